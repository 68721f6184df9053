//===- VerifyPlan.cpp - Check a planned step independently ----------------===//
//
// The `bonsai-verify-plan` pass (see Passes.td). It shares no code with the planner: liveness
// is recomputed here from the launches, so that a planner bug cannot hide itself.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Transforms/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIVERIFYPLANPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
using plan::BufferOp;

struct VerifyPlanPass : impl::BonsaiVerifyPlanPassBase<VerifyPlanPass> {
  using Base::Base;

  LogicalResult verifyStep(plan::StepOp step) {
    Block &body = step.getBody().front();
    bool ok = true;
    llvm::StringMap<plan::ArenaOp> arenas;
    for (auto arena : body.getOps<plan::ArenaOp>())
      arenas[arena.getSymName()] = arena;

    // First and last op index touching each buffer; persistent buffers are always live.
    struct Range {
      int64_t first = INT64_MAX, last = INT64_MIN;
    };
    llvm::DenseMap<Operation *, Range> ranges;
    llvm::DenseSet<Operation *> written;
    int64_t index = 0;
    SmallVector<BufferOp> buffers;
    for (Operation &op : body) {
      if (auto buffer = dyn_cast<BufferOp>(op)) {
        buffers.push_back(buffer);
        if (!buffer.getOffsetAttr()) {
          buffer.emitError() << "buffer '" << buffer.getName() << "' has no offset";
          ok = false;
        }
        // Parameters are bound, inputs and the loss scale written by the runtime, and
        // persistent state starts zeroed (or copied): all readable before any op runs.
        plan::BufferRole role = buffer.getRole();
        plan::ArenaOp arena = arenas.lookup(buffer.getArena());
        bool persistent = arena && arena.getLifetime() == plan::Lifetime::Persistent;
        if (persistent || role == plan::BufferRole::Input ||
            role == plan::BufferRole::LossScale)
          written.insert(buffer);
        if (role == plan::BufferRole::Input || role == plan::BufferRole::LossScale)
          ranges[buffer].first = -1;
        continue;
      }
      if (isa<plan::ArenaOp, plan::ViewOp>(op))
        continue;
      auto touch = [&](Value v) -> BufferOp {
        BufferOp buffer = plan::getUnderlyingBuffer(v);
        if (!buffer)
          return nullptr;
        Range &r = ranges[buffer];
        r.first = std::min(r.first, index);
        r.last = std::max(r.last, index);
        return buffer;
      };
      // Reads: launch ins, and operand 0 of copies and collectives.
      ValueRange reads = op.getOperands(), writes;
      if (auto launch = dyn_cast<plan::LaunchOp>(op)) {
        reads = launch.getIns();
        writes = launch.getOuts();
      } else if (isa<plan::RetainOp>(op)) {
        reads = op.getOperands(); // It only keeps them live.
      } else {
        reads = op.getOperands().take_front(std::min<size_t>(1, op.getNumOperands()));
        writes = op.getOperands().drop_front(std::min<size_t>(1, op.getNumOperands()));
      }
      for (Value v : reads)
        if (BufferOp buffer = touch(v); buffer && !written.contains(buffer)) {
          op.emitError() << "reads buffer '" << buffer.getName()
                         << "' before any op writes it";
          ok = false;
        }
      for (Value v : writes)
        if (BufferOp buffer = touch(v))
          written.insert(buffer);
      ++index;
    }
    for (BufferOp buffer : buffers)
      if (buffer.getRole() == plan::BufferRole::Loss ||
          buffer.getRole() == plan::BufferRole::Metric ||
          buffer.getRole() == plan::BufferRole::Input ||
          buffer.getRole() == plan::BufferRole::LossScale)
        ranges[buffer].last = index;

    // Pairwise: same arena, both live at some op, overlapping bytes.
    for (size_t i = 0; i < buffers.size(); ++i) {
      BufferOp a = buffers[i];
      plan::ArenaOp arena = arenas.lookup(a.getArena());
      if (!arena || !a.getOffsetAttr())
        continue;
      bool persistent = arena.getLifetime() == plan::Lifetime::Persistent;
      int64_t aBegin = a.getOffsetAttr().getInt(), aEnd = aBegin + a.getSizeInBytes();
      if (aEnd > arena.getSizeAttr().getInt()) {
        a.emitError() << "buffer '" << a.getName() << "' ends at byte " << aEnd
                      << ", past the end of arena '" << arena.getSymName() << "' ("
                      << arena.getSizeAttr().getInt() << " bytes)";
        ok = false;
      }
      Range ra = ranges.lookup(a);
      for (size_t j = i + 1; j < buffers.size(); ++j) {
        BufferOp b = buffers[j];
        if (b.getArena() != a.getArena() || !b.getOffsetAttr())
          continue;
        int64_t bBegin = b.getOffsetAttr().getInt(), bEnd = bBegin + b.getSizeInBytes();
        if (!(aBegin < bEnd && bBegin < aEnd))
          continue;
        Range rb = ranges.lookup(b);
        bool bothLive = persistent || (ra.first <= rb.last && rb.first <= ra.last);
        if (!bothLive)
          continue;
        b.emitError() << "buffer '" << b.getName() << "' [" << bBegin << ", " << bEnd
                      << ") overlaps buffer '" << a.getName() << "' [" << aBegin << ", "
                      << aEnd << ") in arena '" << a.getArena() << "' while both are live";
        ok = false;
      }
    }
    return success(ok);
  }

  void runOnOperation() override {
    bool ok = true;
    for (auto step : getOperation().getOps<plan::StepOp>())
      ok &= succeeded(verifyStep(step));
    if (!ok)
      signalPassFailure();
    markAllAnalysesPreserved();
  }
};
} // namespace
} // namespace mlir::bonsai
