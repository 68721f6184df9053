//===- Norm.cpp - rms_norm, layer_norm and softmax on the CPU -------------===//
//
// Kernels that normalise along one axis. Each row (each column of the softmax axis) is converted
// to fp32, reduced in fp64 (means, variances, exponential sums) and rounded once into the output.
// Rows are independent and each is reduced by one thread in order, so results do not depend on
// the number of threads.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// Elements per thread below which threading costs more than it saves.
constexpr int64_t kElementGrain = 32768;

/// Runs fn(row, in, out) on every row of `d` elements of x, writing y, in parallel; `in` holds
/// the row as fp32 and fn fills `out`.
template <typename F> void forRows(const TensorView &x, const TensorView &y, int64_t d, F fn) {
  int64_t rows = d ? x.numel() / d : 0;
  parallelFor(rows, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, d)),
              [&](int64_t r0, int64_t r1) {
                std::vector<float> in(static_cast<size_t>(d)), out(static_cast<size_t>(d));
                for (int64_t r = r0; r < r1; ++r) {
                  loadF32(subView(x, r * d, d), in.data());
                  fn(in, out);
                  storeF32(out.data(), subView(y, r * d, d));
                }
              });
}

} // namespace

void rmsNorm(const TensorView &x, const TensorView &w, double eps, const TensorView &y) {
  int64_t d = checkNorm("rms_norm", x, w, nullptr, y);
  std::vector<float> ws;
  const float *wp = loadFloats(w, ws);
  forRows(x, y, d, [&](const std::vector<float> &in, std::vector<float> &out) {
    double sumSq = 0.0;
    for (float v : in)
      sumSq += double(v) * double(v);
    double inv = 1.0 / std::sqrt(sumSq / double(d) + eps);
    for (int64_t i = 0; i < d; ++i)
      out[size_t(i)] = float(double(in[size_t(i)]) * inv * double(wp[i]));
  });
}

void layerNorm(const TensorView &x, const TensorView &w, const TensorView &b, double eps,
               const TensorView &y) {
  int64_t d = checkNorm("layer_norm", x, w, &b, y);
  std::vector<float> ws, bs;
  const float *wp = loadFloats(w, ws);
  const float *bp = loadFloats(b, bs);
  forRows(x, y, d, [&](const std::vector<float> &in, std::vector<float> &out) {
    // Two passes: the mean first, so the variance does not suffer from cancellation.
    double sum = 0.0;
    for (float v : in)
      sum += double(v);
    double mean = sum / double(d);
    double sumSq = 0.0;
    for (float v : in)
      sumSq += (double(v) - mean) * (double(v) - mean);
    double inv = 1.0 / std::sqrt(sumSq / double(d) + eps);
    for (int64_t i = 0; i < d; ++i)
      out[size_t(i)] = float((double(in[size_t(i)]) - mean) * inv * double(wp[i]) + double(bp[i]));
  });
}

void softmax(const TensorView &x, int axis, const TensorView &y) {
  const char *k = "softmax";
  checkFloat(k, "x", x);
  checkFloat(k, "y", y);
  checkSameShape(k, "y", y, "x", x);
  int64_t a = normalizeAxis(k, axis, x.rank());
  int64_t outer = 1, len = x.dim(a), inner = 1;
  for (int64_t i = 0; i < a; ++i)
    outer *= x.shape[size_t(i)];
  for (int64_t i = a + 1; i < x.rank(); ++i)
    inner *= x.shape[size_t(i)];
  int64_t block = len * inner;
  if (block == 0)
    return;
  // Each block [len, inner] is contiguous; softmax runs down each of its `inner` columns.
  parallelFor(outer, std::max<int64_t>(1, kElementGrain / block), [&](int64_t o0, int64_t o1) {
    std::vector<float> v(static_cast<size_t>(block));
    std::vector<double> e(static_cast<size_t>(len));
    for (int64_t o = o0; o < o1; ++o) {
      loadF32(subView(x, o * block, block), v.data());
      for (int64_t c = 0; c < inner; ++c) {
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < len; ++i)
          max = std::max(max, v[size_t(i * inner + c)]);
        double sum = 0.0;
        for (int64_t i = 0; i < len; ++i)
          sum += e[size_t(i)] = std::exp(double(v[size_t(i * inner + c)]) - double(max));
        for (int64_t i = 0; i < len; ++i)
          v[size_t(i * inner + c)] = float(e[size_t(i)] / sum);
      }
      storeF32(v.data(), subView(y, o * block, block));
    }
  });
}

} // namespace bonsai::rt::cpu
