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

/// The delayed-scaling update after a step (device memory throughout): records the amax of
/// *stats in history[*step % length], then sets *scale to fp8::delayedScale(history, length,
/// *scale, format, margin) and, when `descale` is not null, *descale to 1 / *scale (what an
/// FP8 GEMM multiplies by). `step` is the plan's i64 step counter.
void updateDelayedScale(const Context &ctx, const Fp8CastStats *stats, float *history,
                        int64_t length, const int64_t *step, float *scale, float *descale,
                        fp8::Format format, int margin);

} // namespace bonsai::rt::cuda

#endif // BONSAI_RUNTIME_CUDAFP8_H
