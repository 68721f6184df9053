//===- BonsaiFlashAttentionOps.cpp - attention that keeps its log-sum-exp -===//
//
// Verifiers and costs of bonsai.flash_attention and bonsai.flash_attention_grad, the ops of
// the `flash-attention` fusion family. The operand rules are those of bonsai.attention and
// bonsai.attention_grad; the log-sum-exp is f32 [batch, heads, seq].
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

/// Checks q [B, S, H, D], k and v [B, S, KV, D] with KV dividing H, one element type, and a
/// positive scale: the operand rules of bonsai.attention.
static LogicalResult verifyAttentionOperands(Operation *op, Value query, Value key, Value value,
                                             double scale) {
  RankedTensorType q = tensorType(query), k = tensorType(key), v = tensorType(value);
  if (failed(expectRank(op, "query", q, 4)) || failed(expectRank(op, "key", k, 4)) ||
      failed(expectRank(op, "value", v, 4)))
    return failure();
  if (failed(expectShape(op, "value", v.getShape(), k.getShape())))
    return failure();
  if (k.getDimSize(0) != q.getDimSize(0) || k.getDimSize(1) != q.getDimSize(1) ||
      k.getDimSize(3) != q.getDimSize(3))
    return op->emitOpError() << "key shape " << fmt(k.getShape())
                             << " does not match query shape " << fmt(q.getShape())
                             << " in batch, sequence or head_dim";
  if (k.getDimSize(2) == 0 || q.getDimSize(2) % k.getDimSize(2) != 0)
    return op->emitOpError() << "query heads (" << q.getDimSize(2)
                             << ") must be a multiple of key/value heads (" << k.getDimSize(2)
                             << ") for grouped-query attention";
  if (failed(expectElementType(op, "key", k.getElementType(), q.getElementType())) ||
      failed(expectElementType(op, "value", v.getElementType(), q.getElementType())))
    return failure();
  if (!(scale > 0))
    return op->emitOpError() << "scale must be positive, got " << scale;
  return success();
}

/// Fails unless `value` has exactly type `expected`.
static LogicalResult expectType(Operation *op, StringRef what, Value value, Type expected) {
  if (value.getType() == expected)
    return success();
  return op->emitOpError() << what << " type: expected " << expected << ", got "
                           << value.getType();
}

/// Checks that `lse` is f32 [batch, heads, seq] for the query `query`.
static LogicalResult verifyLse(Operation *op, Value lse, Value query) {
  RankedTensorType q = tensorType(query), l = tensorType(lse);
  SmallVector<int64_t> shape = {q.getDimSize(0), q.getDimSize(2), q.getDimSize(1)};
  if (l.getElementType().isF32() && l.getShape() == ArrayRef<int64_t>(shape))
    return success();
  return op->emitOpError() << "lse must be an f32 tensor of shape " << fmt(shape)
                           << " ([batch, heads, seq] of the query), got " << l;
}

/// Scored (query, key) pairs per batch and head (attentionScoredPairs).
static int64_t scoredPairs(Value query, bool causal, std::optional<int64_t> ringRanks) {
  return attentionScoredPairs(tensorType(query).getDimSize(1), causal, ringRanks);
}

//===----------------------------------------------------------------------===//
// FlashAttentionOp
//===----------------------------------------------------------------------===//

LogicalResult FlashAttentionOp::verify() {
  if (failed(verifyAttentionOperands(*this, getQuery(), getKey(), getValue(),
                                     getScale().convertToDouble())) ||
      failed(expectType(*this, "output", getOutput(), getQuery().getType())) ||
      failed(verifyTokenOperand(*this, "segment_ids", getSegmentIds(), getQuery())) ||
      failed(verifyRingSequence(*this, getRingRanks(), getQuery())))
    return failure();
  return verifyLse(*this, getLse(), getQuery());
}

OpCost FlashAttentionOp::getForwardCost() {
  RankedTensorType q = tensorType(getQuery());
  int64_t batchHeads = q.getDimSize(0) * q.getDimSize(2);
  // As bonsai.attention (Q·Kᵀ and P·V over the scored pairs; scale, max, exp, sum and
  // normalise per score), plus one f32 per query row written.
  OpCost cost = streamingBytes(*this);
  int64_t pairs = scoredPairs(getQuery(), getCausal(), getRingRanks());
  cost.matmulFlops = cost.attentionFlops = 4 * batchHeads * q.getDimSize(3) * pairs;
  cost.vectorFlops = 5 * batchHeads * pairs;
  return cost;
}

//===----------------------------------------------------------------------===//
// FlashAttentionGradOp
//===----------------------------------------------------------------------===//

LogicalResult FlashAttentionGradOp::verify() {
  if (failed(verifyAttentionOperands(*this, getQuery(), getKey(), getValue(),
                                     getScale().convertToDouble())) ||
      failed(expectType(*this, "result_grad", getResultGrad(), getQuery().getType())) ||
      failed(expectType(*this, "output", getOutput(), getQuery().getType())) ||
      failed(expectType(*this, "query_grad", getQueryGrad(), getQuery().getType())) ||
      failed(expectType(*this, "key_grad", getKeyGrad(), getKey().getType())) ||
      failed(expectType(*this, "value_grad", getValueGrad(), getValue().getType())) ||
      failed(verifyTokenOperand(*this, "segment_ids", getSegmentIds(), getQuery())) ||
      failed(verifyRingSequence(*this, getRingRanks(), getQuery())))
    return failure();
  return verifyLse(*this, getLse(), getQuery());
}

OpCost FlashAttentionGradOp::getForwardCost() {
  RankedTensorType q = tensorType(getQuery());
  int64_t batchHeads = q.getDimSize(0) * q.getDimSize(2);
  int64_t pairs = scoredPairs(getQuery(), getCausal(), getRingRanks());
  // Scores recomputed (Q·Kᵀ) and normalised by the saved lse, then dV = Pᵀ·dO, dP = dO·Vᵀ,
  // dQ = dS·K, dK = dSᵀ·Q; no pass for the softmax statistics.
  OpCost cost = streamingBytes(*this);
  cost.matmulFlops = cost.attentionFlops = 10 * batchHeads * q.getDimSize(3) * pairs;
  cost.vectorFlops = 7 * batchHeads * pairs;
  return cost;
}
