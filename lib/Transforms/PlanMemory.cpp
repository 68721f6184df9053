//===- PlanMemory.cpp - Offsets for every buffer of a step ----------------===//
//
// The `bonsai-plan-memory` pass (see Passes.td): liveness over the schedule, then the
// greedy-by-size planner of MemoryPlanner.h per per-step arena.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/MemoryPlanner.h"
#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Transforms/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIPLANMEMORYPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
using plan::BufferOp;

struct PlanMemoryPass : impl::BonsaiPlanMemoryPassBase<PlanMemoryPass> {
  using Base::Base;

  LogicalResult planStep(plan::StepOp step) {
    Block &body = step.getBody().front();
    llvm::StringMap<plan::ArenaOp> arenas;
    for (auto arena : body.getOps<plan::ArenaOp>())
      arenas[arena.getSymName()] = arena;

    // Live interval of every buffer: the positions of the ops that touch it, through views.
    // Position 0 is before the first op (inputs), `end` after the last (the loss).
    llvm::MapVector<Operation *, BufferInterval> live;
    for (auto buffer : body.getOps<BufferOp>()) {
      BufferInterval interval{buffer.getSizeInBytes(), INT64_MAX, INT64_MIN};
      // The runtime writes inputs and the loss scale before the first op.
      if (buffer.getRole() == plan::BufferRole::Input ||
          buffer.getRole() == plan::BufferRole::LossScale)
        interval.firstUse = 0;
      live[buffer] = interval;
    }
    int64_t position = 1;
    for (Operation &op : body) {
      if (isa<plan::ArenaOp, BufferOp, plan::ViewOp>(op))
        continue;
      for (Value operand : op.getOperands())
        if (BufferOp buffer = plan::getUnderlyingBuffer(operand)) {
          BufferInterval &interval = live[buffer];
          interval.firstUse = std::min(interval.firstUse, position);
          interval.lastUse = std::max(interval.lastUse, position);
        }
      ++position;
    }
    for (auto &[op, interval] : live) {
      // The runtime reads the loss and the metrics after the last op; inputs and the loss
      // scale, which the runtime writes, are never reused within a step (they are small, and
      // the runtime may read them back, to report or to generate).
      plan::BufferRole role = cast<BufferOp>(op).getRole();
      if (role == plan::BufferRole::Loss || role == plan::BufferRole::Metric ||
          role == plan::BufferRole::Input || role == plan::BufferRole::LossScale)
        interval.lastUse = position;
      if (interval.firstUse == INT64_MAX) // Never used: give it a slot of its own moment.
        interval.firstUse = interval.lastUse = 0;
      interval.lastUse = std::max(interval.lastUse, interval.firstUse);
    }

    for (auto &[name, arena] : arenas) {
      int64_t alignment = arena.getAlignmentAttr().getInt();
      SmallVector<BufferOp> buffers;
      std::vector<BufferInterval> intervals;
      for (auto &[op, interval] : live) {
        auto buffer = cast<BufferOp>(op);
        if (buffer.getArena() != name)
          continue;
        buffers.push_back(buffer);
        intervals.push_back(interval);
      }
      MemoryPlan memoryPlan;
      if (arena.getLifetime() == plan::Lifetime::Persistent) {
        // Persistent state is live for the whole run: one after another.
        int64_t offset = 0;
        for (const BufferInterval &b : intervals) {
          memoryPlan.offsets.push_back(offset);
          offset = alignTo(offset + b.size, alignment);
        }
        memoryPlan.peak = offset;
      } else {
        memoryPlan = planGreedyBySize(intervals, alignment);
        int64_t withoutReuse = 0;
        for (const BufferInterval &b : intervals)
          withoutReuse += alignTo(b.size, alignment);
        bytesSaved += withoutReuse - memoryPlan.peak;
      }
      OpBuilder builder(arena);
      for (auto [buffer, offset] : llvm::zip(buffers, memoryPlan.offsets))
        buffer.setOffsetAttr(builder.getI64IntegerAttr(offset));
      arena.setSize(memoryPlan.peak);
      numBuffers += buffers.size();
    }

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
