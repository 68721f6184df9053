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
    op->setAttr("bonsai.phase", phase);
    ++count;
  }
  StringAttr phase;
  unsigned count = 0;
};

struct AutodiffPass : impl::BonsaiAutodiffPassBase<AutodiffPass> {
  using Base::Base;

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
    for (Operation &op : body.without_terminator())
      forward.push_back(&op);
    for (Operation *op : llvm::reverse(forward)) {
      if (isa<ParamOp>(op))
        continue;
      SmallVector<Value> resultGradients;
      bool any = false;
      for (Value r : op->getResults()) {
        resultGradients.push_back(gradients.lookup(r));
        any |= bool(resultGradients.back());
      }
      if (!any || llvm::none_of(op->getOperands(), needsGradient))
        continue;
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
    }

    // Each trainable parameter's gradient goes into its persistent accumulator.
    for (Operation *op : forward) {
      auto param = dyn_cast<ParamOp>(op);
      if (!param || !param.getTrainable())
        continue;
      Value gradient = gradients.lookup(param.getResult());
      if (!gradient) {
        param.emitWarning() << "trainable parameter '" << param.getName()
                            << "' does not influence the loss; it gets no gradient";
        continue;
      }
      // Accumulators are fp32 whatever the parameter's type, so that summing micro-batches
      // and the optimizer's reads do not lose the small gradients bf16 would round away.
      auto f32 = RankedTensorType::get(param.getType().getShape(), builder.getF32Type());
      auto state = StateOp::create(builder, param.getLoc(), f32, StateKind::Gradient,
                                   param.getName(), StringAttr());
      AccumulateOp::create(builder, param.getLoc(), gradient, state);
      ++numGradients;
    }
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
