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

#include "bonsai/runtime/ElementwiseProgram.h"
#include "bonsai/runtime/KernelAttrs.h"
#include "bonsai/runtime/Tensor.h"

#include <limits>
#include <vector>

namespace bonsai::rt::cpu {

/// c[m, n] = alpha op(a) op(b) + beta c, f32, row-major and dense: op(a) is [m, k] (stored
/// [k, m] when transA), op(b) [k, n] (stored [n, k] when transB). Every GEMM of the CPU backend
/// and of the exports goes through it: OpenBLAS's sgemm, single-threaded, over fixed blocks of
/// 64 rows of c, the blocks spread over the host threads (HostThreads.h), so that each element
/// is computed the same way whatever the number of threads. (OpenBLAS's own threading changed
/// the last bits of the tiny models' gradients between 1 and 2 threads, which made a rank's
/// results depend on how many ranks shared its host.) `kernel` names the caller in errors (a
/// dimension beyond OpenBLAS's 32-bit range).
void gemm(const char *kernel, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
          float alpha, const float *a, const float *b, float beta, float *c);

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
/// rope with the attributes' inverse frequencies (ropeInverseFrequencies: llama3 scaling) and,
/// when `positions` (i32/i64 [B, S]) is given, s = positions[b, s] instead of the index.
void rope(const TensorView &x, const RoPEAttrs &a, const TensorView *positions,
          const TensorView &y);

/// o = softmax(scale * q kᵀ [+ causal mask]) v per batch and head; q [B, S, H, D],
/// k and v [B, S, Hkv, D], query head h reads kv head h / (H / Hkv). With `segmentIds`
/// (i32/i64 [B, S]) query i reads key j only where the ids are equal (packed rows); a query
/// that reads no key gets o = 0.
void attention(const TensorView &q, const TensorView &k, const TensorView &v, bool causal,
               double scale, const TensorView &o, const TensorView *segmentIds = nullptr);
/// attention, bit for bit, that also writes lse [B, H, S] (f32): the natural log of each query
/// row's softmax denominator, max_j x_ij + log Σ_j exp(x_ij - max_j x_ij) with x = scale q kᵀ
/// (-inf for a row that reads no key).
void flashAttention(const TensorView &q, const TensorView &k, const TensorView &v, bool causal,
                    double scale, const TensorView &o, const TensorView &lse,
                    const TensorView *segmentIds = nullptr);
/// flashAttention of q, k and v packed in qkv [B, S, H + 2 KV, D] (H = o.dim(2)): heads 0..H-1
/// are q, the next KV are k, the last KV are v (a fused projection's output, read in place by
/// the CUDA kernels). The same values as flashAttention of the three apart.
void flashAttentionQkv(const TensorView &qkv, bool causal, double scale, const TensorView &o,
                       const TensorView &lse, const TensorView *segmentIds = nullptr);

/// The shape of one block step of ring attention (docs/ring-attention.md): `queries` local
/// query rows against `keys` rows of one rank's key/value block, fp32 [batch, rows, heads or
/// kvHeads, headDim] row-major.
struct RingBlockShape {
  int64_t batch = 0, queries = 0, keys = 0, heads = 0, kvHeads = 0, headDim = 0;
  bool causal = false;
  double scale = 0;
};
/// Which tokens a block step pairs: each query's and key's index in the whole sequence
/// (causal masking compares them), and optionally their segment ids ([batch, rows]; null:
/// one segment).
struct RingBlockTokens {
  const int64_t *queryIndex = nullptr, *keyIndex = nullptr;
  const int64_t *querySegments = nullptr, *keySegments = nullptr;
};
/// The online-softmax state of every local query row across the block steps, in fp64: max
/// and sum per [batch, heads, queries] row (start at -inf and 0), acc the unnormalised output
/// [batch, queries, heads, headDim] (starts at 0).
struct RingAttentionState {
  std::vector<double> max, sum, acc;
  explicit RingAttentionState(const RingBlockShape &s)
      : max(size_t(s.batch * s.heads * s.queries), -std::numeric_limits<double>::infinity()),
        sum(size_t(s.batch * s.heads * s.queries), 0.0),
        acc(size_t(s.batch * s.queries * s.heads * s.headDim), 0.0) {}
};
/// Adds one key/value block to `state`: the scores scale q·k of the pairs `tokens` allows.
void ringAttentionBlock(const RingBlockShape &shape, const RingBlockTokens &tokens, const float *q,
                        const float *k, const float *v, RingAttentionState &state);
/// o = acc / sum and lse = max + log(sum) (null: not wanted); a row that read no key gets 0
/// and -inf, as flashAttention.
void ringAttentionFinish(const RingBlockShape &shape, const RingAttentionState &state, float *o,
                         float *lse);
/// One block step of ring attention's backward pass from the final lse [batch, heads,
/// queries] and delta = Σ dO·O per row: adds the block's part of dq (fp64, local) and of dk,
/// dv (fp32, the block's accumulators that travel with it).
void ringAttentionBlockGrad(const RingBlockShape &shape, const RingBlockTokens &tokens,
                            const float *dout, const float *q, const float *k, const float *v,
                            const float *lse, const double *delta, double *dq, float *dk,
                            float *dv);

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
/// y = the inputs joined along `axis` (equal elsewhere, one dtype).
void concat(const std::vector<TensorView> &xs, int axis, const TensorView &y);
/// Element type conversion between f32, f16 and bf16 (round to nearest even).
void cast(const TensorView &x, const TensorView &y);
/// Byte copy between tensors of equal size.
void copy(const TensorView &x, const TensorView &y);
/// y = the NF4 tensor q dequantized (Nf4.h) into f32, f16 or bf16 of the same shape.
void dequantize(const TensorView &q, const TensorView &y);

//===----------------------------------------------------------------------===//
// Backward kernels (plan version 2). `dy` is the gradient of an op's result; every kernel
// overwrites its outputs (accumulation across uses is explicit in the plan: Add, Accumulate).
//===----------------------------------------------------------------------===//

/// y = value everywhere.
void fill(double value, const TensorView &y);

/// dtable = 0, then dtable[ids[p], :] += dy[p, :] for every position p (in position order, so
/// the result is deterministic).
void embeddingGrad(const TensorView &dy, const TensorView &ids, const TensorView &dtable);

/// dx[..., k] = sum_n dy[..., n] * w[n, k].
void linearGradInput(const TensorView &dy, const TensorView &w, const TensorView &dx);
/// dw[n, k] = sum over all leading positions p of dy[p, n] * x[p, k].
void linearGradWeight(const TensorView &dy, const TensorView &x, const TensorView &dw);

/// y = x summed over the dimensions a trailing broadcast of y to x's shape would add or
/// expand (the adjoint of Add/Mul's rhs broadcast; y's shape broadcasts to x's).
void reduceTo(const TensorView &x, const TensorView &y);

/// Gradients of rmsNorm (recomputing 1/rms from x): dx, and dw summed over all rows.
void rmsNormGrad(const TensorView &dy, const TensorView &x, const TensorView &w, double eps,
                 const TensorView &dx, const TensorView &dw);
/// Gradients of layerNorm: dx, dw = sum dy * xhat, db = sum dy (over all rows).
void layerNormGrad(const TensorView &dy, const TensorView &x, const TensorView &w, double eps,
                   const TensorView &dx, const TensorView &dw, const TensorView &db);

/// The adjoint of rope: the inverse rotation (angle -> -angle) of dy.
void ropeGrad(const TensorView &dy, double theta, const TensorView &dx);
/// ropeGrad of rope(x, a, positions, y).
void ropeGrad(const TensorView &dy, const RoPEAttrs &a, const TensorView *positions,
              const TensorView &dx);

/// Gradients of attention with respect to q, k and v given dO, recomputing the probabilities
/// from q and k; o is the forward output (for D_i = sum_d dO_id O_id). With GQA, dk and dv
/// sum over the query heads that share a kv head.
void attentionGrad(const TensorView &dout, const TensorView &q, const TensorView &k,
                   const TensorView &v, const TensorView &o, bool causal, double scale,
                   const TensorView &dq, const TensorView &dk, const TensorView &dv,
                   const TensorView *segmentIds = nullptr);
/// attentionGrad with the probabilities recomputed as exp(scale q_i·k_j - lse_i) from the
/// forward's log-sum-exp (flashAttention), with no pass for the softmax statistics. Equal to
/// attentionGrad up to the rounding of lse to f32 (a relative 2^-24 |lse| in each p).
void flashAttentionGrad(const TensorView &dout, const TensorView &q, const TensorView &k,
                        const TensorView &v, const TensorView &o, const TensorView &lse,
                        bool causal, double scale, const TensorView &dq, const TensorView &dk,
                        const TensorView &dv, const TensorView *segmentIds = nullptr);
/// flashAttentionGrad of flashAttentionQkv: dq, dk and dv as the heads of dqkv (qkv's shape).
void flashAttentionQkvGrad(const TensorView &dout, const TensorView &qkv, const TensorView &o,
                           const TensorView &lse, bool causal, double scale, const TensorView &dqkv,
                           const TensorView *segmentIds = nullptr);

void siluGrad(const TensorView &dy, const TensorView &x, const TensorView &dx);
void geluGrad(const TensorView &dy, const TensorView &x, bool tanh, const TensorView &dx);
/// dgate = dy * up * silu'(gate), dup = dy * silu(gate).
void swigluGrad(const TensorView &dy, const TensorView &gate, const TensorView &up,
                const TensorView &dgate, const TensorView &dup);
/// dx = y * (dy - sum(dy * y)) along `axis`, from the softmax output y.
void softmaxGrad(const TensorView &dy, const TensorView &y, int axis, const TensorView &dx);

/// dlogits = dloss * (softmax(logits) - onehot(label)) / count over positions whose label is not
/// ignoreIndex (count = their number), 0 at ignored positions; dloss is an f32 scalar.
void crossEntropyGrad(const TensorView &dloss, const TensorView &logits,
                      const TensorView &labels, int64_t ignoreIndex, const TensorView &dlogits);

/// dx = 0, then dx[..., start : start + dy.shape[axis], ...] = dy along `axis`.
void sliceGrad(const TensorView &dy, int axis, int64_t start, const TensorView &dx);

//===----------------------------------------------------------------------===//
// Optimizer kernels. The step counter is an i64 scalar holding the number of updates done.
//===----------------------------------------------------------------------===//

/// norm = sqrt(sum of squares of every element of every gradient) (f32 scalar; accumulated
/// in double, in order).
void gradNorm(const std::vector<TensorView> &grads, const TensorView &norm);

/// A learning-rate schedule (see LearningRateAttrs in plan.fbs).
struct LearningRateSchedule {
  double lr = 0;
  bool cosine = false;
  int64_t warmupSteps = 0;
  int64_t totalSteps = 0;
  double minLrRatio = 0;
};
/// lr (f32 scalar) at the step after `step` updates, t = step + 1.
void learningRate(const TensorView &step, const LearningRateSchedule &schedule,
                  const TensorView &lr);

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0, gradClip = 0;
};
/// One AdamW step in place (PyTorch semantics, see AdamWAttrs in plan.fbs): m and v are f32;
/// with `master` (f32) the update applies to master and param is master rounded to its dtype.
void adamwUpdate(const TensorView &grad, const TensorView &step, const TensorView &lr,
                 const TensorView &gradNorm, const AdamWHyper &hyper, const TensorView &param,
                 const TensorView &m, const TensorView &v, const TensorView *master);

struct SGDHyper {
  double momentum = 0, weightDecay = 0, gradClip = 0;
};
/// One SGD step in place (PyTorch semantics, see SGDAttrs in plan.fbs).
void sgdUpdate(const TensorView &grad, const TensorView &lr, const TensorView &gradNorm,
               const SGDHyper &hyper, const TensorView &param, const TensorView &momentum,
               const TensorView *master);

/// step += 1 (i64 scalar).
void stepIncrement(const TensorView &step);
/// acc += g (same shape; any float storage, computed in fp32).
void accumulate(const TensorView &g, const TensorView &acc);
/// x = 0.
void zero(const TensorView &x);
/// acc = max(acc, x) elementwise (f32, same shape; NaN when either is NaN): a step's FP8 cast
/// statistics from its micro-batches' (AccumulateMax, docs/fp8.md).
void accumulateMax(const TensorView &x, const TensorView &acc);

/// DoRA's row scale (docs/lora.md): y[o] = m[o] / n[o], n[o] = ||w[o, :] + scale (b a)[o, :]||_2
/// for m [out], w [out, in], a [r, in], b [out, r]. Each row's square sum is accumulated in
/// fp64 in order (the row of b·a formed element by element, never stored) and n is rounded to
/// y's dtype before the division, so that n equals the RowNorm initializer at b = 0.
void doraScale(const TensorView &m, const TensorView &w, const TensorView &a, const TensorView &b,
               double scale, const TensorView &y);
/// The gradients of DoRA's rescaled output y = x ⊙ scale, scale = m / n as doraScale computes
/// it with the norm n detached (docs/lora.md): dx = dy ⊙ scale (rounded once to dx's dtype, as
/// `mul` rounds), and dm[o] = Σ_t dy[t, o] · y[t, o] / m[o], which equals Σ_t dy · x / n without
/// the pre-scale x. Each column's sum is fp64 in row order. A zero m[o] is an error: x is not
/// recoverable from y there.
void doraGrad(const TensorView &dy, const TensorView &y, const TensorView &scale,
              const TensorView &m, const TensorView &dx, const TensorView &dm);

//===----------------------------------------------------------------------===//
// Fused kernels (bonsai-fuse; docs/fusion.md). Each computes exactly what the chain of
// kernels it replaces computes, rounding every intermediate the chain stores the same way.
//===----------------------------------------------------------------------===//

/// The LM head, its mean cross-entropy and their gradients, `chunkRows` positions at a time:
/// loss = crossEntropy(x wᵀ), dx = dlogits w, dw = dlogitsᵀ x (when dw is given) with
/// dlogits = crossEntropyGrad(dloss, x wᵀ). The logits chunk and (for a non-f32 dw) dw's fp32
/// accumulator live in `workspace` (f32, linearCrossEntropyWorkspaceElements elements).
void linearCrossEntropy(const TensorView &x, const TensorView &w, const TensorView &labels,
                        const TensorView &dloss, int64_t ignoreIndex, int64_t chunkRows,
                        const TensorView &loss, const TensorView &dx,
                        const TensorView &workspace, const TensorView *dw);
/// sum = lhs + rhs (as add), y = rmsNorm(sum).
void addRmsNorm(const TensorView &lhs, const TensorView &rhs, const TensorView &w, double eps,
                const TensorView &sum, const TensorView &y);
/// sum = lhs + rhs (as add), y = layerNorm(sum).
void addLayerNorm(const TensorView &lhs, const TensorView &rhs, const TensorView &w,
                  const TensorView &b, double eps, const TensorView &sum, const TensorView &y);
/// rmsNormGrad with dx = (the norm's input gradient, rounded to dx's dtype) + addend.
void rmsNormGradAdd(const TensorView &dy, const TensorView &x, const TensorView &w,
                    const TensorView &addend, double eps, const TensorView &dx,
                    const TensorView &dw);
/// layerNormGrad with dx = (the norm's input gradient, rounded to dx's dtype) + addend.
void layerNormGradAdd(const TensorView &dy, const TensorView &x, const TensorView &w,
                      const TensorView &addend, double eps, const TensorView &dx,
                      const TensorView &dw, const TensorView &db);

/// adamwUpdate of every (grads[i], params[i], m[i], v[i], masters[i]) with the shared step,
/// lr and norm; `masters` is empty or has one tensor per parameter. Bitwise the per-tensor
/// kernel's results; the chunks of all tensors are spread over the threads together.
void multiTensorAdamwUpdate(const std::vector<TensorView> &grads, const TensorView &step,
                            const TensorView &lr, const TensorView &gradNorm,
                            const AdamWHyper &hyper, const std::vector<TensorView> &params,
                            const std::vector<TensorView> &m, const std::vector<TensorView> &v,
                            const std::vector<TensorView> &masters);
/// sgdUpdate of every (grads[i], params[i], momentum[i], masters[i]), as multiTensorAdamwUpdate.
void multiTensorSgdUpdate(const std::vector<TensorView> &grads, const TensorView &lr,
                          const TensorView &gradNorm, const SGDHyper &hyper,
                          const std::vector<TensorView> &params,
                          const std::vector<TensorView> &momentum,
                          const std::vector<TensorView> &masters);
/// pre = linear(x, w, bias); y = gelu(pre) with the tanh approximation: the unfused pair,
/// y computed from pre as stored (rounded to its dtype).
void linearGelu(const TensorView &x, const TensorView &w, const TensorView *bias,
                const TensorView &y, const TensorView &pre);
/// y = addend + linear(x, w): the unfused pair, the product rounded to y's dtype before the
/// addition. y may be the addend's storage.
void linearAdd(const TensorView &x, const TensorView &w, const TensorView &addend,
               const TensorView &y);
/// acc += dyᵀ x summed over the leading dimensions: the product is formed in fp32 (as
/// linearGradWeight forms it) and added to acc in fp32, rounded once into acc. With an f32 acc
/// this is bitwise linearGradWeight into an f32 tensor followed by accumulate; the unfused
/// pair with a bf16/f16 gradient rounds the product to that dtype first, this does not.
void linearGradWeightAccumulate(const TensorView &dy, const TensorView &x, const TensorView &acc);

//===----------------------------------------------------------------------===//
// FP8 GEMMs (plan kinds Fp8Linear .. Fp8LinearBackward, docs/fp8.md). `state` is an FP8 scaling
// state f32 [3, 4 + H] (fp8::StateRow, fp8::StateColumn); a cast uses the scale of its operand's
// row, or, when that is not a positive finite number (before the first update) or `current` is set,
// fp8::currentScale(amax of the operand, format, margin). Casts are fp8::castScaled's, their
// codes go to `workspace` (f32 of fp8::gemmWorkspaceBytes / 4 elements or more: the first
// operand's codes, then the second's from the next multiple of 256 bytes, each row-major in
// its operand's layout), and row r of `stats` (f32 [2, 4], fp8::StatsColumn) describes cast
// operand r. The GEMMs multiply decoded values, sum in f32 in k order and multiply by
// 1 / (scaleA · scaleB), as fp8::gemm; the result is rounded once into the output's dtype.

/// y [..., N] = x [..., K] · w [N, K]ᵀ (+ bias [N], added in f32) from E4M3FN casts of x
/// (state row InputRow) and w (WeightRow); stats rows: x, w.
void fp8Linear(const TensorView &x, const TensorView &w, const TensorView &state,
               const TensorView *bias, bool current, int margin, const TensorView &y,
               const TensorView &stats, const TensorView &workspace);
/// dx [..., K] = dy [..., N] · w [N, K] from an E5M2 cast of dy (OutputGradRow) and an E4M3FN
/// cast of w (WeightRow); stats rows: dy, w.
void fp8LinearGradInput(const TensorView &dy, const TensorView &w, const TensorView &state,
                        bool current, int margin, const TensorView &dx, const TensorView &stats,
                        const TensorView &workspace);
/// dw [N, K] = dyᵀ · x summed over the leading dimensions, from an E5M2 cast of dy
/// (OutputGradRow) and an E4M3FN cast of x (InputRow); stats rows: dy, x.
void fp8LinearGradWeight(const TensorView &dy, const TensorView &x, const TensorView &state,
                         bool current, int margin, const TensorView &dw, const TensorView &stats,
                         const TensorView &workspace);
/// acc [N, K] (f32) += dyᵀ · x: fp8LinearGradWeight's product, in f32, added to the
/// accumulator once, as fp8LinearGradWeight into an f32 tensor and accumulate would.
void fp8LinearGradWeightAccumulate(const TensorView &dy, const TensorView &x,
                                   const TensorView &state, bool current, int margin,
                                   const TensorView &stats, const TensorView &workspace,
                                   const TensorView &acc);
/// dx = dy · w and acc += dyᵀ · x (Fp8LinearBackward): fp8LinearGradInput and
/// fp8LinearGradWeightAccumulate with the same dy and state, bit for bit, in the two halves of
/// `workspace`; dy and x have one dtype.
void fp8LinearBackward(const TensorView &dy, const TensorView &w, const TensorView &x,
                       const TensorView &state, bool current, int margin, const TensorView &dx,
                       const TensorView &inputGradStats, const TensorView &weightGradStats,
                       const TensorView &workspace, const TensorView &acc);
/// fp8Linear of an input that fp8Linear has cast already (Fp8LinearSharedInput): x's codes are the
/// first M·K bytes of `inputCast` (that call's workspace), its scale column 3 of row 0 of
/// `inputStats` (its stats), which becomes row 0 of `stats`; only w is cast, its codes at
/// the start of `workspace` (fp8::gemmWorkspaceBytes(0, N·K) bytes or more). y gives M and
/// the dtype. The same as fp8Linear of that x with that scale, bit for bit.
void fp8LinearSharedInput(const TensorView &inputCast, const TensorView &inputStats,
                          const TensorView &w, const TensorView &state, const TensorView *bias,
                          bool current, int margin, const TensorView &y, const TensorView &stats,
                          const TensorView &workspace);
/// fp8LinearBackward of an input that fp8LinearBackward has cast already
/// (Fp8LinearBackwardSharedInput): x's codes are those that call left in `inputCast` (its
/// workspace: the M·K bytes before its last 256), its scale column 3 of row 1 of `inputStats` (its
/// weightGradStats), which becomes row 1 of `weightGradStats`; dy and w are cast as
/// fp8LinearBackward casts them.
void fp8LinearBackwardSharedInput(const TensorView &dy, const TensorView &w,
                                  const TensorView &inputCast, const TensorView &inputStats,
                                  const TensorView &state, bool current, int margin,
                                  const TensorView &dx, const TensorView &inputGradStats,
                                  const TensorView &weightGradStats, const TensorView &workspace,
                                  const TensorView &acc);
/// fp8Linear that also writes xᵀ's E4M3FN codes to `inputCast` (f8e4m3fn [K, M];
/// Fp8LinearWithInputCast), the codes fp8LinearBackward would make of x with the same scale.
void fp8LinearWithInputCast(const TensorView &x, const TensorView &w, const TensorView &state,
                            const TensorView *bias, bool current, int margin, const TensorView &y,
                            const TensorView &stats, const TensorView &inputCast,
                            const TensorView &workspace);
/// fp8LinearBackward with x's codes from fp8LinearWithInputCast (Fp8LinearBackwardFromInputCast):
/// `inputCast` its xᵀ codes [K, M], `inputStats` its stats, whose row 0 (x's scale) becomes row 1
/// of `weightGradStats`; the workspace is fp8LinearBackwardSharedInput's.
void fp8LinearBackwardFromInputCast(const TensorView &dy, const TensorView &w,
                                    const TensorView &inputCast, const TensorView &inputStats,
                                    const TensorView &state, bool current, int margin,
                                    const TensorView &dx, const TensorView &inputGradStats,
                                    const TensorView &weightGradStats, const TensorView &workspace,
                                    const TensorView &acc);
/// The once-per-step delayed-scale update, in place on `state`: rows InputRow and WeightRow
/// from rows 0 and 1 of `forwardStats`, OutputGradRow from row 0 of `backwardStats` when
/// given. Each records the amax in its history at step % H (fp8::recordAmax), sets its scale
/// to fp8::delayedScale of the history (the previous scale while the history holds no finite
/// nonzero amax) and copies the amax, underflow and saturation fractions to columns 1..3.
void fp8UpdateScales(const TensorView &step, const TensorView &forwardStats,
                     const TensorView *backwardStats, int margin, const TensorView &state);

/// A generated elementwise kernel (FusedElementwise): runs `program` for every element index
/// of the outputs (all of one numel), reading input i at the index modulo its numel. Values
/// are f32 between instructions; Truncate rounds to nearest even as a store to its type would,
/// exp, tanh and erf are the C library's f32 functions. An output may be an input's very
/// storage when that input has the outputs' numel.
void fusedElementwise(const ElementwiseProgramInfo &program,
                      const std::vector<const TensorView *> &inputs,
                      const std::vector<const TensorView *> &outputs);

} // namespace bonsai::rt::cpu

#endif // BONSAI_RUNTIME_CPUKERNELS_H
