//===- Fp8Backward.cpp - Fusion family `fp8-backward` ---------------------===//
//
// The two backward GEMMs of an FP8 linear read the same output gradient dy with the same
// scale (row 2 of the linear's state): fp8_linear_grad_input casts it as it is, for
// dx = dy · W, and fp8_linear_grad_weight_accumulate transposed, for acc += dyᵀ · x. Apart,
// each reads dy from memory and launches its own amax and cast kernels. Together
// (`bonsai.fp8_linear_backward`) one launch reads dy once and writes both layouts of its
// codes, with the transposed casts of W and x, before the two GEMMs: on Llama-3-8B's shapes a
// linear's backward reads dy once instead of twice and launches four kernels instead of six.
//
// The pair is fused where the input gradient was computed: its users are the reason it
// exists early. The weight gradient's operands must already be available there (x is a
// forward activation; the accumulator's declaration, which reads nothing, moves up), and
// nothing between the two may touch the accumulator or write what either reads.
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"

namespace mlir::bonsai {
namespace {

/// fp8_linear_grad_input(dy, W, s) ... fp8_linear_grad_weight_accumulate(dy, x, s, acc)
///   -> fp8_linear_backward(dy, W, x, s, acc) where the input gradient was.
struct FuseFp8Backward : OpRewritePattern<Fp8LinearGradWeightAccumulateOp> {
  FuseFp8Backward(MLIRContext *ctx, const FusionOptions &options)
      : OpRewritePattern(ctx), options(options) {}

  LogicalResult matchAndRewrite(Fp8LinearGradWeightAccumulateOp weightGrad,
                                PatternRewriter &rewriter) const override {
    Value dy = weightGrad.getResultGrad(), x = weightGrad.getInput();
    Value acc = weightGrad.getAccumulator();
    Fp8LinearGradInputOp inputGrad;
    for (Operation *user : dy.getUsers()) {
      auto candidate = dyn_cast<Fp8LinearGradInputOp>(user);
      if (candidate && candidate.getResultGrad() == dy &&
          candidate.getState() == weightGrad.getState() &&
          candidate->getBlock() == weightGrad->getBlock() &&
          candidate->isBeforeInBlock(weightGrad)) {
        inputGrad = candidate;
        break;
      }
    }
    if (!inputGrad)
      return rewriter.notifyMatchFailure(weightGrad,
                                         "no fp8_linear_grad_input of the same dy and state "
                                         "before it");
    if (inputGrad.getCurrent() != weightGrad.getCurrent() ||
        inputGrad.getMargin() != weightGrad.getMargin())
      return rewriter.notifyMatchFailure(weightGrad, "the two GEMMs scale differently");
    if (!fusion::sameSchedule(inputGrad, weightGrad))
      return rewriter.notifyMatchFailure(weightGrad, "the two GEMMs run in different phases");
    if (!inputGrad.getWorkspace().use_empty() || !weightGrad.getWorkspace().use_empty())
      return rewriter.notifyMatchFailure(weightGrad, "a workspace is read");
    if (!fusion::isDefinedBefore(x, inputGrad))
      return rewriter.notifyMatchFailure(weightGrad, "x is computed after the input gradient");
    // The accumulator's declaration reads no value of the block, so it may move up.
    Operation *accDef = acc.getDefiningOp();
    bool moveAcc = !fusion::isDefinedBefore(acc, inputGrad);
    if (moveAcc && (accDef->getBlock() != inputGrad->getBlock() || accDef->getNumOperands() != 0 ||
                    accDef->getNumRegions() != 0))
      return rewriter.notifyMatchFailure(weightGrad, "the accumulator is computed after the input "
                                                     "gradient");
    // The weight gradient moves up to the input gradient: what lies between may neither see
    // the accumulator before or after the addition nor write what the GEMMs read.
    for (Operation *op = inputGrad->getNextNode(); op != weightGrad; op = op->getNextNode()) {
      if (op == accDef)
        continue;
      if (llvm::is_contained(op->getOperands(), acc))
        return rewriter.notifyMatchFailure(weightGrad,
                                           "the accumulator is used between the two GEMMs");
      for (Value read : {dy, Value(inputGrad.getWeight()), x, Value(weightGrad.getState())})
        if (fusion::mayWrite(op, read))
          return rewriter.notifyMatchFailure(weightGrad,
                                             "an operand of the GEMMs is written between "
                                             "them");
    }
    if (moveAcc)
      rewriter.moveOpBefore(accDef, inputGrad);
    rewriter.setInsertionPoint(inputGrad);
    int64_t workspace =
        Fp8LinearBackwardOp::getWorkspaceElements(fusion::elementsOf(dy),
                                                  fusion::elementsOf(inputGrad.getWeight())) +
        Fp8LinearBackwardOp::getWorkspaceElements(fusion::elementsOf(dy), fusion::elementsOf(x));
    auto fused = Fp8LinearBackwardOp::create(
        rewriter, inputGrad.getLoc(),
        TypeRange{inputGrad.getResult().getType(), inputGrad.getStats().getType(),
                  weightGrad.getStats().getType(),
                  RankedTensorType::get({workspace}, rewriter.getF32Type())},
        dy, inputGrad.getWeight(), x, weightGrad.getState(), acc, inputGrad.getCurrent(),
        inputGrad.getMargin());
    if (Attribute phase = inputGrad->getAttr(fusion::kPhaseAttr))
      fused->setAttr(fusion::kPhaseAttr, phase);
    rewriter.replaceAllUsesWith(inputGrad.getResult(), fused.getInputGrad());
    rewriter.replaceAllUsesWith(inputGrad.getStats(), fused.getInputGradStats());
    rewriter.replaceAllUsesWith(weightGrad.getStats(), fused.getWeightGradStats());
    rewriter.eraseOp(weightGrad);
    rewriter.eraseOp(inputGrad);
    options.fused(fused, "fp8_linear_grad_input + fp8_linear_grad_weight_accumulate");
    return success();
  }

  const FusionOptions &options;
};

} // namespace

void populateFp8BackwardFusionPatterns(RewritePatternSet &patterns, const FusionOptions &options) {
  patterns.add<FuseFp8Backward>(patterns.getContext(), options);
}

} // namespace mlir::bonsai
