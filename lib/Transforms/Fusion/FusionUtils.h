//===- FusionUtils.h - Helpers shared by the fusion families ----*- C++ -*-===//
//
// Private to lib/Transforms/Fusion: how the families recognise recomputed clones (bonsai-remat
// copies forward ops into the backward pass, marked bonsai.recomputed) as the values they copy,
// and how they place a fused op so that every operand dominates it and it dominates every use.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_LIB_TRANSFORMS_FUSION_FUSIONUTILS_H
#define BONSAI_LIB_TRANSFORMS_FUSION_FUSIONUTILS_H

#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h"
#include "mlir/IR/Operation.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::bonsai::fusion {

/// The dialect's discardable attributes (BonsaiDialect.td says what each marks).
constexpr StringLiteral kPhaseAttr = BonsaiDialect::getPhaseAttrName();
constexpr StringLiteral kRecomputedAttr = BonsaiDialect::getRecomputedAttrName();
constexpr StringLiteral kRematSearchedAttr = BonsaiDialect::getRematSearchedAttrName();

/// The attributes of `op` that say what it computes: all but the discardable bonsai.*
/// annotations (phase, recomputed).
SmallVector<NamedAttribute> getInherentAttrs(Operation *op);

/// Whether `candidate` computes the same value as `original`: it is `original`, or the result
/// (same number) of a recomputed clone of `original`'s defining op (same op, same inherent
/// attributes) whose operands compute the same values as the original's.
bool isSameValue(Value original, Value candidate);

/// Copies the discardable bonsai.* annotations (phase, recomputed) of `from` onto `to`.
void copyAnnotations(Operation *from, Operation *to);

/// The element count of a value of ranked tensor type.
int64_t elementsOf(Value value);

/// The phase annotation of `op` ("" for forward ops).
StringRef getPhase(Operation *op);

/// Whether `a` and `b` run in the same phase and are both recomputed clones or both not.
bool sameSchedule(Operation *a, Operation *b);

/// Erases `op` if its results are unused, and then, recursively, the recomputed clones that
/// only it read (the clone chains a fusion leaves dead).
void eraseDeadClones(RewriterBase &rewriter, Operation *op);

/// Whether every user of `value` in `op`'s block comes after `op` (users elsewhere are nested
/// in later ops or in other functions and do not count).
bool allUsersAfter(Value value, Operation *op);

/// Whether `value` is available before `op`: a block argument of an enclosing block, or the
/// result of an op before `op` in its block.
bool isDefinedBefore(Value value, Operation *op);

/// Whether `op` may write `value`: one of its in-place operands when it is a kernel, never when
/// it has no memory effects, and (conservatively) any operand otherwise.
bool mayWrite(Operation *op, Value value);

} // namespace mlir::bonsai::fusion

#endif // BONSAI_LIB_TRANSFORMS_FUSION_FUSIONUTILS_H
