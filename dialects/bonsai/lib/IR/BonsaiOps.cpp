//===- BonsaiOps.cpp - bonsai model operations ----------------------------===//
//
// Verifiers and costs of the model ops. Every verifier names the operand, what it expected and
// what it got, so that a shape bug in a hand-written or imported model is found at parse time.
// FLOP counts are those of a straightforward kernel; they are documented in docs/cost-model.md.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

#include "OpUtils.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallBitVector.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace mlir::bonsai;

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

using namespace mlir::bonsai::detail;

//===----------------------------------------------------------------------===//
// ParamOp
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  if (getName().empty())
    return emitOpError("parameter name must not be empty");
  RankedTensorType type = getResult().getType();
  Type element = type.getElementType();
  if (getTrainable() && !isa<BFloat16Type, Float16Type, Float32Type>(element))
    return emitOpError() << "trainable parameter '" << getName()
                         << "' must have a bf16, f16 or f32 element type, got " << element;
  if (auto nf4 = dyn_cast<NF4Type>(element)) {
    int64_t n = getNumElements(type);
    if (n % nf4.getBlockSize() != 0)
      return emitOpError() << "NF4 parameter '" << getName() << "' has " << n
                           << " elements, not a multiple of the block size "
                           << nf4.getBlockSize();
  }
  if (failed(verifyShardedValue(*this, "parameter '" + getName().str() + "'", getResult(),
                                getShardingAttr())))
    return failure();
  return success();
}

// Parameters are bound, not computed: they cost nothing in the step.
OpCost ParamOp::getForwardCost() { return {}; }

//===----------------------------------------------------------------------===//
// EmbeddingOp
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::verify() {
  RankedTensorType table = tensorType(getTable());
  RankedTensorType ids = tensorType(getIds());
  if (failed(expectRank(*this, "table", table, 2)))
    return failure();
  SmallVector<int64_t> expected(ids.getShape());
  expected.push_back(table.getDimSize(1));
  RankedTensorType result = getResult().getType();
  if (failed(expectShape(*this, "result", result.getShape(), expected)) ||
      failed(expectElementType(*this, "result", result.getElementType(),
                               table.getElementType())))
    return failure();
  return success();
}

OpCost EmbeddingOp::getForwardCost() {
  // A gather reads only the rows it needs: as many bytes as it writes, plus the ids.
  OpCost cost;
  int64_t out = getStorageBytes(getResult().getType());
  cost.bytesRead = getStorageBytes(getIds().getType()) + out;
  cost.bytesWritten = out;
  return cost;
}

OpCost EmbeddingOp::getBackwardCost(function_ref<bool(Value)> needsGradient) {
  if (!needsGradient(getTable()))
    return {};
  // Zero the table gradient, then scatter-add one row per id.
  OpCost cost;
  int64_t rows = getStorageBytes(getResult().getType());
  cost.vectorFlops = getNumElements(getResult().getType());
  cost.bytesRead = rows + getStorageBytes(getIds().getType());
  cost.bytesWritten = getStorageBytes(getTable().getType()) + rows;
  return cost;
}

//===----------------------------------------------------------------------===//
// LinearOp
//===----------------------------------------------------------------------===//

LogicalResult LinearOp::verify() {
  RankedTensorType input = tensorType(getInput());
  RankedTensorType weight = tensorType(getWeight());
  RankedTensorType result = getResult().getType();
  if (input.getRank() < 1)
    return emitOpError("input must have rank at least 1 (its last dimension is the features)");
  if (failed(expectRank(*this, "weight", weight, 2)))
    return failure();
  int64_t inFeatures = input.getShape().back();
  if (weight.getDimSize(1) != inFeatures)
    return emitOpError() << "weight shape: expected [out, " << inFeatures
                         << "] (Hugging Face [out, in] layout for input features " << inFeatures
                         << "), got " << fmt(weight.getShape());
  if (failed(expectElementType(*this, "weight", weight.getElementType(),
                               input.getElementType())))
    return failure();
  int64_t outFeatures = weight.getDimSize(0);
  if (Value bias = getBias()) {
    RankedTensorType biasType = tensorType(bias);
    if (failed(expectShape(*this, "bias", biasType.getShape(), {outFeatures})) ||
        failed(expectElementType(*this, "bias", biasType.getElementType(),
                                 input.getElementType())))
      return failure();
  }
  SmallVector<int64_t> expected(input.getShape().drop_back());
  expected.push_back(outFeatures);
  if (failed(expectShape(*this, "result", result.getShape(), expected)) ||
      failed(expectElementType(*this, "result", result.getElementType(),
                               input.getElementType())))
    return failure();
  return success();
}

namespace {
/// Rows (M), reduction (K) and columns (N) of a linear's GEMM.
struct GemmShape {
  int64_t m, k, n;
  int64_t flops() const { return 2 * m * k * n; }
};

GemmShape getGemmShape(LinearOp op) {
  RankedTensorType input = tensorType(op.getInput());
  int64_t k = input.getShape().back();
  return {getNumElements(input) / k, k, tensorType(op.getWeight()).getDimSize(0)};
}
} // namespace

OpCost LinearOp::getForwardCost() {
  GemmShape gemm = getGemmShape(*this);
  OpCost cost = streamingBytes(*this);
  cost.matmulFlops = gemm.flops();
  if (getBias())
    cost.vectorFlops = gemm.m * gemm.n;
  return cost;
}

OpCost LinearOp::getBackwardCost(function_ref<bool(Value)> needsGradient) {
  GemmShape gemm = getGemmShape(*this);
  int64_t x = getStorageBytes(getInput().getType());
  int64_t w = getStorageBytes(getWeight().getType());
  int64_t dy = getStorageBytes(getResult().getType());
  OpCost cost;
  if (needsGradient(getInput())) { // dX = dY · W
    cost.matmulFlops += gemm.flops();
    cost.bytesRead += dy + w;
    cost.bytesWritten += x;
  }
  if (needsGradient(getWeight())) { // dW = dYᵀ · X
    cost.matmulFlops += gemm.flops();
    cost.bytesRead += dy + x;
    cost.bytesWritten += w;
  }
  if (getBias() && needsGradient(getBias())) { // db = Σ dY
    cost.vectorFlops += gemm.m * gemm.n;
    cost.bytesRead += dy;
    cost.bytesWritten += getStorageBytes(getBias().getType());
  }
  return cost;
}

//===----------------------------------------------------------------------===//
// MatmulOp
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::verify() {
  RankedTensorType lhs = tensorType(getLhs());
  RankedTensorType rhs = tensorType(getRhs());
  if (lhs.getRank() < 2)
    return emitOpError() << "lhs rank: expected at least 2, got " << lhs.getRank();
  if (failed(expectRank(*this, "rhs", rhs, lhs.getRank())))
    return failure();
  int64_t rank = lhs.getRank();
  if (lhs.getShape().drop_back(2) != rhs.getShape().drop_back(2))
    return emitOpError() << "batch dimensions differ: lhs " << fmt(lhs.getShape().drop_back(2))
                         << ", rhs " << fmt(rhs.getShape().drop_back(2));
  if (lhs.getDimSize(rank - 1) != rhs.getDimSize(rank - 2))
    return emitOpError() << "contraction dimension: lhs has " << lhs.getDimSize(rank - 1)
                         << ", rhs has " << rhs.getDimSize(rank - 2);
  if (failed(expectElementType(*this, "rhs", rhs.getElementType(), lhs.getElementType())))
    return failure();
  SmallVector<int64_t> expected(lhs.getShape().drop_back(1));
  expected.push_back(rhs.getDimSize(rank - 1));
  RankedTensorType result = getResult().getType();
  if (failed(expectShape(*this, "result", result.getShape(), expected)) ||
      failed(expectElementType(*this, "result", result.getElementType(),
                               lhs.getElementType())))
    return failure();
  return success();
}

static int64_t matmulFlops(MatmulOp op) {
  RankedTensorType lhs = tensorType(op.getLhs());
  return 2 * getNumElements(lhs) * tensorType(op.getRhs()).getShape().back();
}

OpCost MatmulOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.matmulFlops = matmulFlops(*this);
  return cost;
}

OpCost MatmulOp::getBackwardCost(function_ref<bool(Value)> needsGradient) {
  OpCost cost;
  int64_t dy = getStorageBytes(getResult().getType());
  int64_t a = getStorageBytes(getLhs().getType());
  int64_t b = getStorageBytes(getRhs().getType());
  if (needsGradient(getLhs())) { // dA = dC · Bᵀ
    cost.matmulFlops += matmulFlops(*this);
    cost.bytesRead += dy + b;
    cost.bytesWritten += a;
  }
  if (needsGradient(getRhs())) { // dB = Aᵀ · dC
    cost.matmulFlops += matmulFlops(*this);
    cost.bytesRead += dy + a;
    cost.bytesWritten += b;
  }
  return cost;
}

//===----------------------------------------------------------------------===//
// AddOp, MulOp
//===----------------------------------------------------------------------===//

static LogicalResult verifyBroadcastBinary(Operation *op) {
  RankedTensorType lhs = tensorType(op->getOperand(0));
  RankedTensorType rhs = tensorType(op->getOperand(1));
  if (failed(expectElementType(op, "rhs", rhs.getElementType(), lhs.getElementType())))
    return failure();
  if (rhs.getRank() > lhs.getRank())
    return op->emitOpError() << "rhs rank " << rhs.getRank() << " exceeds lhs rank "
                             << lhs.getRank() << " (only rhs is broadcast)";
  ArrayRef<int64_t> trailing = lhs.getShape().take_back(rhs.getRank());
  for (auto [i, pair] : llvm::enumerate(llvm::zip(rhs.getShape(), trailing))) {
    auto [r, l] = pair;
    if (r != l && r != 1)
      return op->emitOpError() << "rhs shape " << fmt(rhs.getShape())
                               << " does not broadcast to lhs shape " << fmt(lhs.getShape())
                               << ": rhs dimension " << i << " is " << r << ", expected " << l
                               << " or 1";
  }
  return expectSameTypeAsOperand(op, "lhs", op->getOperand(0));
}

LogicalResult AddOp::verify() { return verifyBroadcastBinary(*this); }
LogicalResult MulOp::verify() { return verifyBroadcastBinary(*this); }
OpCost AddOp::getForwardCost() { return elementwiseCost(*this, 1); }
OpCost MulOp::getForwardCost() { return elementwiseCost(*this, 1); }

//===----------------------------------------------------------------------===//
// DoraScaleOp
//===----------------------------------------------------------------------===//

LogicalResult DoraScaleOp::verify() {
  RankedTensorType weight = tensorType(getWeight()), a = tensorType(getLoraA()),
                   b = tensorType(getLoraB()), m = tensorType(getMagnitude());
  if (failed(expectRank(*this, "weight", weight, 2)))
    return failure();
  int64_t out = weight.getDimSize(0), in = weight.getDimSize(1);
  if (failed(expectRank(*this, "lora_a", a, 2)))
    return failure();
  int64_t rank = a.getDimSize(0);
  Type element = weight.getElementType();
  if (failed(expectShape(*this, "lora_a", a.getShape(), {rank, in})) ||
      failed(expectShape(*this, "lora_b", b.getShape(), {out, rank})) ||
      failed(expectShape(*this, "magnitude", m.getShape(), {out})) ||
      failed(expectElementType(*this, "lora_a", a.getElementType(), element)) ||
      failed(expectElementType(*this, "lora_b", b.getElementType(), element)) ||
      failed(expectElementType(*this, "magnitude", m.getElementType(), element)))
    return failure();
  double scale = getScale().convertToDouble();
  if (!std::isfinite(scale))
    return emitOpError() << "scale must be finite, got " << scale;
  return expectSameTypeAsOperand(*this, "magnitude", getMagnitude());
}

OpCost DoraScaleOp::getForwardCost() {
  // Per output row: r multiply-adds per weight element (the row of B·A), then the square
  // and sum; one division per row. Vector work: the kernel is a reduction, not a GEMM.
  RankedTensorType weight = tensorType(getWeight());
  int64_t rank = tensorType(getLoraA()).getDimSize(0);
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = getNumElements(weight) * (2 * rank + 3) + weight.getDimSize(0);
  return cost;
}

OpCost DoraScaleOp::getBackwardCost(function_ref<bool(Value)> needsGradient) {
  // Only the magnitude has a gradient, the same op on the incoming gradient.
  if (!needsGradient(getMagnitude()))
    return {};
  return getForwardCost();
}

//===----------------------------------------------------------------------===//
// RMSNormOp, LayerNormOp
//===----------------------------------------------------------------------===//

static LogicalResult verifyNormParam(Operation *op, StringRef what, Value input, Value param) {
  RankedTensorType in = tensorType(input);
  RankedTensorType p = tensorType(param);
  if (in.getRank() < 1)
    return op->emitOpError("input must have rank at least 1");
  if (failed(expectShape(op, what, p.getShape(), {in.getShape().back()})) ||
      failed(expectElementType(op, what, p.getElementType(), in.getElementType())))
    return failure();
  return success();
}

static LogicalResult verifyEpsilon(Operation *op, double epsilon) {
  if (epsilon > 0)
    return success();
  return op->emitOpError() << "epsilon must be positive, got " << epsilon;
}

LogicalResult RMSNormOp::verify() {
  if (failed(verifyNormParam(*this, "weight", getInput(), getWeight())) ||
      failed(verifyEpsilon(*this, getEpsilon().convertToDouble())))
    return failure();
  return expectSameTypeAsOperand(*this, "input", getInput());
}

// Square, sum, scale by the reciprocal root, times the weight.
OpCost RMSNormOp::getForwardCost() { return elementwiseCost(*this, 4); }

LogicalResult LayerNormOp::verify() {
  if (failed(verifyNormParam(*this, "weight", getInput(), getWeight())) ||
      failed(verifyNormParam(*this, "bias", getInput(), getBias())) ||
      failed(verifyEpsilon(*this, getEpsilon().convertToDouble())))
    return failure();
  return expectSameTypeAsOperand(*this, "input", getInput());
}

// Mean, subtract, square, sum, scale, times weight, plus bias.
OpCost LayerNormOp::getForwardCost() { return elementwiseCost(*this, 7); }

//===----------------------------------------------------------------------===//
// RoPEOp
//===----------------------------------------------------------------------===//

LogicalResult RoPEOp::verify() {
  RankedTensorType input = tensorType(getInput());
  if (input.getRank() != 4)
    return emitOpError() << "input rank: expected 4 ([batch, seq, heads, head_dim]), got "
                         << input.getRank();
  if (input.getDimSize(3) % 2 != 0)
    return emitOpError() << "head_dim must be even to rotate pairs, got "
                         << input.getDimSize(3);
  if (!(getTheta().convertToDouble() > 0))
    return emitOpError() << "theta must be positive, got " << getTheta().convertToDouble();
  auto f64 = [](std::optional<APFloat> v) -> std::optional<double> {
    return v ? std::optional<double>(v->convertToDouble()) : std::nullopt;
  };
  std::optional<int64_t> original;
  if (std::optional<uint64_t> v = getOriginalMaxPositions())
    original = int64_t(*v);
  if (failed(verifyTokenOperand(*this, "positions", getPositions(), getInput())) ||
      failed(verifyRopeScaling(*this, f64(getScalingFactor()), f64(getLowFreqFactor()),
                               f64(getHighFreqFactor()), original)))
    return failure();
  return expectSameTypeAsOperand(*this, "input", getInput());
}

// x·cos + rotate_half(x)·sin.
OpCost RoPEOp::getForwardCost() { return elementwiseCost(*this, 3); }

//===----------------------------------------------------------------------===//
// AttentionOp
//===----------------------------------------------------------------------===//

LogicalResult AttentionOp::verify() {
  RankedTensorType q = tensorType(getQuery());
  RankedTensorType k = tensorType(getKey());
  RankedTensorType v = tensorType(getValue());
  if (q.getRank() != 4)
    return emitOpError() << "query rank: expected 4 ([batch, seq, heads, head_dim]), got "
                         << q.getRank();
  if (failed(expectRank(*this, "key", k, 4)) || failed(expectRank(*this, "value", v, 4)))
    return failure();
  if (failed(expectShape(*this, "value", v.getShape(), k.getShape())))
    return failure();
  if (k.getDimSize(0) != q.getDimSize(0) || k.getDimSize(1) != q.getDimSize(1))
    return emitOpError() << "key batch and sequence: expected [" << q.getDimSize(0) << ", "
                         << q.getDimSize(1) << "] (as query), got [" << k.getDimSize(0) << ", "
                         << k.getDimSize(1) << "]";
  if (k.getDimSize(3) != q.getDimSize(3))
    return emitOpError() << "key head_dim: expected " << q.getDimSize(3) << " (as query), got "
                         << k.getDimSize(3);
  int64_t heads = q.getDimSize(2), kvHeads = k.getDimSize(2);
  if (heads % kvHeads != 0)
    return emitOpError() << "query heads (" << heads << ") must be a multiple of key/value heads ("
                         << kvHeads << ") for grouped-query attention";
  if (failed(expectElementType(*this, "key", k.getElementType(), q.getElementType())) ||
      failed(expectElementType(*this, "value", v.getElementType(), q.getElementType())))
    return failure();
  if (!(getScale().convertToDouble() > 0))
    return emitOpError() << "scale must be positive, got " << getScale().convertToDouble();
  if (failed(verifyTokenOperand(*this, "segment_ids", getSegmentIds(), getQuery())) ||
      failed(verifyRingSequence(*this, getRingRanks(), getQuery())))
    return failure();
  return expectSameTypeAsOperand(*this, "query", getQuery());
}

int64_t AttentionOp::getScoredPairs() {
  return attentionScoredPairs(tensorType(getQuery()).getDimSize(1), getCausal(), getRingRanks());
}

OpCost AttentionOp::getForwardCost() {
  RankedTensorType q = tensorType(getQuery());
  int64_t batchHeads = q.getDimSize(0) * q.getDimSize(2);
  int64_t headDim = q.getDimSize(3);
  // A fused kernel: Q, K, V read once, O written once, scores never stored. Two GEMMs (Q·Kᵀ and
  // P·V) over the scored pairs; scale, max, exp, sum and normalise per score.
  OpCost cost = streamingBytes(*this);
  cost.matmulFlops = 4 * batchHeads * headDim * getScoredPairs();
  cost.vectorFlops = 5 * batchHeads * getScoredPairs();
  return cost;
}

//===----------------------------------------------------------------------===//
// Activations and softmax
//===----------------------------------------------------------------------===//

LogicalResult SiLUOp::verify() { return expectSameTypeAsOperand(*this, "input", getInput()); }
// Negate, exp, add one, divide.
OpCost SiLUOp::getForwardCost() { return elementwiseCost(*this, 4); }

LogicalResult GeLUOp::verify() { return expectSameTypeAsOperand(*this, "input", getInput()); }
OpCost GeLUOp::getForwardCost() {
  // tanh form: x³, two multiply-adds, tanh, add, two multiplies; erf form: scale, erf, add, mul.
  return elementwiseCost(*this,
                         getApproximation() == GeluApproximation::Tanh ? 8 : 4);
}

LogicalResult SwiGLUOp::verify() {
  if (getGate().getType() != getUp().getType())
    return emitOpError() << "up type: expected " << getGate().getType()
                         << " (the type of gate), got " << getUp().getType();
  return expectSameTypeAsOperand(*this, "gate", getGate());
}
// silu(gate) then times up.
OpCost SwiGLUOp::getForwardCost() { return elementwiseCost(*this, 5); }

LogicalResult SoftmaxOp::verify() {
  int64_t rank = tensorType(getInput()).getRank();
  int64_t axis = getAxisAttr().getInt();
  if (axis < 0 || axis >= rank)
    return emitOpError() << "axis " << axis << " is out of range for rank " << rank;
  return expectSameTypeAsOperand(*this, "input", getInput());
}
// Max, subtract, exp, sum, divide.
OpCost SoftmaxOp::getForwardCost() { return elementwiseCost(*this, 5); }

//===----------------------------------------------------------------------===//
// CrossEntropyOp
//===----------------------------------------------------------------------===//

LogicalResult CrossEntropyOp::verify() {
  RankedTensorType logits = tensorType(getLogits());
  RankedTensorType labels = tensorType(getLabels());
  if (logits.getRank() < 2)
    return emitOpError() << "logits rank: expected at least 2 ([..., vocab]), got "
                         << logits.getRank();
  return expectShape(*this, "labels", labels.getShape(), logits.getShape().drop_back());
}

OpCost CrossEntropyOp::getForwardCost() {
  // Max, exp, sum, log and pick, per logit.
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = 4 * getNumElements(tensorType(getLogits()));
  return cost;
}

//===----------------------------------------------------------------------===//
// Shape ops
//===----------------------------------------------------------------------===//

LogicalResult ReshapeOp::verify() {
  RankedTensorType in = tensorType(getInput());
  RankedTensorType out = getResult().getType();
  if (getNumElements(in) != getNumElements(out))
    return emitOpError() << "element count: input " << fmt(in.getShape()) << " has "
                         << getNumElements(in) << ", result " << fmt(out.getShape()) << " has "
                         << getNumElements(out);
  return expectElementType(*this, "result", out.getElementType(), in.getElementType());
}

// A reshape of a contiguous tensor is a view: no work, no traffic.
OpCost ReshapeOp::getForwardCost() { return {}; }

LogicalResult TransposeOp::verify() {
  RankedTensorType in = tensorType(getInput());
  ArrayRef<int64_t> perm = getPermutation();
  if ((int64_t)perm.size() != in.getRank())
    return emitOpError() << "permutation has " << perm.size() << " entries, input rank is "
                         << in.getRank();
  llvm::SmallBitVector seen(in.getRank());
  SmallVector<int64_t> expected;
  for (int64_t p : perm) {
    if (p < 0 || p >= in.getRank() || seen.test(p))
      return emitOpError() << "permutation " << fmt(perm) << " is not a permutation of [0, "
                           << in.getRank() << ")";
    seen.set(p);
    expected.push_back(in.getDimSize(p));
  }
  RankedTensorType out = getResult().getType();
  if (failed(expectShape(*this, "result", out.getShape(), expected)))
    return failure();
  return expectElementType(*this, "result", out.getElementType(), in.getElementType());
}

OpCost TransposeOp::getForwardCost() { return streamingBytes(*this); }

LogicalResult SliceOp::verify() {
  RankedTensorType in = tensorType(getInput());
  RankedTensorType out = getResult().getType();
  int64_t axis = getAxisAttr().getInt();
  if (axis < 0 || axis >= in.getRank())
    return emitOpError() << "axis " << axis << " is out of range for rank " << in.getRank();
  if (failed(expectRank(*this, "result", out, in.getRank())))
    return failure();
  for (int64_t d = 0; d < in.getRank(); ++d)
    if (d != axis && in.getDimSize(d) != out.getDimSize(d))
      return emitOpError() << "result dimension " << d << ": expected " << in.getDimSize(d)
                           << " (only axis " << axis << " is sliced), got "
                           << out.getDimSize(d);
  int64_t start = getStartAttr().getInt(), size = out.getDimSize(axis);
  // Written so that a huge start cannot overflow, and nor can the message.
  if (start < 0 || start > in.getDimSize(axis) - size) {
    InFlightDiagnostic diag = emitOpError() << "range [" << start << ", ";
    if (start > std::numeric_limits<int64_t>::max() - size)
      diag << start << " + " << size;
    else
      diag << start + size;
    return diag << ") is outside dimension " << axis << " of size " << in.getDimSize(axis);
  }
  return expectElementType(*this, "result", out.getElementType(), in.getElementType());
}

OpCost SliceOp::getForwardCost() {
  OpCost cost;
  cost.bytesRead = cost.bytesWritten = getStorageBytes(getResult().getType());
  return cost;
}

LogicalResult ConcatOp::verify() {
  OperandRange inputs = getInputs();
  if (inputs.empty())
    return emitOpError() << "needs at least one input";
  RankedTensorType out = getResult().getType();
  int64_t axis = getAxisAttr().getInt();
  if (axis < 0 || axis >= out.getRank())
    return emitOpError() << "axis " << axis << " is out of range for rank " << out.getRank();
  int64_t total = 0;
  for (auto [i, input] : llvm::enumerate(inputs)) {
    RankedTensorType in = tensorType(input);
    std::string name = ("input " + Twine(i)).str();
    if (failed(expectRank(*this, name, in, out.getRank())))
      return failure();
    for (int64_t d = 0; d < out.getRank(); ++d)
      if (d != axis && in.getDimSize(d) != out.getDimSize(d))
        return emitOpError() << name << " dimension " << d << ": expected " << out.getDimSize(d)
                             << " (only axis " << axis << " is joined), got " << in.getDimSize(d);
    if (failed(expectElementType(*this, name, in.getElementType(), out.getElementType())))
      return failure();
    total += in.getDimSize(axis);
  }
  if (total != out.getDimSize(axis))
    return emitOpError() << "result dimension " << axis << ": expected " << total
                         << " (the inputs' sizes summed), got " << out.getDimSize(axis);
  return success();
}

OpCost ConcatOp::getForwardCost() {
  OpCost cost;
  cost.bytesRead = cost.bytesWritten = getStorageBytes(getResult().getType());
  return cost;
}

LogicalResult CastOp::verify() {
  RankedTensorType in = tensorType(getInput());
  RankedTensorType out = getResult().getType();
  if (failed(expectShape(*this, "result", out.getShape(), in.getShape())))
    return failure();
  if (in.getElementType() == out.getElementType())
    return emitOpError() << "casts " << in.getElementType() << " to itself";
  return success();
}

OpCost CastOp::getForwardCost() { return elementwiseCost(*this, 1); }

LogicalResult DequantizeOp::verify() {
  RankedTensorType in = tensorType(getInput());
  RankedTensorType out = getResult().getType();
  return expectShape(*this, "result", out.getShape(), in.getShape());
}

// Look up the level, multiply by the block's absmax (itself dequantized once per block).
OpCost DequantizeOp::getForwardCost() { return elementwiseCost(*this, 2); }

//===----------------------------------------------------------------------===//
// Kernel parameters with their defaults made explicit
//===----------------------------------------------------------------------===//

static DictionaryAttr makeParams(Operation *op, ArrayRef<NamedAttribute> params) {
  return DictionaryAttr::get(op->getContext(), params);
}

DictionaryAttr RMSNormOp::getKernelParams() {
  Builder b(getContext());
  return makeParams(*this, {b.getNamedAttr("epsilon", getEpsilonAttr())});
}

DictionaryAttr LayerNormOp::getKernelParams() {
  Builder b(getContext());
  return makeParams(*this, {b.getNamedAttr("epsilon", getEpsilonAttr())});
}

DictionaryAttr RoPEOp::getKernelParams() {
  return getRopeKernelParams(*this, getThetaAttr());
}

DictionaryAttr GeLUOp::getKernelParams() {
  Builder b(getContext());
  return makeParams(*this, {b.getNamedAttr(
                               "tanh", b.getBoolAttr(getApproximation() ==
                                                     GeluApproximation::Tanh))});
}

DictionaryAttr CrossEntropyOp::getKernelParams() {
  Builder b(getContext());
  return makeParams(*this, {b.getNamedAttr("ignore_index", getIgnoreIndexAttr())});
}

Value ReshapeOp::getViewSource() { return getInput(); }

#define GET_OP_CLASSES
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.cpp.inc"
