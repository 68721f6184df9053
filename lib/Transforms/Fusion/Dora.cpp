//===- Dora.cpp - Fusion family `dora` ------------------------------------===//
//
// DoRA rescales an adapted linear's output rows (bonsai-insert-lora, docs/lora.md):
//
//   %s = bonsai.dora_scale %m, %w, %a, %b          // m / n, the norm n detached
//   %y = bonsai.mul %x, %s                         // x = x · Wᵀ + s · (x · Aᵀ) · Bᵀ
//
// and autodiff differentiates the mul and the scale apart:
//
//   %dx = bonsai.mul %dy, %s                       ->  %dx, %dm = bonsai.dora_grad
//   %p  = bonsai.mul %dy, %x                                        %dy, %y, %s, %m
//   %ds = bonsai.reduce_to %p
//   %dm = bonsai.dora_scale %ds, %w, %a, %b       // ds / n
//
// which keeps the pre-scale x (a [tokens, out] tensor per adapted linear) for the backward
// pass, writes and reads back the product p, and reads the [out, in] weight again for the
// norm. Σ_t dy · x / n = Σ_t dy · y / m, so dora_grad forms dm from the output y instead,
// which the next op often keeps anyway (SwiGLU keeps gate and up, attention keeps v): one
// pass over dy and y writing dx, and no weight read.
//
// The match starts at each backward dora_scale whose magnitude operand is a reduce_to of a
// mul read by nothing else. The mul's operands are dy and x; the forward mul y = x ⊙ s it
// differentiates is found through the forward dora_scale with the same adapters, scale and
// weight (values computed again for the backward pass count as the same: the NF4 weight
// dequantized, a ZeRO-3 adapter gathered), and the backward mul dy ⊙ s through dy's users. y is the
// forward mul's result, or a recomputed clone of it placed before the fused op; the fused op goes
// where the first of the two backward muls was.
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "mlir/IR/PatternMatch.h"

#include <optional>

namespace mlir::bonsai {
namespace {

using namespace fusion;

/// A forward y = x ⊙ s with s from a dora_scale: the value a fused gradient reads.
struct RescaledOutput {
  MulOp mul;
  Value preScale;
  DoraScaleOp scale;
};

/// The forward (neither backward nor recomputed) muls of `block` that rescale by a dora_scale
/// result.
SmallVector<RescaledOutput> findRescaledOutputs(Block &block) {
  SmallVector<RescaledOutput> outputs;
  for (auto mul : block.getOps<MulOp>()) {
    if (!getPhase(mul).empty() || mul->hasAttr(kRecomputedAttr))
      continue;
    for (auto [scaleSide, other] :
         {std::pair(mul.getRhs(), mul.getLhs()), std::pair(mul.getLhs(), mul.getRhs())}) {
      auto scale = scaleSide.getDefiningOp<DoraScaleOp>();
      if (!scale || other.getType() != mul.getResult().getType())
        continue;
      outputs.push_back({mul, other, scale});
      break;
    }
  }
  return outputs;
}

/// Whether `a` and `b` hold the same values: isSameValue (`b` is `a` or a recomputed clone of
/// it), or both are results of ops of one kind that the backward pass computes again rather
/// than keep (RecomputeOpInterface: bonsai-shard gathers a ZeRO-3 parameter again for the
/// backward pass without marking the gather a clone), with equal attributes and operands that
/// hold the same values.
bool holdSameValues(Value a, Value b) {
  if (isSameValue(a, b))
    return true;
  auto ra = dyn_cast<OpResult>(a), rb = dyn_cast<OpResult>(b);
  if (!ra || !rb || ra.getResultNumber() != rb.getResultNumber())
    return false;
  Operation *x = ra.getOwner(), *y = rb.getOwner();
  auto recompute = dyn_cast<RecomputeOpInterface>(x);
  if (!recompute || !recompute.isAlwaysRecomputed() || x->getName() != y->getName() ||
      x->getNumOperands() != y->getNumOperands() || x->getNumRegions() != 0 ||
      getInherentAttrs(x) != getInherentAttrs(y))
    return false;
  for (auto [p, q] : llvm::zip(x->getOperands(), y->getOperands()))
    if (!holdSameValues(p, q))
      return false;
  return true;
}

/// Whether `forward` computes the scale whose magnitude gradient `grad` computes: the same
/// scale factor, adapters and weight (holdSameValues: the NF4 weight dequantized, or a ZeRO-3
/// adapter gathered, again for the backward pass).
bool sameAdapter(DoraScaleOp forward, DoraScaleOp grad) {
  return forward.getScaleAttr() == grad.getScaleAttr() &&
         forward.getLoraA().getType() == grad.getLoraA().getType() &&
         forward.getWeight().getType() == grad.getWeight().getType() &&
         holdSameValues(forward.getLoraA(), grad.getLoraA()) &&
         holdSameValues(forward.getLoraB(), grad.getLoraB()) &&
         holdSameValues(forward.getWeight(), grad.getWeight());
}

/// The value to read as the forward mul's result before `before`: a recomputed clone of it
/// (reading the forward operands) placed before `before` when there is one, its lifetime
/// already the backward's; else the forward result itself.
Value outputBefore(MulOp forward, Operation *before) {
  for (Value operand : forward->getOperands())
    for (Operation *user : operand.getUsers()) {
      auto clone = dyn_cast<MulOp>(user);
      if (clone && clone != forward && clone->hasAttr(kRecomputedAttr) &&
          clone->getBlock() == before->getBlock() && clone->isBeforeInBlock(before) &&
          isSameValue(forward.getResult(), clone.getResult()))
        return clone.getResult();
    }
  return forward.getResult();
}

void fuseBlock(Block &block, const FusionOptions &options) {
  SmallVector<RescaledOutput> outputs = findRescaledOutputs(block);
  if (outputs.empty())
    return;
  SmallVector<DoraScaleOp> grads;
  for (auto grad : block.getOps<DoraScaleOp>())
    if (getPhase(grad) == "backward" && !grad->hasAttr(kRecomputedAttr))
      grads.push_back(grad);

  IRRewriter rewriter(block.getParentOp()->getContext());
  for (DoraScaleOp grad : grads) {
    auto reduce = grad.getMagnitude().getDefiningOp<ReduceToOp>();
    if (!reduce || !reduce->hasOneUse() || !sameSchedule(reduce, grad))
      continue;
    auto product = reduce.getInput().getDefiningOp<MulOp>();
    if (!product || !product->hasOneUse() || !sameSchedule(product, grad))
      continue;
    // The forward mul this product differentiates: dy ⊙ x, x its pre-scale operand.
    std::optional<RescaledOutput> output;
    Value dy;
    for (const RescaledOutput &candidate : outputs) {
      if (!sameAdapter(candidate.scale, grad))
        continue;
      if (holdSameValues(candidate.preScale, product.getRhs()))
        dy = product.getLhs();
      else if (holdSameValues(candidate.preScale, product.getLhs()))
        dy = product.getRhs();
      else
        continue;
      output = candidate;
      break;
    }
    if (!output || dy.getType() != output->mul.getResult().getType())
      continue;
    // dx = dy ⊙ s, in the same phase.
    MulOp inputGrad;
    Value scale;
    for (Operation *user : dy.getUsers()) {
      auto mul = dyn_cast<MulOp>(user);
      if (!mul || mul == product || mul->getBlock() != &block || !sameSchedule(mul, grad))
        continue;
      Value other = mul.getLhs() == dy ? mul.getRhs() : mul.getLhs();
      if (holdSameValues(output->scale.getResult(), other)) {
        inputGrad = mul;
        scale = other;
        break;
      }
    }
    if (!inputGrad)
      continue;

    Operation *insertion =
        inputGrad->isBeforeInBlock(product) ? inputGrad.getOperation() : product.getOperation();
    Value y = outputBefore(output->mul, insertion);
    Value magnitude = output->scale.getMagnitude();
    if (!isDefinedBefore(dy, insertion) || !isDefinedBefore(scale, insertion) ||
        !isDefinedBefore(magnitude, insertion) || !isDefinedBefore(y, insertion))
      continue;
    rewriter.setInsertionPoint(insertion);
    auto fused = DoraGradOp::create(rewriter,
                                    rewriter.getFusedLoc({inputGrad.getLoc(), product.getLoc(),
                                                          reduce.getLoc(), grad.getLoc()}),
                                    inputGrad.getResult().getType(), grad.getResult().getType(), dy,
                                    y, scale, magnitude);
    for (NamedAttribute attr : grad->getDiscardableAttrs())
      if (attr.getName().getValue().starts_with("bonsai."))
        fused->setAttr(attr.getName(), attr.getValue());
    Value preScale = product.getLhs() == dy ? product.getRhs() : product.getLhs();
    rewriter.replaceAllUsesWith(inputGrad.getResult(), fused.getInputGrad());
    rewriter.replaceAllUsesWith(grad.getResult(), fused.getMagnitudeGrad());
    rewriter.eraseOp(grad);
    rewriter.eraseOp(reduce);
    rewriter.eraseOp(product);
    rewriter.eraseOp(inputGrad);
    // A pre-scale x recomputed for the product alone is dead now.
    if (Operation *def = preScale.getDefiningOp(); def && def->hasAttr(kRecomputedAttr))
      eraseDeadClones(rewriter, def);
    options.fused(fused, "DoRA output gradient (mul, mul, reduce_to, dora_scale)");
  }
}

} // namespace

LogicalResult fuseDoraGradients(FunctionOpInterface function, const FusionOptions &options) {
  for (Block &block : function.getFunctionBody())
    fuseBlock(block, options);
  return success();
}

} // namespace mlir::bonsai
