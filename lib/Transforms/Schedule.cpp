//===- Schedule.cpp - Order and streams for plan launches -----------------===//
//
// The `bonsai-schedule` pass (see Passes.td).
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Transforms/Passes.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAISCHEDULEPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
struct SchedulePass : impl::BonsaiSchedulePassBase<SchedulePass> {
  using Base::Base;

  void scheduleStep(plan::StepOp step) {
    Block &body = step.getBody().front();
    // Declarations move above all work, keeping their relative order (so views still follow
    // their sources); the work keeps its order, which is the step's meaning.
    Operation *anchor = nullptr;
    for (Operation &op : llvm::make_early_inc_range(body)) {
      if (!isa<plan::ArenaOp, plan::BufferOp, plan::ViewOp>(op))
        continue;
      if (anchor)
        op.moveAfter(anchor);
      else
        op.moveBefore(&body, body.begin());
      anchor = &op;
    }
    for (auto launch : body.getOps<plan::LaunchOp>())
      launch.setStream(0);
  }

  void runOnOperation() override {
    for (auto step : getOperation().getOps<plan::StepOp>())
      scheduleStep(step);
  }
};
} // namespace
} // namespace mlir::bonsai
