//===- BonsaiTrainingOps.cpp - backward, state and optimizer ops ----------===//
//
// Verifiers and costs of the ops the autodiff and optimizer passes create. A backward op's
// types follow from the forward op it differentiates; the verifiers check that, so that a bug
// in a gradient rule is caught where it is made.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

/// Fails unless `value` has exactly `expected` as type.
static LogicalResult expectType(Operation *op, StringRef what, Value value, Type expected) {
  if (value.getType() == expected)
    return success();
  return op->emitOpError() << what << " type: expected " << expected << ", got "
                           << value.getType();
}

//===----------------------------------------------------------------------===//
// Backward ops
//===----------------------------------------------------------------------===//

LogicalResult FillOp::verify() { return success(); }
OpCost FillOp::getForwardCost() { return streamingBytes(*this); }

LogicalResult EmbeddingGradOp::verify() {
  RankedTensorType dy = tensorType(getResultGrad()), ids = tensorType(getIds());
  RankedTensorType table = getResult().getType();
  if (failed(expectRank(*this, "result", table, 2)))
    return failure();
  SmallVector<int64_t> expected(ids.getShape());
  expected.push_back(table.getDimSize(1));
  if (failed(expectShape(*this, "result_grad", dy.getShape(), expected)))
    return failure();
  return expectElementType(*this, "result", table.getElementType(), dy.getElementType());
}

OpCost EmbeddingGradOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = getNumElements(tensorType(getResultGrad()));
  return cost;
}

LogicalResult LinearGradInputOp::verify() {
  RankedTensorType dy = tensorType(getResultGrad()), w = tensorType(getWeight());
  if (failed(expectRank(*this, "weight", w, 2)))
    return failure();
  if (dy.getShape().back() != w.getDimSize(0))
    return emitOpError() << "result_grad features (" << dy.getShape().back()
                         << ") must equal the weight's output features (" << w.getDimSize(0)
                         << ")";
  SmallVector<int64_t> expected(dy.getShape().drop_back());
  expected.push_back(w.getDimSize(1));
  return expectShape(*this, "result", getResult().getType().getShape(), expected);
}

OpCost LinearGradInputOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  RankedTensorType w = tensorType(getWeight());
  cost.matmulFlops = 2 * getNumElements(tensorType(getResultGrad())) * w.getDimSize(1);
  return cost;
}

LogicalResult LinearGradWeightOp::verify() {
  RankedTensorType dy = tensorType(getResultGrad()), x = tensorType(getInput());
  if (dy.getShape().drop_back() != x.getShape().drop_back())
    return emitOpError() << "result_grad " << fmt(dy.getShape()) << " and input "
                         << fmt(x.getShape()) << " differ in their leading dimensions";
  return expectShape(*this, "result", getResult().getType().getShape(),
                     {dy.getShape().back(), x.getShape().back()});
}

OpCost LinearGradWeightOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.matmulFlops =
      2 * getNumElements(tensorType(getResultGrad())) * tensorType(getInput()).getShape().back();
  return cost;
}

LogicalResult ReduceToOp::verify() {
  RankedTensorType in = tensorType(getInput()), out = getResult().getType();
  if (failed(expectElementType(*this, "result", out.getElementType(), in.getElementType())))
    return failure();
  if (out.getRank() > in.getRank())
    return emitOpError() << "result rank " << out.getRank() << " exceeds input rank "
                         << in.getRank();
  ArrayRef<int64_t> trailing = in.getShape().take_back(out.getRank());
  for (auto [o, i] : llvm::zip(out.getShape(), trailing))
    if (o != i && o != 1)
      return emitOpError() << "result shape " << fmt(out.getShape())
                           << " does not broadcast to input shape " << fmt(in.getShape());
  return success();
}

OpCost ReduceToOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = getNumElements(tensorType(getInput()));
  return cost;
}

LogicalResult RMSNormGradOp::verify() {
  if (failed(expectType(*this, "result_grad", getResultGrad(), getInput().getType())) ||
      failed(expectType(*this, "input_grad", getInputGrad(), getInput().getType())) ||
      failed(expectType(*this, "weight_grad", getWeightGrad(), getWeight().getType())))
    return failure();
  return expectShape(*this, "weight", tensorType(getWeight()).getShape(),
                     {tensorType(getInput()).getShape().back()});
}

OpCost RMSNormGradOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = 8 * getNumElements(tensorType(getInput()));
  return cost;
}

DictionaryAttr RMSNormGradOp::getKernelParams() {
  Builder b(getContext());
  return b.getDictionaryAttr({b.getNamedAttr("epsilon", getEpsilonAttr())});
}

LogicalResult LayerNormGradOp::verify() {
  if (failed(expectType(*this, "result_grad", getResultGrad(), getInput().getType())) ||
      failed(expectType(*this, "input_grad", getInputGrad(), getInput().getType())) ||
      failed(expectType(*this, "weight_grad", getWeightGrad(), getWeight().getType())) ||
      failed(expectType(*this, "bias_grad", getBiasGrad(), getWeight().getType())))
    return failure();
  return expectShape(*this, "weight", tensorType(getWeight()).getShape(),
                     {tensorType(getInput()).getShape().back()});
}

OpCost LayerNormGradOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = 12 * getNumElements(tensorType(getInput()));
  return cost;
}

DictionaryAttr LayerNormGradOp::getKernelParams() {
  Builder b(getContext());
  return b.getDictionaryAttr({b.getNamedAttr("epsilon", getEpsilonAttr())});
}

LogicalResult RoPEGradOp::verify() {
  if (tensorType(getResultGrad()).getRank() != 4 ||
      tensorType(getResultGrad()).getDimSize(3) % 2 != 0)
    return emitOpError("result_grad must be [batch, seq, heads, head_dim] with an even head_dim");
  auto f64 = [](std::optional<APFloat> v) -> std::optional<double> {
    return v ? std::optional<double>(v->convertToDouble()) : std::nullopt;
  };
  std::optional<int64_t> original;
  if (std::optional<uint64_t> v = getOriginalMaxPositions())
    original = int64_t(*v);
  if (failed(verifyTokenOperand(*this, "positions", getPositions(), getResultGrad())) ||
      failed(verifyRopeScaling(*this, f64(getScalingFactor()), f64(getLowFreqFactor()),
                               f64(getHighFreqFactor()), original)))
    return failure();
  return expectSameTypeAsOperand(*this, "result_grad", getResultGrad());
}

OpCost RoPEGradOp::getForwardCost() { return elementwiseCost(*this, 3); }

DictionaryAttr RoPEGradOp::getKernelParams() {
  return getRopeKernelParams(*this, getThetaAttr());
}

LogicalResult AttentionGradOp::verify() {
  if (failed(expectType(*this, "result_grad", getResultGrad(), getQuery().getType())) ||
      failed(expectType(*this, "output", getOutput(), getQuery().getType())) ||
      failed(expectType(*this, "value", getValue(), getKey().getType())) ||
      failed(expectType(*this, "query_grad", getQueryGrad(), getQuery().getType())) ||
      failed(expectType(*this, "key_grad", getKeyGrad(), getKey().getType())) ||
      failed(expectType(*this, "value_grad", getValueGrad(), getValue().getType())))
    return failure();
  RankedTensorType q = tensorType(getQuery()), k = tensorType(getKey());
  if (q.getRank() != 4 || k.getRank() != 4 || q.getDimSize(2) % k.getDimSize(2) != 0 ||
      q.getDimSize(3) != k.getDimSize(3) || q.getDimSize(1) != k.getDimSize(1))
    return emitOpError() << "query " << q << " and key " << k
                         << " are not [batch, seq, heads, head_dim] with grouped heads";
  if (failed(verifyRingSequence(*this, getRingRanks(), getQuery())))
    return failure();
  return verifyTokenOperand(*this, "segment_ids", getSegmentIds(), getQuery());
}

OpCost AttentionGradOp::getForwardCost() {
  RankedTensorType q = tensorType(getQuery()), k = tensorType(getKey());
  int64_t pairs = attentionScoredPairs(q.getDimSize(1), getCausal(), getRingRanks());
  int64_t batchHeads = q.getDimSize(0) * q.getDimSize(2);
  // Scores recomputed (Q·Kᵀ), then dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q.
  OpCost cost = streamingBytes(*this);
  cost.matmulFlops = 10 * batchHeads * k.getDimSize(3) * pairs;
  cost.vectorFlops = 8 * batchHeads * pairs;
  return cost;
}

LogicalResult SiLUGradOp::verify() {
  if (failed(expectType(*this, "input", getInput(), getResultGrad().getType())))
    return failure();
  return expectSameTypeAsOperand(*this, "result_grad", getResultGrad());
}
OpCost SiLUGradOp::getForwardCost() { return elementwiseCost(*this, 6); }

LogicalResult GeLUGradOp::verify() {
  if (failed(expectType(*this, "input", getInput(), getResultGrad().getType())))
    return failure();
  return expectSameTypeAsOperand(*this, "result_grad", getResultGrad());
}
OpCost GeLUGradOp::getForwardCost() { return elementwiseCost(*this, 12); }

DictionaryAttr GeLUGradOp::getKernelParams() {
  Builder b(getContext());
  return b.getDictionaryAttr({b.getNamedAttr(
      "tanh", b.getBoolAttr(getApproximation() == GeluApproximation::Tanh))});
}

LogicalResult SwiGLUGradOp::verify() {
  Type t = getResultGrad().getType();
  if (failed(expectType(*this, "gate", getGate(), t)) ||
      failed(expectType(*this, "up", getUp(), t)) ||
      failed(expectType(*this, "gate_grad", getGateGrad(), t)) ||
      failed(expectType(*this, "up_grad", getUpGrad(), t)))
    return failure();
  return success();
}
OpCost SwiGLUGradOp::getForwardCost() { return elementwiseCost(*this, 8); }

LogicalResult SoftmaxGradOp::verify() {
  int64_t rank = tensorType(getOutput()).getRank(), axis = getAxisAttr().getInt();
  if (axis < 0 || axis >= rank)
    return emitOpError() << "axis " << axis << " is out of range for rank " << rank;
  if (failed(expectType(*this, "output", getOutput(), getResultGrad().getType())))
    return failure();
  return expectSameTypeAsOperand(*this, "result_grad", getResultGrad());
}
OpCost SoftmaxGradOp::getForwardCost() { return elementwiseCost(*this, 4); }

LogicalResult CrossEntropyGradOp::verify() {
  RankedTensorType logits = tensorType(getLogits()), labels = tensorType(getLabels());
  if (logits.getRank() < 2)
    return emitOpError() << "logits rank: expected at least 2, got " << logits.getRank();
  if (failed(expectShape(*this, "labels", labels.getShape(), logits.getShape().drop_back())))
    return failure();
  return expectSameTypeAsOperand(*this, "logits", getLogits());
}

OpCost CrossEntropyGradOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = 5 * getNumElements(tensorType(getLogits()));
  return cost;
}

DictionaryAttr CrossEntropyGradOp::getKernelParams() {
  Builder b(getContext());
  return b.getDictionaryAttr({b.getNamedAttr("ignore_index", getIgnoreIndexAttr())});
}

LogicalResult SliceGradOp::verify() {
  RankedTensorType dy = tensorType(getResultGrad()), dx = getResult().getType();
  int64_t axis = getAxisAttr().getInt(), start = getStartAttr().getInt();
  if (failed(expectRank(*this, "result", dx, dy.getRank())))
    return failure();
  if (axis < 0 || axis >= dx.getRank())
    return emitOpError() << "axis " << axis << " is out of range for rank " << dx.getRank();
  for (int64_t d = 0; d < dx.getRank(); ++d)
    if (d != axis && dx.getDimSize(d) != dy.getDimSize(d))
      return emitOpError() << "result dimension " << d << ": expected " << dy.getDimSize(d)
                           << ", got " << dx.getDimSize(d);
  if (start < 0 || start > dx.getDimSize(axis) - dy.getDimSize(axis))
    return emitOpError() << "range [" << start << ", " << start + dy.getDimSize(axis)
                         << ") is outside dimension " << axis << " of size "
                         << dx.getDimSize(axis);
  return expectElementType(*this, "result", dx.getElementType(), dy.getElementType());
}

OpCost SliceGradOp::getForwardCost() { return streamingBytes(*this); }

//===----------------------------------------------------------------------===//
// State and optimizer ops
//===----------------------------------------------------------------------===//

LogicalResult StateOp::verify() {
  if (getName().empty())
    return emitOpError("state name must not be empty");
  if (getCopyOf() && getKind() != StateKind::Optimizer)
    return emitOpError("only optimizer state can start as a copy of a parameter");
  return verifyShardedValue(*this, "state '" + getName().str() + "'", getResult(),
                            getShardingAttr());
}

LogicalResult GradNormOp::verify() {
  if (getGradients().empty())
    return emitOpError("needs at least one gradient");
  return success();
}

OpCost GradNormOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  for (Value g : getGradients())
    cost.vectorFlops += 2 * getNumElements(tensorType(g));
  return cost;
}

LogicalResult LearningRateOp::verify() {
  double lr = getLr().convertToDouble();
  if (!(lr > 0))
    return emitOpError() << "lr must be positive, got " << lr;
  if (getSchedule() != "constant" && getSchedule() != "cosine")
    return emitOpError() << "unknown schedule '" << getSchedule()
                         << "'; expected 'constant' or 'cosine'";
  int64_t warmup = getWarmupStepsAttr().getInt(), total = getTotalStepsAttr().getInt();
  if (warmup < 0 || (getSchedule() == "cosine" && total <= warmup))
    return emitOpError() << "warmup_steps (" << warmup << ") and total_steps (" << total
                         << ") do not describe a schedule";
  return success();
}

OpCost LearningRateOp::getForwardCost() { return streamingBytes(*this); }

/// Moments and master copies are f32 tensors of the parameter's shape.
static LogicalResult verifyF32StateOf(Operation *op, StringRef what, Value state,
                                      Value param) {
  auto type = tensorType(state);
  if (!type.getElementType().isF32() ||
      type.getShape() != tensorType(param).getShape())
    return op->emitOpError() << what << " must be an f32 tensor of the parameter's shape "
                             << fmt(tensorType(param).getShape()) << ", got " << type;
  return success();
}

LogicalResult AdamWUpdateOp::verify() {
  if (tensorType(getGradient()).getShape() != tensorType(getParam()).getShape())
    return emitOpError() << "gradient " << getGradient().getType()
                         << " does not match parameter " << getParam().getType();
  if (failed(verifyF32StateOf(*this, "exp_avg", getExpAvg(), getParam())) ||
      failed(verifyF32StateOf(*this, "exp_avg_sq", getExpAvgSq(), getParam())))
    return failure();
  if (getMaster() && failed(verifyF32StateOf(*this, "master", getMaster(), getParam())))
    return failure();
  for (auto [name, v] : {std::pair<StringRef, double>{"beta1", getBeta1().convertToDouble()},
                         {"beta2", getBeta2().convertToDouble()}})
    if (!(v >= 0 && v < 1))
      return emitOpError() << name << " must be in [0, 1), got " << v;
  return success();
}

OpCost AdamWUpdateOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.bytesWritten = cost.bytesRead - getStorageBytes(getGradient().getType());
  cost.vectorFlops = 12 * getNumElements(tensorType(getParam()));
  return cost;
}

LogicalResult SGDUpdateOp::verify() {
  if (tensorType(getGradient()).getShape() != tensorType(getParam()).getShape())
    return emitOpError() << "gradient " << getGradient().getType()
                         << " does not match parameter " << getParam().getType();
  if (failed(verifyF32StateOf(*this, "momentum_buffer", getMomentumBuffer(), getParam())))
    return failure();
  if (getMaster() && failed(verifyF32StateOf(*this, "master", getMaster(), getParam())))
    return failure();
  return success();
}

OpCost SGDUpdateOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.bytesWritten = cost.bytesRead - getStorageBytes(getGradient().getType());
  cost.vectorFlops = 5 * getNumElements(tensorType(getParam()));
  return cost;
}

LogicalResult StepIncrementOp::verify() { return success(); }
OpCost StepIncrementOp::getForwardCost() { return {0, 1, 8, 8}; }

LogicalResult AccumulateOp::verify() {
  if (tensorType(getGradient()).getShape() != tensorType(getAccumulator()).getShape())
    return emitOpError() << "gradient " << getGradient().getType()
                         << " does not match accumulator " << getAccumulator().getType();
  return success();
}

OpCost AccumulateOp::getForwardCost() {
  int64_t g = getStorageBytes(getGradient().getType());
  int64_t acc = getStorageBytes(getAccumulator().getType());
  return {0, getNumElements(tensorType(getGradient())), g + acc, acc};
}

LogicalResult AccumulateMaxOp::verify() {
  if (getStatistics().getType() != getAccumulator().getType())
    return emitOpError() << "statistics " << getStatistics().getType()
                         << " do not match accumulator " << getAccumulator().getType();
  if (!tensorType(getStatistics()).getElementType().isF32())
    return emitOpError() << "takes f32 statistics, got " << getStatistics().getType();
  return success();
}

OpCost AccumulateMaxOp::getForwardCost() {
  int64_t bytes = getStorageBytes(getAccumulator().getType());
  return {0, getNumElements(tensorType(getStatistics())), 2 * bytes, bytes};
}

LogicalResult ZeroOp::verify() { return success(); }
OpCost ZeroOp::getForwardCost() { return {0, 0, 0, getStorageBytes(getTarget().getType())}; }

//===----------------------------------------------------------------------===//
// Host offload
//===----------------------------------------------------------------------===//

// The copies move their bytes over PCIe, not through device memory twice; their cost is the
// bytes, which the device side reads or writes once.
OpCost CopyH2DOp::getForwardCost() {
  int64_t bytes = getStorageBytes(getSource().getType());
  return {0, 0, bytes, bytes};
}

LogicalResult CopyD2HOp::verify() {
  return expectType(*this, "target", getTarget(), getSource().getType());
}

OpCost CopyD2HOp::getForwardCost() {
  int64_t bytes = getStorageBytes(getSource().getType());
  return {0, 0, bytes, bytes};
}

StringRef CopyToHostOp::getKernelName() { return "copy_d2h"; }
bool CopyToHostOp::hasHostResults() { return true; }
OpCost CopyToHostOp::getForwardCost() {
  int64_t bytes = getStorageBytes(getSource().getType());
  return {0, 0, bytes, bytes};
}

LogicalResult CopyToDeviceOp::verify() {
  return expectType(*this, "target", getTarget(), getSource().getType());
}
StringRef CopyToDeviceOp::getKernelName() { return "copy_h2d"; }
SmallVector<unsigned> CopyToDeviceOp::getInPlaceOperands() { return {1}; }
OpCost CopyToDeviceOp::getForwardCost() {
  int64_t bytes = getStorageBytes(getSource().getType());
  return {0, 0, bytes, bytes};
}
