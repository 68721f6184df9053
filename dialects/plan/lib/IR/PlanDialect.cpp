//===- PlanDialect.cpp - The scheduled plan dialect -----------------------===//
//
// Registration and verifiers of the `bonsai_plan` ops. The verifiers check each op alone
// (sizes agree, offsets are aligned and inside their arena); the whole-step checks (no two
// live buffers overlap, every read follows a write) are the bonsai-verify-plan pass.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Plan/IR/PlanDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::bonsai::plan;

#include "bonsai/Dialect/Plan/IR/PlanDialect.cpp.inc"
#include "bonsai/Dialect/Plan/IR/PlanEnums.cpp.inc"
#include "bonsai/Dialect/Plan/IR/PlanTypeInterfaces.cpp.inc"

void PlanDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "bonsai/Dialect/Plan/IR/PlanOps.cpp.inc"
      >();
}

int64_t mlir::bonsai::plan::getMemRefBytes(MemRefType type) {
  int64_t n = 1;
  for (int64_t d : type.getShape())
    n *= d;
  if (auto packed = dyn_cast<PackedElementTypeInterface>(type.getElementType()))
    return int64_t(packed.getStorageBytes(uint64_t(n)));
  return n * llvm::divideCeil(type.getElementTypeBitWidth(), 8);
}

BufferOp mlir::bonsai::plan::getUnderlyingBuffer(Value value) {
  while (Operation *def = value.getDefiningOp()) {
    if (auto buffer = dyn_cast<BufferOp>(def))
      return buffer;
    auto view = dyn_cast<ViewLikeOpInterface>(def);
    if (!view)
      return nullptr;
    value = view.getViewSource();
  }
  return nullptr;
}

//===----------------------------------------------------------------------===//
// StepOp, ArenaOp
//===----------------------------------------------------------------------===//

LogicalResult StepOp::verifyRegions() {
  for (Operation &op : getBody().front())
    if (!isa<PlanDialect>(op.getDialect()))
      return op.emitOpError("is not a bonsai_plan op; a step holds only plan ops");
  return success();
}

LogicalResult ArenaOp::verify() {
  int64_t size = getSizeAttr().getInt(), alignment = getAlignmentAttr().getInt();
  if (size < 0)
    return emitOpError() << "size must be non-negative, got " << size;
  if (alignment <= 0 || !llvm::isPowerOf2_64(alignment))
    return emitOpError() << "alignment must be a power of two, got " << alignment;
  return success();
}

//===----------------------------------------------------------------------===//
// BufferOp, ViewOp
//===----------------------------------------------------------------------===//

int64_t BufferOp::getSizeInBytes() { return getMemRefBytes(getResult().getType()); }

LogicalResult BufferOp::verify() {
  Type element = getResult().getType().getElementType();
  // Sizes come from the bit width or, for packed formats, from the type itself.
  if (!element.isIntOrFloat() && !isa<PackedElementTypeInterface>(element))
    return emitOpError() << "element type " << element << " has no storage size";
  if (IntegerAttr offset = getOffsetAttr(); offset && offset.getInt() < 0)
    return emitOpError() << "offset must be non-negative, got " << offset.getInt();
  bool isInput = getRole() == BufferRole::Input;
  if (isInput != bool(getInputIndexAttr()))
    return emitOpError(isInput ? "an input buffer needs an input_index"
                               : "only input buffers have an input_index");
  if (getTrainable() && getRole() != BufferRole::Parameter)
    return emitOpError("only parameters can be trainable");
  if (getCopyOfAttr() && getRole() != BufferRole::OptimizerState)
    return emitOpError("only optimizer state can start as a copy of a parameter");
  return success();
}

LogicalResult BufferOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto arena = symbolTable.lookupNearestSymbolFrom<ArenaOp>(*this, getArenaAttr());
  if (!arena)
    return emitOpError() << "'" << getArenaAttr() << "' does not name an arena of this step";
  bool persistent = getRole() == BufferRole::Parameter ||
                    getRole() == BufferRole::OptimizerState;
  if (persistent && arena.getLifetime() != Lifetime::Persistent)
    return emitOpError() << "a " << stringifyBufferRole(getRole())
                         << " must live in a persistent arena; '" << arena.getSymName()
                         << "' is per-step";
  IntegerAttr offset = getOffsetAttr();
  if (!offset)
    return success();
  int64_t alignment = arena.getAlignmentAttr().getInt();
  if (offset.getInt() % alignment != 0)
    return emitOpError() << "offset " << offset.getInt() << " is not a multiple of arena '"
                         << arena.getSymName() << "' alignment " << alignment;
  int64_t arenaSize = arena.getSizeAttr().getInt();
  if (offset.getInt() > arenaSize - getSizeInBytes())
    return emitOpError() << "bytes [" << offset.getInt() << ", "
                         << offset.getInt() + getSizeInBytes() << ") exceed arena '"
                         << arena.getSymName() << "' of " << arenaSize << " bytes";
  return success();
}

Value ViewOp::getViewSource() { return getSource(); }

LogicalResult ViewOp::verify() {
  MemRefType source = getSource().getType(), result = getResult().getType();
  if (source.getElementType() != result.getElementType())
    return emitOpError() << "element type changes from " << source.getElementType() << " to "
                         << result.getElementType() << "; a view keeps the bytes as they are";
  if (getMemRefBytes(source) != getMemRefBytes(result))
    return emitOpError() << "views " << getMemRefBytes(source) << " bytes as "
                         << getMemRefBytes(result);
  return success();
}

//===----------------------------------------------------------------------===//
// LaunchOp, CopyOp, collectives
//===----------------------------------------------------------------------===//

LogicalResult LaunchOp::verify() {
  if (getKernel().empty())
    return emitOpError("kernel name must not be empty");
  if (getOuts().empty())
    return emitOpError() << "kernel '" << getKernel() << "' writes no buffer";
  if (getStreamAttr().getInt() < 0)
    return emitOpError() << "stream must be non-negative, got " << getStreamAttr().getInt();
  return success();
}

LogicalResult CopyOp::verify() {
  int64_t from = getMemRefBytes(getSource().getType());
  int64_t to = getMemRefBytes(getTarget().getType());
  if (from != to)
    return emitOpError() << "copies " << from << " bytes into " << to;
  return success();
}

#define GET_OP_CLASSES
#include "bonsai/Dialect/Plan/IR/PlanOps.cpp.inc"
