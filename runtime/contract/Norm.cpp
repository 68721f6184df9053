//===- Norm.cpp - The contracts of the norm kernels -----------------------===//
//
// The operand contracts of RMSNorm, LayerNorm, their gradients and their fusions with a residual
// add: what the plan loader checks of each such kernel before any backend runs it
// (KernelChecker.h). Each kind's `verify` checks its attributes, then its operands, then the state
// it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::checkEpsilon() {
  const auto &a = kernel.attrsAs<NormAttrs>();
  if (!(a.epsilon > 0))
    fail("epsilon must be positive, got " + num(a.epsilon));
}

void KernelChecker::checkNormGradShapes() {
  expectFloat(0);
  expectRankAtLeast(0, 1);
  expectFloatInput(1, in(0).shape);
  int64_t d = in(0).shape.back();
  expectFloatInput(2, {d});
  expectFloatOutput(0, in(0).shape);
  for (size_t j = 1; j < kernel.outputs.size(); ++j)
    expectFloatOutput(j, {d});
}

void KernelChecker::checkAddNormShapes() {
  expectFloat(0);
  expectRankAtLeast(0, 1);
  expectInputDType(1, in(0).dtype);
  expectInputShape(1, in(0).shape);
  int64_t d = in(0).shape.back();
  for (size_t i = 2; i < kernel.inputs.size(); ++i)
    expectFloatInput(i, {d});
  for (size_t j = 0; j < 2; ++j)
    if (out(j).shape != in(0).shape || out(j).dtype != in(0).dtype)
      fail(outName(j) + ": expected " + formatShape(in(0).shape) + " " + dtypeName(in(0).dtype) +
           " (as lhs), got " + formatShape(out(j).shape) + " " + dtypeName(out(j).dtype));
}

void KernelChecker::checkNormGradAddShapes() {
  expectFloat(0);
  expectRankAtLeast(0, 1);
  expectFloatInput(1, in(0).shape);
  int64_t d = in(0).shape.back();
  expectFloatInput(2, {d});
  expectFloatInput(3, in(0).shape);
  expectFloatOutput(0, in(0).shape);
  for (size_t j = 1; j < kernel.outputs.size(); ++j)
    expectFloatOutput(j, {d});
}

void KernelChecker::checkNormShapes() {
  expectFloat(0);
  expectRankAtLeast(0, 1);
  for (size_t i = 1; i < kernel.inputs.size(); ++i) {
    expectInputDType(i, in(0).dtype);
    expectInputShape(i, {in(0).shape.back()});
  }
  expectOutputLike(0);
}

void KernelChecker::verify(kinds::RMSNorm) {
  checkEpsilon();
  checkNormShapes();
}

void KernelChecker::verify(kinds::LayerNorm) {
  checkEpsilon();
  checkNormShapes();
}

void KernelChecker::verify(kinds::RMSNormGrad) {
  checkEpsilon();
  checkNormGradShapes();
}

void KernelChecker::verify(kinds::LayerNormGrad) {
  checkEpsilon();
  checkNormGradShapes();
}

void KernelChecker::verify(kinds::AddRMSNorm) {
  checkEpsilon();
  checkAddNormShapes();
}

void KernelChecker::verify(kinds::AddLayerNorm) {
  checkEpsilon();
  checkAddNormShapes();
}

void KernelChecker::verify(kinds::RMSNormGradAdd) {
  checkEpsilon();
  checkNormGradAddShapes();
}

void KernelChecker::verify(kinds::LayerNormGradAdd) {
  checkEpsilon();
  checkNormGradAddShapes();
}

} // namespace bonsai::rt::contract
