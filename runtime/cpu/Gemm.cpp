//===- Gemm.cpp - linear and matmul through OpenBLAS sgemm ----------------===//
//
// The CPU backend's GEMM (cpu::gemm, which every CPU kernel and export multiplies with) and its
// two GEMM kernels. Operands are converted to fp32 (F32 operands are used in place), multiplied
// by OpenBLAS's row-major cblas_sgemm on one thread per fixed block of rows, and the result is
// rounded once into the output's dtype.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <cblas.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>

// OpenBLAS's thread count (libopenblas is what is linked; not every cblas.h declares it).
extern "C" void openblas_set_num_threads(int threads);

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

/// The rows of c one sgemm call computes. Fixed, not derived from the thread count: OpenBLAS's
/// result for an element can depend on the rows of the call it is computed in (splitting the
/// tiny models' GEMMs in two row halves changed the last bits of their losses), so only a fixed
/// split keeps the bits independent of the threads.
constexpr int64_t kGemmBlockRows = 64;
/// Multiply-adds below which blocks are not worth a thread of their own.
constexpr int64_t kGemmGrain = int64_t(1) << 18;

} // namespace

void gemm(const char *kernel, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
          float alpha, const float *a, const float *b, float beta, float *c) {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    // An empty sum (sgemm would also reject the zero leading dimension).
    if (beta == 0.0f)
      std::fill(c, c + m * n, 0.0f);
    else if (beta != 1.0f)
      for (int64_t i = 0; i < m * n; ++i)
        c[i] *= beta;
    return;
  }
  // OpenBLAS computes each block on the calling thread: the threads are parallelFor's.
  static std::once_flag oneThread;
  std::call_once(oneThread, [] { openblas_set_num_threads(1); });
  blasint lda = toBlas(kernel, transA ? m : k, "leading dimension");
  blasint ldb = toBlas(kernel, transB ? k : n, "leading dimension");
  blasint ldc = toBlas(kernel, n, "N");
  blasint kk = toBlas(kernel, k, "K");
  toBlas(kernel, m, "M");
  int64_t blocks = (m + kGemmBlockRows - 1) / kGemmBlockRows;
  int64_t grain = std::max<int64_t>(1, kGemmGrain / std::max<int64_t>(1, kGemmBlockRows * n * k));
  parallelFor(blocks, grain, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      // Rows r0..r1 of op(a): rows of a, or columns of a stored transposed.
      int64_t r0 = block * kGemmBlockRows, r1 = std::min(m, r0 + kGemmBlockRows);
      cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                  transB ? CblasTrans : CblasNoTrans, blasint(r1 - r0), ldc, kk, alpha,
                  transA ? a + r0 : a + r0 * k, lda, b, ldb, beta, c + r0 * n, ldc);
    }
  });
}

void linear(const TensorView &x, const TensorView &w, const TensorView *bias, const TensorView &y) {
  const char *k = "linear";
  auto [rows, out, in] = checkLinear(k, x, w, bias, y);

  std::vector<float> xs, ws, bs, ys;
  const float *xp = loadFloats(x, xs);
  const float *wp = loadFloats(w, ws);
  float *yp = resultBuffer(y, {&x, &w, bias}, ys);
  gemm(k, /*transA=*/false, /*transB=*/true, rows, out, in, 1.0f, xp, wp, 0.0f, yp);
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
    gemm(k, /*transA=*/false, /*transB=*/false, m, n, kk, 1.0f, ap + i * m * kk, bp + i * kk * n,
         0.0f, cp + i * m * n);
  if (cp != c.data)
    storeF32(cp, c);
}

} // namespace bonsai::rt::cpu
