//===- Collective.cpp - The contracts of the collectives over ranks -------===//
//
// ShardSlice, ReduceScatter, AllGather and AllReduce (docs/sharding.md): what the plan loader
// checks of each before any backend runs it (KernelChecker.h). Shards are flat: a shard of n
// elements is one rank's contiguous 1/ranks of the row-major elements of a whole tensor of
// ranks * n elements, whatever the two shapes are. Every rank runs the same plan, so the counts
// checked here are every rank's, which the collectives need: a rank that moved another count
// would hang or corrupt the others. A sharded NF4 weight is shared out by its storage bytes (u8
// shares) and gathered whole.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

namespace {

const char *reductionName(CollectiveReduction r) {
  switch (r) {
  case CollectiveReduction::Sum:
    return "Sum";
  case CollectiveReduction::L2Norm:
    return "L2Norm";
  case CollectiveReduction::Max:
    return "Max";
  }
  return "an unknown reduction";
}

} // namespace

/// The attributes every collective kind shares: its ranks are the plan's, and only AllReduce
/// takes a reduction other than the sum.
void KernelChecker::checkCollectiveAttrs(bool takesReduction) {
  const auto &a = kernel.attrsAs<CollectiveAttrs>();
  if (a.ranks != plan.ranks)
    fail("attrs.ranks is " + std::to_string(a.ranks) + ", but the plan is for " +
         std::to_string(plan.ranks) + " ranks (Plan.ranks)");
  if (uint8_t(a.reduction) > uint8_t(CollectiveReduction::Max))
    fail("reduction " + std::to_string(int(a.reduction)) +
         " is not a reduction (Sum, L2Norm or Max)");
  if (!takesReduction && a.reduction != CollectiveReduction::Sum)
    fail(std::string("reduction ") + reductionName(a.reduction) +
         " applies to AllReduce only (expected Sum)");
}

/// `full` (input or output) holds ranks x `shard`'s elements, of one dtype.
void KernelChecker::checkShardOf(const TensorInfo &full, const std::string &fullName,
                                 const TensorInfo &shard, const std::string &shardName) {
  if (full.dtype != shard.dtype)
    fail(shardName + " dtype " + dtypeName(shard.dtype) + " differs from " + fullName + " dtype " +
         dtypeName(full.dtype));
  if (uint64_t(full.numel) != uint64_t(shard.numel) * plan.ranks)
    fail(fullName + " " + formatShape(full.shape) + " has " + std::to_string(full.numel) +
         " elements, expected " + std::to_string(plan.ranks) + " ranks x " +
         std::to_string(shard.numel) + " (" + shardName + " " + formatShape(shard.shape) + ")");
}

void KernelChecker::verify(kinds::ShardSlice) {
  checkCollectiveAttrs(/*takesReduction=*/false);
  checkShardOf(in(0), inName(0), out(0), outName(0));
}

void KernelChecker::verify(kinds::ReduceScatter) {
  checkCollectiveAttrs(/*takesReduction=*/false);
  expectFloat(0);
  checkShardOf(in(0), inName(0), out(0), outName(0));
}

void KernelChecker::verify(kinds::AllGather) {
  checkCollectiveAttrs(/*takesReduction=*/false);
  const TensorInfo &full = out(0), &shard = in(0);
  if (full.dtype != DType::NF4 && shard.dtype != DType::U8) {
    checkShardOf(full, outName(0), shard, inName(0));
    return;
  }
  // An NF4 weight gathered from the u8 shares of its storage bytes: the share must be of
  // this tensor's layout, so that the gathered bytes are its codes and block constants.
  if (full.dtype != DType::NF4 || !shard.nf4Share())
    fail(inName(0) + " is " + dtypeName(shard.dtype) + " and " + outName(0) + " is " +
         dtypeName(full.dtype) + ": an nf4 tensor is gathered from the u8 shares of its storage");
  if (shard.fullShape != full.shape || shard.quantBlock != full.quantBlock ||
      shard.quantDoubleBlock != full.quantDoubleBlock)
    fail(inName(0) + " is a share of the nf4 storage of " + formatShape(shard.fullShape) +
         " with blocks (" + std::to_string(shard.quantBlock) + ", " +
         std::to_string(shard.quantDoubleBlock) + "), but " + outName(0) + " is " +
         formatShape(full.shape) + " with blocks (" + std::to_string(full.quantBlock) + ", " +
         std::to_string(full.quantDoubleBlock) + ")");
  if (full.bytes != uint64_t(shard.numel) * plan.ranks)
    fail(outName(0) + " has " + std::to_string(full.bytes) + " storage bytes, expected " +
         std::to_string(plan.ranks) + " ranks x " + std::to_string(shard.numel) + " (" + inName(0) +
         ")");
}

void KernelChecker::verify(kinds::AllReduce) {
  checkCollectiveAttrs(/*takesReduction=*/true);
  expectFloat(0);
  CollectiveReduction reduction = attrs<kinds::AllReduce>().reduction;
  if (reduction != CollectiveReduction::Sum && in(0).dtype != DType::F32)
    fail(inName(0) + " dtype: " +
         (reduction == CollectiveReduction::L2Norm ? "an L2Norm all-reduce takes f32 (norms)"
                                                   : "a Max all-reduce takes f32 (amaxes)") +
         ", got " + dtypeName(in(0).dtype));
  expectOutputLike(0);
}

} // namespace bonsai::rt::contract
