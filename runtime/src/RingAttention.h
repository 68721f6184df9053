//===- RingAttention.h - ring attention on the CPU backend ----------------===//
//
// The ring of ring attention (docs/ring-attention.md) for the CPU backend: which rank's
// key/value block a rank holds at each step, the exchange around the ring through the host
// communicator, and the block steps of runtime/cpu/RingAttention.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_SRC_RINGATTENTION_H
#define BONSAI_RUNTIME_SRC_RINGATTENTION_H

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/KernelAttrs.h"
#include "bonsai/runtime/Tensor.h"

#include <string>

namespace bonsai::rt {

/// Each local token's index in the whole sequence for rank `rank` of a ring of `ranks`: the
/// zigzag layout's chunks `rank` and 2·ranks-1-rank of `localSeq / 2` tokens.
std::vector<int64_t> ringTokenIndices(int64_t localSeq, int64_t ranks, int64_t rank);

/// o (and lse, when non-null) of attention of this rank's queries against every rank's keys:
/// `ranks` block steps, the key/value block (and segment ids) passed to the next rank after
/// each but the last. The rings are the communicator's consecutive groups of `a.ringRanks`
/// ranks (its size a multiple of them: a data x ring grid).
void cpuRingAttention(Communicator &comm, const AttentionAttrs &a, const TensorView &q,
                      const TensorView &k, const TensorView &v, const TensorView *segmentIds,
                      const TensorView &o, const TensorView *lse, const std::string &context);

/// dq, dk, dv of ring attention from the forward's o and lse (null: recomputed by a forward
/// pass around the ring first). The key/value blocks travel as in the forward pass, each
/// with its dk and dv accumulators, which come home after `ranks` shifts.
void cpuRingAttentionGrad(Communicator &comm, const AttentionAttrs &a, const TensorView &dout,
                          const TensorView &q, const TensorView &k, const TensorView &v,
                          const TensorView &o, const TensorView *lse, const TensorView *segmentIds,
                          const TensorView &dq, const TensorView &dk, const TensorView &dv,
                          const std::string &context);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_SRC_RINGATTENTION_H
