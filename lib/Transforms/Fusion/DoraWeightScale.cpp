//===- DoraWeightScale.cpp - Fusion family `dora-weight` ------------------===//
//
// DoRA rescales an adapted linear's output rows (bonsai-insert-lora, docs/lora.md):
//
//   %p = bonsai.linear %x, %w
//   %q = bonsai.linear %u, %b                       // u = s · x · Aᵀ, the rank-r input
//   %z = bonsai.add %p, %q
//   %s = bonsai.dora_scale %m, %w, %a, %b
//   %y = bonsai.mul %z, %s                          // a [tokens, out] pass, read and written
//
// Scaling output column o by s[o] is scaling row o of each right-hand operand:
// y = x · (s ⊙ W)ᵀ + u · (s ⊙ B)ᵀ. The family rewrites the forward to that:
//
//   %c  = bonsai.reshape %s                         // [out, 1]
//   %w' = bonsai.mul %w, %c                         // [out, in]: fewer elements than [tokens,
//   %b' = bonsai.mul %b, %c                         // out] when tokens > in
//   %y  = bonsai.add (bonsai.linear %x, %w'), (bonsai.linear %u, %b')
//
// so no [tokens, out] rescale pass remains (gemm-epilogue then folds the add into the base
// GEMM), and the elementwise kernel of SwiGLU no longer rescales gate and up first. The
// backward pass is unchanged: it reads s, W and B (dora_grad's dx = dy ⊙ s feeds the same
// GEMMs), never z, so z must have no reader but the mul — which holds once family `dora` has
// replaced the mul that read it for the magnitude's gradient. Forward ops only: a recomputed
// clone of the mul keeps computing y as before (the same values up to rounding).
//
// Rounding: y = s ⊙ z rounds z and then the product; here s ⊙ W is rounded per weight (one
// rounding of the element type) before the GEMM accumulates in fp32, so a bf16 output may
// differ from the unfused one in its last place.
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::bonsai {
namespace {

using namespace fusion;

/// Whether `op` is a forward op this family may rewrite: not backward or update, not a clone.
bool isForward(Operation *op) { return getPhase(op).empty() && !op->hasAttr(kRecomputedAttr); }

/// The linear behind `value` when `value` is its result and nothing else reads it.
LinearOp soleLinear(Value value) {
  auto linear = value.getDefiningOp<LinearOp>();
  if (!linear || !linear->hasOneUse() || !isForward(linear))
    return nullptr;
  return linear;
}

void rewriteBlock(Block &block, const FusionOptions &options) {
  SmallVector<MulOp> muls;
  for (auto mul : block.getOps<MulOp>())
    if (isForward(mul))
      muls.push_back(mul);
  IRRewriter rewriter(block.getParentOp()->getContext());
  for (MulOp mul : muls) {
    DoraScaleOp scale;
    Value sum;
    for (auto [scaleSide, other] :
         {std::pair(mul.getRhs(), mul.getLhs()), std::pair(mul.getLhs(), mul.getRhs())})
      if (auto candidate = scaleSide.getDefiningOp<DoraScaleOp>()) {
        scale = candidate;
        sum = other;
        break;
      }
    if (!scale || sum.getType() != mul.getResult().getType())
      continue;
    auto add = sum.getDefiningOp<AddOp>();
    if (!add || !add->hasOneUse() || !isForward(add) ||
        add.getLhs().getType() != add.getRhs().getType())
      continue;
    // The base linear reads the scale's weight, the adapter's its lora_b.
    LinearOp base, adapter;
    for (auto [p, q] :
         {std::pair(add.getLhs(), add.getRhs()), std::pair(add.getRhs(), add.getLhs())}) {
      LinearOp first = soleLinear(p), second = soleLinear(q);
      // bonsai-insert-lora refuses DoRA on a linear with a bias, so neither has one.
      if (first && second && first.getWeight() == scale.getWeight() &&
          second.getWeight() == scale.getLoraB() && !first.getBias() && !second.getBias()) {
        base = first;
        adapter = second;
        break;
      }
    }
    if (!base)
      continue;
    auto weightType = cast<RankedTensorType>(base.getWeight().getType());
    auto loraBType = cast<RankedTensorType>(adapter.getWeight().getType());
    auto scaleType = cast<RankedTensorType>(scale.getResult().getType());
    Type element = weightType.getElementType();
    if (weightType.getRank() != 2 || loraBType.getElementType() != element ||
        scaleType.getElementType() != element ||
        cast<RankedTensorType>(mul.getResult().getType()).getElementType() != element)
      continue;
    int64_t out = weightType.getDimSize(0);

    Location loc =
        rewriter.getFusedLoc({base.getLoc(), adapter.getLoc(), add.getLoc(), mul.getLoc()});
    rewriter.setInsertionPoint(mul);
    Value column = ReshapeOp::create(rewriter, loc, RankedTensorType::get({out, 1}, element),
                                     scale.getResult());
    Value weight = MulOp::create(rewriter, loc, weightType, base.getWeight(), column);
    Value loraB = MulOp::create(rewriter, loc, loraBType, adapter.getWeight(), column);
    Value scaledBase = LinearOp::create(rewriter, loc, base.getResult().getType(), base.getInput(),
                                        weight, Value());
    Value scaledAdapter = LinearOp::create(rewriter, loc, adapter.getResult().getType(),
                                           adapter.getInput(), loraB, Value());
    auto scaled =
        AddOp::create(rewriter, loc, mul.getResult().getType(), scaledBase, scaledAdapter);
    rewriter.replaceAllUsesWith(mul.getResult(), scaled.getResult());
    rewriter.eraseOp(mul);
    rewriter.eraseOp(add);
    rewriter.eraseOp(base);
    rewriter.eraseOp(adapter);
    options.fused(scaled, "DoRA row scale on the weight (linear, linear, add, mul)");
  }
}

} // namespace

LogicalResult scaleDoraWeights(FunctionOpInterface function, const FusionOptions &options) {
  // Whether the rewrite applies depends on the recompute set (a set that recomputes y from a
  // kept z gives z a second reader), and bonsai-remat's peak model reads what the plan
  // materialises from one set's plan: under a search the family would mislead it (TinyLlama
  // QDoRA at 8.5 GiB found no set that fits, where without the family one recomputes 1.6% of
  // the FLOPs). Policies none, selective and full are fixed sets: there it applies.
  if (function->hasAttr(kRematSearchedAttr))
    return success();
  for (Block &block : function.getFunctionBody())
    rewriteBlock(block, options);
  return success();
}

} // namespace mlir::bonsai
