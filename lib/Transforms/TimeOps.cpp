//===- TimeOps.cpp - Each op's time on the target --------------------------===//
//
// The `bonsai-time-ops` pass (see Passes.td and docs/offload.md, "Predicted step time"): the
// seconds each op that becomes a launch takes on the target, for bonsai-predict-step's
// simulation of the scheduled step.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/StepTime.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Target/TargetProfile.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAITIMEOPSPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

struct TimeOpsPass : impl::BonsaiTimeOpsPassBase<TimeOpsPass> {
  using Base::Base;

  void runOnOperation() override {
    std::optional<TargetProfile> profile = lookupTargetProfile(target);
    if (!profile) {
      getOperation().emitError() << "unknown target '" << target << "'";
      return signalPassFailure();
    }
    if (!(profile->bf16Tflops > 0) || !(profile->memoryBandwidthGBs > 0))
      return;
    double hostRate = hostUpdateRate > 0 ? hostUpdateRate : profile->hostUpdateGParamsPerSecond;
    StepRates rates = sustainedStepRates(*profile, hostRate);
    Builder builder(&getContext());
    for (auto function : getOperation().getOps<func::FuncOp>()) {
      if (function.isExternal())
        continue;
      SmallVector<std::pair<Operation *, double>> timed;
      bool complete = true;
      function.walk([&](KernelOpInterface kernel) {
        double seconds = estimateLaunchSeconds(kernel, rates);
        complete &= seconds >= 0;
        timed.push_back({kernel, seconds});
      });
      // Without the link's or the host's rate an offloaded step cannot be predicted: a
      // partial timing would predict it as if its copies were free.
      if (!complete)
        continue;
      for (auto [op, seconds] : timed)
        op->setAttr(kOpSecondsAttr, builder.getF64FloatAttr(seconds));
    }
  }
};

} // namespace
} // namespace mlir::bonsai
