//===- Norm.cu - rms_norm, layer_norm, softmax and their gradients on CUDA -===//
//
// Row kernels: one warp per row for short rows (eight rows per block), else one block per row
// (up to 1024 threads, about four 16-byte vectors each), reductions by warp shuffles and one
// shared-memory step, in fp32 and in an order fixed by the launch shape, so results are the
// same run to run. Rows are read with 16-byte vectors after a scalar head that brings the row
// to a 16-byte boundary, so odd row lengths vectorise too; re-reads of a row within a kernel
// come from cache. Softmax over an inner axis (inner size > 1) runs one thread per column.
//
// The norm gradients are one pass over the rows plus a small second stage, deterministic (no
// atomics, sums in an order fixed by the shapes and the device). Each of G blocks (a few per
// multiprocessor, at least kMinRowsPerBlock rows each) takes a contiguous chunk of rows in row
// groups of just enough warps for two vectors per thread, computes dx row by row from dy and x
// held in registers, and adds its columns' weight (and bias) gradient terms into registers;
// the groups' sums are added in group order into the block's fp32 partial row, and
// sumPartialRowsKernel adds the G partial rows of each column in block order. Rows of over 512
// vectors go through a slower kernel of one block per row that accumulates in shared or global
// memory (same two stages).
//
// The weight (and bias) may have a dtype other than x's (e.g. f32 weights with bf16
// activations); other mixes run through fp32 copies (F32Staging).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <algorithm>
#include <optional>
#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

/// Block shape and grid for one row per warp (short rows) or one row per block.
struct RowLaunch {
  dim3 block;
  unsigned grid;
};

RowLaunch rowLaunch(int64_t rows, int64_t d, int vw) {
  int tpr = threadsPerRow(d, vw);
  if (tpr == 32)
    return {dim3(32, 8), unsigned((rows + 7) / 8)};
  return {dim3(unsigned(tpr), 1), unsigned(rows)};
}

//===----------------------------------------------------------------------===//
// Forward norms
//===----------------------------------------------------------------------===//

/// Stores N elements of dx; with an addend (the residual stream's gradient, fused from the
/// add that follows the norm gradient), first rounds the norm's gradient to T, as the unfused
/// kernel would store it, and adds the addend in fp32 before the one rounding of the sum.
template <int N, typename T>
__device__ __forceinline__ void storeDx(T *out, float (&v)[N], const T *addend) {
  if (addend) {
    float a[N];
    loadF<N>(addend, a);
#pragma unroll
    for (int e = 0; e < N; ++e)
      v[e] = toFloat(fromFloat<T>(v[e])) + a[e];
  }
  storeF<N>(out, v);
}

/// y = norm(x), or with `rhs` (add_rms_norm, add_layer_norm): sum = x + rhs rounded to T,
/// stored, and y = norm(sum) from the rounded values. Each thread reads back only elements it
/// wrote itself (forRow assigns every element to one thread), so no barrier is needed.
template <typename T, typename W, int VW, bool Layer>
__global__ void normKernel(const T *x, const T *rhs, T *sum, const W *w, const W *b, T *y,
                           int64_t rows, int64_t d, float eps) {
  __shared__ float scratch[32];
  int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows)
    return; // a whole warp-row (no barrier in its reductions) or, for block rows, never
  const T *xr = x + row * d;
  T *yr = y + row * d;
  const int tid = threadIdx.x, threads = blockDim.x;
  if (rhs) {
    const T *rr = rhs + row * d;
    T *sr = sum + row * d;
    forRow<VW>(xr, d, tid, threads, [&](int64_t i, auto width) {
      constexpr int N = decltype(width)::value;
      float v[N], u[N];
      loadF<N>(xr + i, v);
      loadF<N>(rr + i, u);
#pragma unroll
      for (int e = 0; e < N; ++e)
        v[e] += u[e];
      storeF<N>(sr + i, v);
    });
    xr = sr;
  }
  float mean = 0.0f;
  if constexpr (Layer) {
    float sum = 0.0f;
    forRow<VW>(xr, d, tid, threads, [&](int64_t i, auto width) {
      constexpr int N = decltype(width)::value;
      float v[N];
      loadF<N>(xr + i, v);
#pragma unroll
      for (int e = 0; e < N; ++e)
        sum += v[e];
    });
    mean = rowReduce(sum, scratch, SumOp{}) / float(d);
  }
  // The variance from the mean (two passes, as the CPU kernel), or the mean square.
  float sumSq = 0.0f;
  forRow<VW>(xr, d, tid, threads, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(xr + i, v);
#pragma unroll
    for (int e = 0; e < N; ++e)
      sumSq += (v[e] - mean) * (v[e] - mean);
  });
  sumSq = rowReduce(sumSq, scratch, SumOp{});
  const float inv = 1.0f / sqrtf(sumSq / float(d) + eps);
  const int64_t head = rowHead<VW>(xr, d);
  const bool wVec = sideAligned<VW>(w + head) && (!Layer || sideAligned<VW>(b + head));
  forRow<VW>(xr, d, tid, threads, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N], wv[N];
    [[maybe_unused]] float bv[N];
    loadF<N>(xr + i, v);
    loadSide<N>(w + i, wv, wVec);
    if constexpr (Layer)
      loadSide<N>(b + i, bv, wVec);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      v[e] = (v[e] - mean) * inv * wv[e];
      if constexpr (Layer)
        v[e] += bv[e];
    }
    storeF<N>(yr + i, v);
  });
}

/// Calls f(T{}, W{}) for the storage types of the activations and the side operands when they
/// are one of the pairs the kernels are built for: W = T, or W = float.
template <typename F> bool dispatchNormTypes(DType t, DType w, F &&f) {
  if (w != t && w != DType::F32)
    return false;
  dispatchFloat(t, [&](auto tTag) {
    using T = decltype(tTag);
    if (w == t)
      f(tTag, tTag);
    else
      f(tTag, float{});
  });
  return true;
}

/// norm(x) into y; with `rhs` and `sum` (the fused residual add), sum = x + rhs and y =
/// norm(sum). The fused form needs x, rhs, sum and y of one dtype and no overlaps (the plan
/// guarantees both).
template <bool Layer>
void norm(const char *kernel, const Context &ctx, const TensorView &xIn, const TensorView &wIn,
          const TensorView *bIn, double eps, const TensorView &yIn,
          const TensorView *rhs = nullptr, const TensorView *sum = nullptr) {
  int64_t d = checkNorm(kernel, xIn, wIn, bIn, yIn);
  if (rhs) {
    checkFloat(kernel, "rhs", *rhs);
    checkFloat(kernel, "sum", *sum);
    checkSameShape(kernel, "rhs", *rhs, "x", xIn);
    checkSameShape(kernel, "sum", *sum, "x", xIn);
    if (rhs->dtype != xIn.dtype || sum->dtype != xIn.dtype || yIn.dtype != xIn.dtype)
      fail(kernel, "lhs, rhs, sum and y must share one dtype");
    for (const TensorView *t : {&xIn, rhs, &wIn})
      if (overlaps(*t, *sum) || overlaps(*t, yIn))
        fail(kernel, "the outputs must not overlap the inputs");
    if (bIn && (overlaps(*bIn, *sum) || overlaps(*bIn, yIn)))
      fail(kernel, "the outputs must not overlap the inputs");
  }
  int64_t rows = d ? xIn.numel() / d : 0;
  if (rows == 0 || d == 0)
    return;
  std::vector<Scratch> keep;
  TensorView x = safeInPlace(xIn, yIn) ? xIn : copyToScratch(kernel, ctx.stream, xIn, keep);
  TensorView w = overlaps(wIn, yIn) ? copyToScratch(kernel, ctx.stream, wIn, keep) : wIn;
  TensorView b = bIn ? *bIn : wIn;
  if (bIn && overlaps(b, yIn))
    b = copyToScratch(kernel, ctx.stream, b, keep);
  TensorView y = yIn;
  F32Staging staging(kernel, ctx.stream);
  bool sideOk = w.dtype == b.dtype && (w.dtype == x.dtype || w.dtype == DType::F32);
  TensorView r = rhs ? *rhs : x, s = sum ? *sum : y;
  if (x.dtype != y.dtype || !sideOk) {
    x = staging.in(x);
    w = staging.in(w);
    b = staging.in(b);
    y = staging.out(y);
    if (rhs) {
      r = staging.in(r);
      s = staging.out(s);
    }
  }
  dispatchNormTypes(x.dtype, w.dtype, [&](auto tTag, auto wTag) {
    using T = decltype(tTag);
    using W = decltype(wTag);
    int vw = rhs ? rowVectorWidth<T>({x.data, y.data, r.data, s.data})
                 : rowVectorWidth<T>({x.data, y.data});
    RowLaunch l = rowLaunch(rows, d, vw);
    auto xp = static_cast<const T *>(x.data);
    auto rp = rhs ? static_cast<const T *>(r.data) : nullptr;
    auto sp = rhs ? static_cast<T *>(s.data) : nullptr;
    auto wp = static_cast<const W *>(w.data), bp = static_cast<const W *>(b.data);
    auto yp = static_cast<T *>(y.data);
    if (vw > 1)
      normKernel<T, W, kVec<T>, Layer>
          <<<l.grid, l.block, 0, ctx.stream>>>(xp, rp, sp, wp, bp, yp, rows, d, float(eps));
    else
      normKernel<T, W, 1, Layer>
          <<<l.grid, l.block, 0, ctx.stream>>>(xp, rp, sp, wp, bp, yp, rows, d, float(eps));
    checkLaunch(kernel, "normKernel");
  });
  staging.finish();
}

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

template <typename T, int VW>
__global__ void softmaxRowKernel(const T *x, T *y, int64_t rows, int64_t d) {
  __shared__ float scratch[64];
  int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows)
    return;
  const T *xr = x + row * d;
  T *yr = y + row * d;
  SoftmaxState st;
  forRow<VW>(xr, d, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(xr + i, v);
    softmaxAccumulate(st, v);
  });
  st = rowSoftmaxReduce(st, scratch);
  const float inv = 1.0f / st.s;
  forRow<VW>(xr, d, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float v[N];
    loadF<N>(xr + i, v);
#pragma unroll
    for (int e = 0; e < N; ++e)
      v[e] = exp2f(fmaf(v[e], kLog2e, -st.m)) * inv;
    storeF<N>(yr + i, v);
  });
}

/// Softmax down the columns of [outer, len, inner] blocks: one thread per (outer, inner) column,
/// consecutive threads on consecutive columns (coalesced).
template <typename T>
__global__ void softmaxColumnKernel(const T *x, T *y, int64_t outer, int64_t len, int64_t inner) {
  for (int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; col < outer * inner;
       col += int64_t(gridDim.x) * blockDim.x) {
    int64_t o = col / inner, c = col % inner;
    const T *xc = x + o * len * inner + c;
    T *yc = y + o * len * inner + c;
    SoftmaxState st;
    for (int64_t i = 0; i < len; ++i) {
      float v[1] = {toFloat(xc[i * inner])};
      softmaxAccumulate(st, v);
    }
    const float inv = 1.0f / st.s;
    for (int64_t i = 0; i < len; ++i)
      yc[i * inner] = fromFloat<T>(exp2f(fmaf(toFloat(xc[i * inner]), kLog2e, -st.m)) * inv);
  }
}

template <typename T, int VW>
__global__ void softmaxGradRowKernel(const T *dy, const T *y, T *dx, int64_t rows, int64_t d) {
  __shared__ float scratch[32];
  int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows)
    return;
  const T *gr = dy + row * d, *pr = y + row * d;
  T *outr = dx + row * d;
  float dot = 0.0f;
  forRow<VW>(gr, d, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float g[N], p[N];
    loadF<N>(gr + i, g);
    loadF<N>(pr + i, p);
#pragma unroll
    for (int e = 0; e < N; ++e)
      dot += g[e] * p[e];
  });
  dot = rowReduce(dot, scratch, SumOp{});
  forRow<VW>(gr, d, threadIdx.x, blockDim.x, [&](int64_t i, auto width) {
    constexpr int N = decltype(width)::value;
    float g[N], p[N];
    loadF<N>(gr + i, g);
    loadF<N>(pr + i, p);
#pragma unroll
    for (int e = 0; e < N; ++e)
      g[e] = p[e] * (g[e] - dot);
    storeF<N>(outr + i, g);
  });
}

template <typename T>
__global__ void softmaxGradColumnKernel(const T *dy, const T *y, T *dx, int64_t outer,
                                        int64_t len, int64_t inner) {
  for (int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; col < outer * inner;
       col += int64_t(gridDim.x) * blockDim.x) {
    int64_t base = (col / inner) * len * inner + col % inner;
    float dot = 0.0f;
    for (int64_t i = 0; i < len; ++i)
      dot += toFloat(dy[base + i * inner]) * toFloat(y[base + i * inner]);
    for (int64_t i = 0; i < len; ++i) {
      int64_t e = base + i * inner;
      dx[e] = fromFloat<T>(toFloat(y[e]) * (toFloat(dy[e]) - dot));
    }
  }
}

/// [outer, len, inner] around `axis`.
void splitAxis(const TensorView &t, int64_t axis, int64_t &outer, int64_t &len, int64_t &inner) {
  outer = 1;
  inner = 1;
  len = t.dim(axis);
  for (int64_t i = 0; i < axis; ++i)
    outer *= t.shape[size_t(i)];
  for (int64_t i = axis + 1; i < t.rank(); ++i)
    inner *= t.shape[size_t(i)];
}

//===----------------------------------------------------------------------===//
// Norm gradients
//===----------------------------------------------------------------------===//

/// Vectors of each row a thread of normGradKernel holds: with two, dy, x and the layer norm's
/// two accumulators fit in registers for two blocks per multiprocessor.
constexpr int kRowVectors = 2;
/// Up to this many instead where that makes a row group one warp (rows of 65 to 96 vectors,
/// the 124M models' 768 columns in bf16): the row reductions are then warp shuffles with no
/// block barrier, and a block has twice the rows in flight.
constexpr int kMaxRowVectors = 3;
/// Threads of a normGradKernel block: row groups of enough warps for kRowVectors vectors each,
/// as many groups as fit. Longer rows (over 512 vectors: bf16 rows over 4096) take
/// normGradWideKernel.
constexpr int kNormGradThreads = 256;
/// Fewest rows a block of the gradient kernels takes (unless there are fewer rows), so the
/// partial sums (a row of fp32 per block) stay a small fraction of the traffic.
constexpr int64_t kMinRowsPerBlock = 32;

/// The norm gradients over a contiguous chunk of rows per block. The block is row groups of
/// blockDim.x threads (threadIdx.y the group); the groups take the chunk's rows in turn (group
/// y the rows r0 + y, r0 + y + blockDim.y, ...) and step together, since their row reductions
/// share barriers when blockDim.x > 32. Thread t of a group owns the vectors t, t + blockDim.x,
/// ... of every row (at most NV): it keeps that row's dy and x in registers between
/// the statistics and the output, and adds its columns' weight (and bias) gradient terms into
/// registers. At the end the groups' sums are added in group order (through shared memory) into
/// the block's row of `partial` ([gridDim.x, kAcc d]: dw, then db). VW > 1 only when every row
/// starts on a 16-byte boundary.
template <typename T, typename W, int VW, int NV, bool Layer>
__global__ void __launch_bounds__(kNormGradThreads, 2)
    normGradKernel(const T *dy, const T *x, const W *w, T *dx, const T *addend, float *partial,
                   int64_t rows, int64_t rowsPerBlock, int64_t d, float eps) {
  constexpr int kAcc = Layer ? 2 : 1;
  // Three sums per group; groups of more than one warp are at most kNormGradThreads / 64.
  static_assert(kNormGradThreads % 64 == 0, "scratch holds whole groups of two warps or more");
  __shared__ float scratch[3 * 32 * (kNormGradThreads / 64)];
  extern __shared__ float combine[]; // kAcc d floats when blockDim.y > 1
  using Raw = RawOf<VW, T>;
  const int64_t first = int64_t(threadIdx.x) * VW, step = int64_t(blockDim.x) * VW;
  const bool wVec = sideAligned<VW>(w);
  float accW[NV][VW] = {};
  [[maybe_unused]] float accB[NV][VW] = {};
  const int64_t r0 = int64_t(blockIdx.x) * rowsPerBlock;
  const int64_t r1 = r0 + rowsPerBlock < rows ? r0 + rowsPerBlock : rows;

  for (int64_t base = r0; base < r1; base += blockDim.y) {
    const int64_t row = base + threadIdx.y;
    const bool active = row < r1; // an idle group still joins the reductions' barriers
    const T *gr = dy + row * d, *xr = x + row * d;
    Raw gRaw[NV], xRaw[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      int64_t c = first + k * step;
      gRaw[k] = xRaw[k] = Raw{};
      if (active && c < d) {
        gRaw[k] = loadRaw<VW>(gr + c);
        xRaw[k] = loadRaw<VW>(xr + c);
      }
    }
    T *outr = dx + row * d;
    const T *addr = addend ? addend + row * d : nullptr;
    if constexpr (!Layer) {
      // y = x r w, r = (mean(x^2) + eps)^-1/2, g = dy w: dx = r g - x r^3 mean(g x).
      float s[2] = {0.0f, 0.0f}; // sum x^2, sum g x
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        int64_t c = first + k * step;
        if (c >= d)
          continue;
        float g[VW], v[VW], wv[VW];
        unpackF<VW, T>(gRaw[k], g);
        unpackF<VW, T>(xRaw[k], v);
        loadSide<VW>(w + c, wv, wVec);
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          s[0] += v[e] * v[e];
          s[1] += g[e] * wv[e] * v[e];
        }
      }
      groupReduceSum(s, scratch);
      const float r = 1.0f / sqrtf(s[0] / float(d) + eps);
      const float coef = r * r * r * s[1] / float(d);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        int64_t c = first + k * step;
        if (!active || c >= d)
          continue;
        float g[VW], v[VW], wv[VW], out[VW];
        unpackF<VW, T>(gRaw[k], g);
        unpackF<VW, T>(xRaw[k], v);
        loadSide<VW>(w + c, wv, wVec);
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          out[e] = r * g[e] * wv[e] - coef * v[e];
          accW[k][e] += g[e] * v[e] * r;
        }
        storeDx<VW>(outr + c, out, addr ? addr + c : nullptr);
      }
    } else {
      // xhat = (x - mean) r, g = dy w: dx = r (g - mean(g) - xhat mean(g xhat)).
      float s1[1] = {0.0f};
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        float v[VW];
        unpackF<VW, T>(xRaw[k], v); // zeros past the row
#pragma unroll
        for (int e = 0; e < VW; ++e)
          s1[0] += v[e];
      }
      groupReduceSum(s1, scratch);
      const float mean = s1[0] / float(d);
      float s[3] = {0.0f, 0.0f, 0.0f}; // sum (x - mean)^2, sum g, sum g (x - mean)
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        int64_t c = first + k * step;
        if (c >= d)
          continue;
        float g[VW], v[VW], wv[VW];
        unpackF<VW, T>(gRaw[k], g);
        unpackF<VW, T>(xRaw[k], v);
        loadSide<VW>(w + c, wv, wVec);
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          float gw = g[e] * wv[e], xc = v[e] - mean;
          s[0] += xc * xc;
          s[1] += gw;
          s[2] += gw * xc;
        }
      }
      groupReduceSum(s, scratch);
      const float r = 1.0f / sqrtf(s[0] / float(d) + eps);
      const float meanG = s[1] / float(d), meanGX = r * s[2] / float(d);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        int64_t c = first + k * step;
        if (!active || c >= d)
          continue;
        float g[VW], v[VW], wv[VW], out[VW];
        unpackF<VW, T>(gRaw[k], g);
        unpackF<VW, T>(xRaw[k], v);
        loadSide<VW>(w + c, wv, wVec);
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          float xhat = (v[e] - mean) * r;
          out[e] = r * (g[e] * wv[e] - meanG - xhat * meanGX);
          accW[k][e] += g[e] * xhat;
          accB[k][e] += g[e];
        }
        storeDx<VW>(outr + c, out, addr ? addr + c : nullptr);
      }
    }
  }

  // The groups' sums, added in group order; the last group writes the block's partial row.
  float *dst = partial + int64_t(blockIdx.x) * kAcc * d;
  for (int group = 0; group < int(blockDim.y); ++group) {
    if (int(threadIdx.y) == group) {
      const bool last = group + 1 == int(blockDim.y);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        int64_t c = first + k * step;
        if (c >= d)
          continue;
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          float sw = accW[k][e];
          if (group > 0)
            sw = combine[c + e] + sw;
          (last ? dst : combine)[c + e] = sw;
          if constexpr (Layer) {
            float sb = accB[k][e];
            if (group > 0)
              sb = combine[d + c + e] + sb;
            (last ? dst : combine)[d + c + e] = sb;
          }
        }
      }
    }
    if (group + 1 < int(blockDim.y))
      __syncthreads();
  }
}

/// The norm gradients for rows too long for normGradKernel's registers: one block of blockDim.x
/// threads per row, block b taking rows b, b + gridDim.x, ...; each thread adds its columns'
/// terms into the block's accumulator row (shared memory when it fits, else the block's row of
/// `partial`), re-reading dy and x from cache for the output.
template <typename T, typename W, int VW, bool Layer>
__global__ void normGradWideKernel(const T *dy, const T *x, const W *w, T *dx, const T *addend,
                                   float *partial,
                                   bool sharedAcc, int64_t rows, int64_t d, float eps) {
  extern __shared__ float sharedMem[];
  __shared__ float scratch[64];
  constexpr int kAcc = Layer ? 2 : 1;
  float *accW = sharedAcc ? sharedMem : partial + int64_t(blockIdx.x) * kAcc * d;
  float *accB = accW + d; // layer norm only
  const int64_t first = int64_t(threadIdx.x) * VW, step = int64_t(blockDim.x) * VW;
  const bool wVec = sideAligned<VW>(w);
  for (int64_t c = first; c < d; c += step)
#pragma unroll
    for (int e = 0; e < VW; ++e) {
      accW[c + e] = 0.0f;
      if constexpr (Layer)
        accB[c + e] = 0.0f;
    }

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *gr = dy + row * d, *xr = x + row * d;
    T *outr = dx + row * d;
    const T *addr = addend ? addend + row * d : nullptr;
    if constexpr (!Layer) {
      float sumSq = 0.0f, dot = 0.0f;
      for (int64_t c = first; c < d; c += step) {
        float g[VW], v[VW], wv[VW];
        loadF<VW>(gr + c, g);
        loadF<VW>(xr + c, v);
        loadSide<VW>(w + c, wv, wVec);
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          sumSq += v[e] * v[e];
          dot += g[e] * wv[e] * v[e];
        }
      }
      rowReduceSum2(sumSq, dot, scratch);
      const float r = 1.0f / sqrtf(sumSq / float(d) + eps);
      const float coef = r * r * r * dot / float(d);
      for (int64_t c = first; c < d; c += step) {
        float g[VW], v[VW], wv[VW], out[VW];
        loadF<VW>(gr + c, g);
        loadF<VW>(xr + c, v);
        loadSide<VW>(w + c, wv, wVec);
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          out[e] = r * g[e] * wv[e] - coef * v[e];
          accW[c + e] += g[e] * v[e] * r;
        }
        storeDx<VW>(outr + c, out, addr ? addr + c : nullptr);
      }
    } else {
      float sum = 0.0f;
      for (int64_t c = first; c < d; c += step) {
        float v[VW];
        loadF<VW>(xr + c, v);
#pragma unroll
        for (int e = 0; e < VW; ++e)
          sum += v[e];
      }
      const float mean = rowReduce(sum, scratch, SumOp{}) / float(d);
      float sumSq = 0.0f;
      for (int64_t c = first; c < d; c += step) {
        float v[VW];
        loadF<VW>(xr + c, v);
#pragma unroll
        for (int e = 0; e < VW; ++e)
          sumSq += (v[e] - mean) * (v[e] - mean);
      }
      const float r = 1.0f / sqrtf(rowReduce(sumSq, scratch, SumOp{}) / float(d) + eps);
      float sumG = 0.0f, sumGX = 0.0f;
      for (int64_t c = first; c < d; c += step) {
        float g[VW], v[VW], wv[VW];
        loadF<VW>(gr + c, g);
        loadF<VW>(xr + c, v);
        loadSide<VW>(w + c, wv, wVec);
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          float gw = g[e] * wv[e];
          sumG += gw;
          sumGX += gw * (v[e] - mean) * r;
        }
      }
      rowReduceSum2(sumG, sumGX, scratch);
      const float meanG = sumG / float(d), meanGX = sumGX / float(d);
      for (int64_t c = first; c < d; c += step) {
        float g[VW], v[VW], wv[VW], out[VW];
        loadF<VW>(gr + c, g);
        loadF<VW>(xr + c, v);
        loadSide<VW>(w + c, wv, wVec);
#pragma unroll
        for (int e = 0; e < VW; ++e) {
          float xhat = (v[e] - mean) * r;
          out[e] = r * (g[e] * wv[e] - meanG - xhat * meanGX);
          accW[c + e] += g[e] * xhat;
          accB[c + e] += g[e];
        }
        storeDx<VW>(outr + c, out, addr ? addr + c : nullptr);
      }
    }
  }
  if (sharedAcc) {
    float *dst = partial + int64_t(blockIdx.x) * kAcc * d;
    for (int64_t c = first; c < d; c += step)
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        dst[c + e] = accW[c + e];
        if constexpr (Layer)
          dst[d + c + e] = accB[c + e];
      }
  }
}

/// Blocks for `rows` rows, `rowsPerGroup` at a time per block sweep: at most what stays resident
/// (perSm per multiprocessor), and no more than one per kMinRowsPerBlock rows beyond one per
/// multiprocessor.
int64_t gradBlocks(const char *kernel, int64_t rows, int64_t rowsPerSweep, int perSm) {
  int64_t sms = multiprocessorCount(kernel);
  int64_t blocks = std::min((rows + rowsPerSweep - 1) / rowsPerSweep, sms * std::max(1, perSm));
  return std::max<int64_t>(
      1, std::min(blocks, std::max(sms, (rows + kMinRowsPerBlock - 1) / kMinRowsPerBlock)));
}

template <bool Layer>
void normGrad(const char *kernel, const Context &ctx, const TensorView &dyIn,
              const TensorView &xIn, const TensorView &wIn, double eps, const TensorView &dxIn,
              const TensorView &dwIn, const TensorView *dbIn,
              const TensorView *addendIn = nullptr) {
  int64_t d = checkNormGrad(kernel, dyIn, xIn, wIn, dxIn);
  checkFloat(kernel, "dw", dwIn);
  checkShape(kernel, "dw", dwIn, {d}, "for x shape " + formatShape(xIn.shape));
  if (dbIn) {
    checkFloat(kernel, "db", *dbIn);
    checkShape(kernel, "db", *dbIn, {d}, "for x shape " + formatShape(xIn.shape));
  }
  int64_t rows = d ? xIn.numel() / d : 0;
  if (d == 0)
    return;

  // Inputs are read while dx, dw and db are written: any overlap reads from copies.
  std::vector<Scratch> keep;
  std::vector<const TensorView *> outputs = {&dxIn, &dwIn};
  if (dbIn)
    outputs.push_back(dbIn);
  auto unaliased = [&](const TensorView &t) {
    for (const TensorView *o : outputs)
      if (overlaps(t, *o))
        return copyToScratch(kernel, ctx.stream, t, keep);
    return t;
  };
  if (addendIn) {
    checkFloat(kernel, "addend", *addendIn);
    checkSameShape(kernel, "addend", *addendIn, "x", xIn);
  }
  TensorView dy = unaliased(dyIn), x = unaliased(xIn), w = unaliased(wIn);
  TensorView addend = addendIn ? unaliased(*addendIn) : TensorView{};
  TensorView dx = dxIn, dw = dwIn, db = dbIn ? *dbIn : dwIn;
  F32Staging staging(kernel, ctx.stream);
  bool activationsOk = dy.dtype == x.dtype && dx.dtype == x.dtype &&
                       (!addendIn || addend.dtype == x.dtype);
  bool sideOk = (w.dtype == x.dtype || w.dtype == DType::F32) && dw.dtype == w.dtype &&
                (!dbIn || db.dtype == w.dtype);
  if (!activationsOk || !sideOk) {
    dy = staging.in(dy);
    x = staging.in(x);
    w = staging.in(w);
    dx = staging.out(dx);
    dw = staging.out(dw);
    // Mixed dtypes (never made by bonsai-fuse, whose addend, dy, x and dx share one): the
    // norm's gradient is added to the addend in fp32 and rounded once, into dx's dtype.
    if (addendIn)
      addend = staging.in(addend);
    if (dbIn)
      db = staging.out(db);
  }
  if (rows == 0) {
    // Empty sums.
    checkCuda(cudaMemsetAsync(dw.data, 0, dw.bytes(), ctx.stream), "cudaMemsetAsync", kernel);
    if (dbIn)
      checkCuda(cudaMemsetAsync(db.data, 0, db.bytes(), ctx.stream), "cudaMemsetAsync", kernel);
    staging.finish();
    return;
  }

  dispatchNormTypes(x.dtype, w.dtype, [&](auto tTag, auto wTag) {
    using T = decltype(tTag);
    using W = decltype(wTag);
    constexpr int kAcc = Layer ? 2 : 1;
    bool vector = aligned16(dy.data) && aligned16(x.data) && aligned16(dx.data) &&
                  (!addendIn || aligned16(addend.data)) && (d * int64_t(sizeof(T))) % 16 == 0;
    auto ap = addendIn ? static_cast<const T *>(addend.data) : nullptr;
    int vw = vector ? kVec<T> : 1;
    int64_t vectors = (d + vw - 1) / vw;
    const bool oneWarp = vectors > 32 * kRowVectors && vectors <= 32 * kMaxRowVectors;
    const int rowVectors = oneWarp ? kMaxRowVectors : kRowVectors;
    int64_t groupThreads = (vectors + rowVectors - 1) / rowVectors;
    groupThreads = (groupThreads + 31) / 32 * 32;
    auto dyp = static_cast<const T *>(dy.data), xp = static_cast<const T *>(x.data);
    auto wp = static_cast<const W *>(w.data);
    auto dxp = static_cast<T *>(dx.data);
    size_t accBytes = size_t(kAcc) * size_t(d) * sizeof(float);
    int64_t blocks;
    std::optional<Scratch> partial;
    if (groupThreads <= kNormGradThreads) {
      // The groups' sums meet in kAcc d floats of shared memory (at most 2 x 2048 when a
      // block has several groups, groupThreads <= 128).
      int threads = int(groupThreads);
      int groups = kNormGradThreads / threads;
      size_t smem = groups > 1 ? accBytes : 0;
      auto kernelFn = vector ? (oneWarp ? normGradKernel<T, W, kVec<T>, kMaxRowVectors, Layer>
                                        : normGradKernel<T, W, kVec<T>, kRowVectors, Layer>)
                             : (oneWarp ? normGradKernel<T, W, 1, kMaxRowVectors, Layer>
                                        : normGradKernel<T, W, 1, kRowVectors, Layer>);
      int perSm = 0;
      checkCuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernelFn,
                                                              threads * groups, smem),
                "cudaOccupancyMaxActiveBlocksPerMultiprocessor", kernel);
      blocks = gradBlocks(kernel, rows, groups, perSm);
      int64_t rowsPerBlock = (rows + blocks - 1) / blocks;
      blocks = (rows + rowsPerBlock - 1) / rowsPerBlock;
      partial.emplace(kernel, ctx.stream, size_t(blocks) * accBytes);
      kernelFn<<<unsigned(blocks), dim3(unsigned(threads), unsigned(groups)), smem,
                 ctx.stream>>>(dyp, xp, wp, dxp, ap, partial->as<float>(), rows, rowsPerBlock, d,
                               float(eps));
      checkLaunch(kernel, "normGradKernel");
    } else {
      int threads = threadsPerRow(d, vw);
      bool sharedAcc = accBytes <= 48 * 1024;
      size_t smem = sharedAcc ? accBytes : 0;
      auto kernelFn = vector ? normGradWideKernel<T, W, kVec<T>, Layer>
                             : normGradWideKernel<T, W, 1, Layer>;
      int perSm = 0;
      checkCuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernelFn, threads, smem),
                "cudaOccupancyMaxActiveBlocksPerMultiprocessor", kernel);
      blocks = gradBlocks(kernel, rows, 1, perSm);
      partial.emplace(kernel, ctx.stream, size_t(blocks) * accBytes);
      kernelFn<<<unsigned(blocks), threads, smem, ctx.stream>>>(
          dyp, xp, wp, dxp, ap, partial->as<float>(), sharedAcc, rows, d, float(eps));
      checkLaunch(kernel, "normGradWideKernel");
    }
    sumPartialRows<W>(kernel, ctx.stream, partial->as<float>(), blocks, kAcc * d,
                      static_cast<W *>(dw.data), d, static_cast<W *>(db.data));
  });
  staging.finish();
}

} // namespace

void rmsNorm(const Context &ctx, const TensorView &x, const TensorView &w, double eps,
             const TensorView &y) {
  norm<false>("rms_norm", ctx, x, w, nullptr, eps, y);
}

void layerNorm(const Context &ctx, const TensorView &x, const TensorView &w,
               const TensorView &b, double eps, const TensorView &y) {
  norm<true>("layer_norm", ctx, x, w, &b, eps, y);
}

void softmax(const Context &ctx, const TensorView &xIn, int axis, const TensorView &y) {
  const char *k = "softmax";
  checkFloat(k, "x", xIn);
  checkFloat(k, "y", y);
  checkSameShape(k, "y", y, "x", xIn);
  int64_t a = normalizeAxis(k, axis, xIn.rank());
  int64_t outer, len, inner;
  splitAxis(xIn, a, outer, len, inner);
  if (outer * len * inner == 0)
    return;
  std::vector<Scratch> keep;
  // The column kernel reads a column twice while writing it; the row kernel likewise per row.
  TensorView x = safeInPlace(xIn, y) ? xIn : copyToScratch(k, ctx.stream, xIn, keep);
  F32Staging staging(k, ctx.stream);
  TensorView xs = x, ys = y;
  if (x.dtype != y.dtype) {
    xs = staging.in(x);
    ys = staging.out(y);
  }
  dispatchFloat(xs.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto xp = static_cast<const T *>(xs.data);
    auto yp = static_cast<T *>(ys.data);
    if (inner == 1) {
      int vw = rowVectorWidth<T>({xs.data, ys.data});
      RowLaunch l = rowLaunch(outer, len, vw);
      if (vw > 1)
        softmaxRowKernel<T, kVec<T>><<<l.grid, l.block, 0, ctx.stream>>>(xp, yp, outer, len);
      else
        softmaxRowKernel<T, 1><<<l.grid, l.block, 0, ctx.stream>>>(xp, yp, outer, len);
      checkLaunch(k, "softmaxRowKernel");
    } else {
      softmaxColumnKernel<T><<<gridFor(k, outer * inner, 256), 256, 0, ctx.stream>>>(
          xp, yp, outer, len, inner);
      checkLaunch(k, "softmaxColumnKernel");
    }
  });
  staging.finish();
}

void softmaxGrad(const Context &ctx, const TensorView &dyIn, const TensorView &yIn, int axis,
                 const TensorView &dx) {
  const char *k = "softmax_grad";
  checkFloat(k, "dy", dyIn);
  checkFloat(k, "y", yIn);
  checkFloat(k, "dx", dx);
  checkSameShape(k, "y", yIn, "dy", dyIn);
  checkSameShape(k, "dx", dx, "dy", dyIn);
  int64_t a = normalizeAxis(k, axis, dyIn.rank());
  int64_t outer, len, inner;
  splitAxis(dyIn, a, outer, len, inner);
  if (outer * len * inner == 0)
    return;
  std::vector<Scratch> keep;
  TensorView dy = safeInPlace(dyIn, dx) ? dyIn : copyToScratch(k, ctx.stream, dyIn, keep);
  TensorView y = safeInPlace(yIn, dx) ? yIn : copyToScratch(k, ctx.stream, yIn, keep);
  TensorView out = dx;
  F32Staging staging(k, ctx.stream);
  if (!(dy.dtype == y.dtype && y.dtype == dx.dtype)) {
    dy = staging.in(dy);
    y = staging.in(y);
    out = staging.out(dx);
  }
  dispatchFloat(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto gp = static_cast<const T *>(dy.data), pp = static_cast<const T *>(y.data);
    auto op = static_cast<T *>(out.data);
    if (inner == 1) {
      int vw = rowVectorWidth<T>({dy.data, y.data, out.data});
      RowLaunch l = rowLaunch(outer, len, vw);
      if (vw > 1)
        softmaxGradRowKernel<T, kVec<T>>
            <<<l.grid, l.block, 0, ctx.stream>>>(gp, pp, op, outer, len);
      else
        softmaxGradRowKernel<T, 1><<<l.grid, l.block, 0, ctx.stream>>>(gp, pp, op, outer, len);
      checkLaunch(k, "softmaxGradRowKernel");
    } else {
      softmaxGradColumnKernel<T><<<gridFor(k, outer * inner, 256), 256, 0, ctx.stream>>>(
          gp, pp, op, outer, len, inner);
      checkLaunch(k, "softmaxGradColumnKernel");
    }
  });
  staging.finish();
}

void rmsNormGrad(const Context &ctx, const TensorView &dy, const TensorView &x,
                 const TensorView &w, double eps, const TensorView &dx, const TensorView &dw) {
  normGrad<false>("rms_norm_grad", ctx, dy, x, w, eps, dx, dw, nullptr);
}

void layerNormGrad(const Context &ctx, const TensorView &dy, const TensorView &x,
                   const TensorView &w, double eps, const TensorView &dx, const TensorView &dw,
                   const TensorView &db) {
  normGrad<true>("layer_norm_grad", ctx, dy, x, w, eps, dx, dw, &db);
}

void addRmsNorm(const Context &ctx, const TensorView &lhs, const TensorView &rhs,
                const TensorView &w, double eps, const TensorView &sum, const TensorView &y) {
  norm<false>("add_rms_norm", ctx, lhs, w, nullptr, eps, y, &rhs, &sum);
}

void addLayerNorm(const Context &ctx, const TensorView &lhs, const TensorView &rhs,
                  const TensorView &w, const TensorView &b, double eps, const TensorView &sum,
                  const TensorView &y) {
  norm<true>("add_layer_norm", ctx, lhs, w, &b, eps, y, &rhs, &sum);
}

void rmsNormGradAdd(const Context &ctx, const TensorView &dy, const TensorView &x,
                    const TensorView &w, const TensorView &addend, double eps,
                    const TensorView &dx, const TensorView &dw) {
  normGrad<false>("rms_norm_grad_add", ctx, dy, x, w, eps, dx, dw, nullptr, &addend);
}

void layerNormGradAdd(const Context &ctx, const TensorView &dy, const TensorView &x,
                      const TensorView &w, const TensorView &addend, double eps,
                      const TensorView &dx, const TensorView &dw, const TensorView &db) {
  normGrad<true>("layer_norm_grad_add", ctx, dy, x, w, eps, dx, dw, &db, &addend);
}

} // namespace bonsai::rt::cuda
