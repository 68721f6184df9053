//===- BackwardAttention.cpp - Gradients of rope and attention on the CPU -===//
//
// rope_grad applies the inverse rotation (the adjoint of an orthogonal map) with the forward's
// fp64 angle tables. attention_grad recomputes each query row's softmax from q and k in fp64,
// exactly as the forward kernel, then forms dP = dO vᵀ, dS = P (dP - D) with D = sum(dO o), and
// accumulates dq, dk and dv in fp64. flash_attention_grad is the same kernel with the
// probabilities formed from the forward's saved log-sum-exp, exp(x - lse), instead. One work item is a (batch, kv head) pair: it walks the query
// heads that share the kv head in order, so the GQA sums into dk and dv have one order whatever
// the number of threads. Segment ids (packed rows) mask keys of other segments as in the
// forward.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// attention_grad's operands as fp32 arrays, and its dimensions and attributes.
struct AttentionGradArgs {
  const float *dout, *q, *k, *v, *o;
  const float *lse; ///< flash_attention_grad's saved log-sum-exp [B, H, S]; null: recompute
  const int64_t *segments; ///< segment ids [B, S] (packed rows); null: none
  float *dq, *dk, *dv;
  int64_t seq, heads, kvHeads, d;
  bool causal;
  double scale;
};

/// One thread's fp64 work space.
struct AttentionGradScratch {
  AttentionGradScratch(int64_t seq, int64_t d)
      : p(size_t(seq)), dq(size_t(d)), dk(size_t(seq * d)), dv(size_t(seq * d)) {}
  std::vector<double> p, dq, dk, dv;
};

/// The gradients owned by batch `b` and kv head `g`: dq of every query head that reads g, and dk
/// and dv of g, summed over those heads in order and over their queries in order. Each row's
/// probabilities are p_j = exp(x_j - max) / sum, the softmax recomputed, or exp(x_j - lse) from
/// the saved log-sum-exp when there is one.
void attentionGradItem(const AttentionGradArgs &a, int64_t b, int64_t g, AttentionGradScratch &s) {
  int64_t seq = a.seq, d = a.d, group = a.heads / a.kvHeads;
  std::fill(s.dk.begin(), s.dk.end(), 0.0);
  std::fill(s.dv.begin(), s.dv.end(), 0.0);
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i = 0; i < seq; ++i) {
      int64_t qOffset = ((b * seq + i) * a.heads + h) * d;
      const float *qi = a.q + qOffset, *doi = a.dout + qOffset, *oi = a.o + qOffset;
      int64_t keys = a.causal ? i + 1 : seq;
      const int64_t *seg = a.segments ? a.segments + b * seq : nullptr;
      // The scores, as the forward computes them (-inf for keys of another segment).
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < keys; ++j) {
        if (seg && seg[j] != seg[i]) {
          s.p[size_t(j)] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const float *kj = a.k + ((b * seq + j) * a.kvHeads + g) * d;
        double dot = 0.0;
        for (int64_t e = 0; e < d; ++e)
          dot += double(qi[e]) * double(kj[e]);
        s.p[size_t(j)] = a.scale * dot;
        max = std::max(max, s.p[size_t(j)]);
      }
      // Normalised with the saved log-sum-exp (exp(x - lse) = exp(x - max) / sum), or with
      // the softmax's maximum and sum recomputed the same way as the forward.
      // A row that reads no key contributes nothing (its forward output is 0).
      if (max == -std::numeric_limits<double>::infinity()) {
        for (int64_t e = 0; e < d; ++e)
          a.dq[qOffset + e] = 0.0f;
        continue;
      }
      double sum = 1.0;
      if (a.lse) {
        double lse = a.lse[(b * a.heads + h) * seq + i];
        for (int64_t j = 0; j < keys; ++j)
          s.p[size_t(j)] = std::exp(s.p[size_t(j)] - lse);
      } else {
        sum = 0.0;
        for (int64_t j = 0; j < keys; ++j)
          sum += s.p[size_t(j)] = std::exp(s.p[size_t(j)] - max);
      }
      // D_i = dO_i . o_i = sum_j P_ij dP_ij, from the forward output as the header specifies.
      double rowDot = 0.0;
      for (int64_t e = 0; e < d; ++e)
        rowDot += double(doi[e]) * double(oi[e]);
      std::fill(s.dq.begin(), s.dq.end(), 0.0);
      for (int64_t j = 0; j < keys; ++j) {
        int64_t kvOffset = ((b * seq + j) * a.kvHeads + g) * d;
        const float *kj = a.k + kvOffset, *vj = a.v + kvOffset;
        double pj = s.p[size_t(j)] / sum, dp = 0.0;
        if (pj == 0.0 && seg && seg[j] != seg[i])
          continue;
        for (int64_t e = 0; e < d; ++e)
          dp += double(doi[e]) * double(vj[e]);
        double ds = pj * (dp - rowDot);
        double *dkj = &s.dk[size_t(j * d)], *dvj = &s.dv[size_t(j * d)];
        for (int64_t e = 0; e < d; ++e) {
          s.dq[size_t(e)] += ds * double(kj[e]);
          dkj[e] += ds * double(qi[e]);
          dvj[e] += pj * double(doi[e]);
        }
      }
      for (int64_t e = 0; e < d; ++e)
        a.dq[qOffset + e] = float(a.scale * s.dq[size_t(e)]);
    }
  }
  for (int64_t j = 0; j < seq; ++j) {
    int64_t kvOffset = ((b * seq + j) * a.kvHeads + g) * d;
    for (int64_t e = 0; e < d; ++e) {
      a.dk[kvOffset + e] = float(a.scale * s.dk[size_t(j * d + e)]);
      a.dv[kvOffset + e] = float(s.dv[size_t(j * d + e)]);
    }
  }
}

} // namespace

void ropeGrad(const TensorView &dy, double theta, const TensorView &dx) {
  ropeGrad(dy, RoPEAttrs{theta}, nullptr, dx);
}

void ropeGrad(const TensorView &dy, const RoPEAttrs &a, const TensorView *positions,
              const TensorView &dx) {
  rotatePairs("rope_grad", "dy", dy, a, positions, /*transpose=*/true, "dx", dx);
}

namespace {

/// attentionGrad, and with `lse` (non-null) flashAttentionGrad.
void attentionGradImpl(const char *kn, const TensorView &dout, const TensorView &q,
                       const TensorView &k, const TensorView &v, const TensorView &o,
                       const TensorView *lse, const TensorView *segmentIds, bool causal,
                       double scale, const TensorView &dq, const TensorView &dk,
                       const TensorView &dv) {
  checkFloat(kn, "dout", dout);
  checkFloat(kn, "q", q);
  checkFloat(kn, "k", k);
  checkFloat(kn, "v", v);
  checkFloat(kn, "o", o);
  checkFloat(kn, "dq", dq);
  checkFloat(kn, "dk", dk);
  checkFloat(kn, "dv", dv);
  if (q.rank() != 4)
    fail(kn, "q shape " + formatShape(q.shape) + " is not [batch, seq, heads, head_dim]");
  int64_t batch = q.dim(0), seq = q.dim(1), heads = q.dim(2), d = q.dim(3);
  if (k.rank() != 4 || k.dim(0) != batch || k.dim(1) != seq || k.dim(3) != d || k.dim(2) <= 0 ||
      heads % k.dim(2) != 0)
    fail(kn, "k shape " + formatShape(k.shape) + " is not [" + std::to_string(batch) + ", " +
                 std::to_string(seq) + ", kv_heads, " + std::to_string(d) +
                 "] with kv_heads dividing the heads of q shape " + formatShape(q.shape));
  checkSameShape(kn, "v", v, "k", k);
  checkSameShape(kn, "o", o, "q", q);
  checkSameShape(kn, "dout", dout, "q", q);
  checkSameShape(kn, "dq", dq, "q", q);
  checkSameShape(kn, "dk", dk, "k", k);
  checkSameShape(kn, "dv", dv, "v", v);
  if (lse) {
    checkView(kn, "lse", *lse);
    if (lse->dtype != DType::F32)
      fail(kn, std::string("lse must be f32, not ") + dtypeName(lse->dtype));
    checkShape(kn, "lse", *lse, {batch, heads, seq}, "([batch, heads, seq] of q " +
                                                      formatShape(q.shape) + ")");
  }
  int64_t kvHeads = k.dim(2), group = heads / kvHeads;
  std::vector<int64_t> segments = loadTokenOperand(kn, "segment_ids", segmentIds, batch, seq);

  std::vector<float> dos, qs, ks, vs, os, lses, dqs, dks, dvs;
  const float *dop = loadFloats(dout, dos);
  const float *qp = loadFloats(q, qs);
  const float *kp = loadFloats(k, ks);
  const float *vp = loadFloats(v, vs);
  const float *op = loadFloats(o, os);
  const float *lp = lse ? loadFloats(*lse, lses) : nullptr;
  // An lse that shares bytes with an output is read before any output is written: the outputs
  // go to scratch then (resultBuffer sees it as an input).
  const TensorView none{nullptr, DType::F32, {0}};
  const TensorView &l = lse ? *lse : none;
  float *dqp = resultBuffer(dq, {&dout, &q, &k, &v, &o, &l}, dqs);
  float *dkp = resultBuffer(dk, {&dout, &q, &k, &v, &o, &l, &dq}, dks);
  float *dvp = resultBuffer(dv, {&dout, &q, &k, &v, &o, &l, &dq, &dk}, dvs);

  AttentionGradArgs args{dop, qp, kp, vp, op, lp, segments.empty() ? nullptr : segments.data(),
                         dqp, dkp, dvp, seq, heads, kvHeads, d, causal, scale};
  int64_t work = std::max<int64_t>(1, group * seq * seq * d);
  parallelFor(batch * kvHeads, std::max<int64_t>(1, kWorkGrain / work),
              [&](int64_t t0, int64_t t1) {
                AttentionGradScratch scratch(seq, d);
                for (int64_t t = t0; t < t1; ++t)
                  attentionGradItem(args, t / kvHeads, t % kvHeads, scratch);
              });
  if (dqp != dq.data)
    storeF32(dqp, dq);
  if (dkp != dk.data)
    storeF32(dkp, dk);
  if (dvp != dv.data)
    storeF32(dvp, dv);
}

} // namespace

void attentionGrad(const TensorView &dout, const TensorView &q, const TensorView &k,
                   const TensorView &v, const TensorView &o, bool causal, double scale,
                   const TensorView &dq, const TensorView &dk, const TensorView &dv,
                   const TensorView *segmentIds) {
  attentionGradImpl("attention_grad", dout, q, k, v, o, nullptr, segmentIds, causal, scale, dq,
                    dk, dv);
}

void flashAttentionGrad(const TensorView &dout, const TensorView &q, const TensorView &k,
                        const TensorView &v, const TensorView &o, const TensorView &lse,
                        bool causal, double scale, const TensorView &dq, const TensorView &dk,
                        const TensorView &dv, const TensorView *segmentIds) {
  attentionGradImpl("flash_attention_grad", dout, q, k, v, o, &lse, segmentIds, causal, scale, dq,
                    dk, dv);
}

void flashAttentionQkvGrad(const TensorView &dout, const TensorView &qkv, const TensorView &o,
                           const TensorView &lse, bool causal, double scale, const TensorView &dqkv,
                           const TensorView *segmentIds) {
  const char *kernel = "flash_attention_qkv_grad";
  UnpackedQkv u = unpackQkv(kernel, qkv, o);
  checkFloat(kernel, "dqkv", dqkv);
  checkSameShape(kernel, "dqkv", dqkv, "qkv", qkv);
  // The gradients of q, k and v into tensors of their own, then into their heads of dqkv.
  UnpackedQkv grads = unpackQkv(kernel, dqkv, o, /*copy=*/false);
  attentionGradImpl(kernel, dout, u.views[0], u.views[1], u.views[2], o, &lse, segmentIds, causal,
                    scale, grads.views[0], grads.views[1], grads.views[2]);
  int64_t first = 0;
  for (const TensorView &g : grads.views) {
    if (g.numel() != 0)
      copyHeads(g, 0, dqkv, first, g.dim(2));
    first += g.dim(2);
  }
}

} // namespace bonsai::rt::cpu
