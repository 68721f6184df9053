//===- Embedding.cu - embedding and embedding_grad on CUDA -----------------===//
//
// embedding gathers table rows, one warp per position, as 16-byte copies when the row allows
// (bit-exact for equal dtypes, converted once otherwise). An id outside [0, vocab) is recorded
// in ctx.deviceError (kIdOutOfRange) and its output row is left unwritten: nothing is read out
// of bounds, and the executor fails the step.
//
// embedding_grad is deterministic without float atomics: the (id, position) pairs are sorted
// by id with CUB's radix sort, which is stable, so each id's positions stay in position order;
// then one block per vocabulary row finds its run of positions by binary search and sums their
// dy rows in that order (the CPU kernel's order), writing the whole row (zeros for ids that
// never occur). A hot id costs its block proportionally more, but no two blocks ever write the
// same row. Bad ids are recorded and sorted past the last row, so they contribute nothing.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <limits>
#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

/// Copies units of U (bytes moved verbatim) of each position's table row; warp per position.
template <typename U>
__global__ void embeddingCopyKernel(const U *table, const void *ids, bool wide, int64_t n,
                                    int64_t vocab, int64_t units, U *out, DeviceError *error,
                                    int32_t kernelIndex) {
  int64_t p = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (p >= n)
    return;
  int64_t id = loadIndexAt(ids, wide, p);
  if (id < 0 || id >= vocab) {
    if (threadIdx.x == 0)
      recordError(error, kernelIndex, kIdOutOfRange, p, id);
    return;
  }
  const U *src = table + id * units;
  U *dst = out + p * units;
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x)
    dst[u] = src[u];
}

/// As embeddingCopyKernel, converting each element from TT to TO.
template <typename TT, typename TO>
__global__ void embeddingConvertKernel(const TT *table, const void *ids, bool wide, int64_t n,
                                       int64_t vocab, int64_t hidden, TO *out,
                                       DeviceError *error, int32_t kernelIndex) {
  int64_t p = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (p >= n)
    return;
  int64_t id = loadIndexAt(ids, wide, p);
  if (id < 0 || id >= vocab) {
    if (threadIdx.x == 0)
      recordError(error, kernelIndex, kIdOutOfRange, p, id);
    return;
  }
  for (int64_t e = threadIdx.x; e < hidden; e += blockDim.x)
    out[p * hidden + e] = fromFloat<TO>(toFloat(table[id * hidden + e]));
}

/// keys[p] = ids[p] (vocab for a bad id, recorded), values[p] = p.
__global__ void sortKeysKernel(const void *ids, bool wide, int64_t n, int64_t vocab,
                               uint32_t *keys, int32_t *values, DeviceError *error,
                               int32_t kernelIndex) {
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    int64_t id = loadIndexAt(ids, wide, p);
    if (id < 0 || id >= vocab) {
      recordError(error, kernelIndex, kIdOutOfRange, p, id);
      id = vocab;
    }
    keys[p] = uint32_t(id);
    values[p] = int32_t(p);
  }
}

/// The first index in sorted keys[0, n) whose key is not below `key`.
__device__ __forceinline__ int64_t lowerBound(const uint32_t *keys, int64_t n, int64_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    if (int64_t(keys[mid]) < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/// dtable[row, :] = sum, in position order, of dy[p, :] over the positions p with ids[p] = row.
template <typename T, int VW>
__global__ void embeddingGradRowKernel(const T *dy, const uint32_t *keys, const int32_t *positions,
                                       int64_t n, int64_t vocab, int64_t hidden, T *dtable) {
  for (int64_t row = blockIdx.x; row < vocab; row += gridDim.x) {
    const int64_t begin = lowerBound(keys, n, row), end = lowerBound(keys, n, row + 1);
    T *out = dtable + row * hidden;
    for (int64_t c = int64_t(threadIdx.x) * VW; c < hidden; c += int64_t(blockDim.x) * VW) {
      float acc[VW] = {};
      for (int64_t i = begin; i < end; ++i) {
        float v[VW];
        loadF<VW>(dy + int64_t(positions[i]) * hidden + c, v);
#pragma unroll
        for (int e = 0; e < VW; ++e)
          acc[e] += v[e];
      }
      storeF<VW>(out + c, acc);
    }
  }
}

/// Checks the operands of embedding and embedding_grad; returns (vocab, hidden).
std::pair<int64_t, int64_t> checkEmbedding(const char *kernel, const char *tableName,
                                           const TensorView &table, const char *rowsName,
                                           const TensorView &rowsT, const TensorView &ids) {
  checkFloat(kernel, tableName, table);
  checkIndex(kernel, "ids", ids);
  checkFloat(kernel, rowsName, rowsT);
  if (table.rank() != 2)
    fail(kernel, std::string(tableName) + " shape " + formatShape(table.shape) +
                     " is not [vocab, hidden]");
  int64_t vocab = table.dim(0), hidden = table.dim(1);
  std::vector<int64_t> expected = ids.shape;
  expected.push_back(hidden);
  checkShape(kernel, rowsName, rowsT, expected,
             "for ids shape " + formatShape(ids.shape) + " and " + tableName + " shape " +
                 formatShape(table.shape));
  return {vocab, hidden};
}

} // namespace

void embedding(const Context &ctx, const TensorView &tableIn, const TensorView &idsIn,
               const TensorView &out) {
  const char *k = "embedding";
  const auto shape = checkEmbedding(k, "table", tableIn, "out", out, idsIn);
  const int64_t vocab = shape.first, hidden = shape.second;
  int64_t n = idsIn.numel();
  if (n == 0)
    return;
  std::vector<Scratch> keep;
  TensorView table = overlaps(tableIn, out) ? copyToScratch(k, ctx.stream, tableIn, keep) : tableIn;
  TensorView ids = overlaps(idsIn, out) ? copyToScratch(k, ctx.stream, idsIn, keep) : idsIn;
  bool wide = ids.dtype == DType::I64;
  dim3 block(32, 8);
  unsigned grid = unsigned((n + 7) / 8);
  if (table.dtype == out.dtype) {
    // Verbatim bytes, as the CPU kernel's memcpy: 16-byte units when every row allows.
    size_t rowBytes = size_t(hidden) * dtypeSize(table.dtype);
    auto launch = [&](auto unit) {
      using U = decltype(unit);
      int64_t units = int64_t(rowBytes / sizeof(U));
      embeddingCopyKernel<U><<<grid, block, 0, ctx.stream>>>(
          static_cast<const U *>(table.data), ids.data, wide, n, vocab, units,
          static_cast<U *>(out.data), ctx.deviceError, ctx.kernelIndex);
    };
    if (rowBytes % 16 == 0 && aligned16(table.data) && aligned16(out.data))
      launch(uint4{});
    else if (dtypeSize(table.dtype) == 4)
      launch(uint32_t{});
    else
      launch(uint16_t{});
    checkLaunch(k, "embeddingCopyKernel");
    return;
  }
  dispatchFloat(table.dtype, [&](auto tTag) {
    dispatchFloat(out.dtype, [&](auto oTag) {
      using TT = decltype(tTag);
      using TO = decltype(oTag);
      embeddingConvertKernel<TT, TO><<<grid, block, 0, ctx.stream>>>(
          static_cast<const TT *>(table.data), ids.data, wide, n, vocab, hidden,
          static_cast<TO *>(out.data), ctx.deviceError, ctx.kernelIndex);
      checkLaunch(k, "embeddingConvertKernel");
    });
  });
}

void embeddingGrad(const Context &ctx, const TensorView &dyIn, const TensorView &idsIn,
                   const TensorView &dtable) {
  const char *k = "embedding_grad";
  const auto shape = checkEmbedding(k, "dtable", dtable, "dy", dyIn, idsIn);
  const int64_t vocab = shape.first, hidden = shape.second;
  int64_t n = idsIn.numel();
  if (n > int64_t(std::numeric_limits<int32_t>::max()) ||
      vocab >= int64_t(std::numeric_limits<int32_t>::max()))
    fail(k, std::to_string(n) + " positions over a vocabulary of " + std::to_string(vocab) +
                " exceed the 32-bit keys and positions of the sort");
  std::vector<Scratch> keep;
  TensorView ids = overlaps(idsIn, dtable) ? copyToScratch(k, ctx.stream, idsIn, keep) : idsIn;
  TensorView dy = overlaps(dyIn, dtable) ? copyToScratch(k, ctx.stream, dyIn, keep) : dyIn;
  bool wide = ids.dtype == DType::I64;

  // Sort (id, position) pairs by id; n may be 0, in which case every row is zero.
  Scratch keysIn(k, ctx.stream, size_t(n) * 4), keysOut(k, ctx.stream, size_t(n) * 4);
  Scratch valuesIn(k, ctx.stream, size_t(n) * 4), valuesOut(k, ctx.stream, size_t(n) * 4);
  if (n > 0) {
    sortKeysKernel<<<gridFor(k, n, 256), 256, 0, ctx.stream>>>(
        ids.data, wide, n, vocab, keysIn.as<uint32_t>(), valuesIn.as<int32_t>(), ctx.deviceError,
        ctx.kernelIndex);
    checkLaunch(k, "sortKeysKernel");
    int endBit = 1;
    while (endBit < 31 && (int64_t(1) << endBit) <= vocab)
      ++endBit;
    size_t tempBytes = 0;
    checkCuda(cub::DeviceRadixSort::SortPairs(nullptr, tempBytes, keysIn.as<uint32_t>(),
                                              keysOut.as<uint32_t>(), valuesIn.as<int32_t>(),
                                              valuesOut.as<int32_t>(), n, 0, endBit, ctx.stream),
              "cub::DeviceRadixSort::SortPairs(size query)", k);
    Scratch temp(k, ctx.stream, tempBytes);
    checkCuda(cub::DeviceRadixSort::SortPairs(temp.get(), tempBytes, keysIn.as<uint32_t>(),
                                              keysOut.as<uint32_t>(), valuesIn.as<int32_t>(),
                                              valuesOut.as<int32_t>(), n, 0, endBit, ctx.stream),
              "cub::DeviceRadixSort::SortPairs", k);
  }
  if (vocab == 0 || hidden == 0)
    return;

  F32Staging staging(k, ctx.stream);
  TensorView g = dy, out = dtable;
  if (g.dtype != out.dtype) {
    g = staging.in(g);
    out = staging.out(out);
  }
  dispatchFloat(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int VW = kVec<T>;
    bool vector = hidden % VW == 0 && aligned16(g.data) && aligned16(out.data);
    int threads = threadsPerRow(hidden, vector ? VW : 1);
    unsigned grid = unsigned(std::min<int64_t>(vocab, int64_t(1) << 30));
    auto gp = static_cast<const T *>(g.data);
    auto op = static_cast<T *>(out.data);
    if (vector)
      embeddingGradRowKernel<T, VW><<<grid, threads, 0, ctx.stream>>>(
          gp, keysOut.as<uint32_t>(), valuesOut.as<int32_t>(), n, vocab, hidden, op);
    else
      embeddingGradRowKernel<T, 1><<<grid, threads, 0, ctx.stream>>>(
          gp, keysOut.as<uint32_t>(), valuesOut.as<int32_t>(), n, vocab, hidden, op);
    checkLaunch(k, "embeddingGradRowKernel");
  });
  staging.finish();
}

} // namespace bonsai::rt::cuda
