//===- CpuKernels.h - The CPU reference backend's kernels ------------------===//
//
// One function per plan kernel kind (see plan.fbs and docs/plan-format.md). Storage may be
// f32, f16 or bf16; every kernel computes in fp32 (GEMMs through OpenBLAS's sgemm) and rounds
// once when storing. Shapes are those the compiler verified; kernels still check what would
// otherwise corrupt memory (ids out of range, shape disagreements) and throw rt::Error.
// These kernels are the numerical reference every GPU kernel is tested against.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CPUKERNELS_H
#define BONSAI_RUNTIME_CPUKERNELS_H

#include "bonsai/runtime/Tensor.h"

namespace bonsai::rt::cpu {

/// out[..., :] = table[ids[...], :]. Throws if an id is outside [0, vocab).
void embedding(const TensorView &table, const TensorView &ids, const TensorView &out);

/// y[..., n] = sum_k x[..., k] * w[n, k] (+ bias[n]); w in [out, in] layout.
void linear(const TensorView &x, const TensorView &w, const TensorView *bias,
            const TensorView &y);

/// c[..., m, n] = sum_k a[..., m, k] * b[..., k, n], same batch dimensions.
void matmul(const TensorView &a, const TensorView &b, const TensorView &c);

/// out = lhs + rhs / lhs * rhs, rhs broadcast over lhs's trailing dimensions (dims equal or 1).
void add(const TensorView &lhs, const TensorView &rhs, const TensorView &out);
void mul(const TensorView &lhs, const TensorView &rhs, const TensorView &out);

/// y = x / sqrt(mean(x^2) + eps) * w over the last dimension.
void rmsNorm(const TensorView &x, const TensorView &w, double eps, const TensorView &y);
/// y = (x - mean) / sqrt(var + eps) * w + b over the last dimension (biased variance).
void layerNorm(const TensorView &x, const TensorView &w, const TensorView &b, double eps,
               const TensorView &y);

/// Rotary embedding of x [B, S, H, D], Hugging Face rotate-half convention: for i < D/2,
/// angle = s * theta^(-2i/D), y[i] = x[i] cos - x[i + D/2] sin, y[i + D/2] = x[i + D/2] cos + x[i] sin.
void rope(const TensorView &x, double theta, const TensorView &y);

/// o = softmax(scale * q kᵀ [+ causal mask]) v per batch and head; q [B, S, H, D],
/// k and v [B, S, Hkv, D], query head h reads kv head h / (H / Hkv).
void attention(const TensorView &q, const TensorView &k, const TensorView &v, bool causal,
               double scale, const TensorView &o);

void silu(const TensorView &x, const TensorView &y);
/// tanh = true: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); else 0.5 x (1 + erf(x / sqrt 2)).
void gelu(const TensorView &x, bool tanh, const TensorView &y);
/// y = silu(gate) * up.
void swiglu(const TensorView &gate, const TensorView &up, const TensorView &y);
void softmax(const TensorView &x, int axis, const TensorView &y);

/// Mean over positions with labels != ignoreIndex of -log softmax(logits)[label]; writes the
/// f32 scalar `loss` (NaN when every label is ignored, as PyTorch). Throws on a label outside
/// [0, vocab) that is not ignoreIndex.
void crossEntropy(const TensorView &logits, const TensorView &labels, int64_t ignoreIndex,
                  const TensorView &loss);

/// y.shape[i] = x.shape[perm[i]].
void transpose(const TensorView &x, const std::vector<int64_t> &perm, const TensorView &y);
/// y = x[..., start : start + y.shape[axis], ...] along `axis`.
void slice(const TensorView &x, int axis, int64_t start, const TensorView &y);
/// Element type conversion between f32, f16 and bf16 (round to nearest even).
void cast(const TensorView &x, const TensorView &y);
/// Byte copy between tensors of equal size.
void copy(const TensorView &x, const TensorView &y);

} // namespace bonsai::rt::cpu

#endif // BONSAI_RUNTIME_CPUKERNELS_H
