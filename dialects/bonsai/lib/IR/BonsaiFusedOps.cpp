//===- BonsaiFusedOps.cpp - Ops that bonsai-fuse creates -------------------===//
//
// Verifiers, costs and kernel parameters of the fused ops (BonsaiFusedOps.td), and the
// normalisation interfaces' builders of their fused variants. A fused op's cost is the sum of
// the chain it replaces minus the intermediate tensors it no longer writes and reads back.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

/// Fails unless `value` has exactly `expected` as type.
static LogicalResult expectTypeOf(Operation *op, StringRef what, Value value, Type expected) {
  if (value.getType() == expected)
    return success();
  return op->emitOpError() << what << " type: expected " << expected << ", got " << value.getType();
}

/// Checks a norm parameter [D] of the input's element type, and a positive epsilon.
static LogicalResult verifyNormOperands(Operation *op, Value input, ArrayRef<Value> params,
                                        ArrayRef<StringRef> names, double epsilon) {
  RankedTensorType in = tensorType(input);
  if (in.getRank() < 1)
    return op->emitOpError("input must have rank at least 1");
  for (auto [param, name] : llvm::zip(params, names)) {
    RankedTensorType p = tensorType(param);
    if (failed(expectShape(op, name, p.getShape(), {in.getShape().back()})) ||
        failed(expectElementType(op, name, p.getElementType(), in.getElementType())))
      return failure();
  }
  if (!(epsilon > 0))
    return op->emitOpError() << "epsilon must be positive, got " << epsilon;
  return success();
}

static DictionaryAttr epsilonParams(Operation *op, FloatAttr epsilon) {
  Builder b(op->getContext());
  return b.getDictionaryAttr({b.getNamedAttr("epsilon", epsilon)});
}

//===----------------------------------------------------------------------===//
// LinearCrossEntropyOp
//===----------------------------------------------------------------------===//

static int64_t alignSlots(int64_t slots) { return (slots + 63) / 64 * 64; }

int64_t LinearCrossEntropyOp::chooseChunkRows(int64_t rows, int64_t vocab, int64_t elementBytes) {
  int64_t rowBytes = std::max<int64_t>(1, vocab * elementBytes);
  if (rows * rowBytes <= kMaxChunkBytes)
    return std::max<int64_t>(rows, 1);
  return std::max<int64_t>(64, kMaxChunkBytes / rowBytes / 64 * 64);
}

int64_t LinearCrossEntropyOp::getWorkspaceElements(int64_t rows, int64_t vocab, int64_t hidden,
                                                   int64_t chunkRows, int64_t elementBytes,
                                                   bool weightGrad) {
  // runtime/include/bonsai/runtime/Fusion.h computes the same layout.
  auto slots = [](int64_t elements, int64_t bytes) { return (elements * bytes + 3) / 4; };
  int64_t perVector = std::max<int64_t>(1, 16 / std::max<int64_t>(1, elementBytes));
  int64_t paddedVocab = (vocab + perVector - 1) / perVector * perVector;
  bool padded = paddedVocab != vocab;
  int64_t chunk = std::min(rows, chunkRows);
  int64_t logits = alignSlots(slots(chunk * paddedVocab, elementBytes));
  int64_t losses = alignSlots(rows);
  int64_t weight = padded ? alignSlots(slots(paddedVocab * hidden, elementBytes)) : 0;
  bool accumulate = weightGrad && (elementBytes != 4 || padded);
  int64_t accumulator = accumulate ? alignSlots(paddedVocab * hidden) : 0;
  return logits + losses + weight + accumulator + 64;
}

int64_t LinearCrossEntropyOp::getNumRows() { return getNumElements(tensorType(getLabels())); }

int64_t LinearCrossEntropyOp::getVocabSize() { return tensorType(getWeight()).getDimSize(0); }

LogicalResult LinearCrossEntropyOp::verify() {
  RankedTensorType x = tensorType(getInput()), w = tensorType(getWeight());
  RankedTensorType labels = tensorType(getLabels());
  if (x.getRank() < 2)
    return emitOpError() << "input rank: expected at least 2 ([..., hidden]), got " << x.getRank();
  if (failed(expectRank(*this, "weight", w, 2)))
    return failure();
  if (failed(expectElementType(*this, "weight", w.getElementType(), x.getElementType())))
    return failure();
  if (w.getDimSize(1) != x.getShape().back())
    return emitOpError() << "weight " << fmt(w.getShape()) << " is not [vocab, "
                         << x.getShape().back() << "] for input " << fmt(x.getShape());
  if (failed(expectShape(*this, "labels", labels.getShape(), x.getShape().drop_back())))
    return failure();
  if (failed(expectTypeOf(*this, "input_grad", getInputGrad(), x)))
    return failure();
  if (getWeightGrad() && failed(expectTypeOf(*this, "weight_grad", getWeightGrad(), w)))
    return failure();
  int64_t chunk = getChunkRows();
  if (chunk <= 0)
    return emitOpError() << "chunk_rows must be positive, got " << chunk;
  RankedTensorType ws = tensorType(getWorkspace());
  int64_t bytes = x.getElementType().getIntOrFloatBitWidth() / 8;
  int64_t expected = getWorkspaceElements(getNumRows(), getVocabSize(), w.getDimSize(1), chunk,
                                          bytes, bool(getWeightGrad()));
  if (!ws.getElementType().isF32() || ws.getRank() != 1 || ws.getDimSize(0) != expected)
    return emitOpError() << "workspace must be tensor<" << expected << "xf32> for " << getNumRows()
                         << " rows of " << getVocabSize() << " logits in chunks of " << chunk
                         << ", got " << ws;
  return success();
}

OpCost LinearCrossEntropyOp::getForwardCost() {
  int64_t rows = getNumRows(), vocab = getVocabSize();
  int64_t hidden = tensorType(getWeight()).getDimSize(1);
  int64_t gemms = getWeightGrad() ? 3 : 2;
  // Operands read and results written once, but the workspace is scratch: its traffic is the
  // logits', which the first GEMM writes, the loss pass reads and overwrites with their
  // gradient, and each gradient GEMM reads.
  OpCost cost = streamingBytes(*this);
  cost.bytesWritten -= getStorageBytes(getWorkspace().getType());
  int64_t elementBytes = tensorType(getInput()).getElementType().getIntOrFloatBitWidth() / 8;
  int64_t logitsBytes = rows * vocab * elementBytes;
  cost.bytesWritten += 2 * logitsBytes;
  cost.bytesRead += gemms * logitsBytes;
  cost.matmulFlops = gemms * 2 * rows * vocab * hidden;
  // cross_entropy's 4 and cross_entropy_grad's 5 per logit.
  cost.vectorFlops = 9 * rows * vocab;
  return cost;
}

SmallVector<unsigned> LinearCrossEntropyOp::getWorkspaceResults() {
  return {cast<OpResult>(getWorkspace()).getResultNumber()};
}

DictionaryAttr LinearCrossEntropyOp::getKernelParams() {
  Builder b(getContext());
  return b.getDictionaryAttr({b.getNamedAttr("ignore_index", getIgnoreIndexAttr()),
                              b.getNamedAttr("chunk_rows", getChunkRowsAttr())});
}

//===----------------------------------------------------------------------===//
// Residual add + norm
//===----------------------------------------------------------------------===//

/// lhs and rhs of one type, both results of that type.
static LogicalResult verifyAddNorm(Operation *op, Value lhs, Value rhs) {
  if (failed(expectTypeOf(op, "rhs", rhs, lhs.getType())) ||
      failed(expectTypeOf(op, "sum", op->getResult(0), lhs.getType())) ||
      failed(expectTypeOf(op, "result", op->getResult(1), lhs.getType())))
    return failure();
  return success();
}

/// An add (one FLOP per element) and the norm, without writing and reading the sum twice.
static OpCost addNormCost(Operation *op, int64_t normFlops) {
  OpCost cost = streamingBytes(op);
  cost.vectorFlops = (1 + normFlops) * getNumElements(cast<ShapedType>(op->getResult(0).getType()));
  return cost;
}

LogicalResult AddRMSNormOp::verify() {
  if (failed(verifyAddNorm(*this, getLhs(), getRhs())))
    return failure();
  return verifyNormOperands(*this, getLhs(), {getWeight()}, {"weight"},
                            getEpsilon().convertToDouble());
}
OpCost AddRMSNormOp::getForwardCost() { return addNormCost(*this, 4); }
DictionaryAttr AddRMSNormOp::getKernelParams() { return epsilonParams(*this, getEpsilonAttr()); }

LogicalResult AddLayerNormOp::verify() {
  if (failed(verifyAddNorm(*this, getLhs(), getRhs())))
    return failure();
  return verifyNormOperands(*this, getLhs(), {getWeight(), getBias()}, {"weight", "bias"},
                            getEpsilon().convertToDouble());
}
OpCost AddLayerNormOp::getForwardCost() { return addNormCost(*this, 7); }
DictionaryAttr AddLayerNormOp::getKernelParams() { return epsilonParams(*this, getEpsilonAttr()); }

/// The norm gradient's checks plus an addend of the input gradient's type.
static LogicalResult verifyNormGradAdd(Operation *op, Value dy, Value x, Value w, Value addend,
                                       double epsilon) {
  Type xType = x.getType();
  if (failed(expectTypeOf(op, "result_grad", dy, xType)) ||
      failed(expectTypeOf(op, "addend", addend, xType)) ||
      failed(expectTypeOf(op, "input_grad", op->getResult(0), xType)))
    return failure();
  for (Value result : op->getResults().drop_front())
    if (failed(expectTypeOf(op, "parameter gradient", result, w.getType())))
      return failure();
  return verifyNormOperands(op, x, {w}, {"weight"}, epsilon);
}

LogicalResult RMSNormGradAddOp::verify() {
  return verifyNormGradAdd(*this, getResultGrad(), getInput(), getWeight(), getAddend(),
                           getEpsilon().convertToDouble());
}
OpCost RMSNormGradAddOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = 9 * getNumElements(tensorType(getInput()));
  return cost;
}
DictionaryAttr RMSNormGradAddOp::getKernelParams() {
  return epsilonParams(*this, getEpsilonAttr());
}

LogicalResult LayerNormGradAddOp::verify() {
  return verifyNormGradAdd(*this, getResultGrad(), getInput(), getWeight(), getAddend(),
                           getEpsilon().convertToDouble());
}
OpCost LayerNormGradAddOp::getForwardCost() {
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = 11 * getNumElements(tensorType(getInput()));
  return cost;
}
DictionaryAttr LayerNormGradAddOp::getKernelParams() {
  return epsilonParams(*this, getEpsilonAttr());
}

//===----------------------------------------------------------------------===//
// DoraGradOp
//===----------------------------------------------------------------------===//

LogicalResult DoraGradOp::verify() {
  RankedTensorType dy = tensorType(getResultGrad());
  if (dy.getRank() < 1)
    return emitOpError("result_grad must have rank at least 1");
  auto row = RankedTensorType::get({dy.getShape().back()}, dy.getElementType());
  if (failed(expectTypeOf(*this, "output", getOutput(), dy)) ||
      failed(expectTypeOf(*this, "scale", getScale(), row)) ||
      failed(expectTypeOf(*this, "magnitude", getMagnitude(), row)) ||
      failed(expectTypeOf(*this, "input_grad", getInputGrad(), dy)) ||
      failed(expectTypeOf(*this, "magnitude_grad", getMagnitudeGrad(), row)))
    return failure();
  return success();
}
OpCost DoraGradOp::getForwardCost() {
  // A multiply for dx, a multiply-add for the sum per element.
  OpCost cost = streamingBytes(*this);
  cost.vectorFlops = 3 * getNumElements(tensorType(getResultGrad()));
  return cost;
}

//===----------------------------------------------------------------------===//
// The normalisation interfaces' fused variants
//===----------------------------------------------------------------------===//

Operation *RMSNormOp::buildWithResidualAdd(OpBuilder &builder, Value lhs, Value rhs) {
  Type type = getResult().getType();
  return AddRMSNormOp::create(builder, getLoc(), type, type, lhs, rhs, getWeight(),
                              getEpsilonAttr());
}

Operation *LayerNormOp::buildWithResidualAdd(OpBuilder &builder, Value lhs, Value rhs) {
  Type type = getResult().getType();
  return AddLayerNormOp::create(builder, getLoc(), type, type, lhs, rhs, getWeight(), getBias(),
                                getEpsilonAttr());
}

Operation *RMSNormGradOp::buildWithAddend(OpBuilder &builder, Value addend) {
  return RMSNormGradAddOp::create(builder, getLoc(), getInputGrad().getType(),
                                  getWeightGrad().getType(), getResultGrad(), getInput(),
                                  getWeight(), addend, getEpsilonAttr());
}

Operation *LayerNormGradOp::buildWithAddend(OpBuilder &builder, Value addend) {
  return LayerNormGradAddOp::create(
      builder, getLoc(), getInputGrad().getType(), getWeightGrad().getType(),
      getBiasGrad().getType(), getResultGrad(), getInput(), getWeight(), addend, getEpsilonAttr());
}
