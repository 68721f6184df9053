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
    for (Operation &op : body) {
      if (auto param = dyn_cast<ParamOp>(op))
        params[param.getName()] = param;
      if (auto state = dyn_cast<StateOp>(op); state && state.getKind() == StateKind::Gradient)
        accumulators.push_back(state);
    }
    if (accumulators.empty())
      return function.emitError("no gradient to apply: run bonsai-autodiff first (or the model "
                                "has no trainable parameter)");

    MLIRContext *ctx = &getContext();
    Operation *ret = body.getTerminator();
    OpBuilder builder(ret);
    Location loc = directive.getLoc();
    StringAttr update = StringAttr::get(ctx, "update");
    auto mark = [&](Operation *op) {
      op->setAttr("bonsai.phase", update);
      return op;
    };
    auto f32Scalar = RankedTensorType::get({}, builder.getF32Type());
    auto step = StateOp::create(builder, loc, RankedTensorType::get({}, builder.getI64Type()),
                                StateKind::Optimizer, "optimizer.step", StringAttr());
    auto lr = LearningRateOp::create(builder, loc, f32Scalar, step, directive.getLrAttr(),
                                     directive.getScheduleAttr(), directive.getWarmupStepsAttr(),
                                     directive.getTotalStepsAttr(),
                                     directive.getMinLrRatioAttr());
    mark(lr);
    SmallVector<Value> gradients = llvm::map_to_vector(
        accumulators, [](StateOp s) -> Value { return s.getResult(); });
    auto norm = GradNormOp::create(builder, loc, f32Scalar, gradients);
    mark(norm);

    bool adamw = directive.getKind() == "adamw";
    for (StateOp accumulator : accumulators) {
      ParamOp param = params.lookup(accumulator.getName());
      if (!param)
        return accumulator.emitError() << "gradient '" << accumulator.getName()
                                       << "' belongs to no parameter of the model";
      RankedTensorType type = param.getType();
      auto f32 = RankedTensorType::get(type.getShape(), builder.getF32Type());
      auto state = [&](StringRef suffix, StringAttr copyOf = {}) {
        stateBytes += getNumElements(f32) * 4;
        return StateOp::create(builder, param.getLoc(), f32, StateKind::Optimizer,
                               (param.getName() + suffix).str(), copyOf)
            .getResult();
      };
      // Parameters stored in bf16/f16 are updated through an fp32 master copy, so that small
      // updates are not rounded away.
      Value master = type.getElementType().isF32()
                         ? Value()
                         : state(".master", param.getNameAttr());
      if (adamw) {
        Value m = state(".exp_avg"), v = state(".exp_avg_sq");
        mark(AdamWUpdateOp::create(builder, param.getLoc(), accumulator, step, lr, norm,
                                   param, m, v, master, directive.getBeta1Attr(),
                                   directive.getBeta2Attr(), directive.getEpsAttr(),
                                   directive.getWeightDecayAttr(), directive.getGradClipAttr()));
      } else {
        Value buffer = state(".momentum_buffer");
        mark(SGDUpdateOp::create(builder, param.getLoc(), accumulator, lr, norm, param, buffer,
                                 master, directive.getMomentumAttr(),
                                 directive.getWeightDecayAttr(), directive.getGradClipAttr()));
      }
      mark(ZeroOp::create(builder, param.getLoc(), accumulator));
      ++numUpdates;
    }
    mark(StepIncrementOp::create(builder, loc, step));
    mark(MetricOp::create(builder, loc, "grad_norm", norm));
    mark(MetricOp::create(builder, loc, "lr", lr));
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
