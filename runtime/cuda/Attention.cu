//===- Attention.cu - attention and attentionGrad on CUDA ------------------===//
//
// Exact softmax(scale q kᵀ [+ causal mask]) v and its gradients for [B, S, H, D] tensors,
// never materialising the S x S scores (FlashAttention-2's scheme).
//
// Two paths. The tensor-core path takes bf16 or f16 storage with D a multiple of 8 up to 128
// (padded in shared memory to 64 or 128) on sm_80 and newer: mma.sync m16n8k16 with fp32
// accumulation, tiles staged through shared memory by cp.async (double-buffered), an online
// softmax in base 2 with fp32 running maxima and sums. The generic path takes everything else
// (f32 storage, mixed storage types, other head dims): one warp per query or key row, one lane per
// key or query of a 32-wide tile, fp32 FMA arithmetic; it is the reference the tests hold f32 to.
//
// attention() writes no log-sum-exp; flashAttention() is the same forward that also writes each
// row's natural-log log-sum-exp (f32 [B, H, S]), which both paths hold at the end anyway, and
// flashAttentionGrad() takes it back (see below). On the tensor-core path attentionGrad runs two
// kernels: one per query tile forms D_i = dO_i . o_i and dq, looping
// over key tiles with an online softmax as the forward does (so it needs no normaliser in
// advance), and writes D and each row's log-sum-exp as by-products; then one per key tile forms
// dk and dv from those, looping over the query heads that share the kv head, then over query
// tiles. The generic path computes D and the log-sum-exp in passes of their own.
// flashAttentionGrad runs the same kernels with the saved log-sum-exp: the dq kernel forms
// p = 2^(x - lse log2(e)) directly, with no running maximum, sum or rescaling of dq (and hands the
// base-2 lse on to the dk/dv kernel), and the generic path skips its log-sum-exp pass.
// On Hopper (a build with sm_90a code, an sm_90 device), bf16 at head dim 64 or 128 takes
// warpgroup MMA (wgmma) kernels (namespace wg) for the forward (with a positive scale), the dk/dv
// kernel and, from the saved log-sum-exp, the dq kernel: the mma.sync kernels' softmax arithmetic
// on the same fragment layout, over 128-key tiles, with the operands read by the tensor cores
// straight from swizzled shared memory, loaded there by TMA from a producer warpgroup
// (FlashAttention-3's design). Segment ids (packed rows, query i reads key j only within its
// segment) are masked by every kernel; each tensor-core block (mma.sync or warpgroup) first reads
// the ids to find the tiles that hold its rows' documents (SegmentWindow), visits only those, and
// masks only the tiles that straddle a document's edge. The segmented tensor-core kernels are
// instances of their own (kSegments), so that those without segment ids do not change.
// Causal tiles differ in length, so the tensor-core kernels start their blocks longest first
// across groups of heads, not head by head (tileOf), which keeps the last wave from running a
// few long tiles alone. Scratch (D and the log-sum-exp) is CudaCheck.h's Scratch: cudaMallocAsync
// on ctx.stream, which graph capture accepts, or the backend's arena inside a conditional body.
// Every output element is summed by one thread in a fixed order, so results are identical run to
// run, unless the caller turns Context::deterministic off: then
// flashAttentionGrad on the Hopper path forms dq inside the dk/dv kernel (FlashAttention-3's
// one-pass backward, five products instead of seven) and adds each key block's share into f32
// sums with bulk reductions, in the order the blocks run.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "AttentionRows.h"
#include "CudaCheck.h"
#include "MmaSync.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace bonsai::rt::cuda {

namespace {

//===----------------------------------------------------------------------===//
// Host-side checks
//===----------------------------------------------------------------------===//

// The backend's checks (CudaCheck.h), with its messages.
using detail::checkFloat;
using detail::checkSameShape;
using detail::fail;
using detail::overlaps;
using detail::Scratch;

/// checkCuda with the kernel first, as this file's calls read.
void checkCuda(const char *kernel, cudaError_t status, const char *call) {
  detail::checkCuda(status, call, kernel);
}

// Kernels read their inputs while other blocks write their outputs, so an output may share no
// byte with an input or another output.
void checkDisjoint(const char *kernel, const char *outName, const TensorView &out,
                   std::initializer_list<std::pair<const char *, const TensorView *>> others) {
  for (const auto &[name, t] : others)
    if (overlaps(out, *t))
      fail(kernel, std::string(outName) + " overlaps " + name);
}

/// The dimensions of an attention problem: `seq` queries against `seqK` keys (the same but in
/// ring attention's block steps, whose keys are another rank's).
struct Dims {
  int64_t batch, seq, heads, kvHeads, d, seqK;
};

/// Checks q, k, v and returns their dimensions; k and v must have q's sequence length unless
/// `keysOfTheirOwn` (a ring block step).
Dims checkOperands(const char *kn, const TensorView &q, const TensorView &k, const TensorView &v,
                   bool keysOfTheirOwn = false) {
  checkFloat(kn, "q", q);
  checkFloat(kn, "k", k);
  checkFloat(kn, "v", v);
  if (q.rank() != 4)
    fail(kn, "q shape " + formatShape(q.shape) + " is not [batch, seq, heads, head_dim]");
  Dims dims{q.dim(0), q.dim(1), q.dim(2), 0, q.dim(3), q.dim(1)};
  if (k.rank() != 4 || k.dim(0) != dims.batch || (!keysOfTheirOwn && k.dim(1) != dims.seq) ||
      k.dim(3) != dims.d || k.dim(2) <= 0 || dims.heads % k.dim(2) != 0)
    fail(kn, "k shape " + formatShape(k.shape) + " is not [" + std::to_string(dims.batch) + ", " +
                 (keysOfTheirOwn ? std::string("keys") : std::to_string(dims.seq)) +
                 ", kv_heads, " + std::to_string(dims.d) +
                 "] with kv_heads dividing the heads of q shape " + formatShape(q.shape));
  checkSameShape(kn, "v", v, "k", k);
  dims.kvHeads = k.dim(2);
  dims.seqK = k.dim(1);
  if (dims.seq > std::numeric_limits<int32_t>::max() / 2 ||
      dims.seqK > std::numeric_limits<int32_t>::max() / 2 ||
      dims.batch * dims.heads > std::numeric_limits<int32_t>::max() ||
      dims.d > std::numeric_limits<int32_t>::max() / 64)
    fail(kn, "q shape " + formatShape(q.shape) + " is too large for the CUDA kernels");
  return dims;
}

int deviceAttribute(const char *kn, cudaDeviceAttr attr) {
  int device = 0, value = 0;
  checkCuda(kn, cudaGetDevice(&device), "cudaGetDevice");
  checkCuda(kn, cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}

bool aligned16(const TensorView &t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; }

/// Whether the tensor-core kernels take these operands: one bf16 or f16 storage type, a head
/// dim they can pad to 64 or 128 with 16-byte rows, 16-byte aligned data, an sm_80+ device.
bool tensorCorePath(const char *kn, const Dims &dims,
                    std::initializer_list<const TensorView *> operands) {
  DType dtype = (*operands.begin())->dtype;
  if (dtype != DType::BF16 && dtype != DType::F16)
    return false;
  if (dims.d % 8 != 0 || dims.d > 128)
    return false;
  for (const TensorView *t : operands)
    if (t->dtype != dtype || !aligned16(*t))
      return false;
  return deviceAttribute(kn, cudaDevAttrComputeCapabilityMajor) >= 8;
}

/// Sets a kernel's dynamic shared-memory limit (needed above 48 KB) after checking the device's.
template <typename Kernel> void allowSharedMemory(const char *kn, Kernel kernel, size_t bytes) {
  int limit = deviceAttribute(kn, cudaDevAttrMaxSharedMemoryPerBlockOptin);
  if (bytes > size_t(limit))
    fail(kn, "needs " + std::to_string(bytes) +
                 " bytes of shared memory per block; the device has " + std::to_string(limit));
  checkCuda(kn,
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
            "cudaFuncSetAttribute");
}

//===----------------------------------------------------------------------===//
// Kernel arguments
//===----------------------------------------------------------------------===//

/// Everything a kernel of either path needs; unused pointers are null.
struct Args {
  const void *q, *k, *v, *o, *dout;
  void *out, *dq, *dk, *dv;
  float *lse, *dsum; ///< [B, H, S] scratch rows of attentionGrad
  /// The f32 sums of dq that the reducing warpgroup dk/dv kernel adds into (wg::dqSumFloats);
  /// null on every other path.
  float *dqSums;
  /// flashAttention: where the forward writes the natural-log log-sum-exp [B, H, S] (null:
  /// attention, none written). flashAttentionGrad: the saved one, read.
  float *savedLse;
  int qType, kType, vType, oType, doutType, outType, dqType, dkType, dvType;
  int seq, heads, kvHeads, group, d;
  int seqK; ///< keys (seq but in a ring block step); causal calls have seqK == seq
  /// Elements from one position to the next: of q and dq; of k, v, dk and dv; of o and dout.
  /// Heads times head_dim for tensors of their own; the packed width (H + 2 KV) D for q, k and v
  /// read out of one qkv tensor and their gradients written into one (flashAttentionQkv).
  int64_t qStride, kvStride, oStride;
  float scale, scaleLog2;
  int causal;
  /// (batch, head) groups per chunk of tileOf's block order; 0: head by head.
  int orderChunk;
  /// Segment ids [B, S] of packed rows (null: none), i64 when segmentsI64 else i32, and those of
  /// the keys [B, seqK] (the same array but in a ring block step). Read by the generic kernels
  /// and by the tensor-core kernels' kSegments instances.
  const void *segments, *keySegments;
  int segmentsI64;
  int numTiles; ///< tiles along the sequence per (batch, head) or (batch, kv head)
};

/// Groups per chunk of the causal kernels' block order (tileOf). On the H200, 8 and 16 measure the
/// same (B4 S4096 H32: 8.39 and 8.42 ms forward and backward, against 8.64 head by head).
constexpr int kOrderChunk = 8;

Args makeArgs(const Dims &dims, bool causal, double scale) {
  Args a{};
  // Tiles of one length need no order, and head by head keeps the blocks in flight on few heads.
  a.orderChunk = causal ? kOrderChunk : 0;
  a.seq = int(dims.seq);
  a.seqK = int(dims.seqK);
  a.heads = int(dims.heads);
  a.kvHeads = int(dims.kvHeads);
  a.group = int(dims.heads / dims.kvHeads);
  a.d = int(dims.d);
  a.qStride = a.oStride = dims.heads * dims.d;
  a.kvStride = dims.kvHeads * dims.d;
  a.scale = float(scale);
  a.scaleLog2 = float(scale * 1.4426950408889634); // log2(e)
  a.causal = causal ? 1 : 0;
  return a;
}

int typeCode(DType dtype) { return int(dtype); } // F32 = 0, F16 = 1, BF16 = 2

/// The element offset of position 0 of head `head` of batch row `b` in an operand of `rows`
/// positions `stride` elements apart and heads `d` elements apart: (b rows heads + head) d when
/// the operand is a tensor of its own (stride = heads d).
__host__ __device__ __forceinline__ int64_t headOffset(int64_t b, int64_t rows, int64_t stride,
                                                       int64_t head, int64_t d) {
  return b * rows * stride + head * d;
}

//===----------------------------------------------------------------------===//
// Device helpers shared by both paths
//===----------------------------------------------------------------------===//

__device__ __forceinline__ float loadElem(const void *p, int dtype, int64_t i) {
  if (dtype == 2)
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
  if (dtype == 1)
    return __half2float(static_cast<const __half *>(p)[i]);
  return static_cast<const float *>(p)[i];
}

__device__ __forceinline__ void storeElem(void *p, int dtype, int64_t i, float x) {
  if (dtype == 2)
    static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(x);
  else if (dtype == 1)
    static_cast<__half *>(p)[i] = __float2half_rn(x);
  else
    static_cast<float *>(p)[i] = x;
}

/// Whether query i may read key j of batch row b under the segment ids (always without them).
__device__ __forceinline__ bool sameSegment(const Args &a, int b, int i, int j) {
  if (!a.segments)
    return true;
  const int64_t qRow = int64_t(b) * a.seq, kRow = int64_t(b) * a.seqK;
  if (a.segmentsI64)
    return static_cast<const int64_t *>(a.segments)[qRow + i] ==
           static_cast<const int64_t *>(a.keySegments)[kRow + j];
  return static_cast<const int32_t *>(a.segments)[qRow + i] ==
         static_cast<const int32_t *>(a.keySegments)[kRow + j];
}

/// Segment id `index` of `ids` (i64 when i64, else i32), widened.
__device__ __forceinline__ int64_t segmentAt(const void *ids, int i64, int64_t index) {
  return i64 ? static_cast<const int64_t *>(ids)[index]
             : int64_t(static_cast<const int32_t *>(ids)[index]);
}

/// Segment ids from element `offset` of `ids` on (a batch row's ids).
__device__ __forceinline__ const void *segmentRow(const void *ids, int i64, int64_t offset) {
  return static_cast<const char *>(ids) + offset * (i64 ? 8 : 4);
}

__device__ __forceinline__ float warpMax(float x) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ __forceinline__ float warpSum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

/// dsum[(b H + h) S + i] = sum_e dO[b, i, h, e] o[b, i, h, e]: one warp per row (the generic
/// path's D; the tensor-core dq kernel forms its own).
__global__ void rowDotKernel(const Args a, int64_t rows) {
  int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x & 31;
  if (row >= rows)
    return;
  const int64_t h = row % a.heads, bi = row / a.heads, i = bi % a.seq, b = bi / a.seq;
  const int64_t offset = headOffset(b, a.seq, a.oStride, h, a.d) + i * a.oStride;
  float dot = 0.f;
  for (int e = lane; e < a.d; e += 32)
    dot = fmaf(loadElem(a.dout, a.doutType, offset + e), loadElem(a.o, a.oType, offset + e), dot);
  dot = warpSum(dot);
  if (lane == 0)
    a.dsum[(b * a.heads + h) * a.seq + i] = dot;
}

//===----------------------------------------------------------------------===//
// Generic path: fp32 FMA, any storage types, any head dim
//===----------------------------------------------------------------------===//

namespace generic {

constexpr int kWarps = 8; ///< rows (queries or keys) per block, one warp each
constexpr int kTile = 32; ///< keys (or queries) per shared-memory tile, one per lane
constexpr int kThreads = kWarps * 32;

// An odd pitch puts the 32 lanes' rows (lane * pitch + e) in 32 different banks.
__host__ __device__ inline int pitchOf(int d) { return d | 1; }

/// Loads rows [row0, row0 + kTile) of a [B, S, heads, D] operand at (b, head) as fp32 into
/// smem[r * pitch + e]; rows past the sequence are zeros.
__device__ void loadRows(float *smem, const void *src, int dtype, int64_t base, int64_t stride,
                         int row0, int seq, int d) {
  int pitch = pitchOf(d);
  for (int idx = threadIdx.x; idx < kTile * d; idx += kThreads) {
    int r = idx / d, e = idx - r * d;
    int j = row0 + r;
    smem[r * pitch + e] = j < seq ? loadElem(src, dtype, base + int64_t(j) * stride + e) : 0.f;
  }
}

size_t forwardSmem(int d) {
  return sizeof(float) * (2 * kTile * pitchOf(d) + 2 * kWarps * d + kWarps * kTile);
}

/// Forward (or, with lseOnly, the natural-log log-sum-exp of each row into a.lse): one warp per
/// query row, the block's 8 rows sharing each key/value tile.
__global__ void __launch_bounds__(kThreads) forwardKernel(const Args a, bool lseOnly) {
  extern __shared__ float smem[];
  const int d = a.d, pitch = pitchOf(d);
  float *sK = smem, *sV = sK + kTile * pitch, *sQ = sV + kTile * pitch, *sAcc = sQ + kWarps * d;
  float *sP = sAcc + kWarps * d;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int rank = blockIdx.x % a.numTiles, bh = blockIdx.x / a.numTiles;
  const int tile = a.causal ? a.numTiles - 1 - rank : rank;
  const int b = bh / a.heads, h = bh % a.heads, g = h / a.group;
  const int i = tile * kWarps + warp;
  const bool active = i < a.seq;
  const int64_t qRow = headOffset(b, a.seq, a.qStride, h, d) + int64_t(i) * a.qStride;
  const int64_t oRow = headOffset(b, a.seq, a.oStride, h, d) + int64_t(i) * a.oStride;
  const int64_t kvBase = headOffset(b, a.seqK, a.kvStride, g, d);
  float *q = sQ + warp * d, *acc = sAcc + warp * d, *p = sP + warp * kTile;
  for (int e = lane; e < d; e += 32) {
    q[e] = active ? loadElem(a.q, a.qType, qRow + e) : 0.f;
    acc[e] = 0.f;
  }
  float rowMax = -INFINITY, rowSum = 0.f;
  const int keyEnd = a.causal ? min(a.seqK, (tile + 1) * kWarps) : a.seqK;
  for (int t0 = 0; t0 < keyEnd; t0 += kTile) {
    __syncthreads(); // the previous tile is consumed
    loadRows(sK, a.k, a.kType, kvBase, a.kvStride, t0, a.seqK, d);
    if (!lseOnly)
      loadRows(sV, a.v, a.vType, kvBase, a.kvStride, t0, a.seqK, d);
    __syncthreads();
    if (!active)
      continue;
    const int j = t0 + lane;
    float s = -INFINITY;
    if (j < a.seqK && !(a.causal && j > i) && sameSegment(a, b, i, j)) {
      const float *kj = sK + lane * pitch;
      float dot = 0.f;
      for (int e = 0; e < d; ++e)
        dot = fmaf(q[e], kj[e], dot);
      s = dot * a.scale;
    }
    const float newMax = fmaxf(rowMax, warpMax(s));
    if (newMax == -INFINITY)
      continue; // every key of this tile is masked for this row
    const float correction = expf(rowMax - newMax), pj = expf(s - newMax);
    rowSum = rowSum * correction + warpSum(pj);
    rowMax = newMax;
    if (lseOnly)
      continue;
    p[lane] = pj;
    __syncwarp();
    for (int e = lane; e < d; e += 32) {
      float x = acc[e] * correction;
      for (int jj = 0; jj < kTile; ++jj)
        x = fmaf(p[jj], sV[jj * pitch + e], x);
      acc[e] = x;
    }
    __syncwarp();
  }
  if (!active)
    return;
  if (lseOnly) {
    if (lane == 0)
      a.lse[int64_t(bh) * a.seq + i] = rowMax + logf(rowSum);
    return;
  }
  // A row that read no key (segment ids without the causal diagonal) writes zeros and an lse
  // of -inf, not 0 * inf.
  const float inv = rowSum > 0.f ? 1.f / rowSum : 0.f;
  for (int e = lane; e < d; e += 32)
    storeElem(a.out, a.outType, oRow + e, acc[e] * inv);
  if (a.savedLse && lane == 0)
    a.savedLse[int64_t(bh) * a.seq + i] = rowMax + logf(rowSum);
}

size_t gradQSmem(int d) {
  return sizeof(float) * (2 * kTile * pitchOf(d) + 3 * kWarps * d + kWarps * kTile);
}

/// dq: one warp per query row, looping over key tiles.
__global__ void __launch_bounds__(kThreads) gradQKernel(const Args a) {
  extern __shared__ float smem[];
  const int d = a.d, pitch = pitchOf(d);
  float *sK = smem, *sV = sK + kTile * pitch, *sQ = sV + kTile * pitch, *sDo = sQ + kWarps * d;
  float *sAcc = sDo + kWarps * d, *sDs = sAcc + kWarps * d;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int rank = blockIdx.x % a.numTiles, bh = blockIdx.x / a.numTiles;
  const int tile = a.causal ? a.numTiles - 1 - rank : rank;
  const int b = bh / a.heads, h = bh % a.heads, g = h / a.group;
  const int i = tile * kWarps + warp;
  const bool active = i < a.seq;
  const int64_t qRow = headOffset(b, a.seq, a.qStride, h, d) + int64_t(i) * a.qStride;
  const int64_t oRow = headOffset(b, a.seq, a.oStride, h, d) + int64_t(i) * a.oStride;
  const int64_t kvBase = headOffset(b, a.seqK, a.kvStride, g, d);
  float *q = sQ + warp * d, *dout = sDo + warp * d, *acc = sAcc + warp * d,
        *ds = sDs + warp * kTile;
  for (int e = lane; e < d; e += 32) {
    q[e] = active ? loadElem(a.q, a.qType, qRow + e) : 0.f;
    dout[e] = active ? loadElem(a.dout, a.doutType, oRow + e) : 0.f;
    acc[e] = 0.f;
  }
  const float lse = active ? a.lse[int64_t(bh) * a.seq + i] : 0.f;
  const float rowDot = active ? a.dsum[int64_t(bh) * a.seq + i] : 0.f;
  const int keyEnd = a.causal ? min(a.seqK, (tile + 1) * kWarps) : a.seqK;
  for (int t0 = 0; t0 < keyEnd; t0 += kTile) {
    __syncthreads();
    loadRows(sK, a.k, a.kType, kvBase, a.kvStride, t0, a.seqK, d);
    loadRows(sV, a.v, a.vType, kvBase, a.kvStride, t0, a.seqK, d);
    __syncthreads();
    if (!active)
      continue;
    const int j = t0 + lane;
    float dsj = 0.f;
    if (j < a.seqK && !(a.causal && j > i) && sameSegment(a, b, i, j)) {
      const float *kj = sK + lane * pitch, *vj = sV + lane * pitch;
      float dot = 0.f, dp = 0.f;
      for (int e = 0; e < d; ++e) {
        dot = fmaf(q[e], kj[e], dot);
        dp = fmaf(dout[e], vj[e], dp);
      }
      dsj = expf(dot * a.scale - lse) * (dp - rowDot);
    }
    ds[lane] = dsj;
    __syncwarp();
    for (int e = lane; e < d; e += 32) {
      float x = acc[e];
      for (int jj = 0; jj < kTile; ++jj)
        x = fmaf(ds[jj], sK[jj * pitch + e], x);
      acc[e] = x;
    }
    __syncwarp();
  }
  if (!active)
    return;
  for (int e = lane; e < d; e += 32)
    storeElem(a.dq, a.dqType, qRow + e, acc[e] * a.scale);
}

size_t gradKVSmem(int d) {
  return sizeof(float) * (2 * kTile * pitchOf(d) + 2 * kTile + 4 * kWarps * d + 2 * kWarps * kTile);
}

/// dk and dv: one warp per key row, looping over the query heads that read its kv head, then
/// over query tiles, in order.
__global__ void __launch_bounds__(kThreads) gradKVKernel(const Args a) {
  extern __shared__ float smem[];
  const int d = a.d, pitch = pitchOf(d);
  float *sQ = smem, *sDo = sQ + kTile * pitch, *sLse = sDo + kTile * pitch, *sRowDot = sLse + kTile;
  float *sK = sRowDot + kTile, *sV = sK + kWarps * d, *sAccK = sV + kWarps * d;
  float *sAccV = sAccK + kWarps * d, *sP = sAccV + kWarps * d, *sDs = sP + kWarps * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int tile = blockIdx.x % a.numTiles, bg = blockIdx.x / a.numTiles;
  const int b = bg / a.kvHeads, g = bg % a.kvHeads;
  const int j = tile * kWarps + warp;
  const bool active = j < a.seqK;
  const int64_t kvRow = headOffset(b, a.seqK, a.kvStride, g, d) + int64_t(j) * a.kvStride;
  float *kj = sK + warp * d, *vj = sV + warp * d, *accK = sAccK + warp * d,
        *accV = sAccV + warp * d;
  float *p = sP + warp * kTile, *ds = sDs + warp * kTile;
  for (int e = lane; e < d; e += 32) {
    kj[e] = active ? loadElem(a.k, a.kType, kvRow + e) : 0.f;
    vj[e] = active ? loadElem(a.v, a.vType, kvRow + e) : 0.f;
    accK[e] = accV[e] = 0.f;
  }
  // With the causal mask only queries at or after the block's first key see its keys.
  const int queryStart = a.causal ? tile * kWarps : 0;
  for (int hh = 0; hh < a.group; ++hh) {
    const int h = g * a.group + hh;
    const int64_t qBase = headOffset(b, a.seq, a.qStride, h, d);
    const int64_t oBase = headOffset(b, a.seq, a.oStride, h, d);
    const int64_t rowBase = (int64_t(b) * a.heads + h) * a.seq;
    for (int t0 = queryStart; t0 < a.seq; t0 += kTile) {
      __syncthreads();
      loadRows(sQ, a.q, a.qType, qBase, a.qStride, t0, a.seq, d);
      loadRows(sDo, a.dout, a.doutType, oBase, a.oStride, t0, a.seq, d);
      if (threadIdx.x < kTile) {
        int i = t0 + threadIdx.x;
        sLse[threadIdx.x] = i < a.seq ? a.lse[rowBase + i] : 0.f;
        sRowDot[threadIdx.x] = i < a.seq ? a.dsum[rowBase + i] : 0.f;
      }
      __syncthreads();
      if (!active)
        continue;
      const int i = t0 + lane;
      float pi = 0.f, dsi = 0.f;
      if (i < a.seq && !(a.causal && j > i) && sameSegment(a, b, i, j)) {
        const float *qi = sQ + lane * pitch, *doi = sDo + lane * pitch;
        float dot = 0.f, dp = 0.f;
        for (int e = 0; e < d; ++e) {
          dot = fmaf(qi[e], kj[e], dot);
          dp = fmaf(doi[e], vj[e], dp);
        }
        pi = expf(dot * a.scale - sLse[lane]);
        dsi = pi * (dp - sRowDot[lane]);
      }
      p[lane] = pi;
      ds[lane] = dsi;
      __syncwarp();
      for (int e = lane; e < d; e += 32) {
        float xk = accK[e], xv = accV[e];
        for (int ii = 0; ii < kTile; ++ii) {
          xk = fmaf(ds[ii], sQ[ii * pitch + e], xk);
          xv = fmaf(p[ii], sDo[ii * pitch + e], xv);
        }
        accK[e] = xk;
        accV[e] = xv;
      }
      __syncwarp();
    }
  }
  if (!active)
    return;
  for (int e = lane; e < d; e += 32) {
    storeElem(a.dk, a.dkType, kvRow + e, accK[e] * a.scale);
    storeElem(a.dv, a.dvType, kvRow + e, accV[e]);
  }
}

} // namespace generic

//===----------------------------------------------------------------------===//
// Tensor-core path: bf16/f16 storage, mma.sync m16n8k16, fp32 accumulation
//===----------------------------------------------------------------------===//

namespace tc {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// Rows of every shared tile are padded by 16 bytes: the 8 rows an ldmatrix phase reads then
// start 4 banks apart and cover all 32.
template <int kD> constexpr int kPitch = kD + 8;

using mma::cpAsync16;
using mma::cpAsync4;
using mma::cpAsyncCommit;
using mma::cpAsyncWait;
using mma::ldsm;
using mma::ldsmTrans;
using mma::mma; // `mma(...)` is the function; `mma::` still names the namespace
using mma::pack;
using mma::smemAddr;

__device__ __forceinline__ float exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Per-lane offsets of the ldmatrix addresses (the 32 lanes give the rows of four 8x8 matrices).
// A operand, row-major [m][k]: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
__device__ __forceinline__ int aOffset(int lane, int pitch) {
  return (lane & 15) * pitch + (lane >> 4) * 8;
}
// B operand stored [n][k] (kᵀ for q kᵀ): b0, b1 of n-tile 0, then b0, b1 of n-tile 1.
__device__ __forceinline__ int bOffset(int lane, int pitch) {
  return ((lane & 7) + (lane >> 4) * 8) * pitch + ((lane >> 3) & 1) * 8;
}
// B operand stored [k][n] (v for p v), read transposed: b0, b1 of n-tile 0, then of n-tile 1.
__device__ __forceinline__ int btOffset(int lane, int pitch) {
  return ((lane & 7) + ((lane >> 3) & 1) * 8) * pitch + (lane >> 4) * 8;
}

/// Starts copying rows [row0, row0 + kRows) of an operand (row r at base + r * stride) into a
/// padded shared tile; rows past `seq` and columns past `d` become zeros. Each thread copies one
/// column chunk of every kRowStep-th row, so it keeps one source pointer, not one per copy.
template <int kRows, int kD, typename T>
__device__ __forceinline__ void loadTile(T *tile, const T *base, int64_t stride, int row0, int seq,
                                         int d) {
  constexpr int kChunks = kD / 8, kRowStep = kThreads / kChunks;
  static_assert(kRows % kRowStep == 0, "whole rows per pass");
  const int r0 = threadIdx.x / kChunks, col = (threadIdx.x % kChunks) * 8;
  const bool colValid = col < d;
  const T *src = base + int64_t(row0 + r0) * stride + col;
  T *dst = tile + r0 * kPitch<kD> + col;
#pragma unroll
  for (int k = 0; k < kRows / kRowStep; ++k) {
    const bool valid = colValid && row0 + r0 + k * kRowStep < seq;
    cpAsync16(dst + k * kRowStep * kPitch<kD>, valid ? src + k * kRowStep * stride : base, valid);
  }
}

/// Writes a warp's `kRows` rows of a shared tile to global rows [row0, ...), skipping rows past
/// `seq` and columns past `d`. 16-byte stores.
template <int kRows, int kD, typename T>
__device__ __forceinline__ void storeRows(T *base, int64_t stride, const T *tile, int row0, int seq,
                                          int d, int lane) {
  constexpr int kChunks = kD / 8;
  for (int c = lane; c < kRows * kChunks; c += 32) {
    int r = c / kChunks, col = (c % kChunks) * 8;
    if (row0 + r < seq && col < d)
      *reinterpret_cast<uint4 *>(base + int64_t(row0 + r) * stride + col) =
          *reinterpret_cast<const uint4 *>(tile + r * kPitch<kD> + col);
  }
}

/// Stores 16 rows of fp32 accumulator fragments as T into a shared tile, rows 0-7 times f0 and
/// rows 8-15 times f1.
template <int kD, typename T>
__device__ __forceinline__ void fragmentsToShared(T *tile, const float (&acc)[kD / 8][4], float f0,
                                                  float f1, int lane) {
#pragma unroll
  for (int dt = 0; dt < kD / 8; ++dt) {
    const int row = lane >> 2, col = dt * 8 + (lane & 3) * 2;
    *reinterpret_cast<uint32_t *>(tile + row * kPitch<kD> + col) =
        pack(T(), acc[dt][0] * f0, acc[dt][1] * f0);
    *reinterpret_cast<uint32_t *>(tile + (row + 8) * kPitch<kD> + col) =
        pack(T(), acc[dt][2] * f1, acc[dt][3] * f1);
  }
}

/// A block's tile: its rank along the sequence and its (batch, head) or (batch, kv head) group.
struct Tile {
  int rank, group;
};

/// Causal tiles differ in length (a query tile's keys end at its diagonal, a key tile's queries
/// start there), and blocks start roughly in blockIdx order, so the order decides the tail: in
/// group-major order the last groups' longest tiles start last and run alone. Causal blocks are
/// taken in chunks of a.orderChunk groups, rank-major within a chunk, so that every group's
/// longest tiles start first (longest-processing-time order) while the blocks in flight still
/// share a few heads' keys and values in L2. Rank 0 is the longest: the callers map it to their
/// tile.
__device__ __forceinline__ Tile tileOf(const Args &a) {
  const int chunkGroups = a.orderChunk;
  if (chunkGroups == 0)
    return {int(blockIdx.x % a.numTiles), int(blockIdx.x / a.numTiles)};
  const int groups = int(gridDim.x) / a.numTiles, chunkBlocks = chunkGroups * a.numTiles;
  const int chunk = int(blockIdx.x) / chunkBlocks, within = int(blockIdx.x) - chunk * chunkBlocks;
  const int width = min(chunkGroups, groups - chunk * chunkGroups); // the last chunk may be short
  return {within / width, chunk * chunkGroups + within % width};
}

/// Which rows of the other side a block's rows can read under segment ids (packed rows), found by
/// reading the ids, so that it holds for any ids: rows [begin, end) of the other side hold every
/// row whose segment is among the block's, and with `uniform` every row in that range is in the one
/// segment all the block's rows share, so no pair in it needs the segment mask. Packed rows keep a
/// document's tokens together, so the range covers the block's few documents and the tiles outside
/// it are skipped: the FLOPs that packing saves are saved.
struct SegmentWindow {
  int begin, end;
  bool uniform;
};

/// The block-wide minimum of `lo`, maximum of `hi` and sum of `count`, in every thread of a block
/// of kBlockThreads.
template <int kBlockThreads>
__device__ __forceinline__ void blockReduce(int64_t &lo, int64_t &hi, int64_t &count) {
  constexpr int kBlockWarps = kBlockThreads / 32;
  __shared__ int64_t partial[3][kBlockWarps];
  for (int offset = 16; offset > 0; offset >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
    count += __shfl_xor_sync(0xffffffffu, count, offset);
  }
  const int warp = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) {
    partial[0][warp] = lo;
    partial[1][warp] = hi;
    partial[2][warp] = count;
  }
  __syncthreads();
  lo = partial[0][0];
  hi = partial[1][0];
  count = partial[2][0];
#pragma unroll
  for (int w = 1; w < kBlockWarps; ++w) {
    lo = min(lo, partial[0][w]);
    hi = max(hi, partial[1][w]);
    count += partial[2][w];
  }
  __syncthreads(); // partial is reused by the next call
}

/// The window of rows [otherBegin, otherEnd) of `other` (ids of one batch row) that the block's
/// rows [ownBegin, ownEnd) of `own` can read. Every thread of the block (kBlockThreads) calls it.
template <int kBlockThreads>
__device__ SegmentWindow segmentWindow(int i64, const void *own, int ownBegin, int ownEnd,
                                       const void *other, int otherBegin, int otherEnd) {
  int64_t lo = INT64_MAX, hi = INT64_MIN, unused = 0;
  for (int i = ownBegin + int(threadIdx.x); i < ownEnd; i += kBlockThreads) {
    const int64_t id = segmentAt(own, i64, i);
    lo = min(lo, id);
    hi = max(hi, id);
  }
  blockReduce<kBlockThreads>(lo, hi, unused);
  int64_t first = INT64_MAX, last = INT64_MIN, count = 0;
  for (int j = otherBegin + int(threadIdx.x); j < otherEnd; j += kBlockThreads) {
    const int64_t id = segmentAt(other, i64, j);
    if (id >= lo && id <= hi) {
      first = min(first, int64_t(j));
      last = max(last, int64_t(j));
      ++count;
    }
  }
  blockReduce<kBlockThreads>(first, last, count);
  if (count == 0)
    return {otherBegin, otherBegin, false};
  return {int(first), int(last) + 1, lo == hi && count == last - first + 1};
}

/// Batch row b's segment ids of the queries and of the keys, and the window of the other side's
/// rows a block can read.
struct BlockSegments {
  const void *queries, *keys;
  SegmentWindow window;
};

/// The segments of a block of queries [ownBegin, ownEnd) reading keys [otherBegin, otherEnd)
/// (ownQueries), or of a block of keys [ownBegin, ownEnd) read by queries [otherBegin,
/// otherEnd). Every thread of the block (kBlockThreads) calls it.
template <int kBlockThreads>
__device__ BlockSegments blockSegments(const Args &a, int b, bool ownQueries, int ownBegin,
                                       int ownEnd, int otherBegin, int otherEnd) {
  BlockSegments s;
  s.queries = segmentRow(a.segments, a.segmentsI64, int64_t(b) * a.seq);
  s.keys = segmentRow(a.keySegments, a.segmentsI64, int64_t(b) * a.seqK);
  s.window =
      segmentWindow<kBlockThreads>(a.segmentsI64, ownQueries ? s.queries : s.keys, ownBegin, ownEnd,
                                   ownQueries ? s.keys : s.queries, otherBegin, otherEnd);
  return s;
}

constexpr int kFwdBlockM = 128; ///< queries per forward block (32 per warp)
constexpr int kFwdBlockN = 64;  ///< keys per forward tile

template <int kD> constexpr size_t forwardSmem() {
  return sizeof(uint16_t) * kPitch<kD> * (kFwdBlockM + 4 * kFwdBlockN);
}

/// The segment ids of the rows a thread holds in mma fragments, rows row0 + 16 mt + lane / 4
/// (+ 8) for the kMT 16-row tiles (-1 past `rows`, which no store reads).
template <int kMT>
__device__ __forceinline__ void fragmentRowSegments(int64_t (&ids)[kMT][2], const void *segments,
                                                    int i64, int row0, int rows) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = row0 + mt * 16 + (lane >> 2) + r * 8;
      ids[mt][r] = i < rows ? segmentAt(segments, i64, i) : -1;
    }
}

/// Forward over one tile of 128 queries of one (batch, head); with kSegments, under the segment ids
/// (a template parameter, so that calls without them keep every register for the products).
template <typename T, int kD, bool kSegments>
__global__ void __launch_bounds__(kThreads, 2) forwardKernel(const Args a) {
  constexpr int kBlockM = kFwdBlockM, kBlockN = kFwdBlockN, kP = kPitch<kD>;
  constexpr int kMT = kBlockM / (16 * kWarps), kNT = kBlockN / 8, kDT = kD / 8;
  constexpr int kWarpRows = kMT * 16;
  extern __shared__ __align__(16) unsigned char smemBytes[];
  T *sQ = reinterpret_cast<T *>(smemBytes);
  T *sK = sQ + kBlockM * kP;     // two buffers
  T *sV = sK + 2 * kBlockN * kP; // two buffers
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const Tile tile = tileOf(a);
  const int bh = tile.group;
  // Causal: the longest tiles (the last queries) first, so the short ones fill the tail.
  const int mBlock = a.causal ? a.numTiles - 1 - tile.rank : tile.rank;
  const int b = bh / a.heads, h = bh % a.heads, g = h / a.group;
  const int m0 = mBlock * kBlockM, seq = a.seq, seqK = a.seqK;
  const T *qBase = static_cast<const T *>(a.q) + headOffset(b, seq, a.qStride, h, a.d);
  const T *kBase = static_cast<const T *>(a.k) + headOffset(b, seqK, a.kvStride, g, a.d);
  const T *vBase = static_cast<const T *>(a.v) + headOffset(b, seqK, a.kvStride, g, a.d);

  // Segment ids: the key tiles that hold the block's documents, and the rows' ids.
  BlockSegments seg{nullptr, nullptr, {0, 0, true}};
  if (kSegments)
    seg = blockSegments<kThreads>(a, b, true, m0, min(seq, m0 + kBlockM), 0,
                                  a.causal ? min(seqK, m0 + kBlockM) : seqK);

  loadTile<kBlockM, kD>(sQ, qBase, a.qStride, m0, seq, a.d);
  if (!kSegments || seg.window.begin < seg.window.end) {
    const int n0 = seg.window.begin / kBlockN * kBlockN;
    loadTile<kBlockN, kD>(sK, kBase, a.kvStride, n0, seqK, a.d);
    loadTile<kBlockN, kD>(sV, vBase, a.kvStride, n0, seqK, a.d);
  }
  cpAsyncCommit();
  if (kSegments &&
      seg.window.begin == seg.window.end) { // no key: q must land before o is staged there
    cpAsyncWait<0>();
    __syncthreads();
  }

  float acc[kMT][kDT][4];
  float rowMax[kMT][2], rowSum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[mt][dt][e] = 0.f;
    rowMax[mt][0] = rowMax[mt][1] = -INFINITY;
    rowSum[mt][0] = rowSum[mt][1] = 0.f;
  }

  const int warpRow0 = m0 + warp * kWarpRows;
  const int keyEnd = a.causal ? min(seqK, m0 + kBlockM) : seqK;
  const int tileBegin = kSegments ? seg.window.begin / kBlockN : 0;
  const int tileEnd = ((kSegments ? seg.window.end : keyEnd) + kBlockN - 1) / kBlockN;
  int64_t rowSegment[kMT][2] = {};
  if (kSegments)
    fragmentRowSegments<kMT>(rowSegment, seg.queries, a.segmentsI64, warpRow0, seq);
  const T *warpQ = sQ + warp * kWarpRows * kP;
  for (int t = tileBegin; t < tileEnd; ++t) {
    const int buf = (t - tileBegin) & 1, n0 = t * kBlockN;
    if (t + 1 < tileEnd) {
      loadTile<kBlockN, kD>(sK + (buf ^ 1) * kBlockN * kP, kBase, a.kvStride, n0 + kBlockN, seqK,
                            a.d);
      loadTile<kBlockN, kD>(sV + (buf ^ 1) * kBlockN * kP, vBase, a.kvStride, n0 + kBlockN, seqK,
                            a.d);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    const T *tK = sK + buf * kBlockN * kP, *tV = sV + buf * kBlockN * kP;

    // s = q kᵀ for the warp's rows.
    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[mt][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        ldsm(qa[mt], warpQ + mt * 16 * kP + kk * 16 + aOffset(lane, kP));
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t kb[4];
        ldsm(kb, tK + np * 16 * kP + kk * 16 + bOffset(lane, kP));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma(T(), s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma(T(), s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    // Scale into base 2, mask, and update the running maxima and sums.
    const bool maskSegments =
        !seg.window.uniform || n0 < seg.window.begin || n0 + kBlockN > seg.window.end;
    const bool needMask = n0 + kBlockN > seqK || (a.causal && n0 + kBlockN - 1 > warpRow0) ||
                          (kSegments && maskSegments);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = warpRow0 + mt * 16 + (lane >> 2) + r * 8;
        float tileMax = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float x = s[mt][nt][2 * r + c] * a.scaleLog2;
            if (needMask) {
              const int j = n0 + nt * 8 + (lane & 3) * 2 + c;
              if (j >= seqK || (a.causal && j > i) ||
                  (kSegments && segmentAt(seg.keys, a.segmentsI64, j) != rowSegment[mt][r]))
                x = -INFINITY;
            }
            s[mt][nt][2 * r + c] = x;
            tileMax = fmaxf(tileMax, x);
          }
        tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 1));
        tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 2));
        const float newMax = fmaxf(rowMax[mt][r], tileMax);
        // A row with every key so far masked keeps max -inf; subtract 0 then, not -inf.
        const float base = newMax == -INFINITY ? 0.f : newMax;
        const float correction = exp2Approx(rowMax[mt][r] - base);
        rowMax[mt][r] = newMax;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float pv = exp2Approx(s[mt][nt][2 * r + c] - base);
            s[mt][nt][2 * r + c] = pv;
            sum += pv;
          }
        rowSum[mt][r] = rowSum[mt][r] * correction + sum;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          acc[mt][dt][2 * r] *= correction;
          acc[mt][dt][2 * r + 1] *= correction;
        }
      }

    // acc += p v, with p rounded to T as the A operand straight from the s fragments.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = pack(T(), s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack(T(), s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack(T(), s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack(T(), s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t vb[4];
        ldsmTrans(vb, tV + kk * 16 * kP + dp * 16 + btOffset(lane, kP));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma(T(), acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma(T(), acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads(); // this buffer is refilled by the next iteration's prefetch
  }

  // The four lanes of a quad hold partial sums of the same rows.
  float factor[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = rowSum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      factor[mt][r] = sum > 0.f ? 1.f / sum : 0.f;
      // flashAttention: the natural-log log-sum-exp, (m + log2 l) ln 2 in the base-2 units
      // of the scaled scores.
      const int i = warpRow0 + mt * 16 + (lane >> 2) + r * 8;
      if (a.savedLse && (lane & 3) == 0 && i < seq)
        a.savedLse[int64_t(bh) * seq + i] =
            sum > 0.f ? (rowMax[mt][r] + __log2f(sum)) * 0.6931471805599453f : -INFINITY;
    }
  // Each warp reuses its own rows of the q tile to stage o for 16-byte stores.
  T *warpO = sQ + warp * kWarpRows * kP;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
    fragmentsToShared<kD>(warpO + mt * 16 * kP, acc[mt], factor[mt][0], factor[mt][1], lane);
  __syncwarp();
  storeRows<kWarpRows, kD>(static_cast<T *>(a.out) + headOffset(b, seq, a.oStride, h, a.d),
                           a.oStride, warpO, warpRow0, seq, a.d, lane);
}

constexpr int kBwdBlock = 64;  ///< keys per dk/dv block and queries per step (16 rows per warp)
constexpr int kDqBlockM = 128; ///< queries per dq block (32 per warp)
constexpr int kDqBlockN = 32;  ///< keys per dq tile

__device__ __forceinline__ float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float toFloat(__half x) { return __half2float(x); }

template <int kD> constexpr size_t gradQSmem() {
  return sizeof(uint16_t) * kPitch<kD> * (2 * kDqBlockM + 4 * kDqBlockN);
}

/// dq over one tile of 128 queries of one (batch, head), looping over key tiles, plus two rows
/// for the dk/dv kernel: D_i = dO_i . o_i and the base-2 log-sum-exp. No pass computes the
/// softmax normaliser first: like the forward, the kernel keeps the running maximum m of the
/// scaled scores x = scale log2(e) s and the running sum l of 2^(x - m), accumulates
/// dq~ = sum 2^(x - m) (dp - D) k with dp = dO vᵀ, rescales dq~ and l by 2^(m_old - m_new) when m
/// grows, and ends with dq = scale dq~ / l (p = 2^(x - m) / l, ds = p (dp - D)) and
/// lse = m + log2 l. Each warp owns 32 query rows, so every k and v fragment it reads from shared
/// memory feeds two products. With kSavedLse (flashAttentionGrad) the normaliser is known: the
/// kernel reads the forward's log-sum-exp, forms p = 2^(x - lse log2(e)) and ds = p (dp - D)
/// directly (no running maximum or sum, no rescaling of dq~), and writes the base-2 lse rows the
/// dk/dv kernel reads.
template <typename T, int kD, bool kSavedLse, bool kSegments>
__global__ void __launch_bounds__(kThreads, 2) gradQKernel(const Args a) {
  constexpr int kBlockM = kDqBlockM, kBlockN = kDqBlockN, kP = kPitch<kD>;
  constexpr int kMT = kBlockM / (16 * kWarps), kNT = kBlockN / 8, kDT = kD / 8;
  constexpr int kWarpRows = kMT * 16;
  static_assert(4 * kBlockN == kBlockM, "the k and v buffers hold the o tile before the loop");
  extern __shared__ __align__(16) unsigned char smemBytes[];
  T *sQ = reinterpret_cast<T *>(smemBytes);
  T *sDo = sQ + kBlockM * kP;
  T *sK = sDo + kBlockM * kP;    // two buffers
  T *sV = sK + 2 * kBlockN * kP; // two buffers
  T *sO = sK;                    // the o tile, over all four, before the loop
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const Tile tile = tileOf(a);
  const int bh = tile.group;
  const int mBlock = a.causal ? a.numTiles - 1 - tile.rank : tile.rank;
  const int b = bh / a.heads, h = bh % a.heads, g = h / a.group;
  const int m0 = mBlock * kBlockM, seq = a.seq, seqK = a.seqK;
  const int64_t qOffset = headOffset(b, seq, a.qStride, h, a.d);
  const int64_t oOffset = headOffset(b, seq, a.oStride, h, a.d);
  const T *kBase = static_cast<const T *>(a.k) + headOffset(b, seqK, a.kvStride, g, a.d);
  const T *vBase = static_cast<const T *>(a.v) + headOffset(b, seqK, a.kvStride, g, a.d);

  loadTile<kBlockM, kD>(sQ, static_cast<const T *>(a.q) + qOffset, a.qStride, m0, seq, a.d);
  loadTile<kBlockM, kD>(sDo, static_cast<const T *>(a.dout) + oOffset, a.oStride, m0, seq, a.d);
  loadTile<kBlockM, kD>(sO, static_cast<const T *>(a.o) + oOffset, a.oStride, m0, seq, a.d);
  cpAsyncCommit();
  cpAsyncWait<0>();
  __syncthreads();

  // D for the warp's rows, from the stored dO and o; the four lanes of a quad split the columns.
  const int warpRow0 = m0 + warp * kWarpRows;
  float rowDot[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * kWarpRows + mt * 16 + (lane >> 2) + r * 8;
      const T *dOut = sDo + row * kP + (lane & 3) * (kD / 4),
              *out = sO + row * kP + (lane & 3) * (kD / 4);
      float dot = 0.f;
#pragma unroll 8
      for (int e = 0; e < kD / 4; ++e)
        dot = fmaf(toFloat(dOut[e]), toFloat(out[e]), dot);
      dot += __shfl_xor_sync(0xffffffffu, dot, 1);
      dot += __shfl_xor_sync(0xffffffffu, dot, 2);
      rowDot[mt][r] = dot;
      const int i = m0 + row;
      if ((lane & 3) == 0 && i < seq)
        a.dsum[int64_t(bh) * seq + i] = dot;
    }
  // The saved log-sum-exp in the base-2 units of x, for this kernel and the dk/dv kernel.
  float rowLse[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      rowLse[mt][r] = 0.f;
      if constexpr (kSavedLse) {
        const int i = warpRow0 + mt * 16 + (lane >> 2) + r * 8;
        if (i < seq) {
          // A row that read no key (segment ids) has lse -inf; +inf makes its p 0, not NaN.
          const float lse = a.savedLse[int64_t(bh) * seq + i];
          rowLse[mt][r] = kSegments && lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
          if ((lane & 3) == 0)
            a.lse[int64_t(bh) * seq + i] = rowLse[mt][r];
        }
      }
    }
  // Segment ids: the key tiles that hold the block's documents, and the rows' ids.
  BlockSegments seg{nullptr, nullptr, {0, 0, true}};
  int64_t rowSegment[kMT][2] = {};
  if (kSegments) {
    seg = blockSegments<kThreads>(a, b, true, m0, min(seq, m0 + kBlockM), 0,
                                  a.causal ? min(seqK, m0 + kBlockM) : seqK);
    fragmentRowSegments<kMT>(rowSegment, seg.queries, a.segmentsI64, warpRow0, seq);
  }
  __syncthreads(); // the first k and v tiles overwrite the o tile

  if (!kSegments || seg.window.begin < seg.window.end) {
    const int n0 = seg.window.begin / kBlockN * kBlockN;
    loadTile<kBlockN, kD>(sK, kBase, a.kvStride, n0, seqK, a.d);
    loadTile<kBlockN, kD>(sV, vBase, a.kvStride, n0, seqK, a.d);
  }
  cpAsyncCommit();

  float dq[kMT][kDT][4];
  float rowMax[kMT][2], rowSum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dq[mt][dt][e] = 0.f;
    rowMax[mt][0] = rowMax[mt][1] = -INFINITY;
    rowSum[mt][0] = rowSum[mt][1] = 0.f;
  }

  const int keyEnd = a.causal ? min(seqK, m0 + kBlockM) : seqK;
  const int tileBegin = kSegments ? seg.window.begin / kBlockN : 0;
  const int tileEnd = ((kSegments ? seg.window.end : keyEnd) + kBlockN - 1) / kBlockN;
  const T *warpQ = sQ + warp * kWarpRows * kP, *warpDo = sDo + warp * kWarpRows * kP;
  for (int t = tileBegin; t < tileEnd; ++t) {
    const int buf = (t - tileBegin) & 1, n0 = t * kBlockN;
    if (t + 1 < tileEnd) {
      loadTile<kBlockN, kD>(sK + (buf ^ 1) * kBlockN * kP, kBase, a.kvStride, n0 + kBlockN, seqK,
                            a.d);
      loadTile<kBlockN, kD>(sV + (buf ^ 1) * kBlockN * kP, vBase, a.kvStride, n0 + kBlockN, seqK,
                            a.d);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    const T *tK = sK + buf * kBlockN * kP, *tV = sV + buf * kBlockN * kP;

    // s = q kᵀ and dp = dO vᵀ, sharing the k loop.
    float s[kMT][kNT][4], dp[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[mt][nt][e] = dp[mt][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t qa[kMT][4], da[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        ldsm(qa[mt], warpQ + mt * 16 * kP + kk * 16 + aOffset(lane, kP));
        ldsm(da[mt], warpDo + mt * 16 * kP + kk * 16 + aOffset(lane, kP));
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t kb[4], vb[4];
        ldsm(kb, tK + np * 16 * kP + kk * 16 + bOffset(lane, kP));
        ldsm(vb, tV + np * 16 * kP + kk * 16 + bOffset(lane, kP));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma(T(), s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma(T(), s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
          mma(T(), dp[mt][2 * np], da[mt], vb[0], vb[1]);
          mma(T(), dp[mt][2 * np + 1], da[mt], vb[2], vb[3]);
        }
      }
    }

    // Scale into base 2, mask, update the running maxima and sums, and form
    // 2^(x - m) (dp - D) in s; with the saved lse, form p (dp - D) = 2^(x - lse) (dp - D).
    const bool maskSegments =
        !seg.window.uniform || n0 < seg.window.begin || n0 + kBlockN > seg.window.end;
    const bool needMask = n0 + kBlockN > seqK || (a.causal && n0 + kBlockN - 1 > warpRow0) ||
                          (kSegments && maskSegments);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = warpRow0 + mt * 16 + (lane >> 2) + r * 8;
        if constexpr (kSavedLse) {
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float x = s[mt][nt][2 * r + c] * a.scaleLog2;
              if (needMask) {
                const int j = n0 + nt * 8 + (lane & 3) * 2 + c;
                if (j >= seqK || (a.causal && j > i) ||
                    (kSegments && segmentAt(seg.keys, a.segmentsI64, j) != rowSegment[mt][r]))
                  x = -INFINITY;
              }
              const float p = exp2Approx(x - rowLse[mt][r]);
              s[mt][nt][2 * r + c] = p * (dp[mt][nt][2 * r + c] - rowDot[mt][r]);
            }
          continue;
        }
        float tileMax = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float x = s[mt][nt][2 * r + c] * a.scaleLog2;
            if (needMask) {
              const int j = n0 + nt * 8 + (lane & 3) * 2 + c;
              if (j >= seqK || (a.causal && j > i) ||
                  (kSegments && segmentAt(seg.keys, a.segmentsI64, j) != rowSegment[mt][r]))
                x = -INFINITY;
            }
            s[mt][nt][2 * r + c] = x;
            tileMax = fmaxf(tileMax, x);
          }
        tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 1));
        tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 2));
        const float newMax = fmaxf(rowMax[mt][r], tileMax);
        const float base = newMax == -INFINITY ? 0.f : newMax;
        const float correction = exp2Approx(rowMax[mt][r] - base);
        rowMax[mt][r] = newMax;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float p = exp2Approx(s[mt][nt][2 * r + c] - base);
            sum += p;
            s[mt][nt][2 * r + c] = p * (dp[mt][nt][2 * r + c] - rowDot[mt][r]);
          }
        rowSum[mt][r] = rowSum[mt][r] * correction + sum;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          dq[mt][dt][2 * r] *= correction;
          dq[mt][dt][2 * r + 1] *= correction;
        }
      }

    // dq += ds k, with ds rounded to T as the A operand.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t sa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        sa[mt][0] = pack(T(), s[mt][2 * kk][0], s[mt][2 * kk][1]);
        sa[mt][1] = pack(T(), s[mt][2 * kk][2], s[mt][2 * kk][3]);
        sa[mt][2] = pack(T(), s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        sa[mt][3] = pack(T(), s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp2 = 0; dp2 < kDT / 2; ++dp2) {
        uint32_t kb[4];
        ldsmTrans(kb, tK + kk * 16 * kP + dp2 * 16 + btOffset(lane, kP));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma(T(), dq[mt][2 * dp2], sa[mt], kb[0], kb[1]);
          mma(T(), dq[mt][2 * dp2 + 1], sa[mt], kb[2], kb[3]);
        }
      }
    }
    __syncthreads(); // this buffer is refilled by the next iteration's prefetch
  }

  // Each warp stages its rows of dq in its rows of the q tile for 16-byte stores.
  T *warpOut = sQ + warp * kWarpRows * kP;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    float factor[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (kSavedLse) {
        factor[r] = a.scale; // p was normalised already; the lse rows are written
        continue;
      }
      float sum = rowSum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int i = warpRow0 + mt * 16 + (lane >> 2) + r * 8;
      // A row that read no key (segment ids): +inf, so that the dk/dv kernel's p is 0 for it.
      if ((lane & 3) == 0 && i < seq)
        a.lse[int64_t(bh) * seq + i] =
            kSegments && !(sum > 0.f) ? INFINITY : rowMax[mt][r] + __log2f(sum);
      factor[r] = sum > 0.f ? a.scale / sum : 0.f;
    }
    fragmentsToShared<kD>(warpOut + mt * 16 * kP, dq[mt], factor[0], factor[1], lane);
  }
  __syncwarp();
  storeRows<kWarpRows, kD>(static_cast<T *>(a.dq) + qOffset, a.qStride, warpOut, warpRow0, seq, a.d,
                           lane);
}

template <int kD> constexpr size_t gradKVSmem() {
  return sizeof(uint16_t) * kPitch<kD> * 6 * kBwdBlock + sizeof(float) * 4 * kBwdBlock;
}

/// dk and dv over one tile of 64 keys of one (batch, kv head), looping over the query heads that
/// read it and their query tiles. Each warp owns 16 keys and works on transposed tiles:
/// sᵀ = k qᵀ, pᵀ = 2^(sᵀ scale log2(e) - lse), dv += pᵀ dO, dpᵀ = v dOᵀ, dsᵀ = pᵀ (dpᵀ - D),
/// dk += scale dsᵀ q. kSegments as in forwardKernel.
template <typename T, int kD, bool kSegments>
__global__ void __launch_bounds__(kThreads, 2) gradKVKernel(const Args a) {
  constexpr int kBlockM = kBwdBlock, kBlockN = kBwdBlock, kP = kPitch<kD>;
  constexpr int kMT = kBlockM / 8, kDT = kD / 8; // kMT: 8-wide query tiles of a step
  extern __shared__ __align__(16) unsigned char smemBytes[];
  T *sK = reinterpret_cast<T *>(smemBytes);
  T *sV = sK + kBlockN * kP;
  T *sQ = sV + kBlockN * kP;                                       // two buffers
  T *sDo = sQ + 2 * kBlockM * kP;                                  // two buffers
  float *sLse = reinterpret_cast<float *>(sDo + 2 * kBlockM * kP); // two buffers
  float *sRowDot = sLse + 2 * kBlockM;                             // two buffers
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  // Key block 0 reaches the most query tiles: rank 0 is the longest.
  const Tile tile = tileOf(a);
  const int nBlock = tile.rank, bg = tile.group;
  const int b = bg / a.kvHeads, g = bg % a.kvHeads;
  const int n0 = nBlock * kBlockN, seq = a.seq, seqK = a.seqK;
  const int64_t kvOffset = headOffset(b, seqK, a.kvStride, g, a.d);

  // Steps: (query head of the group, query tile), in order. With the causal mask the query
  // tiles before the block's first key see none of its keys.
  const int mStart = a.causal ? n0 / kBlockM : 0;
  // Segment ids: the query tiles that hold the block's documents, and the keys' ids.
  BlockSegments seg{nullptr, nullptr, {mStart * kBlockM, seq, true}};
  if (kSegments)
    seg = blockSegments<kThreads>(a, b, false, n0, min(seqK, n0 + kBlockN), mStart * kBlockM, seq);
  const int mBegin = seg.window.begin / kBlockM;
  const int perHead = (seg.window.end + kBlockM - 1) / kBlockM - mBegin;
  const int steps = a.group * perHead;
  auto loadStep = [&](int u, int buf) {
    const int h = g * a.group + u / perHead, i0 = (mBegin + u % perHead) * kBlockM;
    const int64_t qOffset = headOffset(b, seq, a.qStride, h, a.d);
    const int64_t oOffset = headOffset(b, seq, a.oStride, h, a.d);
    loadTile<kBlockM, kD>(sQ + buf * kBlockM * kP, static_cast<const T *>(a.q) + qOffset, a.qStride,
                          i0, seq, a.d);
    loadTile<kBlockM, kD>(sDo + buf * kBlockM * kP, static_cast<const T *>(a.dout) + oOffset,
                          a.oStride, i0, seq, a.d);
    const int64_t rowBase = (int64_t(b) * a.heads + h) * seq;
    const int x = threadIdx.x % kBlockM, i = i0 + x;
    const float *src = threadIdx.x < kBlockM ? a.lse : a.dsum;
    float *dst = (threadIdx.x < kBlockM ? sLse : sRowDot) + buf * kBlockM + x;
    cpAsync4(dst, i < seq ? src + rowBase + i : src, i < seq);
  };
  static_assert(kThreads == 2 * kBwdBlock, "one lse or D element per thread");

  loadTile<kBlockN, kD>(sK, static_cast<const T *>(a.k) + kvOffset, a.kvStride, n0, seqK, a.d);
  loadTile<kBlockN, kD>(sV, static_cast<const T *>(a.v) + kvOffset, a.kvStride, n0, seqK, a.d);
  if (!kSegments || steps > 0)
    loadStep(0, 0);
  cpAsyncCommit();
  if (kSegments && steps == 0) { // no query reads these keys: dk, dv are 0, staged over k, v
    cpAsyncWait<0>();
    __syncthreads();
  }

  float dk[kDT][4], dv[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dk[dt][e] = dv[dt][e] = 0.f;

  const int warpKey0 = n0 + warp * 16;
  int64_t keySegment[1][2] = {};
  if (kSegments)
    fragmentRowSegments<1>(keySegment, seg.keys, a.segmentsI64, warpKey0, seqK);
  const T *warpK = sK + warp * 16 * kP, *warpV = sV + warp * 16 * kP;
  for (int u = 0; u < steps; ++u) {
    const int buf = u & 1, i0 = (mBegin + u % perHead) * kBlockM;
    if (u + 1 < steps) {
      loadStep(u + 1, buf ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    const T *tQ = sQ + buf * kBlockM * kP, *tDo = sDo + buf * kBlockM * kP;
    const float *tLse = sLse + buf * kBlockM, *tRowDot = sRowDot + buf * kBlockM;

    // sᵀ = k qᵀ and dpᵀ = v dOᵀ for the warp's 16 keys, sharing the k loop.
    float st[kMT][4], dpt[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st[mt][e] = dpt[mt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t ka[4], va[4];
      ldsm(ka, warpK + kk * 16 + aOffset(lane, kP));
      ldsm(va, warpV + kk * 16 + aOffset(lane, kP));
#pragma unroll
      for (int mp = 0; mp < kMT / 2; ++mp) {
        uint32_t qb[4], db[4];
        ldsm(qb, tQ + mp * 16 * kP + kk * 16 + bOffset(lane, kP));
        ldsm(db, tDo + mp * 16 * kP + kk * 16 + bOffset(lane, kP));
        mma(T(), st[2 * mp], ka, qb[0], qb[1]);
        mma(T(), st[2 * mp + 1], ka, qb[2], qb[3]);
        mma(T(), dpt[2 * mp], va, db[0], db[1]);
        mma(T(), dpt[2 * mp + 1], va, db[2], db[3]);
      }
    }

    // pᵀ into st, dsᵀ into dpt. Element e of tile mt: key row (lane >> 2) + 8 (e >> 1),
    // query column mt * 8 + 2 (lane & 3) + (e & 1).
    const bool maskSegments =
        !seg.window.uniform || i0 < seg.window.begin || i0 + kBlockM > seg.window.end;
    const bool needMask =
        i0 + kBlockM > seq || (a.causal && warpKey0 + 15 > i0) || (kSegments && maskSegments);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = mt * 8 + (lane & 3) * 2 + (e & 1);
        float p = exp2Approx(st[mt][e] * a.scaleLog2 - tLse[col]);
        if (needMask) {
          const int i = i0 + col, j = warpKey0 + (lane >> 2) + (e >> 1) * 8;
          if (i >= seq || (a.causal && j > i) ||
              (kSegments && segmentAt(seg.queries, a.segmentsI64, i) != keySegment[0][e >> 1]))
            p = 0.f;
        }
        st[mt][e] = p;
        dpt[mt][e] = p * (dpt[mt][e] - tRowDot[col]);
      }

    // dv += pᵀ dO and dk += dsᵀ q; the A operands come straight from the fragments.
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t pa[4], sa[4];
      pa[0] = pack(T(), st[2 * kk][0], st[2 * kk][1]);
      pa[1] = pack(T(), st[2 * kk][2], st[2 * kk][3]);
      pa[2] = pack(T(), st[2 * kk + 1][0], st[2 * kk + 1][1]);
      pa[3] = pack(T(), st[2 * kk + 1][2], st[2 * kk + 1][3]);
      sa[0] = pack(T(), dpt[2 * kk][0], dpt[2 * kk][1]);
      sa[1] = pack(T(), dpt[2 * kk][2], dpt[2 * kk][3]);
      sa[2] = pack(T(), dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
      sa[3] = pack(T(), dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
#pragma unroll
      for (int dp2 = 0; dp2 < kDT / 2; ++dp2) {
        uint32_t db[4], qb[4];
        ldsmTrans(db, tDo + kk * 16 * kP + dp2 * 16 + btOffset(lane, kP));
        ldsmTrans(qb, tQ + kk * 16 * kP + dp2 * 16 + btOffset(lane, kP));
        mma(T(), dv[2 * dp2], pa, db[0], db[1]);
        mma(T(), dv[2 * dp2 + 1], pa, db[2], db[3]);
        mma(T(), dk[2 * dp2], sa, qb[0], qb[1]);
        mma(T(), dk[2 * dp2 + 1], sa, qb[2], qb[3]);
      }
    }
    __syncthreads();
  }

  // Each warp stages its 16 rows of dk in its rows of the k tile, dv in those of the v tile.
  T *warpDk = sK + warp * 16 * kP, *warpDv = sV + warp * 16 * kP;
  fragmentsToShared<kD>(warpDk, dk, a.scale, a.scale, lane);
  fragmentsToShared<kD>(warpDv, dv, 1.f, 1.f, lane);
  __syncwarp();
  storeRows<16, kD>(static_cast<T *>(a.dk) + kvOffset, a.kvStride, warpDk, warpKey0, seqK, a.d,
                    lane);
  storeRows<16, kD>(static_cast<T *>(a.dv) + kvOffset, a.kvStride, warpDv, warpKey0, seqK, a.d,
                    lane);
}

} // namespace tc

//===----------------------------------------------------------------------===//
// Hopper path: warp-specialised warpgroup-MMA kernels (sm_90a), bf16 at head dims 64 and 128
//===----------------------------------------------------------------------===//

// FlashAttention-3's design. wgmma reads its shared-memory operands itself (no ldmatrix through
// registers) and one instruction covers a 64 x 128 x 16 (or 64 x 64 x 16) product of four warps, so
// a 64-row warpgroup reads each tile once where four mma.sync warps read it four times. A block has
// one producer warpgroup, which loads tiles with the Tensor Memory Accelerator (TMA) into rings of
// shared-memory stages and signals mbarriers as their bytes land, and two consumer warpgroups,
// which wait on those barriers, multiply, and release a stage as soon as their last product
// that reads it is done. The consumers meet at no block barrier, so one's softmax runs while the
// other's products do; the producer gives up registers (setmaxnreg) for them, as each consumer
// thread holds 160 to 224 accumulator and fragment values at head dim 128. The kernels are
// templates on the head dim kD (64 or 128): a tile is kD / 64 regions of 64 columns.
// The instructions exist only in the arch-specific sm_90a target; other targets compile these
// kernels to traps, and the host takes this path only where CMake built sm_90a code and the
// device is an sm_90 (wgmmaUsable).
namespace wg {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BONSAI_ATTENTION_WGMMA 1
#else
#define BONSAI_ATTENTION_WGMMA 0
#endif

constexpr int kConsumers = 2;                    ///< consumer warpgroups per block
constexpr int kThreads = (1 + kConsumers) * 128; ///< the producer warpgroup, then the consumers
constexpr int kBlockM = 64 * kConsumers;         ///< queries per forward and dq block
constexpr int kBlockN = 128;                     ///< keys per forward and dq tile
// Stages of each kernel's ring (H100, docs/benchmarks.md: the forward measured the same with 3,
// the dk/dv kernel best with 3 of 2, 3 and 4).
constexpr int kForwardStages = 2;
constexpr int kGradQStages = 2;
constexpr int kGradKVStages = 3;

/// Whether this path takes head dim d.
constexpr bool takesHeadDim(int64_t d) { return d == 64 || d == 128; }

/// Bytes of a [rows][kD] bf16 tile stored as kD / 64 [rows][64] regions, each row 128 bytes
/// with the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), regions
/// 1024-aligned.
template <int kD> constexpr int tileBytes(int rows) { return rows * kD * 2; }

#if BONSAI_ATTENTION_WGMMA
constexpr int kRegionBytes = 128;       ///< a row of one 64-column region of a tile
constexpr int kProducerRegisters = 24;  ///< per producer thread after setmaxnreg
constexpr int kConsumerRegisters = 240; ///< per consumer thread after setmaxnreg

/// A shared-memory matrix descriptor for wgmma with the 128-byte swizzle: start address,
/// leading- and stride-dimension byte offsets. K-major operands (q, k: 64 columns of k per
/// region) step through k by advancing the start 32 bytes within a region; the stride offset is
/// the 1024 bytes between groups of 8 rows. For v read with N contiguous, the leading offset is
/// the distance between the two 64-column regions and a 16-key step advances 16 rows (2048
/// bytes). (Checked on the H200 against a CPU product for both layouts before this kernel.)
__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t leading,
                                               uint32_t stride) {
  return uint64_t((address & 0x3FFFF) >> 4) | uint64_t((leading >> 4) & 0x3FFF) << 16 |
         uint64_t((stride >> 4) & 0x3FFF) << 32 | uint64_t(1) << 62;
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/// d (+)= a · bᵀ for a 64 x 128 tile, both operands in shared memory (descriptors), f32
/// accumulators in the wgmma fragment layout; d is overwritten when `accumulate` is 0.
__device__ __forceinline__ void mmaSS128(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}

/// mmaSS128 for a 64 x 64 tile. kTransposed: both operands stored with M and N contiguous (the
/// descriptors' "MN-major"), a as [K][64] and b as [K][64], and d (+)= a · b.
template <int kTransposed = 0>
__device__ __forceinline__ void mmaSS64(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "%32, %33, p, 1, 1, %35, %35;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
                 "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
                 "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
                 "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
                 "+f"(d[31])
               : "l"(a), "l"(b), "r"(accumulate), "n"(kTransposed));
}

/// d += a · b for a 64 x 128 tile: a (64 x 16) in registers in the mma.sync A-fragment layout,
/// b (16 x 128) in shared memory with N contiguous (the descriptor's "MN-major", transposed).
__device__ __forceinline__ void mmaRS(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

/// mmaRS for a 64 x 64 tile.
__device__ __forceinline__ void mmaRS(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
                 "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
                 "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
                 "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
                 "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

#endif // BONSAI_ATTENTION_WGMMA

constexpr int kKvBlockN = 128; ///< keys per dk/dv block, 64 per warpgroup
constexpr int kKvBlockM = 64;  ///< queries per dk/dv step
/// The reducing dk/dv kernel's [128 keys][64 queries] bf16 dsᵀ tile (two, one per step parity)
/// and the f32 [64 queries][64 columns] dq block each consumer stages on its way to the sums.
constexpr int kDsTileBytes = kKvBlockN * kKvBlockM * 2;
constexpr int kDqBlockFloats = kKvBlockM * 64;

/// The forward's mbarriers: q loaded, the k and v of each stage loaded, and each released (k
/// once its scores are formed, v once its product is: with the products overlapped, v is held
/// half a tile longer than k).
struct ForwardBarriers {
  uint64_t q, kFull[kForwardStages], vFull[kForwardStages], kEmpty[kForwardStages],
      vEmpty[kForwardStages];
};

/// q, the k and v stages, the barriers, and the alignment slack (TMA's 128-byte swizzle wants
/// each region 1024-aligned).
template <int kD> constexpr size_t forwardSmem() {
  return 1024 + tileBytes<kD>(kBlockM) + 2 * kForwardStages * tileBytes<kD>(kBlockN) +
         sizeof(ForwardBarriers);
}

#if BONSAI_ATTENTION_WGMMA
__device__ __forceinline__ void mbarrierInit(uint64_t *bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(tc::smemAddr(bar)),
               "r"(arrivals)
               : "memory");
}

/// Arrives on `bar` and adds `bytes` to the transfer count its phase waits for.
__device__ __forceinline__ void mbarrierExpectBytes(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   tc::smemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrierArrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tc::smemAddr(bar)) : "memory");
}

/// Waits until the phase of `bar` with parity `parity` has completed.
__device__ __forceinline__ void mbarrierWait(uint64_t *bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n}\n" ::"r"(tc::smemAddr(bar)),
               "r"(parity)
               : "memory");
}

/// Loads box (column c, head h, rows from r, batch b) of `map` into shared memory at `dst`,
/// completing its bytes on `bar`.
__device__ __forceinline__ void tmaLoad(void *dst, const CUtensorMap &map, uint64_t *bar, int c,
                                        int h, int r, int b) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(tc::smemAddr(dst)),
               "l"(reinterpret_cast<uint64_t>(&map)), "r"(tc::smemAddr(bar)), "r"(c), "r"(h),
               "r"(r), "r"(b)
               : "memory");
}

/// Loads rows [row0, row0 + kRows) of head h, batch b as a [kRows][kD] tile: kD / 64 boxes of
/// 64 columns, one per 1024-aligned swizzled region. Rows past the tensor's end come in as zeros.
template <int kRows, int kD>
__device__ __forceinline__ void tmaLoadTile(uint8_t *tile, const CUtensorMap &map, uint64_t *bar,
                                            int h, int row0, int b) {
#pragma unroll
  for (int region = 0; region < kD / 64; ++region)
    tmaLoad(tile + region * kRows * kRegionBytes, map, bar, region * 64, h, row0, b);
}

/// One operand of a ring of key tiles: its kStages tiles in shared memory, its TMA map, and the
/// barriers of each stage (loaded; released by every consumer thread).
struct KeyTileRing {
  uint8_t *tiles;
  const CUtensorMap *map;
  uint64_t *full, *empty;
};

/// The producer's loop of the forward and dq kernels: for each of `tiles` tiles of 128 keys of
/// kv head g, batch b, from tile `firstTile` on, loads `first`'s tile and then `second`'s into
/// stage t % kStages (t counting from 0), each once the consumers have released that operand's
/// previous tile there.
template <int kD, int kStages>
__device__ __forceinline__ void produceKeyTiles(const KeyTileRing &first, const KeyTileRing &second,
                                                int firstTile, int tiles, int g, int b) {
  for (int t = 0; t < tiles; ++t) {
    const int stage = t % kStages;
    const uint32_t released = (t / kStages - 1) & 1;
#pragma unroll
    for (int operand = 0; operand < 2; ++operand) {
      const KeyTileRing &ring = operand == 0 ? first : second;
      if (t >= kStages)
        mbarrierWait(&ring.empty[stage], released);
      mbarrierExpectBytes(&ring.full[stage], tileBytes<kD>(kBlockN));
      tmaLoadTile<kBlockN, kD>(ring.tiles + stage * tileBytes<kD>(kBlockN), *ring.map,
                               &ring.full[stage], g, (firstTile + t) * kBlockN, b);
    }
  }
}

/// The key tiles a forward or dq block of queries m0.. of batch row b visits, [first, first +
/// count), and with kSegments the segments they were found from (every thread of the block
/// calls it then: the segment window reads the ids with all of them).
struct KeyTiles {
  tc::BlockSegments segments;
  int first, count;
};

template <bool kSegments>
__device__ __forceinline__ KeyTiles keyTilesOf(const Args &a, int b, int m0) {
  const int keyEnd = a.causal ? min(a.seqK, m0 + kBlockM) : a.seqK;
  KeyTiles tiles{{nullptr, nullptr, {0, 0, true}}, 0, (keyEnd + kBlockN - 1) / kBlockN};
  if (kSegments) {
    tiles.segments =
        tc::blockSegments<kThreads>(a, b, true, m0, min(a.seq, m0 + kBlockM), 0, keyEnd);
    tiles.first = tiles.segments.window.begin / kBlockN;
    tiles.count = (tiles.segments.window.end + kBlockN - 1) / kBlockN - tiles.first;
  }
  return tiles;
}

/// Waits until at most kWait of the warpgroup's committed wgmma groups are still running.
template <int kWait> __device__ __forceinline__ void waitGroup() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kWait) : "memory");
}

/// Keeps the compiler from moving reads or writes of registers an asynchronous wgmma owns across
/// the point where this is placed (CUTLASS's warpgroup_fence_operand).
template <int N> __device__ __forceinline__ void fenceRegisters(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void fenceRegisters(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    asm volatile("" : "+r"(r[i])::"memory");
}

/// Orders this thread's shared-memory stores before later reads by the async proxy (wgmma
/// operands, bulk copies).
__device__ __forceinline__ void fenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// The reducing dk/dv kernel's named barrier (0 is __syncthreads'): both consumers' dsᵀ stored.
constexpr int kDsBarrier = 1;

/// Waits until `threads` threads (warps whole) have arrived at named barrier `id`.
__device__ __forceinline__ void namedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// Arrives at named barrier `id` of `threads` threads without waiting.
__device__ __forceinline__ void namedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// The forward's named barriers: kTurnBarrier + c opens consumer c's turn to issue products.
constexpr int kTurnBarrier = 1;

/// The first of the 4096 sums of block `block` (64 columns) of the dq tile of queries i0.. of
/// head h, batch b.
template <int kD>
__device__ __forceinline__ int64_t dqSumIndex(const Args &a, int b, int h, int i0, int block) {
  const int64_t tiles = (a.seq + kKvBlockM - 1) / kKvBlockM;
  return (((int64_t(b) * a.heads + h) * tiles + i0 / kKvBlockM) * (kD / 64) + block) *
         kDqBlockFloats;
}

/// Adds a consumer's 64 x 64 f32 dq block (the wgmma fragment layout) into `sums` with bulk
/// reductions from shared memory, each warp its own 16 rows, so that the warpgroup never waits as
/// a whole: float4 e of lane l of warp w is staged at (w * 8 + e) * 32 + l (each store a
/// contiguous 512 bytes, a warp's share a contiguous 4 KB), the order the sums keep and
/// gradQFromSumsKernel reads back.
__device__ __forceinline__ void addDqBlock(const float (&dq)[32], float *stage, float *sums) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x % 128) / 32;
  float4 *mine = reinterpret_cast<float4 *>(stage) + warp * 8 * 32;
  // This warp's previous reduction has read its share out before the stores below.
  if (lane == 0)
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  __syncwarp();
#pragma unroll
  for (int e = 0; e < 8; ++e)
    mine[e * 32 + lane] = make_float4(dq[4 * e], dq[4 * e + 1], dq[4 * e + 2], dq[4 * e + 3]);
  fenceProxyAsync();
  __syncwarp();
  if (lane == 0) {
    asm volatile(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
            sums + warp * 8 * 32 * 4),
        "r"(tc::smemAddr(mine)), "n"(8 * 32 * 16)
        : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  }
}

/// Writes a consumer warp's 16 rows of a [64][kD] f32 accumulator (the wgmma fragment layout),
/// row r scaled by scale[r], as bf16 rows firstRow + tileRow0.. of `out` (`stride` elements
/// apart; rows from `rows` on are left out), 16 bytes a lane: the rows are staged first in rows
/// tileRow0..tileRow0 + 15 of `tile`, a [kTileRows][kD] tile in the 128-byte swizzle (16-byte
/// chunk c of region g of row x at g * kTileRows * 128 + x * 128 + (c ^ x % 8) * 16), which
/// only this warp may be reading or writing by then. Without the staging each store is a 4-byte
/// pair and fills half of each sector it writes.
template <int kD, int kTileRows>
__device__ __forceinline__ void
storeFragmentRows(uint8_t *tile, int tileRow0, const float (&acc)[kD / 2], const float (&scale)[2],
                  __nv_bfloat16 *out, int64_t stride, int firstRow, int rows) {
  using T = __nv_bfloat16;
  const int lane = threadIdx.x & 31;
  const auto chunkAt = [&](int x, int chunk) {
    return tile + (chunk / 8) * kTileRows * kRegionBytes + x * kRegionBytes +
           (((chunk % 8) ^ (x & 7)) * 16);
  };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int x = tileRow0 + (lane >> 2) + r * 8;
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt)
      *reinterpret_cast<uint32_t *>(chunkAt(x, nt) + (lane & 3) * 4) =
          tc::pack(T(), acc[4 * nt + 2 * r] * scale[r], acc[4 * nt + 2 * r + 1] * scale[r]);
  }
  __syncwarp();
  constexpr int kChunks = kD / 8; // of a row
#pragma unroll
  for (int q = lane; q < 16 * kChunks; q += 32) {
    const int x = tileRow0 + q / kChunks, chunk = q % kChunks;
    const int i = firstRow + x;
    if (i < rows)
      *reinterpret_cast<uint4 *>(out + int64_t(i) * stride + chunk * 8) =
          *reinterpret_cast<const uint4 *>(chunkAt(x, chunk));
  }
}

#endif // BONSAI_ATTENTION_WGMMA

/// Forward over one tile of 128 queries of one (batch, head): consumer c owns queries
/// 64c..64c+63; s = q kᵀ is one chain of kD / 16 m64n128k16 products from shared memory, the online
/// softmax runs on the fragments (each warp 16 rows, the mma.sync C layout), and o += p v takes p
/// from registers. Per key tile t the consumer issues s_t with o += p_{t-1} v_{t-1} behind it
/// and runs the softmax of s_t while the second product is still on the tensor cores (FA3's
/// intra-warpgroup overlap): k_t is released once s_t is formed, v_{t-1} once its product is.
/// With kSegments, under the segment ids as tc::forwardKernel: only the key tiles of the block's
/// documents are loaded and multiplied.
template <int kD, bool kSegments>
__global__ void __launch_bounds__(kThreads, 1)
    forwardKernel(const __grid_constant__ CUtensorMap qMap,
                  const __grid_constant__ CUtensorMap kMap,
                  const __grid_constant__ CUtensorMap vMap, const Args a) {
#if BONSAI_ATTENTION_WGMMA
  constexpr int kStages = kForwardStages;
  extern __shared__ unsigned char smemRaw[];
  uint8_t *sQ = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(smemRaw) + 1023) &
                                            ~uintptr_t(1023));
  uint8_t *sK = sQ + tileBytes<kD>(kBlockM);           // kStages buffers
  uint8_t *sV = sK + kStages * tileBytes<kD>(kBlockN); // kStages buffers
  auto *bars = reinterpret_cast<ForwardBarriers *>(sV + kStages * tileBytes<kD>(kBlockN));
  const int lane = threadIdx.x & 31, role = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32;
  const tc::Tile tile = tc::tileOf(a);
  const int bh = tile.group;
  // Causal: the longest tiles (the last queries) first, so the short ones fill the tail.
  const int mBlock = a.causal ? a.numTiles - 1 - tile.rank : tile.rank;
  const int b = bh / a.heads, h = bh % a.heads, g = h / a.group;
  const int m0 = mBlock * kBlockM, seq = a.seq, seqK = a.seqK;
  const KeyTiles keyTiles = keyTilesOf<kSegments>(a, b, m0);
  const tc::BlockSegments &seg = keyTiles.segments;
  const int firstTile = keyTiles.first, tiles = keyTiles.count;

  if (threadIdx.x == 0) {
    mbarrierInit(&bars->q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrierInit(&bars->kFull[s], 1);
      mbarrierInit(&bars->vFull[s], 1);
      mbarrierInit(&bars->kEmpty[s], kConsumers * 128); // every consumer thread releases
      mbarrierInit(&bars->vEmpty[s], kConsumers * 128);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (role == 0) {
    // The producer: one thread issues every load.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (warp == 0 && lane == 0) {
      mbarrierExpectBytes(&bars->q, tileBytes<kD>(kBlockM));
      tmaLoadTile<kBlockM, kD>(sQ, qMap, &bars->q, h, m0, b);
      produceKeyTiles<kD, kStages>({sK, &kMap, bars->kFull, bars->kEmpty},
                                   {sV, &vMap, bars->vFull, bars->vEmpty}, firstTile, tiles, g, b);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  using T = __nv_bfloat16;
  const int consumer = role - 1;
  const int warpRow0 = m0 + consumer * 64 + warp * 16; // rows warpRow0 + lane / 4 (+ 8)
  // This consumer's 64 rows in each region of the q tile.
  const uint32_t qAddress = tc::smemAddr(sQ) + consumer * 64 * kRegionBytes;
  int64_t rowSegment[1][2] = {};
  if (kSegments)
    tc::fragmentRowSegments<1>(rowSegment, seg.queries, a.segmentsI64, warpRow0, seq);

  float o[kD / 2], s[64];
  uint32_t p[32];
#pragma unroll
  for (int e = 0; e < kD / 2; ++e)
    o[e] = 0.f;
  float rowMax[2] = {-INFINITY, -INFINITY}, rowSum[2] = {0.f, 0.f}, correction[2];

  // s = q kᵀ for the k tile of `stage`: kD / 16 k-steps of 16, four per 64-column region.
  auto issueScores = [&](int stage) {
    const uint32_t kAddress = tc::smemAddr(sK + stage * tileBytes<kD>(kBlockN));
    fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t step = (kk % 4) * 32; // 16 columns of 2 bytes into the region
      const uint64_t qd =
          descriptor(qAddress + (kk / 4) * kBlockM * kRegionBytes + step, 16, 1024);
      const uint64_t kd =
          descriptor(kAddress + (kk / 4) * kBlockN * kRegionBytes + step, 16, 1024);
      mmaSS128(s, qd, kd, kk > 0);
    }
    commit();
  };
  // o += p v for the v tile of `stage`: eight 16-key steps, v read with the head dim contiguous.
  auto issueValues = [&](int stage) {
    const uint32_t vAddress = tc::smemAddr(sV + stage * tileBytes<kD>(kBlockN));
    fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t pa[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
      const uint64_t vd =
          descriptor(vAddress + kk * 16 * kRegionBytes, kBlockN * kRegionBytes, 1024);
      mmaRS(o, pa, vd);
    }
    commit();
  };
  // The online softmax of the scores of keys n0..n0 + 127, in base 2: s becomes
  // 2^(s scale log2(e) - max), the running maxima and sums are updated, and `correction` is
  // what o must be scaled by. The maxima are taken over the unscaled scores (the host takes
  // this kernel only with a positive scale, which keeps their order), so each score costs one
  // FFMA before its exponential. rowMax holds scaled maxima.
  // Element e of s: row lane / 4 + 8 ((e / 2) % 2), key n0 + 8 (e / 4) + 2 (lane % 4) + e % 2.
  auto softmax = [&](int n0) {
    const bool maskSegments =
        !seg.window.uniform || n0 < seg.window.begin || n0 + kBlockN > seg.window.end;
    const bool needMask = n0 + kBlockN > seqK || (a.causal && n0 + kBlockN - 1 > warpRow0) ||
                          (kSegments && maskSegments);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = warpRow0 + (lane >> 2) + r * 8;
      float tileMax = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float &x = s[4 * nt + 2 * r + c];
          if (needMask) {
            const int j = n0 + nt * 8 + (lane & 3) * 2 + c;
            if (j >= seqK || (a.causal && j > i) ||
                (kSegments && segmentAt(seg.keys, a.segmentsI64, j) != rowSegment[0][r]))
              x = -INFINITY;
          }
          tileMax = fmaxf(tileMax, x);
        }
      tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 1));
      tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 2));
      const float newMax = fmaxf(rowMax[r], tileMax * a.scaleLog2);
      // A row with every key so far masked keeps max -inf; subtract 0 then, not -inf.
      const float base = newMax == -INFINITY ? 0.f : newMax;
      correction[r] = tc::exp2Approx(rowMax[r] - base);
      rowMax[r] = newMax;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float e = tc::exp2Approx(fmaf(s[4 * nt + 2 * r + c], a.scaleLog2, -base));
          s[4 * nt + 2 * r + c] = e;
          sum += e;
        }
      rowSum[r] = rowSum[r] * correction[r] + sum;
    }
  };
  // Scales o by the corrections and packs s into p, the A fragments of the next p v.
  auto rescaleAndPack = [&]() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int nt = 0; nt < kD / 8; ++nt) {
        o[4 * nt + 2 * r] *= correction[r];
        o[4 * nt + 2 * r + 1] *= correction[r];
      }
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt)
        p[2 * nt + r] = tc::pack(T(), s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]);
    }
  };

  // Ping-pong (FlashAttention-3): the consumers take turns to issue their products, so that the
  // tensor cores take one consumer's while the other runs its softmax, rather than both
  // consumers' at once and then neither's. A turn is one issue of products; consumer 0 has the
  // first, and each consumer passes the turn on after each of its issues, but for consumer 1's
  // last (every arrival at a barrier then meets a wait: tiles + 1 each way).
  const auto waitTurn = [&] { namedBarrierSync(kTurnBarrier + consumer, kConsumers * 128); };
  const auto passTurn = [&] {
    namedBarrierArrive(kTurnBarrier + (1 - consumer), kConsumers * 128);
  };
  mbarrierWait(&bars->q, 0);
  if (tiles > 0) {
    // Tile 0's scores alone; then per tile t, s_t and p_{t-1} v_{t-1} together; then the last
    // tile's p v alone.
    if (consumer == 1)
      passTurn();
    mbarrierWait(&bars->kFull[0], 0);
    waitTurn();
    issueScores(0);
    passTurn();
    waitGroup<0>();
    fenceRegisters(s);
    mbarrierArrive(&bars->kEmpty[0]);
    softmax(firstTile * kBlockN);
    rescaleAndPack();
    for (int t = 1; t < tiles; ++t) {
      const int stage = t % kStages, previous = (t - 1) % kStages;
      mbarrierWait(&bars->kFull[stage], (t / kStages) & 1);
      mbarrierWait(&bars->vFull[previous], ((t - 1) / kStages) & 1);
      waitTurn();
      issueScores(stage);
      issueValues(previous);
      passTurn();
      waitGroup<1>(); // s_t formed; p_{t-1} v_{t-1} may still run
      fenceRegisters(s);
      mbarrierArrive(&bars->kEmpty[stage]);
      softmax((firstTile + t) * kBlockN);
      waitGroup<0>();
      fenceRegisters(o);
      fenceRegisters(p); // the product read p from registers until here
      mbarrierArrive(&bars->vEmpty[previous]);
      rescaleAndPack();
    }
    const int last = (tiles - 1) % kStages;
    mbarrierWait(&bars->vFull[last], ((tiles - 1) / kStages) & 1);
    waitTurn();
    issueValues(last);
    if (consumer == 0)
      passTurn();
    waitGroup<0>();
    fenceRegisters(o);
    fenceRegisters(p);
    mbarrierArrive(&bars->vEmpty[last]);
  }

  // The four lanes of a quad hold partial sums of the same rows. o goes out through the warp's
  // own rows of the q tile, which only this consumer's products read, all formed by now.
  float factor[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = rowSum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    factor[r] = sum > 0.f ? 1.f / sum : 0.f;
    const int i = warpRow0 + (lane >> 2) + r * 8;
    if (a.savedLse && (lane & 3) == 0 && i < seq)
      a.savedLse[int64_t(bh) * seq + i] =
          sum > 0.f ? (rowMax[r] + __log2f(sum)) * 0.6931471805599453f : -INFINITY;
  }
  storeFragmentRows<kD, kBlockM>(sQ, consumer * 64 + warp * 16, o, factor,
                                 static_cast<T *>(a.out) + headOffset(b, seq, a.oStride, h, kD),
                                 a.oStride, m0, seq);
#else
  __trap();
#endif
}

/// One lane's share of a row's D = dO . o (bf16): the kD / 4 elements from element `at`, eight
/// at a time, in order. The four lanes of a row then add theirs with two shuffles; the warpgroup
/// dq kernel and rowStatsKernel both sum this way, so that they write the same bits.
template <int kD> __device__ __forceinline__ float quarterRowDot(const Args &a, int64_t at) {
  using T = __nv_bfloat16;
  const T *dOut = static_cast<const T *>(a.dout) + at, *out = static_cast<const T *>(a.o) + at;
  float dot = 0.f;
#pragma unroll
  for (int v = 0; v < kD / 32; ++v) {
    const uint4 x = *reinterpret_cast<const uint4 *>(dOut + 8 * v);
    const uint4 y = *reinterpret_cast<const uint4 *>(out + 8 * v);
    const T *xs = reinterpret_cast<const T *>(&x), *ys = reinterpret_cast<const T *>(&y);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      dot = fmaf(__bfloat162float(xs[e]), __bfloat162float(ys[e]), dot);
  }
  return dot;
}

/// The dq kernel's mbarriers: q and dO loaded; the k and v of each stage loaded and released.
struct GradQBarriers {
  uint64_t qdo, kFull[kGradQStages], vFull[kGradQStages], kEmpty[kGradQStages],
      vEmpty[kGradQStages];
};

template <int kD> constexpr size_t gradQSmem() {
  return 1024 + 2 * tileBytes<kD>(kBlockM) + 2 * kGradQStages * tileBytes<kD>(kBlockN) +
         sizeof(GradQBarriers);
}

/// dq from the saved log-sum-exp (flashAttentionGrad) over one tile of 128 queries of one
/// (batch, head), as tc::gradQKernel<..., true> computes it: per key tile, s = q kᵀ and
/// dp = dO vᵀ from shared memory, p = 2^(s scale log2(e) - lse log2(e)) and ds = p (dp - D) on
/// the fragments, dq += ds k with ds from registers (k read with the head dim contiguous). Also
/// writes the rows the dk/dv kernel reads: D = dO . o (summed as tc::gradQKernel sums it, so
/// that kernel's results do not change) and the base-2 log-sum-exp. The producer loads q and dO
/// once and the k and v tiles into a ring; v is released once dp is formed, k once dq += ds k is.
/// kSegments as in forwardKernel.
template <int kD, bool kSegments>
__global__ void __launch_bounds__(kThreads, 1)
    gradQKernel(const __grid_constant__ CUtensorMap qMap, const __grid_constant__ CUtensorMap doMap,
                const __grid_constant__ CUtensorMap kMap, const __grid_constant__ CUtensorMap vMap,
                const Args a) {
#if BONSAI_ATTENTION_WGMMA
  constexpr int kStages = kGradQStages;
  extern __shared__ unsigned char smemRaw[];
  uint8_t *sQ = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(smemRaw) + 1023) &
                                            ~uintptr_t(1023));
  uint8_t *sDo = sQ + tileBytes<kD>(kBlockM);
  uint8_t *sK = sDo + tileBytes<kD>(kBlockM);          // kStages buffers
  uint8_t *sV = sK + kStages * tileBytes<kD>(kBlockN); // kStages buffers
  auto *bars = reinterpret_cast<GradQBarriers *>(sV + kStages * tileBytes<kD>(kBlockN));
  const int lane = threadIdx.x & 31, role = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32;
  const tc::Tile tile = tc::tileOf(a);
  const int bh = tile.group;
  const int mBlock = a.causal ? a.numTiles - 1 - tile.rank : tile.rank;
  const int b = bh / a.heads, h = bh % a.heads, g = h / a.group;
  const int m0 = mBlock * kBlockM, seq = a.seq, seqK = a.seqK;
  const KeyTiles keyTiles = keyTilesOf<kSegments>(a, b, m0);
  const tc::BlockSegments &seg = keyTiles.segments;
  const int firstTile = keyTiles.first, tiles = keyTiles.count;

  if (threadIdx.x == 0) {
    mbarrierInit(&bars->qdo, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrierInit(&bars->kFull[s], 1);
      mbarrierInit(&bars->vFull[s], 1);
      mbarrierInit(&bars->kEmpty[s], 256);
      mbarrierInit(&bars->vEmpty[s], 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (role == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (warp == 0 && lane == 0) {
      mbarrierExpectBytes(&bars->qdo, 2 * tileBytes<kD>(kBlockM));
      tmaLoadTile<kBlockM, kD>(sQ, qMap, &bars->qdo, h, m0, b);
      tmaLoadTile<kBlockM, kD>(sDo, doMap, &bars->qdo, h, m0, b);
      // v first: the consumers release it first (once dp is formed).
      produceKeyTiles<kD, kStages>({sV, &vMap, bars->vFull, bars->vEmpty},
                                   {sK, &kMap, bars->kFull, bars->kEmpty}, firstTile, tiles, g, b);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  using T = __nv_bfloat16;
  const int consumer = role - 1;
  const int64_t qOffset = headOffset(b, seq, a.qStride, h, kD);
  const int64_t oOffset = headOffset(b, seq, a.oStride, h, kD);
  // D and the base-2 log-sum-exp of the thread's two rows; the four lanes of a quad take a
  // quarter of the head dim each, in order, as tc::gradQKernel does (so the dk/dv kernel's inputs
  // are the same bits).
  const int warpRow0 = m0 + consumer * 64 + warp * 16; // rows warpRow0 + lane / 4 (+ 8)
  float rowDot[2], rowLse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = warpRow0 + (lane >> 2) + r * 8;
    float dot = 0.f;
    if (i < seq) {
      dot = quarterRowDot<kD>(a, oOffset + int64_t(i) * a.oStride + (lane & 3) * (kD / 4));
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    dot += __shfl_xor_sync(0xffffffffu, dot, 2);
    rowDot[r] = dot;
    rowLse[r] = 0.f;
    if (i < seq) {
      // A row that read no key (segment ids) has lse -inf; +inf makes its p 0, not NaN.
      const float lse = a.savedLse[int64_t(bh) * seq + i];
      rowLse[r] = kSegments && lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
      if ((lane & 3) == 0) {
        a.dsum[int64_t(bh) * seq + i] = dot;
        a.lse[int64_t(bh) * seq + i] = rowLse[r];
      }
    }
  }

  int64_t rowSegment[1][2] = {};
  if (kSegments)
    tc::fragmentRowSegments<1>(rowSegment, seg.queries, a.segmentsI64, warpRow0, seq);
  float dq[kD / 2];
#pragma unroll
  for (int e = 0; e < kD / 2; ++e)
    dq[e] = 0.f;
  const uint32_t qAddress = tc::smemAddr(sQ) + consumer * 64 * kRegionBytes;
  const uint32_t doAddress = tc::smemAddr(sDo) + consumer * 64 * kRegionBytes;
  mbarrierWait(&bars->qdo, 0);
  for (int t = 0; t < tiles; ++t) {
    const int stage = t % kStages, n0 = (firstTile + t) * kBlockN;
    const uint32_t parity = (t / kStages) & 1;
    const uint32_t kAddress = tc::smemAddr(sK + stage * tileBytes<kD>(kBlockN));
    const uint32_t vAddress = tc::smemAddr(sV + stage * tileBytes<kD>(kBlockN));
    mbarrierWait(&bars->kFull[stage], parity);
    mbarrierWait(&bars->vFull[stage], parity);

    // s = q kᵀ and dp = dO vᵀ, both chains in flight together.
    float s[64], dp[64];
    fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t step = (kk / 4) * kBlockM * kRegionBytes + (kk % 4) * 32;
      const uint32_t keyStep = (kk / 4) * kBlockN * kRegionBytes + (kk % 4) * 32;
      mmaSS128(s, descriptor(qAddress + step, 16, 1024), descriptor(kAddress + keyStep, 16, 1024),
               kk > 0);
      mmaSS128(dp, descriptor(doAddress + step, 16, 1024),
               descriptor(vAddress + keyStep, 16, 1024), kk > 0);
    }
    commit();
    waitGroup<0>();
    fenceRegisters(s);
    fenceRegisters(dp);
    mbarrierArrive(&bars->vEmpty[stage]);

    // ds = p (dp - D) in T pairs, the A fragments of ds k. Element e: row lane / 4 +
    // 8 ((e / 2) % 2), key n0 + 8 (e / 4) + 2 (lane % 4) + e % 2.
    const bool maskSegments =
        !seg.window.uniform || n0 < seg.window.begin || n0 + kBlockN > seg.window.end;
    const bool needMask = n0 + kBlockN > seqK || (a.causal && n0 + kBlockN - 1 > warpRow0) ||
                          (kSegments && maskSegments);
    uint32_t ds[32];
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = warpRow0 + (lane >> 2) + r * 8;
        float v[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float x = s[4 * nt + 2 * r + c] * a.scaleLog2;
          if (needMask) {
            const int j = n0 + nt * 8 + (lane & 3) * 2 + c;
            if (j >= seqK || (a.causal && j > i) ||
                (kSegments && segmentAt(seg.keys, a.segmentsI64, j) != rowSegment[0][r]))
              x = -INFINITY;
          }
          const float p = tc::exp2Approx(x - rowLse[r]);
          v[c] = p * (dp[4 * nt + 2 * r + c] - rowDot[r]);
        }
        ds[2 * nt + r] = tc::pack(T(), v[0], v[1]);
      }

    // dq += ds k: eight 16-key steps, k read with the head dim contiguous.
    fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t da[4] = {ds[4 * kk], ds[4 * kk + 1], ds[4 * kk + 2], ds[4 * kk + 3]};
      mmaRS(dq, da, descriptor(kAddress + kk * 16 * kRegionBytes, kBlockN * kRegionBytes, 1024));
    }
    commit();
    waitGroup<0>();
    fenceRegisters(dq);
    fenceRegisters(ds);
    mbarrierArrive(&bars->kEmpty[stage]);
  }

  // dq goes out through the warp's own rows of the q tile, which only this consumer's products
  // read, all formed by now.
  const float scale[2] = {a.scale, a.scale};
  storeFragmentRows<kD, kBlockM>(sQ, consumer * 64 + warp * 16, dq, scale,
                                 static_cast<T *>(a.dq) + qOffset, a.qStride, m0, seq);
#else
  __trap();
#endif
}

/// The dk/dv kernel's mbarriers: k and v loaded; each stage's q, dO, lse and D loaded (the TMA
/// bytes and the 32 lanes that copy lse and D) and released.
struct GradKVBarriers {
  uint64_t kv, full[kGradKVStages], empty[kGradKVStages];
};

/// k, v, the stages (q, dO, and the rows of lse and D), with kReduceDq the dsᵀ tiles and dq
/// blocks, and the barriers.
template <int kD, bool kReduceDq> constexpr size_t gradKVSmem() {
  return 1024 + 2 * tileBytes<kD>(kKvBlockN) +
         kGradKVStages * (2 * tileBytes<kD>(kKvBlockM) + 2 * kKvBlockM * sizeof(float)) +
         (kReduceDq ? 2 * kDsTileBytes + kConsumers * kDqBlockFloats * sizeof(float) : 0) +
         sizeof(GradKVBarriers);
}

/// The f32 sums of dq the reducing dk/dv kernel adds into: per (batch, head, 64-query tile),
/// kD / 64 blocks of 64 columns, each 4096 floats in the order the kernel stages them (see
/// dqSumIndex). Zeroed before that kernel; gradQFromSumsKernel turns them into dq.
template <int kD> int64_t dqSumFloats(int64_t batch, int64_t heads, int64_t seq) {
  return batch * heads * ((seq + kKvBlockM - 1) / kKvBlockM) * kD * kKvBlockM;
}

/// dk and dv over one tile of 128 keys of one (batch, kv head), as tc::gradKVKernel computes
/// them: consumer c owns keys 64c..64c+63 and loops over the query heads that read them and
/// their 64-query tiles; per step sᵀ = k qᵀ and dpᵀ = v dOᵀ from shared memory (two chains in
/// flight), pᵀ = 2^(sᵀ scale log2(e) - lse) and dsᵀ = pᵀ (dpᵀ - D) on the fragments, then
/// dv += pᵀ dO and dk += dsᵀ q with pᵀ and dsᵀ from registers (dO and q read with the head dim
/// contiguous). Reads the rows of lse and D the dq kernel wrote. The producer's first warp loads
/// k and v once and each step's q and dO tiles into a ring; its second warp copies the step's
/// rows of lse and D (zeros past the sequence). kSegments as in forwardKernel: only the query
/// tiles of the block's documents are loaded and multiplied.
///
/// With kReduceDq the kernel forms dq too (FlashAttention-3's one-kernel backward, five products
/// where the dq kernel's own pass makes seven): each consumer also stores its dsᵀ (bf16, as the
/// dk product reads it) into the step's [128 keys][64 queries] tile and adds ds k, the step's dq
/// tile [64 queries][kD], into a.dqSums with bulk reductions from shared memory. At head dim 128
/// the two consumers meet at a named barrier and form it in blocks of 64 columns over all 128
/// keys, block j by consumer (j + step) % 2; at 64 each forms the whole tile over its own 64 keys
/// and adds it without waiting for the other. The additions of different key blocks come in
/// whatever order the blocks run, so dq is not bit-reproducible; the host takes this kernel only
/// where the caller allows that (Context::deterministic off).
template <int kD, bool kSegments, bool kReduceDq>
__global__ void __launch_bounds__(kThreads, 1)
    gradKVKernel(const __grid_constant__ CUtensorMap qMap,
                 const __grid_constant__ CUtensorMap doMap,
                 const __grid_constant__ CUtensorMap kMap, const __grid_constant__ CUtensorMap vMap,
                 const Args a) {
#if BONSAI_ATTENTION_WGMMA
  constexpr int kStages = kGradKVStages;
  extern __shared__ unsigned char smemRaw[];
  uint8_t *sK = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(smemRaw) + 1023) &
                                            ~uintptr_t(1023));
  uint8_t *sV = sK + tileBytes<kD>(kKvBlockN);
  uint8_t *sDs = sV + tileBytes<kD>(kKvBlockN);           // kReduceDq: 2 tiles
  uint8_t *sQ = sDs + (kReduceDq ? 2 * kDsTileBytes : 0); // kStages buffers
  uint8_t *sDo = sQ + kStages * tileBytes<kD>(kKvBlockM); // kStages buffers
  float *sDq = reinterpret_cast<float *>(sDo + kStages * tileBytes<kD>(kKvBlockM)); // kReduceDq
  float *sLse = sDq + (kReduceDq ? kConsumers * kDqBlockFloats : 0);                // kStages rows
  float *sRowDot = sLse + kStages * kKvBlockM;                                  // kStages rows
  auto *bars = reinterpret_cast<GradKVBarriers *>(sRowDot + kStages * kKvBlockM);
  const int lane = threadIdx.x & 31, role = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32;
  const tc::Tile tile = tc::tileOf(a);
  const int nBlock = tile.rank, bg = tile.group;
  const int b = bg / a.kvHeads, g = bg % a.kvHeads;
  const int n0 = nBlock * kKvBlockN, seq = a.seq, seqK = a.seqK;
  // Steps: (query head of the group, query tile), in order. With the causal mask the query
  // tiles before the block's first key see none of its keys.
  const int mStart = a.causal ? n0 / kKvBlockM : 0;
  int mBegin = mStart, perHead = (seq + kKvBlockM - 1) / kKvBlockM - mStart;
  // Segment ids: the query tiles that hold the block's documents (every thread reads the ids).
  tc::BlockSegments seg{nullptr, nullptr, {0, 0, true}};
  if (kSegments) {
    seg = tc::blockSegments<kThreads>(a, b, false, n0, min(seqK, n0 + kKvBlockN),
                                      mStart * kKvBlockM, seq);
    mBegin = seg.window.begin / kKvBlockM;
    perHead = (seg.window.end + kKvBlockM - 1) / kKvBlockM - mBegin;
  }
  const int steps = a.group * perHead;

  if (threadIdx.x == 0) {
    mbarrierInit(&bars->kv, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrierInit(&bars->full[s], 1 + 32);
      mbarrierInit(&bars->empty[s], 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (role == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (warp == 0 && lane == 0) {
      mbarrierExpectBytes(&bars->kv, 2 * tileBytes<kD>(kKvBlockN));
      tmaLoadTile<kKvBlockN, kD>(sK, kMap, &bars->kv, g, n0, b);
      tmaLoadTile<kKvBlockN, kD>(sV, vMap, &bars->kv, g, n0, b);
      for (int u = 0; u < steps; ++u) {
        const int stage = u % kStages;
        const int h = g * a.group + u / perHead, i0 = (mBegin + u % perHead) * kKvBlockM;
        if (u >= kStages)
          mbarrierWait(&bars->empty[stage], (u / kStages - 1) & 1);
        mbarrierExpectBytes(&bars->full[stage], 2 * tileBytes<kD>(kKvBlockM));
        tmaLoadTile<kKvBlockM, kD>(sQ + stage * tileBytes<kD>(kKvBlockM), qMap, &bars->full[stage],
                                   h, i0, b);
        tmaLoadTile<kKvBlockM, kD>(sDo + stage * tileBytes<kD>(kKvBlockM), doMap,
                                   &bars->full[stage], h, i0, b);
      }
    } else if (warp == 1) {
      for (int u = 0; u < steps; ++u) {
        const int stage = u % kStages;
        const int h = g * a.group + u / perHead, i0 = (mBegin + u % perHead) * kKvBlockM;
        const int64_t rowBase = (int64_t(b) * a.heads + h) * seq;
        if (u >= kStages)
          mbarrierWait(&bars->empty[stage], (u / kStages - 1) & 1);
#pragma unroll
        for (int x = lane; x < kKvBlockM; x += 32) {
          const int i = i0 + x;
          sLse[stage * kKvBlockM + x] = i < seq ? a.lse[rowBase + i] : 0.f;
          sRowDot[stage * kKvBlockM + x] = i < seq ? a.dsum[rowBase + i] : 0.f;
        }
        mbarrierArrive(&bars->full[stage]);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  using T = __nv_bfloat16;
  const int consumer = role - 1;
  float dk[kD / 2], dv[kD / 2];
#pragma unroll
  for (int e = 0; e < kD / 2; ++e)
    dk[e] = dv[e] = 0.f;
  const int warpKey0 = n0 + consumer * 64 + warp * 16; // keys warpKey0 + lane / 4 (+ 8)
  int64_t keySegment[1][2] = {};
  if (kSegments)
    tc::fragmentRowSegments<1>(keySegment, seg.keys, a.segmentsI64, warpKey0, seqK);
  const uint32_t kAddress = tc::smemAddr(sK) + consumer * 64 * kRegionBytes;
  const uint32_t vAddress = tc::smemAddr(sV) + consumer * 64 * kRegionBytes;
  mbarrierWait(&bars->kv, 0);
  for (int u = 0; u < steps; ++u) {
    const int stage = u % kStages, i0 = (mBegin + u % perHead) * kKvBlockM;
    mbarrierWait(&bars->full[stage], (u / kStages) & 1);
    const uint32_t qAddress = tc::smemAddr(sQ + stage * tileBytes<kD>(kKvBlockM));
    const uint32_t doAddress = tc::smemAddr(sDo + stage * tileBytes<kD>(kKvBlockM));
    const float *tLse = sLse + stage * kKvBlockM, *tRowDot = sRowDot + stage * kKvBlockM;

    // sᵀ = k qᵀ, then dpᵀ = v dOᵀ in a group of its own: kD / 16 k-steps of 16 over the head
    // dim each. The exponentials of pᵀ run while dpᵀ is still on the tensor cores.
    float st[32], dpt[32];
    fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      mmaSS64(st,
              descriptor(kAddress + (kk / 4) * kKvBlockN * kRegionBytes + (kk % 4) * 32, 16, 1024),
              descriptor(qAddress + (kk / 4) * kKvBlockM * kRegionBytes + (kk % 4) * 32, 16, 1024),
              kk > 0);
    commit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      mmaSS64(dpt,
              descriptor(vAddress + (kk / 4) * kKvBlockN * kRegionBytes + (kk % 4) * 32, 16, 1024),
              descriptor(doAddress + (kk / 4) * kKvBlockM * kRegionBytes + (kk % 4) * 32, 16, 1024),
              kk > 0);
    commit();
    waitGroup<1>();
    fenceRegisters(st);

    // pᵀ (in st) and dsᵀ in T pairs, the A fragments of the dv and dk products. Element e: key
    // warpKey0 + lane / 4 + 8 ((e / 2) % 2), query i0 + 8 (e / 4) + 2 (lane % 4) + e % 2.
    const bool maskSegments =
        !seg.window.uniform || i0 < seg.window.begin || i0 + kKvBlockM > seg.window.end;
    const bool needMask =
        i0 + kKvBlockM > seq || (a.causal && warpKey0 + 15 > i0) || (kSegments && maskSegments);
#pragma unroll
    for (int nt = 0; nt < kKvBlockM / 8; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = warpKey0 + (lane >> 2) + r * 8;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = nt * 8 + (lane & 3) * 2 + c;
          float &pv = st[4 * nt + 2 * r + c];
          pv = tc::exp2Approx(pv * a.scaleLog2 - tLse[col]);
          if (needMask) {
            const int i = i0 + col;
            if (i >= seq || (a.causal && j > i) ||
                (kSegments && segmentAt(seg.queries, a.segmentsI64, i) != keySegment[0][r]))
              pv = 0.f;
          }
        }
      }
    waitGroup<0>();
    fenceRegisters(dpt);
    uint32_t pa[16], sa[16];
#pragma unroll
    for (int nt = 0; nt < kKvBlockM / 8; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float ds[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = nt * 8 + (lane & 3) * 2 + c, e = 4 * nt + 2 * r + c;
          ds[c] = st[e] * (dpt[e] - tRowDot[col]);
        }
        pa[2 * nt + r] = tc::pack(T(), st[4 * nt + 2 * r], st[4 * nt + 2 * r + 1]);
        sa[2 * nt + r] = tc::pack(T(), ds[0], ds[1]);
      }
    [[maybe_unused]] uint8_t *tileDs = sDs + (u % 2) * kDsTileBytes;
    if constexpr (kReduceDq) {
      // This consumer's rows of dsᵀ, [key][query] with the 128-byte swizzle (a row's 16-byte
      // chunk c at c ^ (row % 8)): the eight rows of a store are eight chunks, no bank twice.
#pragma unroll
      for (int nt = 0; nt < kKvBlockM / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = consumer * 64 + warp * 16 + (lane >> 2) + r * 8;
          *reinterpret_cast<uint32_t *>(tileDs + row * kRegionBytes + ((nt ^ (row & 7)) * 16) +
                                        (lane & 3) * 4) = sa[2 * nt + r];
        }
      fenceProxyAsync(); // the stores, before wgmma reads the tile
    }

    // dv += pᵀ dO and dk += dsᵀ q: four 16-query steps.
    fence();
#pragma unroll
    for (int kk = 0; kk < kKvBlockM / 16; ++kk) {
      const uint32_t pk[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
      const uint32_t sk[4] = {sa[4 * kk], sa[4 * kk + 1], sa[4 * kk + 2], sa[4 * kk + 3]};
      const uint32_t rows = kk * 16 * kRegionBytes, region = kKvBlockM * kRegionBytes;
      mmaRS(dv, pk, descriptor(doAddress + rows, region, 1024));
      mmaRS(dk, sk, descriptor(qAddress + rows, region, 1024));
    }
    commit();
    if constexpr (kReduceDq) {
      // At head dim 128 the consumers share dsᵀ: both halves stored, and both consumers past the
      // previous step's dq products, which read the other tile (the one the next step
      // overwrites). At 64 each multiplies its own keys' (rows from `first`) and adds the whole
      // block, without waiting for the other.
      constexpr bool kShareDs = kD == 128;
      if constexpr (kShareDs)
        namedBarrierSync(kDsBarrier, kConsumers * 128);
      const int block = kShareDs ? (consumer + u) % 2 : 0; // of 64 dq columns
      const int first = kShareDs ? 0 : consumer * 64;
      float dq[32];
      const uint32_t dsAddress = tc::smemAddr(tileDs) + first * kRegionBytes;
      const uint32_t keyColumns =
          tc::smemAddr(sK) + block * kKvBlockN * kRegionBytes + first * kRegionBytes;
#pragma unroll
      for (int kk = 0; kk < (kShareDs ? kKvBlockN : 64) / 16; ++kk)
        mmaSS64</*kTransposed=*/1>(
            dq, descriptor(dsAddress + kk * 16 * kRegionBytes, kDsTileBytes, 1024),
            descriptor(keyColumns + kk * 16 * kRegionBytes, kKvBlockN * kRegionBytes, 1024),
            kk > 0);
      commit();
      // (Staged and added here rather than while the next step's first products run: on
      // an H100 that order measured 2-6% slower at head dim 128.)
      waitGroup<0>();
      fenceRegisters(dq);
      addDqBlock(dq, sDq + consumer * kDqBlockFloats,
                 a.dqSums + dqSumIndex<kD>(a, b, g * a.group + u / perHead, i0, block));
    }
    waitGroup<0>();
    fenceRegisters(dk);
    fenceRegisters(dv);
    fenceRegisters(pa);
    fenceRegisters(sa);
    mbarrierArrive(&bars->empty[stage]);
  }
  if constexpr (kReduceDq) {
    // The bulk reductions still reading this block's shared memory must finish before it ends.
    if (lane == 0)
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }

  // dv and then dk go out through the warp's own rows of the v tile, which only this consumer's
  // dpᵀ products read (the dq products of kReduceDq read k), all formed by now.
  const int64_t kvOffset = headOffset(b, seqK, a.kvStride, g, kD);
  const float one[2] = {1.f, 1.f}, scale[2] = {a.scale, a.scale};
  storeFragmentRows<kD, kKvBlockN>(sV, consumer * 64 + warp * 16, dv, one,
                                   static_cast<T *>(a.dv) + kvOffset, a.kvStride, n0, seqK);
  __syncwarp(); // the rows are read out before they are written again
  storeFragmentRows<kD, kKvBlockN>(sV, consumer * 64 + warp * 16, dk, scale,
                                   static_cast<T *>(a.dk) + kvOffset, a.kvStride, n0, seqK);
#else
  __trap();
#endif
}

/// The rows the reducing dk/dv kernel reads, which the dq kernel writes on the other path: D =
/// dO . o, summed as that kernel sums it (four lanes a row, kD / 4 elements each, then two
/// shuffles), and the saved log-sum-exp in base 2 (+inf for a row that read no key, so that its
/// p is 0). Eight rows a warp, rows in [B, H, S] order.
template <int kD> __global__ void rowStatsKernel(const Args a, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 4) + threadIdx.x / 4;
  const int part = threadIdx.x & 3;
  float dot = 0.f;
  if (row < rows) {
    const int64_t bh = row / a.seq, i = row % a.seq, b = bh / a.heads, h = bh % a.heads;
    dot = quarterRowDot<kD>(a, headOffset(b, a.seq, a.oStride, h, kD) + i * a.oStride +
                                   part * (kD / 4));
  }
  dot += __shfl_xor_sync(0xffffffffu, dot, 1);
  dot += __shfl_xor_sync(0xffffffffu, dot, 2);
  if (row < rows && part == 0) {
    a.dsum[row] = dot;
    const float lse = a.savedLse[row];
    a.lse[row] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
  }
}

/// dq = scale · the sums of the reducing dk/dv kernel: one block of 128 threads per 64 x 64 block
/// of sums. Each thread reads back the eight float4 it staged (addDqBlock's order) into a
/// row-major tile in shared memory, and the block writes the tile's rows 16 bytes a thread (the
/// fragments' own 4-byte pairs would fill half of each sector written).
template <int kD> __global__ void __launch_bounds__(128) gradQFromSumsKernel(const Args a) {
  using T = __nv_bfloat16;
  constexpr int kPitch = 64 + 4; // floats a tile row, padded off the banks of the next
  __shared__ float tile[kKvBlockM * kPitch];
  const int64_t tiles = (a.seq + kKvBlockM - 1) / kKvBlockM;
  const int64_t chunk = blockIdx.x;
  const int block = int(chunk % (kD / 64));
  const int64_t m = (chunk / (kD / 64)) % tiles, bh = chunk / (kD / 64) / tiles;
  const int64_t b = bh / a.heads, h = bh % a.heads;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const float4 *sums = reinterpret_cast<const float4 *>(a.dqSums + chunk * kDqBlockFloats);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float4 x = sums[(warp * 8 + e) * 32 + lane];
    float *at = tile + (warp * 16 + (lane >> 2)) * kPitch + e * 8 + (lane & 3) * 2;
    *reinterpret_cast<float2 *>(at) = make_float2(x.x, x.y);
    *reinterpret_cast<float2 *>(at + 8 * kPitch) = make_float2(x.z, x.w);
  }
  __syncthreads();
  T *dq = static_cast<T *>(a.dq) + headOffset(b, a.seq, a.qStride, h, kD) + block * 64;
#pragma unroll
  for (int c = t; c < kKvBlockM * 8; c += 128) {
    const int row = c / 8, part = c % 8;
    const int64_t i = m * kKvBlockM + row;
    if (i >= a.seq)
      continue;
    const float *x = tile + row * kPitch + part * 8;
    uint4 packed;
    packed.x = tc::pack(T(), x[0] * a.scale, x[1] * a.scale);
    packed.y = tc::pack(T(), x[2] * a.scale, x[3] * a.scale);
    packed.z = tc::pack(T(), x[4] * a.scale, x[5] * a.scale);
    packed.w = tc::pack(T(), x[6] * a.scale, x[7] * a.scale);
    *reinterpret_cast<uint4 *>(dq + i * a.qStride + part * 8) = packed;
  }
}

} // namespace wg

//===----------------------------------------------------------------------===//
// Launchers
//===----------------------------------------------------------------------===//

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename... Params, typename... Values>
void launch(const char *kn, const char *name, void (*kernel)(Params...), int64_t blocks,
            int threads, size_t smem, Stream stream, const Values &...values) {
  if (blocks <= 0)
    return;
  if (blocks > std::numeric_limits<int32_t>::max())
    fail(kn, "needs " + std::to_string(blocks) + " thread blocks, more than one launch takes");
  if (smem > 48 * 1024)
    allowSharedMemory(kn, kernel, smem);
  kernel<<<unsigned(blocks), threads, smem, stream>>>(values...);
  checkCuda(kn, cudaGetLastError(), name);
}

/// Whether the warpgroup kernels run here: built for sm_90a (BONSAI_CUDA_SM90A, set by CMake when
/// the architectures include it) and an sm_90 device, the only one sm_90a code runs on.
bool wgmmaUsable(const char *kn) {
#if BONSAI_CUDA_SM90A
  return deviceAttribute(kn, cudaDevAttrComputeCapabilityMajor) == 9 &&
         deviceAttribute(kn, cudaDevAttrComputeCapabilityMinor) == 0;
#else
  (void)kn;
  return false;
#endif
}

/// cuTensorMapEncodeTiled, found through the runtime so that nothing links the driver library.
PFN_cuTensorMapEncodeTiled_v12000 tensorMapEncoder(const char *kn) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [kn] {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    checkCuda(kn,
              cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                               cudaEnableDefault, &found),
              "cudaGetDriverEntryPointByVersion");
    if (found != cudaDriverEntryPointSuccess || !fn)
      fail(kn, "the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

/// The TMA map of a [batch, rows, heads, headDim] bf16 operand whose rows are `rowStride`
/// elements apart: boxes of 64 columns by `boxRows` rows of one head, in the 128-byte swizzle
/// the warpgroup kernels' descriptors read.
CUtensorMap tileMap(const char *kn, const void *base, int64_t batch, int64_t rows, int64_t heads,
                    int64_t headDim, int64_t rowStride, int boxRows) {
  CUtensorMap map;
  const cuuint64_t sizes[4] = {cuuint64_t(headDim), cuuint64_t(heads), cuuint64_t(rows),
                               cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(headDim) * 2, cuuint64_t(rowStride) * 2,
                                 cuuint64_t(rows * rowStride) * 2};
  const cuuint32_t box[4] = {64, 1, cuuint32_t(boxRows), 1};
  const cuuint32_t elementStrides[4] = {1, 1, 1, 1};
  const CUresult result = tensorMapEncoder(kn)(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void *>(base), sizes, strides, box,
      elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    fail(kn, "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(result)) + ")");
  return map;
}

/// Whether the Hopper kernels (namespace wg) take a call of storage type T: bf16 at head dim
/// 64 or 128, where CMake built sm_90a code and the device is an sm_90, with rows to load on
/// both sides (a TMA map has no empty dimension).
template <typename T> bool warpGroupPath(const char *kn, const Dims &dims) {
  return std::is_same_v<T, __nv_bfloat16> && wg::takesHeadDim(dims.d) && dims.seq > 0 &&
         dims.seqK > 0 && wgmmaUsable(kn);
}

template <typename T, int kD>
void forwardTensorCore(const char *kn, Stream stream, Args a, const Dims &dims) {
  a.numTiles = int(ceilDiv(dims.seq, tc::kFwdBlockM));
  launch(kn, "launch of the forward kernel",
         a.segments ? tc::forwardKernel<T, kD, true> : tc::forwardKernel<T, kD, false>,
         int64_t(a.numTiles) * dims.batch * dims.heads, tc::kThreads, tc::forwardSmem<kD>(), stream,
         a);
}

/// The TMA maps of the warpgroup dk/dv kernel: q and dO in 64-row boxes, k and v in 128-row ones.
struct GradKVMaps {
  CUtensorMap q, dout, k, v;
};

template <int kD> GradKVMaps gradKVMaps(const char *kn, const Args &a, const Dims &dims) {
  return {tileMap(kn, a.q, dims.batch, dims.seq, dims.heads, kD, a.qStride, wg::kKvBlockM),
          tileMap(kn, a.dout, dims.batch, dims.seq, dims.heads, kD, a.oStride, wg::kKvBlockM),
          tileMap(kn, a.k, dims.batch, dims.seqK, dims.kvHeads, kD, a.kvStride, wg::kKvBlockN),
          tileMap(kn, a.v, dims.batch, dims.seqK, dims.kvHeads, kD, a.kvStride, wg::kKvBlockN)};
}

/// FlashAttention-3's backward in one pass over the keys (wg::gradKVKernel with kReduceDq): the
/// rows of D and the base-2 log-sum-exp, the dk/dv kernel adding dq into f32 sums, and dq from
/// the sums. Five products where the dq kernel's pass makes seven, at the price of sums added in
/// the order the blocks run.
template <int kD> void gradReducingDq(const char *kn, Stream stream, Args a, const Dims &dims) {
  const int64_t rows = dims.batch * dims.heads * dims.seq;
  launch(kn, "launch of the row statistics kernel", wg::rowStatsKernel<kD>, ceilDiv(rows, 64), 256,
         0, stream, a, rows);
  const int64_t sums = wg::dqSumFloats<kD>(dims.batch, dims.heads, dims.seq);
  Scratch dqSums(kn, stream, size_t(sums) * sizeof(float));
  a.dqSums = dqSums.as<float>();
  checkCuda(kn, cudaMemsetAsync(a.dqSums, 0, size_t(sums) * sizeof(float), stream),
            "cudaMemsetAsync");
  a.numTiles = int(ceilDiv(dims.seqK, wg::kKvBlockN));
  const GradKVMaps maps = gradKVMaps<kD>(kn, a, dims);
  launch(kn, "launch of the warpgroup dk/dv/dq kernel",
         a.segments ? wg::gradKVKernel<kD, true, true> : wg::gradKVKernel<kD, false, true>,
         int64_t(a.numTiles) * dims.batch * dims.kvHeads, wg::kThreads, wg::gradKVSmem<kD, true>(),
         stream, maps.q, maps.dout, maps.k, maps.v, a);
  launch(kn, "launch of the sums-to-dq kernel", wg::gradQFromSumsKernel<kD>,
         sums / wg::kDqBlockFloats, 128, 0, stream, a);
}

template <typename T, int kD>
void gradTensorCore(const char *kn, Stream stream, Args a, const Dims &dims, bool deterministic) {
  const bool hopper = dims.d == kD && warpGroupPath<T>(kn, dims);
  if (hopper && a.savedLse && !deterministic) {
    gradReducingDq<kD>(kn, stream, a, dims);
    return;
  }
  // The dq kernel writes the rows of D and log-sum-exp the dk/dv kernel reads (from the saved
  // log-sum-exp when there is one).
  a.numTiles = int(ceilDiv(dims.seq, tc::kDqBlockM));
  if (hopper && a.savedLse) {
    // From the saved log-sum-exp on Hopper: the warp-specialised dq kernel.
    static_assert(wg::kBlockM == tc::kDqBlockM, "both dq kernels write the same row blocks");
    launch(kn, "launch of the warpgroup dq kernel",
           a.segments ? wg::gradQKernel<kD, true> : wg::gradQKernel<kD, false>,
           int64_t(a.numTiles) * dims.batch * dims.heads, wg::kThreads, wg::gradQSmem<kD>(), stream,
           tileMap(kn, a.q, dims.batch, dims.seq, dims.heads, kD, a.qStride, wg::kBlockM),
           tileMap(kn, a.dout, dims.batch, dims.seq, dims.heads, kD, a.oStride, wg::kBlockM),
           tileMap(kn, a.k, dims.batch, dims.seqK, dims.kvHeads, kD, a.kvStride, wg::kBlockN),
           tileMap(kn, a.v, dims.batch, dims.seqK, dims.kvHeads, kD, a.kvStride, wg::kBlockN), a);
  } else {
    auto *dqKernel = a.segments ? (a.savedLse ? tc::gradQKernel<T, kD, true, true>
                                              : tc::gradQKernel<T, kD, false, true>)
                                : (a.savedLse ? tc::gradQKernel<T, kD, true, false>
                                              : tc::gradQKernel<T, kD, false, false>);
    launch(kn, "launch of the dq kernel", dqKernel,
           int64_t(a.numTiles) * dims.batch * dims.heads, tc::kThreads, tc::gradQSmem<kD>(),
           stream, a);
  }
  if (hopper) {
    a.numTiles = int(ceilDiv(dims.seqK, wg::kKvBlockN));
    const GradKVMaps maps = gradKVMaps<kD>(kn, a, dims);
    launch(kn, "launch of the warpgroup dk/dv kernel",
           a.segments ? wg::gradKVKernel<kD, true, false> : wg::gradKVKernel<kD, false, false>,
           int64_t(a.numTiles) * dims.batch * dims.kvHeads, wg::kThreads,
           wg::gradKVSmem<kD, false>(), stream, maps.q, maps.dout, maps.k, maps.v, a);
    return;
  }
  a.numTiles = int(ceilDiv(dims.seqK, tc::kBwdBlock));
  launch(kn, "launch of the dk/dv kernel",
         a.segments ? tc::gradKVKernel<T, kD, true> : tc::gradKVKernel<T, kD, false>,
         int64_t(a.numTiles) * dims.batch * dims.kvHeads, tc::kThreads, tc::gradKVSmem<kD>(),
         stream, a);
}

template <int kD> void forwardWarpGroup(const char *kn, Stream stream, Args a, const Dims &dims) {
  a.numTiles = int(ceilDiv(dims.seq, wg::kBlockM));
  launch(kn, "launch of the warpgroup forward kernel",
         a.segments ? wg::forwardKernel<kD, true> : wg::forwardKernel<kD, false>,
         int64_t(a.numTiles) * dims.batch * dims.heads, wg::kThreads, wg::forwardSmem<kD>(), stream,
         tileMap(kn, a.q, dims.batch, dims.seq, dims.heads, kD, a.qStride, wg::kBlockM),
         tileMap(kn, a.k, dims.batch, dims.seqK, dims.kvHeads, kD, a.kvStride, wg::kBlockN),
         tileMap(kn, a.v, dims.batch, dims.seqK, dims.kvHeads, kD, a.kvStride, wg::kBlockN), a);
}

template <typename T>
void forwardTensorCoreD(const char *kn, Stream stream, const Args &a, const Dims &dims) {
  // bf16 at head dim 64 or 128 on Hopper with a positive scale (its softmax takes the maximum
  // over the unscaled scores): the warp-specialised warpgroup-MMA kernel.
  if (a.scale > 0 && warpGroupPath<T>(kn, dims)) {
    if (dims.d == 64)
      forwardWarpGroup<64>(kn, stream, a, dims);
    else
      forwardWarpGroup<128>(kn, stream, a, dims);
    return;
  }
  if (dims.d <= 64)
    forwardTensorCore<T, 64>(kn, stream, a, dims);
  else
    forwardTensorCore<T, 128>(kn, stream, a, dims);
}

template <typename T>
void gradTensorCoreD(const char *kn, Stream stream, const Args &a, const Dims &dims,
                     bool deterministic) {
  if (dims.d <= 64)
    gradTensorCore<T, 64>(kn, stream, a, dims, deterministic);
  else
    gradTensorCore<T, 128>(kn, stream, a, dims, deterministic);
}

void forwardGeneric(const char *kn, Stream stream, Args a, const Dims &dims, bool lseOnly) {
  a.numTiles = int(ceilDiv(dims.seq, generic::kWarps));
  launch(kn, "launch of the generic forward kernel", generic::forwardKernel,
         int64_t(a.numTiles) * dims.batch * dims.heads, generic::kThreads,
         generic::forwardSmem(a.d), stream, a, lseOnly);
}

void gradGeneric(const char *kn, Stream stream, Args a, const Dims &dims) {
  const int64_t rows = dims.batch * dims.seq * dims.heads;
  launch(kn, "launch of the row-dot kernel", rowDotKernel, ceilDiv(rows, 8), 256, 0, stream, a,
         rows);
  // The dq and dk/dv kernels read natural-log rows: the saved ones, else a pass computes them.
  if (a.savedLse)
    a.lse = a.savedLse;
  else
    forwardGeneric(kn, stream, a, dims, /*lseOnly=*/true);
  a.numTiles = int(ceilDiv(dims.seq, generic::kWarps));
  launch(kn, "launch of the generic dq kernel", generic::gradQKernel,
         int64_t(a.numTiles) * dims.batch * dims.heads, generic::kThreads, generic::gradQSmem(a.d),
         stream, a);
  a.numTiles = int(ceilDiv(dims.seqK, generic::kWarps));
  launch(kn, "launch of the generic dk/dv kernel", generic::gradKVKernel,
         int64_t(a.numTiles) * dims.batch * dims.kvHeads, generic::kThreads,
         generic::gradKVSmem(a.d), stream, a);
}

} // namespace

namespace {

/// Checks that `lse` is f32 [B, H, S] for q's dimensions.
void checkLse(const char *kn, const TensorView &lse, const Dims &dims) {
  if (lse.dtype != DType::F32)
    fail(kn, std::string("lse must be f32, not ") + dtypeName(lse.dtype));
  std::vector<int64_t> want = {dims.batch, dims.heads, dims.seq};
  if (lse.shape != want)
    fail(kn, "lse shape " + formatShape(lse.shape) + " should be " + formatShape(want) +
                 " ([batch, heads, seq] of q)");
  if (!lse.data && lse.numel() != 0)
    fail(kn, "lse of shape " + formatShape(lse.shape) + " has no data");
}

/// Checks segment ids `name` (i32 or i64 [B, rows]).
void checkSegments(const char *kn, const char *name, const TensorView &ids, int64_t batch,
                   int64_t rows, const char *of) {
  if (ids.dtype != DType::I32 && ids.dtype != DType::I64)
    fail(kn, std::string(name) + " must be i32 or i64, not " + dtypeName(ids.dtype));
  std::vector<int64_t> want = {batch, rows};
  if (ids.shape != want)
    fail(kn, std::string(name) + " shape " + formatShape(ids.shape) + " should be " +
                 formatShape(want) + " ([batch, seq] of " + of + ")");
  if (!ids.data && ids.numel() != 0)
    fail(kn, std::string(name) + " of shape " + formatShape(ids.shape) + " has no data");
}

/// Checks the optional segment ids of the queries and of the keys (both or neither; the same
/// tensor but in a ring block step) and points the kernels' arguments at them.
void setSegments(const char *kn, Args &a, const TensorView *segmentIds,
                 const TensorView *keySegmentIds, const Dims &dims) {
  if (!segmentIds && !keySegmentIds)
    return;
  if (!segmentIds || !keySegmentIds)
    fail(kn, "segment ids are given for the queries or the keys but not both");
  checkSegments(kn, "segment_ids", *segmentIds, dims.batch, dims.seq, "q");
  if (keySegmentIds != segmentIds) {
    checkSegments(kn, "key segment_ids", *keySegmentIds, dims.batch, dims.seqK, "k");
    if (keySegmentIds->dtype != segmentIds->dtype)
      fail(kn, "the keys' segment ids are not of the queries' type");
  }
  a.segments = segmentIds->data;
  a.keySegments = keySegmentIds->data;
  a.segmentsI64 = segmentIds->dtype == DType::I64 ? 1 : 0;
}

/// Refuses the causal mask between different numbers of queries and keys (a ring block step
/// takes it only on its own block, whose chunks are the queries').
void checkCausalLengths(const char *kn, const Dims &dims, bool causal) {
  if (causal && dims.seqK != dims.seq)
    fail(kn, "the causal mask needs as many keys as queries, not " + std::to_string(dims.seqK) +
                 " keys for " + std::to_string(dims.seq) + " queries");
}

/// attention, and with `lse` flashAttention; k and v may be another length than q with
/// `keysOfTheirOwn` (a ring block step, whose key segment ids are `keySegmentIds`). With `qkv`,
/// q, k and v are views of its heads (packedViews), which the kernels read `qkv` positions
/// apart.
void attentionImpl(const char *kn, const Context &ctx, const TensorView &q, const TensorView &k,
                   const TensorView &v, bool causal, double scale, const TensorView &o,
                   const TensorView *lse, const TensorView *segmentIds,
                   const TensorView *keySegmentIds, bool keysOfTheirOwn,
                   const TensorView *qkv = nullptr) {
  Dims dims = checkOperands(kn, q, k, v, keysOfTheirOwn);
  checkCausalLengths(kn, dims, causal);
  checkFloat(kn, "o", o);
  checkSameShape(kn, "o", o, "q", q);
  if (qkv)
    checkDisjoint(kn, "o", o, {{"qkv", qkv}});
  else
    checkDisjoint(kn, "o", o, {{"q", &q}, {"k", &k}, {"v", &v}});
  if (lse) {
    checkLse(kn, *lse, dims);
    if (qkv)
      checkDisjoint(kn, "lse", *lse, {{"qkv", qkv}, {"o", &o}});
    else
      checkDisjoint(kn, "lse", *lse, {{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}});
  }
  // With head_dim 0, o is empty but every row still has lse = log(keys): the generic kernel.
  if (o.numel() == 0 && (!lse || lse->numel() == 0))
    return;

  Args a = makeArgs(dims, causal, scale);
  if (qkv)
    a.qStride = a.kvStride = qkv->dim(2) * dims.d;
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.out = o.data;
  a.qType = typeCode(q.dtype);
  a.kType = typeCode(k.dtype);
  a.vType = typeCode(v.dtype);
  a.outType = typeCode(o.dtype);
  a.savedLse = lse ? static_cast<float *>(lse->data) : nullptr;
  setSegments(kn, a, segmentIds, keySegmentIds, dims);
  if (o.numel() != 0 && tensorCorePath(kn, dims, {&q, &k, &v, &o})) {
    if (q.dtype == DType::BF16)
      forwardTensorCoreD<__nv_bfloat16>(kn, ctx.stream, a, dims);
    else
      forwardTensorCoreD<__half>(kn, ctx.stream, a, dims);
  } else {
    forwardGeneric(kn, ctx.stream, a, dims, false);
  }
}

/// attentionGrad, and with `lse` flashAttentionGrad; k and v as in attentionImpl. With `qkv`
/// and `dqkv`, q, k, v and dq, dk, dv are views of their heads (packedViews).
void attentionGradImpl(const char *kn, const Context &ctx, const TensorView &dout,
                       const TensorView &q, const TensorView &k, const TensorView &v,
                       const TensorView &o, const TensorView *lse, bool causal, double scale,
                       const TensorView &dq, const TensorView &dk, const TensorView &dv,
                       const TensorView *segmentIds, const TensorView *keySegmentIds,
                       bool keysOfTheirOwn, const TensorView *qkv = nullptr,
                       const TensorView *dqkv = nullptr) {
  Dims dims = checkOperands(kn, q, k, v, keysOfTheirOwn);
  checkCausalLengths(kn, dims, causal);
  checkFloat(kn, "dout", dout);
  checkFloat(kn, "o", o);
  checkFloat(kn, "dq", dq);
  checkFloat(kn, "dk", dk);
  checkFloat(kn, "dv", dv);
  checkSameShape(kn, "o", o, "q", q);
  checkSameShape(kn, "dout", dout, "q", q);
  checkSameShape(kn, "dq", dq, "q", q);
  checkSameShape(kn, "dk", dk, "k", k);
  checkSameShape(kn, "dv", dv, "v", v);
  if (dqkv) {
    // dq, dk and dv are disjoint heads of dqkv.
    checkDisjoint(kn, "dqkv", *dqkv, {{"dout", &dout}, {"qkv", qkv}, {"o", &o}});
    if (lse)
      checkDisjoint(kn, "dqkv", *dqkv, {{"lse", lse}});
  } else {
    std::initializer_list<std::pair<const char *, const TensorView *>> inputs = {
        {"dout", &dout}, {"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}};
    checkDisjoint(kn, "dq", dq, inputs);
    checkDisjoint(kn, "dk", dk, inputs);
    checkDisjoint(kn, "dv", dv, inputs);
    checkDisjoint(kn, "dk", dk, {{"dq", &dq}, {"dv", &dv}});
    checkDisjoint(kn, "dq", dq, {{"dv", &dv}});
    if (lse) {
      checkDisjoint(kn, "dq", dq, {{"lse", lse}});
      checkDisjoint(kn, "dk", dk, {{"lse", lse}});
      checkDisjoint(kn, "dv", dv, {{"lse", lse}});
    }
  }
  if (lse)
    checkLse(kn, *lse, dims);
  if (q.numel() == 0) {
    // No query reads any key (heads or head_dim is 0 with keys left): the gradients are zeros
    // (packed: dqkv holds only dk and dv then, or nothing).
    for (const TensorView *t : dqkv ? std::initializer_list<const TensorView *>{dqkv}
                                    : std::initializer_list<const TensorView *>{&dk, &dv})
      checkCuda(kn, cudaMemsetAsync(t->data, 0, t->bytes(), ctx.stream), "cudaMemsetAsync");
    return;
  }

  Args a = makeArgs(dims, causal, scale);
  if (qkv)
    a.qStride = a.kvStride = qkv->dim(2) * dims.d;
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.o = o.data;
  a.dout = dout.data;
  a.dq = dq.data;
  a.dk = dk.data;
  a.dv = dv.data;
  a.qType = typeCode(q.dtype);
  a.kType = typeCode(k.dtype);
  a.vType = typeCode(v.dtype);
  a.oType = typeCode(o.dtype);
  a.doutType = typeCode(dout.dtype);
  a.dqType = typeCode(dq.dtype);
  a.dkType = typeCode(dk.dtype);
  a.dvType = typeCode(dv.dtype);
  a.savedLse = lse ? static_cast<float *>(lse->data) : nullptr;

  const int64_t rows = dims.batch * dims.seq * dims.heads;
  // The log-sum-exp and D of every query row.
  Scratch scratch(kn, ctx.stream, size_t(2 * rows) * sizeof(float));
  a.lse = scratch.as<float>();
  a.dsum = a.lse + rows;
  setSegments(kn, a, segmentIds, keySegmentIds, dims);
  if (tensorCorePath(kn, dims, {&q, &k, &v, &o, &dout, &dq, &dk, &dv})) {
    if (q.dtype == DType::BF16)
      gradTensorCoreD<__nv_bfloat16>(kn, ctx.stream, a, dims, ctx.deterministic);
    else
      gradTensorCoreD<__half>(kn, ctx.stream, a, dims, ctx.deterministic);
  } else {
    gradGeneric(kn, ctx.stream, a, dims);
  }
}

} // namespace

void attention(const Context &ctx, const TensorView &q, const TensorView &k, const TensorView &v,
               bool causal, double scale, const TensorView &o, const TensorView *segmentIds) {
  attentionImpl("attention", ctx, q, k, v, causal, scale, o, nullptr, segmentIds, segmentIds,
                false);
}

void flashAttention(const Context &ctx, const TensorView &q, const TensorView &k,
                    const TensorView &v, bool causal, double scale, const TensorView &o,
                    const TensorView &lse, const TensorView *segmentIds) {
  attentionImpl("flash_attention", ctx, q, k, v, causal, scale, o, &lse, segmentIds, segmentIds,
                false);
}

namespace {

/// q, k and v as views of the heads of a packed qkv [B, S, H + 2 KV, D] (H from o):
/// each view points at its first head and has the shape of a tensor of its own; the kernels
/// read its positions qkv.dim(2) D elements apart (Args::qStride, kvStride).
struct PackedViews {
  TensorView q, k, v;
};

PackedViews packedViews(const char *kn, const char *name, const TensorView &qkv,
                        const TensorView &o) {
  const int64_t kvHeads = detail::checkPackedQkv(kn, name, qkv, o), heads = o.dim(2);
  const int64_t d = qkv.dim(3);
  auto view = [&](int64_t firstHead, int64_t count) {
    TensorView t;
    t.data =
        qkv.data ? static_cast<char *>(qkv.data) + firstHead * d * dtypeSize(qkv.dtype) : nullptr;
    t.dtype = qkv.dtype;
    t.shape = {qkv.dim(0), qkv.dim(1), count, d};
    return t;
  };
  return {view(0, heads), view(heads, kvHeads), view(heads + kvHeads, kvHeads)};
}

} // namespace

void flashAttentionQkv(const Context &ctx, const TensorView &qkv, bool causal, double scale,
                       const TensorView &o, const TensorView &lse, const TensorView *segmentIds) {
  const char *kn = "flash_attention_qkv";
  PackedViews p = packedViews(kn, "qkv", qkv, o);
  attentionImpl(kn, ctx, p.q, p.k, p.v, causal, scale, o, &lse, segmentIds, segmentIds, false,
                &qkv);
}

void attentionGrad(const Context &ctx, const TensorView &dout, const TensorView &q,
                   const TensorView &k, const TensorView &v, const TensorView &o, bool causal,
                   double scale, const TensorView &dq, const TensorView &dk, const TensorView &dv,
                   const TensorView *segmentIds) {
  attentionGradImpl("attention_grad", ctx, dout, q, k, v, o, nullptr, causal, scale, dq, dk, dv,
                    segmentIds, segmentIds, false);
}

void flashAttentionGrad(const Context &ctx, const TensorView &dout, const TensorView &q,
                        const TensorView &k, const TensorView &v, const TensorView &o,
                        const TensorView &lse, bool causal, double scale, const TensorView &dq,
                        const TensorView &dk, const TensorView &dv,
                        const TensorView *segmentIds) {
  attentionGradImpl("flash_attention_grad", ctx, dout, q, k, v, o, &lse, causal, scale, dq, dk,
                    dv, segmentIds, segmentIds, false);
}

void flashAttentionQkvGrad(const Context &ctx, const TensorView &dout, const TensorView &qkv,
                           const TensorView &o, const TensorView &lse, bool causal, double scale,
                           const TensorView &dqkv, const TensorView *segmentIds) {
  const char *kn = "flash_attention_qkv_grad";
  PackedViews p = packedViews(kn, "qkv", qkv, o);
  checkFloat(kn, "dqkv", dqkv);
  checkSameShape(kn, "dqkv", dqkv, "qkv", qkv);
  PackedViews g = packedViews(kn, "dqkv", dqkv, o);
  attentionGradImpl(kn, ctx, dout, p.q, p.k, p.v, o, &lse, causal, scale, g.q, g.k, g.v, segmentIds,
                    segmentIds, false, &qkv, &dqkv);
}

namespace detail {

void attentionRows(const char *kernel, const Context &ctx, const TensorView &q,
                   const TensorView &k, const TensorView &v, bool causal, double scale,
                   const TensorView &o, const TensorView &lse, const TensorView *querySegments,
                   const TensorView *keySegments) {
  attentionImpl(kernel, ctx, q, k, v, causal, scale, o, &lse, querySegments, keySegments, true);
}

void attentionRowsGrad(const char *kernel, const Context &ctx, const TensorView &dout,
                       const TensorView &q, const TensorView &k, const TensorView &v,
                       const TensorView &o, const TensorView &lse, bool causal, double scale,
                       const TensorView &dq, const TensorView &dk, const TensorView &dv,
                       const TensorView *querySegments, const TensorView *keySegments) {
  attentionGradImpl(kernel, ctx, dout, q, k, v, o, &lse, causal, scale, dq, dk, dv, querySegments,
                    keySegments, true);
}

} // namespace detail

} // namespace bonsai::rt::cuda
