//===- Fp8SharedInput.cpp - Fusion family `fp8-shared-input` --------------===//
//
// Linears that read one input cast it once. In a Llama block q, k and v read the same
// normalised hidden state, and so do the gate and up projections; in FP8 each of their GEMMs
// casts that input to E4M3FN itself, in the forward (plain codes) and again in the backward
// (transposed codes, for the weight gradient). Every cast of one tensor gives the same codes:
// the linears' states record the same input amax every step (the update reads it from the
// GEMMs' statistics), so their input scales, equal from the first step, stay equal. The first
// GEMM of a group keeps its cast; the others read the codes from its workspace and its scale
// and statistics from its stats (fp8_linear_shared_input, fp8_linear_backward_shared_input),
// bit for bit what they computed apart. On Llama-3-8B's shapes this saves three of seven
// input casts in each direction: about 600 MB of memory traffic per layer and step.
//
// A group is the GEMMs of one block, phase and scaling (`current`, `margin`) that read the
// same input value, the first of them in block order keeping its cast; nothing between it
// and a sibling may write the input. The sibling's workspace shrinks to its other operands;
// the first GEMM's workspace lives on until its last sibling has read it.
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::bonsai {
namespace {

/// Whether `sibling` may read the cast `first` made of the input `input`: same block, phase
/// and scaling, `first` earlier, and nothing between them writes the input.
template <typename GemmOp> bool canShare(GemmOp first, GemmOp sibling, Value input) {
  if (first->getBlock() != sibling->getBlock() || !first->isBeforeInBlock(sibling) ||
      first.getCurrent() != sibling.getCurrent() || first.getMargin() != sibling.getMargin() ||
      !fusion::sameSchedule(first, sibling))
    return false;
  for (Operation *op = first->getNextNode(); op != sibling; op = op->getNextNode())
    if (fusion::mayWrite(op, input))
      return false;
  return true;
}

/// The GEMMs of `function` of type GemmOp, grouped by the input they read (in block order).
template <typename GemmOp>
SmallVector<SmallVector<GemmOp>> groupsByInput(FunctionOpInterface function) {
  llvm::DenseMap<Value, unsigned> groupOf;
  SmallVector<SmallVector<GemmOp>> groups;
  function->walk([&](GemmOp gemm) {
    auto [it, inserted] = groupOf.try_emplace(gemm.getInput(), groups.size());
    if (inserted)
      groups.emplace_back();
    groups[it->second].push_back(gemm);
  });
  return groups;
}

/// Rewrites each GEMM of type GemmOp that can read an earlier GEMM's cast of its input
/// (canShare) into the op `buildShared` creates from the two, whose results are the GEMM's in
/// order (the workspace, unused, last).
template <typename GemmOp>
void shareCasts(FunctionOpInterface function, const FusionOptions &options, StringRef what,
                function_ref<Operation *(RewriterBase &, GemmOp first, GemmOp gemm)> buildShared) {
  IRRewriter rewriter(function->getContext());
  for (SmallVector<GemmOp> &group : groupsByInput<GemmOp>(function)) {
    SmallVector<GemmOp> firsts;
    for (GemmOp gemm : group) {
      auto first =
          llvm::find_if(firsts, [&](GemmOp f) { return canShare(f, gemm, gemm.getInput()); });
      if (first == firsts.end() || !gemm.getWorkspace().use_empty()) {
        firsts.push_back(gemm);
        continue;
      }
      rewriter.setInsertionPoint(gemm);
      Operation *shared = buildShared(rewriter, *first, gemm);
      shared->setDiscardableAttrs(gemm->getDiscardableAttrDictionary());
      for (unsigned i = 0, e = gemm->getNumResults() - 1; i < e; ++i)
        rewriter.replaceAllUsesWith(gemm->getResult(i), shared->getResult(i));
      rewriter.eraseOp(gemm);
      options.fused(shared, what);
    }
  }
}

/// fp8_linear(x, W2, s2) after fp8_linear(x, W1, s1) -> fp8_linear_shared_input(ws1, stats1,
/// W2, s2).
Operation *buildSharedForward(RewriterBase &rewriter, Fp8LinearOp first, Fp8LinearOp gemm) {
  int64_t workspace =
      Fp8LinearSharedInputOp::getWorkspaceElements(0, fusion::elementsOf(gemm.getWeight()));
  return Fp8LinearSharedInputOp::create(
      rewriter, gemm.getLoc(),
      TypeRange{gemm.getResult().getType(), gemm.getStats().getType(),
                RankedTensorType::get({workspace}, rewriter.getF32Type())},
      first.getWorkspace(), first.getStats(), gemm.getWeight(), gemm.getState(), gemm.getBias(),
      gemm.getCurrent(), gemm.getMargin(), gemm.getFastAccumulation());
}

/// fp8_linear_backward(dy2, W2, x, s2, acc2) after fp8_linear_backward(dy1, W1, x, s1, acc1)
/// -> fp8_linear_backward_shared_input(dy2, W2, ws1, weight_grad_stats1, s2, acc2).
Operation *buildSharedBackward(RewriterBase &rewriter, Fp8LinearBackwardOp first,
                               Fp8LinearBackwardOp gemm) {
  int64_t dy = fusion::elementsOf(gemm.getResultGrad());
  int64_t workspace = Fp8LinearBackwardSharedInputOp::getWorkspaceElements(
                          dy, fusion::elementsOf(gemm.getWeight())) +
                      Fp8LinearBackwardSharedInputOp::getWorkspaceElements(dy, 0);
  return Fp8LinearBackwardSharedInputOp::create(
      rewriter, gemm.getLoc(),
      TypeRange{gemm.getInputGrad().getType(), gemm.getInputGradStats().getType(),
                gemm.getWeightGradStats().getType(),
                RankedTensorType::get({workspace}, rewriter.getF32Type())},
      gemm.getResultGrad(), gemm.getWeight(), first.getWorkspace(), first.getWeightGradStats(),
      gemm.getState(), gemm.getAccumulator(), gemm.getCurrent(), gemm.getMargin());
}

} // namespace

LogicalResult shareFp8InputCasts(FunctionOpInterface function, const FusionOptions &options) {
  shareCasts<Fp8LinearOp>(function, options,
                          "fp8_linear (its input's cast shared with an earlier fp8_linear)",
                          buildSharedForward);
  shareCasts<Fp8LinearBackwardOp>(
      function, options,
      "fp8_linear_backward (its input's cast shared with an earlier fp8_linear_backward)",
      buildSharedBackward);
  return success();
}

} // namespace mlir::bonsai
