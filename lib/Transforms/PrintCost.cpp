//===- PrintCost.cpp - Print the cost report of every model function ------===//
//
// The `bonsai-print-cost` pass: an analysis with a report, leaving the IR as it is.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/ModelCost.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIPRINTCOSTPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {
struct PrintCostPass : impl::BonsaiPrintCostPassBase<PrintCostPass> {
  using Base::Base;

  void runOnOperation() override {
    for (auto function : getOperation().getOps<FunctionOpInterface>()) {
      if (function.isExternal() || function.getFunctionBody().getOps<ParamOp>().empty())
        continue;
      computeModelCost(function).print(llvm::outs(), perLayer);
    }
    llvm::outs().flush();
    markAllAnalysesPreserved();
  }
};
} // namespace
} // namespace mlir::bonsai
