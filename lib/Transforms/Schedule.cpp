//===- Schedule.cpp - Topological order and streams for plan launches -----===//
//
// The `bonsai-schedule` pass (see Passes.td).
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Transforms/Passes.h"
#include "llvm/ADT/DenseMap.h"

#include <queue>

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAISCHEDULEPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
using plan::BufferOp;

/// Buffers read and written by a work op (launch, copy, collective), through views.
void collectAccesses(Operation *op, SmallVectorImpl<Operation *> &reads,
                     SmallVectorImpl<Operation *> &writes) {
  auto add = [](ValueRange values, SmallVectorImpl<Operation *> &into) {
    for (Value v : values)
      if (BufferOp buffer = plan::getUnderlyingBuffer(v))
        into.push_back(buffer);
  };
  if (auto launch = dyn_cast<plan::LaunchOp>(op)) {
    add(launch.getIns(), reads);
    add(launch.getOuts(), writes);
    return;
  }
  // Copies and collectives: operand 0 is read, operand 1 written.
  add(op->getOperands().take_front(1), reads);
  add(op->getOperands().drop_front(1), writes);
}

struct SchedulePass : impl::BonsaiSchedulePassBase<SchedulePass> {
  using Base::Base;

  LogicalResult scheduleStep(plan::StepOp step) {
    Block &body = step.getBody().front();
    SmallVector<Operation *> declarations, work;
    for (Operation &op : body) {
      if (isa<plan::ArenaOp>(op))
        continue;
      if (isa<BufferOp, plan::ViewOp>(op))
        declarations.push_back(&op);
      else
        work.push_back(&op);
    }

    // Dependences: an op depends on the last writer of each buffer it touches, and a writer
    // also on every reader since that last write.
    size_t n = work.size();
    std::vector<SmallVector<size_t>> successors(n);
    std::vector<size_t> indegree(n, 0);
    llvm::DenseMap<Operation *, size_t> lastWriter;
    llvm::DenseMap<Operation *, SmallVector<size_t>> readersSinceWrite;
    auto addEdge = [&](size_t from, size_t to) {
      if (from == to)
        return;
      successors[from].push_back(to);
      ++indegree[to];
    };
    for (size_t i = 0; i < n; ++i) {
      SmallVector<Operation *> reads, writes;
      collectAccesses(work[i], reads, writes);
      for (Operation *buffer : reads) {
        if (auto it = lastWriter.find(buffer); it != lastWriter.end())
          addEdge(it->second, i);
        readersSinceWrite[buffer].push_back(i);
      }
      for (Operation *buffer : writes) {
        if (auto it = lastWriter.find(buffer); it != lastWriter.end())
          addEdge(it->second, i);
        for (size_t reader : readersSinceWrite[buffer])
          addEdge(reader, i);
        readersSinceWrite[buffer].clear();
        lastWriter[buffer] = i;
      }
    }

    // Kahn's algorithm, smallest original position first among ready ops.
    std::priority_queue<size_t, std::vector<size_t>, std::greater<size_t>> ready;
    for (size_t i = 0; i < n; ++i)
      if (indegree[i] == 0)
        ready.push(i);
    SmallVector<size_t> order;
    while (!ready.empty()) {
      size_t i = ready.top();
      ready.pop();
      order.push_back(i);
      for (size_t s : successors[i])
        if (--indegree[s] == 0)
          ready.push(s);
    }
    if (order.size() != n) {
      for (size_t i = 0; i < n; ++i)
        if (indegree[i] != 0)
          return work[i]->emitError("is on a dependence cycle: the step cannot be scheduled");
    }

    // Declarations first (in their order, so that views follow their sources), then work.
    Operation *anchor = nullptr;
    for (Operation &op : body)
      if (isa<plan::ArenaOp>(op))
        anchor = &op;
    for (Operation *decl : declarations) {
      if (anchor)
        decl->moveAfter(anchor);
      else
        decl->moveBefore(&body, body.begin());
      anchor = decl;
    }
    for (size_t i : order) {
      work[i]->moveAfter(anchor);
      anchor = work[i];
      if (auto launch = dyn_cast<plan::LaunchOp>(work[i]))
        launch.setStream(0);
    }
    return success();
  }

  void runOnOperation() override {
    for (auto step : getOperation().getOps<plan::StepOp>())
      if (failed(scheduleStep(step)))
        return signalPassFailure();
  }
};
} // namespace
} // namespace mlir::bonsai
