//===- PredictStep.cpp - The step time bonsai-compile predicts ------------===//
//
// The `bonsai-predict-step` pass (see Passes.td and docs/offload.md, "Predicted step time"):
// each planned step's launches as StepSimulation.h sees them (stream, phase, seconds, the
// bytes they touch, the link direction they take), simulated, the prediction recorded on the
// step for the plan and the compiler's report.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/StepSimulation.h"
#include "bonsai/Analysis/StepTime.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Target/TargetProfile.h"
#include "bonsai/Transforms/Passes.h"
#include "bonsai/Transforms/PlannedStep.h"

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
    SimMachine machine = runtimeMachine(*profile);
    Builder builder(&getContext());
    for (auto step : getOperation().getOps<plan::StepOp>()) {
      std::optional<std::vector<SimLaunch>> launches = collectSimLaunches(step);
      // The estimates were for this simulation; the plan does not carry them.
      for (auto launch : step.getBody().getOps<plan::LaunchOp>())
        launch->removeAttr(kOpSecondsAttr);
      if (!launches)
        continue;
      SimulatedStep prediction = simulateStep(*launches, step.getMicroBatches(), machine);
      step->setAttr("bonsai.predicted_step_seconds",
                    builder.getF64FloatAttr(prediction.stepSeconds));
      step->setAttr("bonsai.predicted_exposed_seconds",
                    builder.getF64FloatAttr(prediction.exposedSeconds));
      // The host steps' share, against which bonsai-run's measured host time (its metrics'
      // `host_step_s`) tells a slow host from a mis-simulated overlap.
      if (prediction.hostSeconds > 0)
        step->setAttr("bonsai.predicted_host_seconds",
                      builder.getF64FloatAttr(prediction.hostSeconds));
    }
  }
};

} // namespace
} // namespace mlir::bonsai
