//===- BonsaiFusedOptimizerOps.cpp - multi-tensor optimizer updates -------===//
//
// Verifiers and costs of the multi-tensor updates (BonsaiFusedOptimizerOps.td), and the
// MultiTensorUpdateOpInterface of the per-parameter updates they replace: what an update
// shares with the others (scalars, hyper-parameters) and how a group of them becomes one op.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

namespace {

/// Checks the lists of a multi-tensor update: `lists` (name, values) other than the masters
/// have one value per gradient; masters none or one per gradient; gradient i has parameter i's
/// shape, every state list is f32 of that shape; all gradients share an element type, as do
/// all parameters (one kernel instantiation serves them all).
LogicalResult verifyLists(Operation *op, ValueRange gradients, ValueRange params,
                          ArrayRef<std::pair<StringRef, ValueRange>> states, ValueRange masters) {
  size_t n = gradients.size();
  if (n == 0)
    return op->emitOpError("needs at least one parameter to update");
  if (params.size() != n)
    return op->emitOpError() << "has " << n << " gradients but " << params.size()
                             << " params";
  for (auto [name, values] : states)
    if (values.size() != n)
      return op->emitOpError() << "has " << n << " gradients but " << values.size() << " "
                               << name;
  if (!masters.empty() && masters.size() != n)
    return op->emitOpError() << "has " << n << " gradients but " << masters.size()
                             << " masters (expected none or one per parameter)";
  Type gradElement = tensorType(gradients[0]).getElementType();
  Type paramElement = tensorType(params[0]).getElementType();
  for (size_t i = 0; i < n; ++i) {
    RankedTensorType g = tensorType(gradients[i]), p = tensorType(params[i]);
    if (g.getShape() != p.getShape())
      return op->emitOpError() << "gradient #" << i << " " << g << " does not match param #"
                               << i << " " << p;
    if (g.getElementType() != gradElement)
      return op->emitOpError() << "gradient #" << i << " element type " << g.getElementType()
                               << " differs from gradient #0's " << gradElement;
    if (p.getElementType() != paramElement)
      return op->emitOpError() << "param #" << i << " element type " << p.getElementType()
                               << " differs from param #0's " << paramElement;
    auto checkState = [&](StringRef name, Value state) -> LogicalResult {
      RankedTensorType s = tensorType(state);
      if (s.getElementType().isF32() && s.getShape() == p.getShape())
        return success();
      return op->emitOpError() << name << " #" << i
                               << " must be an f32 tensor of the parameter's shape "
                               << fmt(p.getShape()) << ", got " << s;
    };
    for (auto [name, values] : states)
      if (failed(checkState(name, values[i])))
        return failure();
    if (!masters.empty() && failed(checkState("master", masters[i])))
      return failure();
  }
  return success();
}

/// Bytes and FLOPs of a multi-tensor update: every operand read; everything but the
/// gradients and the shared scalars written back; `flopsPerElement` per parameter element.
OpCost multiTensorCost(Operation *op, ValueRange gradients, ValueRange params,
                       int64_t flopsPerElement) {
  OpCost cost;
  for (Value v : op->getOperands()) {
    int64_t bytes = getStorageBytes(v.getType());
    cost.bytesRead += bytes;
    if (tensorType(v).getRank() > 0)
      cost.bytesWritten += bytes;
  }
  for (Value g : gradients)
    cost.bytesWritten -= getStorageBytes(g.getType());
  for (Value p : params)
    cost.vectorFlops += flopsPerElement * getNumElements(tensorType(p));
  return cost;
}

} // namespace

//===----------------------------------------------------------------------===//
// MultiTensorAdamWUpdateOp
//===----------------------------------------------------------------------===//

LogicalResult MultiTensorAdamWUpdateOp::verify() {
  if (failed(verifyLists(*this, getGradients(), getParams(),
                         {{"exp_avg", getExpAvgs()}, {"exp_avg_sq", getExpAvgSqs()}},
                         getMasters())))
    return failure();
  for (auto [name, v] : {std::pair<StringRef, double>{"beta1", getBeta1().convertToDouble()},
                         {"beta2", getBeta2().convertToDouble()}})
    if (!(v >= 0 && v < 1))
      return emitOpError() << name << " must be in [0, 1), got " << v;
  return success();
}

// The hyper-parameters, not the operand segment sizes the op also stores.
DictionaryAttr MultiTensorAdamWUpdateOp::getKernelParams() {
  Builder b(getContext());
  return b.getDictionaryAttr({b.getNamedAttr("beta1", getBeta1Attr()),
                              b.getNamedAttr("beta2", getBeta2Attr()),
                              b.getNamedAttr("eps", getEpsAttr()),
                              b.getNamedAttr("weight_decay", getWeightDecayAttr()),
                              b.getNamedAttr("grad_clip", getGradClipAttr())});
}

OpCost MultiTensorAdamWUpdateOp::getForwardCost() {
  return multiTensorCost(*this, getGradients(), getParams(), 12);
}

//===----------------------------------------------------------------------===//
// MultiTensorSGDUpdateOp
//===----------------------------------------------------------------------===//

LogicalResult MultiTensorSGDUpdateOp::verify() {
  return verifyLists(*this, getGradients(), getParams(),
                     {{"momentum_buffer", getMomentumBuffers()}}, getMasters());
}

DictionaryAttr MultiTensorSGDUpdateOp::getKernelParams() {
  Builder b(getContext());
  return b.getDictionaryAttr({b.getNamedAttr("momentum", getMomentumAttr()),
                              b.getNamedAttr("weight_decay", getWeightDecayAttr()),
                              b.getNamedAttr("grad_clip", getGradClipAttr())});
}

OpCost MultiTensorSGDUpdateOp::getForwardCost() {
  return multiTensorCost(*this, getGradients(), getParams(), 5);
}

//===----------------------------------------------------------------------===//
// MultiTensorUpdateOpInterface of the per-parameter updates
//===----------------------------------------------------------------------===//

SmallVector<Value> AdamWUpdateOp::getSharedOperands() {
  return {getStep(), getLr(), getGradNorm()};
}

SmallVector<Value> AdamWUpdateOp::getTensorOperands() {
  SmallVector<Value> values = {getGradient(), getParam(), getExpAvg(), getExpAvgSq()};
  if (getMaster())
    values.push_back(getMaster());
  return values;
}

DictionaryAttr AdamWUpdateOp::getHyperParameters() {
  Builder b(getContext());
  return b.getDictionaryAttr({b.getNamedAttr("beta1", getBeta1Attr()),
                              b.getNamedAttr("beta2", getBeta2Attr()),
                              b.getNamedAttr("eps", getEpsAttr()),
                              b.getNamedAttr("weight_decay", getWeightDecayAttr()),
                              b.getNamedAttr("grad_clip", getGradClipAttr())});
}

Operation *AdamWUpdateOp::buildMultiTensorUpdate(OpBuilder &builder,
                                                 ArrayRef<Operation *> updates) {
  SmallVector<Value> gradients, params, m, v, masters;
  for (Operation *op : updates) {
    auto update = cast<AdamWUpdateOp>(op);
    gradients.push_back(update.getGradient());
    params.push_back(update.getParam());
    m.push_back(update.getExpAvg());
    v.push_back(update.getExpAvgSq());
    if (update.getMaster())
      masters.push_back(update.getMaster());
  }
  return MultiTensorAdamWUpdateOp::create(builder, getLoc(), getStep(), getLr(), getGradNorm(),
                                          gradients, params, m, v, masters, getBeta1Attr(),
                                          getBeta2Attr(), getEpsAttr(), getWeightDecayAttr(),
                                          getGradClipAttr());
}

SmallVector<Value> SGDUpdateOp::getSharedOperands() { return {getLr(), getGradNorm()}; }

SmallVector<Value> SGDUpdateOp::getTensorOperands() {
  SmallVector<Value> values = {getGradient(), getParam(), getMomentumBuffer()};
  if (getMaster())
    values.push_back(getMaster());
  return values;
}

DictionaryAttr SGDUpdateOp::getHyperParameters() {
  Builder b(getContext());
  return b.getDictionaryAttr({b.getNamedAttr("momentum", getMomentumAttr()),
                              b.getNamedAttr("weight_decay", getWeightDecayAttr()),
                              b.getNamedAttr("grad_clip", getGradClipAttr())});
}

Operation *SGDUpdateOp::buildMultiTensorUpdate(OpBuilder &builder,
                                               ArrayRef<Operation *> updates) {
  SmallVector<Value> gradients, params, buffers, masters;
  for (Operation *op : updates) {
    auto update = cast<SGDUpdateOp>(op);
    gradients.push_back(update.getGradient());
    params.push_back(update.getParam());
    buffers.push_back(update.getMomentumBuffer());
    if (update.getMaster())
      masters.push_back(update.getMaster());
  }
  return MultiTensorSGDUpdateOp::create(builder, getLoc(), getLr(), getGradNorm(), gradients,
                                        params, buffers, masters, getMomentumAttr(),
                                        getWeightDecayAttr(), getGradClipAttr());
}

//===----------------------------------------------------------------------===//
// OptimizerStateOpInterface
//===----------------------------------------------------------------------===//

// ODS operand groups: adamw_update (gradient, step, lr, grad_norm, param, exp_avg,
// exp_avg_sq, master), sgd_update (gradient, lr, grad_norm, param, momentum_buffer, master);
// the multi-tensor updates have the same groups as lists.

SmallVector<unsigned> AdamWUpdateOp::getOptimizerStateOperands() {
  return odsOperandIndices(*this, {5, 6});
}
SmallVector<unsigned> AdamWUpdateOp::getMasterWeightOperands() {
  return odsOperandIndices(*this, {7});
}
std::optional<unsigned> AdamWUpdateOp::getHostStepParamOperand() {
  return odsOperandIndices(*this, {4}).front();
}

// Without momentum, SGD neither reads nor needs its buffer: it keeps no state.
SmallVector<unsigned> SGDUpdateOp::getOptimizerStateOperands() {
  if (getMomentum().isZero())
    return {};
  return odsOperandIndices(*this, {4});
}
SmallVector<unsigned> SGDUpdateOp::getMasterWeightOperands() {
  return odsOperandIndices(*this, {5});
}
std::optional<unsigned> SGDUpdateOp::getHostStepParamOperand() {
  return odsOperandIndices(*this, {3}).front();
}

SmallVector<unsigned> MultiTensorAdamWUpdateOp::getOptimizerStateOperands() {
  return odsOperandIndices(*this, {5, 6});
}
SmallVector<unsigned> MultiTensorAdamWUpdateOp::getMasterWeightOperands() {
  return odsOperandIndices(*this, {7});
}

SmallVector<unsigned> MultiTensorSGDUpdateOp::getOptimizerStateOperands() {
  if (getMomentum().isZero())
    return {};
  return odsOperandIndices(*this, {4});
}
SmallVector<unsigned> MultiTensorSGDUpdateOp::getMasterWeightOperands() {
  return odsOperandIndices(*this, {5});
}
