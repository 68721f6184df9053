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

#include <optional>

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
/// The operand indices of the ODS operand groups `groups` of `op` (every operand of a
/// variadic or optional group), in order.
template <typename OpT>
SmallVector<unsigned> odsOperandIndices(OpT op, std::initializer_list<unsigned> groups) {
  SmallVector<unsigned> indices;
  for (unsigned group : groups) {
    auto [start, length] = op.getODSOperandIndexAndLength(group);
    for (unsigned i = 0; i < length; ++i)
      indices.push_back(start + i);
  }
  return indices;
}

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

/// Scored (query, key) pairs per batch and head of an attention whose query has `seq` tokens:
/// S² or S(S+1)/2 when causal. With `ringRanks` N the query is one rank's zigzag share of a
/// sequence of N·seq tokens (chunks r and 2N-1-r of 2N chunks of C = seq/2): every key of the
/// sequence unmasked, or when causal (2N-1)·C² + C(C+1), the same on every rank.
inline int64_t attentionScoredPairs(int64_t seq, bool causal,
                                    std::optional<int64_t> ringRanks = std::nullopt) {
  if (!ringRanks)
    return causal ? seq * (seq + 1) / 2 : seq * seq;
  if (!causal)
    return seq * seq * *ringRanks;
  int64_t chunk = seq / 2;
  return (2 * *ringRanks - 1) * chunk * chunk + chunk * (chunk + 1);
}

/// Checks a ring attention's local sequence (`ring_ranks`): two equal chunks of the zigzag
/// layout, so even.
inline LogicalResult verifyRingSequence(Operation *op, std::optional<int64_t> ringRanks,
                                        Value query) {
  if (!ringRanks)
    return success();
  int64_t seq = tensorType(query).getDimSize(1);
  if (seq % 2 == 0)
    return success();
  return op->emitOpError() << "ring_ranks " << *ringRanks << ": the local sequence (" << seq
                           << " tokens) must be two equal chunks of the zigzag layout";
}

/// Checks an optional per-token operand of the rope and attention ops (`positions`,
/// `segment_ids`): absent, or an integer [batch, seq] tensor of the [batch, seq, ...] `of`.
inline LogicalResult verifyTokenOperand(Operation *op, StringRef what, Value operand, Value of) {
  if (!operand)
    return success();
  RankedTensorType t = tensorType(operand), x = tensorType(of);
  SmallVector<int64_t> shape = {x.getDimSize(0), x.getDimSize(1)};
  if (t.getShape() == ArrayRef<int64_t>(shape))
    return success();
  return op->emitOpError() << what << " shape: expected " << fmt(shape)
                           << " ([batch, seq] of the input), got " << fmt(t.getShape());
}

/// Checks rope's llama3 scaling attributes (bonsai.rope, bonsai.rope_grad): all four or none,
/// and values that transformers' formula accepts (factors positive, high_freq_factor above
/// low_freq_factor, a positive original context).
inline LogicalResult verifyRopeScaling(Operation *op, std::optional<double> factor,
                                       std::optional<double> low, std::optional<double> high,
                                       std::optional<int64_t> original) {
  const char *names[] = {"scaling_factor", "low_freq_factor", "high_freq_factor",
                         "original_max_positions"};
  bool present[] = {factor.has_value(), low.has_value(), high.has_value(),
                    original.has_value()};
  int count = int(present[0]) + int(present[1]) + int(present[2]) + int(present[3]);
  if (count == 0)
    return success();
  if (count != 4) {
    for (int i = 0; i < 4; ++i)
      if (!present[i])
        return op->emitOpError() << "llama3 rope scaling needs all of scaling_factor, "
                                    "low_freq_factor, high_freq_factor and "
                                    "original_max_positions: "
                                 << names[i] << " is missing";
  }
  if (!(*factor > 0) || !(*low > 0))
    return op->emitOpError() << "scaling_factor and low_freq_factor must be positive, got "
                             << *factor << " and " << *low;
  if (!(*high > *low))
    return op->emitOpError() << "high_freq_factor (" << *high
                             << ") must be greater than low_freq_factor (" << *low << ")";
  if (*original <= 0)
    return op->emitOpError() << "original_max_positions must be positive, got " << *original;
  return success();
}

/// rope's and rope_grad's kernel parameters: theta, and the llama3 scaling attributes when
/// the op has them.
inline DictionaryAttr getRopeKernelParams(Operation *op, FloatAttr theta) {
  Builder b(op->getContext());
  SmallVector<NamedAttribute> params = {b.getNamedAttr("theta", theta)};
  for (StringRef name :
       {"scaling_factor", "low_freq_factor", "high_freq_factor", "original_max_positions"})
    if (Attribute value = op->getAttr(name))
      params.push_back(b.getNamedAttr(name, value));
  return b.getDictionaryAttr(params);
}

} // namespace mlir::bonsai::detail

#endif // BONSAI_DIALECT_BONSAI_LIB_IR_OPUTILS_H
