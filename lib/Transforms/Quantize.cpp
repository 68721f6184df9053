//===- Quantize.cpp - NF4 storage of the recipe's frozen linear weights ---===//
//
// The `bonsai-quantize` pass (see Passes.td and docs/quantization.md). The parameter keeps
// its name, so weights are still bound by their checkpoint key; only its type changes, to
// the NF4 element type, and a bonsai.dequantize gives its users the compute type they had.
// The quantization itself happens in the runtime, when the weights are bound.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Dialect/Bonsai/IR/ModelSummary.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "bonsai-quantize"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIQUANTIZEPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {


struct QuantizePass : impl::BonsaiQuantizePassBase<QuantizePass> {
  using Base::Base;

  /// The model functions `directive`'s recipe applies to: the one it names, or every model
  /// function of the module (the recipe verifier has checked that there is one).
  SmallVector<func::FuncOp> getModels(QuantizeDirectiveOp directive) {
    auto recipe = directive->getParentOfType<RecipeOp>();
    SmallVector<func::FuncOp> models;
    for (auto function : getOperation().getOps<func::FuncOp>()) {
      if (function.isExternal() || function.getBody().getOps<ParamOp>().empty())
        continue;
      if (FlatSymbolRefAttr model = recipe.getModelAttr();
          model && model.getValue() != function.getSymName())
        continue;
      models.push_back(function);
    }
    return models;
  }

  LogicalResult quantizeFunction(func::FuncOp function, QuantizeDirectiveOp directive) {
    ModelSummary model(function);
    SmallVector<StringRef> patterns = directive.getTargetPatterns();
    auto type = NF4Type::getChecked([&] { return directive.emitOpError(); }, &getContext(),
                                    unsigned(directive.getBlockSize()),
                                    unsigned(directive.getDoubleQuantBlock()));
    if (!type)
      return failure();

    // Each targeted parameter once, in model order (a weight may feed several linears).
    llvm::SetVector<ParamOp> targets;
    for (const LinearSummary *linear : model.matchLinears(patterns)) {
      // Adapters are what trains, never what a quantize target means, even when a glob
      // happens to match them.
      if (!linear->weight->addedByPass)
        targets.insert(cast<ParamOp>(linear->weight->op));
    }
    if (targets.empty())
      return directive.emitOpError()
             << "no linear weight of @" << function.getSymName() << " matches the targets";

    for (ParamOp param : targets) {
      RankedTensorType weightType = param.getResult().getType();
      if (isa<NF4Type>(weightType.getElementType()))
        continue; // Already quantized: the pass is idempotent.
      if (param.getTrainable())
        return (param.emitError()
                << "weight '" << param.getName()
                << "' is trainable, but NF4 weights are frozen: add a bonsai.lora directive "
                   "that targets it (it freezes the base weight) or declare it frozen")
                   .attachNote(directive.getLoc())
               << "quantized by this directive";
      if (!isa<BFloat16Type, Float16Type, Float32Type>(weightType.getElementType()))
        return param.emitError() << "weight '" << param.getName() << "' is "
                                 << weightType.getElementType()
                                 << "; NF4 quantizes bf16, f16 or f32 weights";
      int64_t n = getNumElements(weightType);
      if (n % int64_t(directive.getBlockSize()) != 0)
        return param.emitError() << "weight '" << param.getName() << "' has " << n
                                 << " elements, not a multiple of the NF4 block size "
                                 << int64_t(directive.getBlockSize());

      // The dequantized weight is made right before its first use, so that it lives only
      // from there to its last use (users follow their operand in the block).
      Operation *firstUser = nullptr;
      for (Operation *user : param.getResult().getUsers())
        if (!firstUser || user->isBeforeInBlock(firstUser))
          firstUser = user;
      if (!firstUser)
        continue; // An unused weight: nothing reads it, nothing to quantize.

      auto quantizedType = RankedTensorType::get(weightType.getShape(), type);
      param.getResult().setType(quantizedType);
      OpBuilder builder(firstUser);
      auto dequantize =
          DequantizeOp::create(builder, param.getLoc(), weightType, param.getResult());
      param.getResult().replaceAllUsesExcept(dequantize.getResult(), dequantize);
      ++numQuantized;
      bytesSaved += getStorageBytes(weightType) - getStorageBytes(quantizedType);
      LLVM_DEBUG(llvm::dbgs() << "quantized " << param.getName() << "\n");
    }
    return success();
  }

  void runOnOperation() override {
    SmallVector<QuantizeDirectiveOp> directives;
    getOperation().walk([&](QuantizeDirectiveOp op) { directives.push_back(op); });
    if (directives.empty())
      return;
    for (QuantizeDirectiveOp directive : directives)
      for (func::FuncOp function : getModels(directive))
        if (failed(quantizeFunction(function, directive)))
          return signalPassFailure();
  }
};

} // namespace
} // namespace mlir::bonsai
