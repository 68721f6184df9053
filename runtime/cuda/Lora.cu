//===- Lora.cu - DoRA's row scale on CUDA ----------------------------------===//
//
// dora_scale: y[o] = m[o] / ||W[o, :] + s·(B·A)[o, :]||, one block per output row. The block
// stages B's row (r values, zero-padded to a multiple of 4: the compiled loop over k may load
// up to 3 values past r, which compute-sanitizer's memcheck reported) in shared memory; each thread walks the columns i = t, t + T, ...
// (coalesced reads of W's row and of A's column i across the r rows of A), forms
// W[o, i] + s·Σ_k B[o, k]·A[k, i] and adds its square to an fp64 sum; the block's sums are added
// in a fixed tree order, so the result is the same run to run. The [out, in] product B·A is
// never stored. As on the CPU (runtime/cpu/Lora.cpp), the norm is rounded to y's dtype before
// the division, so that at B = 0 a magnitude initialized to ||W|| gives a scale of 1; a row of
// norm 0 is recorded as a device error (kZeroNorm) and its scale left at 0.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <cstdint>
#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

/// The floats of B's row the kernel stages: rank rounded up to a multiple of 4.
__host__ __device__ constexpr int64_t stagedRank(int64_t rank) { return (rank + 3) / 4 * 4; }

template <typename T>
__global__ void doraScaleKernel(const T *m, const T *w, const T *a, const T *b, int64_t in,
                                int64_t rank, float scale, T *y, DeviceError *error,
                                int32_t kernelIndex) {
  extern __shared__ float brow[]; // B[o, :], stagedRank(rank) floats, zeros after rank
  __shared__ double partial[kThreads];
  const int64_t o = blockIdx.x;
  for (int64_t k = threadIdx.x; k < stagedRank(rank); k += blockDim.x)
    brow[k] = k < rank ? toFloat(b[o * rank + k]) : 0.0f;
  __syncthreads();
  const T *wrow = w + o * in;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < in; i += blockDim.x) {
    float lora = 0.0f;
    for (int64_t k = 0; k < rank; ++k)
      lora = fmaf(brow[k], toFloat(a[k * in + i]), lora);
    double v = double(toFloat(wrow[i])) + double(scale) * double(lora);
    sum += v * v;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x != 0)
    return;
  // The norm as y's dtype holds it, then the quotient (see the file comment).
  float norm = toFloat(fromFloat<T>(float(sqrt(partial[0]))));
  if (!(norm > 0.0f)) {
    recordError(error, kernelIndex, kZeroNorm, o, 0);
    y[o] = fromFloat<T>(0.0f);
    return;
  }
  y[o] = fromFloat<T>(float(double(toFloat(m[o])) / double(norm)));
}

} // namespace

void doraScale(const Context &ctx, const TensorView &m, const TensorView &w, const TensorView &a,
               const TensorView &b, double scale, const TensorView &y) {
  const char *kernel = "dora_scale";
  checkFloat(kernel, "magnitude", m);
  checkFloat(kernel, "w", w);
  checkFloat(kernel, "lora_a", a);
  checkFloat(kernel, "lora_b", b);
  checkFloat(kernel, "y", y);
  if (w.rank() != 2 || a.rank() != 2)
    fail(kernel, "w and lora_a must be 2-D, got " + formatShape(w.shape) + " and " +
                     formatShape(a.shape));
  int64_t out = w.dim(0), in = w.dim(1), rank = a.dim(0);
  std::string context = "for w " + formatShape(w.shape) + " and lora_a " + formatShape(a.shape);
  checkShape(kernel, "lora_a", a, {rank, in}, context);
  checkShape(kernel, "lora_b", b, {out, rank}, context);
  checkShape(kernel, "magnitude", m, {out}, context);
  checkShape(kernel, "y", y, {out}, context);
  for (const TensorView *t : {&m, &a, &b, &y})
    if (t->dtype != w.dtype)
      fail(kernel, std::string("operands must share w's dtype ") + dtypeName(w.dtype) +
                       ", got " + dtypeName(t->dtype));
  if (out == 0)
    return;
  // 48 KiB of shared memory per block without opting in, 2 KiB of it the static partial sums.
  constexpr int64_t kMaxRank = (48 * 1024 - kThreads * int64_t(sizeof(double))) / 4 / 4 * 4;
  if (rank > kMaxRank)
    fail(kernel, "rank " + std::to_string(rank) + " exceeds the " + std::to_string(kMaxRank) +
                     " this kernel stages");
  size_t shared = size_t(stagedRank(rank)) * sizeof(float);
  dispatchFloat(w.dtype, [&](auto tag) {
    using T = decltype(tag);
    doraScaleKernel<T><<<unsigned(out), kThreads, shared, ctx.stream>>>(
        static_cast<const T *>(m.data), static_cast<const T *>(w.data),
        static_cast<const T *>(a.data), static_cast<const T *>(b.data), in, rank, float(scale),
        static_cast<T *>(y.data), ctx.deviceError, ctx.kernelIndex);
  });
  checkLaunch(kernel, "doraScaleKernel");
}

} // namespace bonsai::rt::cuda
