//===- RingGradients.cpp - The ring's gradients summed over its ranks -----===//
//
// The `bonsai-ring-gradients` pass (see Passes.td and docs/ring-attention.md). The ranks of a
// ring (bonsai-ring) hold the same parameters and each computes the gradients of its share
// of the tokens: the runtime seeds rank r's backward pass with the share of the micro-batch's
// counted tokens it holds, so that the sum over the ranks is the gradient of the mean loss
// over the whole sequence. This pass adds that sum: each gradient accumulator is all-reduced
// at the start of the update phase, before the norm and the updates read it, so every rank
// updates the same parameters alike. With bonsai.shard the shards' reduce-scatters, over every
// rank of the data x ring grid, sum them instead.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIRINGGRADIENTSPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

struct RingGradientsPass : impl::BonsaiRingGradientsPassBase<RingGradientsPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    for (auto function : llvm::to_vector(module.getOps<func::FuncOp>()))
      if (auto ranks = function->getAttrOfType<IntegerAttr>("bonsai.ring_ranks"))
        if (failed(reduceGradients(module, function, ranks.getInt())))
          return signalPassFailure();
  }

  /// What the ring does not compose with yet is refused, naming the directive, rather than
  /// producing a step whose ranks drift apart.
  LogicalResult checkComposition(ModuleOp module) {
    LogicalResult result = success();
    module.walk([&](FP8DirectiveOp op) {
      op.emitError() << "bonsai.ring does not compose with bonsai.fp8 yet: each rank's delayed "
                        "scales would follow the amax history of its own tokens";
      result = failure();
    });
    module.walk([&](OptimizerDirectiveOp op) {
      if (op.getUpdateInBackward()) {
        op.emitError() << "bonsai.ring does not compose with update_in_backward yet: the "
                          "update must run after the ring's gradients are summed";
        result = failure();
      }
    });
    return result;
  }

  LogicalResult reduceGradients(ModuleOp module, func::FuncOp function, int64_t ranks) {
    Block &body = function.getBody().front();
    SmallVector<GradNormOp> norms(body.getOps<GradNormOp>());
    // A forward-only step has no gradients to sum.
    if (norms.empty())
      return success();
    if (failed(checkComposition(module)))
      return failure();
    // With bonsai.shard the ring's ranks are part of the shards' grid, whose reduce-scatters
    // sum the gradients over every rank, the ring's included.
    bool sharded = false;
    module.walk([&](ShardDirectiveOp) { sharded = true; });
    if (sharded)
      return success();
    if (norms.size() != 1)
      return function.emitError() << "bonsai-ring-gradients expects one bonsai.grad_norm in "
                                     "the update phase (bonsai-optimizer's), found "
                                  << norms.size();
    GradNormOp norm = norms.front();
    OpBuilder builder(norm);
    StringAttr updatePhase = builder.getStringAttr("update");
    int64_t tensors = 0, bytes = 0;
    for (auto gradient : llvm::to_vector(body.getOps<StateOp>())) {
      if (gradient.getKind() != StateKind::Gradient)
        continue;
      auto reduced = AllReduceOp::create(builder, gradient.getLoc(), gradient.getResult().getType(),
                                         gradient.getResult(), ranks, builder.getStringAttr("sum"));
      reduced->setAttr(BonsaiDialect::getPhaseAttrName(), updatePhase);
      // The update phase reads the sum; the backward pass accumulates and the zeroing clears
      // the rank's own accumulator.
      for (OpOperand &use : llvm::make_early_inc_range(gradient.getResult().getUses())) {
        Operation *user = use.getOwner();
        auto phase = user->getAttrOfType<StringAttr>(BonsaiDialect::getPhaseAttrName());
        if (user == reduced.getOperation() || isa<ZeroOp>(user) || !phase ||
            phase.getValue() != "update")
          continue;
        use.set(reduced.getResult());
      }
      ++tensors;
      bytes += getStorageBytes(gradient.getResult().getType());
    }
    numReduced += tensors;
    emitRemark(function.getLoc()) << "ring: " << tensors << " gradient accumulators ("
                                  << formatBytes(bytes) << ") summed over the " << ranks
                                  << " ranks of the ring once per step";
    return success();
  }
};

} // namespace
} // namespace mlir::bonsai
