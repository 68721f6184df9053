//===- BonsaiTokenwise.cpp - Which ops compute each token alone ------------===//
//
// TokenwiseOpInterface for the model ops that compute a token's results from that token's
// operands alone, whatever share of the sequence they are given: what bonsai-ring splits the
// sequence through (docs/ring-attention.md). Ops whose token rows are always separate
// (embedding, the normalisations) take the interface's default; the ones below depend on an
// axis, a permutation or an operand.
//
//===----------------------------------------------------------------------===//

#include "OpUtils.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

using namespace mlir;
using namespace mlir::bonsai;
using namespace mlir::bonsai::detail;

std::string LinearOp::whyNotTokenwise(llvm::function_ref<bool(unsigned)> overTokens) {
  // Operand 0 is x; the weight and bias are read whole by every token.
  for (unsigned i = 1; i < getNumOperands(); ++i)
    if (overTokens(i))
      return i == 1 ? "its weight varies by token" : "its bias varies by token";
  return "";
}

std::string RoPEOp::whyNotTokenwise(llvm::function_ref<bool(unsigned)> overTokens) {
  if (!getPositions())
    return "it takes each token's position from its index in the sequence (give it the "
           "'positions' input)";
  // Operand 0 is the input, operand 1 the positions.
  return overTokens(1) ? "" : "its positions are not split with the tokens";
}

std::string SoftmaxOp::whyNotTokenwise(llvm::function_ref<bool(unsigned)>) {
  return getAxisAttr().getInt() >= 2 ? "" : "it normalises along the batch or sequence axis";
}

std::string ReshapeOp::whyNotTokenwise(llvm::function_ref<bool(unsigned)>) {
  RankedTensorType in = tensorType(getInput()), out = getResult().getType();
  // The same elements in the same order: each token's row stays whole when [batch, tokens]
  // leads both and a token has as many elements on either side. (The sequence lengths are not
  // compared: bonsai-ring asks with the input already cut to a rank's share.)
  auto perToken = [](RankedTensorType t) {
    int64_t rows = t.getDimSize(0) * t.getDimSize(1);
    return rows > 0 ? t.getNumElements() / rows : 0;
  };
  return in.getRank() >= 2 && out.getRank() >= 2 && in.getDimSize(0) == out.getDimSize(0) &&
                 perToken(in) == perToken(out)
             ? ""
             : "it regroups the tokens";
}

std::string TransposeOp::whyNotTokenwise(llvm::function_ref<bool(unsigned)>) {
  ArrayRef<int64_t> perm = getPermutation();
  return perm.size() >= 2 && perm[0] == 0 && perm[1] == 1 ? "" : "it moves the sequence axis";
}

std::string SliceOp::whyNotTokenwise(llvm::function_ref<bool(unsigned)>) {
  return getAxisAttr().getInt() >= 2 ? "" : "it slices along the sequence";
}
