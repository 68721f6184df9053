//===- Autodiff.cpp - Reverse-mode differentiation of model functions -----===//
//
// The `bonsai-autodiff` pass (see Passes.td). The pass knows no op: every rule lives with its
// op, behind GradientOpInterface.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIAUTODIFFPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// Marks every op a builder inserts with the phase it belongs to.
struct PhaseMarker : public OpBuilder::Listener {
  explicit PhaseMarker(StringAttr phase) : phase(phase) {}
  void notifyOperationInserted(Operation *op, OpBuilder::InsertPoint) override {
    op->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
    ++count;
  }
  StringAttr phase;
  unsigned count = 0;
};

struct AutodiffPass : impl::BonsaiAutodiffPassBase<AutodiffPass> {
  using Base::Base;

  /// Builds the gradients of `op`'s operands from those of its results, summing into
  /// `gradients` where a value has several uses.
  LogicalResult differentiateOp(Operation *op, OpBuilder &builder,
                                llvm::DenseMap<Value, Value> &gradients,
                                function_ref<bool(Value)> needsGradient) {
    if (isa<ParamOp>(op))
      return success();
    SmallVector<Value> resultGradients;
    bool any = false;
    for (Value r : op->getResults()) {
      resultGradients.push_back(gradients.lookup(r));
      any |= bool(resultGradients.back());
    }
    if (!any || llvm::none_of(op->getOperands(), needsGradient))
      return success();
    auto rule = dyn_cast<GradientOpInterface>(op);
    if (!rule)
      return op->emitError() << "'" << op->getName()
                             << "' cannot be differentiated: it has no gradient rule";
    SmallVector<Value> operandGradients;
    if (failed(rule.buildGradients(builder, resultGradients, needsGradient, operandGradients)))
      return failure();
    for (auto [operand, gradient] : llvm::zip(op->getOperands(), operandGradients)) {
      if (!gradient)
        continue;
      Value &slot = gradients[operand];
      // A value used twice (a tied weight, a residual) sums its gradients.
      slot = slot ? AddOp::create(builder, op->getLoc(), operand.getType(), slot, gradient)
                        .getResult()
                  : gradient;
    }
    return success();
  }

  LogicalResult differentiate(func::FuncOp function) {
    Block &body = function.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    if (ret.getNumOperands() != 1)
      return function.emitError("autodiff needs a model that returns one loss");
    Value loss = ret.getOperand(0);

    // Values that depend on a trainable parameter need a gradient.
    llvm::DenseSet<Value> needs;
    for (Operation &op : body.without_terminator()) {
      if (auto param = dyn_cast<ParamOp>(op)) {
        if (param.getTrainable())
          needs.insert(param.getResult());
        continue;
      }
      if (llvm::any_of(op.getOperands(), [&](Value v) { return needs.contains(v); }))
        needs.insert(op.getResults().begin(), op.getResults().end());
    }
    if (!needs.contains(loss))
      return function.emitError("the loss depends on no trainable parameter: nothing to "
                                "differentiate");
    auto needsGradient = [&](Value v) { return needs.contains(v); };

    PhaseMarker marker(StringAttr::get(&getContext(), "backward"));
    OpBuilder builder(ret);
    builder.setListener(&marker);
    llvm::DenseMap<Value, Value> gradients;
    gradients[loss] = LossScaleOp::create(builder, ret.getLoc(), loss.getType());

    // Walk the forward ops backwards (the backward ops are inserted after all of them).
    SmallVector<Operation *> forward;
    llvm::DenseMap<Operation *, unsigned> position;
    for (Operation &op : body.without_terminator()) {
      position[&op] = forward.size();
      forward.push_back(&op);
    }

    // A parameter's gradient is complete once the walk has passed its first use in the
    // forward order: it goes into its accumulator right then, so that the step-arena gradient
    // dies there instead of living to the end of the backward pass (for Llama-2-7B the weight
    // gradients held to the end would be 12.5 GiB that no recomputation could remove).
    llvm::DenseMap<Operation *, SmallVector<ParamOp>> completedAt;
    SmallVector<ParamOp> unused;
    for (Operation *op : forward) {
      auto param = dyn_cast<ParamOp>(op);
      if (!param || !param.getTrainable())
        continue;
      Operation *first = nullptr;
      for (Operation *user : param.getResult().getUsers())
        if (position.contains(user) && (!first || position[user] < position[first]))
          first = user;
      if (first)
        completedAt[first].push_back(param);
      else
        unused.push_back(param);
    }
    auto accumulate = [&](ParamOp param) {
      Value gradient = gradients.lookup(param.getResult());
      if (!gradient) {
        param.emitWarning() << "trainable parameter '" << param.getName()
                            << "' does not influence the loss; it gets no gradient";
        return;
      }
      // Accumulators are fp32 whatever the parameter's type, so that summing micro-batches
      // and the optimizer's reads do not lose the small gradients bf16 would round away.
      auto f32 = RankedTensorType::get(param.getType().getShape(), builder.getF32Type());
      auto state = StateOp::create(builder, param.getLoc(), f32, StateKind::Gradient,
                                   param.getName(), StringAttr());
      AccumulateOp::create(builder, param.getLoc(), gradient, state);
      ++numGradients;
    };

    for (Operation *op : llvm::reverse(forward)) {
      if (failed(differentiateOp(op, builder, gradients, needsGradient)))
        return failure();
      // The op's operand gradients are final now for every parameter whose first use it is.
      auto it = completedAt.find(op);
      if (it != completedAt.end())
        for (ParamOp param : it->second)
          accumulate(param);
    }

    // Parameters no op uses never got a gradient; the warning says so.
    for (ParamOp param : unused)
      accumulate(param);
    numBackwardOps += marker.count;
    return success();
  }

  void runOnOperation() override {
    for (auto function : getOperation().getOps<func::FuncOp>())
      if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
        if (failed(differentiate(function)))
          return signalPassFailure();
  }
};
} // namespace
} // namespace mlir::bonsai
