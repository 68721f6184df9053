//===- Elementwise.cpp - The contracts of the elementwise kernels ---------===//
//
// The operand contracts of elementwise kernels and their gradients, fills, accumulation and
// generated kernels: what the plan loader checks of each such kernel before any backend runs it
// (KernelChecker.h). Each kind's `verify` checks its attributes, then its operands, then the state
// it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::checkUnaryGradShapes() {
  expectFloat(0);
  expectFloatInput(1, in(0).shape);
  expectFloatOutput(0, in(0).shape);
}

void KernelChecker::checkBinaryShapes() {
  expectFloat(0);
  expectInputDType(1, in(0).dtype);
  const std::vector<int64_t> &l = in(0).shape, &r = in(1).shape;
  if (r.size() > l.size())
    fail(inName(1) + " rank " + std::to_string(r.size()) + " exceeds " + inName(0) + " rank " +
         std::to_string(l.size()) + " (only rhs is broadcast)");
  for (size_t i = 0; i < r.size(); ++i) {
    int64_t want = l[l.size() - r.size() + i];
    if (r[i] != want && r[i] != 1)
      fail(inName(1) + " shape " + formatShape(r) + " does not broadcast to " + formatShape(l) +
           ": dimension " + std::to_string(i) + " is " + std::to_string(r[i]) + ", expected " +
           std::to_string(want) + " or 1");
  }
  expectOutputLike(0);
}

void KernelChecker::checkUnaryShapes() {
  expectFloat(0);
  expectOutputLike(0);
}

void KernelChecker::verify(kinds::Add) { checkBinaryShapes(); }

void KernelChecker::verify(kinds::Mul) { checkBinaryShapes(); }

void KernelChecker::verify(kinds::SiLU) { checkUnaryShapes(); }

void KernelChecker::verify(kinds::GeLU) { checkUnaryShapes(); }

void KernelChecker::verify(kinds::SwiGLU) {
  expectFloat(0);
  expectInputDType(1, in(0).dtype);
  expectInputShape(1, in(0).shape);
  expectOutputLike(0);
}

void KernelChecker::verify(kinds::Cast) {
  expectFloat(0);
  if (!isFloatStorage(out().dtype))
    fail(outName() + " dtype: expected f32, f16 or bf16, got " + dtypeName(out().dtype));
  expectOutput(in(0).shape, out().dtype);
}

void KernelChecker::verify(kinds::Copy) {
  if (out().bytes != in(0).bytes)
    fail(outName() + " has " + std::to_string(out().bytes) + " bytes, " + inName(0) + " has " +
         std::to_string(in(0).bytes));
}

void KernelChecker::verify(kinds::Fill) {
  const auto &a = attrs<kinds::Fill>();
  // Attributes.
  if (!std::isfinite(a.value))
    fail("value must be finite, got " + num(a.value));
  // Operands.
  expectFloatOutput(0, out().shape);
}

void KernelChecker::verify(kinds::SiLUGrad) { checkUnaryGradShapes(); }

void KernelChecker::verify(kinds::GeLUGrad) { checkUnaryGradShapes(); }

void KernelChecker::verify(kinds::SwiGLUGrad) {
  expectFloat(0);
  expectFloatInput(1, in(0).shape);
  expectFloatInput(2, in(0).shape);
  expectFloatOutput(0, in(0).shape);
  expectFloatOutput(1, in(0).shape);
}

void KernelChecker::verify(kinds::Accumulate) {
  expectFloat(0);
  expectFloatOutput(0, in(0).shape);
}

void KernelChecker::verify(kinds::AccumulateMax) {
  if (in(0).dtype != DType::F32)
    fail(inName(0) + " dtype: expected f32 (FP8 statistics), got " + dtypeName(in(0).dtype));
  expectOutputLike(0);
}

void KernelChecker::verify(kinds::Zero) {
  if (!isFloatStorage(out().dtype) && !isIndexType(out().dtype))
    fail(outName() + " dtype: expected f32, f16, bf16, i32 or i64, got " + dtypeName(out().dtype));
}

void KernelChecker::verify(kinds::FusedElementwise) {
  // Its operands are its generated kernel's, checked with its arity.
}

} // namespace bonsai::rt::contract
