//===- BonsaiCollectiveOps.cpp - collectives over data-parallel ranks -----===//
//
// Verifiers and costs of the ops bonsai-shard inserts. A shard is 1-D and holds 1/ranks of the
// whole tensor's elements, of the same element type (or 1/ranks of the storage bytes of a
// packed tensor, as ui8); the verifiers check that, so that a mis-sized exchange is caught in
// the compiler rather than as a rank waiting forever.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

/// Fails unless `shard` is one of `ranks` flat shares of `full`.
static LogicalResult verifyShardOf(Operation *op, int64_t ranks, Value shard, Value full) {
  if (ranks < 1)
    return op->emitOpError() << "ranks must be at least 1, got " << ranks;
  auto shardType = cast<RankedTensorType>(shard.getType());
  auto fullType = cast<RankedTensorType>(full.getType());
  // A packed tensor (NF4) is shared out by its storage bytes: the shard is ui8.
  if (auto packed = dyn_cast<plan::PackedElementTypeInterface>(fullType.getElementType())) {
    uint64_t bytes = packed.getStorageBytes(uint64_t(getNumElements(fullType)));
    if (shardType.getRank() != 1 || !shardType.getElementType().isUnsignedInteger(8) ||
        bytes % uint64_t(ranks) != 0 || uint64_t(shardType.getDimSize(0)) != bytes / ranks)
      return op->emitOpError() << "shard type " << shardType << " is not one of " << ranks
                               << " flat shares of the " << bytes << " storage bytes of "
                               << fullType << " (expected "
                               << (bytes % uint64_t(ranks)
                                       ? std::string("storage bytes that divide")
                                       : "tensor<" + std::to_string(bytes / ranks) + "xui8>")
                               << ")";
    return success();
  }
  if (shardType.getElementType() != fullType.getElementType())
    return op->emitOpError() << "shard element type " << shardType.getElementType()
                             << " differs from the whole tensor's " << fullType.getElementType();
  int64_t n = getNumElements(fullType);
  if (shardType.getRank() != 1 || n % ranks != 0 || shardType.getDimSize(0) != n / ranks)
    return op->emitOpError() << "shard type " << shardType << " is not one of " << ranks
                             << " flat shares of " << fullType << " (expected "
                             << (n % ranks ? std::string("a whole tensor that divides")
                                           : "tensor<" + std::to_string(n / ranks) + "x...>")
                             << ")";
  return success();
}

/// The device bytes a collective touches: it reads its inputs and writes its outputs once.
/// Its time is the link's (bonsai/Analysis/StepTime.h), not these bytes'.
static OpCost collectiveCost(Operation *op) { return streamingBytes(op); }

LogicalResult ShardSliceOp::verify() {
  return verifyShardOf(*this, getRanks(), getShard(), getFull());
}
OpCost ShardSliceOp::getForwardCost() { return collectiveCost(*this); }

LogicalResult ReduceScatterOp::verify() {
  return verifyShardOf(*this, getRanks(), getShard(), getFull());
}
OpCost ReduceScatterOp::getForwardCost() { return collectiveCost(*this); }

LogicalResult AllGatherOp::verify() {
  return verifyShardOf(*this, getRanks(), getShard(), getFull());
}
OpCost AllGatherOp::getForwardCost() { return collectiveCost(*this); }
/// A parameter's share is resident for the whole step, so gathering it again before the
/// backward pass costs the link's time, where keeping the gathered tensor from the forward
/// pass would keep every layer's whole weight alive at once (what ZeRO-3 is for not to do).
bool AllGatherOp::isAlwaysRecomputed() {
  return !getKept() && getShard().getDefiningOp<ParamOp>() != nullptr;
}

LogicalResult AllGatherIntoOp::verify() {
  return verifyShardOf(*this, getRanks(), getShard(), getFull());
}
OpCost AllGatherIntoOp::getForwardCost() { return collectiveCost(*this); }
StringRef AllGatherIntoOp::getKernelName() { return "all_gather"; }
SmallVector<unsigned> AllGatherIntoOp::getInPlaceOperands() { return {1}; }

LogicalResult AllReduceOp::verify() {
  if (getRanks() < 1)
    return emitOpError() << "ranks must be at least 1, got " << getRanks();
  if (getInput().getType() != getResult().getType())
    return emitOpError() << "result type " << getResult().getType() << " differs from the input's "
                         << getInput().getType();
  if (getReduction() != "sum" && getReduction() != "l2" && getReduction() != "max")
    return emitOpError() << "reduction must be \"sum\", \"l2\" or \"max\", got \"" << getReduction()
                         << "\"";
  if (getReduction() != "sum" &&
      !cast<RankedTensorType>(getInput().getType()).getElementType().isF32())
    return emitOpError() << "reduction \"" << getReduction() << "\" needs f32, got "
                         << getInput().getType();
  return success();
}
OpCost AllReduceOp::getForwardCost() { return collectiveCost(*this); }
Value AllReduceOp::getWholeTensor() { return getInput(); }
/// A reduce-scatter, then an all-gather of the reduced shares.
unsigned AllReduceOp::getLinkPasses() { return 2; }
DictionaryAttr AllReduceOp::getKernelParams() {
  Builder builder(getContext());
  return builder.getDictionaryAttr({builder.getNamedAttr("ranks", getRanksAttr()),
                                    builder.getNamedAttr("reduction", getReductionAttr())});
}
