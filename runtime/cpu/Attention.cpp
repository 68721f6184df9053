//===- Attention.cpp - rope and attention on the CPU ----------------------===//
//
// The two kernels that work on [batch, seq, heads, head_dim] tensors. rope rotates pairs
// (i, i + D/2) by angles computed in fp64 (Hugging Face's rotate-half convention), from each
// token's position (its sequence index, or the optional positions operand) and the inverse
// frequencies of ropeInverseFrequencies (llama3 scaling included). With segment ids, attention
// masks the keys of other segments (packed rows). attention is
// the exact softmax(scale q kᵀ) v with dot products, the softmax and the weighted sum of values in
// fp64, one (batch, head) pair per work item, so results do not depend on the number of threads.
// flash_attention is the same kernel that also stores each row's log-sum-exp, max + log(sum), in
// f32.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

void detail::rotatePairs(const char *kernel, const char *xName, const TensorView &x,
                         const RoPEAttrs &a, const TensorView *positions, bool transpose,
                         const char *yName, const TensorView &y) {
  checkFloat(kernel, xName, x);
  checkFloat(kernel, yName, y);
  if (x.rank() != 4 || x.dim(3) % 2 != 0)
    fail(kernel, std::string(xName) + " shape " + formatShape(x.shape) +
                     " is not [batch, seq, heads, head_dim] with an even head_dim");
  checkSameShape(kernel, yName, y, xName, x);
  if (!(a.theta > 0.0))
    fail(kernel, "theta " + std::to_string(a.theta) + " is not positive");
  int64_t batch = x.dim(0), seq = x.dim(1), heads = x.dim(2), d = x.dim(3), half = d / 2;
  std::vector<int64_t> pos = loadTokenOperand(kernel, "positions", positions, batch, seq);

  // Angles in fp64: an fp32 position * inv_freq is off by up to 2.4e-4 rad at position 4096.
  // The forward and the gradient compute the same angles, so that ropeGrad(rope(x)) is x up to
  // rounding. Without positions one table of seq rows serves every batch row; with them each
  // token's angles are computed from its own position.
  std::vector<double> invFreq = ropeInverseFrequencies(a, d);
  int64_t tableRows = pos.empty() ? seq : batch * seq;
  std::vector<double> cosTable(static_cast<size_t>(tableRows * half)),
      sinTable(static_cast<size_t>(tableRows * half));
  for (int64_t r = 0; r < tableRows; ++r) {
    double p = pos.empty() ? double(r) : double(pos[size_t(r)]);
    for (int64_t i = 0; i < half; ++i) {
      double angle = p * invFreq[size_t(i)];
      cosTable[size_t(r * half + i)] = std::cos(angle);
      sinTable[size_t(r * half + i)] = std::sin(angle);
    }
  }

  int64_t row = heads * d; // one (batch, position): every head of one token
  parallelFor(batch * seq, std::max<int64_t>(1, kWorkGrain / std::max<int64_t>(1, row)),
              [&](int64_t t0, int64_t t1) {
                std::vector<float> in(static_cast<size_t>(row)), out(static_cast<size_t>(row));
                for (int64_t t = t0; t < t1; ++t) {
                  int64_t s = pos.empty() ? t % seq : t;
                  const double *c = &cosTable[size_t(s * half)];
                  const double *sn = &sinTable[size_t(s * half)];
                  loadF32(subView(x, t * row, row), in.data());
                  for (int64_t h = 0; h < heads; ++h) {
                    const float *xi = &in[size_t(h * d)];
                    float *yi = &out[size_t(h * d)];
                    if (!transpose) {
                      for (int64_t i = 0; i < half; ++i) {
                        double lo = xi[i], hi = xi[i + half];
                        yi[i] = float(lo * c[i] - hi * sn[i]);
                        yi[i + half] = float(hi * c[i] + lo * sn[i]);
                      }
                    } else {
                      // The transpose of [[c, -s], [s, c]]: [[c, s], [-s, c]].
                      for (int64_t i = 0; i < half; ++i) {
                        double lo = xi[i], hi = xi[i + half];
                        yi[i] = float(lo * c[i] + hi * sn[i]);
                        yi[i + half] = float(hi * c[i] - lo * sn[i]);
                      }
                    }
                  }
                  storeF32(out.data(), subView(y, t * row, row));
                }
              });
}

void rope(const TensorView &x, double theta, const TensorView &y) {
  rope(x, RoPEAttrs{theta}, nullptr, y);
}

void rope(const TensorView &x, const RoPEAttrs &a, const TensorView *positions,
          const TensorView &y) {
  rotatePairs("rope", "x", x, a, positions, /*transpose=*/false, "y", y);
}

namespace {

/// attention, and with `lse` (non-null) flashAttention: the log-sum-exp of each row is a
/// by-product of the softmax, so both share one body and o is the same in both.
void attentionImpl(const char *kn, const TensorView &q, const TensorView &k, const TensorView &v,
                   const TensorView *segmentIds, bool causal, double scale, const TensorView &o,
                   const TensorView *lse) {
  checkFloat(kn, "q", q);
  checkFloat(kn, "k", k);
  checkFloat(kn, "v", v);
  checkFloat(kn, "o", o);
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
  if (lse) {
    checkView(kn, "lse", *lse);
    if (lse->dtype != DType::F32)
      fail(kn, std::string("lse must be f32, not ") + dtypeName(lse->dtype));
    checkShape(kn, "lse", *lse, {batch, heads, seq}, "([batch, heads, seq] of q " +
                                                      formatShape(q.shape) + ")");
    if (overlaps(*lse, o))
      fail(kn, "lse overlaps o");
  }
  int64_t kvHeads = k.dim(2), group = heads / kvHeads;
  std::vector<int64_t> segments = loadTokenOperand(kn, "segment_ids", segmentIds, batch, seq);

  std::vector<float> qs, ks, vs, os, lses;
  const float *qp = loadFloats(q, qs);
  const float *kp = loadFloats(k, ks);
  const float *vp = loadFloats(v, vs);
  float *op = resultBuffer(o, {&q, &k, &v}, os);
  float *lp = lse ? resultBuffer(*lse, {&q, &k, &v}, lses) : nullptr;

  int64_t work = std::max<int64_t>(1, seq * seq * d);
  parallelFor(batch * heads, std::max<int64_t>(1, kWorkGrain / work), [&](int64_t t0, int64_t t1) {
    std::vector<double> p(static_cast<size_t>(seq)), acc(static_cast<size_t>(d));
    for (int64_t t = t0; t < t1; ++t) {
      int64_t b = t / heads, h = t % heads, g = h / group;
      for (int64_t i = 0; i < seq; ++i) {
        const float *qi = qp + ((b * seq + i) * heads + h) * d;
        int64_t keys = causal ? i + 1 : seq;
        // Keys of another segment (packed rows) score -inf: probability 0.
        const int64_t *seg = segments.empty() ? nullptr : &segments[size_t(b * seq)];
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          if (seg && seg[j] != seg[i]) {
            p[size_t(j)] = -std::numeric_limits<double>::infinity();
            continue;
          }
          const float *kj = kp + ((b * seq + j) * kvHeads + g) * d;
          double dot = 0.0;
          for (int64_t e = 0; e < d; ++e)
            dot += double(qi[e]) * double(kj[e]);
          p[size_t(j)] = scale * dot;
          max = std::max(max, p[size_t(j)]);
        }
        // A row that reads no key (possible only without causal masking's own key) has
        // max -inf: its probabilities are 0, its output 0 and its log-sum-exp -inf.
        bool empty = max == -std::numeric_limits<double>::infinity();
        double sum = 0.0;
        for (int64_t j = 0; j < keys; ++j)
          sum += p[size_t(j)] = empty ? 0.0 : std::exp(p[size_t(j)] - max);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < keys; ++j) {
          const float *vj = vp + ((b * seq + j) * kvHeads + g) * d;
          for (int64_t e = 0; e < d; ++e)
            acc[size_t(e)] += p[size_t(j)] * double(vj[e]);
        }
        float *oi = op + ((b * seq + i) * heads + h) * d;
        for (int64_t e = 0; e < d; ++e)
          oi[e] = empty ? 0.0f : float(acc[size_t(e)] / sum);
        if (lp)
          lp[t * seq + i] = empty ? -std::numeric_limits<float>::infinity()
                                  : float(max + std::log(sum));
      }
    }
  });
  if (op != o.data)
    storeF32(op, o);
  if (lp && lp != lse->data)
    storeF32(lp, *lse);
}

} // namespace

void detail::copyHeads(const TensorView &from, int64_t fromHead, const TensorView &to,
                       int64_t toHead, int64_t count) {
  const int64_t positions = from.dim(0) * from.dim(1);
  const size_t unit = size_t(from.dim(3)) * dtypeSize(from.dtype), bytes = size_t(count) * unit;
  const auto *src = static_cast<const char *>(from.data) + size_t(fromHead) * unit;
  auto *dst = static_cast<char *>(to.data) + size_t(toHead) * unit;
  const size_t fromRow = size_t(from.dim(2)) * unit, toRow = size_t(to.dim(2)) * unit;
  for (int64_t p = 0; p < positions; ++p)
    std::memcpy(dst + size_t(p) * toRow, src + size_t(p) * fromRow, bytes);
}

detail::UnpackedQkv detail::unpackQkv(const char *kernel, const TensorView &qkv,
                                      const TensorView &o, bool copy) {
  const int64_t kvHeads = checkPackedQkv(kernel, "qkv", qkv, o), heads = o.dim(2);
  UnpackedQkv u;
  const int64_t counts[3] = {heads, kvHeads, kvHeads};
  int64_t first = 0;
  for (int i = 0; i < 3; ++i) {
    TensorView &t = u.views[i];
    t.dtype = qkv.dtype;
    t.shape = {qkv.dim(0), qkv.dim(1), counts[i], qkv.dim(3)};
    u.storage[i].resize(t.bytes());
    t.data = u.storage[i].data();
    if (copy && t.numel() != 0)
      copyHeads(qkv, first, t, 0, counts[i]);
    first += counts[i];
  }
  return u;
}

void attention(const TensorView &q, const TensorView &k, const TensorView &v, bool causal,
               double scale, const TensorView &o, const TensorView *segmentIds) {
  attentionImpl("attention", q, k, v, segmentIds, causal, scale, o, nullptr);
}

void flashAttention(const TensorView &q, const TensorView &k, const TensorView &v, bool causal,
                    double scale, const TensorView &o, const TensorView &lse,
                    const TensorView *segmentIds) {
  attentionImpl("flash_attention", q, k, v, segmentIds, causal, scale, o, &lse);
}

void flashAttentionQkv(const TensorView &qkv, bool causal, double scale, const TensorView &o,
                       const TensorView &lse, const TensorView *segmentIds) {
  const char *kernel = "flash_attention_qkv";
  UnpackedQkv u = unpackQkv(kernel, qkv, o);
  attentionImpl(kernel, u.views[0], u.views[1], u.views[2], segmentIds, causal, scale, o, &lse);
}

} // namespace bonsai::rt::cpu
