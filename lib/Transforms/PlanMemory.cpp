//===- PlanMemory.cpp - Offsets for every buffer of a step ----------------===//
//
// The `bonsai-plan-memory` pass (see Passes.td): liveness over the schedule, then the
// greedy-by-size planner of MemoryPlanner.h per per-step arena.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Transforms/Passes.h"
#include "bonsai/Transforms/PlannedStep.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIPLANMEMORYPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
using plan::BufferOp;

struct PlanMemoryPass : impl::BonsaiPlanMemoryPassBase<PlanMemoryPass> {
  using Base::Base;

  LogicalResult planStep(plan::StepOp step) {
    bytesSaved += planStepBuffers(step);
    numBuffers += llvm::range_size(step.getBody().front().getOps<BufferOp>());

    int64_t budget = step.getDeviceMemoryAttr().getInt();
    int64_t hostBudget = step.getHostMemoryAttr().getInt();
    if (budget <= 0 && hostBudget <= 0)
      return success();
    PlanMemorySummary summary = summarizePlanMemory(step);
    if (budget > 0 && summary.peakDevice > budget) {
      auto [dominant, bytes] = summary.dominant();
      InFlightDiagnostic diag = step.emitError()
                                << "the plan needs " << formatBytes(summary.peakDevice)
                                << " of device memory but the budget is " << formatBytes(budget)
                                << " (" << kOverBudget << formatBytes(summary.peakDevice - budget)
                                << "); " << dominant
                                << (StringRef(dominant).ends_with("s") ? " take " : " takes ")
                                << formatBytes(bytes);
      diag << ": " << overBudgetAdvice(dominant, /*recomputing=*/false);
      return failure();
    }
    // Pinned host memory is the host's RAM, locked: a plan over its budget would fail at
    // start-up, or push the machine into swapping, so it is an error here too.
    if (hostBudget > 0 && summary.peakHost > hostBudget) {
      InFlightDiagnostic diag = step.emitError()
                                << "the plan needs " << formatBytes(summary.peakHost)
                                << " of pinned host memory but the host budget is "
                                << formatBytes(hostBudget) << " ("
                                << formatBytes(summary.peakHost - hostBudget)
                                << " more than it allows):";
      std::pair<const char *, int64_t> classes[] = {
          {"weights", summary.hostWeights},
          {"gradients", summary.hostGradients},
          {"optimizer state", summary.hostOptimizerState},
          {"staging and offloaded activations", summary.hostStaging}};
      for (auto [name, bytes] : classes)
        if (bytes > 0)
          diag << " " << name << " " << formatBytes(bytes) << ";";
      diag << " offload less (bonsai.offload), recompute more (bonsai.remat), or raise "
              "host_memory";
      return failure();
    }
    return success();
  }

  void runOnOperation() override {
    for (auto step : getOperation().getOps<plan::StepOp>())
      if (failed(planStep(step)))
        return signalPassFailure();
  }
};
} // namespace
} // namespace mlir::bonsai
