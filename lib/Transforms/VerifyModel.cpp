//===- VerifyModel.cpp - Check that model functions are training graphs ---===//
//
// The `bonsai-verify-model` pass: the checks that span a whole function and so do not belong
// to any single op's verifier (unique parameter names, the loss, the inputs).
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIVERIFYMODELPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
struct VerifyModelPass : impl::BonsaiVerifyModelPassBase<VerifyModelPass> {
  using Base::Base;

  /// Checks one model function; reports every problem it finds.
  LogicalResult verifyModel(FunctionOpInterface function) {
    bool ok = true;
    llvm::StringMap<ParamOp> byName;
    for (ParamOp param : function.getFunctionBody().getOps<ParamOp>()) {
      auto [it, inserted] = byName.try_emplace(param.getName(), param);
      if (!inserted) {
        param.emitError() << "parameter '" << param.getName() << "' is declared twice"
                          << "; a parameter used twice (tied weights) is one bonsai.param with "
                             "two uses";
        ok = false;
      }
    }
    for (auto [i, type] : llvm::enumerate(function.getArgumentTypes())) {
      auto tensor = dyn_cast<RankedTensorType>(type);
      if (!tensor || !tensor.hasStaticShape() || !tensor.getElementType().isInteger()) {
        function.emitError() << "argument " << i << " of model @" << function.getName()
                             << " has type " << type
                             << "; model inputs are statically shaped integer tensors "
                                "(token ids, labels)";
        ok = false;
      }
    }
    ArrayRef<Type> results = function.getResultTypes();
    auto loss = results.size() == 1 ? dyn_cast<RankedTensorType>(results[0]) : nullptr;
    if (!loss || loss.getRank() != 0 || !loss.getElementType().isF32()) {
      InFlightDiagnostic diag = function.emitError()
                                << "model @" << function.getName()
                                << " must return exactly one tensor<f32> loss, returns ";
      if (results.empty())
        diag << "nothing";
      else
        llvm::interleaveComma(results, diag);
      ok = false;
    }
    return success(ok);
  }

  void runOnOperation() override {
    bool ok = true;
    for (auto function : getOperation().getOps<FunctionOpInterface>())
      if (!function.isExternal() && !function.getFunctionBody().getOps<ParamOp>().empty())
        ok &= succeeded(verifyModel(function));
    if (!ok)
      signalPassFailure();
    markAllAnalysesPreserved();
  }
};
} // namespace
} // namespace mlir::bonsai
