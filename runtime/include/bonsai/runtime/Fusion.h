//===- Fusion.h - Layouts shared by the fused kernels ------------*- C++ -*-===//
//
// What the compiler's fused ops (docs/fusion.md) and the runtime's kernels for them agree on
// beyond plan.fbs: the layout of the fused LM head's workspace. The compiler sizes the
// workspace tensor by the same formula (LinearCrossEntropyOp::getWorkspaceElements); plan
// validation checks it, and both backends carve it up by linearCrossEntropyWorkspace.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_FUSION_H
#define BONSAI_RUNTIME_FUSION_H

#include <algorithm>
#include <cstdint>

namespace bonsai::rt {

/// Offsets, in f32 elements, of the parts of a LinearCrossEntropy workspace, each 256-byte
/// aligned: one chunk of logits (in W's dtype), each row's loss (f32), the fp32 accumulator
/// of dW (only when W is not f32 and dW is computed), and a 64-bit counter of labels.
struct LinearCrossEntropyWorkspace {
  int64_t logits = 0;
  int64_t losses = 0;
  int64_t accumulator = 0; ///< == counter when there is no accumulator
  int64_t counter = 0;
  int64_t total = 0;
};

inline LinearCrossEntropyWorkspace linearCrossEntropyWorkspace(int64_t rows, int64_t vocab,
                                                               int64_t hidden,
                                                               int64_t chunkRows,
                                                               int64_t elementBytes,
                                                               bool weightGrad) {
  auto align = [](int64_t slots) { return (slots + 63) / 64 * 64; };
  int64_t chunk = std::min(rows, chunkRows);
  LinearCrossEntropyWorkspace w;
  w.logits = 0;
  w.losses = align((chunk * vocab * elementBytes + 3) / 4);
  w.accumulator = w.losses + align(rows);
  w.counter = w.accumulator + (weightGrad && elementBytes != 4 ? align(vocab * hidden) : 0);
  w.total = w.counter + 64;
  return w;
}

/// f32 elements of the workspace (LinearCrossEntropyOp::getWorkspaceElements).
inline int64_t linearCrossEntropyWorkspaceElements(int64_t rows, int64_t vocab, int64_t hidden,
                                                   int64_t chunkRows, int64_t elementBytes,
                                                   bool weightGrad) {
  return linearCrossEntropyWorkspace(rows, vocab, hidden, chunkRows, elementBytes, weightGrad)
      .total;
}

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_FUSION_H
