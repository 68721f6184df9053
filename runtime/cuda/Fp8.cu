//===- Fp8.cu - FP8 casts with their statistics, and delayed scaling ------===//
//
// castToFp8 reads the input once: each thread converts 16-byte vectors of the input to FP8
// codes with the hardware conversion (cvt.rn.satfinite), and counts, in registers, the input's
// amax and the values that underflow or saturate; a block reduces its threads' counts in a fixed
// order and adds them to the statistics with one atomic per counter. The conversion and the
// counting follow fp8::encode and fp8::castScaled exactly (every NaN becomes 0x7F).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaFp8.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"
#include "GemmImpl.h"

#include <cuda_fp8.h>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

/// Per-thread statistics of the values a thread converted.
struct Counts {
  float amax = 0.0f;
  uint32_t underflows = 0, saturations = 0;

  /// The codes of x0 * scale (low byte) and x1 * scale, as fp8::encode gives them, counted as
  /// fp8::castScaled counts them; one conversion instruction for the pair and no branches, as
  /// the cast runs at memory speed only if it spends few instructions per element. fmaxf skips
  /// a NaN input; a NaN product compares false with everything (neither saturated nor an
  /// underflow) and becomes 0x7F; a saturated product is never an underflow, its code being
  /// the largest finite one.
  template <bool E4M3>
  __device__ __forceinline__ uint16_t convert2(float x0, float x1, float scale) {
    amax = fmaxf(amax, fmaxf(fabsf(x0), fabsf(x1)));
    const float y0 = x0 * scale, y1 = x1 * scale;
    constexpr float limit = E4M3 ? 448.0f : 57344.0f;
    const uint32_t pair = __nv_cvt_float2_to_fp8x2(make_float2(y0, y1), __NV_SATFINITE,
                                                   E4M3 ? __NV_E4M3 : __NV_E5M2);
    const uint32_t c0 = isnan(y0) ? 0x7Fu : (pair & 0xFFu);
    const uint32_t c1 = isnan(y1) ? 0x7Fu : (pair >> 8);
    saturations += uint32_t(fabsf(y0) > limit) + uint32_t(fabsf(y1) > limit);
    underflows += uint32_t(y0 != 0.0f && (c0 & 0x7Fu) == 0) +
                  uint32_t(y1 != 0.0f && (c1 & 0x7Fu) == 0);
    return uint16_t(c0 | (c1 << 8));
  }

  /// One value (a zero partner adds nothing to the counts).
  template <bool E4M3> __device__ __forceinline__ uint8_t convert(float x, float scale) {
    return uint8_t(convert2<E4M3>(x, 0.0f, scale));
  }
};

/// Adds a block's counts to *stats (nothing when null): a reduction in a fixed order, then one
/// atomic per counter; `count` is what this block adds to stats->count. Every thread of the
/// block calls it.
__device__ void addCounts(const Counts &counts, Fp8CastStats *stats, int64_t count) {
  if (!stats)
    return;
  __shared__ float amax[kThreads / 32];
  __shared__ uint32_t under[kThreads / 32], sat[kThreads / 32];
  float a = counts.amax;
  uint32_t u = counts.underflows, s = counts.saturations;
  for (int offset = 16; offset > 0; offset /= 2) {
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, offset));
    u += __shfl_xor_sync(0xffffffffu, u, offset);
    s += __shfl_xor_sync(0xffffffffu, s, offset);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    amax[warp] = a;
    under[warp] = u;
    sat[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x != 0)
    return;
  for (int w = 1; w < kThreads / 32; ++w) {
    a = fmaxf(amax[0], amax[w]);
    amax[0] = a;
    under[0] += under[w];
    sat[0] += sat[w];
  }
  atomicMax(&stats->amaxBits, __float_as_uint(amax[0]));
  if (under[0])
    atomicAdd(&stats->underflows, (unsigned long long)under[0]);
  if (sat[0])
    atomicAdd(&stats->saturations, (unsigned long long)sat[0]);
  if (count)
    atomicAdd(&stats->count, (unsigned long long)count);
}

/// VW elements per access: 16 bytes of input (VW = 16 / sizeof(T)), VW bytes of output; VW = 1
/// for operands that are not aligned for vectors.
template <typename T, int VW, bool E4M3>
__global__ void __launch_bounds__(kThreads)
    castKernel(const T *x, uint8_t *out, int64_t n, const float *scalePtr, Fp8CastStats *stats) {
  const float scale = scalePtr ? *scalePtr : 1.0f;
  Counts counts;
  const int64_t vectors = n / VW;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    float in[VW];
    loadF<VW>(x + v * VW, in);
    uint8_t codes[VW];
    if constexpr (VW == 1) {
      codes[0] = counts.convert<E4M3>(in[0], scale);
    } else {
#pragma unroll
      for (int i = 0; i < VW; i += 2) {
        const uint16_t pair = counts.convert2<E4M3>(in[i], in[i + 1], scale);
        codes[i] = uint8_t(pair);
        codes[i + 1] = uint8_t(pair >> 8);
      }
    }
    *reinterpret_cast<typename RawType<VW>::type *>(out + v * VW) =
        *reinterpret_cast<const typename RawType<VW>::type *>(codes);
  }
  // The tail (fewer than VW elements) goes to the first threads.
  for (int64_t i = vectors * VW + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = counts.convert<E4M3>(toFloat(x[i]), scale);
  addCounts(counts, stats, blockIdx.x == 0 ? n : 0);
}

__global__ void updateScaleKernel(const Fp8CastStats *stats, float *history, int64_t length,
                                  const int64_t *step, float *scale, float *descale,
                                  float maxFinite, int margin) {
  history[*step % length] = __uint_as_float(stats->amaxBits);
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < length; ++i) {
    finite = finite && isfinite(history[i]);
    amax = fmaxf(amax, history[i]);
  }
  if (finite && amax > 0.0f)
    *scale = float(double(maxFinite) / double(amax) / ldexp(1.0, margin));
  if (descale)
    *descale = 1.0f / *scale;
}

template <typename T, int VW>
void launchCast(const char *kn, Stream stream, const TensorView &x, const TensorView &out,
                const float *scale, Fp8CastStats *stats) {
  const int64_t n = x.numel();
  unsigned blocks = gridFor(kn, std::max<int64_t>(n / VW, 1), kThreads);
  const T *in = static_cast<const T *>(x.data);
  auto *codes = static_cast<uint8_t *>(out.data);
  if (out.dtype == DType::F8E4M3FN)
    castKernel<T, VW, true><<<blocks, kThreads, 0, stream>>>(in, codes, n, scale, stats);
  else
    castKernel<T, VW, false><<<blocks, kThreads, 0, stream>>>(in, codes, n, scale, stats);
  checkLaunch(kn, "castKernel");
}

/// The scale a cast uses when it has no delayed scale (fp8::currentScale, bit for bit).
__device__ __forceinline__ float currentScaleOf(float amax, float maxFinite, int margin) {
  if (!isfinite(amax) || !(amax > 0.0f))
    return 1.0f;
  return float(double(maxFinite) / double(amax) / ldexp(1.0, margin));
}

/// Whether a state's scale is one a cast may use (not the 0 of a state never updated).
__device__ __forceinline__ bool usableScale(float scale) {
  return isfinite(scale) && scale > 0.0f;
}

/// The end of an FP8 GEMM kernel's workspace (fp8::gemmWorkspaceBytes keeps 256 bytes for it):
/// the statistics of the two casts and the scales they used. Each descale, which cuBLASLt reads
/// through a scale pointer, has a 16-byte slot of its own: with a pointer aligned to less,
/// cuBLASLt answers "not supported".
struct Fp8Control {
  Fp8CastStats stats[2];
  float scale[2];
  struct alignas(16) Descale {
    float value;
  } descale[2];
};
static_assert(sizeof(Fp8Control) <= 256, "fp8::gemmWorkspaceBytes keeps 256 bytes");

/// What the kernels need to know of one cast operand.
struct CastOperand {
  const float *stateScale; ///< the state row's scale
  float maxFinite;
};

/// Reduces |x| into stats->amaxBits, unless the cast can use the state's scale: the amax pass
/// that current scaling, and delayed scaling before its first update, need before the cast.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    amaxKernel(const T *x, int64_t n, const float *stateScale, bool current,
               Fp8CastStats *stats) {
  if (!current && usableScale(*stateScale))
    return;
  constexpr int VW = kVec<T>;
  Counts counts;
  const int64_t vectors = n / VW;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    float in[VW];
    loadF<VW>(x + v * VW, in);
#pragma unroll
    for (int i = 0; i < VW; ++i)
      if (!isnan(in[i]))
        counts.amax = fmaxf(counts.amax, fabsf(in[i]));
  }
  for (int64_t i = vectors * VW + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float v = toFloat(x[i]);
    if (!isnan(v))
      counts.amax = fmaxf(counts.amax, fabsf(v));
  }
  addCounts(counts, stats, 0);
}

/// Thread i picks operand i's scale: the state's, or under current scaling (or before the
/// first update) the one of the amax just reduced; then clears that amax for the cast, which
/// counts it again.
__global__ void resolveScalesKernel(CastOperand a, CastOperand b, bool current, int margin,
                                    Fp8Control *control) {
  const int i = threadIdx.x;
  if (i > 1)
    return;
  const CastOperand &op = i == 0 ? a : b;
  float scale = *op.stateScale;
  if (current || !usableScale(scale))
    scale = currentScaleOf(__uint_as_float(control->stats[i].amaxBits), op.maxFinite, margin);
  control->scale[i] = scale;
  control->descale[i].value = 1.0f / scale;
  control->stats[i].amaxBits = 0;
}

/// out [cols, rows] = the codes of x [rows, cols] transposed, cast as castKernel casts (the
/// operands of the backward GEMMs, which cuBLASLt takes only as "TN"). A block converts a 64 x 64
/// tile: 8-element row vectors in (rows and cols are multiples of 16), 16-byte column chunks out
/// through shared memory.
template <typename T, bool E4M3>
__global__ void __launch_bounds__(kThreads)
    castTransposeKernel(const T *x, uint8_t *out, int64_t rows, int64_t cols,
                        const float *scalePtr, Fp8CastStats *stats) {
  constexpr int kTile = 64;
  __shared__ uint8_t tile[kTile][kTile + 16];
  const float scale = *scalePtr;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  Counts counts;
  for (int v = threadIdx.x; v < kTile * kTile / 8; v += kThreads) {
    const int r = v / (kTile / 8), c = (v % (kTile / 8)) * 8;
    if (r0 + r >= rows || c0 + c >= cols)
      continue;
    const T *p = x + (r0 + r) * cols + c0 + c;
    float in[8];
    if constexpr (sizeof(T) == 4) {
      float lo[4], hi[4];
      loadF<4>(p, lo);
      loadF<4>(p + 4, hi);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        in[i] = lo[i];
        in[4 + i] = hi[i];
      }
    } else {
      loadF<8>(p, in);
    }
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const uint16_t pair = counts.convert2<E4M3>(in[i], in[i + 1], scale);
      tile[r][c + i] = uint8_t(pair);
      tile[r][c + i + 1] = uint8_t(pair >> 8);
    }
  }
  __syncthreads();
  for (int v = threadIdx.x; v < kTile * kTile / 16; v += kThreads) {
    const int oc = v / (kTile / 16), chunk = (v % (kTile / 16)) * 16;
    if (c0 + oc >= cols || r0 + chunk >= rows)
      continue;
    uint8_t bytes[16];
#pragma unroll
    for (int i = 0; i < 16; ++i)
      bytes[i] = tile[chunk + i][oc];
    *reinterpret_cast<uint4 *>(out + (c0 + oc) * rows + r0 + chunk) =
        *reinterpret_cast<const uint4 *>(bytes);
  }
  addCounts(counts, stats, blockIdx.x == 0 && blockIdx.y == 0 ? rows * cols : 0);
}

/// stats [2, 4] = per operand: amax, underflow and saturation fractions, scale used.
__global__ void writeStatsKernel(const Fp8Control *control, float *stats) {
  const int i = threadIdx.x;
  if (i > 1)
    return;
  const Fp8CastStats &s = control->stats[i];
  const double count = double(s.count);
  float *row = stats + i * fp8::kStatsColumns;
  row[fp8::StatsAmax] = __uint_as_float(s.amaxBits);
  row[fp8::StatsUnderflow] = s.count ? float(double(s.underflows) / count) : 0.0f;
  row[fp8::StatsSaturation] = s.count ? float(double(s.saturations) / count) : 0.0f;
  row[fp8::StatsScale] = control->scale[i];
}

/// Thread r updates state row r from its stats row (fp8::recordAmax, then fp8::delayedScale).
__global__ void updateScalesKernel(const int64_t *step, const float *forward,
                                   const float *backward, float *state, int64_t columns,
                                   int margin) {
  const int r = threadIdx.x;
  if (r > 2)
    return;
  const float *stats = r < 2 ? forward + r * fp8::kStatsColumns : backward;
  if (!stats)
    return; // no backward GEMM: the output gradient's row keeps its values
  float *row = state + r * columns;
  float *history = row + fp8::kStateColumns;
  const int64_t length = columns - fp8::kStateColumns;
  const float amax = stats[fp8::StatsAmax];
  history[*step % length] = amax;
  float largest = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < length; ++i) {
    finite = finite && isfinite(history[i]);
    largest = fmaxf(largest, history[i]);
  }
  const float maxFinite = r == fp8::OutputGradRow ? 57344.0f : 448.0f;
  if (finite && largest > 0.0f)
    row[fp8::ScaleColumn] = float(double(maxFinite) / double(largest) / ldexp(1.0, margin));
  row[fp8::AmaxColumn] = amax;
  row[fp8::UnderflowColumn] = stats[fp8::StatsUnderflow];
  row[fp8::SaturationColumn] = stats[fp8::StatsSaturation];
}

/// One operand of an FP8 GEMM kernel as the host sees it.
struct GemmOperand {
  const TensorView *x;
  int64_t rows, cols;   ///< x as a [rows, cols] matrix
  bool transpose;       ///< cast to [cols, rows] codes
  fp8::StateRow row;
  const char *name;
};

/// Casts the two operands of an FP8 GEMM into the workspace (codes, control) and returns the
/// control block: amax passes where needed, the scales, then the casts.
Fp8Control *castOperands(const Context &ctx, const char *kn, const GemmOperand (&ops)[2],
                         const TensorView &state, bool current, int margin,
                         const TensorView &workspace, uint8_t *(&codes)[2]) {
  const int64_t columns = state.dim(1);
  auto *base = static_cast<uint8_t *>(workspace.data);
  const int64_t aBytes = (ops[0].x->numel() + 255) / 256 * 256;
  const int64_t bBytes = (ops[1].x->numel() + 255) / 256 * 256;
  codes[0] = base;
  codes[1] = base + aBytes;
  auto *control = reinterpret_cast<Fp8Control *>(base + aBytes + bBytes);
  checkCuda(cudaMemsetAsync(control, 0, sizeof(Fp8Control), ctx.stream), "cudaMemsetAsync",
            kn);
  CastOperand cast[2];
  for (int i = 0; i < 2; ++i) {
    const float *stateScale =
        static_cast<const float *>(state.data) + ops[i].row * columns + fp8::ScaleColumn;
    cast[i] = {stateScale, ops[i].row == fp8::OutputGradRow ? 57344.0f : 448.0f};
    const int64_t n = ops[i].x->numel();
    dispatchFloat(ops[i].x->dtype, [&](auto t) {
      using T = decltype(t);
      // One wave: in the steady state of delayed scaling every block only reads the state's
      // scale and returns, so the grid is kept small.
      amaxKernel<T><<<gridFor(kn, std::max<int64_t>(n / kVec<T>, 1), kThreads, 1), kThreads,
                      0, ctx.stream>>>(static_cast<const T *>(ops[i].x->data), n, stateScale,
                                       current, &control->stats[i]);
    });
    checkLaunch(kn, "amaxKernel");
  }
  resolveScalesKernel<<<1, 32, 0, ctx.stream>>>(cast[0], cast[1], current, margin, control);
  checkLaunch(kn, "resolveScalesKernel");
  for (int i = 0; i < 2; ++i) {
    const GemmOperand &op = ops[i];
    const bool e4m3 = op.row != fp8::OutputGradRow;
    dispatchFloat(op.x->dtype, [&](auto t) {
      using T = decltype(t);
      const T *x = static_cast<const T *>(op.x->data);
      if (op.transpose) {
        dim3 grid(unsigned((op.cols + 63) / 64), unsigned((op.rows + 63) / 64));
        if (grid.y > 65535u)
          fail(kn, std::string(op.name) + " has too many rows for the transposing cast");
        if (e4m3)
          castTransposeKernel<T, true><<<grid, kThreads, 0, ctx.stream>>>(
              x, codes[i], op.rows, op.cols, &control->scale[i], &control->stats[i]);
        else
          castTransposeKernel<T, false><<<grid, kThreads, 0, ctx.stream>>>(
              x, codes[i], op.rows, op.cols, &control->scale[i], &control->stats[i]);
        checkLaunch(kn, "castTransposeKernel");
      } else {
        TensorView out{codes[i], e4m3 ? DType::F8E4M3FN : DType::F8E5M2, op.x->shape};
        launchCast<T, kVec<T>>(kn, ctx.stream, *op.x, out, &control->scale[i],
                               &control->stats[i]);
      }
    });
  }
  return control;
}

/// Checks an FP8 scaling state: f32 [3, 4 + H], H >= 1.
void checkState(const char *kn, const TensorView &state) {
  checkView(kn, "state", state);
  if (state.dtype != DType::F32 || state.rank() != 2 || state.dim(0) != 3 ||
      state.dim(1) < fp8::kStateColumns + 1)
    fail(kn, "state must be f32 [3, 4 + H] with H >= 1");
}

/// Checks what every FP8 GEMM kernel shares: the state, stats and workspace operands, and
/// the operands' dtypes and divisibility.
void checkFp8Operands(const char *kn, const GemmOperand (&ops)[2], const TensorView &state,
                      const TensorView &stats, const TensorView &workspace) {
  for (const GemmOperand &op : ops) {
    checkFloat(kn, op.name, *op.x);
    if (op.rows % 16 || op.cols % 16)
      fail(kn, std::string(op.name) + " is " + std::to_string(op.rows) + " x " +
                   std::to_string(op.cols) + ": FP8 GEMMs need multiples of 16");
    if (!aligned16(op.x->data))
      fail(kn, std::string(op.name) + " must start on a 16-byte boundary");
  }
  checkState(kn, state);
  checkView(kn, "stats", stats);
  if (stats.dtype != DType::F32 || stats.numel() != 2 * fp8::kStatsColumns)
    fail(kn, "stats must be f32 [2, 4]");
  checkView(kn, "workspace", workspace);
  const int64_t need = fp8::gemmWorkspaceBytes(ops[0].x->numel(), ops[1].x->numel());
  if (workspace.dtype != DType::F32 || workspace.numel() * 4 < need ||
      reinterpret_cast<uintptr_t>(workspace.data) % 256)
    fail(kn, "workspace must be f32 holding " + std::to_string(need) +
                 " bytes from a 256-byte boundary (fp8::gemmWorkspaceBytes)");
}

/// Runs the FP8 GEMM out = codes[0] · codes[1]ᵀ of `ops` (m x k and n x k codes), or
/// out += that product when `accumulate`.
void runGemm(const Context &ctx, const char *kn, const GemmOperand (&ops)[2],
             uint8_t *const (&codes)[2], const Fp8Control *control, int64_t m, int64_t n,
             int64_t k, const TensorView &out, const TensorView *bias, bool accumulate = false) {
  if (!ctx.gemm)
    fail(kn, "the context has no GemmEngine");
  checkFloat(kn, "output", out);
  if (!aligned16(out.data))
    fail(kn, "the output must start on a 16-byte boundary");
  Fp8GemmCall call;
  call.aType = ops[0].row == fp8::OutputGradRow ? DType::F8E5M2 : DType::F8E4M3FN;
  call.bType = ops[1].row == fp8::OutputGradRow ? DType::F8E5M2 : DType::F8E4M3FN;
  call.dType = out.dtype;
  call.m = m;
  call.n = n;
  call.k = k;
  call.a = codes[0];
  call.b = codes[1];
  call.d = out.data;
  call.descaleA = &control->descale[0].value;
  call.descaleB = &control->descale[1].value;
  call.accumulate = accumulate;
  if (bias) {
    checkFloat(kn, "bias", *bias);
    if (bias->dtype != out.dtype || bias->numel() != n || !aligned16(bias->data))
      fail(kn, "bias must be [" + std::to_string(n) + "] of the output's dtype, 16-byte "
                                                          "aligned");
    call.bias = bias->data;
  }
  ltEngineOf(kn, *ctx.gemm).runFp8(kn, ctx.stream, call);
}

void writeStats(const Context &ctx, const char *kn, const Fp8Control *control,
                const TensorView &stats) {
  writeStatsKernel<<<1, 32, 0, ctx.stream>>>(control, static_cast<float *>(stats.data));
  checkLaunch(kn, "writeStatsKernel");
}

/// [rows, cols] of a tensor seen as a matrix over its last dimension.
std::pair<int64_t, int64_t> asMatrix(const char *kn, const char *name, const TensorView &t) {
  if (t.rank() < 1)
    fail(kn, std::string(name) + " must have at least one dimension");
  const int64_t cols = t.dim(t.rank() - 1);
  return {cols ? t.numel() / cols : 0, cols};
}

} // namespace

void castToFp8(const Context &ctx, const TensorView &x, const float *scale,
               const TensorView &out, Fp8CastStats *stats) {
  const char *kn = "cast_to_fp8";
  checkFloat(kn, "x", x);
  checkView(kn, "out", out);
  if (out.dtype != DType::F8E4M3FN && out.dtype != DType::F8E5M2)
    fail(kn, std::string("out must be f8e4m3fn or f8e5m2, got ") + dtypeName(out.dtype));
  checkSameShape(kn, "x", x, "out", out);
  if (x.numel() == 0)
    return;
  dispatchFloat(x.dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int VW = kVec<T>;
    if (aligned16(x.data) && (reinterpret_cast<uintptr_t>(out.data) % VW) == 0)
      launchCast<T, VW>(kn, ctx.stream, x, out, scale, stats);
    else
      launchCast<T, 1>(kn, ctx.stream, x, out, scale, stats);
  });
}

void updateDelayedScale(const Context &ctx, const Fp8CastStats *stats, float *history,
                        int64_t length, const int64_t *step, float *scale, float *descale,
                        fp8::Format format, int margin) {
  const char *kn = "fp8_update_scale";
  if (!stats || !history || !step || !scale)
    fail(kn, "stats, history, step and scale must all be device pointers");
  if (length < 1)
    fail(kn, "the amax history needs at least one entry, got " + std::to_string(length));
  updateScaleKernel<<<1, 1, 0, ctx.stream>>>(stats, history, length, step, scale, descale,
                                             fp8::maxFinite(format), margin);
  checkLaunch(kn, "updateScaleKernel");
}

void fp8Linear(const Context &ctx, const TensorView &x, const TensorView &w,
               const TensorView &state, const TensorView *bias, bool current, int margin,
               const TensorView &y, const TensorView &stats, const TensorView &workspace) {
  const char *kn = "fp8_linear";
  auto [m, k] = asMatrix(kn, "x", x);
  auto [n, wk] = asMatrix(kn, "w", w);
  if (w.rank() != 2 || wk != k)
    fail(kn, "w must be [N, " + std::to_string(k) + "] for x [..., " + std::to_string(k) + "]");
  auto [ym, yn] = asMatrix(kn, "y", y);
  if (ym != m || yn != n)
    fail(kn, "y must be [..., " + std::to_string(n) + "] with x's leading dimensions");
  const GemmOperand ops[2] = {{&x, m, k, false, fp8::InputRow, "x"},
                              {&w, n, k, false, fp8::WeightRow, "w"}};
  checkFp8Operands(kn, ops, state, stats, workspace);
  uint8_t *codes[2];
  Fp8Control *control = castOperands(ctx, kn, ops, state, current, margin, workspace, codes);
  runGemm(ctx, kn, ops, codes, control, m, n, k, y, bias);
  writeStats(ctx, kn, control, stats);
}

void fp8LinearGradInput(const Context &ctx, const TensorView &dy, const TensorView &w,
                        const TensorView &state, bool current, int margin, const TensorView &dx,
                        const TensorView &stats, const TensorView &workspace) {
  const char *kn = "fp8_linear_grad_input";
  auto [m, n] = asMatrix(kn, "dy", dy);
  auto [wn, k] = asMatrix(kn, "w", w);
  if (w.rank() != 2 || wn != n)
    fail(kn, "w must be [" + std::to_string(n) + ", K] for dy [..., " + std::to_string(n) + "]");
  auto [xm, xk] = asMatrix(kn, "dx", dx);
  if (xm != m || xk != k)
    fail(kn, "dx must be [..., " + std::to_string(k) + "] with dy's leading dimensions");
  // dx [m, k] = dy [m, n] · (wᵀ [k, n])ᵀ.
  const GemmOperand ops[2] = {{&dy, m, n, false, fp8::OutputGradRow, "dy"},
                              {&w, n, k, true, fp8::WeightRow, "w"}};
  checkFp8Operands(kn, ops, state, stats, workspace);
  uint8_t *codes[2];
  Fp8Control *control = castOperands(ctx, kn, ops, state, current, margin, workspace, codes);
  runGemm(ctx, kn, ops, codes, control, m, k, n, dx, nullptr);
  writeStats(ctx, kn, control, stats);
}

/// fp8LinearGradWeight into dw, or added to it when `accumulate` (kind 94's accumulator).
static void gradWeight(const Context &ctx, const char *kn, const TensorView &dy,
                       const TensorView &x, const TensorView &state, bool current, int margin,
                       const TensorView &dw, const char *dwName, const TensorView &stats,
                       const TensorView &workspace, bool accumulate) {
  auto [m, n] = asMatrix(kn, "dy", dy);
  auto [xm, k] = asMatrix(kn, "x", x);
  if (xm != m)
    fail(kn, "dy and x must have the same leading dimensions");
  if (dw.rank() != 2 || dw.dim(0) != n || dw.dim(1) != k)
    fail(kn, std::string(dwName) + " must be [" + std::to_string(n) + ", " + std::to_string(k) +
                 "]");
  // dw [n, k] = (dyᵀ [n, m]) · (xᵀ [k, m])ᵀ: both operands cast transposed.
  const GemmOperand ops[2] = {{&dy, m, n, true, fp8::OutputGradRow, "dy"},
                              {&x, m, k, true, fp8::InputRow, "x"}};
  checkFp8Operands(kn, ops, state, stats, workspace);
  uint8_t *codes[2];
  Fp8Control *control = castOperands(ctx, kn, ops, state, current, margin, workspace, codes);
  runGemm(ctx, kn, ops, codes, control, n, k, m, dw, nullptr, accumulate);
  writeStats(ctx, kn, control, stats);
}

void fp8LinearGradWeight(const Context &ctx, const TensorView &dy, const TensorView &x,
                         const TensorView &state, bool current, int margin,
                         const TensorView &dw, const TensorView &stats,
                         const TensorView &workspace) {
  gradWeight(ctx, "fp8_linear_grad_weight", dy, x, state, current, margin, dw, "dw", stats,
             workspace, /*accumulate=*/false);
}

void fp8LinearGradWeightAccumulate(const Context &ctx, const TensorView &dy, const TensorView &x,
                                   const TensorView &state, bool current, int margin,
                                   const TensorView &stats, const TensorView &workspace,
                                   const TensorView &acc) {
  gradWeight(ctx, "fp8_linear_grad_weight_accumulate", dy, x, state, current, margin, acc, "acc",
             stats, workspace, /*accumulate=*/true);
}

void fp8UpdateScales(const Context &ctx, const TensorView &step, const TensorView &forward,
                     const TensorView *backward, int margin, const TensorView &state) {
  const char *kn = "fp8_update_scales";
  checkView(kn, "step", step);
  if (step.dtype != DType::I64 || step.numel() != 1)
    fail(kn, "step must be an i64 scalar");
  for (const TensorView *stats : {&forward, backward}) {
    if (!stats)
      continue;
    checkView(kn, "stats", *stats);
    if (stats->dtype != DType::F32 || stats->numel() != 2 * fp8::kStatsColumns)
      fail(kn, "stats must be f32 [2, 4]");
  }
  checkState(kn, state);
  updateScalesKernel<<<1, 32, 0, ctx.stream>>>(
      static_cast<const int64_t *>(step.data), static_cast<const float *>(forward.data),
      backward ? static_cast<const float *>(backward->data) : nullptr,
      static_cast<float *>(state.data), state.dim(1), margin);
  checkLaunch(kn, "updateScalesKernel");
}

} // namespace bonsai::rt::cuda
