//===- BonsaiFlashAttentionOps.cpp - attention that keeps its log-sum-exp -===//
//
// Verifiers and costs of bonsai.flash_attention and bonsai.flash_attention_grad, the ops of
// the `flash-attention` fusion family, and of their packed forms bonsai.flash_attention_qkv
// and bonsai.flash_attention_qkv_grad (the `packed-qkv` family). The operand rules are those of
// bonsai.attention and bonsai.attention_grad, q, k and v being head ranges of one tensor in the
// packed forms; the log-sum-exp is f32 [batch, heads, seq].
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

/// The cost of a flash attention kernel over `query`'s shape [B, S, H, D] (the output's for the
/// packed forms): streaming its operands, `matmulPerPair` FLOPs per scored pair and element of
/// the head dim, `vectorPerPair` per scored pair.
static OpCost flashCost(Operation *op, Value query, bool causal, std::optional<int64_t> ringRanks,
                        int64_t matmulPerPair, int64_t vectorPerPair) {
  RankedTensorType q = tensorType(query);
  int64_t batchHeads = q.getDimSize(0) * q.getDimSize(2);
  int64_t pairs = scoredPairs(query, causal, ringRanks);
  OpCost cost = streamingBytes(op);
  cost.matmulFlops = cost.attentionFlops = matmulPerPair * batchHeads * q.getDimSize(3) * pairs;
  cost.vectorFlops = vectorPerPair * batchHeads * pairs;
  return cost;
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
  // As bonsai.attention (Q·Kᵀ and P·V over the scored pairs; scale, max, exp, sum and
  // normalise per score), plus one f32 per query row written.
  return flashCost(*this, getQuery(), getCausal(), getRingRanks(), 4, 5);
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
  // Scores recomputed (Q·Kᵀ) and normalised by the saved lse, then dV = Pᵀ·dO, dP = dO·Vᵀ,
  // dQ = dS·K, dK = dSᵀ·Q; no pass for the softmax statistics.
  return flashCost(*this, getQuery(), getCausal(), getRingRanks(), 10, 7);
}

//===----------------------------------------------------------------------===//
// FlashAttentionQkvOp and FlashAttentionQkvGradOp
//===----------------------------------------------------------------------===//

/// Checks qkv [B, S, H + 2 KV, D] against the attention output [B, S, H, D] (H is the
/// output's): the heads that are not q split evenly into k and v, KV divides H, one element
/// type, and a positive scale.
static LogicalResult verifyPackedOperands(Operation *op, Value qkv, Value output, double scale) {
  RankedTensorType packed = tensorType(qkv), o = tensorType(output);
  if (failed(expectRank(op, "qkv", packed, 4)) || failed(expectRank(op, "output", o, 4)))
    return failure();
  if (o.getDimSize(0) != packed.getDimSize(0) || o.getDimSize(1) != packed.getDimSize(1) ||
      o.getDimSize(3) != packed.getDimSize(3))
    return op->emitOpError() << "output shape " << fmt(o.getShape()) << " does not match qkv shape "
                             << fmt(packed.getShape()) << " in batch, sequence or head_dim";
  const int64_t heads = o.getDimSize(2), others = packed.getDimSize(2) - heads;
  if (heads <= 0)
    return op->emitOpError() << "output has no heads: " << fmt(o.getShape());
  if (others <= 0 || others % 2 != 0)
    return op->emitOpError() << "qkv has " << packed.getDimSize(2) << " heads for " << heads
                             << " query heads (the output's): the other " << others
                             << " must be key and value heads, as many of each (a positive "
                                "even count)";
  if (heads % (others / 2) != 0)
    return op->emitOpError() << "query heads (" << heads
                             << ") must be a multiple of key/value heads (" << others / 2
                             << ") for grouped-query attention";
  if (failed(expectElementType(op, "output", o.getElementType(), packed.getElementType())))
    return failure();
  if (!(scale > 0))
    return op->emitOpError() << "scale must be positive, got " << scale;
  return success();
}

LogicalResult FlashAttentionQkvOp::verify() {
  if (failed(verifyPackedOperands(*this, getQkv(), getOutput(), getScale().convertToDouble())) ||
      failed(verifyTokenOperand(*this, "segment_ids", getSegmentIds(), getQkv())))
    return failure();
  return verifyLse(*this, getLse(), getOutput());
}

OpCost FlashAttentionQkvOp::getForwardCost() {
  // FlashAttentionOp's: the same scores over the same q, k and v, which qkv holds.
  return flashCost(*this, getOutput(), getCausal(), std::nullopt, 4, 5);
}

LogicalResult FlashAttentionQkvGradOp::verify() {
  if (failed(verifyPackedOperands(*this, getQkv(), getOutput(), getScale().convertToDouble())) ||
      failed(expectType(*this, "result_grad", getResultGrad(), getOutput().getType())) ||
      failed(expectType(*this, "qkv_grad", getQkvGrad(), getQkv().getType())) ||
      failed(verifyTokenOperand(*this, "segment_ids", getSegmentIds(), getQkv())))
    return failure();
  return verifyLse(*this, getLse(), getOutput());
}

OpCost FlashAttentionQkvGradOp::getForwardCost() {
  // FlashAttentionGradOp's: dq, dk and dv written into one tensor instead of three.
  return flashCost(*this, getOutput(), getCausal(), std::nullopt, 10, 7);
}
