//===- OpUtils.h - Shared verifier and cost helpers of bonsai ops ----------===//
//
// Private to the dialect library: diagnostics that name the operand, what was expected and what
// was found, and the streaming-kernel cost every elementwise op shares.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_LIB_IR_OPUTILS_H
#define BONSAI_DIALECT_BONSAI_LIB_IR_OPUTILS_H

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::bonsai::detail {


/// Prints a shape as [a, b, c].
struct ShapePrinter {
  ArrayRef<int64_t> shape;
};

template <typename Stream>
Stream &operator<<(Stream &os, ShapePrinter p) {
  os << "[";
  llvm::interleaveComma(p.shape, os);
  os << "]";
  return os;
}

inline ShapePrinter fmt(ArrayRef<int64_t> shape) { return {shape}; }

inline RankedTensorType tensorType(Value v) { return cast<RankedTensorType>(v.getType()); }

/// Fails with "<what> element type: expected <expected>, got <got>" unless they agree.
inline LogicalResult expectElementType(Operation *op, StringRef what, Type got, Type expected) {
  if (got == expected)
    return success();
  return op->emitOpError() << what << " element type: expected " << expected << ", got "
                           << got;
}

/// Fails with "<what> shape: expected [..], got [..]" unless they agree.
inline LogicalResult expectShape(Operation *op, StringRef what, ArrayRef<int64_t> got,
                          ArrayRef<int64_t> expected) {
  if (got == expected)
    return success();
  return op->emitOpError() << what << " shape: expected " << fmt(expected) << ", got "
                           << fmt(got);
}

/// Fails unless `what` has rank `rank`.
inline LogicalResult expectRank(Operation *op, StringRef what, RankedTensorType type, int64_t rank) {
  if (type.getRank() == rank)
    return success();
  return op->emitOpError() << what << " rank: expected " << rank << ", got "
                           << type.getRank() << " (" << type << ")";
}

/// Fails unless the result has exactly the type of `operand`.
inline LogicalResult expectSameTypeAsOperand(Operation *op, StringRef what, Value operand) {
  Type want = operand.getType();
  Type got = op->getResult(0).getType();
  if (want == got)
    return success();
  return op->emitOpError() << "result type: expected " << want << " (the type of " << what
                           << "), got " << got;
}

/// Bytes of all operands read once and all results written once.
inline OpCost streamingBytes(Operation *op) {
  OpCost cost;
  for (Value v : op->getOperands())
    cost.bytesRead += getStorageBytes(v.getType());
  for (Value v : op->getResults())
    cost.bytesWritten += getStorageBytes(v.getType());
  return cost;
}

/// A streaming op doing `flopsPerElement` vector FLOPs per result element.
inline OpCost elementwiseCost(Operation *op, int64_t flopsPerElement) {
  OpCost cost = streamingBytes(op);
  cost.vectorFlops =
      flopsPerElement * getNumElements(cast<ShapedType>(op->getResult(0).getType()));
  return cost;
}


} // namespace mlir::bonsai::detail

#endif // BONSAI_DIALECT_BONSAI_LIB_IR_OPUTILS_H
