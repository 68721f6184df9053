//===- RematGraph.cpp - The forward graph as bonsai-remat sees it ---------===//
//
// See RematGraph.h.
//
//===----------------------------------------------------------------------===//

#include "RematGraph.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::bonsai::remat {

bool isBackward(Operation *op) {
  auto phase = op->getAttrOfType<StringAttr>(kPhaseAttr);
  return phase && phase.getValue() == "backward";
}

SmallVector<Operation *> collectForwardOps(func::FuncOp function) {
  SmallVector<Operation *> forward;
  for (Operation &op : function.getBody().front().without_terminator())
    if (!op.hasAttr(kPhaseAttr))
      forward.push_back(&op);
  return forward;
}

namespace {
/// Whether `user`, an op of the update phase, reads only results of `op` that no backward op
/// reads: the FP8 statistics a scale update takes from a forward GEMM (docs/fp8.md). Such a
/// reader does not pin `op`: recomputing it for the backward leaves the update reading the
/// forward's small result, while the results the backward reads are recomputed.
bool readsOnlySideResults(Operation *op, Operation *user) {
  auto phase = user->getAttrOfType<StringAttr>(kPhaseAttr);
  if (!phase || phase.getValue() != "update")
    return false;
  return llvm::none_of(op->getResults(), [&](OpResult result) {
    return llvm::is_contained(user->getOperands(), result) &&
           llvm::any_of(result.getUsers(), isBackward);
  });
}
} // namespace

ForwardGraph analyzeForwardGraph(func::FuncOp function) {
  ForwardGraph g;
  g.ops = collectForwardOps(function);
  unsigned n = g.ops.size();
  llvm::DenseMap<Operation *, unsigned> index;
  for (auto [i, op] : llvm::enumerate(g.ops))
    index[op] = i;
  g.users.resize(n);
  g.backwardUse.resize(n);
  g.candidate.resize(n);
  g.isView.resize(n);
  g.viewRoot.assign(n, -1);
  g.blockInput.resize(n);
  g.gemm.resize(n);
  g.alwaysRecomputed.resize(n);
  g.flops.assign(n, 0);
  g.bytes.assign(n, 0);
  g.operandRoots.resize(n);
  BitVector pinned(n);

  // The op that owns the buffer of `v`, through views; -1 if no forward op does.
  auto rootOf = [&](Value v) -> int {
    auto it = index.find(v.getDefiningOp());
    if (!v.getDefiningOp() || it == index.end())
      return -1;
    return g.isView.test(it->second) ? g.viewRoot[it->second] : int(it->second);
  };

  for (auto [i, op] : llvm::enumerate(g.ops)) {
    for (Operation *user : op->getUsers()) {
      if (auto it = index.find(user); it != index.end())
        g.users[i].push_back(it->second);
      else if (isBackward(user))
        g.backwardUse.set(i);
      else if (!readsOnlySideResults(op, user))
        pinned.set(i); // The return (the loss), an update, a metric: left as they are.
    }
    for (Value result : op->getResults())
      if (auto type = dyn_cast<RankedTensorType>(result.getType()))
        g.bytes[i] += getStorageBytes(type);
    for (Value operand : op->getOperands())
      if (int root = rootOf(operand); root >= 0)
        g.operandRoots[i].push_back(root);
    if (auto view = dyn_cast<ViewLikeOpInterface>(op)) {
      g.isView.set(i);
      g.viewRoot[i] = rootOf(view.getViewSource());
      continue;
    }
    if (auto norm = dyn_cast<NormalizationOpInterface>(op))
      if (int root = rootOf(norm.getNormalizedInput()); root >= 0)
        g.blockInput.set(root);
    auto cost = dyn_cast<CostOpInterface>(op);
    if (!cost)
      continue;
    OpCost forward = cost.getForwardCost();
    g.flops[i] = forward.totalFlops();
    g.gemm[i] = forward.matmulFlops > 0;
  }
  // A pinned view pins the buffer it aliases.
  for (unsigned i = 0; i < n; ++i)
    if (g.isView.test(i) && pinned.test(i) && g.viewRoot[i] >= 0)
      pinned.set(g.viewRoot[i]);
  // An op RecomputeOpInterface always recomputes may have memory effects (a gather of a
  // parameter's share): the interface vouches that running it again gives the same result.
  auto alwaysRecomputed = [](Operation *op) {
    auto recompute = dyn_cast<RecomputeOpInterface>(op);
    return recompute && recompute.isAlwaysRecomputed();
  };
  for (auto [i, op] : llvm::enumerate(g.ops)) {
    g.candidate[i] = !g.isView.test(i) && !pinned.test(i) && isa<CostOpInterface>(op) &&
                     isa<KernelOpInterface>(op) && op->getNumRegions() == 0 &&
                     (isMemoryEffectFree(op) || alwaysRecomputed(op));
    g.alwaysRecomputed[i] = g.candidate[i] && alwaysRecomputed(op);
  }

  for (Operation &op : function.getBody().front()) {
    g.hasBackward |= isBackward(&op);
    if (auto cost = dyn_cast<CostOpInterface>(op))
      g.stepFlops += cost.getForwardCost().totalFlops();
  }
  return g;
}

BitVector ForwardGraph::resolve(const BitVector &dropped) const {
  unsigned n = size();
  BitVector recompute(n);
  // Users come after their operands: walking backwards, every user's decision is known.
  for (unsigned i = n; i-- > 0;) {
    int owner = isView.test(i) ? viewRoot[i] : int(i);
    if (owner < 0 || !candidate.test(owner) ||
        !(dropped.test(owner) || alwaysRecomputed.test(owner)))
      continue;
    if (backwardUse.test(i) ||
        llvm::any_of(users[i], [&](unsigned user) { return recompute.test(user); }))
      recompute.set(i);
  }
  return recompute;
}

BitVector ForwardGraph::getSavedRoots(const BitVector &recompute) const {
  BitVector saved(size());
  for (unsigned i = 0; i < size(); ++i) {
    int owner = isView.test(i) ? viewRoot[i] : int(i);
    if (owner >= 0 && (backwardUse.test(i) ||
                       llvm::any_of(users[i], [&](unsigned user) { return recompute.test(user); })))
      saved.set(owner);
  }
  return saved;
}

BitVector ForwardGraph::getChain(unsigned c, const BitVector &dropped,
                                 const BitVector &savedRoots) const {
  BitVector chain(size());
  chain.set(c);
  SmallVector<unsigned> work{c};
  while (!work.empty()) {
    unsigned x = work.pop_back_val();
    for (unsigned root : operandRoots[x]) {
      if (!candidate.test(root) || dropped.test(root) || alwaysRecomputed.test(root) ||
          chain.test(root) || savedRoots.test(root))
        continue;
      chain.set(root);
      work.push_back(root);
    }
  }
  return chain;
}

int64_t ForwardGraph::getFlops(const BitVector &recompute) const {
  int64_t total = 0;
  for (unsigned i : recompute.set_bits())
    total += flops[i];
  return total;
}

//===----------------------------------------------------------------------===//
// Applying a recompute set
//===----------------------------------------------------------------------===//

/// Clones the ops of `recompute` (positions in `forward`) into the backward pass, each right
/// before the first backward op or clone that reads it, in forward order where several go
/// before the same op; backward ops then read the clones, and a clone that repeats a backward
/// op replaces it. Returns how many backward ops clones replaced.
unsigned applyRecompute(ArrayRef<Operation *> forward, const BitVector &recompute) {
  if (recompute.none())
    return 0;
  MLIRContext *ctx = forward.front()->getContext();
  // Where each clone goes, from the last recomputed op to the first: a clone must precede
  // its backward readers and the clones that read it.
  llvm::DenseMap<Operation *, Operation *> anchor;
  for (unsigned i = forward.size(); i-- > 0;) {
    if (!recompute.test(i))
      continue;
    Operation *first = nullptr;
    auto consider = [&](Operation *op) {
      if (!first || op->isBeforeInBlock(first))
        first = op;
    };
    for (Operation *user : forward[i]->getUsers()) {
      if (isBackward(user))
        consider(user);
      else if (Operation *userAnchor = anchor.lookup(user))
        consider(userAnchor);
    }
    assert(first && "a recomputed op has a backward reader");
    anchor[forward[i]] = first;
  }

  OpBuilder builder(ctx);
  IRMapping mapping;
  StringAttr backward = StringAttr::get(ctx, "backward");
  SmallVector<Operation *> clones;
  for (unsigned i : recompute.set_bits()) {
    Operation *op = forward[i];
    builder.setInsertionPoint(anchor.lookup(op));
    Operation *clone = builder.clone(*op, mapping);
    clone->setAttr(kPhaseAttr, backward);
    clone->setAttr(kRecomputedAttr, UnitAttr::get(ctx));
    clones.push_back(clone);
  }
  for (unsigned i : recompute.set_bits())
    for (Value result : forward[i]->getResults())
      result.replaceUsesWithIf(mapping.lookup(result), [](OpOperand &use) {
        return isBackward(use.getOwner()) && !use.getOwner()->hasAttr(kRecomputedAttr);
      });

  // A clone that reads and writes memory (a gather of a parameter's share) may repeat a
  // backward op on the same operands: bonsai-shard gathers a parameter again for its backward
  // readers, and a recomputed forward op of the same weight would gather it a second time. One
  // of the two is enough: the clone stays, at the earlier of the two places, so that as a
  // recomputed op bonsai-fuse knows it for the forward value it repeats and drops it if fusion
  // leaves it unread. Both are backward ops, so their discardable attributes (the phase, the
  // clone's mark) say nothing more. (Pure clones repeat nothing the unrecomputed step has.)
  auto repeats = [](Operation *clone, Operation *op) {
    return op != clone && isBackward(op) &&
           OperationEquivalence::isEquivalentTo(clone, op, OperationEquivalence::exactValueMatch,
                                                /*markEquivalent=*/nullptr,
                                                OperationEquivalence::IgnoreLocations |
                                                    OperationEquivalence::IgnoreDiscardableAttrs);
  };
  unsigned replaced = 0;
  for (Operation *clone : clones) {
    if (isMemoryEffectFree(clone) || clone->getNumOperands() == 0)
      continue;
    Operation *twin = nullptr;
    for (Operation *user : clone->getOperand(0).getUsers())
      if (repeats(clone, user)) {
        twin = user;
        break;
      }
    if (!twin)
      continue;
    // The operands precede both (the twin reads them), so the clone may move up to the twin.
    if (twin->isBeforeInBlock(clone))
      clone->moveBefore(twin);
    twin->replaceAllUsesWith(clone);
    twin->erase();
    ++replaced;
  }
  return replaced;
}

/// The candidates grouped by kind: same op, operand and result types and attributes, which
/// the same op of every repeated layer shares. Each group in forward order; groups in the
/// order of their first members.
std::vector<SmallVector<unsigned>> groupRepeated(const ForwardGraph &g,
                                                 ArrayRef<unsigned> candidates) {
  llvm::MapVector<llvm::hash_code, SmallVector<unsigned>> bySignature;
  for (unsigned c : candidates) {
    Operation *op = g.ops[c];
    llvm::hash_code signature = llvm::hash_combine(
        op->getName(), llvm::hash_combine_range(op->getResultTypes()),
        llvm::hash_combine_range(op->getOperandTypes()), op->getAttrDictionary());
    bySignature[signature].push_back(c);
  }
  std::vector<SmallVector<unsigned>> groups;
  for (auto &[signature, members] : bySignature)
    groups.push_back(std::move(members));
  return groups;
}

} // namespace mlir::bonsai::remat
