//===- GemmEpilogue.cpp - Fusion family `gemm-epilogue` -------------------===//
//
// Work a GEMM's epilogue can do where cuBLASLt has an epilogue for it:
//
//   - accumulation: `bonsai.accumulate(p, acc)` of the result of an op that can add its result
//     into the accumulator itself (AccumulatingProducerOpInterface: linear_grad_weight and
//     fp8_linear_grad_weight as GEMMs with beta = 1) becomes that op. The weight-sized
//     gradient temporary, one launch and a read and write of it disappear.
//     GPT-2 stores its weights transposed ([in, out], Conv1D), so its weight gradient is
//     transpose(linear_grad_weight(dy, x)); that is linear_grad_weight(x, dy), the same GEMM
//     with its operands swapped, which the accumulation then absorbs (the transpose's kernel
//     and temporary disappear with it).
//   - addition: `bonsai.add` of a `bonsai.linear`'s result (no bias, no other reader) and a
//     value of the same type becomes `bonsai.linear_add`, one GEMM with beta = 1 and the
//     other term as cuBLASLt's C. LoRA's y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ is such a sum: the base
//     product and the adapter's are no longer stored apart and added by a third kernel.
//   - GELU: `bonsai.gelu` (tanh approximation) of a `bonsai.linear` becomes
//     `bonsai.linear_gelu` (CUBLASLT_EPILOGUE_GELU_AUX_BIAS), which keeps the pre-activation
//     as its second result for gelu_grad. cuBLASLt's GELU epilogue is the tanh form; an exact
//     (erf) GELU stays unfused.
//
// SwiGLU (Llama's MLP) has no cuBLASLt epilogue: it stays its own kernel (docs/fusion.md).
//
//===----------------------------------------------------------------------===//

#include "FusionUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Fusion.h"

namespace mlir::bonsai {
namespace {

/// Copies `from`'s bonsai.phase annotation (the phase the fused op runs in) onto `to`.
void copyPhase(Operation *from, Operation *to) {
  if (Attribute phase = from->getAttr(BonsaiDialect::getPhaseAttrName()))
    to->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
}

/// accumulate(producer(...), acc) -> producer's accumulating form, in place on acc.
struct AccumulateIntoProducer : OpRewritePattern<AccumulateOp> {
  AccumulateIntoProducer(MLIRContext *ctx, const FusionOptions &options)
      : OpRewritePattern(ctx), options(options) {}

  LogicalResult matchAndRewrite(AccumulateOp accumulate,
                                PatternRewriter &rewriter) const override {
    Value gradient = accumulate.getGradient(), acc = accumulate.getAccumulator();
    auto producer = gradient.getDefiningOp<AccumulatingProducerOpInterface>();
    if (!producer)
      return rewriter.notifyMatchFailure(accumulate,
                                         "the gradient's producer cannot accumulate itself");
    if (!gradient.hasOneUse())
      return rewriter.notifyMatchFailure(accumulate,
                                         "the gradient has other uses: it must be materialised");
    if (producer->getBlock() != accumulate->getBlock())
      return rewriter.notifyMatchFailure(accumulate, "producer in another block");
    if (!producer.canAccumulateInto(acc))
      return rewriter.notifyMatchFailure(accumulate,
                                         "the producer cannot add into this accumulator type");
    // The fused op runs where the accumulation ran: nothing in between may touch the
    // accumulator, nor write what the producer reads (its operands are all defined before
    // the producer, so they dominate the accumulation).
    for (Operation *op = producer->getNextNode(); op != accumulate; op = op->getNextNode()) {
      if (llvm::is_contained(op->getOperands(), acc))
        return rewriter.notifyMatchFailure(accumulate,
                                           "the accumulator is used between producer and "
                                           "accumulation");
      for (Value read : producer->getOperands())
        if (fusion::mayWrite(op, read))
          return rewriter.notifyMatchFailure(accumulate,
                                             "an operand of the producer is written between "
                                             "producer and accumulation");
    }
    // The producer's other results (an FP8 GEMM's statistics) become the fused op's, which
    // runs where the accumulation ran: their readers must come after it.
    for (Value result : producer->getResults().drop_front())
      for (Operation *user : result.getUsers())
        if (user->getBlock() != accumulate->getBlock() || !accumulate->isBeforeInBlock(user))
          return rewriter.notifyMatchFailure(accumulate,
                                             "another result of the producer is read before "
                                             "the accumulation");
    rewriter.setInsertionPoint(accumulate);
    Operation *fused = producer.buildAccumulating(rewriter, acc);
    copyPhase(accumulate, fused);
    for (auto [result, replacement] :
         llvm::zip_equal(producer->getResults().drop_front(), fused->getResults()))
      rewriter.replaceAllUsesWith(result, replacement);
    rewriter.eraseOp(accumulate);
    rewriter.eraseOp(producer);
    options.fused(fused, (producer->getName().stripDialect() + " + accumulate").str());
    return success();
  }

  const FusionOptions &options;
};

/// transpose(linear_grad_weight(dy, x), [1, 0]) -> linear_grad_weight(x, dy): (dyᵀ x)ᵀ = xᵀ dy.
struct TransposedWeightGradient : OpRewritePattern<TransposeOp> {
  TransposedWeightGradient(MLIRContext *ctx, const FusionOptions &options)
      : OpRewritePattern(ctx), options(options) {}

  LogicalResult matchAndRewrite(TransposeOp transpose,
                                PatternRewriter &rewriter) const override {
    if (transpose.getPermutation() != ArrayRef<int64_t>{1, 0})
      return rewriter.notifyMatchFailure(transpose, "not a 2-D transpose");
    auto grad = transpose.getInput().getDefiningOp<LinearGradWeightOp>();
    if (!grad)
      return rewriter.notifyMatchFailure(transpose, "the input is not a linear_grad_weight");
    if (!grad->hasOneUse())
      return rewriter.notifyMatchFailure(transpose, "the untransposed gradient has other uses");
    if (grad->getAttr(BonsaiDialect::getPhaseAttrName()) !=
        transpose->getAttr(BonsaiDialect::getPhaseAttrName()))
      return rewriter.notifyMatchFailure(transpose, "different phases");
    rewriter.setInsertionPoint(transpose);
    auto swapped = LinearGradWeightOp::create(rewriter, grad.getLoc(),
                                              transpose.getResult().getType(), grad.getInput(),
                                              grad.getResultGrad());
    copyPhase(grad, swapped);
    rewriter.replaceOp(transpose, swapped.getResult());
    rewriter.eraseOp(grad);
    options.fused(swapped, "transpose + linear_grad_weight");
    return success();
  }

  const FusionOptions &options;
};

/// add(linear(x, w), addend) in either order -> linear_add(x, w, addend).
struct LinearAdd : OpRewritePattern<AddOp> {
  LinearAdd(MLIRContext *ctx, const FusionOptions &options)
      : OpRewritePattern(ctx), options(options) {}

  /// The linear that can take the sum's other term as its addend, or null.
  static LinearOp fusableLinear(AddOp add, Value term, Value other) {
    auto linear = term.getDefiningOp<LinearOp>();
    if (!linear || linear.getBias() || !linear->hasOneUse() ||
        linear->getBlock() != add->getBlock() ||
        linear->getAttr(BonsaiDialect::getPhaseAttrName()) !=
            add->getAttr(BonsaiDialect::getPhaseAttrName()))
      return nullptr;
    // No broadcast: the addend is cuBLASLt's C, laid out as the result.
    Type type = add.getResult().getType();
    if (linear.getResult().getType() != type || other.getType() != type)
      return nullptr;
    Type element = cast<ShapedType>(type).getElementType();
    if (!isa<Float32Type, Float16Type, BFloat16Type>(element) ||
        cast<ShapedType>(linear.getInput().getType()).getElementType() != element ||
        cast<ShapedType>(linear.getWeight().getType()).getElementType() != element)
      return nullptr;
    // The fused GEMM runs where the add ran: nothing in between may write what it reads.
    for (Operation *op = linear->getNextNode(); op != add; op = op->getNextNode())
      if (fusion::mayWrite(op, linear.getInput()) || fusion::mayWrite(op, linear.getWeight()))
        return nullptr;
    return linear;
  }

  LogicalResult matchAndRewrite(AddOp add, PatternRewriter &rewriter) const override {
    Value lhs = add.getLhs(), rhs = add.getRhs();
    LinearOp left = fusableLinear(add, lhs, rhs), right = fusableLinear(add, rhs, lhs);
    if (!left && !right)
      return rewriter.notifyMatchFailure(add, "neither term is a linear that can add the other");
    // Of two linears, the one with the longer sum takes the other as its addend: it is
    // compute-bound, so reading C is hidden, while the short one (a LoRA adapter's r-wide
    // product) only writes its result.
    auto sumLength = [](LinearOp linear) {
      return cast<ShapedType>(linear.getInput().getType()).getShape().back();
    };
    bool takeLeft = left && (!right || sumLength(left) >= sumLength(right));
    LinearOp linear = takeLeft ? left : right;
    Value addend = takeLeft ? rhs : lhs;
    rewriter.setInsertionPoint(add);
    auto fused = LinearAddOp::create(rewriter, linear.getLoc(), add.getResult().getType(),
                                     linear.getInput(), linear.getWeight(), addend);
    copyPhase(add, fused);
    rewriter.replaceOp(add, fused.getResult());
    rewriter.eraseOp(linear);
    options.fused(fused, "linear + add");
    return success();
  }

  const FusionOptions &options;
};

/// gelu_tanh(linear(x, w[, b])) -> linear_gelu(x, w[, b]) (result, pre-activation).
struct LinearGeLU : OpRewritePattern<GeLUOp> {
  LinearGeLU(MLIRContext *ctx, const FusionOptions &options)
      : OpRewritePattern(ctx), options(options) {}

  LogicalResult matchAndRewrite(GeLUOp gelu, PatternRewriter &rewriter) const override {
    if (gelu.getApproximation() != GeluApproximation::Tanh)
      return rewriter.notifyMatchFailure(
          gelu, "cuBLASLt's GELU epilogue is the tanh approximation; exact GELU stays unfused");
    auto linear = gelu.getInput().getDefiningOp<LinearOp>();
    if (!linear)
      return rewriter.notifyMatchFailure(gelu, "the input is not a bonsai.linear");
    if (linear->getBlock() != gelu->getBlock())
      return rewriter.notifyMatchFailure(gelu, "linear in another block");
    if (linear->getAttr(BonsaiDialect::getPhaseAttrName()) !=
        gelu->getAttr(BonsaiDialect::getPhaseAttrName()))
      return rewriter.notifyMatchFailure(gelu, "linear and gelu run in different phases");
    Type element = linear.getResult().getType().getElementType();
    if (!isa<Float32Type, Float16Type, BFloat16Type>(element))
      return rewriter.notifyMatchFailure(gelu, "not an f32, f16 or bf16 GEMM");
    // The fused op replaces the linear where it is (the gelu's users all come after it).
    rewriter.setInsertionPoint(linear);
    Type type = linear.getResult().getType();
    auto fused = LinearGeLUOp::create(rewriter, linear.getLoc(), type, type, linear.getInput(),
                                      linear.getWeight(), linear.getBias());
    copyPhase(linear, fused);
    rewriter.replaceOp(gelu, fused.getResult());
    rewriter.replaceOp(linear, fused.getPreActivation());
    options.fused(fused, "linear + gelu");
    return success();
  }

  const FusionOptions &options;
};

} // namespace

void populateGemmEpilogueFusionPatterns(RewritePatternSet &patterns,
                                        const FusionOptions &options) {
  patterns.add<AccumulateIntoProducer, TransposedWeightGradient, LinearAdd, LinearGeLU>(
      patterns.getContext(), options);
}

} // namespace mlir::bonsai
