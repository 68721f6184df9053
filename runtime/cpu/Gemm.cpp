//===- Gemm.cpp - linear and matmul through OpenBLAS sgemm ----------------===//
//
// The two GEMM kernels of the CPU backend. Operands are converted to fp32 (F32 operands are used
// in place), multiplied by OpenBLAS's row-major cblas_sgemm, which threads internally, and the
// result is rounded once into the output's dtype.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <cblas.h>

#include <algorithm>
#include <limits>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

blasint toBlas(const char *kernel, int64_t v, const char *what) {
  // Debian's OpenBLAS takes 32-bit dimensions; a silent truncation would read out of bounds.
  if (v > int64_t(std::numeric_limits<blasint>::max()))
    fail(kernel, std::string(what) + " " + std::to_string(v) +
                     " exceeds the largest dimension OpenBLAS accepts");
  return blasint(v);
}

/// c[m, n] = sum_k a[m, k] * (transB ? b[n, k] : b[k, n]), all row-major and dense.
void sgemm(const char *kernel, bool transB, int64_t m, int64_t n, int64_t k, const float *a,
           const float *b, float *c) {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    // An empty sum; sgemm would also reject the zero leading dimension of `a`.
    std::fill(c, c + m * n, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              toBlas(kernel, m, "M"), toBlas(kernel, n, "N"), toBlas(kernel, k, "K"), 1.0f, a,
              toBlas(kernel, k, "K"), b, toBlas(kernel, transB ? k : n, "leading dimension"), 0.0f,
              c, toBlas(kernel, n, "N"));
}

} // namespace

void linear(const TensorView &x, const TensorView &w, const TensorView *bias, const TensorView &y) {
  const char *k = "linear";
  auto [rows, out, in] = checkLinear(k, x, w, bias, y);

  std::vector<float> xs, ws, bs, ys;
  const float *xp = loadFloats(x, xs);
  const float *wp = loadFloats(w, ws);
  float *yp = resultBuffer(y, {&x, &w, bias}, ys);
  sgemm(k, /*transB=*/true, rows, out, in, xp, wp, yp);
  if (bias) {
    const float *bp = loadFloats(*bias, bs);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n = 0; n < out; ++n)
        yp[r * out + n] += bp[n];
  }
  if (yp != y.data)
    storeF32(yp, y);
}

void matmul(const TensorView &a, const TensorView &b, const TensorView &c) {
  const char *k = "matmul";
  checkFloat(k, "a", a);
  checkFloat(k, "b", b);
  checkFloat(k, "c", c);
  int64_t rank = a.rank();
  if (rank < 2 || b.rank() != rank ||
      !std::equal(a.shape.begin(), a.shape.end() - 2, b.shape.begin()) || b.dim(-2) != a.dim(-1))
    fail(k, "a shape " + formatShape(a.shape) + " and b shape " + formatShape(b.shape) +
                " are not [..., m, k] and [..., k, n] with the same batch dimensions");
  int64_t m = a.dim(-2), kk = a.dim(-1), n = b.dim(-1);
  std::vector<int64_t> expected(a.shape.begin(), a.shape.end() - 1);
  expected.push_back(n);
  checkShape(k, "c", c, expected,
             "for a shape " + formatShape(a.shape) + " and b shape " + formatShape(b.shape));
  int64_t batch = 1;
  for (int64_t i = 0; i + 2 < rank; ++i)
    batch *= a.shape[size_t(i)];

  std::vector<float> as, bs, cs;
  const float *ap = loadFloats(a, as);
  const float *bp = loadFloats(b, bs);
  float *cp = resultBuffer(c, {&a, &b}, cs);
  for (int64_t i = 0; i < batch; ++i)
    sgemm(k, /*transB=*/false, m, n, kk, ap + i * m * kk, bp + i * kk * n, cp + i * m * n);
  if (cp != c.data)
    storeF32(cp, c);
}

} // namespace bonsai::rt::cpu
