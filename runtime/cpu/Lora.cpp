//===- Lora.cpp - DoRA's row scale and its output's gradients on the CPU --===//
//
// dora_scale: m / ||W + s·B·A|| per output row. A row of B·A is formed one element at a time
// (r multiply-adds in fp64) and squared into the row's fp64 sum, so the [out, in] product is
// never stored. Rows are independent and each is reduced by one thread in order: the result
// does not depend on the thread count, and at B = 0 the norm is exactly the RowNorm
// initializer's (Init.cpp sums the same squares in the same order).
//
// dora_grad: dx = dy ⊙ scale, dm = Σ_t dy ⊙ y / m, each column's sum in fp64 in row order by
// one thread, so the result does not depend on the thread count either.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace bonsai::rt::cpu {

using namespace detail;

void doraScale(const TensorView &m, const TensorView &w, const TensorView &a, const TensorView &b,
               double scale, const TensorView &y) {
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
  if (!std::isfinite(scale))
    fail(kernel, "scale must be finite, got " + std::to_string(scale));

  std::vector<float> ws, as, bs, ms;
  const float *wp = loadFloats(w, ws), *ap = loadFloats(a, as), *bp = loadFloats(b, bs),
              *mp = loadFloats(m, ms);
  std::vector<float> norms(static_cast<size_t>(out)), result(static_cast<size_t>(out));
  parallelFor(out, 8, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const float *brow = bp + o * rank;
      double sum = 0;
      for (int64_t i = 0; i < in; ++i) {
        double lora = 0;
        for (int64_t k = 0; k < rank; ++k)
          lora += double(brow[k]) * double(ap[k * in + i]);
        double v = double(wp[o * in + i]) + scale * lora;
        sum += v * v;
      }
      norms[size_t(o)] = float(std::sqrt(sum));
    }
  });
  // The norm as the magnitude's dtype holds it (see RowNorm), then the quotient.
  TensorView rounded{nullptr, y.dtype, {out}};
  std::vector<uint16_t> half(y.dtype == DType::F32 ? 0 : size_t(out));
  if (y.dtype != DType::F32) {
    rounded.data = half.data();
    storeF32(norms.data(), rounded);
    loadF32(rounded, norms.data());
  }
  for (int64_t o = 0; o < out; ++o) {
    if (!(norms[size_t(o)] > 0))
      fail(kernel, "row " + std::to_string(o) + " of w + scale·lora_b·lora_a has norm " +
                       std::to_string(norms[size_t(o)]) + ": its direction is undefined");
    result[size_t(o)] = float(double(mp[o]) / double(norms[size_t(o)]));
  }
  storeF32(result.data(), y);
}

void doraGrad(const TensorView &dy, const TensorView &y, const TensorView &scale,
              const TensorView &m, const TensorView &dx, const TensorView &dm) {
  const char *kernel = "dora_grad";
  int64_t cols = checkDoraGrad(kernel, dy, y, scale, m, dx, dm);
  int64_t rows = cols == 0 ? 0 : dy.numel() / cols;
  std::vector<float> dys, ys, scales, ms;
  const float *dyp = loadFloats(dy, dys), *yp = loadFloats(y, ys), *sp = loadFloats(scale, scales),
              *mp = loadFloats(m, ms);
  for (int64_t c = 0; c < cols; ++c)
    if (!(mp[c] != 0.0f))
      fail(kernel, "magnitude[" + std::to_string(c) + "] is " + std::to_string(mp[c]) +
                       ": the row's pre-scale output cannot be recovered from y to form its "
                       "gradient (compile with --fuse-disable=dora to keep it instead)");
  // Each column's sum first: dx may share dy's bytes.
  std::vector<float> dmv(static_cast<size_t>(cols));
  parallelFor(cols, std::max<int64_t>(1, kWorkGrain / std::max<int64_t>(rows, 1)),
              [&](int64_t c0, int64_t c1) {
                std::vector<double> sums(static_cast<size_t>(c1 - c0), 0.0);
                for (int64_t r = 0; r < rows; ++r)
                  for (int64_t c = c0; c < c1; ++c)
                    sums[size_t(c - c0)] += double(dyp[r * cols + c]) * double(yp[r * cols + c]);
                for (int64_t c = c0; c < c1; ++c)
                  dmv[size_t(c)] = float(sums[size_t(c - c0)] / double(mp[c]));
              });
  std::vector<float> dxScratch;
  float *dxp = resultBuffer(dx, {&dy, &y, &scale, &m}, dxScratch);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dxp[r * cols + c] = dyp[r * cols + c] * sp[c];
  if (dxp == dxScratch.data())
    storeF32(dxp, dx);
  storeF32(dmv.data(), dm);
}

} // namespace bonsai::rt::cpu
