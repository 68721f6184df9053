//===- LinearCrossEntropy.cpp - The LM head and its loss, chunked ----------===//
//
// The `linear-cross-entropy` fusion family (docs/fusion.md). After autodiff the LM head is
//
//   %logits = bonsai.linear %x, %w
//   %loss   = bonsai.cross_entropy %logits, %labels
//   %seed   = bonsai.loss_scale
//   %dl     = bonsai.cross_entropy_grad %seed, %logits, %labels   (backward)
//   %dx     = bonsai.linear_grad_input %dl, %w                    (backward)
//   %dw     = bonsai.linear_grad_weight %dl, %x                   (backward; absent if w frozen)
//
// and the logits [positions, vocab] are the largest activation of the step, alive from the
// forward pass to the start of the backward pass, together with their gradient. The pattern
// replaces all five ops with one bonsai.linear_cross_entropy that computes the loss and both
// gradients chunk by chunk of positions, so that only one chunk of logits exists at a time
// (in a workspace the memory planner sizes). The fused op runs where the loss is computed, in
// the forward phase: the runtime reads the loss after the forward pass, and it writes the loss
// scale (the gradient seed, 1/micro-batches) before the forward pass, so the seed is known.
//
// The pattern holds only when nothing else reads the logits or their gradient. Recomputed
// clones (bonsai-remat) of the logits, of the head's input and of a dequantized weight count
// as the values they copy, and become dead with the fusion.
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::bonsai {
namespace {

using namespace fusion;

struct FuseLinearCrossEntropy : OpRewritePattern<CrossEntropyOp> {
  FuseLinearCrossEntropy(MLIRContext *context, const FusionOptions &options)
      : OpRewritePattern(context), options(options) {}

  LogicalResult matchAndRewrite(CrossEntropyOp loss, PatternRewriter &rewriter) const override {
    auto linear = loss.getLogits().getDefiningOp<LinearOp>();
    if (!linear)
      return rewriter.notifyMatchFailure(loss, "the logits are not a linear's result");
    if (linear.getBias())
      return rewriter.notifyMatchFailure(linear, "the LM head has a bias");
    if (linear.getInput().getType().getRank() < 2)
      return rewriter.notifyMatchFailure(linear, "the LM head's input has no position dimension");
    Value logits = linear.getResult(), x = linear.getInput(), w = linear.getWeight();

    // Exactly one gradient of the loss, reading these logits or a recomputed copy of them.
    CrossEntropyGradOp grad;
    for (Operation *user : logits.getUsers()) {
      if (user == loss)
        continue;
      auto g = dyn_cast<CrossEntropyGradOp>(user);
      if (!g || grad)
        return rewriter.notifyMatchFailure(user, "the logits have a reader other than the loss "
                                                 "and its one gradient");
      grad = g;
    }
    Operation *logitsClone = nullptr;
    if (!grad) {
      // The backward pass may read a recomputed copy of the logits.
      for (Operation *user : loss.getLabels().getUsers())
        if (auto g = dyn_cast<CrossEntropyGradOp>(user);
            g && g.getLogits() != logits && isSameValue(logits, g.getLogits())) {
          if (grad)
            return rewriter.notifyMatchFailure(user, "two gradients read copies of the logits");
          grad = g;
        }
      if (!grad)
        return rewriter.notifyMatchFailure(loss, "the loss has no gradient (nothing to fuse "
                                                 "the backward pass with)");
      logitsClone = grad.getLogits().getDefiningOp();
      if (!grad.getLogits().hasOneUse())
        return rewriter.notifyMatchFailure(logitsClone, "the recomputed logits have another "
                                                        "reader");
    }
    if (grad.getLabels() != loss.getLabels() || grad.getIgnoreIndex() != loss.getIgnoreIndex())
      return rewriter.notifyMatchFailure(grad, "the gradient's labels or ignore_index differ "
                                               "from the loss's");
    for (Operation *user : loss.getResult().getUsers())
      if (!user->hasTrait<OpTrait::IsTerminator>() && !isa<MetricOp>(user))
        return rewriter.notifyMatchFailure(user, "the loss feeds a computation");

    // The gradient of the logits goes to the head's input and weight gradients only.
    LinearGradInputOp gradInput;
    LinearGradWeightOp gradWeight;
    for (Operation *user : grad.getResult().getUsers()) {
      if (auto gi = dyn_cast<LinearGradInputOp>(user);
          gi && !gradInput && isSameValue(w, gi.getWeight())) {
        gradInput = gi;
        continue;
      }
      if (auto gw = dyn_cast<LinearGradWeightOp>(user);
          gw && !gradWeight && isSameValue(x, gw.getInput())) {
        gradWeight = gw;
        continue;
      }
      return rewriter.notifyMatchFailure(user, "the logits' gradient has a reader other than "
                                               "the LM head's input and weight gradients");
    }
    if (!gradInput)
      return rewriter.notifyMatchFailure(grad, "no input gradient of the LM head");

    // The seed must be available where the loss is computed: the runtime's loss scale is
    // (it is written before the step); a computed seed is not moved.
    Value seed = grad.getLossGrad();
    if (!isDefinedBefore(seed, loss)) {
      if (!seed.getDefiningOp<LossScaleOp>())
        return rewriter.notifyMatchFailure(grad, "the loss gradient is computed after the "
                                                 "loss");
      rewriter.moveOpBefore(seed.getDefiningOp(), loss);
    }

    auto xType = cast<RankedTensorType>(x.getType());
    auto wType = cast<RankedTensorType>(w.getType());
    int64_t rows = getNumElements(cast<ShapedType>(loss.getLabels().getType()));
    int64_t vocab = wType.getDimSize(0), hidden = wType.getDimSize(1);
    int64_t elementBytes = xType.getElementType().getIntOrFloatBitWidth() / 8;
    int64_t chunk = LinearCrossEntropyOp::chooseChunkRows(rows, vocab, elementBytes);
    int64_t workspace = LinearCrossEntropyOp::getWorkspaceElements(rows, vocab, hidden, chunk,
                                                                   elementBytes, bool(gradWeight));

    rewriter.setInsertionPoint(loss);
    SmallVector<Type> results = {loss.getResult().getType(), xType,
                                 RankedTensorType::get({workspace}, rewriter.getF32Type())};
    if (gradWeight)
      results.push_back(wType);
    auto fused = LinearCrossEntropyOp::create(
        rewriter, rewriter.getFusedLoc({linear.getLoc(), loss.getLoc()}), results, x, w,
        loss.getLabels(), seed, loss.getIgnoreIndexAttr(), rewriter.getI64IntegerAttr(chunk));
    rewriter.replaceAllUsesWith(loss.getResult(), fused.getLoss());
    rewriter.replaceAllUsesWith(gradInput.getResult(), fused.getInputGrad());
    if (gradWeight)
      rewriter.replaceAllUsesWith(gradWeight.getResult(), fused.getWeightGrad());
    // Readers first; clones of x, w and the logits that only they read go with them.
    for (Operation *op : SmallVector<Operation *>{gradWeight, gradInput, grad})
      if (op)
        eraseDeadClones(rewriter, op);
    rewriter.eraseOp(loss);
    rewriter.eraseOp(linear);
    options.fused(fused, gradWeight ? "linear + cross-entropy + gradients"
                                    : "linear + cross-entropy + input gradient (frozen head)");
    return success();
  }

  const FusionOptions &options;
};

} // namespace

void populateLinearCrossEntropyFusionPatterns(RewritePatternSet &patterns,
                                              const FusionOptions &options) {
  patterns.add<FuseLinearCrossEntropy>(patterns.getContext(), options);
}

} // namespace mlir::bonsai
