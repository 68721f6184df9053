//===- PeakModel.h - bonsai-remat's peak model ------------------*- C++ -*-===//
//
// Private to lib/Transforms: the live bytes of a training step's per-step buffers at every
// op, for any recompute set, without cloning, lowering or planning (docs/remat.md, "The peak
// model"), and what it reads off one real plan: which values the fused plan materialises.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_LIB_TRANSFORMS_REMAT_PEAKMODEL_H
#define BONSAI_LIB_TRANSFORMS_REMAT_PEAKMODEL_H

#include "RematGraph.h"

#include "bonsai/Dialect/Plan/IR/PlanDialect.h"

#include <functional>

namespace mlir::bonsai::remat {

/// The ops of a function body, terminator included: their indices are the positions the
/// peak model counts in.
SmallVector<Operation *> collectPositions(func::FuncOp function);

/// Tags every op of `copy` (a copy of the function a model is for) with its position, in its
/// location: lowering gives each buffer the location of the op that computes it, and fusion a
/// fused location of the ops it replaced, so the plan made from the copy says which buffer
/// holds what. Clones made afterwards keep their original's location, so its tag.
void tagPositions(func::FuncOp copy);

/// What the fused, lowered plan of a step keeps in per-step buffers, by op of the unfused
/// function it was made from: fusion leaves some values without a buffer (the LM head's
/// logits, the inside of an elementwise chain, the gradients a fused backward never writes
/// out) and adds others (workspaces, a flash kernel's log-sum-exp).
struct Materialization {
  /// Bytes of the buffer of each result of the op at each position; 0: the plan has none.
  SmallVector<SmallVector<int64_t, 1>> resultBytes;
  /// Buffers that no result of the ops they came from accounts for: bytes, and the position
  /// of the last of those ops, where the model counts them live for one op.
  SmallVector<std::pair<unsigned, int64_t>> extras;
};

/// Reads a plan made from a copy of `function` whose ops were tagged with their positions
/// (tagPositions).
Materialization readMaterialization(func::FuncOp function, plan::StepOp step);

/// The live bytes of a step's per-step buffers at every op of the joint function, for any
/// recompute set, without cloning, lowering or planning: the liveness the planner will see,
/// from the unfused function and what one fused trial plan materialises. Values no recompute
/// set changes (backward and update ops, extras) are summed once; the forward values are
/// re-timed for each set: a recomputed value lives from its op to its last forward reader,
/// and again, as its clone, from where applyRecompute puts the clone to its last backward
/// reader; a kept value read by a clone lives until that clone runs. A clone is counted live
/// from its anchor op on, as if it ran there (clones at one anchor run one after another,
/// just before it). What the model leaves out (the planner's fragmentation, persistent
/// arenas, inputs) is measured by calibrating it against real plans (searchGreedy).
class PeakModel {
public:
  PeakModel(func::FuncOp function, const ForwardGraph &g, const Materialization &m);

  /// Live bytes at every position with `recompute` applied, and the results of `offloaded`
  /// (kept forward ops; by default those offloadOf chooses) in host memory between the
  /// passes: on the device from the op until its last forward reader or the next offloaded
  /// value's op (bonsai-schedule keeps a copy's source from reuse until the next copy out),
  /// and again from the previous offloaded value's first backward reader (bonsai-schedule
  /// issues a copy back one group of copies ahead) until its last backward reader.
  void getProfile(const BitVector &recompute, SmallVectorImpl<int64_t> &live,
                  const BitVector *offloaded = nullptr) const;
  /// The largest live total.
  int64_t getPeak(const BitVector &recompute, const BitVector *offloaded = nullptr) const;
  /// The live bytes above `budget`, summed over positions: 0 when the set fits.
  int64_t getExcess(const BitVector &recompute, int64_t budget,
                    const BitVector *offloaded = nullptr) const;
  unsigned getNumPositions() const { return numPositions; }

  /// Makes the profiles offload activations as bonsai-offload-activations does with a
  /// budget of `bytes`: of the values `candidates` returns for a recompute set, the longest
  /// stays between the passes first, while they fit in the bytes. Without it, nothing is
  /// offloaded unless a set is given.
  void setOffloadChoice(std::function<BitVector(const BitVector &)> candidates, int64_t bytes) {
    offloadCandidates = std::move(candidates);
    offloadBytes = bytes;
  }
  /// The values offloaded with `recompute` and an offload budget of `bytes`, as
  /// setOffloadChoice says; with their stays, longest first.
  SmallVector<std::pair<int64_t, unsigned>> getOffloaded(const BitVector &recompute,
                                                         int64_t bytes) const;
  BitVector getOffloadedSet(const BitVector &recompute, int64_t bytes) const;
  /// Bytes of the buffers of `op`'s results.
  int64_t getBytes(unsigned op) const {
    int64_t bytes = 0;
    for (unsigned v : valuesOf[op])
      bytes += values[v].bytes;
    return bytes;
  }

private:
  const ForwardGraph &g;
  unsigned numPositions = 0;
  /// Difference array of what no recompute set changes.
  SmallVector<int64_t> fixed;
  /// Each forward op's position.
  SmallVector<unsigned> position;
  /// Each forward op's anchor when nothing it reads is recomputed: its first backward
  /// reader's position (numPositions if none).
  SmallVector<unsigned> firstBackwardRead;
  /// The values of forward ops that own a buffer (views alias their source's value).
  struct ForwardValue {
    unsigned op;
    int64_t bytes;
    /// Last position that reads it outside the backward pass (its own position if none),
    /// last position in the backward pass (0 if none), and last of all.
    unsigned lastForwardRead, lastBackwardRead, lastRead;
    /// Forward ops that read it (directly or through views) and are not views: their clones
    /// read it at their anchors.
    SmallVector<unsigned, 4> readers;
    /// First position in the backward pass that reads it, through views (numPositions if
    /// none).
    unsigned firstBackwardRead;
  };
  SmallVector<ForwardValue> values;
  /// The values with a buffer in the calibration plan (bytes > 0): the only ones a profile
  /// counts, a fraction of all on fused plans.
  SmallVector<unsigned> materialized;
  /// Per forward op, the values it owns.
  SmallVector<SmallVector<unsigned, 1>> valuesOf;
  std::function<BitVector(const BitVector &)> offloadCandidates;
  int64_t offloadBytes = 0;

  /// Anchors of the clones of `recompute`, as applyRecompute places them.
  SmallVector<unsigned> getAnchors(const BitVector &recompute) const;
  /// getOffloaded with the anchors of `recompute` already computed.
  SmallVector<std::pair<int64_t, unsigned>> getOffloaded(const BitVector &recompute, int64_t bytes,
                                                         ArrayRef<unsigned> anchor) const;
  /// Where the backward pass first reads `value`: a backward reader, or the anchor of the
  /// first clone (of `recompute`, anchored at `anchor`) that reads it.
  unsigned getFirstBackwardRead(const ForwardValue &value, const BitVector &recompute,
                                ArrayRef<unsigned> anchor) const;

  void addInterval(SmallVectorImpl<int64_t> &diff, unsigned from, unsigned to,
                   int64_t bytes) const {
    diff[from] += bytes;
    diff[std::max(from, to) + 1] -= bytes;
  }
};

} // namespace mlir::bonsai::remat

#endif // BONSAI_LIB_TRANSFORMS_REMAT_PEAKMODEL_H
