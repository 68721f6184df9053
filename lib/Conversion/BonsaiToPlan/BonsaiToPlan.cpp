//===- BonsaiToPlan.cpp - Lower model functions to bonsai_plan steps ------===//
//
// A direct walk over each model function: values become buffers, views stay views, kernels
// become launches. The function is replaced by the step. Ops are asked through interfaces
// (KernelOpInterface, ViewLikeOpInterface) what they become; nothing here names a model op.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Conversion/Passes.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SmallVector.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAILOWERTOPLANPASS
#include "bonsai/Conversion/Passes.h.inc"

namespace {

constexpr StringLiteral kWeightsArena = "weights";
constexpr StringLiteral kActivationsArena = "activations";

/// The name of a model input, from how the model uses it: the ids of an embedding, the labels
/// of a loss, or its position.
std::string getInputName(BlockArgument arg) {
  for (OpOperand &use : arg.getUses()) {
    if (auto embedding = dyn_cast<EmbeddingOp>(use.getOwner());
        embedding && use.get() == embedding.getIds())
      return "ids";
    if (auto loss = dyn_cast<CrossEntropyOp>(use.getOwner());
        loss && use.get() == loss.getLabels())
      return "labels";
  }
  return "input" + std::to_string(arg.getArgNumber());
}

struct LowerToPlanPass : impl::BonsaiLowerToPlanPassBase<LowerToPlanPass> {
  using Base::Base;

  /// The buffer type of a tensor; fails for element types with no runtime layout yet.
  FailureOr<MemRefType> getBufferType(Operation *op, Type type) {
    auto tensor = cast<RankedTensorType>(type);
    if (isa<NF4Type>(tensor.getElementType())) {
      op->emitError() << "NF4 tensors have no runtime layout yet: run the quantize pass's "
                         "lowering first (" << tensor << ")";
      return failure();
    }
    return MemRefType::get(tensor.getShape(), tensor.getElementType());
  }

  LogicalResult lowerFunction(func::FuncOp function) {
    OpBuilder builder(function);
    Location loc = function.getLoc();
    int64_t tokens = 0;
    function.walk([&](CrossEntropyOp loss) {
      tokens = getNumElements(cast<ShapedType>(loss.getLabels().getType()));
    });
    auto step = plan::StepOp::create(builder, loc, function.getSymName(), target,
                                     deviceMemory, tokens);
    Block *body = builder.createBlock(&step.getBody());
    builder.setInsertionPointToStart(body);
    plan::ArenaOp::create(builder, loc, kWeightsArena, plan::Lifetime::Persistent,
                          plan::MemorySpace::Device, 0, 256);
    plan::ArenaOp::create(builder, loc, kActivationsArena, plan::Lifetime::Step,
                          plan::MemorySpace::Device, 0, 256);
    StringRef weights = kWeightsArena, activations = kActivationsArena;

    IRMapping mapping;
    for (BlockArgument arg : function.getArguments()) {
      FailureOr<MemRefType> type = getBufferType(function, arg.getType());
      if (failed(type))
        return failure();
      auto buffer = plan::BufferOp::create(
          builder, loc, *type, activations, IntegerAttr(), plan::BufferRole::Input,
          getInputName(arg), false, builder.getI64IntegerAttr(arg.getArgNumber()));
      mapping.map(arg, buffer.getResult());
    }

    Operation *terminator = function.getBody().front().getTerminator();
    unsigned counter = 0;
    for (Operation &op : function.getBody().front().without_terminator()) {
      if (auto param = dyn_cast<ParamOp>(op)) {
        FailureOr<MemRefType> type = getBufferType(&op, param.getType());
        if (failed(type))
          return failure();
        auto buffer = plan::BufferOp::create(builder, op.getLoc(), *type, weights, IntegerAttr(),
                                             plan::BufferRole::Parameter, param.getName(),
                                             param.getTrainable(), IntegerAttr());
        mapping.map(param.getResult(), buffer.getResult());
        continue;
      }
      if (auto view = dyn_cast<ViewLikeOpInterface>(op)) {
        FailureOr<MemRefType> type = getBufferType(&op, op.getResult(0).getType());
        if (failed(type))
          return failure();
        auto lowered = plan::ViewOp::create(builder, op.getLoc(), *type,
                                            mapping.lookup(view.getViewSource()));
        mapping.map(op.getResult(0), lowered.getResult());
        continue;
      }
      auto kernel = dyn_cast<KernelOpInterface>(op);
      if (!kernel)
        return op.emitError() << "'" << op.getName()
                              << "' has no runtime kernel and cannot be lowered to a plan";
      SmallVector<Value> outs;
      for (Value result : op.getResults()) {
        FailureOr<MemRefType> type = getBufferType(&op, result.getType());
        if (failed(type))
          return failure();
        bool isLoss = llvm::is_contained(terminator->getOperands(), result);
        std::string name = (kernel.getKernelName() + "." + Twine(counter++)).str();
        auto buffer = plan::BufferOp::create(
            builder, op.getLoc(), *type, activations, IntegerAttr(),
            isLoss ? plan::BufferRole::Loss : plan::BufferRole::Activation, name, false,
            IntegerAttr());
        mapping.map(result, buffer.getResult());
        outs.push_back(buffer.getResult());
      }
      SmallVector<Value> ins = llvm::map_to_vector(
          op.getOperands(), [&](Value v) { return mapping.lookup(v); });
      plan::LaunchOp::create(builder, op.getLoc(), kernel.getKernelName(), ins, outs,
                             kernel.getKernelParams(), 0);
    }
    function.erase();
    return success();
  }

  void runOnOperation() override {
    SmallVector<func::FuncOp> models;
    for (auto function : getOperation().getOps<func::FuncOp>())
      if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
        models.push_back(function);
    if (models.empty()) {
      getOperation().emitError("no model function to lower: no func.func declares a "
                               "bonsai.param");
      return signalPassFailure();
    }
    for (func::FuncOp function : models)
      if (failed(lowerFunction(function)))
        return signalPassFailure();
  }
};
} // namespace
} // namespace mlir::bonsai
