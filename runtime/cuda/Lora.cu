//===- Lora.cu - DoRA's row scale and its output's gradients on CUDA ------===//
//
// dora_scale: y[o] = m[o] / ||W[o, :] + s·(B·A)[o, :]|| in two kernels. A block per (8 output
// rows, chunk of 1024 columns) stages its rows of B (r values each, zero-padded to a multiple of
// 4: the loop over k may load up to 3 values past r, which compute-sanitizer's memcheck
// reported) in shared memory; each thread takes 4 columns 256 apart, reads A's four ranks at a
// time at all of them before using any (many loads in flight: one column per thread, rank by
// rank and one block per 8 rows, TinyLlama's 154 launches took 6.2 ms on an H100 where reading
// the weights once takes 0.6), forms W[o, i] + s·Σ_k B[o,
// k]·A[k, i] for the 8 rows and adds its square to the row's fp32 sum; rows are summed by warp
// shuffles and then across warps in a fixed order into the chunk's partial; sumPartialRowsKernel
// (DeviceUtil.cuh) adds the chunks in order. No atomics, so the result is the same run to run.
// The [out, in] product B·A is never stored. As on the CPU (runtime/cpu/Lora.cpp), the norm is
// rounded to y's dtype before the division, so that at B = 0 a magnitude initialized to ||W||
// gives a scale of 1; a row of norm 0 is recorded as a device error (kZeroNorm) and its scale
// left at 0.
//
// dora_grad: dx = dy ⊙ scale and dm = Σ_t dy ⊙ y / m over [rows, cols] in two kernels, as
// reduce_to's column sums (Reduce.cu): a block per (32-vector column tile, chunk of rows) writes
// dx for its tile and the chunk's fp32 partial sums of dy ⊙ y, row groups over 16-byte vectors;
// then sumPartialRowsKernel (DeviceUtil.cuh) adds the chunks' partial rows in a fixed order and
// divides by m. No atomics, so the result is the same run to run. A zero m[o] is recorded as a
// device error (kZeroMagnitude) and dm[o] left at 0.
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

/// Output rows per doraScalePartialKernel block: each column of A it reads serves this many rows.
constexpr int kDoraScaleRows = 8;
/// Columns per thread of a doraScalePartialKernel block, kThreads apart: their loads are
/// independent, so that many are in flight per thread.
constexpr int kDoraScaleColumns = 4;
/// Columns per doraScalePartialKernel block.
constexpr int64_t kDoraScaleChunk = int64_t(kThreads) * kDoraScaleColumns;

/// partial[blockIdx.y, o] = Σ_i (W[o, i] + s·Σ_k B[o, k]·A[k, i])² over the kDoraScaleChunk
/// columns of chunk blockIdx.y, for the kDoraScaleRows rows o of row group blockIdx.x.
template <typename T>
__global__ void doraScalePartialKernel(const T *w, const T *a, const T *b, int64_t out, int64_t in,
                                       int64_t rank, float scale, float *partial) {
  // B's rows o0 .. o0 + kDoraScaleRows - 1, stagedRank(rank) floats each (16-byte aligned rows),
  // zeros past rank and past the last row.
  extern __shared__ __align__(16) float brows[];
  __shared__ float sums[kDoraScaleRows][kThreads / 32];
  const int64_t o0 = int64_t(blockIdx.x) * kDoraScaleRows;
  const int rows = out - o0 < kDoraScaleRows ? int(out - o0) : kDoraScaleRows;
  const int64_t staged = stagedRank(rank);
  for (int64_t t = threadIdx.x; t < kDoraScaleRows * staged; t += blockDim.x) {
    int64_t j = t / staged, k = t % staged;
    brows[t] = j < rows && k < rank ? toFloat(b[(o0 + j) * rank + k]) : 0.0f;
  }
  __syncthreads();
  const int64_t i0 = int64_t(blockIdx.y) * kDoraScaleChunk + threadIdx.x;
  float lora[kDoraScaleRows][kDoraScaleColumns] = {};
  for (int64_t k = 0; k < staged; k += 4) {
    // A's four ranks k .. k + 3 at the thread's columns, all loads issued before any use; one
    // 16-byte shared load of each staged row of B per four ranks (zero past r, where A is not
    // read).
    float ak[4][kDoraScaleColumns];
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int c = 0; c < kDoraScaleColumns; ++c) {
        int64_t i = i0 + int64_t(c) * kThreads;
        ak[e][c] = k + e < rank && i < in ? toFloat(a[(k + e) * in + i]) : 0.0f;
      }
#pragma unroll
    for (int j = 0; j < kDoraScaleRows; ++j) {
      float4 bk = *reinterpret_cast<const float4 *>(brows + j * staged + k);
#pragma unroll
      for (int c = 0; c < kDoraScaleColumns; ++c) {
        lora[j][c] = fmaf(bk.x, ak[0][c], lora[j][c]);
        lora[j][c] = fmaf(bk.y, ak[1][c], lora[j][c]);
        lora[j][c] = fmaf(bk.z, ak[2][c], lora[j][c]);
        lora[j][c] = fmaf(bk.w, ak[3][c], lora[j][c]);
      }
    }
  }
  float sum[kDoraScaleRows] = {};
#pragma unroll
  for (int j = 0; j < kDoraScaleRows; ++j)
#pragma unroll
    for (int c = 0; c < kDoraScaleColumns; ++c) {
      int64_t i = i0 + int64_t(c) * kThreads;
      if (j < rows && i < in) {
        float v = fmaf(scale, lora[j][c], toFloat(w[(o0 + j) * in + i]));
        sum[j] = fmaf(v, v, sum[j]);
      }
    }
  // Each row's sum: the warps' (shuffles in a fixed pattern), then the warps' in order.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < kDoraScaleRows; ++j) {
    float v = sum[j];
    for (int offset = 16; offset > 0; offset >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0)
      sums[j][warp] = v;
  }
  __syncthreads();
  if (threadIdx.x >= rows)
    return;
  const int j = threadIdx.x;
  float total = sums[j][0];
#pragma unroll
  for (int g = 1; g < kThreads / 32; ++g)
    total += sums[j][g];
  partial[int64_t(blockIdx.y) * out + o0 + j] = total;
}

/// Stores y[o] = m[o] / ||row o||, the norm rounded to T first (see the file comment); a zero
/// norm is a device error, y[o] then 0.
template <typename T> struct MagnitudeOverNorm {
  const T *m;
  T *y;
  DeviceError *error;
  int32_t kernelIndex;
  __device__ void operator()(int64_t o, float squares) const {
    float norm = toFloat(fromFloat<T>(sqrtf(squares)));
    if (!(norm > 0.0f)) {
      recordError(error, kernelIndex, kZeroNorm, o, 0);
      y[o] = fromFloat<T>(0.0f);
      return;
    }
    y[o] = fromFloat<T>(float(double(toFloat(m[o])) / double(norm)));
  }
};

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

/// Stores dm[c] = (the column's sum) / m[c]; a zero m[c] is a device error, dm[c] then 0.
template <typename T> struct DivideByMagnitude {
  const T *m;
  T *dm;
  DeviceError *error;
  int32_t kernelIndex;
  __device__ void operator()(int64_t c, float sum) const {
    float magnitude = toFloat(m[c]);
    if (!(magnitude != 0.0f)) {
      recordError(error, kernelIndex, kZeroMagnitude, c, 0);
      dm[c] = fromFloat<T>(0.0f);
      return;
    }
    dm[c] = fromFloat<T>(sum / magnitude);
  }
};

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
  // 48 KiB of shared memory per block without opting in, less the static row sums.
  constexpr int64_t kMaxRank =
      (48 * 1024 - kDoraScaleRows * (kThreads / 32) * int64_t(sizeof(float))) / 4 / kDoraScaleRows /
      4 * 4;
  if (rank > kMaxRank)
    fail(kernel, "rank " + std::to_string(rank) + " exceeds the " + std::to_string(kMaxRank) +
                     " this kernel stages");
  size_t shared = size_t(kDoraScaleRows * stagedRank(rank)) * sizeof(float);
  int64_t groups = (out + kDoraScaleRows - 1) / kDoraScaleRows;
  int64_t chunks = std::max<int64_t>(1, (in + kDoraScaleChunk - 1) / kDoraScaleChunk);
  if (groups > INT32_MAX || chunks > 65535)
    fail(kernel, "w shape " + formatShape(w.shape) + " is too large");
  Scratch partial(kernel, ctx.stream, size_t(chunks * out) * sizeof(float));
  dispatchFloat(w.dtype, [&](auto tag) {
    using T = decltype(tag);
    doraScalePartialKernel<T>
        <<<dim3(unsigned(groups), unsigned(chunks)), kThreads, shared, ctx.stream>>>(
            static_cast<const T *>(w.data), static_cast<const T *>(a.data),
            static_cast<const T *>(b.data), out, in, rank, float(scale), partial.as<float>());
    checkLaunch(kernel, "doraScalePartialKernel");
    sumPartialRowsWith(kernel, ctx.stream, partial.as<float>(), chunks, out,
                       MagnitudeOverNorm<T>{static_cast<const T *>(m.data),
                                            static_cast<T *>(y.data), ctx.deviceError,
                                            ctx.kernelIndex});
  });
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
    sumPartialRowsWith(kernel, ctx.stream, partial.as<float>(), chunks, cols,
                       DivideByMagnitude<T>{mp, dmp, ctx.deviceError, ctx.kernelIndex});
  });
}

} // namespace bonsai::rt::cuda
