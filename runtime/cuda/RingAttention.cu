//===- RingAttention.cu - Ring attention's block steps on CUDA -------------===//
//
// One step of ring attention (docs/ring-attention.md) on this rank: its zigzag share of the
// queries against the key/value block of the rank it holds at that step. A step runs the flash
// kernels of Attention.cu (AttentionRows.h) on the rows the zigzag layout pairs, then folds
// their result into fp32 state: the forward merges the block's output and log-sum-exp into the
// running ones (o = o·e^(lse-lse') + o_b·e^(lse_b-lse'), lse' = log(e^lse + e^lse_b)); the
// backward runs the flash gradient kernels from the final o and lse (each block's share of the
// whole softmax is exact then, as in FlashAttention's backward) and adds the block's dq to the
// local accumulator, its dk and dv to fp32 tensors the caller adds to the accumulators that
// travel with the block.
//
// The rows a step reads are half of the local ones at most steps. With one batch row they are
// a view (the halves are contiguous); with several, a strided copy into scratch, which costs a
// pass over half of q or k and v against the O(S²) attention of the step.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "AttentionRows.h"
#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace bonsai::rt::cuda {

namespace {

using detail::checkCuda;
using detail::checkLaunch;
using detail::fail;
using detail::gridFor;
using detail::Scratch;
using detail::toFloat;

/// A range of rows (tokens) of the local sequence.
struct Rows {
  int64_t begin = 0, count = 0;
};

/// What one step pairs: query rows, key rows, and whether causally.
struct Pairing {
  Rows queries, keys;
  bool causal = false;
};

/// The zigzag layout's pairs for `step` over a local sequence of `seq` tokens (two chunks).
Pairing pairingOf(const RingBlockStep &step, int64_t seq, bool causal) {
  const int64_t chunk = seq / 2;
  Pairing p{{0, seq}, {0, seq}, false};
  if (!causal)
    return p;
  if (step.holder == step.rank)
    p.causal = true; // chunks rank and 2N-1-rank against themselves: in order, so causal
  else if (step.holder < step.rank)
    p.keys = {0, chunk}; // the holder's first chunk precedes both of ours; its second follows
  else
    p.queries = {chunk, chunk}; // only our second chunk follows the holder's chunks
  return p;
}

/// Rows `r` of axis `axis` of `t`: a view when they are contiguous (everything before the
/// axis has one element, or all rows), else a copy into scratch kept in `keep`.
TensorView rowsOf(const char *kn, Stream stream, const TensorView &t, int axis, Rows r,
                  std::vector<Scratch> &keep) {
  if (r.begin == 0 && r.count == t.dim(axis))
    return t;
  int64_t outer = 1, inner = int64_t(dtypeSize(t.dtype));
  for (int i = 0; i < axis; ++i)
    outer *= t.dim(i);
  for (int i = axis + 1; i < t.rank(); ++i)
    inner *= t.dim(i);
  TensorView view = t;
  view.shape[size_t(axis)] = r.count;
  const char *base = static_cast<const char *>(t.data) + r.begin * inner;
  if (outer == 1) {
    view.data = const_cast<char *>(base);
    return view;
  }
  keep.emplace_back(kn, stream, size_t(outer * r.count * inner));
  view.data = keep.back().get();
  checkCuda(cudaMemcpy2DAsync(view.data, size_t(r.count * inner), base,
                              size_t(t.dim(axis) * inner), size_t(r.count * inner),
                              size_t(outer), cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpy2DAsync", kn);
  return view;
}

/// A scratch tensor of `shape` and `dtype` kept in `keep`.
TensorView scratchTensor(const char *kn, Stream stream, DType dtype,
                         std::vector<int64_t> shape, std::vector<Scratch> &keep) {
  TensorView t{nullptr, dtype, std::move(shape)};
  keep.emplace_back(kn, stream, std::max<size_t>(t.bytes(), 1));
  t.data = keep.back().get();
  return t;
}

/// The shape of one attention problem in the kernels' index arithmetic.
struct RowShape {
  int64_t batch, seq, heads, d; ///< of the fp32 state ([B, seq, heads, d] and [B, heads, seq])
  int64_t begin, rows;          ///< the block's rows within seq
};

/// Merges a block's output (T [B, rows, H, D]) and log-sum-exp (f32 [B, H, rows]) into the
/// running acc and lse at rows [begin, begin + rows): one warp per (batch, row, head).
template <typename T>
__global__ void mergeKernel(float *acc, float *lse, const T *block, const float *blockLse,
                            RowShape s, bool first) {
  const int64_t total = s.batch * s.rows * s.heads;
  const int lane = threadIdx.x & 31;
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < total;
       w += int64_t(gridDim.x) * blockDim.x / 32) {
    const int64_t h = w % s.heads, bi = w / s.heads, i = bi % s.rows, b = bi / s.rows;
    const int64_t row = s.begin + i;
    float *out = acc + ((b * s.seq + row) * s.heads + h) * s.d;
    const T *in = block + w * s.d;
    float &l = lse[(b * s.heads + h) * s.seq + row];
    const float lb = blockLse[(b * s.heads + h) * s.rows + i];
    float merged = lb, keep = 0.f, take = 1.f;
    if (!first) {
      const float m = fmaxf(l, lb);
      if (m == -INFINITY)
        continue; // neither read a key: o stays 0, lse -inf
      merged = m + logf(expf(l - m) + expf(lb - m));
      keep = expf(l - merged);
      take = expf(lb - merged);
    }
    for (int64_t e = lane; e < s.d; e += 32)
      out[e] = (first ? 0.f : out[e] * keep) + toFloat(in[e]) * take;
    __syncwarp(); // every lane has read l
    if (lane == 0)
      l = merged;
  }
}

/// dst[b, begin + i, x] (f32 [B, seq, X]) = or += src[b, i, x] (T [B, rows, X]).
template <typename T>
__global__ void addRowsKernel(float *dst, const T *src, int64_t batch, int64_t seq, int64_t width,
                              int64_t begin, int64_t rows, bool set) {
  const int64_t total = batch * rows * width;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t x = idx % width, bi = idx / width, i = bi % rows, b = bi / rows;
    float &d = dst[(b * seq + begin + i) * width + x];
    const float v = toFloat(src[idx]);
    d = set ? v : d + v;
  }
}

template <typename T>
void launchMerge(const char *kn, Stream stream, const TensorView &acc, const TensorView &lse,
                 const TensorView &block, const TensorView &blockLse, const RowShape &s,
                 bool first) {
  mergeKernel<T><<<gridFor(kn, s.batch * s.rows * s.heads, 8), 256, 0, stream>>>(
      static_cast<float *>(acc.data), static_cast<float *>(lse.data),
      static_cast<const T *>(block.data), static_cast<const float *>(blockLse.data), s, first);
  checkLaunch(kn, "mergeKernel");
}

/// Merges a block's output and log-sum-exp (rows `rows` of the state) into acc and lse.
void merge(const char *kn, Stream stream, const TensorView &acc, const TensorView &lse,
           const TensorView &block, const TensorView &blockLse, Rows rows, bool first) {
  const RowShape s{acc.dim(0), acc.dim(1), acc.dim(2), acc.dim(3), rows.begin, rows.count};
  if (block.dtype == DType::BF16)
    launchMerge<__nv_bfloat16>(kn, stream, acc, lse, block, blockLse, s, first);
  else if (block.dtype == DType::F16)
    launchMerge<__half>(kn, stream, acc, lse, block, blockLse, s, first);
  else
    launchMerge<float>(kn, stream, acc, lse, block, blockLse, s, first);
}

template <typename T>
void launchAddRows(const char *kn, Stream stream, const TensorView &dst, const TensorView &src,
                   Rows rows, bool set) {
  const int64_t width = dst.numel() / (dst.dim(0) * dst.dim(1));
  const int64_t total = dst.dim(0) * rows.count * width;
  addRowsKernel<T><<<gridFor(kn, total, 256), 256, 0, stream>>>(
      static_cast<float *>(dst.data), static_cast<const T *>(src.data), dst.dim(0), dst.dim(1),
      width, rows.begin, rows.count, set);
  checkLaunch(kn, "addRowsKernel");
}

/// Sets (or adds to) rows `rows` of f32 `dst` from `src`, which holds just those rows.
void addRows(const char *kn, Stream stream, const TensorView &dst, const TensorView &src,
             Rows rows, bool set) {
  if (src.dtype == DType::BF16)
    launchAddRows<__nv_bfloat16>(kn, stream, dst, src, rows, set);
  else if (src.dtype == DType::F16)
    launchAddRows<__half>(kn, stream, dst, src, rows, set);
  else
    launchAddRows<float>(kn, stream, dst, src, rows, set);
}

/// The segment ids of a step's query and key rows (the tensors given when only one is: the
/// flash kernels refuse that).
class Segments {
public:
  // q_ and k_ may point at members: not copyable.
  Segments(const char *kn, Stream stream, const TensorView *queries, const TensorView *keys,
           const Pairing &p, std::vector<Scratch> &keep)
      : q_(queries), k_(keys) {
    if (!queries || !keys)
      return;
    qRows_ = rowsOf(kn, stream, *queries, 1, p.queries, keep);
    kRows_ = rowsOf(kn, stream, *keys, 1, p.keys, keep);
    q_ = &qRows_;
    k_ = &kRows_;
  }
  Segments(const Segments &) = delete;
  Segments &operator=(const Segments &) = delete;
  const TensorView *queries() const { return q_; }
  const TensorView *keys() const { return k_; }

private:
  const TensorView *q_, *k_;
  TensorView qRows_, kRows_;
};

/// The checks both steps make: the ring, q/k/v's shapes, the sequence's two chunks.
void checkStep(const char *kn, const RingBlockStep &step, const TensorView &q, const TensorView &k,
               const TensorView &v) {
  if (step.ranks < 2 || step.rank < 0 || step.rank >= step.ranks || step.holder < 0 ||
      step.holder >= step.ranks)
    fail(kn, "rank " + std::to_string(step.rank) + " holding rank " +
                 std::to_string(step.holder) + "'s block is not a step of a ring of " +
                 std::to_string(step.ranks) + " ranks (two or more)");
  if (q.rank() != 4 || k.rank() != 4 || k.dim(1) != q.dim(1))
    fail(kn, "q " + formatShape(q.shape) + " and k " + formatShape(k.shape) +
                 " are not [batch, seq, heads, head_dim] of the same local sequence");
  detail::checkSameShape(kn, "v", v, "k", k);
  if (q.dim(1) % 2 != 0)
    fail(kn, "the local sequence of " + std::to_string(q.dim(1)) +
                 " tokens is not two equal zigzag chunks");
}

/// Checks an f32 state tensor `name` of `shape`.
void checkState(const char *kn, const char *name, const TensorView &t,
                const std::vector<int64_t> &shape) {
  if (t.dtype != DType::F32 || t.shape != shape)
    fail(kn, std::string(name) + " is " + dtypeName(t.dtype) + " " + formatShape(t.shape) +
                 ", not f32 " + formatShape(shape));
}

} // namespace

void ringAttentionBlock(const Context &ctx, const TensorView &q, const TensorView &k,
                        const TensorView &v, const TensorView *querySegments,
                        const TensorView *keySegments, bool causal, double scale,
                        const RingBlockStep &step, const TensorView &acc, const TensorView &lse) {
  const char *kn = "ring attention block";
  checkStep(kn, step, q, k, v);
  const int64_t B = q.dim(0), S = q.dim(1), H = q.dim(2);
  checkState(kn, "acc", acc, q.shape);
  checkState(kn, "lse", lse, {B, H, S});
  if (q.numel() == 0)
    return;
  const Pairing p = pairingOf(step, S, causal);
  std::vector<Scratch> keep;
  TensorView qRows = rowsOf(kn, ctx.stream, q, 1, p.queries, keep);
  TensorView kRows = rowsOf(kn, ctx.stream, k, 1, p.keys, keep);
  TensorView vRows = rowsOf(kn, ctx.stream, v, 1, p.keys, keep);
  Segments seg(kn, ctx.stream, querySegments, keySegments, p, keep);
  TensorView out = scratchTensor(kn, ctx.stream, q.dtype, qRows.shape, keep);
  TensorView outLse = scratchTensor(kn, ctx.stream, DType::F32, {B, H, p.queries.count}, keep);
  detail::attentionRows(kn, ctx, qRows, kRows, vRows, p.causal, scale, out, outLse,
                        seg.queries(), seg.keys());
  merge(kn, ctx.stream, acc, lse, out, outLse, p.queries, step.holder == step.rank);
}

void ringAttentionBlockGrad(const Context &ctx, const TensorView &dout, const TensorView &q,
                            const TensorView &k, const TensorView &v, const TensorView &o,
                            const TensorView &lse, const TensorView *querySegments,
                            const TensorView *keySegments, bool causal, double scale,
                            const RingBlockStep &step, const TensorView &dq,
                            const TensorView &dkBlock, const TensorView &dvBlock) {
  const char *kn = "ring attention block grad";
  checkStep(kn, step, q, k, v);
  const int64_t B = q.dim(0), S = q.dim(1), H = q.dim(2);
  detail::checkSameShape(kn, "dout", dout, "q", q);
  detail::checkSameShape(kn, "o", o, "q", q);
  checkState(kn, "lse", lse, {B, H, S});
  checkState(kn, "dq", dq, q.shape);
  checkState(kn, "dk", dkBlock, k.shape);
  checkState(kn, "dv", dvBlock, v.shape);
  if (q.numel() == 0) {
    checkCuda(cudaMemsetAsync(dkBlock.data, 0, dkBlock.bytes(), ctx.stream), "cudaMemsetAsync",
              kn);
    checkCuda(cudaMemsetAsync(dvBlock.data, 0, dvBlock.bytes(), ctx.stream), "cudaMemsetAsync",
              kn);
    return;
  }
  const Pairing p = pairingOf(step, S, causal);
  std::vector<Scratch> keep;
  TensorView qRows = rowsOf(kn, ctx.stream, q, 1, p.queries, keep);
  TensorView doRows = rowsOf(kn, ctx.stream, dout, 1, p.queries, keep);
  TensorView oRows = rowsOf(kn, ctx.stream, o, 1, p.queries, keep);
  TensorView lseRows = rowsOf(kn, ctx.stream, lse, 2, p.queries, keep);
  TensorView kRows = rowsOf(kn, ctx.stream, k, 1, p.keys, keep);
  TensorView vRows = rowsOf(kn, ctx.stream, v, 1, p.keys, keep);
  Segments seg(kn, ctx.stream, querySegments, keySegments, p, keep);
  TensorView dqRows = scratchTensor(kn, ctx.stream, q.dtype, qRows.shape, keep);
  TensorView dkRows = scratchTensor(kn, ctx.stream, k.dtype, kRows.shape, keep);
  TensorView dvRows = scratchTensor(kn, ctx.stream, v.dtype, vRows.shape, keep);
  detail::attentionRowsGrad(kn, ctx, doRows, qRows, kRows, vRows, oRows, lseRows, p.causal, scale,
                            dqRows, dkRows, dvRows, seg.queries(), seg.keys());
  addRows(kn, ctx.stream, dq, dqRows, p.queries, step.holder == step.rank);
  if (p.keys.count != S) {
    checkCuda(cudaMemsetAsync(dkBlock.data, 0, dkBlock.bytes(), ctx.stream), "cudaMemsetAsync",
              kn);
    checkCuda(cudaMemsetAsync(dvBlock.data, 0, dvBlock.bytes(), ctx.stream), "cudaMemsetAsync",
              kn);
  }
  addRows(kn, ctx.stream, dkBlock, dkRows, p.keys, true);
  addRows(kn, ctx.stream, dvBlock, dvRows, p.keys, true);
}

//===----------------------------------------------------------------------===//
// The ring: blocks in flight on the transport's stream
//===----------------------------------------------------------------------===//

namespace {

/// An event of the ring's stream ordering, destroyed at scope exit (work it marks is not).
class Event {
public:
  explicit Event(const char *kn) : kn_(kn) {
    checkCuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate", kn);
  }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event &) = delete;
  Event &operator=(const Event &) = delete;
  /// Marks the work enqueued on `stream` so far.
  void record(Stream stream) { checkCuda(cudaEventRecord(event_, stream), "cudaEventRecord", kn_); }
  /// Makes `stream` wait for the work marked by the last record.
  void waitOn(Stream stream) {
    checkCuda(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent", kn_);
  }
  /// `waiter` waits for everything enqueued on `stream` so far.
  void order(Stream stream, Stream waiter) {
    record(stream);
    waitOn(waiter);
  }

private:
  const char *kn_;
  cudaEvent_t event_ = nullptr;
};

/// A key/value block (and its segment ids, when the rows are packed) as it travels.
struct Block {
  TensorView k, v, segments;
  bool segmented = false;
  const TensorView *segmentIds() const { return segmented ? &segments : nullptr; }
};

/// The block this rank starts with: its own keys, values and segment ids.
Block ownBlock(const TensorView &k, const TensorView &v, const TensorView *segmentIds) {
  Block b;
  b.k = k;
  b.v = v;
  if (segmentIds) {
    b.segments = *segmentIds;
    b.segmented = true;
  }
  return b;
}

/// A buffer for a block shaped as `like`, in scratch.
Block spareBlock(const char *kn, Stream stream, const Block &like, std::vector<Scratch> &keep) {
  Block b = like;
  b.k = scratchTensor(kn, stream, like.k.dtype, like.k.shape, keep);
  b.v = scratchTensor(kn, stream, like.v.dtype, like.v.shape, keep);
  if (like.segmented)
    b.segments = scratchTensor(kn, stream, like.segments.dtype, like.segments.shape, keep);
  return b;
}

/// The buffers blocks arrive in: two, used in turn (one for a ring of two: one transfer).
std::vector<Block> spareBlocks(const char *kn, Stream stream, const Block &like, int64_t ranks,
                               std::vector<Scratch> &keep) {
  std::vector<Block> spares;
  spares.push_back(spareBlock(kn, stream, like, keep));
  if (ranks > 2)
    spares.push_back(spareBlock(kn, stream, like, keep));
  return spares;
}

/// Enqueues the shift of `from` to the next rank, `to` receiving the previous rank's.
void shiftBlock(const RingTransport &ring, const Block &from, const Block &to,
                const std::string &what) {
  ring.shift(from.k.data, to.k.data, size_t(from.k.numel()), from.k.dtype, what + ", keys");
  ring.shift(from.v.data, to.v.data, size_t(from.v.numel()), from.v.dtype, what + ", values");
  if (from.segmented)
    ring.shift(from.segments.data, to.segments.data, size_t(from.segments.numel()),
               from.segments.dtype, what + ", segment ids");
}

void checkTransport(const char *kn, const RingTransport &ring) {
  if (ring.ranks < 2 || ring.rank < 0 || ring.rank >= ring.ranks)
    fail(kn, "rank " + std::to_string(ring.rank) + " of a ring of " +
                 std::to_string(ring.ranks) + " ranks is not a ring's rank (two or more ranks)");
  if (!ring.shift)
    fail(kn, "the ring's transport has no shift");
}

/// The rank whose block this rank holds at `step`.
int64_t holderAt(const RingTransport &ring, int64_t step) {
  return (ring.rank - step % ring.ranks + ring.ranks) % ring.ranks;
}

/// The forward steps into the fp32 state acc and lse.
void ringForward(const char *kn, const Context &ctx, const RingTransport &ring,
                 const TensorView &q, const TensorView &k, const TensorView &v,
                 const TensorView *segmentIds, bool causal, double scale, const TensorView &acc,
                 const TensorView &lse, std::vector<Scratch> &keep) {
  Block held = ownBlock(k, v, segmentIds);
  const std::vector<Block> spares = spareBlocks(kn, ctx.stream, held, ring.ranks, keep);
  Event ready(kn), arrived(kn);
  for (int64_t step = 0; step < ring.ranks; ++step) {
    const bool more = step + 1 < ring.ranks;
    const Block &incoming = spares[size_t(step) % spares.size()];
    if (more) {
      // The held block is written and the incoming buffer's last reader (the step before
      // last's kernels) enqueued before this point.
      ready.order(ctx.stream, ring.stream);
      shiftBlock(ring, held, incoming, "ring attention step " + std::to_string(step));
      arrived.record(ring.stream);
    }
    ringAttentionBlock(ctx, q, held.k, held.v, segmentIds, held.segmentIds(), causal, scale,
                       {ring.ranks, ring.rank, holderAt(ring, step)}, acc, lse);
    if (more) {
      arrived.waitOn(ctx.stream);
      held = incoming;
    }
  }
}

} // namespace

void ringAttention(const Context &ctx, const RingTransport &ring, const TensorView &q,
                   const TensorView &k, const TensorView &v, const TensorView *segmentIds,
                   bool causal, double scale, const TensorView &o, const TensorView *lse) {
  const char *kn = "ring attention";
  checkTransport(kn, ring);
  detail::checkSameShape(kn, "o", o, "q", q);
  std::vector<Scratch> keep;
  TensorView acc = scratchTensor(kn, ctx.stream, DType::F32, q.shape, keep);
  TensorView lseAcc = lse ? *lse
                          : scratchTensor(kn, ctx.stream, DType::F32,
                                          {q.dim(0), q.dim(2), q.dim(1)}, keep);
  ringForward(kn, ctx, ring, q, k, v, segmentIds, causal, scale, acc, lseAcc, keep);
  detail::castOnDevice(kn, ctx.stream, acc, o);
}

void ringAttentionGrad(const Context &ctx, const RingTransport &ring, const TensorView &dout,
                       const TensorView &q, const TensorView &k, const TensorView &v,
                       const TensorView &o, const TensorView *lse, const TensorView *segmentIds,
                       bool causal, double scale, const TensorView &dq, const TensorView &dk,
                       const TensorView &dv) {
  const char *kn = "ring attention grad";
  checkTransport(kn, ring);
  detail::checkSameShape(kn, "dq", dq, "q", q);
  detail::checkSameShape(kn, "dk", dk, "k", k);
  detail::checkSameShape(kn, "dv", dv, "v", v);
  std::vector<Scratch> keep;
  TensorView lseUsed;
  if (lse) {
    lseUsed = *lse;
  } else {
    // attention_grad keeps no lse: a forward pass around the ring recomputes it.
    lseUsed = scratchTensor(kn, ctx.stream, DType::F32, {q.dim(0), q.dim(2), q.dim(1)}, keep);
    TensorView acc = scratchTensor(kn, ctx.stream, DType::F32, q.shape, keep);
    ringForward(kn, ctx, ring, q, k, v, segmentIds, causal, scale, acc, lseUsed, keep);
  }
  TensorView dqAcc = scratchTensor(kn, ctx.stream, DType::F32, q.shape, keep);
  TensorView dkBlock = scratchTensor(kn, ctx.stream, DType::F32, k.shape, keep);
  TensorView dvBlock = scratchTensor(kn, ctx.stream, DType::F32, v.shape, keep);
  // The accumulators of the block held and those arriving with the next one.
  TensorView dkAcc[2], dvAcc[2];
  for (int i = 0; i < 2; ++i) {
    dkAcc[i] = scratchTensor(kn, ctx.stream, DType::F32, k.shape, keep);
    dvAcc[i] = scratchTensor(kn, ctx.stream, DType::F32, v.shape, keep);
  }
  Block held = ownBlock(k, v, segmentIds);
  const std::vector<Block> spares = spareBlocks(kn, ctx.stream, held, ring.ranks, keep);
  Event ready(kn), arrived(kn), added(kn), accArrived(kn);
  for (int64_t step = 0; step < ring.ranks; ++step) {
    const bool more = step + 1 < ring.ranks;
    const std::string what = "ring attention grad step " + std::to_string(step);
    const Block &incoming = spares[size_t(step) % spares.size()];
    if (more) {
      ready.order(ctx.stream, ring.stream);
      shiftBlock(ring, held, incoming, what);
      arrived.record(ring.stream);
    }
    ringAttentionBlockGrad(ctx, dout, q, held.k, held.v, o, lseUsed, segmentIds,
                           held.segmentIds(), causal, scale,
                           {ring.ranks, ring.rank, holderAt(ring, step)}, dqAcc, dkBlock, dvBlock);
    // The block's accumulators: this rank's first contribution at the first step; after it,
    // what the previous rank sent, plus this rank's.
    const TensorView &dkHeld = dkAcc[step % 2], &dvHeld = dvAcc[step % 2];
    if (step == 0) {
      checkCuda(cudaMemcpyAsync(dkHeld.data, dkBlock.data, dkBlock.bytes(),
                                cudaMemcpyDeviceToDevice, ctx.stream),
                "cudaMemcpyAsync", kn);
      checkCuda(cudaMemcpyAsync(dvHeld.data, dvBlock.data, dvBlock.bytes(),
                                cudaMemcpyDeviceToDevice, ctx.stream),
                "cudaMemcpyAsync", kn);
    } else {
      accArrived.waitOn(ctx.stream);
      add(ctx, dkHeld, dkBlock, dkHeld);
      add(ctx, dvHeld, dvBlock, dvHeld);
    }
    // Passed on behind the block; the last shift brings each block's accumulators home.
    added.order(ctx.stream, ring.stream);
    const TensorView &dkNext = dkAcc[(step + 1) % 2], &dvNext = dvAcc[(step + 1) % 2];
    ring.shift(dkHeld.data, dkNext.data, size_t(dkHeld.numel()), DType::F32, what + ", dk");
    ring.shift(dvHeld.data, dvNext.data, size_t(dvHeld.numel()), DType::F32, what + ", dv");
    accArrived.record(ring.stream);
    if (more) {
      arrived.waitOn(ctx.stream);
      held = incoming;
    }
  }
  accArrived.waitOn(ctx.stream);
  detail::castOnDevice(kn, ctx.stream, dqAcc, dq);
  detail::castOnDevice(kn, ctx.stream, dkAcc[ring.ranks % 2], dk);
  detail::castOnDevice(kn, ctx.stream, dvAcc[ring.ranks % 2], dv);
}

} // namespace bonsai::rt::cuda
