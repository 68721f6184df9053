//===- CudaFp8.h - FP8 casts and delayed scaling on the GPU -----*- C++ -*-===//
//
// The CUDA counterparts of the CPU reference in Fp8.h: the scaled cast to E4M3FN or E5M2 fused
// with the reduction of the statistics FP8 training needs (the input's amax for delayed
// scaling, and how many values underflowed to zero or saturated, for the telemetry), and the
// once-per-step update of a delayed scale from its amax history. Scales, histories and
// statistics live in device memory, so a step replayed as a CUDA Graph reads the scale the
// previous step wrote without the host in the loop.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CUDAFP8_H
#define BONSAI_RUNTIME_CUDAFP8_H

#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/Fp8.h"

#include <cstdint>

namespace bonsai::rt::cuda {

/// Statistics of the scaled casts of one tensor, accumulated on the device (zero it before
/// the first cast it is to cover). `amaxBits` holds the bits of the largest |x| seen as a
/// non-negative float, whose order as unsigned integers is the order of the values.
struct Fp8CastStats {
  uint32_t amaxBits = 0;
  uint32_t reserved = 0;
  unsigned long long count = 0;
  unsigned long long underflows = 0;  ///< nonzero x * scale that became ±0
  unsigned long long saturations = 0; ///< |x * scale| > maxFinite, clipped (infinities too)
};

/// out[i] = encode(x[i] * scale) with scale = *scale (device memory; 1 when null), rounding to
/// nearest even and saturating as fp8::encode does, bit for bit; x is F32, F16 or BF16 and out
/// F8E4M3FN or F8E5M2 of the same shape, whose dtype picks the format. When `stats` is not
/// null, adds this cast's statistics to *stats (device memory), as fp8::castScaled counts them.
void castToFp8(const Context &ctx, const TensorView &x, const float *scale,
               const TensorView &out, Fp8CastStats *stats);

/// out [cols, rows] = the codes of x [rows, cols] transposed, cast as castToFp8 casts them
/// (codes and statistics): the cast the backward FP8 GEMMs give their operands, as cuBLASLt's
/// FP8 kernels take only the "TN" layout. rows and cols must be multiples of 16, x and out
/// 16-byte aligned.
void castToFp8Transposed(const Context &ctx, const TensorView &x, const float *scale,
                         const TensorView &out, Fp8CastStats *stats);

/// The delayed-scaling update after a step (device memory throughout): records the amax of
/// *stats in history[*step % length], then sets *scale to fp8::delayedScale(history, length,
/// *scale, format, margin) and, when `descale` is not null, *descale to 1 / *scale (what an
/// FP8 GEMM multiplies by). `step` is the plan's i64 step counter.
void updateDelayedScale(const Context &ctx, const Fp8CastStats *stats, float *history,
                        int64_t length, const int64_t *step, float *scale, float *descale,
                        fp8::Format format, int margin);

// The FP8 GEMM kernels of plan kinds Fp8Linear .. Fp8LinearBackwardFromInputCast (docs/fp8.md; the
// CPU backend's cpu::fp8Linear and its siblings are the reference). Each casts its two operands
// with the scales of their state rows (or, under current scaling and before a state's first update,
// from the operand's own amax) into the workspace, multiplies the codes with cuBLASLt in fp32, and
// writes the casts' statistics. Everything stays on the device, so the kernels replay in CUDA
// Graphs.

/// y [..., N] = x [..., K] · wᵀ (+ bias) from E4M3FN casts of x (state row 0) and w (row 1).
/// With `fastAccumulation` the GEMM keeps its sum in the tensor cores' accumulator instead of
/// promoting partial sums to fp32 registers (cuBLASLt's FAST_ACCUM; plan Fp8Attrs).
void fp8Linear(const Context &ctx, const TensorView &x, const TensorView &w,
               const TensorView &state, const TensorView *bias, bool current, int margin,
               const TensorView &y, const TensorView &stats, const TensorView &workspace,
               bool fastAccumulation = false);
/// dx [..., K] = dy [..., N] · w from an E5M2 cast of dy (row 2) and a transposed E4M3FN cast
/// of w (row 1).
void fp8LinearGradInput(const Context &ctx, const TensorView &dy, const TensorView &w,
                        const TensorView &state, bool current, int margin, const TensorView &dx,
                        const TensorView &stats, const TensorView &workspace);
/// dw [N, K] = dyᵀ · x summed over the leading dimensions, from transposed casts of dy (E5M2,
/// row 2) and x (E4M3FN, row 0).
void fp8LinearGradWeight(const Context &ctx, const TensorView &dy, const TensorView &x,
                         const TensorView &state, bool current, int margin,
                         const TensorView &dw, const TensorView &stats,
                         const TensorView &workspace);
/// acc [N, K] (f32) += dyᵀ · x: fp8LinearGradWeight's GEMM with beta = 1 into the accumulator,
/// which cuBLASLt reads as C and writes as D.
void fp8LinearGradWeightAccumulate(const Context &ctx, const TensorView &dy, const TensorView &x,
                                   const TensorView &state, bool current, int margin,
                                   const TensorView &stats, const TensorView &workspace,
                                   const TensorView &acc);
/// dx = dy · w and acc (f32) += dyᵀ · x (Fp8LinearBackward): fp8LinearGradInput and
/// fp8LinearGradWeightAccumulate with the same dy and state in two launches before their
/// GEMMs, not four: dy is read once and its E5M2 codes written in both layouts, in the launch
/// that also casts w and x (transposed). The stats are the two kernels' (rows dy, w and dy,
/// x), the workspace holds both of theirs; dy and x have one dtype.
void fp8LinearBackward(const Context &ctx, const TensorView &dy, const TensorView &w,
                       const TensorView &x, const TensorView &state, bool current, int margin,
                       const TensorView &dx, const TensorView &inputGradStats,
                       const TensorView &weightGradStats, const TensorView &workspace,
                       const TensorView &acc);
/// fp8Linear of an x that fp8Linear has cast already (Fp8LinearSharedInput;
/// cpu::fp8LinearSharedInput): x's codes are the first M·K bytes of `inputCast` (that kernel's
/// workspace), its scale row 0 of `inputStats` (that kernel's stats), copied to row 0 of `stats`;
/// the launch casts only w.
void fp8LinearSharedInput(const Context &ctx, const TensorView &inputCast,
                          const TensorView &inputStats, const TensorView &w,
                          const TensorView &state, const TensorView *bias, bool current, int margin,
                          const TensorView &y, const TensorView &stats, const TensorView &workspace,
                          bool fastAccumulation = false);
/// fp8LinearBackward of an x whose transposed cast fp8LinearBackward has made already (kind
/// 97): the codes are the last M·K bytes (rounded up to 256) of `inputCast`, that kernel's
/// workspace; the scale is row 1 of `inputStats` (its weightGradStats), copied to row 1 of
/// `weightGradStats`. The launch casts dy (both layouts) and w.
void fp8LinearBackwardSharedInput(const Context &ctx, const TensorView &dy, const TensorView &w,
                                  const TensorView &inputCast, const TensorView &inputStats,
                                  const TensorView &state, bool current, int margin,
                                  const TensorView &dx, const TensorView &inputGradStats,
                                  const TensorView &weightGradStats, const TensorView &workspace,
                                  const TensorView &acc);
/// fp8Linear that also writes xᵀ's E4M3FN codes to `inputCast` (f8e4m3fn [K, M];
/// Fp8LinearWithInputCast): x is cast in one pass into both layouts (cpu::fp8LinearWithInputCast).
void fp8LinearWithInputCast(const Context &ctx, const TensorView &x, const TensorView &w,
                            const TensorView &state, const TensorView *bias, bool current,
                            int margin, const TensorView &y, const TensorView &stats,
                            const TensorView &inputCast, const TensorView &workspace,
                            bool fastAccumulation = false);
/// fp8LinearBackward with xᵀ's codes from fp8LinearWithInputCast (Fp8LinearBackwardFromInputCast):
/// `inputCast`, and x's scale from row 0 of `inputStats`, copied to row 1 of `weightGradStats`.
void fp8LinearBackwardFromInputCast(const Context &ctx, const TensorView &dy, const TensorView &w,
                                    const TensorView &inputCast, const TensorView &inputStats,
                                    const TensorView &state, bool current, int margin,
                                    const TensorView &dx, const TensorView &inputGradStats,
                                    const TensorView &weightGradStats, const TensorView &workspace,
                                    const TensorView &acc);
/// The once-per-step update of `state` from the forward kernel's stats (rows 0 and 1) and the
/// backward's (row 2; null when the linear has no backward GEMM): fp8::recordAmax at *step, then
/// fp8::delayedScale, and the stats' amax and fractions in columns 1..3.
void fp8UpdateScales(const Context &ctx, const TensorView &step, const TensorView &forward,
                     const TensorView *backward, int margin, const TensorView &state);

} // namespace bonsai::rt::cuda

#endif // BONSAI_RUNTIME_CUDAFP8_H
