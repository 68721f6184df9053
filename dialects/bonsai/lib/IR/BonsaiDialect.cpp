//===- BonsaiDialect.cpp - The bonsai dialect, its types and attributes ---===//
//
// Registers the dialect's ops, types and attributes, verifies the NF4 type and the sharding
// attribute, and computes storage sizes for tensor types.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::bonsai;

#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.cpp.inc"
#include "bonsai/Dialect/Bonsai/IR/BonsaiEnums.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "bonsai/Dialect/Bonsai/IR/BonsaiTypes.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "bonsai/Dialect/Bonsai/IR/BonsaiAttrs.cpp.inc"

void BonsaiDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "bonsai/Dialect/Bonsai/IR/BonsaiTypes.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "bonsai/Dialect/Bonsai/IR/BonsaiAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// NF4Type
//===----------------------------------------------------------------------===//

LogicalResult NF4Type::verify(function_ref<InFlightDiagnostic()> emitError,
                              unsigned blockSize, unsigned doubleQuantBlockSize) {
  // Blocks must pack whole bytes of 4-bit codes and map onto warp-sized tiles.
  if (blockSize < 16 || blockSize > 4096 || !llvm::isPowerOf2_32(blockSize))
    return emitError() << "NF4 block size must be a power of two in [16, 4096], got "
                       << blockSize;
  if (doubleQuantBlockSize == 0)
    return emitError() << "NF4 double-quantization block must be positive, got 0";
  return success();
}

uint64_t NF4Type::getStorageBytes(uint64_t numElements) const {
  uint64_t blocks = llvm::divideCeil(numElements, getBlockSize());
  uint64_t scaleBlocks = llvm::divideCeil(blocks, getDoubleQuantBlockSize());
  // Packed 4-bit codes, one 8-bit absmax per block, zero padding so that the fp32 parts are
  // aligned, one fp32 scale per double-quantization block, one fp32 offset (the mean of the
  // absmax values, subtracted before quantizing them). Must equal runtime nf4Layout().bytes.
  return llvm::alignTo(llvm::divideCeil(numElements, 2) + blocks, 4) + 4 * scaleBlocks + 4;
}

//===----------------------------------------------------------------------===//
// ShardingAttr
//===----------------------------------------------------------------------===//

LogicalResult ShardingAttr::verify(function_ref<InFlightDiagnostic()> emitError, int64_t ranks,
                                   ArrayRef<int64_t> shape, Type storage) {
  if (ranks < 1)
    return emitError() << "sharding needs at least one rank, got " << ranks;
  int64_t n = 1;
  for (int64_t size : shape) {
    if (size < 1)
      return emitError() << "sharding: the whole tensor's dimensions must be positive, got "
                         << size;
    n *= size;
  }
  if (storage) {
    auto packed = dyn_cast<plan::PackedElementTypeInterface>(storage);
    if (!packed)
      return emitError() << "sharding: storage " << storage
                         << " is not a packed element type (only those are shared out by bytes)";
    uint64_t bytes = packed.getStorageBytes(uint64_t(n));
    if (bytes % uint64_t(ranks) != 0)
      return emitError() << "sharding: the " << bytes << " storage bytes of " << n
                         << " elements of " << storage << " do not split evenly over " << ranks
                         << " ranks";
    return success();
  }
  if (n % ranks != 0)
    return emitError() << "sharding: " << n << " elements do not split evenly over " << ranks
                       << " ranks";
  return success();
}

int64_t ShardingAttr::getNumElements() const {
  int64_t n = 1;
  for (int64_t size : getShape())
    n *= size;
  return n;
}

RankedTensorType ShardingAttr::getShardType(Type element) const {
  if (auto packed = dyn_cast_if_present<plan::PackedElementTypeInterface>(getStorage()))
    return RankedTensorType::get(
        {int64_t(packed.getStorageBytes(uint64_t(getNumElements()))) / getRanks()},
        IntegerType::get(getContext(), 8, IntegerType::Unsigned));
  return RankedTensorType::get({getNumElements() / getRanks()}, element);
}

LogicalResult mlir::bonsai::verifyShardedValue(Operation *op, StringRef what, Value value,
                                               ShardingAttr sharding) {
  if (!sharding)
    return success();
  auto type = cast<RankedTensorType>(value.getType());
  RankedTensorType expected = sharding.getShardType(type.getElementType());
  if (type != expected)
    return op->emitOpError() << what << " sharded over " << sharding.getRanks() << " ranks must be "
                             << expected << " (one rank's share), got " << type;
  return success();
}

//===----------------------------------------------------------------------===//
// Sizes
//===----------------------------------------------------------------------===//

bool mlir::bonsai::hasNoZeroSizedDims(Type type) {
  auto shaped = dyn_cast<ShapedType>(type);
  return shaped && shaped.hasRank() && !llvm::is_contained(shaped.getShape(), 0);
}

int64_t mlir::bonsai::getNumElements(ShapedType type) {
  int64_t n = 1;
  for (int64_t d : type.getShape())
    n *= d;
  return n;
}

int64_t mlir::bonsai::getElementBytes(Type elementType) {
  if (isa<NF4Type>(elementType))
    return 1;
  return llvm::divideCeil(elementType.getIntOrFloatBitWidth(), 8);
}

int64_t mlir::bonsai::getStorageBytes(Type type) {
  auto shaped = dyn_cast<ShapedType>(type);
  if (!shaped || !shaped.hasStaticShape())
    return 0;
  int64_t n = getNumElements(shaped);
  if (auto nf4 = dyn_cast<NF4Type>(shaped.getElementType()))
    return nf4.getStorageBytes(n);
  return n * getElementBytes(shaped.getElementType());
}
