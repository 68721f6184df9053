//===- RingAttention.cpp - one block step of ring attention on the CPU ----===//
//
// The compute of ring attention (docs/ring-attention.md): the local queries against one
// rank's key/value block, masked by the tokens' indices in the whole sequence (a key reads
// only when its index is at most the query's, when causal) and by segment ids. The forward
// keeps each row's online-softmax state (running max, denominator and unnormalised output)
// in fp64 across the blocks, so the merge is exact up to the order of the sums; the backward
// recomputes the probabilities from the final log-sum-exp as flash_attention_grad does. The
// ring itself (which block a rank holds, the exchange) is the runtime's (runtime/src).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// Whether query row i reads key row j of the block.
bool reads(const RingBlockShape &s, const RingBlockTokens &t, int64_t b, int64_t i, int64_t j) {
  if (s.causal && t.keyIndex[j] > t.queryIndex[i])
    return false;
  return !t.querySegments || t.querySegments[b * s.queries + i] == t.keySegments[b * s.keys + j];
}

} // namespace

void ringAttentionBlock(const RingBlockShape &s, const RingBlockTokens &t, const float *q,
                        const float *k, const float *v, RingAttentionState &state) {
  const int64_t group = s.heads / s.kvHeads, d = s.headDim;
  int64_t work = std::max<int64_t>(1, s.queries * s.keys * d);
  parallelFor(s.batch * s.heads, std::max<int64_t>(1, kWorkGrain / work),
              [&](int64_t t0, int64_t t1) {
                std::vector<double> p(size_t(s.keys));
                for (int64_t item = t0; item < t1; ++item) {
                  int64_t b = item / s.heads, h = item % s.heads, g = h / group;
                  for (int64_t i = 0; i < s.queries; ++i) {
                    const float *qi = q + ((b * s.queries + i) * s.heads + h) * d;
                    double blockMax = -std::numeric_limits<double>::infinity();
                    for (int64_t j = 0; j < s.keys; ++j) {
                      if (!reads(s, t, b, i, j)) {
                        p[size_t(j)] = -std::numeric_limits<double>::infinity();
                        continue;
                      }
                      const float *kj = k + ((b * s.keys + j) * s.kvHeads + g) * d;
                      double dot = 0.0;
                      for (int64_t e = 0; e < d; ++e)
                        dot += double(qi[e]) * double(kj[e]);
                      p[size_t(j)] = s.scale * dot;
                      blockMax = std::max(blockMax, p[size_t(j)]);
                    }
                    if (blockMax == -std::numeric_limits<double>::infinity())
                      continue; // The block has no key this row reads.
                    size_t row = size_t((b * s.heads + h) * s.queries + i);
                    double &max = state.max[row], &sum = state.sum[row];
                    double *acc = &state.acc[size_t(((b * s.queries + i) * s.heads + h) * d)];
                    double newMax = std::max(max, blockMax);
                    double rescale = std::exp(max - newMax); // 0 for the first block (max = -inf).
                    sum *= rescale;
                    for (int64_t e = 0; e < d; ++e)
                      acc[e] *= rescale;
                    for (int64_t j = 0; j < s.keys; ++j) {
                      if (p[size_t(j)] == -std::numeric_limits<double>::infinity())
                        continue;
                      double w = std::exp(p[size_t(j)] - newMax);
                      sum += w;
                      const float *vj = v + ((b * s.keys + j) * s.kvHeads + g) * d;
                      for (int64_t e = 0; e < d; ++e)
                        acc[e] += w * double(vj[e]);
                    }
                    max = newMax;
                  }
                }
              });
}

void ringAttentionFinish(const RingBlockShape &s, const RingAttentionState &state, float *o,
                         float *lse) {
  const int64_t d = s.headDim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.queries; ++i) {
        size_t row = size_t((b * s.heads + h) * s.queries + i);
        size_t at = size_t(((b * s.queries + i) * s.heads + h) * d);
        // A row that read no key anywhere (packed rows without causal masking) gets a zero
        // output and an lse of -inf, as flash_attention.
        bool empty = state.sum[row] == 0.0;
        for (int64_t e = 0; e < d; ++e)
          o[at + size_t(e)] = empty ? 0.0f : float(state.acc[at + size_t(e)] / state.sum[row]);
        if (lse)
          lse[row] = empty ? -std::numeric_limits<float>::infinity()
                           : float(state.max[row] + std::log(state.sum[row]));
      }
}

void ringAttentionBlockGrad(const RingBlockShape &s, const RingBlockTokens &t, const float *dout,
                            const float *q, const float *k, const float *v, const float *lse,
                            const double *delta, double *dq, float *dk, float *dv) {
  const int64_t group = s.heads / s.kvHeads, d = s.headDim;
  int64_t work = std::max<int64_t>(1, group * s.queries * s.keys * d);
  // One (batch, kv head) per item: the query heads of a group add into the same dk and dv.
  parallelFor(s.batch * s.kvHeads, std::max<int64_t>(1, kWorkGrain / work),
              [&](int64_t t0, int64_t t1) {
                std::vector<double> dkAcc(size_t(s.keys * d)), dvAcc(size_t(s.keys * d));
                for (int64_t item = t0; item < t1; ++item) {
                  int64_t b = item / s.kvHeads, g = item % s.kvHeads;
                  std::fill(dkAcc.begin(), dkAcc.end(), 0.0);
                  std::fill(dvAcc.begin(), dvAcc.end(), 0.0);
                  for (int64_t h = g * group; h < (g + 1) * group; ++h)
                    for (int64_t i = 0; i < s.queries; ++i) {
                      size_t row = size_t((b * s.heads + h) * s.queries + i);
                      float l = lse[row];
                      if (l == -std::numeric_limits<float>::infinity())
                        continue; // The row read no key: every probability is 0.
                      size_t at = size_t(((b * s.queries + i) * s.heads + h) * d);
                      const float *qi = q + at, *doi = dout + at;
                      double *dqi = dq + at;
                      for (int64_t j = 0; j < s.keys; ++j) {
                        if (!reads(s, t, b, i, j))
                          continue;
                        const float *kj = k + ((b * s.keys + j) * s.kvHeads + g) * d;
                        const float *vj = v + ((b * s.keys + j) * s.kvHeads + g) * d;
                        double dot = 0.0, dp = 0.0;
                        for (int64_t e = 0; e < d; ++e) {
                          dot += double(qi[e]) * double(kj[e]);
                          dp += double(doi[e]) * double(vj[e]);
                        }
                        double p = std::exp(s.scale * dot - double(l));
                        double ds = p * (dp - delta[row]) * s.scale;
                        for (int64_t e = 0; e < d; ++e) {
                          dvAcc[size_t(j * d + e)] += p * double(doi[e]);
                          dkAcc[size_t(j * d + e)] += ds * double(qi[e]);
                          dqi[e] += ds * double(kj[e]);
                        }
                      }
                    }
                  for (int64_t j = 0; j < s.keys; ++j)
                    for (int64_t e = 0; e < d; ++e) {
                      size_t at = size_t(((b * s.keys + j) * s.kvHeads + g) * d + e);
                      dk[at] += float(dkAcc[size_t(j * d + e)]);
                      dv[at] += float(dvAcc[size_t(j * d + e)]);
                    }
                }
              });
}

} // namespace bonsai::rt::cpu
