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
// The refresh must fit a CUDA Graph that is replayed every step, yet run on one step in T. Its
// first kernel decides on the device, from the step counter and the status, whether it is
// due; inside a graph it sets the condition of an if-node that holds the rest of the refresh
// (captureIfDue), so a refresh that is not due costs that one kernel; outside a graph the host
// reads the decision. Within a due refresh a gate word still stops the chain early: a
// non-finite gradient (checked first), or a non-finite or zero sketch, keeps the projector
// and the status records why. The randomized range finder: Ω (l x r, Gaussian from the
// sketch key) into Z, Y = A·Ω, then per power iteration Z = Aᵀ·Q and Y = A·Z (this file's
// tiled fp32 GEMMs, which read the gradient in its own dtype; not cuBLASLt, whose closed
// kernels failed in the if-node's body under compute-sanitizer's synccheck and memcheck,
// docs/reliability.md), Y kept well
// conditioned between the products by a shifted CholeskyQR pass and the last Y orthonormalised
// as the CPU reference does (runtime/cpu/GaLore.cpp, orthonormalize): shifted CholeskyQR, then a rank-revealing
// CholeskyQR, each with an fp64 Gram matrix, a blocked fp64 Cholesky factorisation, R⁻¹ in
// fp64 and Q = Y·R⁻¹; when the second pass leaves columns out, the completion's kernels
// (gated on that) replace them with projected unit vectors.
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
#include <type_traits>

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
  int missing;   ///< how many it left out
  int limit;     ///< the current factorisation accepts at most this many columns
  int accepted;  ///< and has accepted this many so far
  double tolerance; ///< a pivot it accepts exceeds this
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
  auto gate = reinterpret_cast<uintptr_t>(w.z + large * rank);
  w.gate = reinterpret_cast<Gate *>((gate + 7) & ~uintptr_t(7)); // for its double
  static_assert(sizeof(Gate) <= 60 * sizeof(float), "the gate outgrew its workspace");
  return w;
}

/// Opens the gate when the refresh is due; inside a CUDA Graph it also sets the condition of
/// the if-node that holds the rest of the refresh.
__global__ void beginKernel(const int64_t *step, float *status, int64_t gap, int64_t offset,
                            int64_t slot, int64_t weights, Gate *gate,
                            cudaGraphConditionalHandle condition, bool conditional) {
  bool due = galore::refreshDue(*step, gap, offset, *status, slot, weights);
  if (conditional)
    cudaGraphSetConditional(condition, due ? 1u : 0u);
  gate->active = due;
  gate->go = due;
  gate->nonFinite = 0;
  gate->failed = 0;
  gate->deficient = 0;
  gate->missing = 0;
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

/// Ω[i, j] = gaussian(key, i r + j), the key from the step counter on the device. Not gated,
/// so Ω is defined whatever the gate says (a refresh costs it once; no product reads it
/// when the gate is closed).
__global__ void __launch_bounds__(kThreads)
    sketchKernel(float *omega, int64_t count, uint64_t seed, int64_t slot, const int64_t *step) {
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

/// The Cholesky factorisations of a refresh work on an r x r fp64 matrix's upper triangle, in
/// place, blocked by panels of kPanel columns so that the work spreads over the
/// multiprocessors (a single block doing all of it took 6.7 ms at r = 512, most of a refresh):
/// the panel's diagonal block in one block's shared memory, the panel's rows of R right of it
/// by a triangular solve (a column per thread), and the trailing triangle's update by tiles.
/// Column by column they compute what the right-looking loop of the CPU reference computes
/// (runtime/cpu/GaLore.cpp, rankRevealingCholesky): column j is accepted while fewer than the
/// limit are and its pivot exceeds the tolerance; a column left out gets -1 on the diagonal
/// and zeros elsewhere in its row and column.
constexpr int kPanel = 32;

/// What a factorisation is for, which fixes its shift, tolerance, limit and gate.
enum class Factorisation {
  Shifted,        ///< CholeskyQR's first pass: Fukaya's shift, every column must be accepted
  RankRevealing,  ///< the second pass: columns below kRankTolerance of the top are left out
  Completion,     ///< the completion's S: an absolute tolerance, at most `missing` columns
};

/// A completion's kernels run only when the rank-revealing pass left columns out.
__device__ bool gateOpen(const Gate *gate, bool completion) {
  return gate->go && (!completion || gate->deficient);
}

/// Sets the factorisation's tolerance and limit; the shifted pass first fails the refresh on
/// a zero or non-finite sketch and adds the shift (from the trace) to the diagonal.
__global__ void __launch_bounds__(kThreads)
    choleskyBeginKernel(double *a, int64_t s, int64_t r, Factorisation kind, Gate *gate) {
  bool completion = kind == Factorisation::Completion;
  if (!gateOpen(gate, completion))
    return;
  __shared__ double sums[kThreads], tops[kThreads];
  __shared__ double shift;
  __shared__ int stop;
  double trace = 0.0, top = 0.0;
  for (int64_t i = threadIdx.x; i < r; i += blockDim.x) {
    trace += a[i * r + i];
    top = fmax(top, a[i * r + i]);
  }
  sums[threadIdx.x] = trace;
  tops[threadIdx.x] = top;
  __syncthreads();
  if (threadIdx.x == 0) {
    // In thread order, so that the shift does not depend on the scheduling.
    for (int t = 1; t < kThreads; ++t) {
      trace += sums[t];
      top = fmax(top, tops[t]);
    }
    bool shifted = kind == Factorisation::Shifted;
    stop = 0;
    if (shifted && !isfinite(trace))
      stop = galore::kNonFinite; // the f32 sketch overflowed
    else if (shifted && trace == 0.0)
      stop = galore::kRankDeficient; // a zero sketch spans nothing
    shift = shifted ? 11.0 * double(s * r + r * (r + 1)) * 0x1p-53 * trace : 0.0;
    gate->tolerance = kind == Factorisation::Shifted         ? 0.0
                      : kind == Factorisation::RankRevealing ? galore::kRankTolerance * top
                                                             : galore::completionTolerance(r);
    gate->limit = completion ? gate->missing : int(r);
    gate->accepted = 0;
    if (stop) {
      gate->failed = stop;
      gate->go = 0;
    }
  }
  __syncthreads();
  if (stop || shift == 0.0)
    return;
  for (int64_t i = threadIdx.x; i < r; i += blockDim.x)
    a[i * r + i] += shift;
}

/// The diagonal block of the panel at k0, factored column by column in shared memory, a thread
/// per element; a column left out is also cleared in the rows above the block.
__global__ void __launch_bounds__(kPanel *kPanel)
    choleskyDiagonalKernel(double *a, int64_t r, int64_t k0, bool completion, Gate *gate) {
  if (!gateOpen(gate, completion))
    return;
  __shared__ double d[kPanel][kPanel + 1];
  __shared__ int accepted, limit;
  __shared__ double tolerance;
  const int b = int(r - k0 < kPanel ? r - k0 : kPanel);
  const int ty = threadIdx.y, tx = threadIdx.x;
  d[ty][tx] = ty <= tx && tx < b ? a[(k0 + ty) * r + k0 + tx] : 0.0;
  if (ty == 0 && tx == 0) {
    accepted = gate->accepted;
    limit = gate->limit;
    tolerance = gate->tolerance;
  }
  __syncthreads();
  for (int jj = 0; jj < b; ++jj) {
    double pivotSquared = d[jj][jj];
    bool accept = accepted < limit && pivotSquared > tolerance && isfinite(pivotSquared);
    __syncthreads(); // every thread has read the pivot and the count
    if (!accept) {
      if (ty == jj && tx != jj)
        d[jj][tx] = 0.0;
      if (tx == jj && ty != jj)
        d[ty][jj] = 0.0;
      if (ty == jj && tx == jj)
        d[jj][jj] = -1.0;
      for (int64_t i = ty * kPanel + tx; i < k0; i += kPanel * kPanel)
        a[i * r + k0 + jj] = 0.0;
      __syncthreads();
      continue;
    }
    double pivot = sqrt(pivotSquared);
    if (ty == jj && tx > jj)
      d[jj][tx] /= pivot;
    __syncthreads();
    if (ty > jj && tx >= ty && tx < b)
      d[ty][tx] -= d[jj][ty] * d[jj][tx];
    if (ty == jj && tx == jj) {
      d[jj][jj] = pivot;
      ++accepted;
    }
    __syncthreads();
  }
  if (ty <= tx && tx < b)
    a[(k0 + ty) * r + k0 + tx] = d[ty][tx];
  if (ty == 0 && tx == 0)
    gate->accepted = accepted;
}

/// The panel's rows of R right of its diagonal block: R12 = R11⁻ᵀ·A12, a column per thread (a
/// row left out stays zero).
__global__ void __launch_bounds__(128)
    choleskyPanelKernel(double *a, int64_t r, int64_t k0, bool completion, const Gate *gate) {
  if (!gateOpen(gate, completion))
    return;
  __shared__ double d[kPanel][kPanel];
  const int b = int(r - k0 < kPanel ? r - k0 : kPanel);
  for (int e = threadIdx.x; e < kPanel * kPanel; e += blockDim.x) {
    int i = e / kPanel, j = e % kPanel;
    d[i][j] = i <= j && j < b ? a[(k0 + i) * r + k0 + j] : 0.0;
  }
  __syncthreads();
  int64_t c = k0 + b + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= r)
    return;
  double x[kPanel];
#pragma unroll
  for (int jj = 0; jj < kPanel; ++jj)
    x[jj] = jj < b ? a[(k0 + jj) * r + c] : 0.0;
#pragma unroll
  for (int jj = 0; jj < kPanel; ++jj) {
    if (jj >= b)
      break;
    if (d[jj][jj] < 0.0) {
      x[jj] = 0.0;
      continue;
    }
    double sum = x[jj];
#pragma unroll
    for (int ii = 0; ii < jj; ++ii)
      sum -= d[ii][jj] * x[ii];
    x[jj] = sum / d[jj][jj];
  }
#pragma unroll
  for (int jj = 0; jj < kPanel; ++jj)
    if (jj < b)
      a[(k0 + jj) * r + c] = x[jj];
}

/// The trailing upper triangle loses the panel's outer products: A22 -= R12ᵀ·R12, by 32 x 32
/// tiles (those wholly below the diagonal return at once).
__global__ void __launch_bounds__(1024)
    choleskyTrailingKernel(double *a, int64_t r, int64_t k0, bool completion, const Gate *gate) {
  if (!gateOpen(gate, completion) || blockIdx.y > blockIdx.x)
    return;
  __shared__ double rows[kPanel][33], cols[kPanel][33];
  const int b = int(r - k0 < kPanel ? r - k0 : kPanel);
  int64_t base = k0 + b;
  int64_t x0 = base + int64_t(blockIdx.y) * 32, y0 = base + int64_t(blockIdx.x) * 32;
  int tx = threadIdx.x, ty = threadIdx.y;
  rows[ty][tx] = ty < b && x0 + tx < r ? a[(k0 + ty) * r + x0 + tx] : 0.0;
  cols[ty][tx] = ty < b && y0 + tx < r ? a[(k0 + ty) * r + y0 + tx] : 0.0;
  __syncthreads();
  int64_t x = x0 + ty, y = y0 + tx;
  if (x >= r || y >= r || y < x)
    return;
  double sum = 0.0;
#pragma unroll
  for (int p = 0; p < kPanel; ++p)
    sum += rows[p][ty] * cols[p][tx];
  a[x * r + y] -= sum;
}

/// The rank-revealing pass records whether it left columns out (the completion's gate) and
/// how many; the shifted pass must have accepted every column (it does in exact arithmetic:
/// every pivot exceeds the shift).
__global__ void choleskyEndKernel(int64_t r, Factorisation kind, Gate *gate) {
  if (!gateOpen(gate, kind == Factorisation::Completion))
    return;
  if (kind == Factorisation::Shifted && gate->accepted < r) {
    gate->failed = galore::kRankDeficient;
    gate->go = 0;
  } else if (kind == Factorisation::RankRevealing) {
    gate->deficient = gate->accepted < r;
    gate->missing = int(r) - gate->accepted;
  }
}

/// Factors `a` (r x r, upper triangle) in place: see Factorisation.
void cholesky(const char *k, Stream stream, double *a, int64_t s, int64_t r, Factorisation kind,
              Gate *gate) {
  bool completion = kind == Factorisation::Completion;
  choleskyBeginKernel<<<1, kThreads, 0, stream>>>(a, s, r, kind, gate);
  checkLaunch(k, "choleskyBeginKernel");
  for (int64_t k0 = 0; k0 < r; k0 += kPanel) {
    choleskyDiagonalKernel<<<1, dim3(kPanel, kPanel), 0, stream>>>(a, r, k0, completion, gate);
    checkLaunch(k, "choleskyDiagonalKernel");
    int64_t rest = r - std::min<int64_t>(kPanel, r - k0) - k0;
    if (rest <= 0)
      continue;
    choleskyPanelKernel<<<unsigned((rest + 127) / 128), 128, 0, stream>>>(a, r, k0, completion,
                                                                          gate);
    checkLaunch(k, "choleskyPanelKernel");
    unsigned tiles = unsigned((rest + 31) / 32);
    choleskyTrailingKernel<<<dim3(tiles, tiles), dim3(32, 32), 0, stream>>>(a, r, k0, completion,
                                                                            gate);
    checkLaunch(k, "choleskyTrailingKernel");
  }
  choleskyEndKernel<<<1, 1, 0, stream>>>(r, kind, gate);
  checkLaunch(k, "choleskyEndKernel");
}

/// R⁻¹ (upper triangular) of a factor, a warp per column c, by chunks of 32 rows from the
/// bottom: the part of each row's sum over the entries already known (a product whose loads
/// do not wait on each other, the lanes along the row and a shuffle reduction per row), then
/// the chunk's own 32 x 32 triangle in registers, a lane per row. (A lane per column, or a
/// row at a time, waits on a load for every one of the column's up to r dependent steps:
/// 4.5 and 0.47 ms at r = 512.)
__global__ void __launch_bounds__(32)
    inverseKernel(const double *factor, double *inverse, int64_t r, bool completion,
                  const Gate *gate) {
  if (!gateOpen(gate, completion))
    return;
  extern __shared__ double column[];
  const int64_t c = blockIdx.x;
  const int lane = threadIdx.x;
  for (int64_t i = lane; i < r; i += 32)
    column[i] = i == c ? 1.0 / factor[c * r + c] : 0.0;
  __syncwarp();
  for (int64_t hi = c; hi > 0; hi -= 32) {
    const int64_t lo = hi >= 32 ? hi - 32 : 0;
    const int rows = int(hi - lo);
    // mine = Σ_{k ≥ hi} factor[lo + lane, k]·x[k] (x[k] known) for lane `lane`'s row: the
    // lanes walk k, each with the 32 rows' partial sums (32 independent loads a step).
    double partial[32];
#pragma unroll
    for (int row = 0; row < 32; ++row)
      partial[row] = 0.0;
    for (int64_t k = hi + lane; k <= c; k += 32) {
      double known = column[k];
#pragma unroll
      for (int row = 0; row < 32; ++row)
        if (row < rows)
          partial[row] += factor[(lo + row) * r + k] * known;
    }
    double mine = 0.0;
#pragma unroll
    for (int row = 0; row < 32; ++row) {
      double sum = partial[row];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == row)
        mine = sum;
    }
    // The chunk's triangle: lane l holds row lo + l of it, from the diagonal on (the factor's
    // strict lower triangle is never written: compute-sanitizer's initcheck).
    double f[32];
#pragma unroll
    for (int j = 0; j < 32; ++j)
      f[j] = lane < rows && j < rows && j >= lane ? factor[(lo + lane) * r + lo + j] : 0.0;
    // Each lane's reciprocal diagonal, so that the sequential steps below only multiply.
    double reciprocal = 0.0;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      if (lane == j && j < rows)
        reciprocal = 1.0 / f[j];
#pragma unroll
    for (int j = 31; j >= 0; --j) {
      if (j >= rows)
        continue;
      double x = __shfl_sync(0xffffffffu, -mine * reciprocal, j);
      if (lane == j)
        column[lo + j] = x;
      if (lane < j)
        mine += f[j] * x;
    }
    __syncwarp();
  }
  for (int64_t i = lane; i < r; i += 32)
    inverse[i * r + c] = column[i];
}

void launchInverse(const char *k, Stream stream, const double *factor, double *inverse,
                   int64_t r, bool completion, const Gate *gate) {
  size_t bytes = size_t(r) * sizeof(double);
  if (bytes > 48 * 1024) {
    if (bytes > maxDynamicSharedMemory(k))
      fail(k, "rank " + std::to_string(r) + " needs " + std::to_string(bytes) +
                  " bytes of shared memory per column of R⁻¹, more than this device has");
    checkCuda(cudaFuncSetAttribute(inverseKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(bytes)),
              "cudaFuncSetAttribute", k);
  }
  inverseKernel<<<unsigned(r), 32, bytes, stream>>>(factor, inverse, r, completion, gate);
  checkLaunch(k, "inverseKernel");
}

/// The two fp64 products of a CholeskyQR pass over Y (f32 [s, r]), by Tile x Tile output
/// tiles with (Tile / 16)² outputs per thread: the Gram matrix YᵀY (`Gram`; only its upper
/// triangle, the one the factorisation reads, so the tiles below the diagonal return at once)
/// into `gram`, or Q = Y·R⁻¹ (R⁻¹ upper triangular, so a tile's sum stops at its last column)
/// into `q`.
template <bool Gram, int Tile>
__global__ void __launch_bounds__(kThreads)
    choleskyQrProductKernel(const float *y, const double *inverse, double *gram, float *q,
                            int64_t s, int64_t r, const Gate *gate) {
  constexpr int kPer = Tile / 16;
  int64_t row0 = int64_t(blockIdx.y) * Tile, col0 = int64_t(blockIdx.x) * Tile;
  if (!gate->go || (Gram && row0 > col0))
    return;
  __shared__ double as[kDepth][Tile + 1], bs[kDepth][Tile + 1];
  const int64_t rows = Gram ? r : s;
  const int64_t depth = Gram ? s : (col0 + Tile < r ? col0 + Tile : r);
  int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
  double acc[kPer][kPer] = {};
  for (int64_t k0 = 0; k0 < depth; k0 += kDepth) {
    for (int e = threadIdx.x; e < kDepth * Tile; e += kThreads) {
      int kk, ii;
      if (Gram) { // A = Yᵀ: consecutive threads walk i, contiguous in Y's rows
        kk = e / Tile;
        ii = e % Tile;
      } else { // A = Y: consecutive threads walk k
        ii = e / kDepth;
        kk = e % kDepth;
      }
      int64_t i = row0 + ii, k = k0 + kk;
      double v = 0.0;
      if (i < rows && k < depth)
        v = double(Gram ? y[k * r + i] : y[i * r + k]);
      as[kk][ii] = v;
      int jj = e % Tile, kb = e / Tile;
      int64_t j = col0 + jj, kr = k0 + kb;
      double w = 0.0;
      if (j < r && kr < depth)
        w = Gram ? double(y[kr * r + j]) : inverse[kr * r + j];
      bs[kb][jj] = w;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDepth; ++kk) {
      double av[kPer], bv[kPer];
#pragma unroll
      for (int x = 0; x < kPer; ++x) {
        av[x] = as[kk][tr + 16 * x];
        bv[x] = bs[kk][tc + 16 * x];
      }
#pragma unroll
      for (int x = 0; x < kPer; ++x)
#pragma unroll
        for (int z = 0; z < kPer; ++z)
          acc[x][z] += av[x] * bv[z];
    }
    __syncthreads();
  }
#pragma unroll
  for (int x = 0; x < kPer; ++x)
#pragma unroll
    for (int z = 0; z < kPer; ++z) {
      int64_t i = row0 + tr + 16 * x, j = col0 + tc + 16 * z;
      if (i >= rows || j >= r)
        continue;
      if (Gram)
        gram[i * r + j] = acc[x][z];
      else
        q[i * r + j] = float(acc[x][z]);
    }
}

// The completion, when the rank-revealing pass left k columns out (their R⁻¹ diagonal is -1;
// `q` = Q2, s x r f32), in the CPU reference's steps: S = I - Q2[0:r, acc]·Q2[0:r, acc]ᵀ (the
// Gram matrix of the unit vectors projected off the accepted columns) into `gram`, its
// rank-revealing Cholesky factor taking the first k with a squared residual above
// galore::completionTolerance, R_S⁻¹ into `inverse`, then K = Q2[0:r, acc]ᵀ·R_S⁻¹ into `gram`,
// and `target[j]`, the unit vector of left-out column j (-1 for an accepted one). The
// refresh fails if fewer than k are found (never in exact arithmetic: GaLore.h,
// completionTolerance).

/// target[j] = 0 for a left-out column (its unit vector is set by completionMapKernel), -1
/// for an accepted one.
__global__ void __launch_bounds__(kThreads)
    completionTargetsKernel(const double *inverse, int64_t r, int *target, const Gate *gate) {
  if (!gateOpen(gate, true))
    return;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < r;
       j += int64_t(gridDim.x) * blockDim.x)
    target[j] = inverse[j * r + j] < 0.0 ? 0 : -1;
}

/// S[x, i] = δ(x, i) - Σ_{p accepted} Q2[x, p]·Q2[i, p], 16 x 16 tiles.
__global__ void completionGramKernel(const float *q, int64_t r, const int *target, double *gram,
                                     const Gate *gate) {
  if (!gateOpen(gate, true))
    return;
  __shared__ double ti[16][17], tj[16][17];
  int64_t i0 = int64_t(blockIdx.y) * 16, j0 = int64_t(blockIdx.x) * 16;
  int ty = threadIdx.y, tx = threadIdx.x;
  double acc = 0.0;
  for (int64_t p0 = 0; p0 < r; p0 += 16) {
    int64_t p = p0 + tx;
    bool kept = p < r && target[p] < 0;
    ti[ty][tx] = kept && i0 + ty < r ? double(q[(i0 + ty) * r + p]) : 0.0;
    tj[ty][tx] = kept && j0 + ty < r ? double(q[(j0 + ty) * r + p]) : 0.0;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk)
      acc += ti[ty][kk] * tj[tx][kk];
    __syncthreads();
  }
  int64_t i = i0 + ty, j = j0 + tx;
  if (i < r && j < r)
    gram[i * r + j] = (i == j ? 1.0 : 0.0) - acc;
}

/// K[p, i] = Σ_{k ≤ i} Q2[k, p]·R_S⁻¹[k, i] for an accepted p (0 for a left-out one).
__global__ void __launch_bounds__(kThreads)
    completionProductKernel(const float *q, int64_t r, const int *target, const double *inverse,
                            double *product, const Gate *gate) {
  if (!gateOpen(gate, true))
    return;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < r * r;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t p = e / r, i = e % r;
    double sum = 0.0;
    if (target[p] < 0)
      for (int64_t k = 0; k <= i; ++k)
        sum += double(q[k * r + p]) * inverse[k * r + i];
    product[e] = sum;
  }
}

/// Left-out column j gets the next unit vector the factorisation of S took; fails the
/// refresh when it took fewer than were left out.
__global__ void completionMapKernel(const double *inverse, int64_t r, int *target, Gate *gate) {
  if (!gateOpen(gate, true))
    return;
  int64_t i = 0;
  for (int64_t j = 0; j < r; ++j) {
    if (target[j] < 0)
      continue;
    while (i < r && inverse[i * r + i] < 0.0)
      ++i;
    target[j] = int(i < r ? i++ : 0);
  }
  if (gate->accepted < gate->missing) {
    gate->failed = galore::kRankDeficient;
    gate->go = 0;
  }
}

/// The left-out columns of Q2: column j (unit vector i = target[j]) becomes
/// R_S⁻¹[x, i] (x < r) - Σ_{p accepted} Q2[x, p]·K[p, i]. Reads accepted columns only.
__global__ void __launch_bounds__(kThreads)
    completeKernel(float *q, int64_t s, int64_t r, const double *k, const double *inverse,
                   const int *target, const Gate *gate) {
  if (!gateOpen(gate, true))
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

/// One CholeskyQR pass: `to` = `from`·R⁻¹ with RᵀR the (shifted, or rank-revealing) Cholesky
/// factorisation of fromᵀ·from.
void choleskyQrPass(const char *k, Stream stream, const Workspace &w, const float *from,
                    float *to, int64_t s, int64_t r, Factorisation kind) {
  // The Gram matrix is small (r x r) and deep (s): 32 x 32 tiles give the multiprocessors
  // four times as many blocks as 64 x 64 ones would.
  unsigned gramTiles = unsigned((r + 31) / 32);
  choleskyQrProductKernel<true, 32><<<dim3(gramTiles, gramTiles), kThreads, 0, stream>>>(
      from, nullptr, w.gram, nullptr, s, r, w.gate);
  checkLaunch(k, "choleskyQrProductKernel(gram)");
  cholesky(k, stream, w.gram, s, r, kind, w.gate);
  launchInverse(k, stream, w.gram, w.inverse, r, false, w.gate);
  choleskyQrProductKernel<false, kTile>
      <<<dim3(unsigned((r + kTile - 1) / kTile), unsigned((s + kTile - 1) / kTile)), kThreads, 0,
         stream>>>(from, w.inverse, nullptr, to, s, r, w.gate);
  checkLaunch(k, "choleskyQrProductKernel(apply)");
}

/// Y (in place) = the orthonormal factor of Y (runtime/cpu/GaLore.cpp, orthonormalize):
/// shifted CholeskyQR into `scratch`, the rank-revealing CholeskyQR back into Y, and the
/// completion of the columns it left out (kernels that return at once when none was).
void orthonormalize(const char *k, Stream stream, const Workspace &w, float *y, float *scratch,
                    int64_t s, int64_t r) {
  dim3 tiles(unsigned((r + 15) / 16), unsigned((r + 15) / 16)), block(16, 16);
  unsigned grid = gridFor(k, s * r, kThreads);
  choleskyQrPass(k, stream, w, y, scratch, s, r, Factorisation::Shifted);
  choleskyQrPass(k, stream, w, scratch, y, s, r, Factorisation::RankRevealing);
  // Z holds Q1, no longer needed: its first r ints become the column map.
  int *target = reinterpret_cast<int *>(scratch);
  unsigned rGrid = gridFor(k, r, kThreads), squareGrid = gridFor(k, r * r, kThreads);
  completionTargetsKernel<<<rGrid, kThreads, 0, stream>>>(w.inverse, r, target, w.gate);
  checkLaunch(k, "completionTargetsKernel");
  completionGramKernel<<<tiles, block, 0, stream>>>(y, r, target, w.gram, w.gate);
  checkLaunch(k, "completionGramKernel");
  cholesky(k, stream, w.gram, s, r, Factorisation::Completion, w.gate);
  launchInverse(k, stream, w.gram, w.inverse, r, true, w.gate);
  completionProductKernel<<<squareGrid, kThreads, 0, stream>>>(y, r, target, w.inverse, w.gram,
                                                               w.gate);
  checkLaunch(k, "completionProductKernel");
  completionMapKernel<<<1, 1, 0, stream>>>(w.inverse, r, target, w.gate);
  checkLaunch(k, "completionMapKernel");
  completeKernel<<<grid, kThreads, 0, stream>>>(y, s, r, w.gram, w.inverse, target, w.gate);
  checkLaunch(k, "completeKernel");
}

/// The stream a conditional body is captured on (one per thread; a capture cannot nest on
/// the stream being captured).
Stream sideStream(const char *k) {
  thread_local cudaStream_t side = nullptr;
  if (!side) {
    // Creating a stream is not allowed in this thread while it captures; relax that for it.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    checkCuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode",
              k);
    cudaError_t created = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    checkCuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode",
              k);
    checkCuda(created, "cudaStreamCreateWithFlags", k);
  }
  return side;
}

/// Captures, into the graph that `stream` is capturing, `begin(handle, true)` (which must set
/// the handle's condition) and after it an if-node whose body `body(side)` captures: on the
/// graph's replays the body runs only when `begin` set the condition. This keeps a refresh
/// that is not due down to one tiny kernel, where gated kernels cost a few microseconds each
/// (about 4 ms a step over TinyLlama's 110 weights).
template <typename Begin, typename Body>
void captureIfDue(const char *k, Stream stream, Begin begin, Body body) {
  cudaStreamCaptureStatus status;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t *dependencies = nullptr;
  size_t count = 0;
  checkCuda(cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph, nullptr, nullptr, nullptr),
            "cudaStreamGetCaptureInfo", k);
  cudaGraphConditionalHandle handle;
  checkCuda(cudaGraphConditionalHandleCreate(&handle, graph, 0, 0),
            "cudaGraphConditionalHandleCreate", k);
  begin(handle, true);
  checkCuda(cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph, &dependencies, nullptr,
                                     &count),
            "cudaStreamGetCaptureInfo", k);
  cudaGraphNodeParams params = {};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeIf;
  params.conditional.size = 1;
  cudaGraphNode_t node;
  checkCuda(cudaGraphAddNode(&node, graph, dependencies, nullptr, count, &params),
            "cudaGraphAddNode(conditional)", k);
  checkCuda(cudaStreamUpdateCaptureDependencies(stream, &node, nullptr, 1,
                                                cudaStreamSetCaptureDependencies),
            "cudaStreamUpdateCaptureDependencies", k);
  Stream side = sideStream(k);
  checkCuda(cudaStreamBeginCaptureToGraph(side, params.conditional.phGraph_out[0], nullptr,
                                          nullptr, 0, cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCaptureToGraph", k);
  try {
    // The body may not allocate: its scratch comes from the backend's arena.
    ScratchArena::BodyScope scratch;
    body(side);
  } catch (...) {
    cudaGraph_t ended = nullptr;
    cudaStreamEndCapture(side, &ended);
    throw;
  }
  cudaGraph_t ended = nullptr;
  checkCuda(cudaStreamEndCapture(side, &ended), "cudaStreamEndCapture(conditional body)", k);
}

template <typename T>
void refreshTyped(const char *k, Stream stream, const T *g, int64_t m,
                  int64_t n, const galore::RefreshParams &p, const Workspace &w,
                  const int64_t *step) {
  bool left = p.left;
  int64_t s = left ? m : n, l = left ? n : m, r = p.rank;
  finiteKernel<T><<<gridFor(k, m * n, kThreads), kThreads, 0, stream>>>(g, m * n, w.gate);
  checkLaunch(k, "finiteKernel");
  gateKernel<<<1, 1, 0, stream>>>(w.gate);
  checkLaunch(k, "gateKernel");
  sketchKernel<<<gridFor(k, l * r, kThreads), kThreads, 0, stream>>>(w.z, l * r, p.seed, p.slot,
                                                                     step);
  checkLaunch(k, "sketchKernel");
  // A = G (left: s = m rows of n) or Gᵀ (right: G is l x s). A·X reads G untransposed on the
  // left, transposed on the right; Aᵀ·X the other way round.
  launchGemm(k, stream, g, n, !left, w.z, w.y, s, r, l, w.gate); // Y = A·Ω
  for (int64_t it = 0; it < p.powerIterations; ++it) {
    // Between the products one shifted CholeskyQR pass keeps Y well conditioned; the final
    // projector does not depend on it (CPU reference, randomizedRange).
    choleskyQrPass(k, stream, w, w.y, w.z, s, r, Factorisation::Shifted);
    checkCuda(cudaMemcpyAsync(w.y, w.z, size_t(s * r) * sizeof(float), cudaMemcpyDeviceToDevice,
                              stream),
              "cudaMemcpyAsync(Q)", k);
    launchGemm(k, stream, g, n, left, w.y, w.z, l, r, s, w.gate);  // Z = Aᵀ·Q
    launchGemm(k, stream, g, n, !left, w.z, w.y, s, r, l, w.gate); // Y = A·Z
  }
  orthonormalize(k, stream, w, w.y, w.z, s, r);
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
  // Every thread derives the step's scalars (the same fp64 operations, so the same values):
  // no barrier after a one-thread branch, which synccheck reports from conditional graph
  // bodies (docs/reliability.md), as in Optimizer.cu's kernels.
  const double t = double(*a.step) + 1.0;
  const double rate = double(loadScalar(a.lr, a.lrType));
  const double norm = double(loadScalar(a.gradNorm, a.normType));
  const float clip =
      a.gradClip > 0.0 ? float(fmin(1.0, a.gradClip / (norm + kClipEpsilon))) : 1.0f;
  const float stepSize = float(rate * a.scale / (1.0 - pow(a.beta1, t)));
  const float bc2Sqrt = float(sqrt(1.0 - pow(a.beta2, t)));
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

/// w *= 1 - lr·wd (the decoupled weight decay, before the low-rank step is added), rounded
/// to w's dtype.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    decayKernel(T *w, int64_t n, const void *lr, DType lrType, double weightDecay) {
  float decay = float(1.0 - double(loadScalar(lr, lrType)) * weightDecay);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    w[i] = fromFloat<T>(toFloat(w[i]) * decay);
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

} // namespace

void galoreRefresh(const Context &ctx, const TensorView &grad, const TensorView &step,
                   const galore::RefreshParams &params, const TensorView &workspace,
                   const TensorView &projector, const TensorView &status) {
  const char *k = "galore_refresh";
  if (!params.randomized)
    fail(k, "the exact (\"svd\") GaLore projector is not available on the CUDA backend; "
            "compile the plan with projector \"randomized\"");
  auto [rows, cols] = checkSide(k, "grad", grad, params.left);
  int64_t m = rows, n = cols; // named variables: the body's lambda captures them
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
  // Everything after beginKernel runs only when the refresh is due (one step in T).
  auto body = [&](Stream stream) {
    switch (grad.dtype) {
    case DType::BF16:
      refreshTyped(k, stream, static_cast<const __nv_bfloat16 *>(grad.data), m, n,
                   params, w, stepPtr);
      break;
    case DType::F16:
      refreshTyped(k, stream, static_cast<const __half *>(grad.data), m, n, params,
                   w, stepPtr);
      break;
    default:
      refreshTyped(k, stream, static_cast<const float *>(grad.data), m, n, params,
                   w, stepPtr);
      break;
    }
    finishKernel<<<gridFor(k, small * r, kThreads), kThreads, 0, stream>>>(
        w.y, static_cast<float *>(projector.data), small * r, slot, w.gate);
    checkLaunch(k, "finishKernel");
  };
  auto begin = [&](cudaGraphConditionalHandle due, bool conditional) {
    beginKernel<<<1, 1, 0, ctx.stream>>>(stepPtr, slot, params.updateProjGap, params.offset,
                                         params.slot, status.shape[0], w.gate, due, conditional);
    checkLaunch(k, "beginKernel");
  };
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  checkCuda(cudaStreamIsCapturing(ctx.stream, &capturing), "cudaStreamIsCapturing", k);
  if (capturing == cudaStreamCaptureStatusActive) {
    captureIfDue(k, ctx.stream, begin, body);
    return;
  }
  // Outside a graph the host reads the gate: a refresh that is not due launches nothing more.
  begin(0, false);
  // Only the field beginKernel has written: the rest of the gate may be unwritten memory yet.
  int active = 0;
  checkCuda(cudaMemcpyAsync(&active, &w.gate->active, sizeof active, cudaMemcpyDeviceToHost,
                            ctx.stream),
            "cudaMemcpyAsync(gate)", k);
  checkCuda(cudaStreamSynchronize(ctx.stream), "cudaStreamSynchronize", k);
  if (active)
    body(ctx.stream);
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
  else if (param.dtype == DType::F16)
    fail(k, "an f16 parameter needs an f32 master copy to accumulate the update into (the "
            "tensor cores' bf16 products do not accumulate into f16)");
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
  // The update accumulates into the fp32 master, or into the parameter itself (f32, or bf16
  // without a master: each of the two steps then rounds to bf16, as the CPU kernel does).
  const TensorView &target = master ? *master : param;
  if (hyper.weightDecay != 0.0) {
    unsigned grid = gridFor(k, target.numel(), kThreads);
    if (target.dtype == DType::BF16)
      decayKernel<<<grid, kThreads, 0, ctx.stream>>>(static_cast<__nv_bfloat16 *>(target.data),
                                                     target.numel(), lr.data, lr.dtype,
                                                     hyper.weightDecay);
    else
      decayKernel<<<grid, kThreads, 0, ctx.stream>>>(static_cast<float *>(target.data),
                                                     target.numel(), lr.data, lr.dtype,
                                                     hyper.weightDecay);
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
  call.cType = target.dtype;
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
  call.c = target.data;
  ltEngineOf(k, *ctx.gemm).run(k, ctx.stream, call);
  if (master)
    cuda::cast(ctx, *master, param);
}

} // namespace bonsai::rt::cuda
