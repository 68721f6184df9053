//===- Passes.h - Conversions between Bonsai's dialects -------*- C++ -*-===//
//
// Declarations and registration of the conversion passes (see Passes.td).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_CONVERSION_PASSES_H
#define BONSAI_CONVERSION_PASSES_H

#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::bonsai {

#define GEN_PASS_DECL
#include "bonsai/Conversion/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "bonsai/Conversion/Passes.h.inc"

} // namespace mlir::bonsai

#endif // BONSAI_CONVERSION_PASSES_H
