//===- Fp8SavedInput.cpp - Fusion family `fp8-saved-input` ----------------===//
//
// The backward of an FP8 linear casts its input x again, transposed, for the weight gradient,
// with the scale the forward used (the state changes only in the update phase): it reads x
// (kept from the forward for this alone, in a Llama block, for all but the attention output)
// and writes xᵀ's codes, which the forward could have written while it had x in hand. This
// family makes the forward GEMM that casts x (fp8_linear, or the first of a group sharing its
// cast) write xᵀ's codes too (fp8_linear_with_input_cast, Fp8LinearWithInputCast), and every fused
// backward of x read them (fp8_linear_backward_from_input_cast, Fp8LinearBackwardFromInputCast),
// siblings sharing a backward's cast included. Bit for bit the same: the codes and the statistics
// (row 1 of the weight gradient's, copied from the forward's row 0) are those the backward made.
//
// Per layer of Llama-3-8B's shape this trades reading x (2 bytes an element) and writing its
// codes in the backward for writing the codes in the forward: about 440 MB less memory traffic
// per step. And x, a bf16 activation, need not be kept for the backward where nothing else
// reads it there (the normalised inputs of q, k, v and of gate, up, and down's input): the
// one-byte codes are kept instead.
//
// A backward reads a forward's codes when both are in one block, the forward first, with the
// same scaling (`current`, `margin`), and nothing between them writes x or either's state.
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::bonsai {
namespace {

/// Whether `backward` may read the codes `forward` would write of their common input: same
/// block and scaling, `forward` first, and nothing between them writes the input or a state.
bool canRead(Fp8LinearOp forward, Fp8LinearBackwardOp backward) {
  if (forward->getBlock() != backward->getBlock() || !forward->isBeforeInBlock(backward) ||
      forward.getCurrent() != backward.getCurrent() || forward.getMargin() != backward.getMargin())
    return false;
  Value read[] = {forward.getInput(), forward.getState(), backward.getState()};
  for (Operation *op = forward->getNextNode(); op != backward; op = op->getNextNode())
    for (Value value : read)
      if (fusion::mayWrite(op, value))
        return false;
  return true;
}

/// fp8_linear(x, W, s) -> fp8_linear_with_input_cast(x, W, s): the same results, and xᵀ's
/// codes. The original is left for the caller to erase.
Fp8LinearWithInputCastOp keepInputCast(RewriterBase &rewriter, Fp8LinearOp forward) {
  rewriter.setInsertionPoint(forward);
  int64_t k = cast<RankedTensorType>(forward.getInput().getType()).getShape().back();
  auto castType = RankedTensorType::get({k, fusion::elementsOf(forward.getInput()) / k},
                                        rewriter.getType<Float8E4M3FNType>());
  auto kept = Fp8LinearWithInputCastOp::create(
      rewriter, forward.getLoc(),
      TypeRange{forward.getResult().getType(), forward.getStats().getType(), castType,
                forward.getWorkspace().getType()},
      forward.getInput(), forward.getWeight(), forward.getState(), forward.getBias(),
      forward.getCurrent(), forward.getMargin(), forward.getFastAccumulation());
  kept->setDiscardableAttrs(forward->getDiscardableAttrDictionary());
  rewriter.replaceAllUsesWith(forward.getResult(), kept.getResult());
  rewriter.replaceAllUsesWith(forward.getStats(), kept.getStats());
  // Siblings sharing the forward cast (fp8_linear_shared_input) read the same workspace.
  rewriter.replaceAllUsesWith(forward.getWorkspace(), kept.getWorkspace());
  return kept;
}

/// A fused backward (fp8_linear_backward, or fp8_linear_backward_shared_input of one) of
/// dy, W, state and accumulator -> fp8_linear_backward_from_input_cast reading `forward`'s
/// codes, in its place.
template <typename BackwardOp>
void readInputCast(RewriterBase &rewriter, BackwardOp backward, Fp8LinearWithInputCastOp forward,
                   const FusionOptions &options) {
  rewriter.setInsertionPoint(backward);
  int64_t dy = fusion::elementsOf(backward.getResultGrad());
  int64_t workspace = Fp8LinearBackwardFromInputCastOp::getWorkspaceElements(
                          dy, fusion::elementsOf(backward.getWeight())) +
                      Fp8LinearBackwardFromInputCastOp::getWorkspaceElements(dy, 0);
  auto fromCast = Fp8LinearBackwardFromInputCastOp::create(
      rewriter, backward.getLoc(),
      TypeRange{backward.getInputGrad().getType(), backward.getInputGradStats().getType(),
                backward.getWeightGradStats().getType(),
                RankedTensorType::get({workspace}, rewriter.getF32Type())},
      backward.getResultGrad(), backward.getWeight(), forward.getInputCast(), forward.getStats(),
      backward.getState(), backward.getAccumulator(), backward.getCurrent(), backward.getMargin());
  fromCast->setDiscardableAttrs(backward->getDiscardableAttrDictionary());
  rewriter.replaceAllUsesWith(backward.getInputGrad(), fromCast.getInputGrad());
  rewriter.replaceAllUsesWith(backward.getInputGradStats(), fromCast.getInputGradStats());
  rewriter.replaceAllUsesWith(backward.getWeightGradStats(), fromCast.getWeightGradStats());
  options.fused(fromCast, "fp8_linear_backward (its input's cast from the forward)");
}

} // namespace

LogicalResult saveFp8InputCasts(FunctionOpInterface function, const FusionOptions &options) {
  // The forward GEMMs that cast their input themselves, by input, in block order.
  llvm::DenseMap<Value, SmallVector<Fp8LinearOp>> forwardsOf;
  SmallVector<Fp8LinearBackwardOp> backwards;
  function->walk([&](Operation *op) {
    if (auto forward = dyn_cast<Fp8LinearOp>(op))
      forwardsOf[forward.getInput()].push_back(forward);
    else if (auto backward = dyn_cast<Fp8LinearBackwardOp>(op))
      backwards.push_back(backward);
  });
  // Each backward with the forward whose codes it can read, decided before anything changes.
  llvm::MapVector<Operation *, Fp8LinearWithInputCastOp> kept;
  SmallVector<std::pair<Fp8LinearBackwardOp, Fp8LinearOp>> pairs;
  for (Fp8LinearBackwardOp backward : backwards) {
    auto it = forwardsOf.find(backward.getInput());
    if (it == forwardsOf.end())
      continue;
    auto forward = llvm::find_if(it->second, [&](Fp8LinearOp f) { return canRead(f, backward); });
    if (forward == it->second.end())
      continue;
    pairs.emplace_back(backward, *forward);
    kept.insert({*forward, nullptr});
  }
  IRRewriter rewriter(function->getContext());
  for (auto &[forward, withCast] : kept) {
    withCast = keepInputCast(rewriter, cast<Fp8LinearOp>(forward));
    options.fused(withCast, "fp8_linear (keeping its input's transposed cast for the backward)");
  }
  for (auto [backward, forward] : pairs) {
    Fp8LinearWithInputCastOp withCast = kept.lookup(forward);
    // The backwards that share this one's cast of x read the forward's codes as well.
    for (Operation *user : llvm::make_early_inc_range(backward.getWorkspace().getUsers())) {
      auto sibling = dyn_cast<Fp8LinearBackwardSharedInputOp>(user);
      if (!sibling)
        return backward.emitError("bonsai-fuse (fp8-saved-input): the workspace of this "
                                  "fp8_linear_backward is read by an op other than "
                                  "fp8_linear_backward_shared_input");
      readInputCast(rewriter, sibling, withCast, options);
      rewriter.eraseOp(sibling);
    }
    readInputCast(rewriter, backward, withCast, options);
    rewriter.eraseOp(backward);
  }
  for (auto &entry : kept)
    rewriter.eraseOp(entry.first);
  return success();
}

} // namespace mlir::bonsai
