//===- DeviceUtil.cuh - Device-side helpers shared by the CUDA kernels -----===//
//
// Private to runtime/cuda. Storage types (float, __half, __nv_bfloat16) and their conversions
// to and from fp32 (round to nearest even), 16-byte vector loads and stores converting to fp32,
// warp, row and row-group reductions with a fixed combination order (so results are the same run
// to run), the second stage of the deterministic column sums (partial rows added in order),
// a row visitor that peels unaligned heads so rows of any length use vector accesses, the
// device error record, and the host-side dispatch from DType to storage type.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CUDA_DEVICEUTIL_CUH
#define BONSAI_RUNTIME_CUDA_DEVICEUTIL_CUH

#include "CudaCheck.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace bonsai::rt::cuda::detail {

//===----------------------------------------------------------------------===//
// Storage types
//===----------------------------------------------------------------------===//

__device__ __forceinline__ float toFloat(float v) { return v; }
__device__ __forceinline__ float toFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T fromFloat(float v);
template <> __device__ __forceinline__ float fromFloat<float>(float v) { return v; }
template <> __device__ __forceinline__ __half fromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/// Elements of T in one 16-byte vector.
template <typename T> constexpr int kVec = int(16 / sizeof(T));

/// An unsigned type of `Bytes` bytes, for one load or store of that width.
template <int Bytes> struct RawType;
template <> struct RawType<16> { using type = uint4; };
template <> struct RawType<8> { using type = uint2; };
template <> struct RawType<4> { using type = uint32_t; };
template <> struct RawType<2> { using type = uint16_t; };
template <> struct RawType<1> { using type = uint8_t; };

/// The raw bits of N consecutive elements of T, for one access.
template <int N, typename T> using RawOf = typename RawType<int(N * sizeof(T))>::type;

/// Loads the raw bits of N consecutive elements (one access of N * sizeof(T) bytes, which must
/// be aligned to that size).
template <int N, typename T> __device__ __forceinline__ RawOf<N, T> loadRaw(const T *p) {
  return *reinterpret_cast<const RawOf<N, T> *>(p);
}

/// The N elements of T held in `raw`, as fp32.
template <int N, typename T>
__device__ __forceinline__ void unpackF(const RawOf<N, T> &raw, float (&out)[N]) {
  T e[N];
  memcpy(e, &raw, sizeof raw);
#pragma unroll
  for (int i = 0; i < N; ++i)
    out[i] = toFloat(e[i]);
}

/// Loads N consecutive elements (one access of N * sizeof(T) bytes, which must be aligned to
/// that size) as fp32.
template <int N, typename T> __device__ __forceinline__ void loadF(const T *p, float (&out)[N]) {
  unpackF<N, T>(loadRaw<N>(p), out);
}

/// Stores N fp32 values rounded to T as one aligned access.
template <int N, typename T> __device__ __forceinline__ void storeF(T *p, const float (&in)[N]) {
  using R = typename RawType<int(N * sizeof(T))>::type;
  T e[N];
#pragma unroll
  for (int i = 0; i < N; ++i)
    e[i] = fromFloat<T>(in[i]);
  R raw;
  memcpy(&raw, e, sizeof raw);
  *reinterpret_cast<R *>(p) = raw;
}

/// A float scalar of any float dtype, read on the device (lr, grad norms, dloss).
__device__ __forceinline__ float loadScalar(const void *p, DType dtype) {
  switch (dtype) {
  case DType::F16:
    return __half2float(*static_cast<const __half *>(p));
  case DType::BF16:
    return __bfloat162float(*static_cast<const __nv_bfloat16 *>(p));
  default:
    return *static_cast<const float *>(p);
  }
}

/// Stores a float scalar into any float dtype.
__device__ __forceinline__ void storeScalar(void *p, DType dtype, float v) {
  switch (dtype) {
  case DType::F16:
    *static_cast<__half *>(p) = __float2half_rn(v);
    break;
  case DType::BF16:
    *static_cast<__nv_bfloat16 *>(p) = __float2bfloat16_rn(v);
    break;
  default:
    *static_cast<float *>(p) = v;
  }
}

/// Element `i` of an I32 or I64 tensor.
__device__ __forceinline__ int64_t loadIndexAt(const void *p, bool wide, int64_t i) {
  return wide ? static_cast<const int64_t *>(p)[i] : int64_t(static_cast<const int32_t *>(p)[i]);
}

//===----------------------------------------------------------------------===//
// Reductions. Every combination order below is fixed by the thread layout alone, so a
// reduction gives the same bits on every run with the same launch configuration.
//===----------------------------------------------------------------------===//

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  static constexpr float identity() { return 0.0f; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static constexpr float identity() { return -__builtin_huge_valf(); }
};

template <typename Op> __device__ __forceinline__ float warpReduce(float v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/// Reduces `v` over the blockDim.x threads of one row (threadIdx.y) and returns the result to
/// every one of them. With blockDim.x == 32 a row is one warp and no barrier is used (rows of a
/// block may then finish independently); otherwise blockDim.y must be 1 and every thread of the
/// block must call it. `scratch` holds 32 floats per row.
template <typename Op> __device__ __forceinline__ float rowReduce(float v, float *scratch, Op op) {
  v = warpReduce(v, op);
  if (blockDim.x == 32)
    return v;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads(); // the previous reduction's readers are done with scratch
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : Op::identity();
  return warpReduce(v, op);
}

/// Sums two values at once over a row (see rowReduce; `scratch` holds 64 floats per row).
__device__ __forceinline__ void rowReduceSum2(float &a, float &b, float *scratch) {
  a = warpReduce(a, SumOp{});
  b = warpReduce(b, SumOp{});
  if (blockDim.x == 32)
    return;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  a = warpReduce(lane < warps ? scratch[lane] : 0.0f, SumOp{});
  b = warpReduce(lane < warps ? scratch[32 + lane] : 0.0f, SumOp{});
}

/// Sums each of the N values over the blockDim.x threads of its row group (threadIdx.y) and
/// returns the sums to every thread of the group. With blockDim.x == 32 a group is one warp and
/// no barrier is used; otherwise every thread of the block must call it (the groups step
/// together). `scratch` holds 32 N floats per group.
template <int N> __device__ __forceinline__ void groupReduceSum(float (&v)[N], float *scratch) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    v[i] = warpReduce(v[i], SumOp{});
  if (blockDim.x == 32)
    return;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float *s = scratch + threadIdx.y * 32 * N;
  __syncthreads(); // the previous reduction's readers are done with scratch
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < N; ++i)
      s[i * 32 + warp] = v[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i)
    v[i] = warpReduce(lane < warps ? s[i * 32 + lane] : 0.0f, SumOp{});
}

/// Row groups of sumPartialRowsKernel's blocks (blockDim = (32, kPartialGroups)).
constexpr int kPartialGroups = 16;

/// The second stage of a deterministic column sum: store(c, sum) for every column c < cols, sum
/// the sum over rows b = 0, 1, ..., count - 1 of partial[b, c] ([count, cols] fp32). Each block
/// takes 32 columns; its row group y adds the rows y, y + kPartialGroups, ... in that order (many
/// loads in flight), and the groups' sums are added in group order, so the result depends only
/// on count and cols. `Store` is a functor with `__device__ void operator()(int64_t, float)`.
template <typename Store>
__global__ void sumPartialRowsKernel(const float *partial, int64_t count, int64_t cols,
                                     Store store) {
  __shared__ float sums[kPartialGroups][32];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
#pragma unroll 8
    for (int64_t b = threadIdx.y; b < count; b += kPartialGroups)
      sum += partial[b * cols + c];
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols)
    return;
  sum = sums[0][threadIdx.x];
#pragma unroll
  for (int g = 1; g < kPartialGroups; ++g)
    sum += sums[g][threadIdx.x];
  store(c, sum);
}

/// Stores a column sum as TY into out0[c] for c < split and out1[c - split] for the rest (a
/// weight and a bias gradient from one buffer).
template <typename TY> struct SplitColumnStore {
  TY *out0;
  int64_t split;
  TY *out1;
  __device__ void operator()(int64_t c, float sum) const {
    if (c < split)
      out0[c] = fromFloat<TY>(sum);
    else
      out1[c - split] = fromFloat<TY>(sum);
  }
};

/// Enqueues sumPartialRowsKernel over `cols` columns with `store`.
template <typename Store>
void sumPartialRowsWith(const char *kernel, Stream stream, const float *partial, int64_t count,
                        int64_t cols, Store store) {
  dim3 grid(unsigned((cols + 31) / 32));
  sumPartialRowsKernel<Store>
      <<<grid, dim3(32, kPartialGroups), 0, stream>>>(partial, count, cols, store);
  checkLaunch(kernel, "sumPartialRowsKernel");
}

/// Enqueues sumPartialRowsKernel over `cols` columns storing into out0 and out1 as
/// SplitColumnStore does.
template <typename TY>
void sumPartialRows(const char *kernel, Stream stream, const float *partial, int64_t count,
                    int64_t cols, TY *out0, int64_t split, TY *out1) {
  sumPartialRowsWith(kernel, stream, partial, count, cols, SplitColumnStore<TY>{out0, split, out1});
}

/// An online softmax accumulator: the running maximum `m` (scaled by log2 e) and the sum of
/// 2^(x log2 e - m) over the elements seen.
struct SoftmaxState {
  float m = -__builtin_huge_valf();
  float s = 0.0f;
};

constexpr float kLog2e = 1.4426950408889634f;

/// Adds N values to the state: one rescale per vector, not per element.
template <int N>
__device__ __forceinline__ void softmaxAccumulate(SoftmaxState &st, const float (&x)[N]) {
  float mx = x[0] * kLog2e;
#pragma unroll
  for (int i = 1; i < N; ++i)
    mx = fmaxf(mx, x[i] * kLog2e);
  if (mx > st.m) {
    // exp2(-inf) is 0, so the first vector (m = -inf) needs no special case.
    st.s *= exp2f(st.m - mx);
    st.m = mx;
  }
  if (st.m == -__builtin_huge_valf())
    return; // every value so far is -inf: their exponentials are 0
#pragma unroll
  for (int i = 0; i < N; ++i)
    st.s += exp2f(fmaf(x[i], kLog2e, -st.m));
}

__device__ __forceinline__ SoftmaxState softmaxMerge(SoftmaxState a, SoftmaxState b) {
  float m = fmaxf(a.m, b.m);
  if (m == -__builtin_huge_valf())
    return a;
  SoftmaxState r;
  r.m = m;
  r.s = a.s * exp2f(a.m - m) + b.s * exp2f(b.m - m);
  return r;
}

/// Merges the states of one row's threads (see rowReduce for the layout rules); `scratch`
/// holds 64 floats per row.
__device__ __forceinline__ SoftmaxState rowSoftmaxReduce(SoftmaxState st, float *scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    SoftmaxState o;
    o.m = __shfl_xor_sync(0xffffffffu, st.m, offset);
    o.s = __shfl_xor_sync(0xffffffffu, st.s, offset);
    st = softmaxMerge(st, o);
  }
  if (blockDim.x == 32)
    return st;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = st.m;
    scratch[32 + warp] = st.s;
  }
  __syncthreads();
  SoftmaxState w;
  if (lane < warps) {
    w.m = scratch[lane];
    w.s = scratch[32 + lane];
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    SoftmaxState o;
    o.m = __shfl_xor_sync(0xffffffffu, w.m, offset);
    o.s = __shfl_xor_sync(0xffffffffu, w.s, offset);
    w = softmaxMerge(w, o);
  }
  return w;
}

//===----------------------------------------------------------------------===//
// Row visiting
//===----------------------------------------------------------------------===//

template <int N> using Width = std::integral_constant<int, N>;

/// Elements before the first 16-byte boundary of a row at `row` (at most d); 0 when VW = 1.
template <int VW, typename T> __device__ __forceinline__ int64_t rowHead(const T *row, int64_t d) {
  if constexpr (VW == 1) {
    return 0;
  } else {
    int64_t misaligned = int64_t((16 - (reinterpret_cast<uintptr_t>(row) & 15u)) & 15u);
    int64_t head = misaligned / int64_t(sizeof(T));
    return head < d ? head : d;
  }
}

/// Loads N elements of a side operand (a weight, a bias) as fp32: in accesses of up to 16 bytes
/// when `vector` says p is aligned for them, else one element at a time.
template <int N, typename W>
__device__ __forceinline__ void loadSide(const W *p, float (&out)[N], bool vector) {
  constexpr int C = int(N * sizeof(W)) >= 16 ? kVec<W> : N;
  if (vector) {
#pragma unroll
    for (int c = 0; c < N; c += C) {
      float t[C];
      loadF<C>(p + c, t);
#pragma unroll
      for (int e = 0; e < C; ++e)
        out[c + e] = t[e];
    }
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e)
      out[e] = toFloat(p[e]);
  }
}

/// Whether loadSide<VW> may use vector accesses from p onwards in steps of VW elements.
template <int VW, typename W> __device__ __forceinline__ bool sideAligned(const W *p) {
  constexpr unsigned bytes = unsigned(VW * sizeof(W)) >= 16u ? 16u : unsigned(VW * sizeof(W));
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1u)) == 0;
}

/// Calls f(i, Width<n>) over the elements [0, d) of a row starting at `row`, split among
/// `threads` threads (this one is `tid`): n = VW for aligned vectors of VW elements, n = 1
/// for the unaligned head and the tail. The split depends only on d, the row's address modulo
/// 16 and the thread count, so two rows with congruent addresses are split alike.
template <int VW, typename T, typename F>
__device__ __forceinline__ void forRow(const T *row, int64_t d, int tid, int threads, F &&f) {
  int64_t head = rowHead<VW>(row, d);
  for (int64_t i = tid; i < head; i += threads)
    f(i, Width<1>{});
  int64_t vectors = (d - head) / VW;
  for (int64_t v = tid; v < vectors; v += threads)
    f(head + v * VW, Width<VW>{});
  for (int64_t i = head + vectors * VW + tid; i < d; i += threads)
    f(i, Width<1>{});
}

//===----------------------------------------------------------------------===//
// Device errors
//===----------------------------------------------------------------------===//

/// Records an error unless one was recorded already (the first error of a step wins).
__device__ __forceinline__ void recordError(DeviceError *error, int32_t kernelIndex,
                                            int32_t code, int64_t index, int64_t value) {
  if (!error)
    return;
  if (atomicCAS(&error->code, 0, code) == 0) {
    error->kernel = kernelIndex;
    error->index = index;
    error->value = value;
  }
}

//===----------------------------------------------------------------------===//
// Host-side dispatch
//===----------------------------------------------------------------------===//

/// Calls f(T{}) with T the storage type of float dtype `dtype`.
template <typename F> void dispatchFloat(DType dtype, F &&f) {
  switch (dtype) {
  case DType::F16:
    f(__half{});
    break;
  case DType::BF16:
    f(__nv_bfloat16{});
    break;
  default:
    f(float{});
    break;
  }
}

/// The vector width a row kernel over these rows may use: 16 / sizeof(T) when every row
/// pointer listed is congruent to the first modulo 16 (so one head peel suits all of them),
/// else 1.
template <typename T> int rowVectorWidth(std::initializer_list<const void *> pointers) {
  uintptr_t first = reinterpret_cast<uintptr_t>(*pointers.begin()) & 15u;
  for (const void *p : pointers)
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != first)
      return 1;
  return kVec<T>;
}

/// Threads per row for a row of `d` elements read `vw` at a time: one warp for short rows,
/// else enough threads for about four vectors each, at most 1024.
inline int threadsPerRow(int64_t d, int vw) {
  int64_t vectors = (d + vw - 1) / vw;
  if (vectors <= 128)
    return 32;
  int64_t t = ((vectors + 3) / 4 + 31) / 32 * 32;
  return int(t < 1024 ? t : 1024);
}

} // namespace bonsai::rt::cuda::detail

#endif // BONSAI_RUNTIME_CUDA_DEVICEUTIL_CUH
