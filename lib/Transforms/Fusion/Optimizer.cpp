//===- Optimizer.cpp - Fusion family `optimizer` --------------------------===//
//
// The optimizer as one multi-tensor kernel. After bonsai-optimizer, the update phase holds
// one update per parameter, all reading the same step, learning rate and gradient norm with
// the same hyper-parameters. This family groups the update-phase updates that agree on all of
// that and on their storage types (MultiTensorUpdateOpInterface says what each update shares
// and builds the multi-tensor op), and replaces each group of two or more by one op, which
// the runtime runs as one launch instead of one per parameter.
//
// The multi-tensor op takes the place of the group's first update. Moving a later update up
// to it is legal when no op in between touches what that update reads or writes; operands
// defined in between by ops without operands (the bonsai.state declarations of its moments)
// are declared earlier. Updates applied in the backward pass (the recipe's
// update_in_backward) stay per parameter: each runs as soon as its gradient is complete,
// which is their point.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "bonsai-fuse-optimizer"

namespace mlir::bonsai {
namespace {

/// What updates must agree on to share one multi-tensor op.
struct GroupKey {
  OperationName name;
  SmallVector<Value> shared;
  DictionaryAttr hyperParameters;
  SmallVector<Type> elementTypes; ///< of the tensor operands, in order (their count included)

  bool operator==(const GroupKey &other) const {
    return name == other.name && shared == other.shared &&
           hyperParameters == other.hyperParameters && elementTypes == other.elementTypes;
  }
};

GroupKey keyOf(MultiTensorUpdateOpInterface update) {
  GroupKey key{update->getName(), update.getSharedOperands(), update.getHyperParameters(), {}};
  for (Value v : update.getTensorOperands())
    key.elementTypes.push_back(cast<ShapedType>(v.getType()).getElementType());
  return key;
}

/// The operands `op` writes: its in-place operands when it is a kernel, none when it has no
/// memory effects, and (conservatively) all of them otherwise.
llvm::DenseSet<Value> writtenOperands(Operation *op) {
  llvm::DenseSet<Value> written;
  if (auto kernel = dyn_cast<KernelOpInterface>(op)) {
    for (unsigned i : kernel.getInPlaceOperands())
      written.insert(op->getOperand(i));
  } else if (!isMemoryEffectFree(op)) {
    written.insert(op->operand_begin(), op->operand_end());
  }
  return written;
}

/// Whether `op` may be moved up to just before `anchor`. Its operands defined between the two
/// by operand-free ops are added to `hoist` (declarations to move up first); anything else
/// defined in between forbids it, and so does an op in between (other than `movedUp` and
/// `hoist`) that uses a value `op` writes or writes a value `op` reads: that op would see the
/// update's writes too early, or the update would read before that op's writes.
bool canMoveUpTo(Operation *op, Operation *anchor, const llvm::DenseSet<Operation *> &movedUp,
                 llvm::SetVector<Operation *> &hoist) {
  SmallVector<Operation *> declarations;
  for (Value operand : op->getOperands()) {
    Operation *def = operand.getDefiningOp();
    if (!def || def->getBlock() != anchor->getBlock() || def->isBeforeInBlock(anchor))
      continue;
    if (def->getNumOperands() != 0 || def->getNumRegions() != 0) {
      LLVM_DEBUG(llvm::dbgs() << "optimizer fusion: " << *op << " reads " << *def
                              << ", computed after the group's first update\n");
      return false;
    }
    declarations.push_back(def);
  }
  llvm::DenseSet<Value> operands(op->operand_begin(), op->operand_end());
  llvm::DenseSet<Value> written = writtenOperands(op);
  for (Operation *between = anchor->getNextNode(); between != op;
       between = between->getNextNode()) {
    if (movedUp.contains(between) || llvm::is_contained(declarations, between) ||
        hoist.contains(between))
      continue;
    llvm::DenseSet<Value> writtenThere = writtenOperands(between);
    for (Value used : between->getOperands())
      if (written.contains(used) || (operands.contains(used) && writtenThere.contains(used))) {
        LLVM_DEBUG(llvm::dbgs() << "optimizer fusion: " << *between << " and " << *op
                                << " conflict on an operand\n");
        return false;
      }
  }
  hoist.insert(declarations.begin(), declarations.end());
  return true;
}

/// Groups and fuses the update-phase updates of `block`.
void fuseBlock(Block &block, const FusionOptions &options) {
  StringAttr updatePhase = StringAttr::get(block.getParentOp()->getContext(), "update");
  SmallVector<std::pair<GroupKey, SmallVector<MultiTensorUpdateOpInterface>>> groups;
  for (Operation &op : block) {
    auto update = dyn_cast<MultiTensorUpdateOpInterface>(op);
    if (!update || op.getAttrOfType<StringAttr>(BonsaiDialect::getPhaseAttrName()) != updatePhase)
      continue;
    GroupKey key = keyOf(update);
    auto found = llvm::find_if(groups, [&](const auto &g) { return g.first == key; });
    if (found == groups.end())
      groups.push_back({std::move(key), {update}});
    else
      found->second.push_back(update);
  }

  for (auto &[key, updates] : groups) {
    if (updates.size() < 2)
      continue;
    Operation *anchor = updates.front();
    llvm::DenseSet<Operation *> movedUp = {anchor};
    llvm::SetVector<Operation *> hoist;
    SmallVector<Operation *> members = {anchor};
    for (MultiTensorUpdateOpInterface update : ArrayRef(updates).drop_front())
      if (canMoveUpTo(update, anchor, movedUp, hoist)) {
        members.push_back(update);
        movedUp.insert(update);
      }
    if (members.size() < 2)
      continue;
    // Declarations keep their relative order above the anchor.
    SmallVector<Operation *> declarations(hoist.begin(), hoist.end());
    llvm::sort(declarations, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    for (Operation *declaration : declarations)
      declaration->moveBefore(anchor);

    OpBuilder builder(anchor);
    Operation *fused = updates.front().buildMultiTensorUpdate(builder, members);
    fused->setAttr(BonsaiDialect::getPhaseAttrName(), updatePhase);
    for (Operation *member : members)
      member->erase();
    options.fused(fused, (Twine("multi-tensor ") + key.name.stripDialect() + " (" +
                          Twine(members.size()) + " tensors)")
                             .str());
  }
}

} // namespace

LogicalResult fuseOptimizerUpdates(FunctionOpInterface function, const FusionOptions &options) {
  for (Block &block : function.getFunctionBody())
    fuseBlock(block, options);
  return success();
}

} // namespace mlir::bonsai
