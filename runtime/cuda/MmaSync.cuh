//===- MmaSync.cuh - Warp-level tensor-core primitives (sm_80 and newer) ---===//
//
// The PTX the mma.sync kernels share (attention's Ampere/Ada path, the NF4 GEMM, DoRA's row
// norms): shared-memory addresses, cp.async copies, ldmatrix, and mma.sync m16n8k16 with 16-bit
// inputs and fp32 accumulation. Fragment layouts are PTX's ("Matrix Fragments for
// mma.m16n8k16"): with g = lane / 4 and q = lane % 4, A's registers hold (row g, k 2q..2q+1),
// (g + 8, 2q..), (g, 2q + 8..), (g + 8, 2q + 8..); B's (k 2q..2q+1, n g), (2q + 8.., g); C's
// (row g, n 2q..2q+1) and (g + 8, 2q..).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CUDA_MMASYNC_CUH
#define BONSAI_RUNTIME_CUDA_MMASYNC_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace bonsai::rt::cuda::mma {

/// The shared-state-space address of a pointer into shared memory.
__device__ __forceinline__ uint32_t smemAddr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte global -> shared copy; with valid false, writes zeros and reads nothing.
__device__ __forceinline__ void cpAsync16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smemAddr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

/// 4-byte global -> shared copy; with valid false, writes zeros and reads nothing.
__device__ __forceinline__ void cpAsync4(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smemAddr(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// Four 8x8 16-bit matrices from shared memory, lane l giving the address of row l % 8 of
/// matrix l / 8.
__device__ __forceinline__ void ldsm(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smemAddr(p))
               : "memory");
}

/// As ldsm, each matrix transposed.
__device__ __forceinline__ void ldsmTrans(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smemAddr(p))
               : "memory");
}

/// c += a · b for a 16x16 A and 16x8 B of bf16 (the first argument picks the type).
__device__ __forceinline__ void mma(__nv_bfloat16, float (&c)[4], const uint32_t (&a)[4],
                                    uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// c += a · b for a 16x16 A and 16x8 B of f16.
__device__ __forceinline__ void mma(__half, float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats as one register of two 16-bit values, `lo` in the low half.
__device__ __forceinline__ uint32_t pack(__nv_bfloat16, float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ uint32_t pack(__half, float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

/// Two 16-bit values of one register as floats, the low half first.
__device__ __forceinline__ float2 unpack(__nv_bfloat16, uint32_t r) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&r));
}

__device__ __forceinline__ float2 unpack(__half, uint32_t r) {
  return __half22float2(*reinterpret_cast<const __half2 *>(&r));
}

} // namespace bonsai::rt::cuda::mma

#endif // BONSAI_RUNTIME_CUDA_MMASYNC_CUH
