//===- Fp8.cu - FP8 casts with their statistics, and delayed scaling ------===//
//
// A cast reads its input once: each thread converts 16-byte vectors of the input to FP8 codes
// with the hardware conversion (cvt.rn.satfinite), and counts, in registers, the input's amax
// and the values that underflow or saturate; a block reduces its threads' counts in a fixed
// order and adds them to the statistics with one atomic per counter. The conversion and the
// counting follow fp8::encode and fp8::castScaled exactly (every NaN becomes 0x7F), so the
// codes and counts do not depend on how the work is split among threads and blocks.
//
// An FP8 GEMM kernel (plan kinds Fp8Linear .. Fp8LinearGradWeight) runs two kernels before its
// cuBLASLt GEMM: one amax pass over both operands (which, in the steady state of delayed scaling,
// only reads the state's scales and returns), and one launch that casts both operands, each block
// taking its scale from the state or the amax pass, and whose last block writes the stats.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaFp8.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"
#include "GemmImpl.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <array>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

/// The FP8 codes of (y0, y1), saturating to the largest finite code: cvt.rn.satfinite where the
/// hardware has it (sm_89 and later). Below sm_89, CUDA's fallback is a long software routine;
/// inlined into each of the casts' unrolled loops it took nvcc about 400 s per such
/// architecture for this file (and made it the build's longest step by far), so there it is
/// one out-of-line function. Those architectures run no FP8 GEMMs, only these casts.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#define BONSAI_FP8_CONVERT_INLINING __noinline__
#else
#define BONSAI_FP8_CONVERT_INLINING __forceinline__
#endif
template <bool E4M3> __device__ BONSAI_FP8_CONVERT_INLINING uint32_t toFp8x2(float y0, float y1) {
  return __nv_cvt_float2_to_fp8x2(make_float2(y0, y1), __NV_SATFINITE,
                                  E4M3 ? __NV_E4M3 : __NV_E5M2);
}

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
    const uint32_t pair = toFp8x2<E4M3>(y0, y1);
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

  /// The codes of VW consecutive values (VW = 1, 4 or 8), in one word of VW bytes: byte i is
  /// the code of in[i].
  template <bool E4M3, int VW>
  __device__ __forceinline__ typename RawType<VW>::type convertVector(const float (&in)[VW],
                                                                      float scale) {
    if constexpr (VW == 1) {
      return convert<E4M3>(in[0], scale);
    } else {
      static_assert(VW % 4 == 0, "whole words of codes");
      uint32_t words[VW / 4];
#pragma unroll
      for (int w = 0; w < VW / 4; ++w)
        words[w] = uint32_t(convert2<E4M3>(in[4 * w], in[4 * w + 1], scale)) |
                   uint32_t(convert2<E4M3>(in[4 * w + 2], in[4 * w + 3], scale)) << 16;
      typename RawType<VW>::type out;
      memcpy(&out, words, sizeof out);
      return out;
    }
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

/// Vectors a thread of a plain cast, or of the amax pass, loads before it converts any: enough
/// bytes in flight to keep HBM busy at the occupancy these kernels get.
constexpr int kUnroll = 8;

/// Casts x [n] to out [n] with `scale`, adding to `counts`: this block's share, `block` of
/// `blocks` (each takes kUnroll * kThreads vectors of VW elements at a time, each thread kUnroll
/// vectors whose loads are all issued before the first conversion), then the tail of fewer than
/// VW elements. VW = kVec<T> needs x 16-byte aligned and out aligned to VW bytes; VW = 1 takes
/// any alignment.
template <typename T, int VW, bool E4M3>
__device__ __forceinline__ void castPlain(const T *__restrict__ x, uint8_t *__restrict__ out,
                                          int64_t n, float scale, int64_t block, int64_t blocks,
                                          Counts &counts) {
  using In = RawOf<VW, T>;
  using Out = typename RawType<VW>::type;
  const int64_t vectors = n / VW;
  const int64_t chunk = int64_t(kUnroll) * kThreads;
  for (int64_t base = block * chunk; base < vectors; base += blocks * chunk) {
    In raw[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t v = base + j * kThreads + threadIdx.x;
      if (v < vectors)
        raw[j] = loadRaw<VW>(x + v * VW);
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t v = base + j * kThreads + threadIdx.x;
      if (v < vectors) {
        float in[VW];
        unpackF<VW, T>(raw[j], in);
        *reinterpret_cast<Out *>(out + v * VW) = counts.convertVector<E4M3, VW>(in, scale);
      }
    }
  }
  // The tail (fewer than VW elements) goes to the first threads of block 0.
  for (int64_t i = vectors * VW + block * kThreads + threadIdx.x; i < n; i += blocks * kThreads)
    out[i] = counts.convert<E4M3>(toFloat(x[i]), scale);
}

/// Blocks of castPlain<T, VW> over n elements: one chunk each.
template <int VW> unsigned plainBlocks(int64_t n) {
  const int64_t chunk = int64_t(kUnroll) * kThreads;
  return unsigned(std::clamp<int64_t>((n / VW + chunk - 1) / chunk, 1, 1 << 30));
}

/// castToFp8's kernel: x [n] to out [n] with *scalePtr (1 when null), counted into *stats
/// (nothing when null).
template <typename T, int VW, bool E4M3>
__global__ void __launch_bounds__(kThreads)
    castKernel(const T *x, uint8_t *out, int64_t n, const float *scalePtr, Fp8CastStats *stats) {
  const float scale = scalePtr ? *scalePtr : 1.0f;
  Counts counts;
  castPlain<T, VW, E4M3>(x, out, n, scale, blockIdx.x, gridDim.x, counts);
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
  const unsigned blocks = plainBlocks<VW>(n);
  const T *in = static_cast<const T *>(x.data);
  auto *codes = static_cast<uint8_t *>(out.data);
  if (out.dtype == DType::F8E4M3FN)
    castKernel<T, VW, true><<<blocks, kThreads, 0, stream>>>(in, codes, n, scale, stats);
  else
    castKernel<T, VW, false><<<blocks, kThreads, 0, stream>>>(in, codes, n, scale, stats);
  checkLaunch(kn, "castKernel");
}

/// Rows and columns of a transposing cast's tile: a block of kThreads threads casts one, each
/// thread an 8 x 8 piece (8 loads of 16 bytes in flight; two per row for f32).
constexpr int kTile = 128;
static_assert(kTile * kTile == 64 * kThreads, "one 8 x 8 piece per thread");

/// The 4 x 4 byte transpose: byte j of row word ri becomes byte i of column word cj.
__device__ __forceinline__ void transpose4x4(uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3,
                                             uint32_t &c0, uint32_t &c1, uint32_t &c2,
                                             uint32_t &c3) {
  const uint32_t a = __byte_perm(r0, r1, 0x5140), b = __byte_perm(r0, r1, 0x7362);
  const uint32_t c = __byte_perm(r2, r3, 0x5140), d = __byte_perm(r2, r3, 0x7362);
  c0 = __byte_perm(a, c, 0x5410);
  c1 = __byte_perm(a, c, 0x7632);
  c2 = __byte_perm(b, d, 0x5410);
  c3 = __byte_perm(b, d, 0x7632);
}

/// Casts tile `tile` (row-major over the tiles of x) of x [rows, cols] into out [cols, rows]
/// transposed, as castPlain casts, and when `plain` is not null also into plain [rows, cols]
/// (the same codes in x's layout: one read of x for both); rows and cols are multiples of 16,
/// x, out and plain 16-byte aligned. `smem` holds kTile * kTile bytes, 16-byte aligned; every
/// thread of the block calls this.
///
/// Thread t loads the 8 x 8 piece at rows 8 (t / 16), columns 8 (t % 16) of the tile (a half
/// warp reads 256 contiguous bytes of a row per load), converts it, transposes it in registers
/// (byte permutes) into 8 column runs of 8 codes, and stores each run as one 8-byte word in
/// shared memory: column c's 128 codes are one 128-byte line of 16 eight-byte units, unit u of
/// column c stored at u ^ (c / 8), so that the 16 threads of a half warp (same row group, 16
/// column groups) store into 16 different units: no bank conflicts. The block then writes each
/// column's codes as 16-byte chunks (two units: the swizzle keeps them in one 16-byte slot,
/// swapped when c / 8 is odd), 8 consecutive threads taking the 8 chunks of one column: one
/// 128-byte line of `out` per 8 threads, and again no bank conflicts. The plain codes go out
/// from registers, a row's 8 codes as one 8-byte word: 128 contiguous bytes per half warp.
template <typename T, bool E4M3>
__device__ __forceinline__ void
castTransposedTile(const T *__restrict__ x, uint8_t *__restrict__ out, uint8_t *__restrict__ plain,
                   int64_t rows, int64_t cols, float scale, int64_t tile, uint8_t *smem,
                   Counts &counts) {
  constexpr int VW = kVec<T>, L = 8 / VW; // loads per row of a piece
  const int64_t tilesC = std::max<int64_t>((cols + kTile - 1) / kTile, 1);
  const int64_t r0 = tile / tilesC * kTile, c0 = tile % tilesC * kTile;
  const int cg = threadIdx.x % 16, rg = threadIdx.x / 16;
  // rows and cols are multiples of 16: a piece is wholly inside x or wholly outside.
  if (r0 + rg * 8 < rows && c0 + cg * 8 < cols) {
    const T *p = x + (r0 + rg * 8) * cols + c0 + cg * 8;
    RawOf<VW, T> raw[8][L];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int l = 0; l < L; ++l)
        raw[i][l] = loadRaw<VW>(p + i * cols + l * VW);
    uint32_t lo[8], hi[8]; // codes of columns 0..3 and 4..7 of each row
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float in[8];
#pragma unroll
      for (int l = 0; l < L; ++l) {
        float part[VW];
        unpackF<VW, T>(raw[i][l], part);
#pragma unroll
        for (int e = 0; e < VW; ++e)
          in[l * VW + e] = part[e];
      }
      lo[i] = uint32_t(counts.convert2<E4M3>(in[0], in[1], scale)) |
              uint32_t(counts.convert2<E4M3>(in[2], in[3], scale)) << 16;
      hi[i] = uint32_t(counts.convert2<E4M3>(in[4], in[5], scale)) |
              uint32_t(counts.convert2<E4M3>(in[6], in[7], scale)) << 16;
    }
    if (plain) {
      uint8_t *q = plain + (r0 + rg * 8) * cols + c0 + cg * 8;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        *reinterpret_cast<uint2 *>(q + i * cols) = make_uint2(lo[i], hi[i]);
    }
    uint2 run[8]; // run[j]: rows 0..7 of column j
    transpose4x4(lo[0], lo[1], lo[2], lo[3], run[0].x, run[1].x, run[2].x, run[3].x);
    transpose4x4(lo[4], lo[5], lo[6], lo[7], run[0].y, run[1].y, run[2].y, run[3].y);
    transpose4x4(hi[0], hi[1], hi[2], hi[3], run[4].x, run[5].x, run[6].x, run[7].x);
    transpose4x4(hi[4], hi[5], hi[6], hi[7], run[4].y, run[5].y, run[6].y, run[7].y);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      *reinterpret_cast<uint2 *>(smem + (cg * 8 + j) * kTile + (rg ^ cg) * 8) = run[j];
  }
  __syncthreads();
#pragma unroll
  for (int pass = 0; pass < kTile * kTile / 16 / kThreads; ++pass) {
    const int q = pass * kThreads + threadIdx.x;
    const int c = q / 8, k = q % 8, swizzle = c / 8;
    if (c0 + c >= cols || r0 + k * 16 >= rows)
      continue;
    uint4 chunk = *reinterpret_cast<const uint4 *>(smem + c * kTile + (k ^ (swizzle >> 1)) * 16);
    if (swizzle & 1)
      chunk = make_uint4(chunk.z, chunk.w, chunk.x, chunk.y);
    *reinterpret_cast<uint4 *>(out + (c0 + c) * rows + r0 + k * 16) = chunk;
  }
}

/// Tiles of castTransposedTile over x [rows, cols] (at least one: a block with nothing to do
/// still adds its counts).
unsigned transposedBlocks(const char *kn, int64_t rows, int64_t cols) {
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  if (tiles >= (int64_t(1) << 30))
    fail(kn, "the tensor is too large for the transposing cast");
  return unsigned(std::max<int64_t>(tiles, 1));
}

/// castToFp8Transposed's kernel: one tile per block.
template <typename T, bool E4M3>
__global__ void __launch_bounds__(kThreads)
    castTransposedKernel(const T *x, uint8_t *out, int64_t rows, int64_t cols,
                         const float *scalePtr, Fp8CastStats *stats) {
  __shared__ alignas(16) uint8_t smem[kTile * kTile];
  const float scale = scalePtr ? *scalePtr : 1.0f;
  Counts counts;
  castTransposedTile<T, E4M3>(x, out, nullptr, rows, cols, scale, blockIdx.x, smem, counts);
  addCounts(counts, stats, blockIdx.x == 0 ? rows * cols : 0);
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

/// Blocks of the amax pass per operand, and their threads: few enough that their maxima fit in
/// the control block, so that the pass needs no zeroed accumulator (and no memset before it).
constexpr int kAmaxBlocks = 16;
constexpr int kAmaxThreads = 1024;

/// The end of an FP8 GEMM kernel's workspace, for its N cast operands (fp8::gemmWorkspaceBytes
/// keeps 256 bytes for the two of a GEMM; the fused backward's three have the 512 bytes of its
/// two GEMMs). The amax pass writes every one of its blocks' maxima (where it runs), and
/// clears the statistics and the block counter for the casts; the casts write the descales.
/// Each descale, which cuBLASLt reads through a scale pointer, has a 16-byte slot of its own:
/// with a pointer aligned to less, cuBLASLt answers "not supported".
template <int N> struct Fp8Control {
  float amax[N][kAmaxBlocks]; ///< per operand, the amax pass's blocks' maxima of |x|
  Fp8CastStats stats[N];
  unsigned castBlocksDone;
  struct alignas(16) Descale {
    float value;
  } descale[N];
};
static_assert(sizeof(Fp8Control<2>) <= 256, "fp8::gemmWorkspaceBytes keeps 256 bytes");
static_assert(sizeof(Fp8Control<3>) <= 512, "the fused backward keeps two GEMMs' 256 bytes");

/// N operands of a launch, passed by value as one kernel parameter.
template <typename Operand, int N> struct OperandList {
  Operand op[N];
};

/// What the amax pass needs to know of one operand.
struct AmaxOperand {
  const void *x;
  int64_t n;
  const float *stateScale; ///< the state row's scale
};

/// Whether operand casts need the amax pass: under current scaling, or while the state's scale
/// is not usable (before the first update).
__device__ __forceinline__ bool needsAmax(const float *stateScale, bool current) {
  return current || !usableScale(*stateScale);
}

/// The largest |x| (NaNs skipped) of block blockIdx.x's share of x [n] (16-byte aligned), as
/// thread 0 returns it. Every thread of the block calls it.
template <typename T>
__device__ __forceinline__ float blockAmax(const T *__restrict__ x, int64_t n) {
  constexpr int VW = kVec<T>;
  using In = RawOf<VW, T>;
  float amax = 0.0f;
  const int64_t vectors = n / VW;
  const int64_t chunk = int64_t(kUnroll) * kAmaxThreads;
  for (int64_t base = int64_t(blockIdx.x) * chunk; base < vectors;
       base += int64_t(kAmaxBlocks) * chunk) {
    In raw[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t v = base + j * kAmaxThreads + threadIdx.x;
      if (v < vectors)
        raw[j] = loadRaw<VW>(x + v * VW);
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t v = base + j * kAmaxThreads + threadIdx.x;
      if (v < vectors) {
        float in[VW];
        unpackF<VW, T>(raw[j], in);
#pragma unroll
        for (int i = 0; i < VW; ++i)
          if (!isnan(in[i]))
            amax = fmaxf(amax, fabsf(in[i]));
      }
    }
  }
  for (int64_t i = vectors * VW + int64_t(blockIdx.x) * kAmaxThreads + threadIdx.x; i < n;
       i += int64_t(kAmaxBlocks) * kAmaxThreads) {
    const float v = toFloat(x[i]);
    if (!isnan(v))
      amax = fmaxf(amax, fabsf(v));
  }
  __shared__ float warps[kAmaxThreads / 32];
  amax = warpReduce(amax, MaxOp{});
  if (threadIdx.x % 32 == 0)
    warps[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x < 32)
    amax = warpReduce(warps[threadIdx.x], MaxOp{});
  return amax;
}

/// The amax pass of an FP8 kernel's N casts (grid kAmaxBlocks x N, blockIdx.y the operand;
/// operand 1 has element type TB, the others TA): where an operand needs it, each block writes
/// the largest |x| of its share into control->amax; in the steady state of delayed scaling the
/// blocks only read the state's scale and return. It also clears the casts' statistics and
/// block counter, so that the workspace needs no memset.
template <int N, typename TA, typename TB>
__global__ void __launch_bounds__(kAmaxThreads)
    amaxKernel(OperandList<AmaxOperand, N> ops, bool current, Fp8Control<N> *control) {
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i)
      control->stats[i] = Fp8CastStats{};
    control->castBlocksDone = 0;
  }
  const int i = blockIdx.y;
  const AmaxOperand &op = ops.op[i];
  if (op.n == 0 || !needsAmax(op.stateScale, current))
    return; // n == 0: an operand another kernel has cast (its scale comes with its codes)
  const float amax = i == 1 ? blockAmax(static_cast<const TB *>(op.x), op.n)
                            : blockAmax(static_cast<const TA *>(op.x), op.n);
  if (threadIdx.x == 0)
    control->amax[i][blockIdx.x] = amax;
}

/// What the cast launch needs to know of one operand.
struct CastOperand {
  const void *x;
  uint8_t *codes;
  uint8_t *plainCodes;     ///< with `transpose`: also the codes in x's layout (or null)
  int64_t rows, cols;      ///< x as a [rows, cols] matrix
  const float *stateScale; ///< the state row's scale
  float maxFinite;
  bool transpose; ///< cast to [cols, rows] codes
  bool e4m3;
  unsigned blocks; ///< blocks of the cast launch that cast this operand
  /// Null, or for an operand another kernel has cast (no blocks here; `codes` are that
  /// kernel's): its statistics row, whose scale the GEMM uses.
  const float *sharedStats;
};

/// The scale operand i is cast with: the state's, or under current scaling (or before the
/// first update) the one of its amax (the maximum of the amax pass's blocks' maxima).
template <int N>
__device__ __forceinline__ float
operandScale(const CastOperand &op, int i, const Fp8Control<N> *control, bool current, int margin) {
  if (op.sharedStats)
    return op.sharedStats[fp8::StatsScale];
  float scale = *op.stateScale;
  if (needsAmax(op.stateScale, current)) {
    float amax = 0.0f;
#pragma unroll
    for (int b = 0; b < kAmaxBlocks; ++b)
      amax = fmaxf(amax, control->amax[i][b]);
    scale = currentScaleOf(amax, op.maxFinite, margin);
  }
  return scale;
}

/// The cast paths a cast launch's kernel holds. Each set is a kernel of its own: one kernel
/// holding both paths needs more registers than kCastMinBlocks allows and spills, and the fused
/// backward's launch (every operand transposing) ran 15-16% faster on the H200 without the plain
/// path compiled in (same codes and statistics; docs/benchmarks.md, fourth FP8 round).
enum class CastLayouts { Plain, Transposed, Mixed };

/// The layouts of a launch's operands.
template <int N> CastLayouts castLayouts(const bool (&transpose)[N]) {
  const int count = int(std::count(transpose, transpose + N, true));
  return count == N   ? CastLayouts::Transposed
         : count == 0 ? CastLayouts::Plain
                      : CastLayouts::Mixed;
}

/// Block `block` of operand i's share of the cast launch: the cast with its counts; the first
/// block also writes the descale the GEMM reads.
template <CastLayouts Layouts, typename T, int N>
__device__ __forceinline__ void castOperand(const CastOperand &op, int i, int64_t block,
                                            bool current, int margin, Fp8Control<N> *control,
                                            uint8_t *smem) {
  const float scale = operandScale(op, i, control, current, margin);
  if (block == 0 && threadIdx.x == 0)
    control->descale[i].value = 1.0f / scale;
  const T *x = static_cast<const T *>(op.x);
  Counts counts;
  // A compile-time constant unless the launch mixes layouts: the other path is not compiled.
  const bool transpose =
      Layouts == CastLayouts::Mixed ? op.transpose : Layouts == CastLayouts::Transposed;
  if (transpose) {
    if (op.e4m3)
      castTransposedTile<T, true>(x, op.codes, op.plainCodes, op.rows, op.cols, scale, block, smem,
                                  counts);
    else
      castTransposedTile<T, false>(x, op.codes, op.plainCodes, op.rows, op.cols, scale, block, smem,
                                   counts);
  } else {
    const int64_t n = op.rows * op.cols;
    if (op.e4m3)
      castPlain<T, kVec<T>, true>(x, op.codes, n, scale, block, op.blocks, counts);
    else
      castPlain<T, kVec<T>, false>(x, op.codes, n, scale, block, op.blocks, counts);
  }
  addCounts(counts, &control->stats[i], block == 0 ? op.rows * op.cols : 0);
}

/// Row i of an FP8 GEMM kernel's stats [2, 4] from the casts' totals: amax, underflow and
/// saturation fractions, and the scale used. The totals are read from L2 (the other blocks'
/// atomics).
__device__ void writeStatsRow(const Fp8CastStats &s, float scale, float *row) {
  const unsigned long long count = __ldcg(&s.count);
  const unsigned long long underflows = __ldcg(&s.underflows);
  const unsigned long long saturations = __ldcg(&s.saturations);
  row[fp8::StatsAmax] = __uint_as_float(__ldcg(&s.amaxBits));
  row[fp8::StatsUnderflow] = count ? float(double(underflows) / double(count)) : 0.0f;
  row[fp8::StatsSaturation] = count ? float(double(saturations) / double(count)) : 0.0f;
  row[fp8::StatsScale] = scale;
}

/// Resident blocks per multiprocessor the cast launch is compiled for: 4 (at most 64 registers a
/// thread) where the conversion is one instruction; 2 below sm_89, which converts in software
/// (and has no FP8 GEMMs to feed) and would spill at 64.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
constexpr int kCastMinBlocks = 2;
#else
constexpr int kCastMinBlocks = 4;
#endif

/// Casts the N operands of an FP8 kernel in one launch: operand i takes the blocks after
/// those of the operands before it (operand 1 has element type TB, the others TA), each
/// taking its scale from the state or the amax pass (operandScale); an operand another kernel
/// has cast takes no blocks. The last block to finish (a counter the amax pass cleared, the
/// usual fence-then-count pattern) writes the stats [2, 4] of each GEMM: operands 0 and 1 into
/// `stats`, and with three operands (the fused backward: dy, w, x) operands 0 and 2 into
/// `stats2`; for an operand another kernel has cast, that kernel's row and the descale.
template <int N, CastLayouts Layouts, typename TA, typename TB>
__global__ void __launch_bounds__(kThreads, kCastMinBlocks)
    castOperandsKernel(OperandList<CastOperand, N> ops, bool current, int margin,
                       Fp8Control<N> *control, float *stats, float *stats2) {
  __shared__ alignas(16) uint8_t smem[kTile * kTile];
  unsigned first = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (blockIdx.x >= first && blockIdx.x < first + ops.op[i].blocks) {
      if (i == 1)
        castOperand<Layouts, TB>(ops.op[i], i, blockIdx.x - first, current, margin, control, smem);
      else
        castOperand<Layouts, TA>(ops.op[i], i, blockIdx.x - first, current, margin, control, smem);
    }
    first += ops.op[i].blocks;
  }
  if (threadIdx.x != 0)
    return;
  __threadfence(); // this block's atomics before its count
  if (atomicAdd(&control->castBlocksDone, 1u) != gridDim.x - 1)
    return;
  __threadfence(); // every other block's atomics before the reads below
  auto row = [&](int i, float *to) {
    const CastOperand &op = ops.op[i];
    if (op.sharedStats) {
      // Cast by another kernel: its statistics, and the descale of its scale (no block of this
      // launch wrote one).
#pragma unroll
      for (int c = 0; c < fp8::kStatsColumns; ++c)
        to[c] = op.sharedStats[c];
      control->descale[i].value = 1.0f / op.sharedStats[fp8::StatsScale];
      return;
    }
    writeStatsRow(control->stats[i], operandScale(op, i, control, current, margin), to);
  };
  row(0, stats);
  row(1, stats + fp8::kStatsColumns);
  if constexpr (N == 3) {
    row(0, stats2);
    row(2, stats2 + fp8::kStatsColumns);
  }
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

/// One operand of an FP8 kernel as the host sees it.
struct GemmOperand {
  const TensorView *x; ///< (its data null when another kernel has cast it)
  int64_t rows, cols;  ///< x as a [rows, cols] matrix
  bool transpose;      ///< cast to [cols, rows] codes
  fp8::StateRow row;
  const char *name;
  /// For an operand another kernel has cast: its codes and that kernel's statistics row.
  const uint8_t *sharedCodes = nullptr;
  const float *sharedStats = nullptr;
};

/// Bytes of codes rounded up to 256, as workspaces keep them.
int64_t roundedCodeBytes(int64_t elements) { return (elements + 255) / 256 * 256; }

/// Bytes of an operand's codes in this kernel's workspace: its elements, rounded up to 256
/// (none for an operand another kernel has cast).
int64_t codeBytes(const GemmOperand &op) {
  return op.sharedCodes ? 0 : roundedCodeBytes(op.x->numel());
}

/// Casts the N operands of an FP8 kernel into `codes` (and operand 0 also into `plain0`, in
/// its own layout, when not null), with the scales in `control`, and writes the statistics
/// (castOperandsKernel), in two launches: the amax pass (which only reads the scales where
/// delayed scaling has them), then all casts. Operand 1 may have its own element type; the
/// others share operand 0's.
template <int N>
void castOperands(const Context &ctx, const char *kn, const GemmOperand (&ops)[N],
                  uint8_t *const (&codes)[N], uint8_t *plain0, const TensorView &state,
                  bool current, int margin, Fp8Control<N> *control, float *stats, float *stats2) {
  const int64_t columns = state.dim(1);
  OperandList<AmaxOperand, N> amax;
  OperandList<CastOperand, N> cast;
  for (int i = 0; i < N; ++i) {
    const GemmOperand &op = ops[i];
    CastOperand &c = cast.op[i];
    c.x = op.x->data;
    c.codes = op.sharedCodes ? const_cast<uint8_t *>(op.sharedCodes) : codes[i];
    c.sharedStats = op.sharedStats;
    c.plainCodes = i == 0 ? plain0 : nullptr;
    c.rows = op.rows;
    c.cols = op.cols;
    c.stateScale = static_cast<const float *>(state.data) + op.row * columns + fp8::ScaleColumn;
    c.e4m3 = op.row != fp8::OutputGradRow;
    c.maxFinite = c.e4m3 ? 448.0f : 57344.0f;
    c.transpose = op.transpose;
    dispatchFloat(op.x->dtype, [&](auto t) {
      using T = decltype(t);
      c.blocks = op.sharedCodes ? 0
                 : op.transpose ? transposedBlocks(kn, op.rows, op.cols)
                                : plainBlocks<kVec<T>>(op.rows * op.cols);
    });
    amax.op[i] = {c.x, op.sharedCodes ? 0 : op.x->numel(), c.stateScale};
  }
  unsigned blocks = 0;
  bool transpose[N];
  for (int i = 0; i < N; ++i) {
    blocks += cast.op[i].blocks;
    transpose[i] = ops[i].transpose;
  }
  const CastLayouts layouts = castLayouts(transpose);
  dispatchFloat(ops[0].x->dtype, [&](auto ta) {
    dispatchFloat(ops[1].x->dtype, [&](auto tb) {
      using TA = decltype(ta);
      using TB = decltype(tb);
      amaxKernel<N, TA, TB>
          <<<dim3(kAmaxBlocks, N), kAmaxThreads, 0, ctx.stream>>>(amax, current, control);
      checkLaunch(kn, "amaxKernel");
      auto launch = [&](auto kernel) {
        kernel<<<blocks, kThreads, 0, ctx.stream>>>(cast, current, margin, control, stats, stats2);
        checkLaunch(kn, "castOperandsKernel");
      };
      // The fused backward's three operands all transpose: only that kernel exists for N = 3.
      if constexpr (N == 3) {
        if (layouts != CastLayouts::Transposed)
          fail(kn, "the three-operand cast launch takes transposing casts only");
        launch(castOperandsKernel<N, CastLayouts::Transposed, TA, TB>);
      } else if (layouts == CastLayouts::Transposed) {
        launch(castOperandsKernel<N, CastLayouts::Transposed, TA, TB>);
      } else if (layouts == CastLayouts::Plain) {
        launch(castOperandsKernel<N, CastLayouts::Plain, TA, TB>);
      } else {
        launch(castOperandsKernel<N, CastLayouts::Mixed, TA, TB>);
      }
    });
  });
}

/// The codes of an FP8 GEMM's two operands and its control block in `workspace`: a's codes,
/// b's, then the control (fp8::gemmWorkspaceBytes).
struct GemmWorkspace {
  uint8_t *codes[2];
  Fp8Control<2> *control;
};

GemmWorkspace gemmWorkspace(const GemmOperand (&ops)[2], const TensorView &workspace) {
  auto *base = static_cast<uint8_t *>(workspace.data);
  GemmWorkspace w;
  w.codes[0] = base;
  w.codes[1] = base + codeBytes(ops[0]);
  w.control = reinterpret_cast<Fp8Control<2> *>(w.codes[1] + codeBytes(ops[1]));
  return w;
}

/// Checks an FP8 scaling state: f32 [3, 4 + H], H >= 1.
void checkState(const char *kn, const TensorView &state) {
  checkView(kn, "state", state);
  if (state.dtype != DType::F32 || state.rank() != 2 || state.dim(0) != 3 ||
      state.dim(1) < fp8::kStateColumns + 1)
    fail(kn, "state must be f32 [3, 4 + H] with H >= 1");
}

/// Checks a cast operand of an FP8 kernel: its dtype, divisibility and alignment.
void checkCastOperand(const char *kn, const GemmOperand &op) {
  if (op.sharedCodes) {
    if (!aligned16(op.sharedCodes))
      fail(kn, std::string(op.name) + "'s codes (input_cast) must start on a 16-byte boundary");
    if (op.rows % 16 || op.cols % 16)
      fail(kn, std::string(op.name) + " is " + std::to_string(op.rows) + " x " +
                   std::to_string(op.cols) + ": FP8 GEMMs need multiples of 16");
    return;
  }
  checkFloat(kn, op.name, *op.x);
  if (op.rows % 16 || op.cols % 16)
    fail(kn, std::string(op.name) + " is " + std::to_string(op.rows) + " x " +
                 std::to_string(op.cols) + ": FP8 GEMMs need multiples of 16");
  if (!aligned16(op.x->data))
    fail(kn, std::string(op.name) + " must start on a 16-byte boundary");
}

/// Checks an FP8 GEMM's statistics output: f32 [2, 4].
void checkStats(const char *kn, const char *name, const TensorView &stats) {
  checkView(kn, name, stats);
  if (stats.dtype != DType::F32 || stats.numel() != 2 * fp8::kStatsColumns)
    fail(kn, std::string(name) + " must be f32 [2, 4]");
}

/// Checks a workspace: f32 holding `need` bytes from a 256-byte boundary; `what` says how the
/// size comes about.
void checkWorkspace(const char *kn, const TensorView &workspace, int64_t need, const char *what) {
  checkView(kn, "workspace", workspace);
  if (workspace.dtype != DType::F32 || workspace.numel() * 4 < need ||
      reinterpret_cast<uintptr_t>(workspace.data) % 256)
    fail(kn, "workspace must be f32 holding " + std::to_string(need) +
                 " bytes from a 256-byte boundary (" + what + ")");
}

/// Checks what every FP8 GEMM kernel shares: the state, stats and workspace operands, and
/// the operands' dtypes and divisibility.
void checkFp8Operands(const char *kn, const GemmOperand (&ops)[2], const TensorView &state,
                      const TensorView &stats, const TensorView &workspace) {
  for (const GemmOperand &op : ops)
    checkCastOperand(kn, op);
  checkState(kn, state);
  checkStats(kn, "stats", stats);
  checkWorkspace(
      kn, workspace,
      fp8::gemmWorkspaceBytes(ops[0].sharedCodes ? 0 : ops[0].x->numel(), ops[1].x->numel()),
      "fp8::gemmWorkspaceBytes");
}

/// The codes of one FP8 GEMM operand: where they are, their format, and the descale (1 / the
/// scale of the cast) the GEMM multiplies by.
struct GemmCodes {
  const uint8_t *codes;
  fp8::StateRow row;
  const float *descale;
};

/// Runs the FP8 GEMM out = a · bᵀ (m x k and n x k codes), or out += that product when
/// `accumulate`; with `fastAccumulation` its sum stays in the tensor cores' accumulator.
void runGemm(const Context &ctx, const char *kn, GemmCodes a, GemmCodes b, int64_t m, int64_t n,
             int64_t k, const TensorView &out, const TensorView *bias, bool accumulate = false,
             bool fastAccumulation = false) {
  if (!ctx.gemm)
    fail(kn, "the context has no GemmEngine");
  checkFloat(kn, "output", out);
  if (!aligned16(out.data))
    fail(kn, "the output must start on a 16-byte boundary");
  Fp8GemmCall call;
  call.aType = a.row == fp8::OutputGradRow ? DType::F8E5M2 : DType::F8E4M3FN;
  call.bType = b.row == fp8::OutputGradRow ? DType::F8E5M2 : DType::F8E4M3FN;
  call.dType = out.dtype;
  call.m = m;
  call.n = n;
  call.k = k;
  call.a = a.codes;
  call.b = b.codes;
  call.d = out.data;
  call.descaleA = a.descale;
  call.descaleB = b.descale;
  call.accumulate = accumulate;
  call.fastAccumulation = fastAccumulation;
  if (bias) {
    checkFloat(kn, "bias", *bias);
    if (bias->dtype != out.dtype || bias->numel() != n || !aligned16(bias->data))
      fail(kn, "bias must be [" + std::to_string(n) + "] of the output's dtype, 16-byte "
                                                          "aligned");
    call.bias = bias->data;
  }
  ltEngineOf(kn, *ctx.gemm).runFp8(kn, ctx.stream, call);
}

/// The FP8 GEMM kernels of kinds Fp8Linear .. Fp8LinearGradWeight and
/// Fp8LinearGradWeightAccumulate: checks their operands, casts both into the workspace and runs out
/// (+)= a · bᵀ (m x k and n x k codes).
void castAndMultiply(const Context &ctx, const char *kn, const GemmOperand (&ops)[2],
                     const TensorView &state, bool current, int margin, const TensorView &stats,
                     const TensorView &workspace, int64_t m, int64_t n, int64_t k,
                     const TensorView &out, const TensorView *bias, bool accumulate = false,
                     bool fastAccumulation = false) {
  checkFp8Operands(kn, ops, state, stats, workspace);
  GemmWorkspace w = gemmWorkspace(ops, workspace);
  castOperands<2>(ctx, kn, ops, w.codes, nullptr, state, current, margin, w.control,
                  static_cast<float *>(stats.data), nullptr);
  runGemm(ctx, kn, {w.codes[0], ops[0].row, &w.control->descale[0].value},
          {w.codes[1], ops[1].row, &w.control->descale[1].value}, m, n, k, out, bias, accumulate,
          fastAccumulation);
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

void castToFp8Transposed(const Context &ctx, const TensorView &x, const float *scale,
                         const TensorView &out, Fp8CastStats *stats) {
  const char *kn = "cast_to_fp8_transposed";
  checkFloat(kn, "x", x);
  checkView(kn, "out", out);
  if (out.dtype != DType::F8E4M3FN && out.dtype != DType::F8E5M2)
    fail(kn, std::string("out must be f8e4m3fn or f8e5m2, got ") + dtypeName(out.dtype));
  if (x.rank() != 2 || x.dim(0) % 16 || x.dim(1) % 16)
    fail(kn, "x must be [rows, cols] with rows and cols multiples of 16");
  const int64_t rows = x.dim(0), cols = x.dim(1);
  if (out.rank() != 2 || out.dim(0) != cols || out.dim(1) != rows)
    fail(kn,
         "out must be [" + std::to_string(cols) + ", " + std::to_string(rows) + "]: x transposed");
  if (!aligned16(x.data) || !aligned16(out.data))
    fail(kn, "x and out must start on 16-byte boundaries");
  if (x.numel() == 0)
    return;
  const unsigned blocks = transposedBlocks(kn, rows, cols);
  auto *codes = static_cast<uint8_t *>(out.data);
  dispatchFloat(x.dtype, [&](auto t) {
    using T = decltype(t);
    const T *in = static_cast<const T *>(x.data);
    if (out.dtype == DType::F8E4M3FN)
      castTransposedKernel<T, true>
          <<<blocks, kThreads, 0, ctx.stream>>>(in, codes, rows, cols, scale, stats);
    else
      castTransposedKernel<T, false>
          <<<blocks, kThreads, 0, ctx.stream>>>(in, codes, rows, cols, scale, stats);
  });
  checkLaunch(kn, "castTransposedKernel");
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
               const TensorView &y, const TensorView &stats, const TensorView &workspace,
               bool fastAccumulation) {
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
  castAndMultiply(ctx, kn, ops, state, current, margin, stats, workspace, m, n, k, y, bias,
                  /*accumulate=*/false, fastAccumulation);
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
  castAndMultiply(ctx, kn, ops, state, current, margin, stats, workspace, m, k, n, dx, nullptr);
}

/// fp8LinearGradWeight into dw, or added to it when `accumulate` (Fp8LinearGradWeightAccumulate's
/// accumulator).
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
  castAndMultiply(ctx, kn, ops, state, current, margin, stats, workspace, n, k, m, dw, nullptr,
                  accumulate);
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
  const char *kn = "fp8_linear_grad_weight_accumulate";
  // A bf16 C came out tens of ulps off on the H200 (docs/fp8.md); plans accumulate in f32.
  if (acc.dtype != DType::F32)
    fail(kn, std::string("acc must be f32 (FP8 GEMMs add into f32 accumulators only), got ") +
                 dtypeName(acc.dtype));
  gradWeight(ctx, kn, dy, x, state, current, margin, acc, "acc", stats, workspace,
             /*accumulate=*/true);
}

/// The fused backward (Fp8LinearBackward, Fp8LinearBackwardSharedInput and
/// Fp8LinearBackwardFromInputCast) once dy, w, dx and acc are checked: checks the cast operands
/// (x's codes may be another kernel's: ops[2].sharedCodes), the state, the statistics and the
/// workspace (`workspaceBytes`, `what` says why), then casts in one launch and runs the two GEMMs.
/// The workspace: dy's plain codes, wᵀ's, dyᵀ's, the control block in the two GEMMs' 512 bytes, and
/// xᵀ's codes, where x is cast here, at its very end (where fp8LinearBackwardSharedInput finds
/// them).
static void runFusedBackward(const Context &ctx, const char *kn, const GemmOperand (&ops)[3],
                             int64_t m, int64_t n, int64_t k, const TensorView &state, bool current,
                             int margin, const TensorView &dx, const TensorView &inputGradStats,
                             const TensorView &weightGradStats, const TensorView &workspace,
                             const TensorView &acc, int64_t workspaceBytes, const char *what) {
  for (const GemmOperand &op : ops)
    checkCastOperand(kn, op);
  checkState(kn, state);
  checkStats(kn, "input_grad_stats", inputGradStats);
  checkStats(kn, "weight_grad_stats", weightGradStats);
  checkWorkspace(kn, workspace, workspaceBytes, what);
  uint8_t *plain = static_cast<uint8_t *>(workspace.data);
  uint8_t *wCodes = plain + codeBytes(ops[0]);
  uint8_t *dyCodes = wCodes + codeBytes(ops[1]);
  auto *control = reinterpret_cast<Fp8Control<3> *>(dyCodes + codeBytes(ops[0]));
  uint8_t *xCodes = ops[2].sharedCodes ? nullptr
                                       : static_cast<uint8_t *>(workspace.data) +
                                             workspace.numel() * 4 - codeBytes(ops[2]);
  uint8_t *const codes[3] = {dyCodes, wCodes, xCodes};
  castOperands<3>(ctx, kn, ops, codes, plain, state, current, margin, control,
                  static_cast<float *>(inputGradStats.data),
                  static_cast<float *>(weightGradStats.data));
  const float *dyDescale = &control->descale[0].value;
  // dx [m, k] = dy [m, n] · (wᵀ [k, n])ᵀ.
  runGemm(ctx, kn, {plain, fp8::OutputGradRow, dyDescale},
          {wCodes, fp8::WeightRow, &control->descale[1].value}, m, k, n, dx, nullptr);
  // acc [n, k] += (dyᵀ [n, m]) · (xᵀ [k, m])ᵀ.
  runGemm(
      ctx, kn, {dyCodes, fp8::OutputGradRow, dyDescale},
      {ops[2].sharedCodes ? ops[2].sharedCodes : xCodes, fp8::InputRow, &control->descale[2].value},
      n, k, m, acc, nullptr, /*accumulate=*/true);
}

void fp8LinearBackward(const Context &ctx, const TensorView &dy, const TensorView &w,
                       const TensorView &x, const TensorView &state, bool current, int margin,
                       const TensorView &dx, const TensorView &inputGradStats,
                       const TensorView &weightGradStats, const TensorView &workspace,
                       const TensorView &acc) {
  const char *kn = "fp8_linear_backward";
  auto [m, n] = asMatrix(kn, "dy", dy);
  auto [wn, k] = asMatrix(kn, "w", w);
  if (w.rank() != 2 || wn != n)
    fail(kn, "w must be [" + std::to_string(n) + ", K] for dy [..., " + std::to_string(n) + "]");
  auto [xm, xk] = asMatrix(kn, "x", x);
  if (xm != m || xk != k)
    fail(kn, "x must be [..., " + std::to_string(k) + "] with dy's leading dimensions");
  auto [dxm, dxk] = asMatrix(kn, "dx", dx);
  if (dxm != m || dxk != k)
    fail(kn, "dx must be [..., " + std::to_string(k) + "] with dy's leading dimensions");
  if (x.dtype != dy.dtype)
    fail(kn, std::string("x must have dy's dtype ") + dtypeName(dy.dtype) +
                 " (one launch casts both), got " + dtypeName(x.dtype));
  if (acc.dtype != DType::F32 || acc.rank() != 2 || acc.dim(0) != n || acc.dim(1) != k)
    fail(kn, "acc must be f32 [" + std::to_string(n) + ", " + std::to_string(k) +
                 "] (FP8 GEMMs add into f32 accumulators only)");
  checkView(kn, "acc", acc);
  // Operand 0, dy, is cast once into both layouts: transposed for dW = dyᵀ · x, as it is for
  // dx = dy · w (the plain codes). w and x are cast transposed.
  const GemmOperand ops[3] = {{&dy, m, n, true, fp8::OutputGradRow, "dy"},
                              {&w, n, k, true, fp8::WeightRow, "w"},
                              {&x, m, k, true, fp8::InputRow, "x"}};
  runFusedBackward(ctx, kn, ops, m, n, k, state, current, margin, dx, inputGradStats,
                   weightGradStats, workspace, acc,
                   fp8::gemmWorkspaceBytes(dy.numel(), w.numel()) +
                       fp8::gemmWorkspaceBytes(dy.numel(), x.numel()),
                   "the two GEMMs' fp8::gemmWorkspaceBytes");
}

/// Checks `inputCast`, another kernel's workspace holding the codes of `elements` input
/// elements, and `inputStats`, its statistics, and returns their f32 data.
static const float *checkSharedCast(const char *kn, const TensorView &inputCast,
                                    const TensorView &inputStats, int64_t minBytes,
                                    int64_t elements) {
  checkView(kn, "input_cast", inputCast);
  if (inputCast.dtype != DType::F32 || inputCast.rank() != 1 || inputCast.numel() * 4 < minBytes ||
      reinterpret_cast<uintptr_t>(inputCast.data) % 256)
    fail(kn, "input_cast must be the f32 workspace (from a 256-byte boundary) of the kernel "
             "that cast the input, of at least " +
                 std::to_string(minBytes / 4) + " elements for the codes of " +
                 std::to_string(elements) + " elements, got " + formatShape(inputCast.shape) + " " +
                 dtypeName(inputCast.dtype));
  checkStats(kn, "input_stats", inputStats);
  return static_cast<const float *>(inputStats.data);
}

void fp8LinearSharedInput(const Context &ctx, const TensorView &inputCast,
                          const TensorView &inputStats, const TensorView &w,
                          const TensorView &state, const TensorView *bias, bool current, int margin,
                          const TensorView &y, const TensorView &stats, const TensorView &workspace,
                          bool fastAccumulation) {
  const char *kn = "fp8_linear_shared_input";
  checkFloat(kn, "y", y);
  auto [n, k] = asMatrix(kn, "w", w);
  if (w.rank() != 2 || y.rank() < 1 || y.dim(y.rank() - 1) != n)
    fail(kn, "w must be [N, K] and y [..., N], got w " + formatShape(w.shape) + " and y " +
                 formatShape(y.shape));
  const int64_t m = y.numel() / n;
  // x's codes are the first operand's of the Fp8Linear that cast it: its workspace's start.
  const float *shared =
      checkSharedCast(kn, inputCast, inputStats, fp8::gemmWorkspaceBytes(m * k, 0), m * k);
  const TensorView x{nullptr, y.dtype, {m, k}}; // x's shape; its codes are inputCast's
  GemmOperand ops[2] = {{&x, m, k, false, fp8::InputRow, "x"},
                        {&w, n, k, false, fp8::WeightRow, "w"}};
  ops[0].sharedCodes = static_cast<const uint8_t *>(inputCast.data);
  ops[0].sharedStats = shared;
  checkFp8Operands(kn, ops, state, stats, workspace);
  GemmWorkspace ws = gemmWorkspace(ops, workspace);
  uint8_t *const codes[2] = {nullptr, ws.codes[1]};
  castOperands<2>(ctx, kn, ops, codes, nullptr, state, current, margin, ws.control,
                  static_cast<float *>(stats.data), nullptr);
  runGemm(ctx, kn, {ops[0].sharedCodes, fp8::InputRow, &ws.control->descale[0].value},
          {ws.codes[1], fp8::WeightRow, &ws.control->descale[1].value}, m, n, k, y, bias,
          /*accumulate=*/false, fastAccumulation);
}

/// dx = dy · w's operands and the accumulator of Fp8LinearBackwardSharedInput and
/// Fp8LinearBackwardFromInputCast, checked; returns M, N, K.
static std::array<int64_t, 3> checkBackwardWithoutInputCast(const char *kn, const TensorView &dy,
                                                            const TensorView &w,
                                                            const TensorView &dx,
                                                            const TensorView &acc) {
  auto [m, n] = asMatrix(kn, "dy", dy);
  auto [wn, k] = asMatrix(kn, "w", w);
  if (w.rank() != 2 || wn != n)
    fail(kn, "w must be [" + std::to_string(n) + ", K] for dy [..., " + std::to_string(n) + "]");
  auto [dxm, dxk] = asMatrix(kn, "dx", dx);
  if (dxm != m || dxk != k)
    fail(kn, "dx must be [..., " + std::to_string(k) + "] with dy's leading dimensions");
  if (acc.dtype != DType::F32 || acc.rank() != 2 || acc.dim(0) != n || acc.dim(1) != k)
    fail(kn, "acc must be f32 [" + std::to_string(n) + ", " + std::to_string(k) +
                 "] (FP8 GEMMs add into f32 accumulators only)");
  checkView(kn, "acc", acc);
  return {m, n, k};
}

/// Kinds 97 and 99 once xᵀ's codes (`xCodes`, [K, M]) and x's statistics row (`xStats`) are
/// found: runFusedBackward, x not cast again.
static void backwardWithoutInputCast(const Context &ctx, const char *kn, int64_t m, int64_t n,
                                     int64_t k, const TensorView &dy, const TensorView &w,
                                     const uint8_t *xCodes, const float *xStats,
                                     const TensorView &state, bool current, int margin,
                                     const TensorView &dx, const TensorView &inputGradStats,
                                     const TensorView &weightGradStats, const TensorView &workspace,
                                     const TensorView &acc) {
  const TensorView x{nullptr, dy.dtype, {m, k}}; // x's shape; its codes are another kernel's
  GemmOperand ops[3] = {{&dy, m, n, true, fp8::OutputGradRow, "dy"},
                        {&w, n, k, true, fp8::WeightRow, "w"},
                        {&x, m, k, true, fp8::InputRow, "x"}};
  ops[2].sharedCodes = xCodes;
  ops[2].sharedStats = xStats;
  runFusedBackward(
      ctx, kn, ops, m, n, k, state, current, margin, dx, inputGradStats, weightGradStats, workspace,
      acc, fp8::gemmWorkspaceBytes(dy.numel(), w.numel()) + fp8::gemmWorkspaceBytes(dy.numel(), 0),
      "Fp8LinearBackward's workspace without x's codes");
}

void fp8LinearBackwardSharedInput(const Context &ctx, const TensorView &dy, const TensorView &w,
                                  const TensorView &inputCast, const TensorView &inputStats,
                                  const TensorView &state, bool current, int margin,
                                  const TensorView &dx, const TensorView &inputGradStats,
                                  const TensorView &weightGradStats, const TensorView &workspace,
                                  const TensorView &acc) {
  const char *kn = "fp8_linear_backward_shared_input";
  auto [m, n, k] = checkBackwardWithoutInputCast(kn, dy, w, dx, acc);
  // fp8LinearBackward leaves xᵀ's codes at the end of its workspace, after its control block.
  const float *shared =
      checkSharedCast(kn, inputCast, inputStats,
                      fp8::gemmWorkspaceBytes(0, 0) + fp8::gemmWorkspaceBytes(0, m * k), m * k);
  const uint8_t *xCodes = static_cast<const uint8_t *>(inputCast.data) + inputCast.numel() * 4 -
                          roundedCodeBytes(m * k);
  backwardWithoutInputCast(ctx, kn, m, n, k, dy, w, xCodes, shared + fp8::kStatsColumns, state,
                           current, margin, dx, inputGradStats, weightGradStats, workspace, acc);
}

/// Checks `inputCast`: xᵀ's codes, f8_e4m3 [k, m] from a 16-byte boundary.
static void checkInputCast(const char *kn, const TensorView &inputCast, int64_t k, int64_t m) {
  checkView(kn, "input_cast", inputCast);
  if (inputCast.dtype != DType::F8E4M3FN || inputCast.shape != std::vector<int64_t>{k, m} ||
      !aligned16(inputCast.data))
    fail(kn, "input_cast must be f8_e4m3 [" + std::to_string(k) + ", " + std::to_string(m) +
                 "] (x's transposed codes) from a 16-byte boundary, got " +
                 formatShape(inputCast.shape) + " " + dtypeName(inputCast.dtype));
}

void fp8LinearWithInputCast(const Context &ctx, const TensorView &x, const TensorView &w,
                            const TensorView &state, const TensorView *bias, bool current,
                            int margin, const TensorView &y, const TensorView &stats,
                            const TensorView &inputCast, const TensorView &workspace,
                            bool fastAccumulation) {
  const char *kn = "fp8_linear_with_input_cast";
  auto [m, k] = asMatrix(kn, "x", x);
  auto [n, wk] = asMatrix(kn, "w", w);
  if (w.rank() != 2 || wk != k)
    fail(kn, "w must be [N, " + std::to_string(k) + "] for x [..., " + std::to_string(k) + "]");
  auto [ym, yn] = asMatrix(kn, "y", y);
  if (ym != m || yn != n)
    fail(kn, "y must be [..., " + std::to_string(n) + "] with x's leading dimensions");
  checkInputCast(kn, inputCast, k, m);
  // x is cast once into both layouts (the transposing tile with its plain codes, as dy in
  // the fused backward): the plain codes to the workspace for the GEMM, xᵀ's to input_cast.
  const GemmOperand ops[2] = {{&x, m, k, true, fp8::InputRow, "x"},
                              {&w, n, k, false, fp8::WeightRow, "w"}};
  checkFp8Operands(kn, ops, state, stats, workspace);
  GemmWorkspace ws = gemmWorkspace(ops, workspace);
  uint8_t *const codes[2] = {static_cast<uint8_t *>(inputCast.data), ws.codes[1]};
  castOperands<2>(ctx, kn, ops, codes, ws.codes[0], state, current, margin, ws.control,
                  static_cast<float *>(stats.data), nullptr);
  runGemm(ctx, kn, {ws.codes[0], fp8::InputRow, &ws.control->descale[0].value},
          {ws.codes[1], fp8::WeightRow, &ws.control->descale[1].value}, m, n, k, y, bias,
          /*accumulate=*/false, fastAccumulation);
}

void fp8LinearBackwardFromInputCast(const Context &ctx, const TensorView &dy, const TensorView &w,
                                    const TensorView &inputCast, const TensorView &inputStats,
                                    const TensorView &state, bool current, int margin,
                                    const TensorView &dx, const TensorView &inputGradStats,
                                    const TensorView &weightGradStats, const TensorView &workspace,
                                    const TensorView &acc) {
  const char *kn = "fp8_linear_backward_from_input_cast";
  auto [m, n, k] = checkBackwardWithoutInputCast(kn, dy, w, dx, acc);
  checkInputCast(kn, inputCast, k, m);
  checkStats(kn, "input_stats", inputStats);
  backwardWithoutInputCast(ctx, kn, m, n, k, dy, w, static_cast<const uint8_t *>(inputCast.data),
                           static_cast<const float *>(inputStats.data), state, current, margin, dx,
                           inputGradStats, weightGradStats, workspace, acc);
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
