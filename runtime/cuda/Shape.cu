//===- Shape.cu - transpose, slice, slice_grad, copy and zero on CUDA ------===//
//
// Kernels that move elements bit for bit (any dtype). transpose first collapses the
// permutation (dimensions of 1 dropped, runs of dimensions that stay adjacent and in order
// merged), then either gathers whole rows when the innermost dimension stays innermost (16-byte
// units when the rows allow), or moves 32x32 tiles through shared memory so that both the reads
// and the writes are coalesced (2-byte elements: 64x64 tiles moved in pairs when every offset is
// even, as GPT-2's bf16 weights are). slice and slice_grad copy rows of bytes in the widest unit
// (16, 8, 4, 2 or 1 bytes) that every offset and pitch allows; slice_grad writes each element of
// dx once, from dy or as zero. An output that overlaps its input reads from a copy.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <algorithm>
#include <limits>
#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kMaxRank = 8;

/// A collapsed transpose: y's dimensions (sizes), y's strides, and for each y dimension the
/// stride in x of the x dimension it comes from.
struct TransposeGeom {
  int rank;
  int64_t ySize[kMaxRank];
  int64_t yStride[kMaxRank];
  int64_t xStride[kMaxRank];
};

/// Rows of `units` units of U: y row r (over y's dimensions but the last) from x.
template <typename U>
__global__ void gatherRowsKernel(const U *x, U *y, int64_t rows, int64_t units,
                                 TransposeGeom g) {
  const int64_t total = rows * units;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += int64_t(gridDim.x) * blockDim.x) {
    int64_t row = t / units, u = t - row * units;
    int64_t rest = row, src = 0;
#pragma unroll
    for (int i = kMaxRank - 2; i >= 0; --i) {
      if (i < g.rank - 1) {
        int64_t idx = rest % g.ySize[i];
        rest /= g.ySize[i];
        src += idx * g.xStride[i];
      }
    }
    y[t] = x[src * units + u];
  }
}

/// Where tile t of a tiled transpose lies: its index along dimension A (ta) and along B (tb),
/// and the element offsets in x (src) and y (dst) of its batch (the y dimensions other than
/// A, at rank - 1, and B, at qB), for tiles numbered B fastest, then A, then the batch.
struct TileOrigin {
  int64_t ta, tb, src, dst;
};
__device__ __forceinline__ TileOrigin tileOrigin(int64_t t, const TransposeGeom &g, int qB,
                                                 int64_t tilesA, int64_t tilesB) {
  int64_t rest = t / tilesB, batch = rest / tilesA;
  TileOrigin o{rest % tilesA, t % tilesB, 0, 0};
#pragma unroll
  for (int i = kMaxRank - 1; i >= 0; --i) {
    if (i < g.rank - 1 && i != qB) {
      int64_t idx = batch % g.ySize[i];
      batch /= g.ySize[i];
      o.src += idx * g.xStride[i];
      o.dst += idx * g.yStride[i];
    }
  }
  return o;
}

/// 32x32 tiles: dimension A of x (y's innermost, at y position rank - 1) against dimension B
/// (x's innermost, at y position qB); the other y dimensions are the batch.
template <typename U>
__global__ void tileTransposeKernel(const U *x, U *y, TransposeGeom g, int qB, int64_t sizeA,
                                    int64_t sizeB, int64_t strideA, int64_t tilesA,
                                    int64_t tilesB, int64_t tiles) {
  __shared__ U tile[32][33];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    TileOrigin o = tileOrigin(t, g, qB, tilesA, tilesB);
    int64_t a0 = o.ta * 32, b0 = o.tb * 32;
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
      int64_t a = a0 + threadIdx.y + j, b = b0 + threadIdx.x;
      if (a < sizeA && b < sizeB)
        tile[threadIdx.y + j][threadIdx.x] = x[o.src + a * strideA + b];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 32; j += 8) {
      int64_t b = b0 + threadIdx.y + j, a = a0 + threadIdx.x;
      if (a < sizeA && b < sizeB)
        y[o.dst + b * g.yStride[qB] + a] = tile[threadIdx.x][threadIdx.y + j];
    }
    __syncthreads(); // the tile is rewritten by the next iteration
  }
}

/// tileTransposeKernel for 2-byte elements moved in pairs: 64 x 64 tiles, each thread loading
/// and storing 4 bytes (two elements) where the 32 x 32 kernel moves 2; the caller checks that
/// every size, stride and offset is even and both tensors 4-byte aligned. A tile row of 65
/// halves keeps the column reads free of bank conflicts.
__global__ void pairTileTransposeKernel(const uint32_t *x, uint32_t *y, TransposeGeom g, int qB,
                                        int64_t sizeA, int64_t sizeB, int64_t strideA,
                                        int64_t tilesA, int64_t tilesB, int64_t tiles) {
  __shared__ uint16_t tile[64][65];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    TileOrigin o = tileOrigin(t, g, qB, tilesA, tilesB);
    int64_t a0 = o.ta * 64, b0 = o.tb * 64;
#pragma unroll
    for (int j = 0; j < 64; j += 8) {
      int64_t a = a0 + threadIdx.y + j, b = b0 + 2 * threadIdx.x;
      if (a < sizeA && b < sizeB) {
        uint32_t v = x[(o.src + a * strideA + b) / 2];
        tile[threadIdx.y + j][2 * threadIdx.x] = uint16_t(v);
        tile[threadIdx.y + j][2 * threadIdx.x + 1] = uint16_t(v >> 16);
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 64; j += 8) {
      int64_t b = b0 + threadIdx.y + j, a = a0 + 2 * threadIdx.x;
      if (a < sizeA && b < sizeB)
        y[(o.dst + b * g.yStride[qB] + a) / 2] =
            uint32_t(tile[2 * threadIdx.x][threadIdx.y + j]) |
            uint32_t(tile[2 * threadIdx.x + 1][threadIdx.y + j]) << 16;
    }
    __syncthreads(); // the tile is rewritten by the next iteration
  }
}

/// dst row r = src row r (units of U), rows of `width` units at the given pitches (in units),
/// `count` = rows x width units in all. One flat range over every row's units, so that narrow
/// rows (GPT-2's q, k and v slices: 96 units of 16 bytes) still fill whole blocks; Index is
/// 32-bit when every offset fits, which makes the division by the width cheap.
template <typename U, typename Index>
__global__ void copyRowsKernel(const U *src, Index srcPitch, U *dst, Index dstPitch, Index width,
                               Index count) {
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += Index(gridDim.x) * blockDim.x) {
    Index r = i / width, u = i - r * width;
    dst[r * dstPitch + u] = src[r * srcPitch + u];
  }
}

/// dx row r (full units) = zeros with dy row r (len units) at unit `start`; `count` = rows x
/// full units, one flat range as in copyRowsKernel.
template <typename U, typename Index>
__global__ void sliceGradKernel(const U *dy, U *dx, Index start, Index len, Index full,
                                Index count) {
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += Index(gridDim.x) * blockDim.x) {
    Index r = i / full, u = i - r * full;
    U v{};
    if (u >= start && u < start + len)
      v = dy[r * len + u - start];
    dx[i] = v;
  }
}

/// The widest unit (16, 8, 4, 2 or 1 bytes) dividing every value and address given.
int unitBytes(std::initializer_list<uint64_t> values) {
  uint64_t bits = 16;
  for (uint64_t v : values)
    bits |= v;
  return int(bits & (~bits + 1));
}

/// Calls f(U{}) with U the unsigned type of `bytes` bytes.
template <typename F> void dispatchUnit(int bytes, F &&f) {
  switch (bytes) {
  case 16:
    f(uint4{});
    break;
  case 8:
    f(uint64_t{});
    break;
  case 4:
    f(uint32_t{});
    break;
  case 2:
    f(uint16_t{});
    break;
  default:
    f(uint8_t{});
    break;
  }
}

/// Blocks of 256 threads for a flat range of `count` units (grid-stride beyond 2^16 blocks).
unsigned flatGrid(int64_t count) {
  return unsigned(std::min<int64_t>((count + 255) / 256, int64_t(1) << 16));
}

/// Whether every index of a flat range over `count` units, and every offset reached from
/// pitches up to `pitch`, fits the 32-bit index type.
bool fits32(int64_t count, int64_t rows, int64_t pitch) {
  constexpr int64_t limit = std::numeric_limits<int32_t>::max();
  return count + int64_t(flatGrid(count)) * 256 <= limit && rows * pitch <= limit;
}

/// Launches copyRowsKernel over `rows` rows of `width` units of U.
template <typename U>
void copyRows(const Context &ctx, const char *op, const U *src, int64_t srcPitch, U *dst,
              int64_t dstPitch, int64_t width, int64_t rows) {
  int64_t count = width * rows;
  if (fits32(count, rows, std::max(srcPitch, dstPitch)))
    copyRowsKernel<U, int32_t><<<flatGrid(count), 256, 0, ctx.stream>>>(
        src, int32_t(srcPitch), dst, int32_t(dstPitch), int32_t(width), int32_t(count));
  else
    copyRowsKernel<U, int64_t>
        <<<flatGrid(count), 256, 0, ctx.stream>>>(src, srcPitch, dst, dstPitch, width, count);
  checkLaunch(op, "copyRowsKernel");
}

void checkSameDType(const char *kernel, const TensorView &x, const TensorView &y) {
  if (x.dtype != y.dtype)
    fail(kernel, std::string("y dtype ") + dtypeName(y.dtype) + " differs from x dtype " +
                     dtypeName(x.dtype));
}

/// Validates a slice of `len` along `axis` at `start` of a dimension of `full`.
void checkRange(const char *kernel, const char *name, const TensorView &whole, int64_t axis,
                int64_t start, int64_t len) {
  int64_t full = whole.dim(axis);
  if (start < 0 || start > full || len > full - start)
    fail(kernel, "range [" + std::to_string(start) + ", " + std::to_string(start + len) +
                     ") along axis " + std::to_string(axis) + " is outside " + name + " shape " +
                     formatShape(whole.shape));
}

} // namespace

void transpose(const Context &ctx, const TensorView &xIn, const std::vector<int64_t> &perm,
               const TensorView &y) {
  const char *k = "transpose";
  checkView(k, "x", xIn);
  checkView(k, "y", y);
  checkSameDType(k, xIn, y);
  int64_t rank = xIn.rank();
  std::vector<bool> seen(size_t(rank), false);
  bool valid = int64_t(perm.size()) == rank;
  for (size_t i = 0; valid && i < perm.size(); ++i) {
    valid = perm[i] >= 0 && perm[i] < rank && !seen[size_t(perm[i])];
    if (valid)
      seen[size_t(perm[i])] = true;
  }
  if (!valid)
    fail(k, "permutation " + formatShape(perm) +
                " is not a permutation of the dimensions of x shape " + formatShape(xIn.shape));
  std::vector<int64_t> expected(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i)
    expected[size_t(i)] = xIn.shape[size_t(perm[size_t(i)])];
  checkShape(k, "y", y, expected,
             "for x shape " + formatShape(xIn.shape) + " and permutation " + formatShape(perm));
  if (y.numel() == 0)
    return;
  std::vector<Scratch> keep;
  TensorView x = overlaps(xIn, y) ? copyToScratch(k, ctx.stream, xIn, keep) : xIn;
  size_t esize = dtypeSize(x.dtype);

  // Collapse: y's dimensions as groups of x dimensions that stay adjacent and in order.
  std::vector<std::vector<int64_t>> groups; // in y order, each a run of x dimensions
  for (int64_t i = 0; i < rank; ++i) {
    int64_t d = perm[size_t(i)];
    if (x.shape[size_t(d)] == 1)
      continue;
    // The next x dimension after the group's last, skipping dimensions of 1, continues it.
    if (!groups.empty()) {
      int64_t last = groups.back().back(), next = last + 1;
      while (next < rank && x.shape[size_t(next)] == 1)
        ++next;
      if (next == d) {
        groups.back().push_back(d);
        continue;
      }
    }
    groups.push_back({d});
  }
  int r = int(groups.size());
  if (r <= 1) {
    checkCuda(cudaMemcpyAsync(y.data, x.data, y.bytes(), cudaMemcpyDeviceToDevice, ctx.stream),
              "cudaMemcpyAsync", k);
    return;
  }
  if (r > kMaxRank)
    fail(k, "permutation " + formatShape(perm) + " of x shape " + formatShape(x.shape) +
                " has more than " + std::to_string(kMaxRank) + " dimensions after collapsing");
  // The groups in x order, their sizes and x strides.
  std::vector<int> order(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i)
    order[size_t(i)] = i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return groups[size_t(a)][0] < groups[size_t(b)][0]; });
  std::vector<int64_t> size(static_cast<size_t>(r)), xStrideOfGroup(static_cast<size_t>(r));
  std::vector<int> xPos(static_cast<size_t>(r)); // group (y position) -> x position
  for (int i = 0; i < r; ++i) {
    int64_t s = 1;
    for (int64_t d : groups[size_t(i)])
      s *= x.shape[size_t(d)];
    size[size_t(i)] = s;
  }
  for (int j = 0; j < r; ++j)
    xPos[size_t(order[size_t(j)])] = j;
  for (int j = r - 1; j >= 0; --j) {
    int next = j == r - 1 ? -1 : order[size_t(j + 1)];
    xStrideOfGroup[size_t(order[size_t(j)])] =
        next < 0 ? 1 : xStrideOfGroup[size_t(next)] * size[size_t(next)];
  }
  TransposeGeom g{};
  g.rank = r;
  for (int i = r - 1; i >= 0; --i) {
    g.ySize[i] = size[size_t(i)];
    g.yStride[i] = i == r - 1 ? 1 : g.yStride[i + 1] * g.ySize[i + 1];
    g.xStride[i] = xStrideOfGroup[size_t(i)];
  }

  if (xPos[size_t(r - 1)] == r - 1) {
    // The innermost dimension stays: gather rows.
    int64_t inner = g.ySize[r - 1], rows = y.numel() / inner;
    int unit = unitBytes({uint64_t(inner) * esize, reinterpret_cast<uint64_t>(x.data),
                          reinterpret_cast<uint64_t>(y.data)});
    dispatchUnit(unit, [&](auto u) {
      using U = decltype(u);
      int64_t units = inner * int64_t(esize) / int64_t(sizeof(U));
      // x strides count elements; gatherRowsKernel multiplies a row's element offset by the
      // units per row, so express them in rows of `inner` elements.
      TransposeGeom rg = g;
      for (int i = 0; i < r - 1; ++i)
        rg.xStride[i] = g.xStride[i] / inner;
      gatherRowsKernel<U><<<gridFor(k, rows * units, 256), 256, 0, ctx.stream>>>(
          static_cast<const U *>(x.data), static_cast<U *>(y.data), rows, units, rg);
      checkLaunch(k, "gatherRowsKernel");
    });
    return;
  }

  int qB = 0;
  while (xPos[size_t(qB)] != r - 1)
    ++qB;
  int64_t sizeA = g.ySize[r - 1], sizeB = g.ySize[qB], strideA = g.xStride[r - 1];
  if (esize == 2) {
    // Pairs of elements (4 bytes) when every offset the kernel forms is even.
    uint64_t bits = uint64_t(sizeA) | uint64_t(sizeB) | reinterpret_cast<uint64_t>(x.data) / 2 |
                    reinterpret_cast<uint64_t>(y.data) / 2;
    for (int i = 0; i < r; ++i) // all strides but the unit ones of x's and y's innermost
      bits |= (i != qB ? uint64_t(g.xStride[i]) : 0) | (i != r - 1 ? uint64_t(g.yStride[i]) : 0);
    if ((bits & 1) == 0) {
      int64_t tilesA = (sizeA + 63) / 64, tilesB = (sizeB + 63) / 64;
      int64_t tiles = tilesA * tilesB * (y.numel() / (sizeA * sizeB));
      pairTileTransposeKernel<<<unsigned(std::min<int64_t>(tiles, int64_t(1) << 20)), dim3(32, 8),
                                0, ctx.stream>>>(static_cast<const uint32_t *>(x.data),
                                                 static_cast<uint32_t *>(y.data), g, qB, sizeA,
                                                 sizeB, strideA, tilesA, tilesB, tiles);
      checkLaunch(k, "pairTileTransposeKernel");
      return;
    }
  }
  int64_t tilesA = (sizeA + 31) / 32, tilesB = (sizeB + 31) / 32;
  int64_t batch = y.numel() / (sizeA * sizeB), tiles = tilesA * tilesB * batch;
  unsigned grid = unsigned(std::min<int64_t>(tiles, int64_t(1) << 20));
  dispatchUnit(int(esize), [&](auto u) {
    using U = decltype(u);
    tileTransposeKernel<U><<<grid, dim3(32, 8), 0, ctx.stream>>>(
        static_cast<const U *>(x.data), static_cast<U *>(y.data), g, qB, sizeA, sizeB, strideA,
        tilesA, tilesB, tiles);
    checkLaunch(k, "tileTransposeKernel");
  });
}

void slice(const Context &ctx, const TensorView &xIn, int axis, int64_t start,
           const TensorView &y) {
  const char *k = "slice";
  checkView(k, "x", xIn);
  checkView(k, "y", y);
  checkSameDType(k, xIn, y);
  int64_t rank = xIn.rank();
  int64_t a = normalizeAxis(k, axis, rank);
  bool valid = y.rank() == rank;
  for (int64_t i = 0; valid && i < rank; ++i)
    valid = i == a || y.shape[size_t(i)] == xIn.shape[size_t(i)];
  if (!valid)
    fail(k, "y shape " + formatShape(y.shape) + " differs from x shape " +
                formatShape(xIn.shape) + " outside axis " + std::to_string(a));
  int64_t len = y.dim(a), full = xIn.dim(a);
  checkRange(k, "x", xIn, a, start, len);
  if (y.numel() == 0)
    return;
  std::vector<Scratch> keep;
  TensorView x = overlaps(xIn, y) ? copyToScratch(k, ctx.stream, xIn, keep) : xIn;
  int64_t outer = 1, inner = int64_t(dtypeSize(x.dtype));
  for (int64_t i = 0; i < a; ++i)
    outer *= x.shape[size_t(i)];
  for (int64_t i = a + 1; i < rank; ++i)
    inner *= x.shape[size_t(i)];
  const char *src = static_cast<const char *>(x.data) + start * inner;
  int unit = unitBytes({uint64_t(start * inner), uint64_t(len * inner), uint64_t(full * inner),
                        reinterpret_cast<uint64_t>(x.data), reinterpret_cast<uint64_t>(y.data)});
  dispatchUnit(unit, [&](auto u) {
    using U = decltype(u);
    int64_t s = int64_t(sizeof(U));
    copyRows(ctx, k, reinterpret_cast<const U *>(src), full * inner / s,
             static_cast<U *>(y.data), len * inner / s, len * inner / s, outer);
  });
}

void concat(const Context &ctx, const std::vector<TensorView> &xs, int axis,
            const TensorView &y) {
  const char *k = "concat";
  int64_t a = checkConcat(k, xs, axis, y);
  if (y.numel() == 0)
    return;
  int64_t outer = 1, inner = int64_t(dtypeSize(y.dtype));
  for (int64_t i = 0; i < a; ++i)
    outer *= y.shape[size_t(i)];
  for (int64_t i = a + 1; i < y.rank(); ++i)
    inner *= y.shape[size_t(i)];
  int64_t full = y.dim(a), start = 0;
  // One row copy per input, each into its columns of y's rows (an input overlapping y is
  // first copied aside, as slice does).
  for (const TensorView &xIn : xs) {
    int64_t len = xIn.dim(a);
    if (len == 0)
      continue;
    std::vector<Scratch> keep;
    TensorView x = overlaps(xIn, y) ? copyToScratch(k, ctx.stream, xIn, keep) : xIn;
    char *dst = static_cast<char *>(y.data) + start * inner;
    int unit = unitBytes({uint64_t(start * inner), uint64_t(len * inner), uint64_t(full * inner),
                          reinterpret_cast<uint64_t>(x.data), reinterpret_cast<uint64_t>(y.data)});
    dispatchUnit(unit, [&](auto u) {
      using U = decltype(u);
      int64_t s = int64_t(sizeof(U));
      copyRows(ctx, k, static_cast<const U *>(x.data), len * inner / s,
               reinterpret_cast<U *>(dst), full * inner / s, len * inner / s, outer);
    });
    start += len;
  }
}

void sliceGrad(const Context &ctx, const TensorView &dyIn, int axis, int64_t start,
               const TensorView &dx) {
  const char *k = "slice_grad";
  checkView(k, "dy", dyIn);
  checkView(k, "dx", dx);
  if (dyIn.dtype != dx.dtype)
    fail(k, std::string("dx dtype ") + dtypeName(dx.dtype) + " differs from dy dtype " +
                dtypeName(dyIn.dtype));
  int64_t rank = dx.rank();
  int64_t a = normalizeAxis(k, axis, rank);
  bool valid = dyIn.rank() == rank;
  for (int64_t i = 0; valid && i < rank; ++i)
    valid = i == a || dyIn.shape[size_t(i)] == dx.shape[size_t(i)];
  if (!valid)
    fail(k, "dy shape " + formatShape(dyIn.shape) + " differs from dx shape " +
                formatShape(dx.shape) + " outside axis " + std::to_string(a));
  int64_t len = dyIn.dim(a), full = dx.dim(a);
  checkRange(k, "dx", dx, a, start, len);
  if (dx.numel() == 0)
    return;
  std::vector<Scratch> keep;
  TensorView dy = overlaps(dyIn, dx) ? copyToScratch(k, ctx.stream, dyIn, keep) : dyIn;
  int64_t outer = 1, inner = int64_t(dtypeSize(dx.dtype));
  for (int64_t i = 0; i < a; ++i)
    outer *= dx.shape[size_t(i)];
  for (int64_t i = a + 1; i < rank; ++i)
    inner *= dx.shape[size_t(i)];
  int unit = unitBytes({uint64_t(start * inner), uint64_t(len * inner), uint64_t(full * inner),
                        reinterpret_cast<uint64_t>(dy.data), reinterpret_cast<uint64_t>(dx.data)});
  dispatchUnit(unit, [&](auto u) {
    using U = decltype(u);
    int64_t s = int64_t(sizeof(U));
    int64_t count = full * inner / s * outer;
    const U *src = static_cast<const U *>(dy.data);
    U *dst = static_cast<U *>(dx.data);
    if (fits32(count, outer, full * inner / s))
      sliceGradKernel<U, int32_t><<<flatGrid(count), 256, 0, ctx.stream>>>(
          src, dst, int32_t(start * inner / s), int32_t(len * inner / s),
          int32_t(full * inner / s), int32_t(count));
    else
      sliceGradKernel<U, int64_t><<<flatGrid(count), 256, 0, ctx.stream>>>(
          src, dst, start * inner / s, len * inner / s, full * inner / s, count);
    checkLaunch(k, "sliceGradKernel");
  });
}

void copy(const Context &ctx, const TensorView &x, const TensorView &y) {
  const char *k = "copy";
  checkView(k, "x", x);
  checkView(k, "y", y);
  if (x.bytes() != y.bytes())
    fail(k, std::string("y (") + dtypeName(y.dtype) + " " + formatShape(y.shape) + ", " +
                std::to_string(y.bytes()) + " bytes) and x (" + dtypeName(x.dtype) + " " +
                formatShape(x.shape) + ", " + std::to_string(x.bytes()) + " bytes) differ in size");
  if (!x.bytes() || x.data == y.data)
    return;
  std::vector<Scratch> keep;
  // cudaMemcpyAsync has memcpy's contract; overlapping ranges (memmove) go through a copy.
  TensorView src = overlaps(x, y) ? copyToScratch(k, ctx.stream, x, keep) : x;
  checkCuda(cudaMemcpyAsync(y.data, src.data, x.bytes(), cudaMemcpyDeviceToDevice, ctx.stream),
            "cudaMemcpyAsync", k);
}

void zero(const Context &ctx, const TensorView &x) {
  checkView("zero", "x", x);
  // All-zero bytes are 0 in every dtype.
  if (x.bytes())
    checkCuda(cudaMemsetAsync(x.data, 0, x.bytes(), ctx.stream), "cudaMemsetAsync", "zero");
}

} // namespace bonsai::rt::cuda
