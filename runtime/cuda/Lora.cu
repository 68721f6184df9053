//===- Lora.cu - DoRA's row scale and its output's gradients on CUDA ------===//
//
// dora_scale: y[o] = m[o] / ||W[o, :] + s·(B·A)[o, :]|| in two kernels. With bf16 or f16
// weights whose rows are whole 16-byte vectors (every model's), B·A is formed on the tensor
// cores: doraScaleMmaKernel, a block per (64 output rows, chunk of 128 columns), one mma.sync
// per 16 x 8 tile of B·A at rank 16, so that the kernel moves W at close to the memory's rate;
// the CUDA-core kernel below it (sixteen FMAs per weight at rank 16) took 5.5 ms of TinyLlama
// QDoRA's 134 ms step on an H100. Otherwise (f32, unaligned rows) a block per (8 output
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
#include "MmaSync.cuh"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
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

/// Columns of a doraScaleMmaKernel chunk: the four lanes of a quad take 32 each.
constexpr int kMmaChunk = 128;
/// Warps of a doraScaleMmaKernel block, 16 output rows each.
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
static_assert(kMmaThreads == kMmaChunk, "each thread stages one column of A");
/// The largest rank doraScaleMmaKernel holds B's fragments for: eight k-steps of 16.
constexpr int64_t kMmaMaxRank = 128;

/// A's chunk in shared memory, transposed: row p holds the (padded) ranks of one column, so
/// that a B fragment register is one 32-bit load. The pitch, rank + 8 elements (rank padded to
/// a multiple of 16), puts rows p and p + 1 4 banks apart: the eight rows a fragment load
/// reads, and the eight a staging store phase writes, cover all 32 banks.
__host__ __device__ constexpr int mmaPitch(int paddedRank) { return paddedRank + 8; }

/// partial[blockIdx.y, o] = Σ_i (W[o, i] + s·Σ_k B[o, k]·A[k, i])² over the kMmaChunk columns
/// of chunk blockIdx.y, for the 16 rows o of each warp of row block blockIdx.x, with B·A on
/// the tensor cores (mma.sync m16n8k16, 16-bit inputs, fp32 accumulation; the products are
/// exact, their sums rounded as the tensor core adds). Requires in % 8 == 0 and w 16-byte
/// aligned: each lane reads its rows of W as 16-byte vectors.
///
/// Each lane (g = lane / 4, q = lane % 4) takes rows g and g + 8 of its warp's 16 and the 32
/// consecutive columns 32q .. 32q + 31 of the chunk: four 16-byte loads per row, issued before
/// any arithmetic. An mma tile's output column n is assigned to chunk column 32(n / 2) + 2j +
/// n % 2 in tile j (of 16), so that C's (row g, n 2q..2q+1) of tile j are the lane's own
/// columns 2j and 2j + 1: shared row 8j + n holds the ranks of that column of A.
template <typename T>
__global__ void __launch_bounds__(kMmaThreads)
    doraScaleMmaKernel(const T *w, const T *a, const T *b, int64_t out, int64_t in, int64_t rank,
                       float scale, float *partial) {
  extern __shared__ __align__(16) unsigned char smemBytes[];
  T *at = reinterpret_cast<T *>(smemBytes);
  const int steps = int((rank + 15) / 16);
  const int pitch = mmaPitch(steps * 16);
  const int64_t i0 = int64_t(blockIdx.y) * kMmaChunk;
  {
    // Thread t fills shared row 8j + e (j = t / 8, e = t % 8), which holds chunk column
    // 32(e / 2) + e % 2 + 2j, 16 bytes (8 ranks) per store: the eight lanes of a store phase
    // write eight consecutive rows. Zeros past rank and past `in`.
    const int e = threadIdx.x % 8, j = threadIdx.x / 8;
    const int c = 32 * (e / 2) + e % 2 + 2 * j;
    T *row = at + (8 * j + e) * pitch;
    const bool valid = i0 + c < in;
    auto rankAt = [&](int k) {
      return valid && k < rank ? toFloat(a[int64_t(k) * in + i0 + c]) : 0.0f;
    };
    for (int k0 = 0; k0 < steps * 16; k0 += 8)
      *reinterpret_cast<uint4 *>(row + k0) =
          make_uint4(mma::pack(T(), rankAt(k0), rankAt(k0 + 1)),
                     mma::pack(T(), rankAt(k0 + 2), rankAt(k0 + 3)),
                     mma::pack(T(), rankAt(k0 + 4), rankAt(k0 + 5)),
                     mma::pack(T(), rankAt(k0 + 6), rankAt(k0 + 7)));
  }

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, q = lane % 4;
  const int64_t o0 = int64_t(blockIdx.x) * (kMmaWarps * 16) + warp * 16;
  const int64_t rowG = o0 + g, rowG8 = o0 + g + 8;

  // The lane's 32 columns of rows g and g + 8: 16 registers of two values each per row.
  uint4 wv[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t o = h ? rowG8 : rowG;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int64_t i = i0 + 32 * q + 8 * v;
      wv[h][v] = o < out && i < in ? *reinterpret_cast<const uint4 *>(w + o * in + i)
                                   : make_uint4(0, 0, 0, 0);
    }
  }

  // B's rows o0 .. o0 + 15 as A fragments, one per k-step (zeros past rank and past out).
  auto bAt = [&](int64_t o, int64_t k) {
    return o < out && k < rank ? toFloat(b[o * rank + k]) : 0.0f;
  };
  uint32_t frag[kMmaMaxRank / 16][4];
#pragma unroll
  for (int s = 0; s < kMmaMaxRank / 16; ++s) {
    if (s >= steps)
      break;
    const int64_t k = int64_t(s) * 16 + 2 * q;
    frag[s][0] = mma::pack(T(), bAt(rowG, k), bAt(rowG, k + 1));
    frag[s][1] = mma::pack(T(), bAt(rowG8, k), bAt(rowG8, k + 1));
    frag[s][2] = mma::pack(T(), bAt(rowG, k + 8), bAt(rowG, k + 9));
    frag[s][3] = mma::pack(T(), bAt(rowG8, k + 8), bAt(rowG8, k + 9));
  }
  __syncthreads();

  float sumG = 0.0f, sumG8 = 0.0f;
#pragma unroll
  for (int j = 0; j < kMmaChunk / 8; ++j) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const T *col = at + (8 * j + g) * pitch + 2 * q;
#pragma unroll
    for (int s = 0; s < kMmaMaxRank / 16; ++s) {
      if (s >= steps)
        break;
      mma::mma(T(), c, frag[s], *reinterpret_cast<const uint32_t *>(col + 16 * s),
               *reinterpret_cast<const uint32_t *>(col + 16 * s + 8));
    }
    // Columns 2j and 2j + 1 of the lane's 32: register j % 4 of vector j / 4.
    const uint32_t *w0 = reinterpret_cast<const uint32_t *>(&wv[0][j / 4]);
    const uint32_t *w1 = reinterpret_cast<const uint32_t *>(&wv[1][j / 4]);
    float2 x0 = mma::unpack(T(), w0[j % 4]), x1 = mma::unpack(T(), w1[j % 4]);
    float v0 = fmaf(scale, c[0], x0.x), v1 = fmaf(scale, c[1], x0.y);
    float v2 = fmaf(scale, c[2], x1.x), v3 = fmaf(scale, c[3], x1.y);
    sumG = fmaf(v0, v0, sumG);
    sumG = fmaf(v1, v1, sumG);
    sumG8 = fmaf(v2, v2, sumG8);
    sumG8 = fmaf(v3, v3, sumG8);
  }
  // The quad's four lanes hold the row's four column ranges: added in a fixed pattern.
  for (int offset = 1; offset < 4; offset <<= 1) {
    sumG += __shfl_xor_sync(0xffffffffu, sumG, offset);
    sumG8 += __shfl_xor_sync(0xffffffffu, sumG8, offset);
  }
  if (q == 0) {
    if (rowG < out)
      partial[int64_t(blockIdx.y) * out + rowG] = sumG;
    if (rowG8 < out)
      partial[int64_t(blockIdx.y) * out + rowG8] = sumG8;
  }
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
  // 16-bit weights with whole 16-byte rows take the tensor cores; the rest the CUDA cores.
  const bool tensorCores = (w.dtype == DType::BF16 || w.dtype == DType::F16) && in % 8 == 0 &&
                           aligned16(w.data) && rank <= kMmaMaxRank;
  const int64_t blockRows = tensorCores ? kMmaWarps * 16 : kDoraScaleRows;
  const int64_t chunkColumns = tensorCores ? kMmaChunk : kDoraScaleChunk;
  const size_t shared = tensorCores
                            ? size_t(kMmaChunk) * size_t(mmaPitch(int((rank + 15) / 16 * 16))) * 2
                            : size_t(kDoraScaleRows * stagedRank(rank)) * sizeof(float);
  int64_t groups = (out + blockRows - 1) / blockRows;
  int64_t chunks = std::max<int64_t>(1, (in + chunkColumns - 1) / chunkColumns);
  if (groups > INT32_MAX || chunks > 65535)
    fail(kernel, "w shape " + formatShape(w.shape) + " is too large");
  Scratch partial(kernel, ctx.stream, size_t(chunks * out) * sizeof(float));
  const dim3 grid{unsigned(groups), unsigned(chunks)};
  dispatchFloat(w.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T *wp = static_cast<const T *>(w.data), *ap = static_cast<const T *>(a.data),
            *bp = static_cast<const T *>(b.data);
    if constexpr (!std::is_same_v<T, float>) {
      if (tensorCores) {
        doraScaleMmaKernel<T><<<grid, kMmaThreads, shared, ctx.stream>>>(
            wp, ap, bp, out, in, rank, float(scale), partial.as<float>());
        checkLaunch(kernel, "doraScaleMmaKernel");
      }
    }
    if (!tensorCores) {
      doraScalePartialKernel<T><<<grid, kThreads, shared, ctx.stream>>>(
          wp, ap, bp, out, in, rank, float(scale), partial.as<float>());
      checkLaunch(kernel, "doraScalePartialKernel");
    }
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
