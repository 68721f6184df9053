//===- BonsaiOps.h - bonsai model and recipe operations --------------------===//
//
// Declares the ops of the `bonsai` dialect (see BonsaiOps.td).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIOPS_H
#define BONSAI_DIALECT_BONSAI_IR_BONSAIOPS_H

#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiInterfaces.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/ViewLikeInterface.h"

#define GET_OP_CLASSES
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h.inc"

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIOPS_H
