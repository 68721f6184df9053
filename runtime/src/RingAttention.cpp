//===- RingAttention.cpp - ring attention on the CPU backend --------------===//
//
// Rank c of a ring of N holds the zigzag chunks c and 2N-1-c of every row. At step s it holds
// the key/value block of rank (c - s) mod N: ringShift passes each rank's block to the next
// (receiving from the previous), in the tensors' own dtype and grouped-query form. The
// backward pass sends each block's dk/dv accumulators (fp32) along with it; after N shifts
// they are home.
//
//===----------------------------------------------------------------------===//

#include "RingAttention.h"

#include "bonsai/runtime/CpuKernels.h"

#include <cstring>

namespace bonsai::rt {

std::vector<int64_t> ringTokenIndices(int64_t localSeq, int64_t ranks, int64_t rank) {
  const int64_t chunk = localSeq / 2;
  std::vector<int64_t> index(static_cast<size_t>(localSeq));
  for (int64_t i = 0; i < localSeq; ++i)
    index[size_t(i)] = i < chunk ? rank * chunk + i : (2 * ranks - 1 - rank) * chunk + (i - chunk);
  return index;
}

namespace {

/// What every ring kernel checks and derives from q, k, v and the communicator.
struct Ring {
  cpu::RingBlockShape shape;
  int64_t ranks = 0, rank = 0;
  std::vector<int64_t> queryIndex;
  /// Segment ids of the local rows, int64 [batch, seq]; empty: one segment.
  std::vector<int64_t> segments;

  Ring(Communicator &comm, const AttentionAttrs &a, const char *kernel, const TensorView &q,
       const TensorView &k, const TensorView *segmentIds) {
    auto fail = [&](const std::string &why) {
      throw Error(std::string(kernel) + " (ring of " + std::to_string(a.ringRanks) +
                  " ranks): " + why);
    };
    if (a.ringRanks < 2 || comm.size() % int(a.ringRanks) != 0)
      fail("the job's " + std::to_string(comm.size()) +
           " ranks do not form rings of that many (consecutive groups of " +
           std::to_string(a.ringRanks) + ")");
    if (q.rank() != 4 || k.rank() != 4 || k.dim(0) != q.dim(0) || k.dim(1) != q.dim(1) ||
        k.dim(3) != q.dim(3) || k.dim(2) <= 0 || q.dim(2) % k.dim(2) != 0)
      fail("q " + formatShape(q.shape) + " and k " + formatShape(k.shape) +
           " are not [batch, seq, heads, head_dim] with grouped key/value heads");
    if (q.dim(1) % 2 != 0)
      fail("the local sequence of " + std::to_string(q.dim(1)) +
           " tokens is not two equal zigzag chunks");
    shape = {q.dim(0), q.dim(1), q.dim(1), q.dim(2), k.dim(2), q.dim(3), a.causal, a.scale};
    ranks = a.ringRanks;
    rank = comm.rank() % int64_t(a.ringRanks);
    queryIndex = ringTokenIndices(shape.queries, ranks, rank);
    if (segmentIds) {
      if (segmentIds->rank() != 2 || segmentIds->dim(0) != shape.batch ||
          segmentIds->dim(1) != shape.queries ||
          (segmentIds->dtype != DType::I32 && segmentIds->dtype != DType::I64))
        fail("segment_ids " + formatShape(segmentIds->shape) + " is not i32/i64 [" +
             std::to_string(shape.batch) + ", " + std::to_string(shape.queries) + "]");
      segments.resize(size_t(segmentIds->numel()));
      for (size_t i = 0; i < segments.size(); ++i)
        segments[i] = segmentIds->dtype == DType::I64
                          ? static_cast<const int64_t *>(segmentIds->data)[i]
                          : static_cast<const int32_t *>(segmentIds->data)[i];
    }
  }

  /// The rank whose block this rank holds at step `step`.
  int64_t holder(int64_t step) const { return (rank - step % ranks + ranks) % ranks; }
};

/// The elements of `t` as fp32.
std::vector<float> toF32(const TensorView &t) {
  std::vector<float> values(size_t(t.numel()));
  loadF32(t, values.data());
  return values;
}

/// A key/value block in flight: its bytes in the tensors' dtype and its segment ids.
struct Block {
  TensorView k, v;
  std::vector<char> kBytes, vBytes;
  std::vector<int64_t> segments;

  Block(const TensorView &key, const TensorView &value, const std::vector<int64_t> &segs)
      : k(key), v(value), kBytes(key.bytes()), vBytes(value.bytes()), segments(segs) {
    std::memcpy(kBytes.data(), key.data, kBytes.size());
    std::memcpy(vBytes.data(), value.data, vBytes.size());
    k.data = kBytes.data();
    v.data = vBytes.data();
  }

  /// Passes the block to the next rank of this rank's ring (of `ring` ranks) and takes the
  /// previous rank's.
  void shift(Communicator &comm, int ring, const std::string &context) {
    comm.ringShift(kBytes.data(), kBytes.data(), size_t(k.numel()), k.dtype, context + ", keys",
                   ring);
    comm.ringShift(vBytes.data(), vBytes.data(), size_t(v.numel()), v.dtype, context + ", values",
                   ring);
    if (!segments.empty())
      comm.ringShift(segments.data(), segments.data(), segments.size(), DType::I64,
                     context + ", segment ids", ring);
  }
};

cpu::RingBlockTokens tokens(const Ring &ring, const std::vector<int64_t> &keyIndex,
                            const Block &block) {
  return {ring.queryIndex.data(), keyIndex.data(),
          ring.segments.empty() ? nullptr : ring.segments.data(),
          block.segments.empty() ? nullptr : block.segments.data()};
}

} // namespace

void cpuRingAttention(Communicator &comm, const AttentionAttrs &a, const TensorView &q,
                      const TensorView &k, const TensorView &v, const TensorView *segmentIds,
                      const TensorView &o, const TensorView *lse, const std::string &context) {
  Ring ring(comm, a, lse ? "flash_attention" : "attention", q, k, segmentIds);
  const std::vector<float> qs = toF32(q);
  Block block(k, v, ring.segments);
  cpu::RingAttentionState state(ring.shape);
  for (int64_t step = 0; step < ring.ranks; ++step) {
    if (step > 0)
      block.shift(comm, int(ring.ranks), context);
    std::vector<int64_t> keyIndex =
        ringTokenIndices(ring.shape.keys, ring.ranks, ring.holder(step));
    std::vector<float> ks = toF32(block.k), vs = toF32(block.v);
    cpu::ringAttentionBlock(ring.shape, tokens(ring, keyIndex, block), qs.data(), ks.data(),
                            vs.data(), state);
  }
  std::vector<float> os(size_t(o.numel())),
      lses(size_t(ring.shape.batch * ring.shape.heads * ring.shape.queries));
  cpu::ringAttentionFinish(ring.shape, state, os.data(), lses.data());
  storeF32(os.data(), o);
  if (lse)
    storeF32(lses.data(), *lse);
}

void cpuRingAttentionGrad(Communicator &comm, const AttentionAttrs &a, const TensorView &dout,
                          const TensorView &q, const TensorView &k, const TensorView &v,
                          const TensorView &o, const TensorView *lse, const TensorView *segmentIds,
                          const TensorView &dq, const TensorView &dk, const TensorView &dv,
                          const std::string &context) {
  Ring ring(comm, a, lse ? "flash_attention_grad" : "attention_grad", q, k, segmentIds);
  const cpu::RingBlockShape &s = ring.shape;
  const size_t rows = size_t(s.batch * s.heads * s.queries);
  // attention_grad keeps no lse: a forward pass around the ring recomputes it.
  std::vector<float> lses(rows);
  if (lse) {
    loadF32(*lse, lses.data());
  } else {
    std::vector<float> scratch(size_t(q.numel()));
    TensorView oAgain{scratch.data(), DType::F32, q.shape};
    TensorView lseView{lses.data(), DType::F32, {s.batch, s.heads, s.queries}};
    cpuRingAttention(comm, a, q, k, v, segmentIds, oAgain, &lseView, context + ", its lse");
  }
  const std::vector<float> qs = toF32(q), dos = toF32(dout), os = toF32(o);
  // delta = Σ dO·O per row, [batch, heads, queries] as the lse.
  std::vector<double> delta(rows, 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.queries; ++i)
      for (int64_t h = 0; h < s.heads; ++h) {
        size_t at = size_t(((b * s.queries + i) * s.heads + h) * s.headDim);
        double sum = 0.0;
        for (int64_t e = 0; e < s.headDim; ++e)
          sum += double(dos[at + size_t(e)]) * double(os[at + size_t(e)]);
        delta[size_t((b * s.heads + h) * s.queries + i)] = sum;
      }
  Block block(k, v, ring.segments);
  std::vector<double> dqAcc(size_t(q.numel()), 0.0);
  std::vector<float> dkAcc(size_t(k.numel()), 0.0f), dvAcc(size_t(v.numel()), 0.0f);
  for (int64_t step = 0; step < ring.ranks; ++step) {
    if (step > 0) {
      block.shift(comm, int(ring.ranks), context);
      comm.ringShift(dkAcc.data(), dkAcc.data(), dkAcc.size(), DType::F32, context + ", dk",
                     int(ring.ranks));
      comm.ringShift(dvAcc.data(), dvAcc.data(), dvAcc.size(), DType::F32, context + ", dv",
                     int(ring.ranks));
    }
    std::vector<int64_t> keyIndex = ringTokenIndices(s.keys, ring.ranks, ring.holder(step));
    std::vector<float> ks = toF32(block.k), vs = toF32(block.v);
    cpu::ringAttentionBlockGrad(s, tokens(ring, keyIndex, block), dos.data(), qs.data(), ks.data(),
                                vs.data(), lses.data(), delta.data(), dqAcc.data(), dkAcc.data(),
                                dvAcc.data());
  }
  // The last shift brings each block's accumulators back to the rank that owns it.
  comm.ringShift(dkAcc.data(), dkAcc.data(), dkAcc.size(), DType::F32, context + ", dk",
                 int(ring.ranks));
  comm.ringShift(dvAcc.data(), dvAcc.data(), dvAcc.size(), DType::F32, context + ", dv",
                 int(ring.ranks));
  std::vector<float> dqs(dqAcc.begin(), dqAcc.end());
  storeF32(dqs.data(), dq);
  storeF32(dkAcc.data(), dk);
  storeF32(dvAcc.data(), dv);
}

} // namespace bonsai::rt
