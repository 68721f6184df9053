//===- PlanDialect.h - The scheduled plan dialect --------------------------===//
//
// Declares the `bonsai_plan` dialect, its enums and its ops (see PlanOps.td).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_PLAN_IR_PLANDIALECT_H
#define BONSAI_DIALECT_PLAN_IR_PLANDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

#include "bonsai/Dialect/Plan/IR/PlanDialect.h.inc"
#include "bonsai/Dialect/Plan/IR/PlanEnums.h.inc"
#include "bonsai/Dialect/Plan/IR/PlanStreams.h"
#include "bonsai/Dialect/Plan/IR/PlanTypeInterfaces.h"

#define GET_OP_CLASSES
#include "bonsai/Dialect/Plan/IR/PlanOps.h.inc"

namespace mlir::bonsai::plan {

/// Bytes of a statically shaped memref: elements rounded up to whole bytes, or the packed
/// layout's size for an element type with PackedElementTypeInterface.
int64_t getMemRefBytes(MemRefType type);

/// The buffer a memref value is stored in, looking through views; null if it is not one.
BufferOp getUnderlyingBuffer(Value value);

} // namespace mlir::bonsai::plan

#endif // BONSAI_DIALECT_PLAN_IR_PLANDIALECT_H
