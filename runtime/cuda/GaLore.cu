//===- GaLore.cu - GaLore refresh, projection and update on CUDA ----------===//
//
// The CUDA side of GaLore.h. The projection and the update are cuBLASLt GEMMs (the engine of
// the backend, fp32 accumulation) around two elementwise kernels: AdamW on the projected
// gradient R, which leaves -lr·scale·N in R, then W32 = W32·(1 - lr·wd) + P·N (or N·Pᵀ) as a
// GEMM with beta = 1 into the fp32 master (or the f32 parameter), and the master rounded into
// the parameter. For a half-precision gradient the GEMM operands (the projector and the
// direction) are rounded to the gradient's dtype first, in stream-ordered scratch, so that the
// GEMMs run on tensor cores.
//
// The refresh must fit a CUDA Graph that is replayed every step, yet run on one step in T:
// every kernel of it is launched every step, and each one first reads a gate word that the
// first kernel sets from the step counter and the status on the device; when the refresh is
// not due, every block returns at once (a few microseconds for the whole chain). cuBLASLt
// cannot be told to skip, so the refresh's GEMMs are this file's own tiled kernels (fp32
// multiply-add, 64 x 64 tiles). The randomized range finder: Ω (l x r, Gaussian from the
// sketch key) into Z, Y = A·Ω, then per power iteration Z = Aᵀ·Q and Y = A·Z, each Y
// orthonormalised as the CPU reference does (runtime/cpu/GaLore.cpp, orthonormalize): shifted
// CholeskyQR, then a rank-revealing CholeskyQR, each with an fp64 Gram matrix, an fp64
// Cholesky in one block and Q = Y·R⁻¹ with R⁻¹ in fp64; when the second pass leaves columns
// out, two more kernels (gated on that) complete them with projected unit vectors. A
// non-finite gradient (checked first), a non-finite or zero sketch stop the chain: the
// projector is kept and the status records why.
//
// Workspace (GaLore.h, galore::workspaceElements), from its first 8-byte boundary: the Gram
// matrix and R⁻¹ (r x r doubles each), Y (s x r floats), Z (l x r floats), then the gate words.
// The completion reuses them: the Gram region for S, its factor and then K, the R⁻¹ region for
// S's inverse, and Z (free once Q2 is in Y) for the column-to-unit-vector map.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/GaLore.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"
#include "GemmImpl.h"

#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;
/// What PyTorch's clip_grad_norm_ adds to the norm before dividing by it.
constexpr double kClipEpsilon = 1e-6;

/// The gate words of a refresh, at the end of its workspace.
struct Gate {
  int active;    ///< the refresh is due at this step
  int go;        ///< due, and nothing has failed yet: the heavy kernels run
  int nonFinite; ///< the gradient holds a NaN or an infinity
  int failed;    ///< galore::Status of a failure after the finite check
  int deficient; ///< the rank-revealing pass left columns out: the completion runs
};

/// The pieces of a refresh's workspace.
struct Workspace {
  double *gram, *inverse;
  float *y, *z;
  Gate *gate;
};

Workspace carve(const TensorView &workspace, int64_t small, int64_t large, int64_t rank) {
  auto base = reinterpret_cast<uintptr_t>(workspace.data);
  base = (base + 7) & ~uintptr_t(7); // at most one float of the 64 spare ones
  Workspace w;
  w.gram = reinterpret_cast<double *>(base);
  w.inverse = w.gram + rank * rank;
  w.y = reinterpret_cast<float *>(w.inverse + rank * rank);
  w.z = w.y + small * rank;
  w.gate = reinterpret_cast<Gate *>(w.z + large * rank);
  return w;
}

__global__ void beginKernel(const int64_t *step, float *status, int64_t gap, int64_t offset,
                            int64_t slot, int64_t weights, Gate *gate) {
  bool due = galore::refreshDue(*step, gap, offset, *status, slot, weights);
  gate->active = due;
  gate->go = due;
  gate->nonFinite = 0;
  gate->failed = 0;
  gate->deficient = 0;
  if (!due && *status > 0.0f)
    *status = galore::pendingStatus(*status);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) finiteKernel(const T *g, int64_t n, Gate *gate) {
  if (!gate->go)
    return;
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(toFloat(g[i]));
  // Only nonFinite is written here: other blocks still read `go`, which gateKernel closes.
  if (bad)
    gate->nonFinite = 1;
}

__global__ void gateKernel(Gate *gate) { gate->go = gate->go && !gate->nonFinite; }

/// Ω[i, j] = gaussian(key, i r + j), the key from the step counter on the device.
__global__ void __launch_bounds__(kThreads)
    sketchKernel(float *omega, int64_t count, uint64_t seed, int64_t slot, const int64_t *step,
                 const Gate *gate) {
  if (!gate->go)
    return;
  uint64_t key = galore::sketchKey(seed, slot, *step);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x)
    omega[i] = float(galore::gaussian(key, i));
}

constexpr int kTile = 64, kDepth = 16;

/// C[M, N] = op(A)·B in fp32, A of storage T with op(A)[i, k] = transA ? A[k, i] : A[i, k]
/// (row-major, leading dimension lda), B f32 [K, N] (leading dimension N); 64 x 64 tiles, 4 x 4
/// outputs per thread. Skipped when the gate is closed.
template <typename T, bool TransA>
__global__ void __launch_bounds__(kThreads)
    gemmKernel(const T *a, int64_t lda, const float *b, float *c, int64_t M, int64_t N, int64_t K,
               const Gate *gate) {
  if (!gate->go)
    return;
  __shared__ float as[kDepth][kTile + 1];
  __shared__ float bs[kDepth][kTile + 1];
  int64_t row0 = int64_t(blockIdx.y) * kTile, col0 = int64_t(blockIdx.x) * kTile;
  int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
    for (int e = threadIdx.x; e < kDepth * kTile; e += kThreads) {
      int kk, ii;
      if (TransA) { // consecutive threads walk i, contiguous in memory
        kk = e / kTile;
        ii = e % kTile;
      } else { // consecutive threads walk k
        ii = e / kDepth;
        kk = e % kDepth;
      }
      int64_t i = row0 + ii, k = k0 + kk;
      float v = 0.0f;
      if (i < M && k < K)
        v = toFloat(TransA ? a[k * lda + i] : a[i * lda + k]);
      as[kk][ii] = v;
      int jj = e % kTile, kb = e / kTile;
      int64_t j = col0 + jj, kr = k0 + kb;
      bs[kb][jj] = (j < N && kr < K) ? b[kr * N + j] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDepth; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        av[x] = as[kk][tr + 16 * x];
        bv[x] = bs[kk][tc + 16 * x];
      }
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y)
          acc[x][y] += av[x] * bv[y];
    }
    __syncthreads();
  }
#pragma unroll
  for (int x = 0; x < 4; ++x)
#pragma unroll
    for (int y = 0; y < 4; ++y) {
      int64_t i = row0 + tr + 16 * x, j = col0 + tc + 16 * y;
      if (i < M && j < N)
        c[i * N + j] = acc[x][y];
    }
}

/// gram = Yᵀ·Y in fp64 (r x r), Y f32 [s, r]; 16 x 16 tiles.
__global__ void gramKernel(const float *y, int64_t s, int64_t r, double *gram, const Gate *gate) {
  if (!gate->go)
    return;
  __shared__ double ti[16][17], tj[16][17];
  int64_t i0 = int64_t(blockIdx.y) * 16, j0 = int64_t(blockIdx.x) * 16;
  int ty = threadIdx.y, tx = threadIdx.x;
  double acc = 0.0;
  for (int64_t k0 = 0; k0 < s; k0 += 16) {
    int64_t k = k0 + ty;
    ti[ty][tx] = (k < s && i0 + tx < r) ? double(y[k * r + i0 + tx]) : 0.0;
    tj[ty][tx] = (k < s && j0 + tx < r) ? double(y[k * r + j0 + tx]) : 0.0;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk)
      acc += ti[kk][ty] * tj[kk][tx];
    __syncthreads();
  }
  if (i0 + ty < r && j0 + tx < r)
    gram[(i0 + ty) * r + j0 + tx] = acc;
}

/// In one block: the rank-revealing Cholesky factor over `a`'s upper triangle, in place
/// (runtime/cpu/GaLore.cpp, rankRevealingCholesky): column j is accepted while fewer than
/// `limit` are and its pivot exceeds `tolerance`; a column left out gets -1 on the diagonal
/// and zeros elsewhere in its row and column. Right-looking: row j of R, then the trailing
/// upper triangle loses its outer product. Returns the number accepted (to every thread).
__device__ int64_t blockCholesky(double *a, int64_t r, double tolerance, int64_t limit) {
  __shared__ int64_t count;
  if (threadIdx.x == 0)
    count = 0;
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int64_t j = 0; j < r; ++j) {
    double d = a[j * r + j];
    bool accept = count < limit && d > tolerance && isfinite(d);
    __syncthreads(); // every thread has read the pivot and the count
    if (!accept) {
      for (int64_t i = threadIdx.x; i < r; i += blockDim.x) {
        if (i < j)
          a[i * r + j] = 0.0;
        else if (i > j)
          a[j * r + i] = 0.0;
      }
      if (threadIdx.x == 0)
        a[j * r + j] = -1.0;
      __syncthreads();
      continue;
    }
    double pivot = sqrt(d);
    for (int64_t i = j + 1 + threadIdx.x; i < r; i += blockDim.x)
      a[j * r + i] /= pivot;
    __syncthreads();
    if (threadIdx.x == 0) {
      a[j * r + j] = pivot;
      ++count;
    }
    // A warp per row of the trailing triangle, its lanes along the row (coalesced).
    for (int64_t x = j + 1 + warp; x < r; x += blockDim.x / 32) {
      double rx = a[j * r + x];
      for (int64_t y = x + lane; y < r; y += 32)
        a[x * r + y] -= rx * a[j * r + y];
    }
    __syncthreads();
  }
  return count;
}

/// The Cholesky pass of one CholeskyQR step over the Gram matrix. The shifted pass (first)
/// adds Fukaya et al.'s shift (from the trace), after failing the refresh on a zero or
/// non-finite sketch, and must accept every column; the rank-revealing pass (second) leaves
/// out columns whose pivot is below galore::kRankTolerance of the largest diagonal and opens
/// the completion's gate when it does.
__global__ void __launch_bounds__(1024)
    choleskyKernel(double *gram, int64_t s, int64_t r, bool shifted, Gate *gate) {
  if (!gate->go)
    return;
  __shared__ double tolerance, shift;
  __shared__ int stop;
  if (threadIdx.x == 0) {
    double trace = 0.0, top = 0.0;
    for (int64_t i = 0; i < r; ++i) {
      trace += gram[i * r + i];
      top = fmax(top, gram[i * r + i]);
    }
    stop = 0;
    if (shifted && !isfinite(trace))
      stop = galore::kNonFinite; // the f32 sketch overflowed
    else if (shifted && trace == 0.0)
      stop = galore::kRankDeficient; // a zero sketch spans nothing
    shift = shifted ? 11.0 * double(s * r + r * (r + 1)) * 0x1p-53 * trace : 0.0;
    tolerance = shifted ? 0.0 : galore::kRankTolerance * top;
  }
  __syncthreads();
  if (stop) {
    if (threadIdx.x == 0) {
      gate->failed = stop;
      gate->go = 0;
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < r; i += blockDim.x)
    gram[i * r + i] += shift;
  __syncthreads();
  int64_t accepted = blockCholesky(gram, r, tolerance, r);
  if (threadIdx.x == 0) {
    if (shifted && accepted < r) { // never in exact arithmetic: every pivot exceeds the shift
      gate->failed = galore::kRankDeficient;
      gate->go = 0;
    }
    if (!shifted)
      gate->deficient = accepted < r;
  }
}

/// R⁻¹ (upper triangular) column by column, each an upper-triangular back substitution, a
/// column per thread; one warp per block, so that the columns spread over the multiprocessors.
__global__ void __launch_bounds__(32)
    inverseKernel(const double *factor, double *inverse, int64_t r, const Gate *gate) {
  if (!gate->go)
    return;
  int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= r)
    return;
  for (int64_t i = c + 1; i < r; ++i)
    inverse[i * r + c] = 0.0;
  inverse[c * r + c] = 1.0 / factor[c * r + c];
  for (int64_t i = c - 1; i >= 0; --i) {
    double sum = 0.0;
    for (int64_t k = i + 1; k <= c; ++k)
      sum += factor[i * r + k] * inverse[k * r + c];
    inverse[i * r + c] = -sum / factor[i * r + i];
  }
}

/// q = y·R⁻¹ ([s, r] f32 times r x r upper-triangular fp64), accumulated in fp64.
__global__ void __launch_bounds__(kThreads)
    applyInverseKernel(const float *y, const double *inverse, float *q, int64_t s, int64_t r,
                       const Gate *gate) {
  if (!gate->go)
    return;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < s * r;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = e / r, j = e % r;
    double sum = 0.0;
    for (int64_t k = 0; k <= j; ++k)
      sum += double(y[i * r + k]) * inverse[k * r + j];
    q[e] = float(sum);
  }
}

/// In one block, when the rank-revealing pass left k columns out (their R⁻¹ diagonal is -1;
/// `q` = Q2, s x r f32): S = I - Q2[0:r, acc]·Q2[0:r, acc]ᵀ (the Gram matrix of the unit vectors
/// projected off the accepted columns) into `gram`, its rank-revealing Cholesky factor taking
/// the first k with a squared residual above galore::completionTolerance, R_S⁻¹ into `inverse`,
/// then K = Q2[0:r, acc]ᵀ·R_S⁻¹ into `gram`; `target[j]` becomes the unit vector of left-out
/// column j (-1 for an accepted one). Fails the refresh if fewer than k are found (never in
/// exact arithmetic: GaLore.h, completionTolerance).
__global__ void __launch_bounds__(1024)
    completionKernel(const float *q, int64_t s, int64_t r, double *gram, double *inverse,
                     int *target, Gate *gate) {
  if (!gate->go || !gate->deficient)
    return;
  __shared__ int64_t missing;
  if (threadIdx.x == 0) {
    missing = 0;
    for (int64_t j = 0; j < r; ++j)
      if (inverse[j * r + j] < 0.0) {
        target[j] = 0; // left out: its unit vector is set below
        ++missing;
      } else {
        target[j] = -1;
      }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < r * r; e += blockDim.x) {
    int64_t x = e / r, i = e % r;
    double v = x == i ? 1.0 : 0.0;
    for (int64_t p = 0; p < r; ++p)
      if (target[p] < 0)
        v -= double(q[x * r + p]) * double(q[i * r + p]);
    gram[e] = v;
  }
  __syncthreads();
  int64_t found = blockCholesky(gram, r, galore::completionTolerance(r), missing);
  // R_S⁻¹, a column per thread (an upper-triangular back substitution).
  for (int64_t c = threadIdx.x; c < r; c += blockDim.x) {
    for (int64_t i = c + 1; i < r; ++i)
      inverse[i * r + c] = 0.0;
    inverse[c * r + c] = 1.0 / gram[c * r + c];
    for (int64_t i = c - 1; i >= 0; --i) {
      double sum = 0.0;
      for (int64_t k = i + 1; k <= c; ++k)
        sum += gram[i * r + k] * inverse[k * r + c];
      inverse[i * r + c] = -sum / gram[i * r + i];
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < r * r; e += blockDim.x) { // K[p, i]
    int64_t p = e / r, i = e % r;
    double sum = 0.0;
    if (target[p] < 0)
      for (int64_t k = 0; k <= i; ++k)
        sum += double(q[k * r + p]) * inverse[k * r + i];
    gram[e] = sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t i = 0;
    for (int64_t j = 0; j < r; ++j) {
      if (target[j] < 0)
        continue;
      while (i < r && inverse[i * r + i] < 0.0)
        ++i;
      target[j] = int(i < r ? i++ : 0);
    }
    if (found < missing) {
      gate->failed = galore::kRankDeficient;
      gate->go = 0;
    }
  }
}

/// The left-out columns of Q2: column j (unit vector i = target[j]) becomes
/// R_S⁻¹[x, i] (x < r) - Σ_{p accepted} Q2[x, p]·K[p, i]. Reads accepted columns only.
__global__ void __launch_bounds__(kThreads)
    completeKernel(float *q, int64_t s, int64_t r, const double *k, const double *inverse,
                   const int *target, const Gate *gate) {
  if (!gate->go || !gate->deficient)
    return;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < s * r;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t x = e / r, j = e % r;
    int i = target[j];
    if (i < 0)
      continue;
    double v = x < r ? inverse[x * r + i] : 0.0;
    for (int64_t p = 0; p < r; ++p)
      if (target[p] < 0)
        v -= double(q[x * r + p]) * k[p * r + i];
    q[e] = float(v);
  }
}

/// The end of a due refresh: the projector from Y and a clear status, or the status of the
/// failure with the projector as it was.
__global__ void __launch_bounds__(kThreads)
    finishKernel(const float *y, float *projector, int64_t count, float *status, const Gate *gate) {
  if (!gate->active)
    return;
  if (gate->nonFinite || gate->failed) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      *status = float(gate->nonFinite ? galore::kNonFinite : gate->failed);
    return;
  }
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x)
    projector[i] = y[i];
  if (blockIdx.x == 0 && threadIdx.x == 0)
    *status = float(galore::kRefreshed);
}

/// Launches op(A)·B into C through gemmKernel for A of the gradient's dtype.
template <typename T>
void launchGemm(const char *k, Stream stream, const T *a, int64_t lda, bool transA, const float *b,
                float *c, int64_t m, int64_t n, int64_t kk, const Gate *gate) {
  dim3 grid(unsigned((n + kTile - 1) / kTile), unsigned((m + kTile - 1) / kTile));
  if (transA)
    gemmKernel<T, true><<<grid, kThreads, 0, stream>>>(a, lda, b, c, m, n, kk, gate);
  else
    gemmKernel<T, false><<<grid, kThreads, 0, stream>>>(a, lda, b, c, m, n, kk, gate);
  checkLaunch(k, "gemmKernel");
}

/// Y (in place) = the orthonormal factor of Y (runtime/cpu/GaLore.cpp, orthonormalize):
/// shifted CholeskyQR into `scratch`, the rank-revealing CholeskyQR back into Y, and the
/// completion of the columns it left out (two kernels that return at once when none was).
void orthonormalize(const char *k, Stream stream, const Workspace &w, float *y, float *scratch,
                    int64_t s, int64_t r) {
  dim3 tiles(unsigned((r + 15) / 16), unsigned((r + 15) / 16)), block(16, 16);
  unsigned grid = gridFor(k, s * r, kThreads);
  for (int pass = 0; pass < 2; ++pass) {
    const float *from = pass == 0 ? y : scratch;
    float *to = pass == 0 ? scratch : y;
    gramKernel<<<tiles, block, 0, stream>>>(from, s, r, w.gram, w.gate);
    checkLaunch(k, "gramKernel");
    choleskyKernel<<<1, 1024, 0, stream>>>(w.gram, s, r, pass == 0, w.gate);
    checkLaunch(k, "choleskyKernel");
    inverseKernel<<<unsigned((r + 31) / 32), 32, 0, stream>>>(w.gram, w.inverse, r, w.gate);
    checkLaunch(k, "inverseKernel");
    applyInverseKernel<<<grid, kThreads, 0, stream>>>(from, w.inverse, to, s, r, w.gate);
    checkLaunch(k, "applyInverseKernel");
  }
  // Z holds Q1, no longer needed: its first r ints become the column map.
  int *target = reinterpret_cast<int *>(scratch);
  completionKernel<<<1, 1024, 0, stream>>>(y, s, r, w.gram, w.inverse, target, w.gate);
  checkLaunch(k, "completionKernel");
  completeKernel<<<grid, kThreads, 0, stream>>>(y, s, r, w.gram, w.inverse, target, w.gate);
  checkLaunch(k, "completeKernel");
}

template <typename T>
void refreshTyped(const char *k, Stream stream, const T *g, int64_t m, int64_t n,
                  const galore::RefreshParams &p, const Workspace &w, const int64_t *step) {
  bool left = p.left;
  int64_t s = left ? m : n, l = left ? n : m, r = p.rank;
  finiteKernel<T><<<gridFor(k, m * n, kThreads), kThreads, 0, stream>>>(g, m * n, w.gate);
  checkLaunch(k, "finiteKernel");
  gateKernel<<<1, 1, 0, stream>>>(w.gate);
  checkLaunch(k, "gateKernel");
  sketchKernel<<<gridFor(k, l * r, kThreads), kThreads, 0, stream>>>(w.z, l * r, p.seed, p.slot,
                                                                     step, w.gate);
  checkLaunch(k, "sketchKernel");
  // A = G (left: s = m rows of n) or Gᵀ (right: G is l x s). A·X reads G untransposed on the
  // left, transposed on the right; Aᵀ·X the other way round.
  launchGemm(k, stream, g, n, !left, w.z, w.y, s, r, l, w.gate); // Y = A·Ω
  orthonormalize(k, stream, w, w.y, w.z, s, r);
  for (int64_t it = 0; it < p.powerIterations; ++it) {
    launchGemm(k, stream, g, n, left, w.y, w.z, l, r, s, w.gate);  // Z = Aᵀ·Q
    launchGemm(k, stream, g, n, !left, w.z, w.y, s, r, l, w.gate); // Y = A·Z
    orthonormalize(k, stream, w, w.y, w.z, s, r);
  }
}

struct AdamArgs {
  const int64_t *step;
  const void *lr, *gradNorm;
  DType lrType, normType;
  double beta1, beta2, eps, gradClip, scale;
};

/// AdamW on R (f32, in place with m and v), leaving -lr·scale·N in R.
__global__ void __launch_bounds__(kThreads)
    adamKernel(float *r, float *m, float *v, int64_t n, AdamArgs a) {
  __shared__ float clip, stepSize, bc2Sqrt;
  if (threadIdx.x == 0) {
    double t = double(*a.step) + 1.0;
    double rate = double(loadScalar(a.lr, a.lrType));
    double norm = double(loadScalar(a.gradNorm, a.normType));
    clip = a.gradClip > 0.0 ? float(fmin(1.0, a.gradClip / (norm + kClipEpsilon))) : 1.0f;
    stepSize = float(rate * a.scale / (1.0 - pow(a.beta1, t)));
    bc2Sqrt = float(sqrt(1.0 - pow(a.beta2, t)));
  }
  __syncthreads();
  const float b1 = float(a.beta1), b2 = float(a.beta2), eps = float(a.eps);
  const float c1 = float(1.0 - a.beta1), c2 = float(1.0 - a.beta2);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float g = r[i] * clip;
    float mi = b1 * m[i] + c1 * g, vi = b2 * v[i] + c2 * g * g;
    m[i] = mi;
    v[i] = vi;
    r[i] = -stepSize * mi / (sqrtf(vi) / bc2Sqrt + eps);
  }
}

/// w *= 1 - lr·wd (the decoupled weight decay, before the low-rank step is added).
__global__ void __launch_bounds__(kThreads)
    decayKernel(float *w, int64_t n, const void *lr, DType lrType, double weightDecay) {
  float decay = float(1.0 - double(loadScalar(lr, lrType)) * weightDecay);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    w[i] *= decay;
}

/// dst (dtype T) = src (dtype S), for the half-precision GEMM operands.
template <typename S, typename T>
__global__ void __launch_bounds__(kThreads) roundKernel(const S *src, T *dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = fromFloat<T>(toFloat(src[i]));
}

template <typename S>
void launchRound(const char *k, Stream stream, const S *src, void *dst, DType to, int64_t n) {
  unsigned grid = gridFor(k, n, kThreads);
  if (to == DType::BF16)
    roundKernel<<<grid, kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16 *>(dst), n);
  else
    roundKernel<<<grid, kThreads, 0, stream>>>(src, static_cast<__half *>(dst), n);
  checkLaunch(k, "roundKernel");
}

/// The float tensor `t` in dtype `to` (bf16 or f16; stream-ordered scratch kept alive by
/// `keep`), or t's own data when it already has that dtype.
const void *operandIn(const char *k, Stream stream, const TensorView &t, DType to,
                      std::vector<Scratch> &keep) {
  if (t.dtype == to)
    return t.data;
  if (to == DType::F32)
    fail(k, std::string("no f32 copy of a ") + dtypeName(t.dtype) + " operand");
  keep.emplace_back(k, stream, size_t(t.numel()) * dtypeSize(to));
  void *dst = keep.back().get();
  switch (t.dtype) {
  case DType::BF16:
    launchRound(k, stream, static_cast<const __nv_bfloat16 *>(t.data), dst, to, t.numel());
    break;
  case DType::F16:
    launchRound(k, stream, static_cast<const __half *>(t.data), dst, to, t.numel());
    break;
  default:
    launchRound(k, stream, static_cast<const float *>(t.data), dst, to, t.numel());
    break;
  }
  return dst;
}

void checkF32(const char *k, const char *operand, const TensorView &t,
              const std::vector<int64_t> &shape) {
  checkView(k, operand, t);
  if (t.dtype != DType::F32)
    fail(k, std::string(operand) + " must be f32, not " + dtypeName(t.dtype));
  checkShape(k, operand, t, shape, "");
}

/// The gradient's sides, checked against `left`.
std::pair<int64_t, int64_t> checkSide(const char *k, const char *operand, const TensorView &t,
                                      bool left) {
  checkFloat(k, operand, t);
  if (t.shape.size() != 2)
    fail(k, std::string(operand) + " shape " + formatShape(t.shape) + " is not 2-D");
  if ((left && t.shape[0] > t.shape[1]) || (!left && t.shape[0] < t.shape[1]))
    fail(k, std::string("the ") + (left ? "left" : "right") + " side of " + formatShape(t.shape) +
                " is not its smaller side");
  return {t.shape[0], t.shape[1]};
}

} // namespace

void galoreRefresh(const Context &ctx, const TensorView &grad, const TensorView &step,
                   const galore::RefreshParams &params, const TensorView &workspace,
                   const TensorView &projector, const TensorView &status) {
  const char *k = "galore_refresh";
  if (!params.randomized)
    fail(k, "the exact (\"svd\") GaLore projector is not available on the CUDA backend; "
            "compile the plan with projector \"randomized\"");
  auto [m, n] = checkSide(k, "grad", grad, params.left);
  int64_t small = params.left ? m : n, large = params.left ? n : m, r = params.rank;
  if (r <= 0 || r >= small)
    fail(k, "rank " + std::to_string(r) + " is not in (0, " + std::to_string(small) + ")");
  checkF32(k, "workspace", workspace, {galore::workspaceElements(small, large, r)});
  checkF32(k, "projector", projector, {small, r});
  checkView(k, "status", status);
  if (status.dtype != DType::F32 || status.shape.size() != 1 || params.slot < 0 ||
      params.slot >= status.shape[0])
    fail(k, "status must be an f32 vector with slot " + std::to_string(params.slot));
  if (step.dtype != DType::I64 || step.numel() != 1)
    fail(k, "step must be an i64 scalar");
  if (params.updateProjGap <= 0)
    fail(k, "update_proj_gap must be positive");

  Workspace w = carve(workspace, small, large, r);
  const auto *stepPtr = static_cast<const int64_t *>(step.data);
  float *slot = static_cast<float *>(status.data) + params.slot;
  beginKernel<<<1, 1, 0, ctx.stream>>>(stepPtr, slot, params.updateProjGap, params.offset,
                                       params.slot, status.shape[0], w.gate);
  checkLaunch(k, "beginKernel");
  switch (grad.dtype) {
  case DType::BF16:
    refreshTyped(k, ctx.stream, static_cast<const __nv_bfloat16 *>(grad.data), m, n, params, w,
                 stepPtr);
    break;
  case DType::F16:
    refreshTyped(k, ctx.stream, static_cast<const __half *>(grad.data), m, n, params, w, stepPtr);
    break;
  default:
    refreshTyped(k, ctx.stream, static_cast<const float *>(grad.data), m, n, params, w, stepPtr);
    break;
  }
  finishKernel<<<gridFor(k, small * r, kThreads), kThreads, 0, ctx.stream>>>(
      w.y, static_cast<float *>(projector.data), small * r, slot, w.gate);
  checkLaunch(k, "finishKernel");
}

void galoreProject(const Context &ctx, const TensorView &grad, const TensorView &projector,
                   bool left, bool bf16Operands, const TensorView &r) {
  const char *k = "galore_project";
  auto [m, n] = checkSide(k, "grad", grad, left);
  checkView(k, "projector", projector);
  if (projector.dtype != DType::F32 || projector.shape.size() != 2 ||
      projector.shape[0] != (left ? m : n))
    fail(k, "projector shape " + formatShape(projector.shape) + " does not fit grad " +
                formatShape(grad.shape));
  int64_t rank = projector.shape[1];
  checkF32(k, "r", r, left ? std::vector<int64_t>{rank, n} : std::vector<int64_t>{m, rank});
  // The GEMM runs in the gradient's dtype, or in bf16 (tensor cores) for a half-precision
  // weight whose gradient is accumulated in f32.
  DType operands = bf16Operands ? DType::BF16 : grad.dtype;
  std::vector<Scratch> keep;
  const void *g = operandIn(k, ctx.stream, grad, operands, keep);
  const void *p = operandIn(k, ctx.stream, projector, operands, keep);
  GemmCall call;
  call.abType = operands;
  call.cType = DType::F32;
  if (left) { // R [r, n] = Pᵀ·G
    call.transA = true;
    call.m = rank;
    call.n = n;
    call.k = m;
    call.a = p;
    call.b = g;
  } else { // R [m, r] = G·P
    call.m = m;
    call.n = rank;
    call.k = n;
    call.a = g;
    call.b = p;
  }
  call.c = r.data;
  ltEngineOf(k, *ctx.gemm).run(k, ctx.stream, call);
}

void galoreAdamwUpdate(const Context &ctx, const TensorView &step, const TensorView &lr,
                       const TensorView &gradNorm, const TensorView &projector,
                       const cpu::AdamWHyper &hyper, double scale, bool left, const TensorView &r,
                       const TensorView &param, const TensorView &m, const TensorView &v,
                       const TensorView *master) {
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
  else if (param.dtype != DType::F32)
    fail(k, std::string("a ") + dtypeName(param.dtype) +
                " parameter needs an f32 master copy to accumulate the update into");
  if (step.dtype != DType::I64 || step.numel() != 1)
    fail(k, "step must be an i64 scalar");
  checkScalar(k, "lr", lr);
  checkScalar(k, "grad_norm", gradNorm);

  AdamArgs a{static_cast<const int64_t *>(step.data),
             lr.data,
             gradNorm.data,
             lr.dtype,
             gradNorm.dtype,
             hyper.beta1,
             hyper.beta2,
             hyper.eps,
             hyper.gradClip,
             scale};
  int64_t count = r.numel();
  adamKernel<<<gridFor(k, count, kThreads), kThreads, 0, ctx.stream>>>(
      static_cast<float *>(r.data), static_cast<float *>(m.data), static_cast<float *>(v.data),
      count, a);
  checkLaunch(k, "adamKernel");
  const TensorView &w32 = master ? *master : param;
  if (hyper.weightDecay != 0.0) {
    decayKernel<<<gridFor(k, w32.numel(), kThreads), kThreads, 0, ctx.stream>>>(
        static_cast<float *>(w32.data), w32.numel(), lr.data, lr.dtype, hyper.weightDecay);
    checkLaunch(k, "decayKernel");
  }
  // Half-precision models run the GEMM on tensor cores: operands in bf16 (f16 is too narrow
  // for an unscaled direction), the sum accumulated into the fp32 master.
  DType operands = param.dtype == DType::F32 ? DType::F32 : DType::BF16;
  std::vector<Scratch> keep;
  const void *p = operandIn(k, ctx.stream, projector, operands, keep);
  const void *direction = operandIn(k, ctx.stream, r, operands, keep);
  GemmCall call;
  call.abType = operands;
  call.cType = DType::F32;
  call.m = rows;
  call.n = cols;
  call.k = rank;
  call.beta = 1.0f;
  if (left) { // W += P·N'
    call.a = p;
    call.b = direction;
  } else { // W += N'·Pᵀ
    call.a = direction;
    call.b = p;
    call.transB = true;
  }
  call.c = w32.data;
  ltEngineOf(k, *ctx.gemm).run(k, ctx.stream, call);
  if (master)
    cuda::cast(ctx, *master, param);
}

} // namespace bonsai::rt::cuda
