//===- BackwardNorm.cpp - Gradients of the normalising kernels -------------===//
//
// rms_norm_grad, layer_norm_grad, softmax_grad and cross_entropy_grad. Each row's statistics
// (1/rms, mean and 1/std, the softmax) are recomputed from the forward inputs in fp64, as the
// forward kernels compute them. The weight and bias gradients sum over every row: a second pass
// gives each thread a range of columns and adds the rows into them in row order, so every sum has
// one order whatever the number of threads. Outputs are written only after every input was read,
// so an output may alias an input.
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

/// Runs fn(r0, r1) over row ranges of `rows` rows of `d` elements, in parallel.
template <typename F> void forRowRanges(int64_t rows, int64_t d, F fn) {
  parallelFor(rows, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, d)), fn);
}

/// out[c] = sum over rows r, in order, of term(r, c), for every column c of `d`; each thread owns
/// a range of columns.
template <typename F> void sumColumns(int64_t rows, int64_t d, float *out, F term) {
  parallelFor(d, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, rows)),
              [&](int64_t c0, int64_t c1) {
                std::vector<double> acc(static_cast<size_t>(c1 - c0), 0.0);
                for (int64_t r = 0; r < rows; ++r)
                  for (int64_t c = c0; c < c1; ++c)
                    acc[size_t(c - c0)] += term(r, c);
                for (int64_t c = c0; c < c1; ++c)
                  out[c] = float(acc[size_t(c - c0)]);
              });
}

} // namespace

void rmsNormGrad(const TensorView &dy, const TensorView &x, const TensorView &w, double eps,
                 const TensorView &dx, const TensorView &dw) {
  const char *k = "rms_norm_grad";
  int64_t d = checkNormGrad(k, dy, x, w, dx);
  checkFloat(k, "dw", dw);
  checkShape(k, "dw", dw, {d}, "for x shape " + formatShape(x.shape));
  int64_t rows = d ? x.numel() / d : 0;

  std::vector<float> dys, xs, ws, dxs, dws;
  const float *dyp = loadFloats(dy, dys);
  const float *xp = loadFloats(x, xs);
  const float *wp = loadFloats(w, ws);
  float *dxp = resultBuffer(dx, {&dy, &x, &w}, dxs);
  float *dwp = resultBuffer(dw, {&dy, &x, &w, &dx}, dws);

  // y = x r w with r = (mean(x^2) + eps)^-1/2, so with g = dy w:
  // dx = r g - x r^3 mean(g x), and dw = sum over rows of dy x r.
  std::vector<double> inv(static_cast<size_t>(rows));
  forRowRanges(rows, d, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = xp + r * d, *gr = dyp + r * d;
      double sumSq = 0.0, dot = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        sumSq += double(xr[i]) * double(xr[i]);
        dot += double(gr[i]) * double(wp[i]) * double(xr[i]);
      }
      double rr = 1.0 / std::sqrt(sumSq / double(d) + eps);
      inv[size_t(r)] = rr;
      double coef = rr * rr * rr * dot / double(d);
      float *out = dxp + r * d;
      for (int64_t i = 0; i < d; ++i)
        out[i] = float(rr * double(gr[i]) * double(wp[i]) - coef * double(xr[i]));
    }
  });
  sumColumns(rows, d, dwp, [&](int64_t r, int64_t c) {
    return double(dyp[r * d + c]) * double(xp[r * d + c]) * inv[size_t(r)];
  });
  if (dxp != dx.data)
    storeF32(dxp, dx);
  if (dwp != dw.data)
    storeF32(dwp, dw);
}

void layerNormGrad(const TensorView &dy, const TensorView &x, const TensorView &w, double eps,
                   const TensorView &dx, const TensorView &dw, const TensorView &db) {
  const char *k = "layer_norm_grad";
  int64_t d = checkNormGrad(k, dy, x, w, dx);
  checkFloat(k, "dw", dw);
  checkFloat(k, "db", db);
  checkShape(k, "dw", dw, {d}, "for x shape " + formatShape(x.shape));
  checkShape(k, "db", db, {d}, "for x shape " + formatShape(x.shape));
  int64_t rows = d ? x.numel() / d : 0;

  std::vector<float> dys, xs, ws, dxs, dws, dbs;
  const float *dyp = loadFloats(dy, dys);
  const float *xp = loadFloats(x, xs);
  const float *wp = loadFloats(w, ws);
  float *dxp = resultBuffer(dx, {&dy, &x, &w}, dxs);
  float *dwp = resultBuffer(dw, {&dy, &x, &w, &dx}, dws);
  float *dbp = resultBuffer(db, {&dy, &x, &w, &dx, &dw}, dbs);

  // xhat = (x - mean) r, y = xhat w + b, so with g = dy w:
  // dx = r (g - mean(g) - xhat mean(g xhat)), dw = sum dy xhat, db = sum dy.
  std::vector<double> mean(static_cast<size_t>(rows)), inv(static_cast<size_t>(rows));
  forRowRanges(rows, d, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = xp + r * d, *gr = dyp + r * d;
      // Two passes, as the forward kernel: the mean first, then the variance.
      double sum = 0.0;
      for (int64_t i = 0; i < d; ++i)
        sum += double(xr[i]);
      double mu = sum / double(d), sumSq = 0.0;
      for (int64_t i = 0; i < d; ++i)
        sumSq += (double(xr[i]) - mu) * (double(xr[i]) - mu);
      double rr = 1.0 / std::sqrt(sumSq / double(d) + eps);
      mean[size_t(r)] = mu;
      inv[size_t(r)] = rr;
      double sumG = 0.0, sumGX = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        double g = double(gr[i]) * double(wp[i]);
        sumG += g;
        sumGX += g * (double(xr[i]) - mu) * rr;
      }
      double meanG = sumG / double(d), meanGX = sumGX / double(d);
      float *out = dxp + r * d;
      for (int64_t i = 0; i < d; ++i) {
        double g = double(gr[i]) * double(wp[i]), xhat = (double(xr[i]) - mu) * rr;
        out[i] = float(rr * (g - meanG - xhat * meanGX));
      }
    }
  });
  sumColumns(rows, d, dwp, [&](int64_t r, int64_t c) {
    return double(dyp[r * d + c]) * (double(xp[r * d + c]) - mean[size_t(r)]) * inv[size_t(r)];
  });
  sumColumns(rows, d, dbp, [&](int64_t r, int64_t c) { return double(dyp[r * d + c]); });
  if (dxp != dx.data)
    storeF32(dxp, dx);
  if (dwp != dw.data)
    storeF32(dwp, dw);
  if (dbp != db.data)
    storeF32(dbp, db);
}

void softmaxGrad(const TensorView &dy, const TensorView &y, int axis, const TensorView &dx) {
  const char *k = "softmax_grad";
  checkFloat(k, "dy", dy);
  checkFloat(k, "y", y);
  checkFloat(k, "dx", dx);
  checkSameShape(k, "y", y, "dy", dy);
  checkSameShape(k, "dx", dx, "dy", dy);
  int64_t a = normalizeAxis(k, axis, dy.rank());
  int64_t outer = 1, len = dy.dim(a), inner = 1;
  for (int64_t i = 0; i < a; ++i)
    outer *= dy.shape[size_t(i)];
  for (int64_t i = a + 1; i < dy.rank(); ++i)
    inner *= dy.shape[size_t(i)];
  int64_t block = len * inner;
  if (block == 0)
    return;
  // Each block [len, inner] is contiguous, as in softmax; both inputs' blocks are loaded before
  // dx's block is stored, so dx may alias either.
  parallelFor(outer, std::max<int64_t>(1, kElementGrain / block), [&](int64_t o0, int64_t o1) {
    std::vector<float> g(static_cast<size_t>(block)), p(static_cast<size_t>(block));
    for (int64_t o = o0; o < o1; ++o) {
      loadF32(subView(dy, o * block, block), g.data());
      loadF32(subView(y, o * block, block), p.data());
      for (int64_t c = 0; c < inner; ++c) {
        double dot = 0.0;
        for (int64_t i = 0; i < len; ++i)
          dot += double(g[size_t(i * inner + c)]) * double(p[size_t(i * inner + c)]);
        for (int64_t i = 0; i < len; ++i) {
          size_t e = size_t(i * inner + c);
          g[e] = float(double(p[e]) * (double(g[e]) - dot));
        }
      }
      storeF32(g.data(), subView(dx, o * block, block));
    }
  });
}

void crossEntropyGrad(const TensorView &dloss, const TensorView &logits, const TensorView &labels,
                      int64_t ignoreIndex, const TensorView &dlogits) {
  const char *k = "cross_entropy_grad";
  checkFloat(k, "dloss", dloss);
  checkFloat(k, "logits", logits);
  checkIndex(k, "labels", labels);
  checkFloat(k, "dlogits", dlogits);
  if (dloss.numel() != 1)
    fail(k, "dloss shape " + formatShape(dloss.shape) + " is not a scalar");
  if (logits.rank() < 1)
    fail(k, "logits must have at least one dimension, got shape " + formatShape(logits.shape));
  checkShape(k, "labels", labels,
             std::vector<int64_t>(logits.shape.begin(), logits.shape.end() - 1),
             "for logits shape " + formatShape(logits.shape));
  checkSameShape(k, "dlogits", dlogits, "logits", logits);

  // Every label is checked before dlogits is written.
  int64_t vocab = logits.dim(-1), rows = labels.numel(), count = 0;
  std::vector<int64_t> label(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t l = label[size_t(r)] = loadIndex(labels, r);
    if (l == ignoreIndex)
      continue;
    if (l < 0 || l >= vocab)
      fail(k, "label " + std::to_string(l) + " at labels" + formatIndex(r, labels.shape) +
                  " is outside [0, " + std::to_string(vocab) + ") and is not ignore_index " +
                  std::to_string(ignoreIndex));
    ++count;
  }
  if (vocab == 0)
    return;
  float dl;
  loadF32(dloss, &dl);
  // With every label ignored the loss is a constant NaN; its gradient is taken to be 0 rather
  // than NaN, so that a micro-batch of padding does not poison the accumulated gradients.
  double scale = count ? double(dl) / double(count) : 0.0;

  // Row by row: a row is loaded before its gradient is stored, so dlogits may alias logits.
  parallelFor(rows, std::max<int64_t>(1, kElementGrain / vocab), [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(vocab));
    std::vector<double> e(static_cast<size_t>(vocab));
    for (int64_t r = r0; r < r1; ++r) {
      int64_t l = label[size_t(r)];
      if (l == ignoreIndex || count == 0) {
        std::fill(row.begin(), row.end(), 0.0f);
      } else {
        loadF32(subView(logits, r * vocab, vocab), row.data());
        double max = -std::numeric_limits<double>::infinity();
        for (float v : row)
          max = std::max(max, double(v));
        double sum = 0.0;
        for (int64_t i = 0; i < vocab; ++i)
          sum += e[size_t(i)] = std::exp(double(row[size_t(i)]) - max);
        for (int64_t i = 0; i < vocab; ++i)
          row[size_t(i)] = float(scale * (e[size_t(i)] / sum - (i == l ? 1.0 : 0.0)));
      }
      storeF32(row.data(), subView(dlogits, r * vocab, vocab));
    }
  });
}

} // namespace bonsai::rt::cpu
