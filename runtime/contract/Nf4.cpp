//===- Nf4.cpp - The contracts of the Nf4 kernels -------------------------===//
//
// The operand contracts of NF4 dequantization (docs/quantization.md): what the plan loader checks
// of each such kernel before any backend runs it (KernelChecker.h). Each kind's `verify` checks its
// attributes, then its operands, then the state it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::verify(kinds::Dequantize) {
  if (in(0).dtype != DType::NF4)
    fail(inName(0) + " dtype: expected nf4, got " + dtypeName(in(0).dtype));
  expectFloatOutput(0, in(0).shape);
}

} // namespace bonsai::rt::contract
