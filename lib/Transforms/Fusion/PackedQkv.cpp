//===- PackedQkv.cpp - Flash attention reading q, k, v out of one projection -===//
//
// The `packed-qkv` fusion family (docs/fusion.md). GPT-2 projects q, k and v with one linear
// (c_attn, [B, S, 3·768]) and slices them apart; after `flash-attention` and
// `slice-gradients` each layer runs three slice kernels in the forward pass and one concat in
// the backward, pure copies of the whole projection:
//
//   %q = bonsai.slice %x {axis = 2, start = 0}        %p = bonsai.reshape %x  // [B, S, 36, 64]
//   %k = bonsai.slice %x {axis = 2, start = 768}      %o, %lse = bonsai.flash_attention_qkv %p
//   %v = bonsai.slice %x {axis = 2, start = 1536}  -> ...
//   %o, %lse = bonsai.flash_attention                 %dp = bonsai.flash_attention_qkv_grad
//       reshape(%q), reshape(%k), reshape(%v)               %do, %p, %o, %lse
//   ...                                               %g = bonsai.reshape %dp  // [B, S, 2304]
//   %dq, %dk, %dv = bonsai.flash_attention_grad
//       %do, reshape(%q), reshape(%k), reshape(%v), %o, %lse
//   %g = bonsai.concat reshape(%dq), reshape(%dk), reshape(%dv) {axis = 2}
//
// The packed kernels read each head's rows out of the projection with its row stride and
// write dq, dk and dv into the heads of one gradient of its shape, so neither the slices nor
// the concat run (about 1.5 ms of GPT-2 124M's 35 ms step on an H100), and the projection,
// not three copies of it, is what the backward pass keeps. Two patterns, each correct alone:
// the forward rewrites a flash_attention whose q, k and v are those slices (a slice also read
// elsewhere stays for that reader); the backward rewrites the concat of a flash_attention_grad's
// three gradients, each read by that concat only, whose q, k and v are those slices. Each
// value is computed by the same kernel arithmetic as before, bit for bit. Ring attention
// (ring_ranks) passes k and v around the ring apart and is left alone.
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::bonsai {
namespace {

using namespace fusion;

/// The shape of a ranked tensor value.
ArrayRef<int64_t> shapeOf(Value value) {
  return cast<RankedTensorType>(value.getType()).getShape();
}

/// Why the attention operands `q` [B, S, H, D], `k` and `v` [B, S, KV, D] are not the heads of
/// one tensor x [B, S, (H + 2 KV)·D] sliced along its last axis in the order q, k, v and
/// reshaped ([B, S, n·D] -> [B, S, n, D]); null when they are, with `packed` set to x.
const char *whyNotPacked(Value q, Value k, Value v, Value &packed) {
  SliceOp slices[3];
  Value heads[3] = {q, k, v};
  for (auto [slice, value] : llvm::zip_equal(slices, heads)) {
    auto reshape = value.getDefiningOp<ReshapeOp>();
    slice = reshape ? reshape.getInput().getDefiningOp<SliceOp>() : SliceOp();
    if (!slice)
      return "q, k or v is not a reshape of a slice";
  }
  Value x = slices[0].getInput();
  if (slices[1].getInput() != x || slices[2].getInput() != x)
    return "q, k and v are slices of different tensors";
  ArrayRef<int64_t> whole = shapeOf(x);
  if (whole.size() != 3)
    return "the sliced tensor is not of rank 3 ([batch, seq, features])";
  const int64_t dim = shapeOf(q)[3];
  int64_t start = 0;
  for (auto [slice, value] : llvm::zip_equal(slices, heads)) {
    if (slice.getAxis() != 2)
      return "a slice is not along the last axis";
    const int64_t count = shapeOf(value)[2];
    if (shapeOf(slice.getResult()) != ArrayRef<int64_t>({whole[0], whole[1], count * dim}) ||
        shapeOf(value) != ArrayRef<int64_t>({whole[0], whole[1], count, dim}))
      return "a reshape does more than split the sliced features into heads";
    if (int64_t(slice.getStart()) != start)
      return "the slices are not q, k and v one after another from the start";
    start += count * dim;
  }
  if (start != whole[2])
    return "the slices do not cover the sliced tensor";
  packed = x;
  return nullptr;
}

/// `x` [B, S, (H + 2 KV)·D] viewed as [B, S, H + 2 KV, D], built before `anchor` with its
/// annotations.
Value viewAsHeads(PatternRewriter &rewriter, Operation *anchor, Value x, int64_t dim) {
  ArrayRef<int64_t> whole = shapeOf(x);
  auto type = RankedTensorType::get({whole[0], whole[1], whole[2] / dim, dim},
                                    cast<RankedTensorType>(x.getType()).getElementType());
  auto reshape = ReshapeOp::create(rewriter, anchor->getLoc(), type, x);
  copyAnnotations(anchor, reshape);
  return reshape.getResult();
}

/// flash_attention(reshape(slice(x)) x 3) -> flash_attention_qkv(reshape(x)).
struct PackFlashAttention : OpRewritePattern<FlashAttentionOp> {
  PackFlashAttention(MLIRContext *context, const FusionOptions &options)
      : OpRewritePattern(context), options(options) {}

  LogicalResult matchAndRewrite(FlashAttentionOp flash, PatternRewriter &rewriter) const override {
    if (flash.getRingRanks())
      return rewriter.notifyMatchFailure(flash, "ring attention passes k and v around apart");
    Value x;
    if (const char *why = whyNotPacked(flash.getQuery(), flash.getKey(), flash.getValue(), x))
      return rewriter.notifyMatchFailure(flash, why);

    rewriter.setInsertionPoint(flash);
    Value qkv = viewAsHeads(rewriter, flash, x, shapeOf(flash.getQuery())[3]);
    auto packed = FlashAttentionQkvOp::create(rewriter, flash.getLoc(), flash.getOutput().getType(),
                                              flash.getLse().getType(), qkv, flash.getSegmentIds(),
                                              flash.getCausalAttr(), flash.getScaleAttr());
    copyAnnotations(flash, packed);
    rewriter.replaceOp(flash, packed->getResults());
    options.fused(packed, "flash_attention of slices -> flash_attention_qkv");
    return success();
  }

  const FusionOptions &options;
};

/// concat(reshape(dq), reshape(dk), reshape(dv)) of one flash_attention_grad of
/// reshape(slice(x)) x 3 -> reshape(flash_attention_qkv_grad(reshape(x))).
struct PackFlashAttentionGrad : OpRewritePattern<ConcatOp> {
  PackFlashAttentionGrad(MLIRContext *context, const FusionOptions &options)
      : OpRewritePattern(context), options(options) {}

  LogicalResult matchAndRewrite(ConcatOp concat, PatternRewriter &rewriter) const override {
    if (concat.getInputs().size() != 3)
      return rewriter.notifyMatchFailure(concat, "not a concat of three pieces");
    FlashAttentionGradOp grad;
    SmallVector<ReshapeOp, 3> reshapes;
    for (auto [i, input] : llvm::enumerate(concat.getInputs())) {
      auto reshape = input.getDefiningOp<ReshapeOp>();
      auto result = reshape ? dyn_cast<OpResult>(reshape.getInput()) : OpResult();
      auto owner = result ? dyn_cast<FlashAttentionGradOp>(result.getOwner()) : nullptr;
      if (!owner || (grad && owner != grad))
        return rewriter.notifyMatchFailure(concat, "the pieces are not reshapes of the "
                                                   "gradients of one flash_attention_grad");
      if (result.getResultNumber() != i)
        return rewriter.notifyMatchFailure(concat, "the pieces are not dq, dk, dv in order");
      if (!input.hasOneUse() || !result.hasOneUse())
        return rewriter.notifyMatchFailure(concat, "a gradient is read by more than the concat");
      grad = owner;
      reshapes.push_back(reshape);
    }
    if (grad.getRingRanks())
      return rewriter.notifyMatchFailure(concat, "ring attention passes k and v around apart");
    if (!sameSchedule(grad, concat))
      return rewriter.notifyMatchFailure(concat, "the gradient and the concat run in different "
                                                 "phases");
    Value x;
    if (const char *why = whyNotPacked(grad.getQuery(), grad.getKey(), grad.getValue(), x))
      return rewriter.notifyMatchFailure(concat, why);
    if (x.getType() != concat.getType() || concat.getAxis() != 2)
      return rewriter.notifyMatchFailure(concat, "the concat does not join the gradients as "
                                                 "their slices were cut");

    rewriter.setInsertionPoint(grad);
    Value qkv = viewAsHeads(rewriter, grad, x, shapeOf(grad.getQuery())[3]);
    Location loc = rewriter.getFusedLoc({grad.getLoc(), concat.getLoc()});
    auto packed = FlashAttentionQkvGradOp::create(
        rewriter, loc, qkv.getType(), grad.getResultGrad(), qkv, grad.getOutput(), grad.getLse(),
        grad.getSegmentIds(), grad.getCausalAttr(), grad.getScaleAttr());
    copyAnnotations(grad, packed);
    auto joined = ReshapeOp::create(rewriter, loc, concat.getType(), packed.getQkvGrad());
    copyAnnotations(concat, joined);
    rewriter.replaceOp(concat, joined);
    for (ReshapeOp reshape : reshapes)
      rewriter.eraseOp(reshape);
    rewriter.eraseOp(grad);
    options.fused(packed, "flash_attention_grad + concat of its gradients -> "
                          "flash_attention_qkv_grad");
    return success();
  }

  const FusionOptions &options;
};

} // namespace

void populatePackedQkvFusionPatterns(RewritePatternSet &patterns, const FusionOptions &options) {
  patterns.add<PackFlashAttention, PackFlashAttentionGrad>(patterns.getContext(), options);
}

} // namespace mlir::bonsai
