//===- Loss.cpp - The contracts of the loss kernels -----------------------===//
//
// The operand contracts of cross-entropy and the fused LM head: what the plan loader checks of each
// such kernel before any backend runs it (KernelChecker.h). Each kind's `verify` checks its
// attributes, then its operands, then the state it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::verify(kinds::CrossEntropy) {
  expectFloat(0);
  expectIndex(1);
  expectRankAtLeast(0, 2);
  std::vector<int64_t> shape(in(0).shape.begin(), in(0).shape.end() - 1);
  expectInputShape(1, shape);
  expectOutput({}, DType::F32);
}

void KernelChecker::verify(kinds::CrossEntropyGrad) {
  expectScalarInput(0, DType::F32);
  expectFloat(1);
  expectRankAtLeast(1, 2);
  expectIndex(2);
  std::vector<int64_t> shape(in(1).shape.begin(), in(1).shape.end() - 1);
  expectInputShape(2, shape);
  expectFloatOutput(0, in(1).shape);
}

void KernelChecker::verify(kinds::LinearCrossEntropy) {
  const auto &a = attrs<kinds::LinearCrossEntropy>();
  // Attributes.
  if (a.chunkRows <= 0)
    fail("chunk_rows must be positive, got " + std::to_string(a.chunkRows));
  // Operands.
  expectFloat(0);
  expectRankAtLeast(0, 2);
  expectInputDType(1, in(0).dtype);
  expectRank(1, 2);
  const std::vector<int64_t> &x = in(0).shape, &w = in(1).shape;
  if (w[1] != x.back())
    fail(inName(1) + " shape: expected [vocab, " + std::to_string(x.back()) +
         "] ([out, in] layout), got " + formatShape(w));
  expectIndex(2);
  expectInputShape(2, std::vector<int64_t>(x.begin(), x.end() - 1));
  expectScalarInput(3, DType::F32);
  expectScalarOutput(0, DType::F32);
  if (out(1).shape != x || out(1).dtype != in(0).dtype)
    fail(outName(1) + ": expected " + formatShape(x) + " " + dtypeName(in(0).dtype) +
         " (as x), got " + formatShape(out(1).shape) + " " + dtypeName(out(1).dtype));
  bool weightGrad = kernel.outputs.size() > 3;
  if (weightGrad && (out(3).shape != w || out(3).dtype != in(1).dtype))
    fail(outName(3) + ": expected " + formatShape(w) + " " + dtypeName(in(1).dtype) +
         " (as w), got " + formatShape(out(3).shape) + " " + dtypeName(out(3).dtype));
  int64_t rows = in(2).numel;
  int64_t elements = linearCrossEntropyWorkspaceElements(
      rows, w[0], w[1], attrs<kinds::LinearCrossEntropy>().chunkRows,
      int64_t(dtypeSize(in(0).dtype)), weightGrad);
  expectF32Output(2, {elements});
}

} // namespace bonsai::rt::contract
