//===- Elementwise.cpp - Chains of elementwise ops become one kernel ------===//
//
// The `elementwise` fusion family: connected ops implementing ElementwiseOpInterface that
// iterate over the same shape, in the same phase, become one bonsai.fused_elementwise whose
// region is their scalar computation. A chain of n ops that each read and write device memory
// then reads its inputs once and writes only the values used outside it.
//
// Groups grow in block order. An op joins the groups of its producers when every producer it
// reads from the group iterates over its shape and runs in its phase, and when the union stays
// convex: no op outside it may consume a member and (transitively) feed another member, which
// would make the fused op its own ancestor. When the fused op replaces its members, at the
// position of the last one, the outside ops in between that consume a member move after it
// (convexity guarantees that none of them feeds the group).
//
//===----------------------------------------------------------------------===//

#include "bonsai/Transforms/Fusion.h"

#include "FusionUtils.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/TypeUtilities.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "bonsai-fuse"

namespace mlir::bonsai {
namespace {

using fusion::getPhase;
using fusion::kPhaseAttr;

/// Whether an input of shape `input` is read at the element index modulo its size in an
/// iteration space of shape `space` (the fused op's rule: a trailing part, after leading 1s).
bool isTrailingPart(ArrayRef<int64_t> input, ArrayRef<int64_t> space) {
  while (!input.empty() && input.front() == 1)
    input = input.drop_front();
  return input.size() <= space.size() && space.take_back(input.size()) == input;
}

/// The shape an elementwise op iterates over: that of its results, which must agree, with
/// every operand of that shape or a trailing part of it. None for an op that cannot be fused.
std::optional<ArrayRef<int64_t>> getIterationShape(ElementwiseOpInterface op) {
  Operation *operation = op.getOperation();
  if (operation->getNumResults() == 0)
    return std::nullopt;
  auto first = dyn_cast<RankedTensorType>(operation->getResult(0).getType());
  if (!first)
    return std::nullopt;
  ArrayRef<int64_t> shape = first.getShape();
  for (Type type : operation->getResultTypes())
    if (cast<RankedTensorType>(type).getShape() != shape)
      return std::nullopt;
  for (Type type : operation->getOperandTypes()) {
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!tensor || !isTrailingPart(tensor.getShape(), shape))
      return std::nullopt;
  }
  return shape;
}

/// Whether `op` has a scalar form for its element types: built once into a scratch block and
/// thrown away (an op refuses element types it has no scalar form for, such as FP8).
bool hasScalarForm(ElementwiseOpInterface op) {
  Operation *operation = op.getOperation();
  Block scratch;
  for (Type type : operation->getOperandTypes())
    scratch.addArgument(getElementTypeOrSelf(type), operation->getLoc());
  // The scratch block has no parent region to take the context from.
  OpBuilder builder(operation->getContext());
  builder.setInsertionPointToEnd(&scratch);
  SmallVector<Value> results;
  bool ok = succeeded(op.buildScalarComputation(builder, operation->getLoc(),
                                                scratch.getArguments(), results)) &&
            results.size() == operation->getNumResults();
  for (auto [scalar, result] : llvm::zip(results, operation->getResults()))
    ok &= scalar.getType() == getElementTypeOrSelf(result.getType());
  // Erase in reverse so that no op is destroyed while another still uses its result.
  while (!scratch.empty())
    scratch.back().erase();
  return ok;
}

class ElementwiseFusion {
public:
  ElementwiseFusion(Block &block, const FusionOptions &options)
      : block(block), options(options) {}

  LogicalResult run();

private:
  using Group = llvm::SmallSetVector<Operation *, 8>;

  /// Whether `members` plus `op` is convex: no op outside it is reachable from a member and
  /// feeds a member (or `op`).
  bool isConvexWith(const Group &members, Operation *op) const;
  /// Replaces `members` (block order) with one bonsai.fused_elementwise.
  void fuse(ArrayRef<Operation *> members);

  Block &block;
  const FusionOptions &options;
};

bool ElementwiseFusion::isConvexWith(const Group &members, Operation *op) const {
  // Every outside op that depends on a member and comes before `op` (later ops cannot feed
  // it): if one of them feeds a member or `op`, merging would create a cycle.
  llvm::SmallPtrSet<Operation *, 32> tainted;
  SmallVector<Operation *> worklist(members.begin(), members.end());
  while (!worklist.empty()) {
    Operation *current = worklist.pop_back_val();
    for (Operation *nested : current->getUsers()) {
      // A use inside another op's region counts as a use by that op.
      Operation *user = block.findAncestorOpInBlock(*nested);
      if (!user || user == op || members.contains(user) || !user->isBeforeInBlock(op) ||
          !tainted.insert(user).second)
        continue;
      worklist.push_back(user);
    }
  }
  if (tainted.empty())
    return true;
  auto fedByTainted = [&](Operation *member) {
    return llvm::any_of(member->getOperands(), [&](Value operand) {
      Operation *producer = operand.getDefiningOp();
      return producer && tainted.contains(producer);
    });
  };
  return !fedByTainted(op) && llvm::none_of(members, fedByTainted);
}

LogicalResult ElementwiseFusion::run() {
  // Group leader of every op that joined a group, and the members of each group by leader.
  llvm::DenseMap<Operation *, Operation *> leaderOf;
  llvm::DenseMap<Operation *, Group> groups;
  llvm::DenseMap<Operation *, ArrayRef<int64_t>> shapes;

  for (Operation &operation : block) {
    auto op = dyn_cast<ElementwiseOpInterface>(&operation);
    if (!op)
      continue;
    std::optional<ArrayRef<int64_t>> shape = getIterationShape(op);
    if (!shape || !hasScalarForm(op))
      continue;
    shapes[&operation] = *shape;

    // The groups of producers this op could join: same shape, same phase, read whole.
    Group merged;
    SmallVector<Operation *> joined;
    for (Value operand : operation.getOperands()) {
      Operation *producer = operand.getDefiningOp();
      auto leader = producer ? leaderOf.find(producer) : leaderOf.end();
      if (leader == leaderOf.end() || llvm::is_contained(joined, leader->second))
        continue;
      if (shapes.lookup(producer) != *shape || getPhase(producer) != getPhase(&operation))
        continue;
      Group candidate = merged;
      candidate.insert(groups[leader->second].begin(), groups[leader->second].end());
      if (!isConvexWith(candidate, &operation)) {
        LLVM_DEBUG(llvm::dbgs() << "elementwise: " << operation.getName()
                                << " cannot join its producer's group: an op outside it "
                                   "would be both its consumer and its producer\n");
        continue;
      }
      merged = std::move(candidate);
      joined.push_back(leader->second);
    }
    for (Operation *leader : joined)
      groups.erase(leader);
    merged.insert(&operation);
    for (Operation *member : merged)
      leaderOf[member] = &operation;
    groups[&operation] = std::move(merged);
  }

  // Groups in block order of their last member; a group of one saves nothing.
  SmallVector<SmallVector<Operation *>> toFuse;
  for (Operation &operation : block) {
    auto it = groups.find(&operation);
    if (it == groups.end() || it->second.size() < 2)
      continue;
    SmallVector<Operation *> members(it->second.begin(), it->second.end());
    llvm::sort(members, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    toFuse.push_back(std::move(members));
  }
  for (ArrayRef<Operation *> members : toFuse)
    fuse(members);
  return success();
}

void ElementwiseFusion::fuse(ArrayRef<Operation *> members) {
  llvm::SmallPtrSet<Operation *, 8> isMember(members.begin(), members.end());
  Operation *last = members.back();
  // Groups are formed on the unfused graph; once an earlier group is one op, a group that
  // was convex may no longer be (it feeds that op and is fed by it): it stays unfused.
  Group others(members.begin(), members.end() - 1);
  if (!isConvexWith(others, last)) {
    LLVM_DEBUG(llvm::dbgs() << "elementwise: group ending at " << *last
                            << " would feed an earlier fused op that feeds it\n");
    return;
  }
  Location loc = FusedLoc::get(last->getContext(),
                               llvm::map_to_vector(members, [](Operation *op) {
                                 return op->getLoc();
                               }));

  // Inputs: values from outside the group, once each. Outputs: member results used outside.
  llvm::SetVector<Value> inputs;
  SmallVector<Value> outputs;
  for (Operation *member : members) {
    for (Value operand : member->getOperands()) {
      Operation *producer = operand.getDefiningOp();
      if (!producer || !isMember.contains(producer))
        inputs.insert(operand);
    }
    for (Value result : member->getResults())
      if (llvm::any_of(result.getUsers(),
                       [&](Operation *user) { return !isMember.contains(user); }))
        outputs.push_back(result);
  }

  OpBuilder builder(last);
  auto fused = FusedElementwiseOp::create(
      builder, loc, TypeRange(ValueRange(outputs)), inputs.getArrayRef(), StringAttr(),
      DenseI32ArrayAttr(), StringAttr(), StringAttr());
  if (Attribute phase = last->getAttr(kPhaseAttr))
    fused->setAttr(kPhaseAttr, phase);
  Block *body = builder.createBlock(&fused.getBody());
  IRMapping scalars;
  for (Value input : inputs)
    scalars.map(input, body->addArgument(getElementTypeOrSelf(input.getType()), input.getLoc()));
  for (Operation *member : members) {
    SmallVector<Value> operands = llvm::map_to_vector(
        member->getOperands(), [&](Value v) { return scalars.lookup(v); });
    SmallVector<Value> results;
    // hasScalarForm checked that this succeeds for these element types.
    (void)cast<ElementwiseOpInterface>(member).buildScalarComputation(
        builder, member->getLoc(), operands, results);
    scalars.map(member->getResults(), results);
  }
  YieldOp::create(builder, loc,
                  llvm::map_to_vector(outputs, [&](Value v) { return scalars.lookup(v); }));

  // Outside ops between the first and the last member that depend on a member move after
  // the fused op, in their order (they cannot feed the group: it is convex).
  llvm::SmallPtrSet<Operation *, 16> dependent(isMember.begin(), isMember.end());
  SmallVector<Operation *> toMove;
  for (Operation *op = members.front()->getNextNode(); op != last; op = op->getNextNode()) {
    if (isMember.contains(op))
      continue;
    if (llvm::any_of(op->getOperands(), [&](Value operand) {
          Operation *producer = operand.getDefiningOp();
          return producer && dependent.contains(producer);
        })) {
      dependent.insert(op);
      toMove.push_back(op);
    }
  }
  Operation *insertAfter = fused;
  for (Operation *op : toMove) {
    op->moveAfter(insertAfter);
    insertAfter = op;
  }

  for (auto [output, replacement] : llvm::zip(outputs, fused.getResults()))
    output.replaceUsesWithIf(replacement, [&](OpOperand &use) {
      return !isMember.contains(use.getOwner());
    });
  for (Operation *member : llvm::reverse(members))
    member->erase();
  options.fused(fused, "elementwise regions");
}

} // namespace

/// The `elementwise` family's whole-function transform (see the file comment).
LogicalResult fuseElementwiseChains(FunctionOpInterface function,
                                    const FusionOptions &options) {
  for (Block &block : function.getFunctionBody())
    if (failed(ElementwiseFusion(block, options).run()))
      return failure();
  return success();
}

} // namespace mlir::bonsai
