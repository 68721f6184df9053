//===- ResidualNorm.cpp - Residual adds joined to the norms around them ----===//
//
// The `residual-norm` fusion family (docs/fusion.md). A pre-norm transformer adds each
// sublayer's output to the residual stream and normalises the sum at once:
//
//   %h2 = bonsai.add %h1, %a          ->  %h2, %n = bonsai.add_rms_norm %h1, %a, %w
//   %n  = bonsai.rms_norm %h2, %w
//
// and the backward pass sums the gradients reaching the stream:
//
//   %dx, %dw = bonsai.rms_norm_grad %dy, %h2, %w   ->  %s, %dw = bonsai.rms_norm_grad_add
//   %s = bonsai.add %acc, %dx                                         %dy, %h2, %w, %acc
//
// Both save a full pass over the residual stream (the sum is not read back; the norm's input
// gradient is not written and read back). The patterns ask NormalizationOpInterface and
// NormalizationGradOpInterface for the fused variants, so any normalisation that offers one
// fuses (rms_norm and layer_norm do). The add must not broadcast, and both ops must run in the
// same phase (a recomputed norm in the backward pass reads the kept sum, not a fresh add).
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::bonsai {
namespace {

using namespace fusion;

/// add + norm -> the norm's fused residual variant.
struct FuseAddNorm : OpInterfaceRewritePattern<NormalizationOpInterface> {
  FuseAddNorm(MLIRContext *context, const FusionOptions &options)
      : OpInterfaceRewritePattern(context), options(options) {}

  LogicalResult matchAndRewrite(NormalizationOpInterface norm,
                                PatternRewriter &rewriter) const override {
    Operation *op = norm.getOperation();
    auto add = norm.getNormalizedInput().getDefiningOp<AddOp>();
    if (!add)
      return rewriter.notifyMatchFailure(op, "the normalised value is not an add's result");
    if (add.getLhs().getType() != add.getRhs().getType())
      return rewriter.notifyMatchFailure(add, "the add broadcasts");
    if (add->getBlock() != op->getBlock())
      return rewriter.notifyMatchFailure(add, "the add is in another block");
    if (!sameSchedule(add, op))
      return rewriter.notifyMatchFailure(op, "the add and the norm run in different phases "
                                             "(a recomputed norm reads the kept sum)");

    // The fused op replaces the sum for every reader, so it must precede them all: at the
    // norm when no reader of the sum comes before it, else at the add when the norm's
    // parameters are available there.
    Operation *insertion = op;
    if (!allUsersAfter(add.getResult(), op)) {
      if (!llvm::all_of(op->getOperands(),
                        [&](Value v) { return v == add.getResult() || isDefinedBefore(v, add); }))
        return rewriter.notifyMatchFailure(op, "the sum is read before the norm, whose "
                                               "parameters are defined after the add");
      insertion = add;
    }
    rewriter.setInsertionPoint(insertion);
    Operation *fused = norm.buildWithResidualAdd(rewriter, add.getLhs(), add.getRhs());
    if (!fused)
      return rewriter.notifyMatchFailure(op, "the normalisation has no fused residual variant");
    fused->setLoc(rewriter.getFusedLoc({add.getLoc(), op->getLoc()}));
    copyAnnotations(op, fused);
    rewriter.replaceAllUsesWith(add.getResult(), fused->getResult(0));
    rewriter.replaceOp(op, fused->getResult(1));
    rewriter.eraseOp(add);
    options.fused(fused, "residual add + norm");
    return success();
  }

  const FusionOptions &options;
};

/// norm_grad + add of its input gradient -> the gradient's fused variant with an addend.
struct FuseNormGradAdd : OpRewritePattern<AddOp> {
  FuseNormGradAdd(MLIRContext *context, const FusionOptions &options)
      : OpRewritePattern(context), options(options) {}

  LogicalResult matchAndRewrite(AddOp add, PatternRewriter &rewriter) const override {
    if (add.getLhs().getType() != add.getRhs().getType())
      return rewriter.notifyMatchFailure(add, "the add broadcasts");
    // The norm gradient whose input gradient is an operand read only by this add; of two,
    // the later one (so that the other's result, the addend, is available before it).
    NormalizationGradOpInterface grad;
    Value addend;
    for (auto [operand, other] :
         {std::pair(add.getLhs(), add.getRhs()), std::pair(add.getRhs(), add.getLhs())}) {
      auto candidate = operand.getDefiningOp<NormalizationGradOpInterface>();
      if (!candidate || candidate.getNormalizedInputGrad() != operand || !operand.hasOneUse() ||
          candidate->getBlock() != add->getBlock() || !sameSchedule(candidate, add))
        continue;
      if (grad && !grad->isBeforeInBlock(candidate))
        continue;
      grad = candidate;
      addend = other;
    }
    if (!grad)
      return rewriter.notifyMatchFailure(add, "no operand is a norm's input gradient read "
                                              "only by this add, in the same phase");

    // The fused op replaces the add's result and the gradient's other results: at the add
    // when those results are read only after it, else at the gradient when the addend is
    // available there.
    Operation *insertion = add;
    for (Value result : grad->getResults())
      if (result != grad.getNormalizedInputGrad() && !allUsersAfter(result, add))
        insertion = grad;
    if (insertion == grad.getOperation() && !isDefinedBefore(addend, grad))
      return rewriter.notifyMatchFailure(add, "the gradient's other results are read before "
                                              "the add, and the addend is computed after the "
                                              "gradient");
    rewriter.setInsertionPoint(insertion);
    Operation *fused = grad.buildWithAddend(rewriter, addend);
    if (!fused)
      return rewriter.notifyMatchFailure(grad, "the normalisation gradient has no fused "
                                               "variant with an addend");
    fused->setLoc(rewriter.getFusedLoc({grad->getLoc(), add.getLoc()}));
    copyAnnotations(grad, fused);
    Value inputGrad = grad.getNormalizedInputGrad();
    for (auto [old, replacement] : llvm::zip(grad->getResults(), fused->getResults()))
      if (old != inputGrad)
        rewriter.replaceAllUsesWith(old, replacement);
    unsigned index = cast<OpResult>(inputGrad).getResultNumber();
    rewriter.replaceAllUsesWith(add.getResult(), fused->getResult(index));
    rewriter.eraseOp(add);
    rewriter.eraseOp(grad);
    options.fused(fused, "norm gradient + residual gradient add");
    return success();
  }

  const FusionOptions &options;
};

} // namespace

void populateResidualNormFusionPatterns(RewritePatternSet &patterns, const FusionOptions &options) {
  patterns.add<FuseAddNorm, FuseNormGradAdd>(patterns.getContext(), options);
}

} // namespace mlir::bonsai
