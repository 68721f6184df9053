//===- SliceGradients.cpp - Sums of adjacent slices' gradients as one concat ---===//
//
// The `slice-gradients` fusion family (docs/fusion.md). A tensor read through slices that
// tile one of its axes (GPT-2's fused q/k/v projection, split into q, k and v; an MLP's
// input cut into sequence chunks) gets one slice_grad per slice, each a zero tensor of the
// whole shape with its piece in place, and the backward pass adds them up:
//
//   %gv = bonsai.slice_grad %dv {axis = 2, start = 1536}        %g = bonsai.concat %dq, %dk, %dv
//   %gk = bonsai.slice_grad %dk {axis = 2, start = 768}    ->        {axis = 2}
//   %s  = bonsai.add %gv, %gk
//   %gq = bonsai.slice_grad %dq {axis = 2, start = 0}
//   %g  = bonsai.add %s, %gq
//
// Per q/k/v split of GPT-2 124M (B16 x S1024) that is three writes of the whole 75 MB tensor,
// mostly zeros, and an add that reads them back, against one concatenation that writes it
// once. An add of two slice_grads whose pieces are adjacent along one axis becomes the
// slice_grad of their concatenation; one that covers the whole axis is the concatenation
// itself; a concatenation of a concatenation along the same axis is flattened. Each value is
// its piece exactly, as before (x + 0 = x), but for the sign of a zero (-0 + 0 = +0).
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::bonsai {
namespace {

using namespace fusion;

/// The extent of `value`'s tensor type along `axis`.
int64_t extentOf(Value value, int64_t axis) {
  return cast<RankedTensorType>(value.getType()).getDimSize(axis);
}

/// Appends the pieces of `value` along `axis` to `pieces`: the inputs of a concatenation along
/// that axis that nothing else reads (erased into `flattened`), else the value itself.
void appendPieces(Value value, int64_t axis, SmallVectorImpl<Value> &pieces,
                  SmallVectorImpl<Operation *> &flattened) {
  auto concat = value.getDefiningOp<ConcatOp>();
  if (concat && int64_t(concat.getAxis()) == axis && value.hasOneUse()) {
    llvm::append_range(pieces, concat.getInputs());
    flattened.push_back(concat);
    return;
  }
  pieces.push_back(value);
}

/// add(slice_grad(a), slice_grad(b)) with a and b adjacent along one axis -> slice_grad of
/// concat(a, b), or concat(a, b) when it covers the axis.
struct JoinAdjacentSliceGradients : OpRewritePattern<AddOp> {
  JoinAdjacentSliceGradients(MLIRContext *context, const FusionOptions &options)
      : OpRewritePattern(context), options(options) {}

  LogicalResult matchAndRewrite(AddOp add, PatternRewriter &rewriter) const override {
    auto lhs = add.getLhs().getDefiningOp<SliceGradOp>();
    auto rhs = add.getRhs().getDefiningOp<SliceGradOp>();
    if (!lhs || !rhs || lhs == rhs)
      return rewriter.notifyMatchFailure(add, "not an add of two slice_grads");
    if (lhs.getType() != add.getType() || rhs.getType() != add.getType())
      return rewriter.notifyMatchFailure(add, "the add broadcasts or converts");
    if (!add.getLhs().hasOneUse() || !add.getRhs().hasOneUse())
      return rewriter.notifyMatchFailure(add, "a slice_grad is read by more than the add");
    if (lhs.getAxis() != rhs.getAxis())
      return rewriter.notifyMatchFailure(add, "the slices are along different axes");
    if (!sameSchedule(lhs, add) || !sameSchedule(rhs, add))
      return rewriter.notifyMatchFailure(add, "the slice_grads and the add run in different "
                                              "phases");
    const int64_t axis = int64_t(lhs.getAxis());
    SliceGradOp first = lhs, second = rhs;
    if (second.getStart() < first.getStart())
      std::swap(first, second);
    const int64_t firstLength = extentOf(first.getResultGrad(), axis);
    const int64_t secondLength = extentOf(second.getResultGrad(), axis);
    if (int64_t(first.getStart()) + firstLength != int64_t(second.getStart()))
      return rewriter.notifyMatchFailure(add, "the slices are not adjacent");

    SmallVector<Value> pieces;
    SmallVector<Operation *> flattened;
    appendPieces(first.getResultGrad(), axis, pieces, flattened);
    appendPieces(second.getResultGrad(), axis, pieces, flattened);
    auto wholeType = cast<RankedTensorType>(add.getType());
    SmallVector<int64_t> shape(wholeType.getShape());
    shape[size_t(axis)] = firstLength + secondLength;
    auto joinedType = RankedTensorType::get(shape, wholeType.getElementType());

    rewriter.setInsertionPoint(add);
    Location loc = rewriter.getFusedLoc({first.getLoc(), second.getLoc(), add.getLoc()});
    auto concat = ConcatOp::create(rewriter, loc, joinedType, pieces, first.getAxisAttr());
    Operation *fused = concat;
    if (joinedType != wholeType)
      fused = SliceGradOp::create(rewriter, loc, wholeType, concat.getResult(), first.getAxisAttr(),
                                  first.getStartAttr());
    if (Attribute phase = add->getAttr(kPhaseAttr)) {
      concat->setAttr(kPhaseAttr, phase);
      fused->setAttr(kPhaseAttr, phase);
    }
    rewriter.replaceOp(add, fused->getResults());
    rewriter.eraseOp(lhs);
    rewriter.eraseOp(rhs);
    for (Operation *op : flattened)
      rewriter.eraseOp(op);
    options.fused(fused, "adjacent slice gradients + their sum");
    return success();
  }

  const FusionOptions &options;
};

} // namespace

void populateSliceGradientsFusionPatterns(RewritePatternSet &patterns,
                                          const FusionOptions &options) {
  patterns.add<JoinAdjacentSliceGradients>(patterns.getContext(), options);
}

} // namespace mlir::bonsai
