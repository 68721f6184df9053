//===- Lora.cpp - The contracts of the lora kernels -----------------------===//
//
// The operand contracts of DoRA's magnitude scale and of its rescaled output's gradients
// (docs/lora.md): what the plan loader checks of each such kernel before any backend runs it
// (KernelChecker.h). Each kind's `verify` checks its
// attributes, then its operands, then the state it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::verify(kinds::DoraScale) {
  const auto &a = attrs<kinds::DoraScale>();
  // Attributes.
  if (!std::isfinite(a.scale))
    fail("scale must be finite, got " + num(a.scale));
  // Operands.
  // magnitude [out], w [out, in], lora_a [r, in], lora_b [out, r]; y like magnitude.
  for (size_t i = 0; i < 4; ++i)
    expectFloat(i);
  expectRank(1, 2);
  expectRank(2, 2);
  int64_t outRows = in(1).shape[0], inCols = in(1).shape[1], rank = in(2).shape[0];
  expectInputShape(0, {outRows});
  expectInputShape(2, {rank, inCols});
  expectInputShape(3, {outRows, rank});
  expectFloatOutput(0, {outRows});
  for (size_t i = 0; i < 4; ++i)
    if (in(i).dtype != in(1).dtype)
      fail(inName(i) + " dtype " + dtypeName(in(i).dtype) + " differs from " + inName(1) + "'s " +
           dtypeName(in(1).dtype));
  if (out().dtype != in(1).dtype)
    fail(outName() + " dtype " + dtypeName(out().dtype) + " differs from " + inName(1) + "'s " +
         dtypeName(in(1).dtype));
}

void KernelChecker::verify(kinds::DoraGrad) {
  // Operands.
  // dy [..., out], y like dy, scale [out], magnitude [out], all of dy's dtype; dx like dy,
  // dmagnitude like magnitude.
  expectFloat(0);
  expectRankAtLeast(0, 1);
  int64_t outRows = in(0).shape.back();
  expectInputShape(1, in(0).shape);
  expectInputShape(2, {outRows});
  expectInputShape(3, {outRows});
  for (size_t i = 1; i < 4; ++i)
    expectInputDType(i, in(0).dtype);
  expectOutput(in(0).shape, in(0).dtype);
  if (out(1).shape != in(3).shape || out(1).dtype != in(3).dtype)
    fail(outName(1) + ": expected " + formatShape(in(3).shape) + " " + dtypeName(in(3).dtype) +
         " (as " + inName(3) + "), got " + formatShape(out(1).shape) + " " +
         dtypeName(out(1).dtype));
}

} // namespace bonsai::rt::contract
