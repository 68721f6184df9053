//===- BonsaiDialect.h - The bonsai dialect, its types and attributes -----===//
//
// Declares the `bonsai` dialect together with its NF4 element type, its placement and sharding
// attributes and its enums. Ops are declared in BonsaiOps.h.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIDIALECT_H
#define BONSAI_DIALECT_BONSAI_IR_BONSAIDIALECT_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpImplementation.h"

#include "bonsai/Dialect/Plan/IR/PlanTypeInterfaces.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h.inc"
#include "bonsai/Dialect/Bonsai/IR/BonsaiEnums.h.inc"

#define GET_TYPEDEF_CLASSES
#include "bonsai/Dialect/Bonsai/IR/BonsaiTypes.h.inc"

#define GET_ATTRDEF_CLASSES
#include "bonsai/Dialect/Bonsai/IR/BonsaiAttrs.h.inc"

namespace mlir::bonsai {

/// True if `type` is a shaped type none of whose static dimensions is zero.
bool hasNoZeroSizedDims(Type type);

/// Number of elements of a statically shaped tensor type (1 for a scalar tensor).
int64_t getNumElements(ShapedType type);

/// Bytes that one element of `elementType` takes, rounded up to whole bytes (NF4 counts as 1;
/// use getStorageBytes for the packed size).
int64_t getElementBytes(Type elementType);

/// Bytes needed to store a value of tensor type `type`, NF4 tensors with their block scales.
int64_t getStorageBytes(Type type);

/// Fails with an error on `op` unless `value`'s type is one rank's share under `sharding`
/// (succeeds when `sharding` is null). `what` names the value in the message.
LogicalResult verifyShardedValue(Operation *op, StringRef what, Value value, ShardingAttr sharding);

} // namespace mlir::bonsai

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIDIALECT_H
