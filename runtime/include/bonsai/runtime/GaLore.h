//===- GaLore.h - GaLore's refresh, projection and update kernels ---------===//
//
// The three kernels of a GaLore weight's update (docs/galore.md): GaloreRefresh recomputes the
// projector P (s x r, s the smaller side of the gradient) on its own steps, GaloreProject
// computes R = Pᵀ·G (left) or G·P (right), and GaloreAdamWUpdate runs AdamW on R and applies
// the back-projected direction to the weight. The CPU functions here are the reference (fp64
// arithmetic, results rounded once to f32); the CUDA backend implements the same semantics.
//
// The rules both backends share (when a refresh is due, the sketch's random numbers, the
// workspace size) are inline functions here, so that there is one definition of each; they
// compile for the device too when included from CUDA code.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_GALORE_H
#define BONSAI_RUNTIME_GALORE_H

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/Tensor.h"

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define BONSAI_GALORE_HD __host__ __device__
#else
#define BONSAI_GALORE_HD
#endif

namespace bonsai::rt::galore {

/// What a refresh records in its slot of the status vector. A failure is recorded as +reason
/// on the step whose refresh failed (the runtime warns about positive slots after each step)
/// and turned into -reason on the following steps that do not retry it, so that the reason
/// stays known (galore::refreshDue reads it) without being reported again.
enum Status : int {
  kRefreshed = 0,     ///< refreshed, or not due
  kNonFinite = 1,     ///< the gradient (or its f32 sketch) held a NaN or an infinity
  kRankDeficient = 2, ///< the sketch spans nothing (a zero gradient): the projector was kept
};

/// f32 elements of a refresh's workspace for a gradient with sides small <= large at `rank`
/// (the compiler's GaloreRefreshOp::getWorkspaceElements): Y (small x rank) and Z (large x
/// rank) in f32, the fp64 Gram matrix and triangular factor (rank x rank each), 64 scalars.
inline int64_t workspaceElements(int64_t small, int64_t large, int64_t rank) {
  return (small + large) * rank + 4 * rank * rank + 64;
}

/// Whether a refresh is due before the update numbered `step` + 1, for the weight in `slot` of
/// `weights` GaLore weights whose status slot holds `status`: at the first update (every
/// projector) and on the weight's staggered steps; besides, a refresh that met a non-finite
/// gradient is retried on the steps with step % weights == slot, so that at most one retry
/// runs per step over all weights together and failures cannot pile up into every step. A
/// rank-deficient (zero) sketch waits for the next staggered step.
BONSAI_GALORE_HD inline bool refreshDue(int64_t step, int64_t gap, int64_t offset, float status,
                                        int64_t slot, int64_t weights) {
  if (step == 0 || (step + offset) % gap == 0)
    return true;
  return fabsf(status) == float(kNonFinite) && weights > 0 && step % weights == slot;
}

/// The status a refresh that is not due leaves in its slot: a failure is kept, as -reason
/// (0 and a pending -reason stay as they are, bit for bit).
BONSAI_GALORE_HD inline float pendingStatus(float status) {
  return status > 0.0f ? -status : status;
}

/// Pivots of the rank-revealing Cholesky factorisation (the second pass of the range finder's
/// orthonormalisation, on the Gram matrix of the shifted pass's nearly orthonormal factor)
/// at or below this share of the largest diagonal mark a sketch column as dependent on the
/// ones before it: it is left out and replaced by a completion vector. Above it, the factor
/// has a condition number below ~1e4, so one CholeskyQR pass in fp64 is orthogonal to ~1e-8.
constexpr double kRankTolerance = 1e-8;

/// A completion vector (a unit vector e_i, i < rank, projected off the accepted columns) is
/// taken when its squared residual exceeds 1 / (4 rank): the greedy pass over e_0 .. e_{r-1}
/// then always finds enough of them (the missing directions of span(e_0 .. e_{r-1}) would
/// otherwise have a unit vector v with 1 = sum_i (v·e_i)^2 <= rank / (4 rank)).
BONSAI_GALORE_HD inline double completionTolerance(int64_t rank) { return 0.25 / double(rank); }

/// SplitMix64's finaliser: a bijective mix of 64 bits.
BONSAI_GALORE_HD inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The key of the sketch drawn by weight `slot` at step `step` under `seed`.
BONSAI_GALORE_HD inline uint64_t sketchKey(uint64_t seed, int64_t slot, int64_t step) {
  return mix64(mix64(mix64(seed) ^ uint64_t(slot)) ^ uint64_t(step));
}

/// Element `index` of the sketch with `key`: a standard normal by Box-Muller in fp64 from two
/// 53-bit uniforms (the first in (0, 1], so that its logarithm is finite).
BONSAI_GALORE_HD inline double gaussian(uint64_t key, int64_t index) {
  uint64_t a = mix64(key + 2 * uint64_t(index)), b = mix64(key + 2 * uint64_t(index) + 1);
  const double unit = 1.0 / 9007199254740992.0; // 2^-53
  double u1 = double((a >> 11) + 1) * unit, u2 = double(b >> 11) * unit;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/// The attributes of a refresh (GaloreRefreshAttrs in plan.fbs).
struct RefreshParams {
  int64_t rank = 0;
  int64_t updateProjGap = 1;
  int64_t offset = 0;
  int64_t slot = 0;
  bool left = true;
  bool randomized = true;
  int64_t powerIterations = 1;
  uint64_t seed = 0;
};

} // namespace bonsai::rt::galore

namespace bonsai::rt::cpu {

/// GaloreRefresh on the CPU: when due (galore::refreshDue with the status slot's value), P
/// (f32 [s, rank]) becomes the top-`rank` left singular vectors of A = grad (left) or gradᵀ
/// (right), exact or from the randomized range finder, and status[slot] becomes 0; with a
/// non-finite gradient or a zero sketch P is kept and status[slot] records why (galore::Status).
/// A sketch of rank below `rank` still refreshes: P spans it, completed by unit vectors.
/// The workspace is not used on the CPU (its size is checked).
void galoreRefresh(const TensorView &grad, const TensorView &step,
                   const galore::RefreshParams &params, const TensorView &workspace,
                   const TensorView &projector, const TensorView &status);
/// r = Pᵀ·grad (left, [rank, n]) or grad·P (right, [m, rank]), f32; with bf16Operands, grad
/// and P are rounded to bf16 first.
void galoreProject(const TensorView &grad, const TensorView &projector, bool left,
                   bool bf16Operands, const TensorView &r);
/// AdamW on r (moments m, v of r's shape, f32), which is overwritten with N' = -lr scale N
/// rounded to f32 (N the Adam direction); then param (through master when given) =
/// param (1 - lr wd) + P·N' (or N'·Pᵀ), with P and N' rounded to bf16 first when param is
/// bf16 or f16.
void galoreAdamwUpdate(const TensorView &step, const TensorView &lr, const TensorView &gradNorm,
                       const TensorView &projector, const AdamWHyper &hyper, double scale,
                       bool left, const TensorView &r, const TensorView &param, const TensorView &m,
                       const TensorView &v, const TensorView *master);

} // namespace bonsai::rt::cpu

namespace bonsai::rt::cuda {

/// The CUDA kernels (runtime/cuda/GaLore.cu), defined in builds with the CUDA backend. Same
/// operands and semantics as the CPU functions; the refresh runs only the randomized
/// projector (the exact one throws: the compiler refuses it for GPU targets) and is enqueued
/// every step: its kernels read the step counter and the status on the device and return at
/// once when the refresh is not due, so a captured CUDA Graph stays valid. The GEMMs of the
/// projection and the update run in the gradient's dtype (bf16 tensor cores for a bf16 model,
/// with the projector and the direction rounded to bf16; f32 for an f32 model), accumulating
/// in fp32 into an fp32 result.
void galoreRefresh(const Context &ctx, const TensorView &grad, const TensorView &step,
                   const galore::RefreshParams &params, const TensorView &workspace,
                   const TensorView &projector, const TensorView &status);
void galoreProject(const Context &ctx, const TensorView &grad, const TensorView &projector,
                   bool left, bool bf16Operands, const TensorView &r);
void galoreAdamwUpdate(const Context &ctx, const TensorView &step, const TensorView &lr,
                       const TensorView &gradNorm, const TensorView &projector,
                       const cpu::AdamWHyper &hyper, double scale, bool left, const TensorView &r,
                       const TensorView &param, const TensorView &m, const TensorView &v,
                       const TensorView *master);

} // namespace bonsai::rt::cuda

#endif // BONSAI_RUNTIME_GALORE_H
