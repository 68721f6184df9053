//===- Fp8.h - The two 8-bit float formats of FP8 training, on the CPU ----===//
//
// E4M3FN (4 exponent bits, bias 7, 3 mantissa bits, no infinity, one NaN per sign, largest
// finite 448) and E5M2 (5 exponent bits, bias 15, 2 mantissa bits, IEEE-like with infinities,
// largest finite 57344), as the OCP 8-bit floating point specification defines them and as
// Hopper and Ada tensor cores, cuBLASLt and torch.float8_e4m3fn / torch.float8_e5m2 use them.
//
// The conversion from f32 is the one FP8 training uses: round to nearest, ties to even, and
// saturate what lies beyond the largest finite value (infinities included) to it, the CUDA
// intrinsics' __NV_SATFINITE; NaN stays NaN (code 0x7F, the sign dropped, as the hardware does). This is the CPU reference the FP8 kernels are
// tested against, so it is exact: every f32 input gives the code a correctly rounded
// conversion gives (test/runtime/Fp8Test.cpp checks that against a search over all codes).
// No MLIR, no LLVM.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_FP8_H
#define BONSAI_RUNTIME_FP8_H

#include <cstdint>

namespace bonsai::rt::fp8 {

/// The two formats.
enum class Format : uint8_t { E4M3FN, E5M2 };

/// "e4m3fn" or "e5m2".
const char *formatName(Format format);

/// Mantissa bits: 3 or 2.
int mantissaBits(Format format);

/// The exponent bias: 7 or 15.
int exponentBias(Format format);

/// The largest finite value: 448 or 57344.
inline float maxFinite(Format format) { return format == Format::E4M3FN ? 448.0f : 57344.0f; }

/// The smallest positive (subnormal) value: 2^-9 or 2^-16.
float minSubnormal(Format format);

/// The value of `code` (NaN for a NaN code, ±infinity for E5M2's infinities).
float decode(uint8_t code, Format format);

/// `x` rounded to nearest (ties to even) with saturation to ±maxFinite; NaN gives 0x7F.
uint8_t encode(float x, Format format);

/// encode then decode: the value an FP8 cast leaves.
inline float roundTrip(float x, Format format) { return decode(encode(x, format), format); }

/// What a scaled cast of a tensor did to its values, for the underflow telemetry: how many
/// nonzero inputs became zero, and how many were clipped to ±maxFinite.
struct CastStats {
  int64_t count = 0;
  int64_t underflows = 0;
  int64_t saturations = 0;
  float amax = 0.0f; ///< largest |x| of the input (before scaling), NaN ignored
};

/// codes[i] = encode(x[i] * scale); returns the statistics of the cast.
CastStats castScaled(const float *x, int64_t count, float scale, Format format, uint8_t *codes);

/// Delayed scaling (Transformer Engine's recipe): a tensor is cast with a scale computed from
/// the amaxes of the steps before, kept in a history of `length` entries (training state):
/// scale = (maxFinite / max(history)) / 2^margin, so that the largest recent value lands
/// 2^margin below the largest finite one. A history whose maximum is zero or not finite (the
/// first step; an overflowed step) keeps the previous scale.
float delayedScale(const float *history, int64_t length, float previousScale, Format format,
                   int margin);

/// The scale of a cast that has no delayed scale to use (current scaling, or delayed scaling
/// before its first update): from the tensor's own amax, as delayedScale computes it from a
/// one-entry history; 1 when the amax is zero or not finite.
float currentScale(float amax, Format format, int margin);

/// The FP8 GEMM kernels' scaling state (plan kinds Fp8Linear .. Fp8UpdateScales, docs/fp8.md): an
/// f32 tensor [3, kStateColumns + H] with one row per scaled operand of a linear ...
enum StateRow : int64_t { InputRow = 0, WeightRow = 1, OutputGradRow = 2 };
/// ... whose columns are the scale the next casts use (0: none yet), then the last update's
/// amax, underflow fraction and saturation fraction, then the amax history of H entries.
enum StateColumn : int64_t { ScaleColumn = 0, AmaxColumn = 1, UnderflowColumn = 2,
                             SaturationColumn = 3, kStateColumns = 4 };
/// The statistics a kernel of kinds Fp8Linear .. Fp8LinearGradWeight reports per cast operand: f32
/// [2, kStatsColumns].
enum StatsColumn : int64_t { StatsAmax = 0, StatsUnderflow = 1, StatsSaturation = 2,
                             StatsScale = 3, kStatsColumns = 4 };

/// Bytes of the workspace of an FP8 GEMM kernel whose cast operands have `aElements` and
/// `bElements` elements: the two operands' codes, each rounded up to 256 bytes, then 256 bytes
/// for the scales and statistics the device computes.
/// (Inline, as the CUDA kernels use it and link before the CPU reference.)
inline int64_t gemmWorkspaceBytes(int64_t aElements, int64_t bElements) {
  return (aElements + 255) / 256 * 256 + (bElements + 255) / 256 * 256 + 256;
}

/// Records a step's amax in the history (a ring: entry step % length).
void recordAmax(float *history, int64_t length, int64_t step, float amax);

/// C [m, n] (f32) = (A·B) / (scaleA·scaleB) for A [m, k] and B [k, n] given as FP8 codes
/// (row-major) cast with those scales: what an FP8 GEMM computes, each product of two FP8
/// values exact in f32, the sum accumulated in f32 in k order, then descaled.
void gemm(const uint8_t *a, Format formatA, float scaleA, const uint8_t *b, Format formatB,
          float scaleB, int64_t m, int64_t n, int64_t k, float *c);

} // namespace bonsai::rt::fp8

#endif // BONSAI_RUNTIME_FP8_H
