//===- BonsaiGradients.cpp - Reverse-mode rules of the model ops ----------===//
//
// GradientOpInterface for every differentiable model op: given the gradients of its results,
// build the ops computing the gradients of the operands that need one. The rules emit backward
// ops that later passes see as units (attention_grad, rms_norm_grad, linear_grad_weight ...);
// only shape plumbing (reshape, transpose, broadcasting adjoints) uses plain model ops.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

namespace {
/// `gradient` summed down to `type` when `type` was broadcast to the gradient's shape.
Value reduceTo(OpBuilder &b, Location loc, Value gradient, Type type) {
  if (gradient.getType() == type)
    return gradient;
  return ReduceToOp::create(b, loc, type, gradient);
}

/// Swaps the last two dimensions.
Value transposeLastTwo(OpBuilder &b, Location loc, Value value) {
  RankedTensorType type = tensorType(value);
  SmallVector<int64_t> perm, shape(type.getShape());
  for (int64_t i = 0; i < type.getRank(); ++i)
    perm.push_back(i);
  std::swap(perm[type.getRank() - 1], perm[type.getRank() - 2]);
  std::swap(shape[type.getRank() - 1], shape[type.getRank() - 2]);
  return TransposeOp::create(b, loc, RankedTensorType::get(shape, type.getElementType()), value,
                             b.getDenseI64ArrayAttr(perm));
}

/// Starts `gradients` with one null entry per operand of `op`.
void resetGradients(Operation *op, SmallVectorImpl<Value> &gradients) {
  gradients.assign(op->getNumOperands(), Value());
}
} // namespace

LogicalResult EmbeddingOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                          function_ref<bool(Value)> needsGradient,
                                          SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  if (Value dy = resultGrads[0]; dy && needsGradient(getTable()))
    grads[0] = EmbeddingGradOp::create(b, getLoc(), getTable().getType(), dy, getIds());
  return success();
}

LogicalResult LinearOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                       function_ref<bool(Value)> needsGradient,
                                       SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dy = resultGrads[0];
  if (!dy)
    return success();
  if (needsGradient(getInput()))
    grads[0] = LinearGradInputOp::create(b, getLoc(), getInput().getType(), dy, getWeight());
  if (needsGradient(getWeight()))
    grads[1] = LinearGradWeightOp::create(b, getLoc(), getWeight().getType(), dy, getInput());
  if (getBias() && needsGradient(getBias()))
    grads[2] = reduceTo(b, getLoc(), dy, getBias().getType());
  return success();
}

LogicalResult MatmulOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                       function_ref<bool(Value)> needsGradient,
                                       SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dc = resultGrads[0];
  if (!dc)
    return success();
  // C = A·B: dA = dC·Bᵀ, dB = Aᵀ·dC.
  if (needsGradient(getLhs()))
    grads[0] = MatmulOp::create(b, getLoc(), getLhs().getType(), dc,
                                transposeLastTwo(b, getLoc(), getRhs()));
  if (needsGradient(getRhs()))
    grads[1] = MatmulOp::create(b, getLoc(), getRhs().getType(),
                                transposeLastTwo(b, getLoc(), getLhs()), dc);
  return success();
}

LogicalResult AddOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                    function_ref<bool(Value)> needsGradient,
                                    SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dy = resultGrads[0];
  if (!dy)
    return success();
  if (needsGradient(getLhs()))
    grads[0] = dy;
  if (needsGradient(getRhs()))
    grads[1] = reduceTo(b, getLoc(), dy, getRhs().getType());
  return success();
}

LogicalResult MulOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                    function_ref<bool(Value)> needsGradient,
                                    SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dy = resultGrads[0];
  if (!dy)
    return success();
  if (needsGradient(getLhs()))
    grads[0] = MulOp::create(b, getLoc(), getLhs().getType(), dy, getRhs());
  if (needsGradient(getRhs())) {
    Value full = MulOp::create(b, getLoc(), getLhs().getType(), dy, getLhs());
    grads[1] = reduceTo(b, getLoc(), full, getRhs().getType());
  }
  return success();
}

LogicalResult RMSNormOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                        function_ref<bool(Value)> needsGradient,
                                        SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dy = resultGrads[0];
  if (!dy)
    return success();
  auto grad = RMSNormGradOp::create(b, getLoc(), getInput().getType(), getWeight().getType(),
                                    dy, getInput(), getWeight(), getEpsilonAttr());
  if (needsGradient(getInput()))
    grads[0] = grad.getInputGrad();
  if (needsGradient(getWeight()))
    grads[1] = grad.getWeightGrad();
  return success();
}

LogicalResult LayerNormOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                          function_ref<bool(Value)> needsGradient,
                                          SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dy = resultGrads[0];
  if (!dy)
    return success();
  Type w = getWeight().getType();
  auto grad = LayerNormGradOp::create(b, getLoc(), getInput().getType(), w, w, dy, getInput(),
                                      getWeight(), getEpsilonAttr());
  if (needsGradient(getInput()))
    grads[0] = grad.getInputGrad();
  if (needsGradient(getWeight()))
    grads[1] = grad.getWeightGrad();
  if (needsGradient(getBias()))
    grads[2] = grad.getBiasGrad();
  return success();
}

LogicalResult RoPEOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                     function_ref<bool(Value)> needsGradient,
                                     SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  if (Value dy = resultGrads[0]; dy && needsGradient(getInput()))
    grads[0] = RoPEGradOp::create(b, getLoc(), getInput().getType(), dy, getPositions(),
                                  getThetaAttr(), getScalingFactorAttr(), getLowFreqFactorAttr(),
                                  getHighFreqFactorAttr(), getOriginalMaxPositionsAttr());
  return success();
}

LogicalResult AttentionOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                          function_ref<bool(Value)> needsGradient,
                                          SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dy = resultGrads[0];
  if (!dy)
    return success();
  auto grad = AttentionGradOp::create(b, getLoc(), getQuery().getType(), getKey().getType(),
                                      getValue().getType(), dy, getQuery(), getKey(), getValue(),
                                      getResult(), getSegmentIds(), getCausalAttr(), getScaleAttr(),
                                      getRingRanksAttr());
  if (needsGradient(getQuery()))
    grads[0] = grad.getQueryGrad();
  if (needsGradient(getKey()))
    grads[1] = grad.getKeyGrad();
  if (needsGradient(getValue()))
    grads[2] = grad.getValueGrad();
  return success();
}

LogicalResult SiLUOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                     function_ref<bool(Value)> needsGradient,
                                     SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  if (Value dy = resultGrads[0]; dy && needsGradient(getInput()))
    grads[0] = SiLUGradOp::create(b, getLoc(), getInput().getType(), dy, getInput());
  return success();
}

LogicalResult GeLUOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                     function_ref<bool(Value)> needsGradient,
                                     SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  if (Value dy = resultGrads[0]; dy && needsGradient(getInput()))
    grads[0] = GeLUGradOp::create(b, getLoc(), getInput().getType(), dy, getInput(),
                                  getApproximationAttr());
  return success();
}

LogicalResult SwiGLUOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                       function_ref<bool(Value)> needsGradient,
                                       SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dy = resultGrads[0];
  if (!dy)
    return success();
  Type t = getGate().getType();
  auto grad = SwiGLUGradOp::create(b, getLoc(), t, t, dy, getGate(), getUp());
  if (needsGradient(getGate()))
    grads[0] = grad.getGateGrad();
  if (needsGradient(getUp()))
    grads[1] = grad.getUpGrad();
  return success();
}

LogicalResult SoftmaxOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                        function_ref<bool(Value)> needsGradient,
                                        SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  if (Value dy = resultGrads[0]; dy && needsGradient(getInput()))
    grads[0] = SoftmaxGradOp::create(b, getLoc(), getInput().getType(), dy, getResult(),
                                     getAxisAttr());
  return success();
}

LogicalResult CrossEntropyOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                             function_ref<bool(Value)> needsGradient,
                                             SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  if (Value dloss = resultGrads[0]; dloss && needsGradient(getLogits()))
    grads[0] = CrossEntropyGradOp::create(b, getLoc(), getLogits().getType(), dloss,
                                          getLogits(), getLabels(), getIgnoreIndexAttr());
  return success();
}

LogicalResult ReshapeOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                        function_ref<bool(Value)> needsGradient,
                                        SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  if (Value dy = resultGrads[0]; dy && needsGradient(getInput()))
    grads[0] = ReshapeOp::create(b, getLoc(), getInput().getType(), dy);
  return success();
}

LogicalResult TransposeOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                          function_ref<bool(Value)> needsGradient,
                                          SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dy = resultGrads[0];
  if (!dy || !needsGradient(getInput()))
    return success();
  ArrayRef<int64_t> perm = getPermutation();
  SmallVector<int64_t> inverse(perm.size());
  for (auto [i, p] : llvm::enumerate(perm))
    inverse[p] = i;
  grads[0] = TransposeOp::create(b, getLoc(), getInput().getType(), dy,
                                 b.getDenseI64ArrayAttr(inverse));
  return success();
}

LogicalResult SliceOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                      function_ref<bool(Value)> needsGradient,
                                      SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  if (Value dy = resultGrads[0]; dy && needsGradient(getInput()))
    grads[0] = SliceGradOp::create(b, getLoc(), getInput().getType(), dy, getAxisAttr(),
                                   getStartAttr());
  return success();
}

LogicalResult ConcatOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                       function_ref<bool(Value)> needsGradient,
                                       SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  Value dy = resultGrads[0];
  int64_t start = 0, axis = getAxisAttr().getInt();
  for (auto [i, input] : llvm::enumerate(getInputs())) {
    if (dy && needsGradient(input))
      grads[i] = SliceOp::create(b, getLoc(), input.getType(), dy, getAxisAttr(),
                                 b.getI64IntegerAttr(start));
    start += cast<RankedTensorType>(input.getType()).getDimSize(axis);
  }
  return success();
}

LogicalResult CastOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                     function_ref<bool(Value)> needsGradient,
                                     SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  if (Value dy = resultGrads[0]; dy && needsGradient(getInput()))
    grads[0] = CastOp::create(b, getLoc(), getInput().getType(), dy);
  return success();
}

LogicalResult DoraScaleOp::buildGradients(OpBuilder &b, ValueRange resultGrads,
                                          function_ref<bool(Value)> needsGradient,
                                          SmallVectorImpl<Value> &grads) {
  resetGradients(*this, grads);
  // The norm is detached (DoRA, section 4.3): the op is linear in the magnitude, and the
  // weight, lora_a and lora_b get no gradient through it.
  if (Value dy = resultGrads[0]; dy && needsGradient(getMagnitude()))
    grads[0] = DoraScaleOp::create(b, getLoc(), getMagnitude().getType(), dy, getWeight(),
                                   getLoraA(), getLoraB(), getScaleAttr());
  return success();
}
