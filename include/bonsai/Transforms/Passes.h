//===- Passes.h - Bonsai compiler passes ------------------------*- C++ -*-===//
//
// Declarations and registration of the Bonsai passes (see Passes.td).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TRANSFORMS_PASSES_H
#define BONSAI_TRANSFORMS_PASSES_H

#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::bonsai {

#define GEN_PASS_DECL
#include "bonsai/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "bonsai/Transforms/Passes.h.inc"

} // namespace mlir::bonsai

#endif // BONSAI_TRANSFORMS_PASSES_H
