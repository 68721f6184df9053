//===- Gemm.cpp - The contracts of the gemm kernels -----------------------===//
//
// The operand contracts of linear layers, matmul and their gradients, the GEMM epilogues: what the
// plan loader checks of each such kernel before any backend runs it (KernelChecker.h). Each kind's
// `verify` checks its attributes, then its operands, then the state it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::verify(kinds::Linear) { expectOutput(checkLinearInputs(), in(0).dtype); }

void KernelChecker::verify(kinds::Matmul) {
  expectFloat(0);
  expectRankAtLeast(0, 2);
  size_t rank = in(0).shape.size();
  expectRank(1, rank);
  expectInputDType(1, in(0).dtype);
  const std::vector<int64_t> &a = in(0).shape, &b = in(1).shape;
  if (!std::equal(a.begin(), a.end() - 2, b.begin()))
    fail("batch dimensions differ: " + inName(0) + " " + formatShape(a) + ", " + inName(1) + " " +
         formatShape(b));
  if (a[rank - 1] != b[rank - 2])
    fail("contraction dimension: " + inName(0) + " has " + std::to_string(a[rank - 1]) + ", " +
         inName(1) + " has " + std::to_string(b[rank - 2]));
  std::vector<int64_t> shape(a.begin(), a.end() - 1);
  shape.push_back(b[rank - 1]);
  expectOutput(shape, in(0).dtype);
}

void KernelChecker::verify(kinds::LinearGradInput) {
  expectFloat(0);
  expectRankAtLeast(0, 1);
  expectFloat(1);
  expectRank(1, 2);
  int64_t n = in(0).shape.back();
  if (in(1).shape[0] != n)
    fail(inName(1) + " shape: expected [" + std::to_string(n) + ", in] ([out, in] layout), got " +
         formatShape(in(1).shape));
  std::vector<int64_t> shape(in(0).shape.begin(), in(0).shape.end() - 1);
  shape.push_back(in(1).shape[1]);
  expectFloatOutput(0, shape);
}

void KernelChecker::verify(kinds::LinearGradWeight) {
  expectFloat(0);
  expectFloat(1);
  expectRankAtLeast(0, 1);
  expectRankAtLeast(1, 1);
  const std::vector<int64_t> &dy = in(0).shape, &x = in(1).shape;
  if (dy.size() != x.size() || !std::equal(dy.begin(), dy.end() - 1, x.begin()))
    fail("leading dimensions differ: " + inName(0) + " " + formatShape(dy) + ", " + inName(1) +
         " " + formatShape(x));
  expectFloatOutput(0, {dy.back(), x.back()});
}

void KernelChecker::verify(kinds::LinearGeLU) {
  std::vector<int64_t> shape = checkLinearInputs();
  for (size_t j = 0; j < 2; ++j) {
    if (out(j).shape != shape)
      fail(outName(j) + " shape: expected " + formatShape(shape) + ", got " +
           formatShape(out(j).shape));
    if (out(j).dtype != in(0).dtype)
      fail(outName(j) + " dtype: expected " + dtypeName(in(0).dtype) + " (as x), got " +
           dtypeName(out(j).dtype));
  }
}

void KernelChecker::verify(kinds::LinearAdd) {
  std::vector<int64_t> shape = checkLinearInputs(/*thirdIsBias=*/false);
  expectInputDType(2, in(0).dtype);
  expectInputShape(2, shape);
  expectOutput(shape, in(0).dtype);
}

void KernelChecker::verify(kinds::LinearGradWeightAccumulate) {
  expectFloat(0);
  expectFloat(1);
  expectRankAtLeast(0, 1);
  expectRankAtLeast(1, 1);
  const std::vector<int64_t> &dy = in(0).shape, &x = in(1).shape;
  if (dy.size() != x.size() || !std::equal(dy.begin(), dy.end() - 1, x.begin()))
    fail("leading dimensions differ: " + inName(0) + " " + formatShape(dy) + ", " + inName(1) +
         " " + formatShape(x));
  expectFloatOutput(0, {dy.back(), x.back()});
}

} // namespace bonsai::rt::contract
