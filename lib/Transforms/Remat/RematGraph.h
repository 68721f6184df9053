//===- RematGraph.h - The forward graph as bonsai-remat sees it -*- C++ -*-===//
//
// Private to lib/Transforms (Remat.cpp and Remat/): which forward ops bonsai-remat may
// recompute, what a choice of dropped candidates implies, and how a recompute set is applied
// (docs/remat.md, "What is recomputed, and how"). Ops are named by their position among the
// forward ops of a function, which names them in a copy of the function as well.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_LIB_TRANSFORMS_REMAT_REMATGRAPH_H
#define BONSAI_LIB_TRANSFORMS_REMAT_REMATGRAPH_H

#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/SmallVector.h"

#include <vector>

namespace mlir::bonsai::remat {

/// The dialect's discardable attributes (BonsaiDialect.td says what each marks).
constexpr StringLiteral kPhaseAttr = BonsaiDialect::getPhaseAttrName();
constexpr StringLiteral kRecomputedAttr = BonsaiDialect::getRecomputedAttrName();
constexpr StringLiteral kRematSearchedAttr = BonsaiDialect::getRematSearchedAttrName();

/// Whether `op` belongs to the backward pass.
bool isBackward(Operation *op);

/// The forward ops of a model function (those without a phase), in block order. Their
/// positions in this list name them in a copy of the function as well.
SmallVector<Operation *> collectForwardOps(func::FuncOp function);

/// What the pass needs to know about the forward ops of one function. Ops are named by their
/// position in collectForwardOps' list.
struct ForwardGraph {
  SmallVector<Operation *> ops;
  /// Forward ops that read a result of each op.
  SmallVector<SmallVector<unsigned>> users;
  /// A backward op reads a result of the op: the value is saved for the backward pass.
  BitVector backwardUse;
  /// Ops that can be recomputed and are decided on: pure, costed kernels that are not views
  /// and whose results only forward and backward ops read (not the return, not the update).
  BitVector candidate;
  /// Views alias a buffer: `viewRoot` is the op that owns it (-1: a parameter, an argument or
  /// an op that is not forward). A view is recomputed exactly when its root is.
  BitVector isView;
  SmallVector<int> viewRoot;
  /// Block inputs (values a NormalizationOpInterface op normalises) and GEMM outputs.
  BitVector blockInput, gemm;
  /// Candidates that RecomputeOpInterface says are always recomputed (dequantized weights):
  /// every choice drops them.
  BitVector alwaysRecomputed;
  /// Forward FLOPs and result bytes of each op.
  SmallVector<int64_t> flops, bytes;
  /// The owners (see viewRoot) of each op's operands that forward ops own.
  SmallVector<SmallVector<unsigned>> operandRoots;
  /// FLOPs of the whole step as the function stands (forward, backward, update).
  int64_t stepFlops = 0;
  /// The function has a backward pass.
  bool hasBackward = false;

  unsigned size() const { return ops.size(); }

  /// The recompute set of a choice of dropped candidates (those not kept): every dropped
  /// value that a backward op or another recomputed op reads, and the views of those.
  BitVector resolve(const BitVector &dropped) const;
  /// FLOPs of recomputing `recompute` once.
  int64_t getFlops(const BitVector &recompute) const;
  /// Owners of buffers the backward pass reads, given `recompute`: read by a backward op or
  /// by a clone, directly or through a view.
  BitVector getSavedRoots(const BitVector &recompute) const;
  /// Candidate `c` with the candidates it is computed from, recursively, that are neither
  /// dropped nor in `savedRoots`: recomputing `c` alone would keep those alive.
  BitVector getChain(unsigned c, const BitVector &dropped, const BitVector &savedRoots) const;
  /// The candidates some choice recomputes: those recomputed when nothing is kept.
  BitVector getRelevant() const {
    BitVector relevant = resolve(candidate);
    relevant &= candidate;
    relevant.reset(alwaysRecomputed); // Not a choice.
    return relevant;
  }
};

/// Reads the forward graph of a function after bonsai-autodiff and bonsai-optimizer.
ForwardGraph analyzeForwardGraph(func::FuncOp function);

/// Clones the ops of `recompute` (positions in `forward`) into the backward pass, each right
/// before the first backward op or clone that reads it, in forward order where several go
/// before the same op; backward ops then read the clones. A clone with memory effects that
/// repeats a backward op (a parameter's share gathered again, which bonsai-shard already
/// gathers for the backward pass) replaces it, at the earlier of the two places. Returns how
/// many backward ops clones replaced.
unsigned applyRecompute(ArrayRef<Operation *> forward, const BitVector &recompute);

/// The candidates grouped by kind: same op, operand and result types and attributes, which
/// the same op of every repeated layer shares. Each group in forward order; groups in the
/// order of their first members.
std::vector<SmallVector<unsigned>> groupRepeated(const ForwardGraph &g,
                                                 ArrayRef<unsigned> candidates);

} // namespace mlir::bonsai::remat

#endif // BONSAI_LIB_TRANSFORMS_REMAT_REMATGRAPH_H
