//===- FusionUtils.cpp - Helpers shared by the fusion families -------------===//
//
// See FusionUtils.h.
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "mlir/IR/Block.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::bonsai::fusion {

SmallVector<NamedAttribute> getInherentAttrs(Operation *op) {
  SmallVector<NamedAttribute> attrs;
  for (NamedAttribute attr : op->getAttrs())
    if (!attr.getName().getValue().starts_with("bonsai."))
      attrs.push_back(attr);
  return attrs;
}

namespace {
/// isSameValue with the pairs already found equal: a clone chain is a DAG (the residual
/// stream feeds both operands of every residual add), and without them the walk would follow
/// every path through it, 2^layers of them for a fully recomputed model.
bool isSameValue(Value original, Value candidate, llvm::DenseSet<std::pair<Value, Value>> &equal) {
  if (original == candidate || equal.contains({original, candidate}))
    return true;
  auto a = dyn_cast<OpResult>(original), b = dyn_cast<OpResult>(candidate);
  if (!a || !b || a.getResultNumber() != b.getResultNumber())
    return false;
  Operation *orig = a.getOwner(), *clone = b.getOwner();
  if (!clone->hasAttr(kRecomputedAttr) || orig->getName() != clone->getName() ||
      orig->getNumOperands() != clone->getNumOperands() ||
      getInherentAttrs(orig) != getInherentAttrs(clone))
    return false;
  for (auto [x, y] : llvm::zip(orig->getOperands(), clone->getOperands()))
    if (!isSameValue(x, y, equal))
      return false;
  equal.insert({original, candidate});
  return true;
}
} // namespace

bool isSameValue(Value original, Value candidate) {
  llvm::DenseSet<std::pair<Value, Value>> equal;
  return isSameValue(original, candidate, equal);
}

void copyAnnotations(Operation *from, Operation *to) {
  for (NamedAttribute attr : from->getDiscardableAttrs())
    if (attr.getName().getValue().starts_with("bonsai."))
      to->setAttr(attr.getName(), attr.getValue());
}

int64_t elementsOf(Value value) { return cast<RankedTensorType>(value.getType()).getNumElements(); }

StringRef getPhase(Operation *op) {
  if (auto phase = op->getAttrOfType<StringAttr>(kPhaseAttr))
    return phase.getValue();
  return "";
}

bool sameSchedule(Operation *a, Operation *b) {
  return getPhase(a) == getPhase(b) && a->hasAttr(kRecomputedAttr) == b->hasAttr(kRecomputedAttr);
}

void eraseDeadClones(RewriterBase &rewriter, Operation *op) {
  SmallVector<Operation *> worklist = {op};
  llvm::SmallPtrSet<Operation *, 8> erased;
  while (!worklist.empty()) {
    Operation *next = worklist.pop_back_val();
    if (!next || erased.contains(next) || !next->use_empty())
      continue;
    for (Value v : next->getOperands())
      if (Operation *def = v.getDefiningOp(); def && def->hasAttr(kRecomputedAttr))
        worklist.push_back(def);
    erased.insert(next);
    rewriter.eraseOp(next);
  }
}

bool allUsersAfter(Value value, Operation *op) {
  for (Operation *user : value.getUsers()) {
    Operation *ancestor = op->getBlock()->findAncestorOpInBlock(*user);
    if (ancestor && ancestor != op && ancestor->isBeforeInBlock(op))
      return false;
  }
  return true;
}

bool isDefinedBefore(Value value, Operation *op) {
  if (auto arg = dyn_cast<BlockArgument>(value))
    return arg.getOwner()->findAncestorOpInBlock(*op) != nullptr;
  Operation *def = value.getDefiningOp();
  if (def->getBlock() != op->getBlock())
    return def->getBlock()->findAncestorOpInBlock(*op) != nullptr;
  return def->isBeforeInBlock(op);
}

bool mayWrite(Operation *op, Value value) {
  if (auto kernel = dyn_cast<KernelOpInterface>(op))
    return llvm::any_of(kernel.getInPlaceOperands(),
                        [&](unsigned i) { return op->getOperand(i) == value; });
  return !isMemoryEffectFree(op) && llvm::is_contained(op->getOperands(), value);
}

} // namespace mlir::bonsai::fusion
