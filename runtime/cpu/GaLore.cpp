//===- GaLore.cpp - GaLore refresh, projection and update on the CPU ------===//
//
// The reference of the three GaLore kernels (GaLore.h, docs/galore.md). Everything is
// computed in fp64 from the f32/bf16 tensors and rounded once into each tensor written, in a
// fixed order, so that the results do not depend on the thread count.
//
// The exact projector is the eigenvectors of the s x s Gram matrix A·Aᵀ (A the gradient with
// its smaller side first), found by cyclic Jacobi rotations: slow for large s, exact to fp64
// rounding, and enough for the CPU backend's models. The randomized projector is the thin QR
// factor (positive diagonal) of A·Ω after `power_iterations` re-orthonormalised power
// iterations, computed by shifted CholeskyQR then a rank-revealing CholeskyQR (Fukaya et al.,
// 2020) whose left-out columns are completed by projected unit vectors: the same algorithm as
// the CUDA kernels. For a sketch of full column rank Q is unique, so a NumPy reference with a
// Householder QR gets the same projector; for a rank-deficient one Q still spans the sketch.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/GaLore.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// A row-major fp64 matrix.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<double> data;
  Matrix() = default;
  Matrix(int64_t r, int64_t c) : rows(r), cols(c), data(size_t(r * c), 0.0) {}
  double &operator()(int64_t i, int64_t j) { return data[size_t(i * cols + j)]; }
  double operator()(int64_t i, int64_t j) const { return data[size_t(i * cols + j)]; }
};

/// C = op(A)·op(B), op = transpose when the flag is set; rows of C in parallel.
Matrix multiply(const Matrix &a, bool transA, const Matrix &b, bool transB) {
  int64_t m = transA ? a.cols : a.rows, k = transA ? a.rows : a.cols;
  int64_t n = transB ? b.rows : b.cols;
  Matrix c(m, n);
  parallelFor(m, 8, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0;
        for (int64_t p = 0; p < k; ++p)
          sum += (transA ? a(p, i) : a(i, p)) * (transB ? b(j, p) : b(p, j));
        c(i, j) = sum;
      }
  });
  return c;
}

/// The tensor as an fp64 matrix, transposed when `transpose` is set.
Matrix loadMatrix(const TensorView &t, bool transpose) {
  std::vector<float> values(static_cast<size_t>(t.numel()));
  loadF32(t, values.data());
  int64_t r = t.shape[0], c = t.shape[1];
  Matrix out(transpose ? c : r, transpose ? r : c);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      (transpose ? out(j, i) : out(i, j)) = double(values[size_t(i * c + j)]);
  return out;
}

/// Rounds every element to the nearest bf16 (ties to even), as a bf16 GEMM operand.
void roundToBf16(Matrix &a) {
  for (double &x : a.data)
    x = double(bf16ToF32(f32ToBf16(float(x))));
}

/// Rank-revealing Cholesky: upper-triangular R with RᵀR = G over the columns it accepts,
/// taken greedily in order. Column j is accepted while fewer than `limit` are and its pivot
/// (the squared distance of that column to the span of the accepted ones before it) exceeds
/// `tolerance`; a column left out gets a -1 on R's diagonal and zeros elsewhere in its row
/// and column, so that Y·R⁻¹ still runs (the column passes through, negated, to be replaced)
/// and the sign marks it. Returns whether each column was accepted.
std::vector<bool> rankRevealingCholesky(const Matrix &g, double tolerance, int64_t limit,
                                        Matrix &r) {
  int64_t n = g.rows, count = 0;
  r = Matrix(n, n);
  std::vector<bool> accepted(size_t(n), false);
  for (int64_t j = 0; j < n; ++j) {
    double d = g(j, j);
    for (int64_t p = 0; p < j; ++p)
      d -= r(p, j) * r(p, j);
    if (count >= limit || !(d > tolerance) || !std::isfinite(d)) {
      for (int64_t p = 0; p < j; ++p)
        r(p, j) = 0.0;
      r(j, j) = -1.0;
      continue;
    }
    accepted[size_t(j)] = true;
    ++count;
    r(j, j) = std::sqrt(d);
    for (int64_t i = j + 1; i < n; ++i) {
      double v = g(j, i);
      for (int64_t p = 0; p < j; ++p)
        v -= r(p, j) * r(p, i);
      r(j, i) = v / r(j, j);
    }
  }
  return accepted;
}

/// Y·R⁻¹ for upper-triangular R (forward substitution along each row of Y).
Matrix solveUpper(const Matrix &y, const Matrix &r) {
  Matrix q(y.rows, y.cols);
  for (int64_t i = 0; i < y.rows; ++i)
    for (int64_t j = 0; j < y.cols; ++j) {
      double v = y(i, j);
      for (int64_t p = 0; p < j; ++p)
        v -= q(i, p) * r(p, j);
      q(i, j) = v / r(j, j);
    }
  return q;
}

double largestDiagonal(const Matrix &g) {
  double largest = 0.0;
  for (int64_t i = 0; i < g.rows; ++i)
    largest = std::max(largest, g(i, i));
  return largest;
}

/// Step 1 of orthonormalize alone: q1 = Y·R1⁻¹, R1 the Cholesky factor of YᵀY + σI.
galore::Status shiftedCholeskyQr(const Matrix &y, Matrix &q1) {
  int64_t s = y.rows, r = y.cols;
  Matrix gram = multiply(y, true, y, false);
  double trace = 0.0;
  for (int64_t i = 0; i < r; ++i)
    trace += gram(i, i);
  if (!std::isfinite(trace))
    return galore::kNonFinite;
  if (trace == 0.0)
    return galore::kRankDeficient; // a zero sketch spans nothing
  // Fukaya et al.'s shift keeps every pivot above it: step 1 never breaks down.
  double shift = 11.0 * double(s * r + r * (r + 1)) * 0x1p-53 * trace;
  for (int64_t i = 0; i < r; ++i)
    gram(i, i) += shift;
  Matrix factor;
  std::vector<bool> accepted = rankRevealingCholesky(gram, 0.0, r, factor);
  if (std::find(accepted.begin(), accepted.end(), false) != accepted.end())
    return galore::kRankDeficient;
  q1 = solveUpper(y, factor);
  return galore::kRefreshed;
}

/// The orthonormal s x r factor Q of the sketch Y: the thin QR factor with a positive diagonal
/// when Y has full column rank; otherwise Y's columns that depend on the ones before them are
/// replaced, in order, by an orthonormal completion, so that Q always has orthonormal columns
/// and spans Y's range. Three steps (docs/galore.md):
///   1. shifted CholeskyQR (Fukaya et al., 2020): Q1 = Y·R1⁻¹ with R1ᵀR1 = YᵀY + shift·I,
///      which cannot break down on an ill-conditioned or rank-deficient Y;
///   2. rank-revealing CholeskyQR of Q1 (galore::kRankTolerance): Q2 = Q1·R2⁻¹ over the
///      accepted columns;
///   3. for the k columns left out: the unit vectors e_0 .. e_{r-1} projected off the accepted
///      columns, S = I - Q2[0:r, acc]·Q2[0:r, acc]ᵀ their Gram matrix, taken greedily
///      (galore::completionTolerance) until k are found, orthonormalised by the Cholesky factor
///      of S, and put into the left-out columns in order.
/// The CUDA kernels run the same steps. Fails (galore::Status) only when Y is zero or not
/// finite, or in the safety nets of steps 1 and 3 that exact arithmetic never reaches.
galore::Status orthonormalize(const Matrix &y, Matrix &q) {
  int64_t s = y.rows, r = y.cols;
  Matrix q1, factor;
  if (galore::Status failed = shiftedCholeskyQr(y, q1); failed != galore::kRefreshed)
    return failed;
  Matrix gram1 = multiply(q1, true, q1, false);
  std::vector<bool> accepted = rankRevealingCholesky(
      gram1, galore::kRankTolerance * largestDiagonal(gram1), r, factor);
  q = solveUpper(q1, factor);
  std::vector<int64_t> missing;
  for (int64_t j = 0; j < r; ++j)
    if (!accepted[size_t(j)])
      missing.push_back(j);
  if (missing.empty())
    return galore::kRefreshed;

  // The completion: U = (I - Qa·Qaᵀ)·[e_0 .. e_{r-1}], S = I - Qa[0:r]·Qa[0:r]ᵀ its Gram matrix.
  Matrix u(s, r), sGram(r, r);
  for (int64_t x = 0; x < s; ++x)
    for (int64_t i = 0; i < r; ++i) {
      double v = x == i ? 1.0 : 0.0;
      for (int64_t p = 0; p < r; ++p)
        if (accepted[size_t(p)])
          v -= q(x, p) * q(i, p);
      u(x, i) = v;
      if (x < r)
        sGram(x, i) = v;
    }
  std::vector<bool> chosen = rankRevealingCholesky(
      sGram, galore::completionTolerance(r), int64_t(missing.size()), factor);
  Matrix completion = solveUpper(u, factor);
  size_t next = 0;
  for (int64_t i = 0; i < r && next < missing.size(); ++i)
    if (chosen[size_t(i)]) {
      for (int64_t x = 0; x < s; ++x)
        q(x, missing[next]) = completion(x, i);
      ++next;
    }
  return next == missing.size() ? galore::kRefreshed : galore::kRankDeficient;
}

/// Eigenvectors of the symmetric matrix `a` (columns of the result), eigenvalues descending,
/// by cyclic Jacobi rotations to fp64 convergence.
Matrix symmetricEigenvectors(Matrix a, std::vector<double> &values) {
  int64_t n = a.rows;
  Matrix v(n, n);
  for (int64_t i = 0; i < n; ++i)
    v(i, i) = 1.0;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0.0, diag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      diag += a(i, i) * a(i, i);
      for (int64_t j = i + 1; j < n; ++j)
        off += a(i, j) * a(i, j);
    }
    if (off <= 1e-30 * diag || off == 0.0)
      break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        if (a(p, q) == 0.0)
          continue;
        double theta = (a(q, q) - a(p, p)) / (2.0 * a(p, q));
        double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        double c = 1.0 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < n; ++k) { // columns p, q of A·J
          double akp = a(k, p), akq = a(k, q);
          a(k, p) = c * akp - s * akq;
          a(k, q) = s * akp + c * akq;
        }
        for (int64_t k = 0; k < n; ++k) { // rows p, q of Jᵀ·A
          double apk = a(p, k), aqk = a(q, k);
          a(p, k) = c * apk - s * aqk;
          a(q, k) = s * apk + c * aqk;
        }
        for (int64_t k = 0; k < n; ++k) {
          double vkp = v(k, p), vkq = v(k, q);
          v(k, p) = c * vkp - s * vkq;
          v(k, q) = s * vkp + c * vkq;
        }
      }
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return a(x, x) > a(y, y); });
  Matrix sorted(n, n);
  values.assign(size_t(n), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    values[size_t(j)] = a(order[size_t(j)], order[size_t(j)]);
    for (int64_t i = 0; i < n; ++i)
      sorted(i, j) = v(i, order[size_t(j)]);
  }
  return sorted;
}

} // namespace

void galoreRefresh(const TensorView &grad, const TensorView &step,
                   const galore::RefreshParams &params, const TensorView &workspace,
                   const TensorView &projector, const TensorView &status) {
  const char *k = "galore_refresh";
  auto [m, n] = checkSide(k, "grad", grad, params.left);
  int64_t small = params.left ? m : n, large = params.left ? n : m, rank = params.rank;
  if (rank <= 0 || rank >= small)
    fail(k, "rank " + std::to_string(rank) + " is not in (0, " + std::to_string(small) + ")");
  checkF32(k, "workspace", workspace, {galore::workspaceElements(small, large, rank)});
  checkF32(k, "projector", projector, {small, rank});
  checkView(k, "status", status);
  if (status.dtype != DType::F32 || status.shape.size() != 1 || params.slot < 0 ||
      params.slot >= status.shape[0])
    fail(k, "status must be an f32 vector with slot " + std::to_string(params.slot));
  if (params.updateProjGap <= 0)
    fail(k, "update_proj_gap must be positive");
  int64_t done = loadStep(k, step);
  float *flag = static_cast<float *>(status.data) + params.slot;
  if (!galore::refreshDue(done, params.updateProjGap, params.offset, *flag, params.slot,
                          status.shape[0])) {
    *flag = galore::pendingStatus(*flag);
    return;
  }

  // A = the gradient with its smaller side first (s x l).
  Matrix a = loadMatrix(grad, !params.left);
  for (double x : a.data)
    if (!std::isfinite(x)) {
      *flag = float(galore::kNonFinite);
      return;
    }

  Matrix p(small, rank);
  if (!params.randomized) {
    std::vector<double> values;
    Matrix vectors = symmetricEigenvectors(multiply(a, false, a, true), values);
    for (int64_t i = 0; i < small; ++i)
      for (int64_t j = 0; j < rank; ++j)
        p(i, j) = vectors(i, j);
  } else {
    uint64_t key = galore::sketchKey(params.seed, params.slot, done);
    Matrix omega(large, rank);
    for (int64_t i = 0; i < large * rank; ++i)
      omega.data[size_t(i)] = galore::gaussian(key, i);
    // Y = A·Ω, then per power iteration Y = A·Aᵀ·Q with Q a basis of Y; only span(Q) and
    // the triangular relation Q = Y·T matter to the final projector (qr(Y·T) = qr(Y) for an
    // upper-triangular T with a positive diagonal), so between the products one shifted
    // CholeskyQR pass suffices to keep Y well conditioned, and only the last Y gets the full
    // orthonormalisation. Any QR of the intermediate Y (NumPy's in the reference) gives the
    // same projector.
    Matrix y = multiply(a, false, omega, false), q;
    galore::Status outcome = galore::kRefreshed;
    for (int64_t it = 0; it < params.powerIterations && outcome == galore::kRefreshed; ++it) {
      outcome = shiftedCholeskyQr(y, q);
      if (outcome == galore::kRefreshed)
        y = multiply(a, false, multiply(a, true, q, false), false);
    }
    if (outcome == galore::kRefreshed)
      outcome = orthonormalize(y, q);
    if (outcome != galore::kRefreshed) {
      *flag = float(outcome);
      return;
    }
    p = q;
  }
  if (params.randomized == false) {
    // Singular vectors are defined up to sign: the largest-magnitude entry of each is made
    // positive (the first such entry on a tie), so that references agree.
    for (int64_t j = 0; j < rank; ++j) {
      int64_t best = 0;
      for (int64_t i = 1; i < small; ++i)
        if (std::fabs(p(i, j)) > std::fabs(p(best, j)))
          best = i;
      if (p(best, j) < 0)
        for (int64_t i = 0; i < small; ++i)
          p(i, j) = -p(i, j);
    }
  }
  float *out = static_cast<float *>(projector.data);
  for (int64_t i = 0; i < small * rank; ++i)
    out[i] = float(p.data[size_t(i)]);
  *flag = float(galore::kRefreshed);
}

void galoreProject(const TensorView &grad, const TensorView &projector, bool left,
                   bool bf16Operands, const TensorView &r) {
  const char *k = "galore_project";
  auto [m, n] = checkSide(k, "grad", grad, left);
  checkView(k, "projector", projector);
  if (projector.dtype != DType::F32 || projector.shape.size() != 2 ||
      projector.shape[0] != (left ? m : n))
    fail(k, "projector shape " + formatShape(projector.shape) + " does not fit grad " +
                formatShape(grad.shape));
  int64_t rank = projector.shape[1];
  checkF32(k, "r", r, left ? std::vector<int64_t>{rank, n} : std::vector<int64_t>{m, rank});
  Matrix g = loadMatrix(grad, false), p = loadMatrix(projector, false);
  if (bf16Operands) {
    roundToBf16(g);
    roundToBf16(p);
  }
  Matrix result = left ? multiply(p, true, g, false) : multiply(g, false, p, false);
  float *out = static_cast<float *>(r.data);
  for (size_t i = 0; i < result.data.size(); ++i)
    out[i] = float(result.data[i]);
}

void galoreAdamwUpdate(const TensorView &step, const TensorView &lr, const TensorView &gradNorm,
                       const TensorView &projector, const AdamWHyper &hyper, double scale,
                       bool left, const TensorView &r, const TensorView &param, const TensorView &m,
                       const TensorView &v, const TensorView *master) {
  const char *k = "galore_adamw_update";
  auto [rows, cols] = checkSide(k, "param", param, left);
  checkView(k, "projector", projector);
  if (projector.dtype != DType::F32 || projector.shape.size() != 2 ||
      projector.shape[0] != (left ? rows : cols))
    fail(k, "projector shape " + formatShape(projector.shape) + " does not fit param " +
                formatShape(param.shape));
  int64_t rank = projector.shape[1];
  std::vector<int64_t> reduced =
      left ? std::vector<int64_t>{rank, cols} : std::vector<int64_t>{rows, rank};
  checkF32(k, "r", r, reduced);
  checkF32(k, "m", m, reduced);
  checkF32(k, "v", v, reduced);
  if (master)
    checkF32(k, "master", *master, param.shape);
  int64_t done = loadStep(k, step);
  double rate = loadScalar(k, "lr", lr), norm = loadScalar(k, "grad_norm", gradNorm);
  if (!(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0))
    fail(k, "betas are not in [0, 1)");

  // AdamW on the projection, exactly as adamwUpdate does on a full gradient (GaLore.h).
  double t = double(done) + 1.0;
  double clip = 1.0;
  if (hyper.gradClip > 0.0)
    clip = std::min(1.0, hyper.gradClip / (norm + 1e-6));
  double bc1 = 1.0 - std::pow(hyper.beta1, t), bc2Sqrt = std::sqrt(1.0 - std::pow(hyper.beta2, t));
  float *rp = static_cast<float *>(r.data), *mp = static_cast<float *>(m.data),
        *vp = static_cast<float *>(v.data);
  // N' = -lr scale N, rounded to f32 as the kernel leaves it in r; the back-projection adds
  // P·N' (in bf16 operands for a half-precision weight, as the GPU's tensor cores take them).
  Matrix delta(reduced[0], reduced[1]);
  for (int64_t i = 0; i < delta.rows * delta.cols; ++i) {
    double g = double(rp[i]) * clip;
    double mi = hyper.beta1 * double(mp[i]) + (1.0 - hyper.beta1) * g;
    double vi = hyper.beta2 * double(vp[i]) + (1.0 - hyper.beta2) * g * g;
    mp[i] = float(mi);
    vp[i] = float(vi);
    rp[i] = float(-rate * scale * (mi / bc1) / (std::sqrt(vi) / bc2Sqrt + hyper.eps));
    delta.data[size_t(i)] = double(rp[i]);
  }
  Matrix p = loadMatrix(projector, false);
  if (param.dtype != DType::F32) {
    roundToBf16(p);
    roundToBf16(delta);
  }
  Matrix update = left ? multiply(p, false, delta, false) : multiply(delta, false, p, true);
  std::vector<float> w(static_cast<size_t>(param.numel()));
  loadF32(master ? *master : param, w.data());
  double decay = 1.0 - rate * hyper.weightDecay;
  // No master copy: the decay and the step each round to the parameter's dtype, as the CUDA
  // kernel's decay and its GEMM accumulating into the bf16 parameter do.
  bool inPlace = !master && param.dtype != DType::F32;
  if (inPlace && param.dtype != DType::BF16)
    fail(k, std::string("a ") + dtypeName(param.dtype) +
                " parameter needs an f32 master copy to accumulate the update into");
  for (size_t i = 0; i < w.size(); ++i) {
    double decayed = double(w[i]) * decay;
    if (inPlace)
      decayed = double(bf16ToF32(f32ToBf16(float(decayed))));
    w[i] = float(decayed + update.data[i]);
  }
  if (master)
    storeF32(w.data(), *master);
  storeF32(w.data(), param);
}

} // namespace bonsai::rt::cpu
