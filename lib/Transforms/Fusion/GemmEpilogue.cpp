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
  if (Attribute phase = from->getAttr("bonsai.phase"))
    to->setAttr("bonsai.phase", phase);
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
    if (grad->getAttr("bonsai.phase") != transpose->getAttr("bonsai.phase"))
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
    if (linear->getAttr("bonsai.phase") != gelu->getAttr("bonsai.phase"))
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
  patterns.add<AccumulateIntoProducer, TransposedWeightGradient, LinearGeLU>(patterns.getContext(), options);
}

} // namespace mlir::bonsai
