//===- InitAll.h - Register Bonsai's dialects and passes ----------*- C++ -*-===//
//
// What the Bonsai tools register: the project's dialects and passes, and only the upstream
// dialects the bonsai IR is written with.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_INITALL_H
#define BONSAI_INITALL_H

#include "bonsai/Conversion/Passes.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Pipelines/Pipelines.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"

namespace mlir::bonsai {

/// Adds the dialects a bonsai module may contain to `registry`.
inline void registerAllDialects(DialectRegistry &registry) {
  registry.insert<BonsaiDialect, plan::PlanDialect, func::FuncDialect>();
}

/// Registers every Bonsai pass with the global pass registry (for command-line tools).
inline void registerAllPasses() {
  registerBonsaiConversionPasses();
  registerBonsaiTransformsPasses();
  registerPipelines();
}

} // namespace mlir::bonsai

#endif // BONSAI_INITALL_H
