//===- Backward.cpp - Gradients of the GEMM, gather and elementwise kernels ===//
//
// The backward kernels that are not normalisations or attention: fill, embedding_grad,
// linear_grad_input and linear_grad_weight (OpenBLAS sgemm, fp32 accumulation as the forward
// linear), reduce_to (the adjoint of add/mul's rhs broadcast), slice_grad and the gradients of
// silu, gelu and swiglu. Every sum that is not a GEMM is accumulated in fp64 by one thread in a
// fixed order (embedding_grad: position order; reduce_to: the reduced index order), so results do
// not depend on the number of threads. Every kernel overwrites its outputs.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// Elements per chunk of the elementwise kernels, as in Elementwise.cpp.
constexpr int64_t kChunk = 16384;
/// Chunks per thread below which threading costs more than it saves.
constexpr int64_t kChunkGrain = 4;
/// Elements per thread below which threading costs more than it saves.
constexpr int64_t kElementGrain = 32768;

/// Runs fn(offset, count) over `n` elements in fixed chunks, on several threads.
template <typename F> void forChunks(int64_t n, F fn) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
  parallelFor(chunks, kChunkGrain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t offset = c * kChunk;
      fn(offset, std::min(kChunk, n - offset));
    }
  });
}

/// `x` itself, or when it overlaps `y`, a view of a copy of it held by `keep`.
TensorView unaliased(const TensorView &x, const TensorView &y, std::vector<char> &keep) {
  if (!overlaps(x, y))
    return x;
  keep.assign(static_cast<const char *>(x.data), static_cast<const char *>(x.data) + x.bytes());
  TensorView copy = x;
  copy.data = keep.data();
  return copy;
}

/// Runs an elementwise gradient dx = f(dy, x) over same-shaped tensors in chunks; a chunk of
/// every input is loaded before the chunk of dx is stored, so dx may alias dy or x.
template <typename F>
void unaryGrad(const char *kernel, const TensorView &dy, const TensorView &x, const TensorView &dx,
               F f) {
  checkFloat(kernel, "dy", dy);
  checkFloat(kernel, "x", x);
  checkFloat(kernel, "dx", dx);
  checkSameShape(kernel, "x", x, "dy", dy);
  checkSameShape(kernel, "dx", dx, "dy", dy);
  forChunks(dy.numel(), [&](int64_t offset, int64_t count) {
    std::vector<float> g(static_cast<size_t>(count)), v(static_cast<size_t>(count));
    loadF32(subView(dy, offset, count), g.data());
    loadF32(subView(x, offset, count), v.data());
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = float(double(g[i]) * f(double(v[i])));
    storeF32(g.data(), subView(dx, offset, count));
  });
}

/// How reduce_to walks x: x's strides, and the dimensions summed over (outermost first).
struct Reduction {
  std::vector<int64_t> xStride, dims, strides;
  int64_t terms = 1; // the product of dims: the terms of each sum
};

/// y[j] for j in [j0, j1), each the fp64 sum of its terms in row-major order of the summed
/// dimensions. The whole range walks the summed index space together, so the usual [..., D] ->
/// [D] reads x contiguously; each element's order does not depend on the range it is in.
void reduceRange(const float *xp, const std::vector<int64_t> &yShape, int64_t lead,
                 const Reduction &r, int64_t j0, int64_t j1, float *yp) {
  size_t count = size_t(j1 - j0);
  std::vector<int64_t> base(count);
  for (int64_t j = j0; j < j1; ++j) {
    // y's multi-index addresses x directly: y's dimensions of 1 have index 0.
    int64_t flat = j, offset = 0;
    for (size_t d = yShape.size(); d-- > 0;) {
      offset += (flat % yShape[d]) * r.xStride[size_t(lead) + d];
      flat /= yShape[d];
    }
    base[size_t(j - j0)] = offset;
  }
  std::vector<double> acc(count, 0.0);
  std::vector<int64_t> index(r.dims.size(), 0);
  int64_t offset = 0;
  for (int64_t t = 0; t < r.terms; ++t) {
    for (size_t i = 0; i < count; ++i)
      acc[i] += double(xp[base[i] + offset]);
    // The next index of the summed dimensions, like an odometer.
    for (size_t d = r.dims.size(); d-- > 0;) {
      offset += r.strides[d];
      if (++index[d] < r.dims[d])
        break;
      offset -= index[d] * r.strides[d];
      index[d] = 0;
    }
  }
  for (size_t i = 0; i < count; ++i)
    yp[j0 + int64_t(i)] = float(acc[i]);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// d/dx x sigmoid(x) = s (1 + x (1 - s)).
double siluDerivative(double x) {
  double s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}

} // namespace

void fill(double value, const TensorView &y) {
  const char *k = "fill";
  checkFloat(k, "y", y);
  int64_t n = y.numel();
  if (n == 0)
    return;
  // One rounding of `value` into y's dtype, as every kernel stores.
  std::vector<float> chunk(static_cast<size_t>(std::min(n, kChunk)), float(value));
  forChunks(
      n, [&](int64_t offset, int64_t count) { storeF32(chunk.data(), subView(y, offset, count)); });
}

void embeddingGrad(const TensorView &dy, const TensorView &ids, const TensorView &dtable) {
  const char *k = "embedding_grad";
  checkFloat(k, "dy", dy);
  checkIndex(k, "ids", ids);
  checkFloat(k, "dtable", dtable);
  if (dtable.rank() != 2)
    fail(k, "dtable shape " + formatShape(dtable.shape) + " is not [vocab, hidden]");
  int64_t vocab = dtable.dim(0), hidden = dtable.dim(1), n = ids.numel();
  std::vector<int64_t> expected = ids.shape;
  expected.push_back(hidden);
  checkShape(k, "dy", dy, expected,
             "for ids shape " + formatShape(ids.shape) + " and dtable shape " +
                 formatShape(dtable.shape));
  // Every id is checked before dtable is written, so a bad batch leaves it untouched.
  std::vector<int64_t> rowStart(static_cast<size_t>(vocab + 1), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t id = loadIndex(ids, i);
    if (id < 0 || id >= vocab)
      fail(k, "id " + std::to_string(id) + " at ids" + formatIndex(i, ids.shape) +
                  " is outside [0, " + std::to_string(vocab) + ")");
    ++rowStart[size_t(id + 1)];
  }
  if (hidden == 0)
    return;
  // A stable counting sort: the positions of every id, in position order. Each row of dtable
  // then sums its own positions on one thread, so no two threads add into the same row.
  for (int64_t r = 0; r < vocab; ++r)
    rowStart[size_t(r + 1)] += rowStart[size_t(r)];
  std::vector<int64_t> positions(static_cast<size_t>(n)),
      next(rowStart.begin(), rowStart.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    positions[size_t(next[size_t(loadIndex(ids, i))]++)] = i;

  std::vector<char> keep;
  TensorView grad = unaliased(dy, dtable, keep);
  std::vector<float> dys;
  const float *dyp = loadFloats(grad, dys);
  parallelFor(vocab, std::max<int64_t>(1, kElementGrain / hidden), [&](int64_t r0, int64_t r1) {
    std::vector<double> acc(static_cast<size_t>(hidden));
    std::vector<float> row(static_cast<size_t>(hidden));
    for (int64_t r = r0; r < r1; ++r) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t p = rowStart[size_t(r)]; p < rowStart[size_t(r + 1)]; ++p) {
        const float *src = dyp + positions[size_t(p)] * hidden;
        for (int64_t e = 0; e < hidden; ++e)
          acc[size_t(e)] += double(src[e]);
      }
      for (int64_t e = 0; e < hidden; ++e)
        row[size_t(e)] = float(acc[size_t(e)]);
      storeF32(row.data(), subView(dtable, r * hidden, hidden));
    }
  });
}

void linearGradInput(const TensorView &dy, const TensorView &w, const TensorView &dx) {
  const char *k = "linear_grad_input";
  auto [rows, out, in] = checkLinearGradInput(k, dy, w, dx);

  std::vector<float> dys, ws, dxs;
  const float *dyp = loadFloats(dy, dys);
  const float *wp = loadFloats(w, ws);
  float *dxp = resultBuffer(dx, {&dy, &w}, dxs);
  // dx [rows, in] = dy [rows, out] w [out, in].
  gemm(k, /*transA=*/false, /*transB=*/false, rows, in, out, 1.0f, dyp, wp, 0.0f, dxp);
  if (dxp != dx.data)
    storeF32(dxp, dx);
}

void linearGradWeight(const TensorView &dy, const TensorView &x, const TensorView &dw) {
  const char *k = "linear_grad_weight";
  auto [rows, out, in] = checkLinearGradWeight(k, dy, x, dw);

  std::vector<float> dys, xs, dws;
  const float *dyp = loadFloats(dy, dys);
  const float *xp = loadFloats(x, xs);
  float *dwp = resultBuffer(dw, {&dy, &x}, dws);
  // dw [out, in] = dyᵀ [out, rows] x [rows, in] in an order that does not depend on the
  // machine or on which operand comes first (weightGradient).
  weightGradient(dyp, xp, rows, out, in, /*accumulate=*/false, dwp);
  if (dwp != dw.data)
    storeF32(dwp, dw);
}

void reduceTo(const TensorView &x, const TensorView &y) {
  const char *k = "reduce_to";
  checkFloat(k, "x", x);
  checkFloat(k, "y", y);
  int64_t rank = x.rank(), lead = rank - y.rank();
  bool broadcastable = lead >= 0;
  for (int64_t d = 0; broadcastable && d < y.rank(); ++d) {
    int64_t yd = y.shape[size_t(d)], xd = x.shape[size_t(lead + d)];
    broadcastable = yd == xd || yd == 1;
  }
  if (!broadcastable)
    fail(k, "y shape " + formatShape(y.shape) +
                " does not broadcast over the trailing dimensions of x shape " +
                formatShape(x.shape));
  int64_t ny = y.numel();
  if (ny == 0)
    return;

  Reduction plan;
  plan.xStride.resize(size_t(rank));
  for (int64_t d = rank - 1, s = 1; d >= 0; --d) {
    plan.xStride[size_t(d)] = s;
    s *= x.shape[size_t(d)];
  }
  // The dimensions summed over: x's leading ones, and those where y has 1 and x does not.
  for (int64_t d = 0; d < rank; ++d) {
    if (d >= lead && y.shape[size_t(d - lead)] == x.shape[size_t(d)])
      continue;
    plan.dims.push_back(x.shape[size_t(d)]);
    plan.strides.push_back(plan.xStride[size_t(d)]);
    plan.terms *= x.shape[size_t(d)];
  }

  std::vector<float> xs, ys;
  const float *xp = loadFloats(x, xs);
  float *yp = resultBuffer(y, {&x}, ys);
  parallelFor(ny, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, plan.terms)),
              [&](int64_t j0, int64_t j1) { reduceRange(xp, y.shape, lead, plan, j0, j1, yp); });
  if (yp != y.data)
    storeF32(yp, y);
}

void siluGrad(const TensorView &dy, const TensorView &x, const TensorView &dx) {
  unaryGrad("silu_grad", dy, x, dx, siluDerivative);
}

void geluGrad(const TensorView &dy, const TensorView &x, bool tanh, const TensorView &dx) {
  const double invSqrt2Pi = 1.0 / std::sqrt(2.0 * 3.14159265358979323846);
  if (tanh) {
    // d/dx 0.5 x (1 + tanh(u)), u = c (x + a x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2).
    const double c = std::sqrt(2.0 / 3.14159265358979323846), a = 0.044715;
    unaryGrad("gelu_grad", dy, x, dx, [c, a](double v) {
      double t = std::tanh(c * (v + a * v * v * v));
      return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * a * v * v);
    });
  } else {
    // d/dx x Phi(x) = Phi(x) + x phi(x).
    unaryGrad("gelu_grad", dy, x, dx, [invSqrt2Pi](double v) {
      return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) * invSqrt2Pi;
    });
  }
}

void swigluGrad(const TensorView &dy, const TensorView &gate, const TensorView &up,
                const TensorView &dgate, const TensorView &dup) {
  const char *k = "swiglu_grad";
  checkFloat(k, "dy", dy);
  checkFloat(k, "gate", gate);
  checkFloat(k, "up", up);
  checkFloat(k, "dgate", dgate);
  checkFloat(k, "dup", dup);
  checkSameShape(k, "gate", gate, "dy", dy);
  checkSameShape(k, "up", up, "dy", dy);
  checkSameShape(k, "dgate", dgate, "dy", dy);
  checkSameShape(k, "dup", dup, "dy", dy);
  forChunks(dy.numel(), [&](int64_t offset, int64_t count) {
    std::vector<float> g(static_cast<size_t>(count)), gt(static_cast<size_t>(count)),
        u(static_cast<size_t>(count));
    // Every input chunk is loaded before either output chunk is stored (in-place outputs).
    loadF32(subView(dy, offset, count), g.data());
    loadF32(subView(gate, offset, count), gt.data());
    loadF32(subView(up, offset, count), u.data());
    for (size_t i = 0; i < g.size(); ++i) {
      double d = g[i], a = gt[i], b = u[i];
      gt[i] = float(d * b * siluDerivative(a));
      u[i] = float(d * a * sigmoid(a));
    }
    storeF32(gt.data(), subView(dgate, offset, count));
    storeF32(u.data(), subView(dup, offset, count));
  });
}

void sliceGrad(const TensorView &dyIn, int axis, int64_t start, const TensorView &dx) {
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
  if (start < 0 || start > full || len > full - start)
    fail(k, "range [" + std::to_string(start) + ", " + std::to_string(start + len) +
                ") along axis " + std::to_string(a) + " is outside dx shape " +
                formatShape(dx.shape));
  if (dx.numel() == 0)
    return;
  std::vector<char> keep;
  TensorView dy = unaliased(dyIn, dx, keep);
  // All-zero bytes are 0 in every dtype.
  std::memset(dx.data, 0, dx.bytes());
  if (dy.numel() == 0)
    return;
  int64_t outer = 1, inner = int64_t(dtypeSize(dx.dtype));
  for (int64_t i = 0; i < a; ++i)
    outer *= dx.shape[size_t(i)];
  for (int64_t i = a + 1; i < rank; ++i)
    inner *= dx.shape[size_t(i)];
  const char *src = static_cast<const char *>(dy.data);
  char *dst = static_cast<char *>(dx.data);
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + (o * full + start) * inner, src + o * len * inner, size_t(len * inner));
}

} // namespace bonsai::rt::cpu
