//===- Lora.cu - DoRA's row scale and its output's gradients on CUDA ------===//
//
// dora_scale: y[o] = m[o] / ||W[o, :] + s·(B·A)[o, :]||, one block per output row. The block
// stages B's row (r values, zero-padded to a multiple of 4: the compiled loop over k may load
// up to 3 values past r, which compute-sanitizer's memcheck reported) in shared memory; each thread
// walks the columns i = t, t + T, ... (coalesced reads of W's row and of A's column i across the r
// rows of A), forms W[o, i] + s·Σ_k B[o, k]·A[k, i] and adds its square to an fp64 sum; the block's
// sums are added in a fixed tree order, so the result is the same run to run. The [out, in] product
// B·A is never stored. As on the CPU (runtime/cpu/Lora.cpp), the norm is rounded to y's dtype
// before the division, so that at B = 0 a magnitude initialized to ||W|| gives a scale of 1; a row
// of norm 0 is recorded as a device error (kZeroNorm) and its scale left at 0.
//
// dora_grad: dx = dy ⊙ scale and dm = Σ_t dy ⊙ y / m over [rows, cols] in two kernels, as
// reduce_to's column sums (Reduce.cu): a block per (32-vector column tile, chunk of rows) writes
// dx for its tile and the chunk's fp32 partial sums of dy ⊙ y, row groups over 16-byte vectors;
// then one thread per column adds the chunks' partial rows in chunk order and divides by m. No
// atomics, so the result is the same run to run. A zero m[o] is recorded as a device error
// (kZeroMagnitude) and dm[o] left at 0.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

/// Row groups of a doraGradPartialKernel block (blockDim = (32, kDoraGradGroups)).
constexpr int kDoraGradGroups = 8;
/// Fewest rows per chunk of dora_grad's column sums (unless there are fewer rows).
constexpr int64_t kDoraGradMinRows = 64;

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

/// dx[r, c] = dy[r, c] · scale[c] for the rows of chunk blockIdx.y (rowsPerChunk rows) and the
/// 32 VW columns of tile blockIdx.x, and partial[chunk, c] = Σ dy[r, c] · y[r, c] over them: row
/// group threadIdx.y takes rows r0 + y, r0 + y + kDoraGradGroups, ..., and the groups' sums are
/// added in group order.
template <typename T, int VW>
__global__ void doraGradPartialKernel(const T *dy, const T *y, const T *scale, int64_t rows,
                                      int64_t cols, int64_t rowsPerChunk, T *dx, float *partial) {
  __shared__ float sums[kDoraGradGroups][32 * VW];
  const int64_t c = (int64_t(blockIdx.x) * 32 + threadIdx.x) * VW;
  const int64_t q = blockIdx.y, r0 = q * rowsPerChunk;
  const int64_t r1 = r0 + rowsPerChunk < rows ? r0 + rowsPerChunk : rows;
  float acc[VW] = {};
  if (c < cols) {
    float s[VW];
    loadF<VW>(scale + c, s);
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kDoraGradGroups) {
      float g[VW], v[VW], out[VW];
      loadF<VW>(dy + r * cols + c, g);
      loadF<VW>(y + r * cols + c, v);
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        acc[e] = fmaf(g[e], v[e], acc[e]);
        out[e] = g[e] * s[e];
      }
      storeF<VW>(dx + r * cols + c, out);
    }
  }
#pragma unroll
  for (int e = 0; e < VW; ++e)
    sums[threadIdx.y][threadIdx.x * VW + e] = acc[e];
  __syncthreads();
  for (int t = threadIdx.y * 32 + threadIdx.x; t < 32 * VW; t += 32 * kDoraGradGroups) {
    int64_t col = int64_t(blockIdx.x) * 32 * VW + t;
    if (col >= cols)
      continue;
    float sum = sums[0][t];
#pragma unroll
    for (int g = 1; g < kDoraGradGroups; ++g)
      sum += sums[g][t];
    partial[q * cols + col] = sum;
  }
}

/// dm[c] = (Σ over chunks b = 0, 1, ... of partial[b, c]) / m[c], one thread per column.
template <typename T>
__global__ void doraGradFinishKernel(const float *partial, int64_t chunks, int64_t cols, const T *m,
                                     T *dm, DeviceError *error, int32_t kernelIndex) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols)
    return;
  float sum = 0.0f;
  for (int64_t b = 0; b < chunks; ++b)
    sum += partial[b * cols + c];
  float magnitude = toFloat(m[c]);
  if (!(magnitude != 0.0f)) {
    recordError(error, kernelIndex, kZeroMagnitude, c, 0);
    dm[c] = fromFloat<T>(0.0f);
    return;
  }
  dm[c] = fromFloat<T>(sum / magnitude);
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

void doraGrad(const Context &ctx, const TensorView &dyIn, const TensorView &yIn,
              const TensorView &scale, const TensorView &m, const TensorView &dx,
              const TensorView &dm) {
  const char *kernel = "dora_grad";
  int64_t cols = checkDoraGrad(kernel, dyIn, yIn, scale, m, dx, dm);
  if (cols == 0)
    return;
  int64_t rows = dyIn.numel() / cols;
  // dx may be dy or y itself (each element is read before it is written, by the same thread),
  // but not overlap them otherwise.
  std::vector<Scratch> keep;
  auto unaliased = [&](const TensorView &t) {
    return overlaps(dx, t) && dx.data != t.data ? copyToScratch(kernel, ctx.stream, t, keep) : t;
  };
  TensorView dy = unaliased(dyIn), y = unaliased(yIn);
  if (rows == 0) {
    checkCuda(cudaMemsetAsync(dm.data, 0, dm.bytes(), ctx.stream), "cudaMemsetAsync", kernel);
    return;
  }
  dispatchFloat(dy.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto dyp = static_cast<const T *>(dy.data), yp = static_cast<const T *>(y.data),
         sp = static_cast<const T *>(scale.data), mp = static_cast<const T *>(m.data);
    auto dxp = static_cast<T *>(dx.data), dmp = static_cast<T *>(dm.data);
    bool vector =
        cols % kVec<T> == 0 && aligned16(dyp) && aligned16(yp) && aligned16(sp) && aligned16(dxp);
    int vw = vector ? kVec<T> : 1;
    int64_t tiles = (cols + 32 * vw - 1) / (32 * vw);
    // About eight blocks of 256 threads per multiprocessor, each chunk kDoraGradMinRows rows
    // or more.
    int64_t chunks = std::max<int64_t>(1, int64_t(multiprocessorCount(kernel)) * 8 / tiles);
    chunks = std::min({chunks, (rows + kDoraGradMinRows - 1) / kDoraGradMinRows, int64_t(65535)});
    int64_t rowsPerChunk = (rows + chunks - 1) / chunks;
    chunks = (rows + rowsPerChunk - 1) / rowsPerChunk;
    if (tiles > INT32_MAX)
      fail(kernel, "dy shape " + formatShape(dy.shape) + " has too many columns");
    Scratch partial(kernel, ctx.stream, size_t(chunks * cols) * sizeof(float));
    dim3 grid{unsigned(tiles), unsigned(chunks)}, block{32, kDoraGradGroups};
    if (vector)
      doraGradPartialKernel<T, kVec<T>><<<grid, block, 0, ctx.stream>>>(
          dyp, yp, sp, rows, cols, rowsPerChunk, dxp, partial.as<float>());
    else
      doraGradPartialKernel<T, 1><<<grid, block, 0, ctx.stream>>>(
          dyp, yp, sp, rows, cols, rowsPerChunk, dxp, partial.as<float>());
    checkLaunch(kernel, "doraGradPartialKernel");
    doraGradFinishKernel<T><<<unsigned((cols + 255) / 256), 256, 0, ctx.stream>>>(
        partial.as<float>(), chunks, cols, mp, dmp, ctx.deviceError, ctx.kernelIndex);
    checkLaunch(kernel, "doraGradFinishKernel");
  });
}

} // namespace bonsai::rt::cuda
