//===- Fp8.cu - FP8 casts with their statistics, and delayed scaling ------===//
//
// castToFp8 reads the input once: each thread converts 16-byte vectors of the input to FP8
// codes with the hardware conversion (cvt.rn.satfinite), and counts, in registers, the input's
// amax and the values that underflow or saturate; a block reduces its threads' counts in a fixed
// order and adds them to the statistics with one atomic per counter. The conversion and the
// counting follow fp8::encode and fp8::castScaled exactly (every NaN becomes 0x7F).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaFp8.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <cuda_fp8.h>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

/// The FP8 code of y, as fp8::encode computes it.
template <bool E4M3> __device__ __forceinline__ uint8_t encodeFp8(float y) {
  if (isnan(y))
    return 0x7F;
  return uint8_t(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, E4M3 ? __NV_E4M3 : __NV_E5M2));
}

/// Per-thread statistics of the values a thread converted.
struct Counts {
  float amax = 0.0f;
  uint32_t underflows = 0, saturations = 0;

  template <bool E4M3> __device__ __forceinline__ uint8_t convert(float x, float scale) {
    if (!isnan(x))
      amax = fmaxf(amax, fabsf(x));
    float y = x * scale;
    uint8_t code = encodeFp8<E4M3>(y);
    if (!isnan(y)) {
      if (fabsf(y) > (E4M3 ? 448.0f : 57344.0f))
        ++saturations;
      else if (y != 0.0f && (code & 0x7F) == 0)
        ++underflows;
    }
    return code;
  }
};

/// VW elements per access: 16 bytes of input (VW = 16 / sizeof(T)), VW bytes of output; VW = 1
/// for operands that are not aligned for vectors.
template <typename T, int VW, bool E4M3>
__global__ void __launch_bounds__(kThreads)
    castKernel(const T *x, uint8_t *out, int64_t n, const float *scalePtr, Fp8CastStats *stats) {
  const float scale = scalePtr ? *scalePtr : 1.0f;
  Counts counts;
  const int64_t vectors = n / VW;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    float in[VW];
    loadF<VW>(x + v * VW, in);
    uint8_t codes[VW];
#pragma unroll
    for (int i = 0; i < VW; ++i)
      codes[i] = counts.convert<E4M3>(in[i], scale);
    *reinterpret_cast<typename RawType<VW>::type *>(out + v * VW) =
        *reinterpret_cast<const typename RawType<VW>::type *>(codes);
  }
  // The tail (fewer than VW elements) goes to the first threads.
  for (int64_t i = vectors * VW + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = counts.convert<E4M3>(toFloat(x[i]), scale);
  if (!stats)
    return;

  // Block reduction in a fixed order, then one atomic per counter.
  __shared__ float amax[kThreads / 32];
  __shared__ uint32_t under[kThreads / 32], sat[kThreads / 32];
  float a = counts.amax;
  uint32_t u = counts.underflows, s = counts.saturations;
  for (int offset = 16; offset > 0; offset /= 2) {
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, offset));
    u += __shfl_xor_sync(0xffffffffu, u, offset);
    s += __shfl_xor_sync(0xffffffffu, s, offset);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    amax[warp] = a;
    under[warp] = u;
    sat[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x != 0)
    return;
  for (int w = 1; w < kThreads / 32; ++w) {
    a = fmaxf(amax[0], amax[w]);
    amax[0] = a;
    under[0] += under[w];
    sat[0] += sat[w];
  }
  atomicMax(&stats->amaxBits, __float_as_uint(amax[0]));
  if (under[0])
    atomicAdd(&stats->underflows, (unsigned long long)under[0]);
  if (sat[0])
    atomicAdd(&stats->saturations, (unsigned long long)sat[0]);
  if (blockIdx.x == 0)
    atomicAdd(&stats->count, (unsigned long long)n);
}

__global__ void updateScaleKernel(const Fp8CastStats *stats, float *history, int64_t length,
                                  const int64_t *step, float *scale, float *descale,
                                  float maxFinite, int margin) {
  history[*step % length] = __uint_as_float(stats->amaxBits);
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < length; ++i) {
    finite = finite && isfinite(history[i]);
    amax = fmaxf(amax, history[i]);
  }
  if (finite && amax > 0.0f)
    *scale = float(double(maxFinite) / double(amax) / ldexp(1.0, margin));
  if (descale)
    *descale = 1.0f / *scale;
}

template <typename T, int VW>
void launchCast(const char *kn, Stream stream, const TensorView &x, const TensorView &out,
                const float *scale, Fp8CastStats *stats) {
  const int64_t n = x.numel();
  unsigned blocks = gridFor(kn, std::max<int64_t>(n / VW, 1), kThreads);
  const T *in = static_cast<const T *>(x.data);
  auto *codes = static_cast<uint8_t *>(out.data);
  if (out.dtype == DType::F8E4M3FN)
    castKernel<T, VW, true><<<blocks, kThreads, 0, stream>>>(in, codes, n, scale, stats);
  else
    castKernel<T, VW, false><<<blocks, kThreads, 0, stream>>>(in, codes, n, scale, stats);
  checkLaunch(kn, "castKernel");
}

} // namespace

void castToFp8(const Context &ctx, const TensorView &x, const float *scale,
               const TensorView &out, Fp8CastStats *stats) {
  const char *kn = "cast_to_fp8";
  checkFloat(kn, "x", x);
  checkView(kn, "out", out);
  if (out.dtype != DType::F8E4M3FN && out.dtype != DType::F8E5M2)
    fail(kn, std::string("out must be f8e4m3fn or f8e5m2, got ") + dtypeName(out.dtype));
  checkSameShape(kn, "x", x, "out", out);
  if (x.numel() == 0)
    return;
  dispatchFloat(x.dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int VW = kVec<T>;
    if (aligned16(x.data) && (reinterpret_cast<uintptr_t>(out.data) % VW) == 0)
      launchCast<T, VW>(kn, ctx.stream, x, out, scale, stats);
    else
      launchCast<T, 1>(kn, ctx.stream, x, out, scale, stats);
  });
}

void updateDelayedScale(const Context &ctx, const Fp8CastStats *stats, float *history,
                        int64_t length, const int64_t *step, float *scale, float *descale,
                        fp8::Format format, int margin) {
  const char *kn = "fp8_update_scale";
  if (!stats || !history || !step || !scale)
    fail(kn, "stats, history, step and scale must all be device pointers");
  if (length < 1)
    fail(kn, "the amax history needs at least one entry, got " + std::to_string(length));
  updateScaleKernel<<<1, 1, 0, ctx.stream>>>(stats, history, length, step, scale, descale,
                                             fp8::maxFinite(format), margin);
  checkLaunch(kn, "updateScaleKernel");
}

} // namespace bonsai::rt::cuda
