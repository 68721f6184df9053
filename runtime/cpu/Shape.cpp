//===- Shape.cpp - embedding, transpose, slice, cast and copy on the CPU --===//
//
// Kernels that move elements rather than compute with them. embedding, transpose and slice copy
// elements bit for bit (of any dtype; embedding converts only when the output's dtype differs from
// the table's), cast converts between f32, f16 and bf16 rounding to nearest even, copy moves
// bytes. An output that overlaps its input reads from a private copy of the input.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// `x` itself, or when it overlaps `y`, a view of a copy of it held by `keep`.
TensorView unaliased(const TensorView &x, const TensorView &y, std::vector<char> &keep) {
  if (!overlaps(x, y))
    return x;
  keep.assign(static_cast<const char *>(x.data), static_cast<const char *>(x.data) + x.bytes());
  TensorView copy = x;
  copy.data = keep.data();
  return copy;
}

void checkSameDType(const char *kernel, const TensorView &x, const TensorView &y) {
  if (x.dtype != y.dtype)
    fail(kernel, std::string("y dtype ") + dtypeName(y.dtype) + " differs from x dtype " +
                     dtypeName(x.dtype));
}

/// Copies `count` elements of `Size` bytes from src (every `stride` elements) to dst (dense).
template <size_t Size> void gather(const char *src, int64_t stride, char *dst, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    std::memcpy(dst + i * int64_t(Size), src + i * stride * int64_t(Size), Size);
}

} // namespace

void embedding(const TensorView &table, const TensorView &ids, const TensorView &out) {
  const char *k = "embedding";
  checkFloat(k, "table", table);
  checkIndex(k, "ids", ids);
  checkFloat(k, "out", out);
  if (table.rank() != 2)
    fail(k, "table shape " + formatShape(table.shape) + " is not [vocab, hidden]");
  int64_t vocab = table.dim(0), hidden = table.dim(1), n = ids.numel();
  std::vector<int64_t> expected = ids.shape;
  expected.push_back(hidden);
  checkShape(k, "out", out, expected,
             "for ids shape " + formatShape(ids.shape) + " and table shape " +
                 formatShape(table.shape));
  // Every id is checked before any row is written, so a bad batch leaves `out` untouched.
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t id = loadIndex(ids, i);
    if (id < 0 || id >= vocab)
      fail(k, "id " + std::to_string(id) + " at ids" + formatIndex(i, ids.shape) +
                  " is outside [0, " + std::to_string(vocab) + ")");
    rows[size_t(i)] = id;
  }
  if (hidden == 0)
    return;
  std::vector<float> row(static_cast<size_t>(hidden));
  size_t rowBytes = size_t(hidden) * dtypeSize(table.dtype);
  for (int64_t i = 0; i < n; ++i) {
    TensorView src = subView(table, rows[size_t(i)] * hidden, hidden);
    TensorView dst = subView(out, i * hidden, hidden);
    if (table.dtype == out.dtype) {
      std::memcpy(dst.data, src.data, rowBytes);
    } else {
      loadF32(src, row.data());
      storeF32(row.data(), dst);
    }
  }
}

void transpose(const TensorView &xIn, const std::vector<int64_t> &perm, const TensorView &y) {
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
  std::vector<char> keep;
  TensorView x = unaliased(xIn, y, keep);
  size_t size = dtypeSize(x.dtype);
  if (rank == 0) {
    std::memcpy(y.data, x.data, size);
    return;
  }

  // srcStride[i]: the step in x (in elements) for a step along dimension i of y.
  std::vector<int64_t> xStride(static_cast<size_t>(rank)), srcStride(static_cast<size_t>(rank));
  for (int64_t i = rank - 1, s = 1; i >= 0; --i) {
    xStride[size_t(i)] = s;
    s *= x.shape[size_t(i)];
  }
  for (int64_t i = 0; i < rank; ++i)
    srcStride[size_t(i)] = xStride[size_t(perm[size_t(i)])];

  // Walk y row by row (its last dimension), the outer dimensions like an odometer.
  int64_t inner = y.dim(-1), innerStride = srcStride[size_t(rank - 1)];
  int64_t rows = y.numel() / inner;
  std::vector<int64_t> index(size_t(rank - 1), 0);
  int64_t src = 0;
  const char *xp = static_cast<const char *>(x.data);
  char *yp = static_cast<char *>(y.data);
  for (int64_t r = 0; r < rows; ++r) {
    const char *from = xp + src * int64_t(size);
    char *to = yp + r * inner * int64_t(size);
    switch (size) {
    case 1:
      gather<1>(from, innerStride, to, inner);
      break;
    case 2:
      gather<2>(from, innerStride, to, inner);
      break;
    case 4:
      gather<4>(from, innerStride, to, inner);
      break;
    default:
      gather<8>(from, innerStride, to, inner);
      break;
    }
    for (int64_t d = rank - 2; d >= 0; --d) {
      src += srcStride[size_t(d)];
      if (++index[size_t(d)] < y.shape[size_t(d)])
        break;
      src -= index[size_t(d)] * srcStride[size_t(d)];
      index[size_t(d)] = 0;
    }
  }
}

void slice(const TensorView &xIn, int axis, int64_t start, const TensorView &y) {
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
    fail(k, "y shape " + formatShape(y.shape) + " differs from x shape " + formatShape(xIn.shape) +
                " outside axis " + std::to_string(a));
  int64_t len = y.dim(a), full = xIn.dim(a);
  if (start < 0 || start > full || len > full - start)
    fail(k, "range [" + std::to_string(start) + ", " + std::to_string(start + len) +
                ") along axis " + std::to_string(a) + " is outside x shape " +
                formatShape(xIn.shape));
  if (y.numel() == 0)
    return;
  std::vector<char> keep;
  TensorView x = unaliased(xIn, y, keep);
  int64_t outer = 1, inner = int64_t(dtypeSize(x.dtype));
  for (int64_t i = 0; i < a; ++i)
    outer *= x.shape[size_t(i)];
  for (int64_t i = a + 1; i < rank; ++i)
    inner *= x.shape[size_t(i)];
  const char *xp = static_cast<const char *>(x.data);
  char *yp = static_cast<char *>(y.data);
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(yp + o * len * inner, xp + (o * full + start) * inner, size_t(len * inner));
}

void concat(const std::vector<TensorView> &xs, int axis, const TensorView &y) {
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
  char *yp = static_cast<char *>(y.data);
  for (const TensorView &xIn : xs) {
    std::vector<char> keep;
    TensorView x = unaliased(xIn, y, keep);
    int64_t len = x.dim(a);
    const char *xp = static_cast<const char *>(x.data);
    for (int64_t o = 0; o < outer && len > 0; ++o)
      std::memcpy(yp + (o * full + start) * inner, xp + o * len * inner, size_t(len * inner));
    start += len;
  }
}

void cast(const TensorView &x, const TensorView &y) {
  const char *k = "cast";
  checkFloat(k, "x", x);
  checkFloat(k, "y", y);
  checkSameShape(k, "y", y, "x", x);
  if (x.dtype == y.dtype) {
    if (x.bytes())
      std::memmove(y.data, x.data, x.bytes());
    return;
  }
  // Through fp32, which holds every f16 and bf16 value exactly: one rounding, into y's dtype.
  constexpr int64_t chunk = 16384;
  int64_t n = x.numel(), chunks = (n + chunk - 1) / chunk;
  std::vector<char> keep;
  TensorView src = unaliased(x, y, keep);
  parallelFor(chunks, 4, [&](int64_t c0, int64_t c1) {
    std::vector<float> v(static_cast<size_t>(chunk));
    for (int64_t c = c0; c < c1; ++c) {
      int64_t offset = c * chunk, count = std::min(chunk, n - offset);
      loadF32(subView(src, offset, count), v.data());
      storeF32(v.data(), subView(y, offset, count));
    }
  });
}

void copy(const TensorView &x, const TensorView &y) {
  const char *k = "copy";
  checkView(k, "x", x);
  checkView(k, "y", y);
  if (x.bytes() != y.bytes())
    fail(k, std::string("y (") + dtypeName(y.dtype) + " " + formatShape(y.shape) + ", " +
                std::to_string(y.bytes()) + " bytes) and x (" + dtypeName(x.dtype) + " " +
                formatShape(x.shape) + ", " + std::to_string(x.bytes()) + " bytes) differ in size");
  if (x.bytes())
    std::memmove(y.data, x.data, x.bytes());
}

} // namespace bonsai::rt::cpu
