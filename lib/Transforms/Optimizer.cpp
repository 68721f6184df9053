//===- Optimizer.cpp - Expand the recipe's optimizer into updates ---------===//
//
// The `bonsai-optimizer` pass (see Passes.td).
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIOPTIMIZERPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

struct OptimizerPass : impl::BonsaiOptimizerPassBase<OptimizerPass> {
  using Base::Base;

  /// The module's optimizer directive; an error when there is none or more than one.
  FailureOr<OptimizerDirectiveOp> findDirective() {
    SmallVector<OptimizerDirectiveOp> found;
    getOperation().walk([&](OptimizerDirectiveOp op) { found.push_back(op); });
    if (found.size() == 1)
      return found.front();
    getOperation().emitError() << "bonsai-optimizer needs exactly one bonsai.optimizer "
                                  "directive in the module's recipe, found "
                               << found.size();
    return failure();
  }

  LogicalResult expand(func::FuncOp function, OptimizerDirectiveOp directive) {
    Block &body = function.getBody().front();
    SmallVector<StateOp> accumulators;
    llvm::StringMap<ParamOp> params;
    LossScaleOp lossScale;
    for (Operation &op : body) {
      if (auto param = dyn_cast<ParamOp>(op))
        params[param.getName()] = param;
      if (auto state = dyn_cast<StateOp>(op); state && state.getKind() == StateKind::Gradient)
        accumulators.push_back(state);
      if (auto seed = dyn_cast<LossScaleOp>(op))
        lossScale = seed;
    }
    if (accumulators.empty())
      return function.emitError("no gradient to apply: run bonsai-autodiff first (or the model "
                                "has no trainable parameter)");
    bool inBackward = directive.getUpdateInBackward();

    MLIRContext *ctx = &getContext();
    Operation *ret = body.getTerminator();
    OpBuilder builder(ret);
    Location loc = directive.getLoc();
    StringAttr update = StringAttr::get(ctx, "update");
    StringAttr backward = StringAttr::get(ctx, "backward");
    auto mark = [&](Operation *op, StringAttr phase) {
      op->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
      return op;
    };
    auto f32Scalar = RankedTensorType::get({}, builder.getF32Type());
    // In the backward pass, the learning rate is needed before the first update: it is
    // computed where the backward pass starts (from the step counter, which the update
    // phase increments after every parameter has been updated).
    if (inBackward)
      builder.setInsertionPointAfter(lossScale ? lossScale.getOperation()
                                               : accumulators.front().getOperation());
    auto step = StateOp::create(builder, loc, RankedTensorType::get({}, builder.getI64Type()),
                                StateKind::Optimizer, "optimizer.step", StringAttr());
    auto lr = LearningRateOp::create(builder, loc, f32Scalar, step, directive.getLrAttr(),
                                     directive.getScheduleAttr(), directive.getWarmupStepsAttr(),
                                     directive.getTotalStepsAttr(),
                                     directive.getMinLrRatioAttr());
    mark(lr, inBackward ? backward : update);

    // The global gradient norm: in the update phase over the accumulators; in the backward
    // pass, each gradient's own norm where it is complete, and the update phase combines them
    // (sqrt of the sum of squares), so that the metric is the same.
    Value norm;
    builder.setInsertionPoint(ret);
    if (!inBackward) {
      SmallVector<Value> gradients = llvm::map_to_vector(
          accumulators, [](StateOp s) -> Value { return s.getResult(); });
      norm = mark(GradNormOp::create(builder, loc, f32Scalar, gradients), update)->getResult(0);
    }

    bool adamw = directive.getKind() == "adamw";
    SmallVector<Value> partialNorms;
    for (StateOp accumulator : accumulators) {
      ParamOp param = params.lookup(accumulator.getName());
      if (!param)
        return accumulator.emitError() << "gradient '" << accumulator.getName()
                                       << "' belongs to no parameter of the model";
      // The gradient an update reads: the accumulator, or in the backward pass the gradient
      // the accumulator would have received, right where it is complete.
      Value gradient = accumulator.getResult();
      StringAttr phase = update;
      AccumulateOp accumulate;
      if (inBackward) {
        for (Operation *user : accumulator->getUsers())
          if (auto acc = dyn_cast<AccumulateOp>(user))
            accumulate = acc;
        if (!accumulate || !accumulator->hasOneUse())
          return accumulator.emitError() << "update_in_backward needs the gradient of '"
                                         << accumulator.getName()
                                         << "' to have exactly one accumulation";
        gradient = accumulate.getGradient();
        phase = backward;
        builder.setInsertionPoint(accumulate);
        Value partial = mark(GradNormOp::create(builder, param.getLoc(), f32Scalar,
                                                ValueRange{gradient}),
                             backward)
                            ->getResult(0);
        partialNorms.push_back(partial);
        // Read only when clipping, which update_in_backward excludes.
        norm = partial;
      }
      RankedTensorType type = param.getType();
      auto f32 = RankedTensorType::get(type.getShape(), builder.getF32Type());
      auto state = [&](StringRef suffix, StringAttr copyOf = {}) {
        stateBytes += getNumElements(f32) * 4;
        return StateOp::create(builder, param.getLoc(), f32, StateKind::Optimizer,
                               (param.getName() + suffix).str(), copyOf)
            .getResult();
      };
      // Parameters stored in bf16/f16 are updated through an fp32 master copy, so that small
      // updates are not rounded away, unless the recipe trades that for the memory.
      Value master = type.getElementType().isF32() || !directive.getMasterWeights()
                         ? Value()
                         : state(".master", param.getNameAttr());
      if (adamw) {
        Value m = state(".exp_avg"), v = state(".exp_avg_sq");
        mark(AdamWUpdateOp::create(builder, param.getLoc(), gradient, step, lr, norm, param, m,
                                   v, master, directive.getBeta1Attr(), directive.getBeta2Attr(),
                                   directive.getEpsAttr(), directive.getWeightDecayAttr(),
                                   directive.getGradClipAttr()),
             phase);
      } else {
        Value buffer = state(".momentum_buffer");
        mark(SGDUpdateOp::create(builder, param.getLoc(), gradient, lr, norm, param, buffer,
                                 master, directive.getMomentumAttr(),
                                 directive.getWeightDecayAttr(), directive.getGradClipAttr()),
             phase);
      }
      if (inBackward) {
        // No accumulator: the gradient dies with its update.
        accumulate.erase();
        accumulator.erase();
      } else {
        mark(ZeroOp::create(builder, param.getLoc(), accumulator), update);
      }
      ++numUpdates;
    }
    builder.setInsertionPoint(ret);
    if (inBackward)
      norm = mark(GradNormOp::create(builder, loc, f32Scalar, partialNorms), update)
                 ->getResult(0);
    mark(StepIncrementOp::create(builder, loc, step), update);
    mark(MetricOp::create(builder, loc, "grad_norm", norm), update);
    mark(MetricOp::create(builder, loc, "lr", lr), update);
    return success();
  }

  void runOnOperation() override {
    FailureOr<OptimizerDirectiveOp> directive = findDirective();
    if (failed(directive))
      return signalPassFailure();
    for (auto function : getOperation().getOps<func::FuncOp>())
      if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
        if (failed(expand(function, *directive)))
          return signalPassFailure();
  }
};
} // namespace
} // namespace mlir::bonsai
