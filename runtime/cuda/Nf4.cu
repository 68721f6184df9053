//===- Nf4.cu - NF4 dequantization on CUDA ---------------------------------===//
//
// The Dequantize kernel for NF4 tensors (runtime/include/bonsai/runtime/Nf4.h). Memory bound:
// it reads half a byte per element and writes 2 (bf16, f16) or 4 (f32). Each thread handles
// octets of elements: one 32-bit load of codes, one block scale (an octet never straddles a
// block: block sizes are powers of two of at least 16), the levels from shared memory, and
// 16-byte stores (two for f32). Outputs that are not 16-byte aligned, and a tail of fewer than
// eight elements, take an element-wise path. The block scale and the products are rounded
// exactly as the CPU reference rounds them (__fdiv_rn, __fmul_rn, __fadd_rn: no FMA
// contraction), so f32 results are bit-identical to it.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/Nf4.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

/// Where the parts of the layout start, in bytes from the tensor's first byte.
struct Nf4Geometry {
  int64_t numel;
  int32_t blockShift;       ///< log2(block size)
  int32_t doubleBlock;      ///< blocks per double-quantization group
  int64_t absmaxOffset;
  int64_t scalesOffset;
  int64_t offsetOffset;
};

__device__ __forceinline__ float blockScale(const uint8_t *storage, const Nf4Geometry &g,
                                            int64_t block, float offset) {
  int8_t q = static_cast<int8_t>(__ldg(storage + g.absmaxOffset + block));
  float s = __ldg(reinterpret_cast<const float *>(storage + g.scalesOffset) +
                  block / g.doubleBlock);
  return __fadd_rn(__fmul_rn(__fdiv_rn(float(q), 127.0f), s), offset);
}

/// The levels of Nf4.h, in constant memory for the copy into each block's shared memory.
__constant__ float kDeviceLevels[16] = {
    kNf4Levels[0],  kNf4Levels[1],  kNf4Levels[2],  kNf4Levels[3],
    kNf4Levels[4],  kNf4Levels[5],  kNf4Levels[6],  kNf4Levels[7],
    kNf4Levels[8],  kNf4Levels[9],  kNf4Levels[10], kNf4Levels[11],
    kNf4Levels[12], kNf4Levels[13], kNf4Levels[14], kNf4Levels[15]};

/// Shared memory, not constant memory, for the lookups: threads of a warp read different
/// levels, which constant memory would serialise.
__device__ __forceinline__ void loadLevels(float *levels) {
  if (threadIdx.x < 16)
    levels[threadIdx.x] = kDeviceLevels[threadIdx.x];
  __syncthreads();
}

/// Stores eight values at `y` (16-byte aligned).
template <typename T> __device__ __forceinline__ void storeOctet(T *y, const float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4 *>(y)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(y)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    union {
      uint4 vec;
      T lanes[8];
    } packed;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      packed.lanes[e] = fromFloat<T>(v[e]);
    *reinterpret_cast<uint4 *>(y) = packed.vec;
  }
}

/// Octets [0, numel / 8): codes as 32-bit words (the storage is 4-byte aligned), 16-byte
/// stores (y is 16-byte aligned).
template <typename T>
__global__ void dequantizeOctetsKernel(const uint8_t *__restrict__ storage, Nf4Geometry g,
                                       T *__restrict__ y) {
  __shared__ float levels[16];
  loadLevels(levels);
  const float offset = __ldg(reinterpret_cast<const float *>(storage + g.offsetOffset));
  const int64_t octets = g.numel / 8;
  const uint32_t *words = reinterpret_cast<const uint32_t *>(storage);
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < octets;
       o += int64_t(gridDim.x) * blockDim.x) {
    uint32_t word = __ldg(words + o);
    float a = blockScale(storage, g, (o * 8) >> g.blockShift, offset);
    float v[8];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      uint32_t byte = (word >> (8 * b)) & 0xffu;
      v[2 * b] = __fmul_rn(levels[byte >> 4], a);
      v[2 * b + 1] = __fmul_rn(levels[byte & 0xfu], a);
    }
    storeOctet(y + o * 8, v);
  }
}

/// Elements [begin, numel), one per thread: unaligned outputs and the tail.
template <typename T>
__global__ void dequantizeElementsKernel(const uint8_t *__restrict__ storage, Nf4Geometry g,
                                         int64_t begin, T *__restrict__ y) {
  __shared__ float levels[16];
  loadLevels(levels);
  const float offset = __ldg(reinterpret_cast<const float *>(storage + g.offsetOffset));
  for (int64_t i = begin + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < g.numel;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint8_t byte = __ldg(storage + i / 2);
    uint8_t code = (i % 2 == 0) ? byte >> 4 : byte & 0xfu;
    float a = blockScale(storage, g, i >> g.blockShift, offset);
    y[i] = fromFloat<T>(__fmul_rn(levels[code], a));
  }
}

template <typename T>
void launchDequantize(const char *k, cudaStream_t stream, const uint8_t *storage,
                      const Nf4Geometry &g, void *out) {
  T *y = static_cast<T *>(out);
  constexpr int kThreads = 256;
  int64_t begin = 0;
  if (aligned16(y) && (reinterpret_cast<uintptr_t>(storage) & 3u) == 0 && g.numel >= 8) {
    int64_t octets = g.numel / 8;
    dequantizeOctetsKernel<T>
        <<<gridFor(k, octets, kThreads), kThreads, 0, stream>>>(storage, g, y);
    checkLaunch(k, "dequantizeOctetsKernel");
    begin = octets * 8;
  }
  if (begin < g.numel) {
    dequantizeElementsKernel<T>
        <<<gridFor(k, g.numel - begin, kThreads), kThreads, 0, stream>>>(storage, g, begin, y);
    checkLaunch(k, "dequantizeElementsKernel");
  }
}

} // namespace

void dequantize(const Context &ctx, const TensorView &q, const TensorView &y) {
  const char *k = "dequantize";
  checkView(k, "q", q);
  checkFloat(k, "y", y);
  if (q.dtype != DType::NF4)
    fail(k, std::string("q must be nf4, got ") + dtypeName(q.dtype));
  checkSameShape(k, "y", y, "q", q);
  if (q.quantBlock < 16 || (q.quantBlock & (q.quantBlock - 1)) != 0 || q.quantDoubleBlock == 0)
    fail(k, "q has NF4 block size " + std::to_string(q.quantBlock) +
                " and double-quantization block " + std::to_string(q.quantDoubleBlock) +
                "; expected a power of two of at least 16 and a positive count");
  if (y.numel() == 0)
    return;
  Nf4Layout layout = nf4Layout(uint64_t(q.numel()), q.quantBlock, q.quantDoubleBlock);
  Nf4Geometry g;
  g.numel = q.numel();
  g.blockShift = 0;
  while ((1u << g.blockShift) < q.quantBlock)
    ++g.blockShift;
  g.doubleBlock = int32_t(q.quantDoubleBlock);
  g.absmaxOffset = int64_t(layout.absmaxOffset);
  g.scalesOffset = int64_t(layout.scalesOffset);
  g.offsetOffset = int64_t(layout.offsetOffset);
  const auto *storage = static_cast<const uint8_t *>(q.data);
  switch (y.dtype) {
  case DType::F32:
    launchDequantize<float>(k, ctx.stream, storage, g, y.data);
    break;
  case DType::BF16:
    launchDequantize<__nv_bfloat16>(k, ctx.stream, storage, g, y.data);
    break;
  case DType::F16:
    launchDequantize<__half>(k, ctx.stream, storage, g, y.data);
    break;
  default:
    fail(k, std::string("y must be f32, f16 or bf16, got ") + dtypeName(y.dtype));
  }
}

} // namespace bonsai::rt::cuda
