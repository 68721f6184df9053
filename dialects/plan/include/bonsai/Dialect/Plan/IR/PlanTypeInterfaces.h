//===- PlanTypeInterfaces.h - Type interfaces of bonsai_plan ----*- C++ -*-===//
//
// Declares PackedElementTypeInterface (see PlanTypeInterfaces.td). Kept apart from
// PlanDialect.h so that dialects whose types implement it need not include the plan's ops.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_PLAN_IR_PLANTYPEINTERFACES_H
#define BONSAI_DIALECT_PLAN_IR_PLANTYPEINTERFACES_H

#include "mlir/IR/Types.h"

#include "bonsai/Dialect/Plan/IR/PlanTypeInterfaces.h.inc"

#endif // BONSAI_DIALECT_PLAN_IR_PLANTYPEINTERFACES_H
