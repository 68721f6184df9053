//===- FlashAttention.cpp - Attention that saves its log-sum-exp for backward -===//
//
// The `flash-attention` fusion family (docs/fusion.md). bonsai.attention returns only its
// output, so bonsai.attention_grad has to recompute each query row's softmax statistics
// before it can form the probabilities. When an attention's result feeds an attention_grad
// of the same operands, both become their flash variants:
//
//   %o = bonsai.attention %q, %k, %v            ->  %o, %lse = bonsai.flash_attention %q, %k, %v
//   %dq, %dk, %dv = bonsai.attention_grad           %dq, %dk, %dv = bonsai.flash_attention_grad
//       %do, %q, %k, %v, %o                             %do, %q, %k, %v, %o, %lse
//
// The forward writes the log-sum-exp (f32, one per query row) that its online softmax holds
// anyway; the backward reads it instead of recomputing it. Neither stores the attention
// matrix. A clone that bonsai-remat placed in the backward pass (bonsai.recomputed) is
// rewritten the same way, so the grad reads the lse of the clone it already reads the output
// of. When remat recomputes only the attention's inputs (policy selective recomputes rope), the
// grad reads the forward's output with recomputed q and k: clones of the forward's operands,
// which hold the same bits, so the grad still reads the forward's lse. An attention without
// such a grad (generation, a forward whose grad reads a recomputed clone) stays as it is:
// nobody would read its lse.
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::bonsai {
namespace {

/// How deep sameValue follows a chain of clones (remat clones a few ops in front of attention).
constexpr unsigned kMaxCloneDepth = 16;

/// Whether `a` and `b` hold the same values: the same SSA value, or the same result of two
/// pure ops of which one is a recomputed clone (bonsai-remat's) of the other, with the same
/// attributes and operands that hold the same values in turn. Recomputation is bit-exact
/// (docs/remat.md), so a clone's result equals its original's.
bool sameValue(Value a, Value b, unsigned depth = 0) {
  if (a == b)
    return true;
  auto ra = dyn_cast<OpResult>(a), rb = dyn_cast<OpResult>(b);
  if (!ra || !rb || ra.getResultNumber() != rb.getResultNumber() || depth >= kMaxCloneDepth)
    return false;
  Operation *x = ra.getOwner(), *y = rb.getOwner();
  if (!x->hasAttr(fusion::kRecomputedAttr) && !y->hasAttr(fusion::kRecomputedAttr))
    return false;
  if (x->getName() != y->getName() || x->getNumOperands() != y->getNumOperands() ||
      x->getNumRegions() != 0 || y->getNumRegions() != 0 || !isPure(x) ||
      fusion::getInherentAttrs(x) != fusion::getInherentAttrs(y))
    return false;
  for (auto [u, v] : llvm::zip_equal(x->getOperands(), y->getOperands()))
    if (!sameValue(u, v, depth + 1))
      return false;
  return true;
}

/// Whether `grad` is the gradient of `attention`: it reads its result as the forward output,
/// and q, k, v that hold the same values (the same, or recomputed clones), and the same mask
/// and scale.
bool isGradientOf(AttentionGradOp grad, AttentionOp attention) {
  return grad.getOutput() == attention.getResult() &&
         sameValue(grad.getQuery(), attention.getQuery()) &&
         sameValue(grad.getKey(), attention.getKey()) &&
         sameValue(grad.getValue(), attention.getValue()) &&
         grad.getSegmentIds() == attention.getSegmentIds() &&
         grad.getCausal() == attention.getCausal() && grad.getScale() == attention.getScale() &&
         grad.getRingRanks() == attention.getRingRanks();
}

/// attention (+ the attention_grads of it) -> flash_attention (+ flash_attention_grads).
struct FuseFlashAttention : OpRewritePattern<AttentionOp> {
  FuseFlashAttention(MLIRContext *context, const FusionOptions &options)
      : OpRewritePattern(context), options(options) {}

  LogicalResult matchAndRewrite(AttentionOp attention,
                                PatternRewriter &rewriter) const override {
    SmallVector<AttentionGradOp> grads;
    for (Operation *user : attention.getResult().getUsers())
      if (auto grad = dyn_cast<AttentionGradOp>(user); grad && isGradientOf(grad, attention))
        if (!llvm::is_contained(grads, grad))
          grads.push_back(grad);
    if (grads.empty())
      return rewriter.notifyMatchFailure(attention,
                                         "no attention_grad of the same operands reads the "
                                         "result: nobody would read the log-sum-exp");

    RankedTensorType q = cast<RankedTensorType>(attention.getQuery().getType());
    auto lseType = RankedTensorType::get({q.getDimSize(0), q.getDimSize(2), q.getDimSize(1)},
                                         rewriter.getF32Type());
    rewriter.setInsertionPoint(attention);
    auto flash = FlashAttentionOp::create(
        rewriter, attention.getLoc(), attention.getResult().getType(), lseType,
        attention.getQuery(), attention.getKey(), attention.getValue(), attention.getSegmentIds(),
        attention.getCausalAttr(), attention.getScaleAttr(), attention.getRingRanksAttr());
    fusion::copyAnnotations(attention, flash);

    for (AttentionGradOp grad : grads) {
      rewriter.setInsertionPoint(grad);
      auto flashGrad = FlashAttentionGradOp::create(
          rewriter, grad.getLoc(), grad.getQueryGrad().getType(), grad.getKeyGrad().getType(),
          grad.getValueGrad().getType(), grad.getResultGrad(), grad.getQuery(), grad.getKey(),
          grad.getValue(), flash.getOutput(), flash.getLse(), grad.getSegmentIds(),
          grad.getCausalAttr(), grad.getScaleAttr(), grad.getRingRanksAttr());
      fusion::copyAnnotations(grad, flashGrad);
      rewriter.replaceOp(grad, flashGrad->getResults());
      options.fused(flashGrad, "attention_grad -> flash_attention_grad");
    }
    rewriter.replaceOp(attention, flash.getOutput());
    options.fused(flash, "attention -> flash_attention");
    return success();
  }

  const FusionOptions &options;
};

} // namespace

void populateFlashAttentionFusionPatterns(RewritePatternSet &patterns,
                                          const FusionOptions &options) {
  patterns.add<FuseFlashAttention>(patterns.getContext(), options);
}

} // namespace mlir::bonsai
