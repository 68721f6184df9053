//===- Reduce.cu - reduce_to on CUDA ---------------------------------------===//
//
// y = x summed over the dimensions a trailing broadcast of y to x's shape would add or expand
// (the adjoint of add/mul's rhs broadcast). x's shape is collapsed into alternating groups of
// kept (K) and reduced (R) dimensions, and the common layouts get their own kernels:
//
//   [R, K]  columns (a bias gradient): a block per (column tile, chunk of rows) sums its
//           chunk into a partial row (row groups over 16-byte column vectors, coalesced along
//           the row), then sumPartialRowsKernel adds the chunks' partial rows in chunk order;
//   [K, R]  rows: one warp or block per row, as the norm kernels;
//   [R]     everything: chunks reduced by blocks into partials, then one block adds them;
//   other   one thread per y element walks its terms (correct for any layout, not fast).
//
// Every sum is fp32 in an order fixed by the shapes and the device, so results are the same
// run to run; there are no atomics.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <algorithm>
#include <cstdint>
#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kMaxGroups = 8;

/// Row groups of a columnPartialKernel block (blockDim = (32, kColumnGroups)).
constexpr int kColumnGroups = 8;
/// Fewest rows per chunk of the column sums (unless there are fewer rows), so the partial rows
/// stay a small fraction of the traffic.
constexpr int64_t kMinRowsPerChunk = 64;

/// partial[q, c] = the sum of x[r, c] over the rows r of chunk q (rowsPerChunk rows, q =
/// blockIdx.y) for the 32 VW columns of block column blockIdx.x: row group y adds the rows
/// r0 + y, r0 + y + kColumnGroups, ... (16-byte loads when VW > 1), and the groups' sums are
/// added in group order.
template <typename T, int VW>
__global__ void columnPartialKernel(const T *x, int64_t rows, int64_t cols, int64_t rowsPerChunk,
                                    float *partial) {
  __shared__ float sums[kColumnGroups][32 * VW];
  const int64_t c = (int64_t(blockIdx.x) * 32 + threadIdx.x) * VW;
  const int64_t q = blockIdx.y, r0 = q * rowsPerChunk;
  const int64_t r1 = r0 + rowsPerChunk < rows ? r0 + rowsPerChunk : rows;
  float acc[VW] = {};
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColumnGroups) {
      float v[VW];
      loadF<VW>(x + r * cols + c, v);
#pragma unroll
      for (int e = 0; e < VW; ++e)
        acc[e] += v[e];
    }
  }
#pragma unroll
  for (int e = 0; e < VW; ++e)
    sums[threadIdx.y][threadIdx.x * VW + e] = acc[e];
  __syncthreads();
  for (int t = threadIdx.y * 32 + threadIdx.x; t < 32 * VW; t += 32 * kColumnGroups) {
    int64_t col = int64_t(blockIdx.x) * 32 * VW + t;
    if (col >= cols)
      continue;
    float sum = sums[0][t];
#pragma unroll
    for (int g = 1; g < kColumnGroups; ++g)
      sum += sums[g][t];
    partial[q * cols + col] = sum;
  }
}

/// out[r] = sum of x[r * len, min(n, (r + 1) * len)): one warp or block per row.
template <typename T, typename TY, int VW>
__global__ void rowSumKernel(const T *x, int64_t rows, int64_t len, int64_t n, TY *out) {
  __shared__ float scratch[32];
  int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows)
    return;
  int64_t begin = row * len, count = n - begin < len ? n - begin : len;
  const T *xr = x + begin;
  float sum = 0.0f;
  forRow<VW>(xr, count, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(xr + i, v);
#pragma unroll
    for (int e = 0; e < N; ++e)
      sum += v[e];
  });
  sum = rowReduce(sum, scratch, SumOp{});
  if (threadIdx.x == 0)
    out[row] = fromFloat<TY>(sum);
}

/// x's collapsed groups (outermost first): kept groups' sizes and strides, reduced groups' too.
struct Groups {
  int kept, reduced;
  int64_t keptSize[kMaxGroups], keptStride[kMaxGroups];
  int64_t redSize[kMaxGroups], redStride[kMaxGroups];
  int64_t terms;
};

/// y[j] = sum over the reduced index space (row-major) of x at j's kept offset plus the term's.
template <typename T, typename TY>
__global__ void genericReduceKernel(const T *x, int64_t ny, Groups g, TY *y) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < ny;
       j += int64_t(gridDim.x) * blockDim.x) {
    int64_t base = 0, rest = j;
    for (int i = g.kept - 1; i >= 0; --i) {
      base += (rest % g.keptSize[i]) * g.keptStride[i];
      rest /= g.keptSize[i];
    }
    float sum = 0.0f;
    for (int64_t t = 0; t < g.terms; ++t) {
      int64_t offset = 0, r = t;
      for (int i = g.reduced - 1; i >= 0; --i) {
        offset += (r % g.redSize[i]) * g.redStride[i];
        r /= g.redSize[i];
      }
      sum += toFloat(x[base + offset]);
    }
    y[j] = fromFloat<TY>(sum);
  }
}

int rowThreadsLaunch(int64_t rows, int64_t len, int vw, dim3 &block) {
  int tpr = threadsPerRow(len, vw);
  block = tpr == 32 ? dim3(32, 8) : dim3(unsigned(tpr), 1);
  return int(tpr == 32 ? (rows + 7) / 8 : rows);
}

/// out[r] = sum of row r (rows of len, the last clipped at n), as TY.
template <typename T, typename TY>
void rowSums(const char *kernel, Stream stream, const T *x, int64_t rows, int64_t len, int64_t n,
             TY *out) {
  // forRow peels each row's own unaligned head: vectors suit any row length and address.
  dim3 block;
  unsigned grid = unsigned(rowThreadsLaunch(rows, len, kVec<T>, block));
  rowSumKernel<T, TY, kVec<T>><<<grid, block, 0, stream>>>(x, rows, len, n, out);
  checkLaunch(kernel, "rowSumKernel");
}

} // namespace

void reduceTo(const Context &ctx, const TensorView &xIn, const TensorView &yIn) {
  const char *k = "reduce_to";
  checkFloat(k, "x", xIn);
  checkFloat(k, "y", yIn);
  int64_t rank = xIn.rank(), lead = rank - yIn.rank();
  bool broadcastable = lead >= 0;
  for (int64_t d = 0; broadcastable && d < yIn.rank(); ++d) {
    int64_t yd = yIn.shape[size_t(d)], xd = xIn.shape[size_t(lead + d)];
    broadcastable = yd == xd || yd == 1;
  }
  if (!broadcastable)
    fail(k, "y shape " + formatShape(yIn.shape) +
                " does not broadcast over the trailing dimensions of x shape " +
                formatShape(xIn.shape));
  int64_t ny = yIn.numel(), n = xIn.numel();
  if (ny == 0)
    return;
  if (n == 0) {
    // Empty sums (a reduced dimension of 0).
    checkCuda(cudaMemsetAsync(yIn.data, 0, yIn.bytes(), ctx.stream), "cudaMemsetAsync", k);
    return;
  }
  std::vector<Scratch> keep;
  TensorView x = overlaps(xIn, yIn) ? copyToScratch(k, ctx.stream, xIn, keep) : xIn;
  TensorView y = yIn;
  F32Staging staging(k, ctx.stream);
  if (x.dtype != y.dtype) {
    x = staging.in(x);
    y = staging.out(y);
  }

  // Collapse x's dimensions into alternating kept / reduced groups (dimensions of 1 dropped).
  std::vector<int64_t> xStride(static_cast<size_t>(rank));
  for (int64_t d = rank - 1, s = 1; d >= 0; --d) {
    xStride[size_t(d)] = s;
    s *= x.shape[size_t(d)];
  }
  std::vector<int64_t> sizes, strides;
  std::vector<bool> reduced;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t size = x.shape[size_t(d)];
    if (size == 1)
      continue;
    bool r = d < lead || y.shape[size_t(d - lead)] == 1;
    if (!sizes.empty() && reduced.back() == r) {
      sizes.back() *= size;
      strides.back() = xStride[size_t(d)];
    } else {
      sizes.push_back(size);
      strides.push_back(xStride[size_t(d)]);
      reduced.push_back(r);
    }
  }
  int64_t terms = n / ny;

  dispatchFloat(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto xp = static_cast<const T *>(x.data);
    auto yp = static_cast<T *>(y.data);
    if (terms == 1) {
      // Nothing is reduced: y is x (as many elements, same order).
      checkCuda(cudaMemcpyAsync(yp, xp, y.bytes(), cudaMemcpyDeviceToDevice, ctx.stream),
                "cudaMemcpyAsync", k);
    } else if (sizes.size() == 1) {
      // Everything: chunks into partials, then one block over the partials.
      int64_t blocks = std::min<int64_t>((n + 8191) / 8192, 4 * multiprocessorCount(k));
      int64_t chunk = (n + blocks - 1) / blocks;
      blocks = (n + chunk - 1) / chunk;
      Scratch partial(k, ctx.stream, size_t(blocks) * sizeof(float));
      rowSums<T, float>(k, ctx.stream, xp, blocks, chunk, n, partial.as<float>());
      rowSums<float, T>(k, ctx.stream, partial.as<float>(), 1, blocks, blocks, yp);
    } else if (sizes.size() == 2 && reduced[0]) {
      // [R, K]: column sums, chunks of rows into partial rows, then the chunks in order.
      int64_t rows = sizes[0], cols = sizes[1];
      int vw = cols % kVec<T> == 0 && aligned16(xp) ? kVec<T> : 1;
      int64_t tiles = (cols + 32 * vw - 1) / (32 * vw);
      // About eight blocks of 256 threads per multiprocessor, each chunk kMinRowsPerChunk rows
      // or more.
      int64_t chunks = std::max<int64_t>(1, int64_t(multiprocessorCount(k)) * 8 / tiles);
      chunks = std::min({chunks, (rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk,
                         int64_t(65535)});
      int64_t rowsPerChunk = (rows + chunks - 1) / chunks;
      chunks = (rows + rowsPerChunk - 1) / rowsPerChunk;
      if (tiles > INT32_MAX)
        fail(k, "x shape " + formatShape(x.shape) + " has too many columns");
      Scratch partial(k, ctx.stream, size_t(chunks * cols) * sizeof(float));
      dim3 grid{unsigned(tiles), unsigned(chunks)}, block{32, kColumnGroups};
      if (vw > 1)
        columnPartialKernel<T, kVec<T>><<<grid, block, 0, ctx.stream>>>(
            xp, rows, cols, rowsPerChunk, partial.as<float>());
      else
        columnPartialKernel<T, 1><<<grid, block, 0, ctx.stream>>>(xp, rows, cols, rowsPerChunk,
                                                                  partial.as<float>());
      checkLaunch(k, "columnPartialKernel");
      sumPartialRows<T>(k, ctx.stream, partial.as<float>(), chunks, cols, yp, cols, yp);
    } else if (sizes.size() == 2) {
      // [K, R]: row sums.
      rowSums<T, T>(k, ctx.stream, xp, sizes[0], sizes[1], n, yp);
    } else {
      Groups g{};
      g.terms = terms;
      for (size_t i = 0; i < sizes.size(); ++i) {
        int &count = reduced[i] ? g.reduced : g.kept;
        if (count == kMaxGroups)
          fail(k, "x shape " + formatShape(x.shape) + " reduced to y shape " +
                      formatShape(y.shape) + " has more than " + std::to_string(kMaxGroups) +
                      " groups of dimensions of one kind");
        (reduced[i] ? g.redSize : g.keptSize)[count] = sizes[i];
        (reduced[i] ? g.redStride : g.keptStride)[count] = strides[i];
        ++count;
      }
      genericReduceKernel<T, T>
          <<<gridFor(k, ny, 256), 256, 0, ctx.stream>>>(xp, ny, g, yp);
      checkLaunch(k, "genericReduceKernel");
    }
  });
  staging.finish();
}

} // namespace bonsai::rt::cuda
