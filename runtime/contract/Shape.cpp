//===- Shape.cpp - The contracts of the shape kernels ---------------------===//
//
// The operand contracts of embeddings, transposes, slices and broadcast reductions: what the plan
// loader checks of each such kernel before any backend runs it (KernelChecker.h). Each kind's
// `verify` checks its attributes, then its operands, then the state it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::verify(kinds::Embedding) {
  expectFloat(0);
  expectIndex(1);
  expectRank(0, 2);
  std::vector<int64_t> shape = in(1).shape;
  shape.push_back(in(0).shape[1]);
  expectOutput(shape, in(0).dtype);
}

void KernelChecker::verify(kinds::Transpose) {
  const auto &a = attrs<kinds::Transpose>();
  // Attributes.
  size_t rank = in(0).shape.size();
  if (a.permutation.size() != rank)
    fail("permutation has " + std::to_string(a.permutation.size()) + " entries, " + inName(0) +
         " has rank " + std::to_string(rank));
  std::vector<bool> seen(rank, false);
  for (int64_t p : a.permutation) {
    if (p < 0 || size_t(p) >= rank || seen[size_t(p)])
      fail("permutation " + formatShape(a.permutation) + " is not a permutation of [0, " +
           std::to_string(rank) + ")");
    seen[size_t(p)] = true;
  }
  // Operands.
  std::vector<int64_t> shape;
  for (int64_t p : attrs<kinds::Transpose>().permutation)
    shape.push_back(in(0).shape[size_t(p)]);
  expectOutput(shape, in(0).dtype);
}

void KernelChecker::verify(kinds::Slice) {
  checkAxisOfInput(attrs<kinds::Slice>().axis);
  // Operands.
  size_t axis = size_t(attrs<kinds::Slice>().axis);
  if (out().shape.size() != in(0).shape.size())
    fail(outName() + " rank: expected " + std::to_string(in(0).shape.size()) + ", got " +
         std::to_string(out().shape.size()));
  std::vector<int64_t> shape = in(0).shape;
  shape[axis] = out().shape[axis];
  expectOutput(shape, in(0).dtype);
  int64_t start = attrs<kinds::Slice>().start, size = out().shape[axis], dim = in(0).shape[axis];
  if (start < 0 || start > dim || size > dim - start)
    fail("range [" + std::to_string(start) + ", " + std::to_string(start) + " + " +
         std::to_string(size) + ") is outside dimension " + std::to_string(axis) + " of size " +
         std::to_string(dim));
}

void KernelChecker::verify(kinds::Concat) {
  checkAxisOfInput(attrs<kinds::Concat>().axis);
  // Operands: every input x's rank and dtype, equal outside the axis; y their sum along it.
  size_t axis = size_t(attrs<kinds::Concat>().axis);
  std::vector<int64_t> shape = in(0).shape;
  shape[axis] = 0;
  for (size_t i = 0; i < kernel.inputs.size(); ++i) {
    const TensorInfo &x = in(i);
    bool same = x.shape.size() == shape.size() && x.dtype == in(0).dtype;
    for (size_t d = 0; same && d < shape.size(); ++d)
      same = d == axis || x.shape[d] == in(0).shape[d];
    if (!same)
      fail(inName(i) + " " + formatShape(x.shape) + " " + dtypeName(x.dtype) + " differs from " +
           inName(0) + " " + formatShape(in(0).shape) + " " + dtypeName(in(0).dtype) +
           " outside axis " + std::to_string(axis));
    shape[axis] += x.shape[axis];
  }
  expectOutput(shape, in(0).dtype);
}

void KernelChecker::verify(kinds::EmbeddingGrad) {
  expectFloat(0);
  expectIndex(1);
  if (out().shape.size() != 2)
    fail(outName() + " rank: expected 2 ([vocab, dim]), got " + formatShape(out().shape));
  std::vector<int64_t> shape = in(1).shape;
  shape.push_back(out().shape[1]);
  expectInputShape(0, shape);
  expectFloatOutput(0, out().shape);
}

void KernelChecker::verify(kinds::ReduceTo) {
  expectFloat(0);
  expectBroadcast(outName(), out().shape, inName(0), in(0).shape);
  expectFloatOutput(0, out().shape);
}

void KernelChecker::verify(kinds::SliceGrad) {
  const auto &a = attrs<kinds::SliceGrad>();
  // Attributes.
  if (a.axis < 0 || size_t(a.axis) >= out().shape.size())
    fail("axis " + std::to_string(a.axis) + " is out of range for " + outName() + " of rank " +
         std::to_string(out().shape.size()));
  // Operands.
  expectFloat(0);
  size_t axis = size_t(attrs<kinds::SliceGrad>().axis);
  if (out().shape.size() != in(0).shape.size())
    fail(outName() + " rank: expected " + std::to_string(in(0).shape.size()) + ", got " +
         std::to_string(out().shape.size()));
  std::vector<int64_t> shape = in(0).shape;
  shape[axis] = out().shape[axis];
  expectFloatOutput(0, shape);
  int64_t start = attrs<kinds::SliceGrad>().start, size = in(0).shape[axis],
          dim = out().shape[axis];
  if (start < 0 || start > dim || size > dim - start)
    fail("range [" + std::to_string(start) + ", " + std::to_string(start) + " + " +
         std::to_string(size) + ") is outside dimension " + std::to_string(axis) + " of size " +
         std::to_string(dim));
}

} // namespace bonsai::rt::contract
