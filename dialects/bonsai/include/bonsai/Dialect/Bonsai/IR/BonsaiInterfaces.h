//===- BonsaiInterfaces.h - bonsai op interfaces ---------------------------===//
//
// Cost, gradient and recipe-directive interfaces (see BonsaiInterfaces.td).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIINTERFACES_H
#define BONSAI_DIALECT_BONSAI_IR_BONSAIINTERFACES_H

#include "bonsai/Dialect/Bonsai/IR/BonsaiCost.h"
#include "bonsai/Dialect/Bonsai/IR/ModelSummary.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"
#include "llvm/ADT/STLFunctionalExtras.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiInterfaces.h.inc"

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIINTERFACES_H
