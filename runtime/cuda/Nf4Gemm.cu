//===- Nf4Gemm.cu - A GEMM that dequantizes its NF4 weight on the fly ------===//
//
// y[M, N] = x[M, K] · W[N, K]ᵀ with x and y bf16 and W an NF4 weight (block 64 along K):
// the weight is never written to device memory in bf16. Each 128 x 128 output tile of a
// 256-thread block walks K in steps of 64 (one NF4 block per weight row per step): x's tile
// comes in with cp.async, W's tile as 32 bytes of codes per row (one 16-byte load per thread)
// that the thread dequantizes (level x block scale, as Nf4.cu) into bf16 in shared memory;
// both are double-buffered, the next step's loads in flight while the tensor cores
// (mma.sync m16n8k16, bf16 in, fp32 accumulation; ldmatrix from rows padded to 144 bytes,
// free of bank conflicts) work on the current one. Each warp computes a 64 x 32 piece.
//
// A first fused kernel, for measuring against dequantize-into-a-buffer + cuBLASLt
// (bench/nf4_gemm_bench.cu); plans do not call it yet.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/Nf4.h"

#include "CudaCheck.h"
#include "MmaSync.cuh"

#include <cuda_bf16.h>

#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64;
constexpr int kThreads = 256;
constexpr int kPitch = kBK + 8; // bf16 elements per shared row: 144 bytes
constexpr int kTileElems = kBM * kPitch;
constexpr size_t kSharedBytes = size_t(4) * kTileElems * sizeof(__nv_bfloat16); // A, B x 2

__constant__ float kGemmLevels[16] = {
    kNf4Levels[0],  kNf4Levels[1],  kNf4Levels[2],  kNf4Levels[3],
    kNf4Levels[4],  kNf4Levels[5],  kNf4Levels[6],  kNf4Levels[7],
    kNf4Levels[8],  kNf4Levels[9],  kNf4Levels[10], kNf4Levels[11],
    kNf4Levels[12], kNf4Levels[13], kNf4Levels[14], kNf4Levels[15]};

struct GemmArgs {
  const __nv_bfloat16 *x;
  const uint8_t *w; ///< NF4 storage of [N, K]
  __nv_bfloat16 *y;
  int64_t m, n, k;
  int64_t absmaxOffset, scalesOffset, offsetOffset; ///< bytes from w
  int32_t doubleBlock;
};

using mma::cpAsync16;
using mma::cpAsyncCommit;
using mma::cpAsyncWait;
using mma::ldsm;

/// The x tile [kBM, kBK] of step `k0` into `as`: 1024 16-byte chunks, 4 per thread.
__device__ __forceinline__ void loadX(const GemmArgs &g, int64_t m0, int64_t k0,
                                      __nv_bfloat16 *as) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int c = threadIdx.x + i * kThreads;
    int row = c / 8, col = (c % 8) * 8;
    int64_t m = m0 + row;
    bool valid = m < g.m;
    const __nv_bfloat16 *src = g.x + (valid ? m : 0) * g.k + k0 + col;
    cpAsync16(as + row * kPitch + col, src, valid);
  }
}

/// What a thread fetches of W's tile: 32 codes of one row and that row's block scale.
struct WFetch {
  uint4 codes;
  float scale;
};

__device__ __forceinline__ WFetch fetchW(const GemmArgs &g, int64_t n0, int64_t k0,
                                         float offset) {
  int row = threadIdx.x / 2, half = threadIdx.x % 2;
  int64_t element = (n0 + row) * g.k + k0; // the first element of the row's block
  WFetch f;
  f.codes = __ldg(reinterpret_cast<const uint4 *>(g.w + element / 2) + half);
  int64_t block = element / kBK;
  int8_t q = static_cast<int8_t>(__ldg(g.w + g.absmaxOffset + block));
  float s = __ldg(reinterpret_cast<const float *>(g.w + g.scalesOffset) + block / g.doubleBlock);
  f.scale = __fadd_rn(__fmul_rn(__fdiv_rn(float(q), 127.0f), s), offset);
  return f;
}

/// Dequantizes a fetch into its 32 bf16 places of `bs`.
__device__ __forceinline__ void storeW(const WFetch &f, const float *levels, __nv_bfloat16 *bs) {
  int row = threadIdx.x / 2, half = threadIdx.x % 2;
  const uint32_t words[4] = {f.codes.x, f.codes.y, f.codes.z, f.codes.w};
  uint4 *dst = reinterpret_cast<uint4 *>(bs + row * kPitch + half * 32);
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    // Eight elements: bytes in memory order, the high nibble first.
    union {
      uint4 vec;
      __nv_bfloat16 e[8];
    } out;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      uint32_t byte = (words[w] >> (8 * b)) & 0xffu;
      out.e[2 * b] = __float2bfloat16_rn(__fmul_rn(levels[byte >> 4], f.scale));
      out.e[2 * b + 1] = __float2bfloat16_rn(__fmul_rn(levels[byte & 0xfu], f.scale));
    }
    dst[w] = out.vec;
  }
}

__global__ void __launch_bounds__(kThreads)
    nf4GemmKernel(GemmArgs g) {
  extern __shared__ __align__(16) unsigned char shared[];
  __shared__ float levels[16];
  // Stage s: x's tile at tiles + s * kTileElems, W's at tiles + (2 + s) * kTileElems
  // (arithmetic, not an array of pointers, which would live in local memory).
  __nv_bfloat16 *tiles = reinterpret_cast<__nv_bfloat16 *>(shared);
  auto xTile = [&](int stage) { return tiles + stage * kTileElems; };
  auto wTile = [&](int stage) { return tiles + (2 + stage) * kTileElems; };
  if (threadIdx.x < 16)
    levels[threadIdx.x] = kGemmLevels[threadIdx.x];
  __syncthreads();

  const int64_t n0 = int64_t(blockIdx.x) * kBN, m0 = int64_t(blockIdx.y) * kBM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 4, wn = warp % 4; // 2 x 4 warps of 64 x 32
  const float offset = __ldg(reinterpret_cast<const float *>(g.w + g.offsetOffset));

  float acc[4][4][4] = {};
  const int steps = int(g.k / kBK);

  loadX(g, m0, 0, xTile(0));
  cpAsyncCommit();
  storeW(fetchW(g, n0, 0, offset), levels, wTile(0));
  cpAsyncWait<0>();
  __syncthreads();

  for (int step = 0; step < steps; ++step) {
    const int cur = step & 1, nxt = cur ^ 1;
    const bool more = step + 1 < steps;
    WFetch next;
    if (more) {
      loadX(g, m0, int64_t(step + 1) * kBK, xTile(nxt));
      cpAsyncCommit();
      next = fetchW(g, n0, int64_t(step + 1) * kBK, offset);
    }
    const __nv_bfloat16 *a = xTile(cur), *b = wTile(cur);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[4][4];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
        ldsm(af[mi], a + (wm * 64 + mi * 16 + lane % 16) * kPitch + kk + (lane / 16) * 8);
      uint32_t bf[2][4];
#pragma unroll
      for (int nj = 0; nj < 2; ++nj)
        ldsm(bf[nj], b + (wn * 32 + nj * 16 + lane % 8 + (lane / 16) * 8) * kPitch + kk +
                         ((lane / 8) % 2) * 8);
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
          mma::mma(__nv_bfloat16(), acc[mi][ni], af[mi], bf[ni / 2][(ni % 2) * 2],
                   bf[ni / 2][(ni % 2) * 2 + 1]);
    }
    if (more)
      storeW(next, levels, wTile(nxt));
    cpAsyncWait<0>();
    __syncthreads();
  }

  // Accumulator c0, c1: row lane / 4, columns 2 (lane % 4) + {0, 1}; c2, c3: 8 rows below.
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      int64_t col = n0 + wn * 32 + ni * 8 + (lane % 4) * 2;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int64_t row = m0 + wm * 64 + mi * 16 + lane / 4 + h * 8;
        if (row < g.m)
          *reinterpret_cast<__nv_bfloat162 *>(g.y + row * g.n + col) =
              __floats2bfloat162_rn(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
      }
    }
}

} // namespace

std::string nf4LinearProblem(const TensorView &x, const TensorView &q, const TensorView &y) {
  if (x.dtype != DType::BF16 || y.dtype != DType::BF16)
    return "x and y must be bf16";
  if (q.dtype != DType::NF4 || q.rank() != 2)
    return "the weight must be a 2-D nf4 tensor";
  if (q.quantBlock != kBK)
    return "the weight's NF4 block must be 64, got " + std::to_string(q.quantBlock);
  if (q.quantDoubleBlock == 0)
    return "the weight's double-quantization block must be positive";
  int64_t n = q.dim(0), k = q.dim(1);
  if (k % kBK != 0 || n % kBN != 0)
    return "the weight is " + formatShape(q.shape) + "; the fused kernel needs out % 128 == 0 "
           "and in % 64 == 0";
  if (x.rank() < 1 || x.dim(-1) != k || y.rank() != x.rank() || y.dim(-1) != n ||
      x.numel() / k != y.numel() / n)
    return "x " + formatShape(x.shape) + " and y " + formatShape(y.shape) +
           " do not match the weight " + formatShape(q.shape);
  if (!aligned16(x.data) || !aligned16(q.data) || (reinterpret_cast<uintptr_t>(y.data) & 3u))
    return "x and the weight must be 16-byte aligned and y 4-byte aligned";
  return "";
}

void nf4Linear(const Context &ctx, const TensorView &x, const TensorView &q,
               const TensorView &y) {
  const char *k = "nf4_linear";
  std::string problem = nf4LinearProblem(x, q, y);
  if (!problem.empty())
    fail(k, problem);
  GemmArgs g;
  g.x = static_cast<const __nv_bfloat16 *>(x.data);
  g.w = static_cast<const uint8_t *>(q.data);
  g.y = static_cast<__nv_bfloat16 *>(y.data);
  g.n = q.dim(0);
  g.k = q.dim(1);
  g.m = x.numel() / g.k;
  Nf4Layout layout = nf4Layout(uint64_t(q.numel()), q.quantBlock, q.quantDoubleBlock);
  g.absmaxOffset = int64_t(layout.absmaxOffset);
  g.scalesOffset = int64_t(layout.scalesOffset);
  g.offsetOffset = int64_t(layout.offsetOffset);
  g.doubleBlock = int32_t(q.quantDoubleBlock);
  if (g.m == 0)
    return;
  static bool configured = false;
  if (!configured) {
    checkCuda(cudaFuncSetAttribute(nf4GemmKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(kSharedBytes)),
              "cudaFuncSetAttribute", k);
    configured = true;
  }
  dim3 grid(unsigned(g.n / kBN), unsigned((g.m + kBM - 1) / kBM));
  nf4GemmKernel<<<grid, kThreads, kSharedBytes, ctx.stream>>>(g);
  checkLaunch(k, "nf4GemmKernel");
}

} // namespace bonsai::rt::cuda
