//===- PredictStep.cpp - The step time bonsai-compile predicts ------------===//
//
// The `bonsai-predict-step` pass (see Passes.td and docs/offload.md, "Predicted step time"):
// StepTime.h's prediction of each function as it will run, recorded on the function for the
// plan and the compiler's report.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/StepTime.h"
#include "bonsai/Target/TargetProfile.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIPREDICTSTEPPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

struct PredictStepPass : impl::BonsaiPredictStepPassBase<PredictStepPass> {
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
      StepPrediction prediction = predictStep(function, rates, microBatches);
      bool offloaded = prediction.hostUpdates || prediction.streamedUpdates;
      // Without the link's or the host's rate an offloaded step cannot be predicted.
      if (offloaded && (!(rates.offload.linkBytesPerSecond > 0) ||
                        (prediction.hostUpdates && !(rates.offload.hostParamsPerSecond > 0))))
        continue;
      function->setAttr("bonsai.predicted_step_seconds",
                        builder.getF64FloatAttr(prediction.stepSeconds));
      function->setAttr("bonsai.predicted_exposed_seconds",
                        builder.getF64FloatAttr(prediction.exposedSeconds));
    }
  }
};

} // namespace
} // namespace mlir::bonsai
