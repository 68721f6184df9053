//===- Attention.cpp - The contracts of the attention kernels -------------===//
//
// The operand contracts of attention, flash attention, rotary embeddings and softmax: what the plan
// loader checks of each such kernel before any backend runs it (KernelChecker.h). Each kind's
// `verify` checks its attributes, then its operands, then the state it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::checkAttentionShapes(size_t qi, size_t ki, size_t vi) const {
  expectFloat(qi);
  expectRank(qi, 4);
  expectRank(ki, 4);
  expectInputShape(vi, in(ki).shape);
  const std::vector<int64_t> &q = in(qi).shape, &k = in(ki).shape;
  if (k[0] != q[0] || k[1] != q[1] || k[3] != q[3])
    fail(inName(ki) + " shape " + formatShape(k) + " does not match " + inName(qi) + " shape " +
         formatShape(q) + " in batch, sequence or head_dim");
  if (q[2] % k[2] != 0)
    fail("query heads (" + std::to_string(q[2]) + ") must be a multiple of key/value heads (" +
         std::to_string(k[2]) + ")");
}

/// The log-sum-exp of flash attention (output or input `i`) is f32 [batch, heads, seq] of the
/// query (input 0 of FlashAttention, 1 of FlashAttentionGrad).
void KernelChecker::checkLse(size_t i, bool isOutput) const {
  checkLseOf(i, isOutput, in(isOutput ? 0 : 1).shape);
}

void KernelChecker::checkLseOf(size_t i, bool isOutput, const std::vector<int64_t> &q) const {
  std::vector<int64_t> want = {q[0], q[2], q[1]};
  const TensorInfo &lse = isOutput ? out(i) : in(i);
  std::string name = isOutput ? outName(i) : inName(i);
  if (lse.dtype != DType::F32 || lse.shape != want)
    fail(name + ": expected an f32 " + formatShape(want) +
         " log-sum-exp ([batch, heads, seq] of the query), got " + formatShape(lse.shape) + " " +
         dtypeName(lse.dtype));
}

void KernelChecker::checkPackedQkv(size_t qkv, const TensorInfo &output,
                                   const std::string &outputName) const {
  expectFloat(qkv);
  expectRank(qkv, 4);
  const std::vector<int64_t> &packed = in(qkv).shape, &o = output.shape;
  if (o.size() != 4)
    fail(outputName + " rank: expected 4 ([batch, seq, heads, head_dim]), got " +
         std::to_string(o.size()) + " " + formatShape(o));
  if (o[0] != packed[0] || o[1] != packed[1] || o[3] != packed[3])
    fail(outputName + " shape " + formatShape(o) + " does not match " + inName(qkv) + " shape " +
         formatShape(packed) + " in batch, sequence or head_dim");
  const int64_t kvPair = packed[2] - o[2];
  if (o[2] <= 0 || kvPair <= 0 || kvPair % 2 != 0 || o[2] % (kvPair / 2) != 0)
    fail(inName(qkv) + " shape " + formatShape(packed) + " does not hold the " +
         std::to_string(o[2]) + " query heads of " + outputName +
         " and then two equal numbers of key/value heads that divide them");
  if (output.dtype != in(qkv).dtype)
    fail(outputName + " dtype: expected " + dtypeName(in(qkv).dtype) + " (as " + inName(qkv) +
         "), got " + dtypeName(output.dtype));
}

void KernelChecker::checkNoRing() {
  if (kernel.attrsAs<AttentionAttrs>().ringRanks > 1)
    fail("ring_ranks " + std::to_string(kernel.attrsAs<AttentionAttrs>().ringRanks) +
         ": ring attention takes q, k and v apart, not packed");
}

void KernelChecker::checkTheta() {
  const auto &a = kernel.attrsAs<RoPEAttrs>();
  if (!(a.theta > 0))
    fail("theta must be positive, got " + num(a.theta));
  if (a.scalingFactor == 0 && a.lowFreqFactor == 0 && a.highFreqFactor == 0 &&
      a.originalMaxPositions == 0)
    return;
  if (!(a.scalingFactor > 0) || !(a.lowFreqFactor > 0) || !(a.highFreqFactor > a.lowFreqFactor) ||
      a.originalMaxPositions <= 0)
    fail("llama3 rope scaling needs scaling_factor > 0, low_freq_factor > 0, high_freq_factor > "
         "low_freq_factor and original_max_positions > 0, got " +
         num(a.scalingFactor) + ", " + num(a.lowFreqFactor) + ", " + num(a.highFreqFactor) +
         ", " + std::to_string(a.originalMaxPositions));
}

void KernelChecker::checkTokenInput(size_t i, size_t of) const {
  if (kernel.inputs.size() <= i)
    return;
  expectIndex(i);
  const std::vector<int64_t> &x = in(of).shape;
  expectInputShape(i, {x[0], x[1]});
}

void KernelChecker::checkAttentionScale() {
  const auto &a = kernel.attrsAs<AttentionAttrs>();
  if (!(a.scale > 0) || a.scale == std::numeric_limits<double>::infinity())
    fail("scale must be positive and finite, got " + num(a.scale));
}

void KernelChecker::checkAxisOfInput(int32_t axis) {
  if (axis < 0 || size_t(axis) >= in(0).shape.size())
    fail("axis " + std::to_string(axis) + " is out of range for " + inName(0) + " of rank " +
         std::to_string(in(0).shape.size()));
}

void KernelChecker::checkAttentionGradShapes() {
  checkAttentionShapes(1, 2, 3);
  expectFloat(2);
  expectFloat(3);
  expectFloatInput(0, in(1).shape);
  expectFloatInput(4, in(1).shape);
  expectFloatOutput(0, in(1).shape);
  expectFloatOutput(1, in(2).shape);
  expectFloatOutput(2, in(2).shape);
  if (kernel.kind == KernelKind::FlashAttentionGrad) {
    checkLse(5, /*isOutput=*/false);
    checkTokenInput(kinds::FlashAttentionGrad::In::segment_ids, 1);
  } else {
    checkTokenInput(kinds::AttentionGrad::In::segment_ids, 1);
  }
}

void KernelChecker::verify(kinds::RoPE) {
  checkTheta();
  // Operands.
  expectFloat(0);
  expectRank(0, 4);
  if (in(0).shape[3] % 2 != 0)
    fail(inName(0) + " head_dim must be even to rotate pairs, got " +
         std::to_string(in(0).shape[3]));
  checkTokenInput(kinds::RoPE::In::positions, 0);
  expectOutputLike(0);
}

void KernelChecker::verify(kinds::Attention) {
  checkAttentionScale();
  // Operands.
  expectFloat(0);
  expectRank(0, 4);
  expectRank(1, 4);
  expectInputShape(2, in(1).shape);
  expectInputDType(1, in(0).dtype);
  expectInputDType(2, in(0).dtype);
  const std::vector<int64_t> &q = in(0).shape, &k = in(1).shape;
  if (k[0] != q[0] || k[1] != q[1] || k[3] != q[3])
    fail(inName(1) + " shape " + formatShape(k) + " does not match " + inName(0) + " shape " +
         formatShape(q) + " in batch, sequence or head_dim");
  if (q[2] % k[2] != 0)
    fail("query heads (" + std::to_string(q[2]) + ") must be a multiple of key/value heads (" +
         std::to_string(k[2]) + ")");
  checkTokenInput(kinds::Attention::In::segment_ids, 0);
  expectOutputLike(0);
}

void KernelChecker::verify(kinds::Softmax) {
  checkAxisOfInput(attrs<kinds::Softmax>().axis);
  checkUnaryShapes();
}

void KernelChecker::verify(kinds::RoPEGrad) {
  checkTheta();
  // Operands.
  expectFloat(0);
  expectRank(0, 4);
  if (in(0).shape[3] % 2 != 0)
    fail(inName(0) + " head_dim must be even to rotate pairs, got " +
         std::to_string(in(0).shape[3]));
  checkTokenInput(kinds::RoPEGrad::In::positions, 0);
  expectFloatOutput(0, in(0).shape);
}

void KernelChecker::verify(kinds::AttentionGrad) {
  checkAttentionScale();
  checkAttentionGradShapes();
}

void KernelChecker::verify(kinds::SoftmaxGrad) {
  checkAxisOfInput(attrs<kinds::SoftmaxGrad>().axis);
  checkUnaryGradShapes();
}

void KernelChecker::verify(kinds::FlashAttention) {
  checkAttentionScale();
  // Operands.
  // As Attention: one storage type for q, k, v and o.
  checkAttentionShapes(0, 1, 2);
  expectInputDType(1, in(0).dtype);
  expectInputDType(2, in(0).dtype);
  checkTokenInput(kinds::FlashAttention::In::segment_ids, 0);
  expectOutputLike(0);
  checkLse(1, /*isOutput=*/true);
}

void KernelChecker::verify(kinds::FlashAttentionGrad) {
  checkAttentionScale();
  checkAttentionGradShapes();
}

void KernelChecker::verify(kinds::FlashAttentionQkv) {
  using In = kinds::FlashAttentionQkv::In;
  using Out = kinds::FlashAttentionQkv::Out;
  checkAttentionScale();
  checkNoRing();
  // Operands: o [B, S, H, D] says how many of qkv's heads are queries.
  checkPackedQkv(In::qkv, out(Out::o), outName(Out::o));
  checkTokenInput(In::segment_ids, In::qkv);
  checkLseOf(Out::lse, /*isOutput=*/true, out(Out::o).shape);
}

void KernelChecker::verify(kinds::FlashAttentionQkvGrad) {
  using In = kinds::FlashAttentionQkvGrad::In;
  using Out = kinds::FlashAttentionQkvGrad::Out;
  checkAttentionScale();
  checkNoRing();
  // Operands: the forward's o says how many of qkv's heads are queries; dO is o's shape.
  expectFloat(In::o);
  checkPackedQkv(In::qkv, in(In::o), inName(In::o));
  expectFloatInput(In::do_, in(In::o).shape);
  checkLseOf(In::lse, /*isOutput=*/false, in(In::o).shape);
  checkTokenInput(In::segment_ids, In::qkv);
  expectFloatOutput(Out::dqkv, in(In::qkv).shape);
}

} // namespace bonsai::rt::contract
