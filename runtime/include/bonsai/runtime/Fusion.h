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
/// aligned: one chunk of logits (in W's dtype, rows of `paddedVocab` elements), each row's
/// loss (f32), a copy of W with its rows padded to `paddedVocab` with zeros (only when the
/// vocabulary is not a multiple of 16 bytes of elements, as GPT-2's 50257 is not), the fp32
/// accumulator of dW ([paddedVocab, hidden]; only when dW is computed and W is not f32 or the
/// vocabulary is padded), and a 64-bit counter of labels. The padding lets the CUDA kernel run
/// every GEMM on 16-byte aligned rows without the GEMM engine's per-call padded copies.
struct LinearCrossEntropyWorkspace {
  int64_t paddedVocab = 0;
  int64_t logits = 0;
  int64_t losses = 0;
  int64_t weight = 0;      ///< == accumulator when W needs no padded copy
  int64_t accumulator = 0; ///< == counter when there is no accumulator
  int64_t counter = 0;
  int64_t total = 0;
};

inline LinearCrossEntropyWorkspace linearCrossEntropyWorkspace(int64_t rows, int64_t vocab,
                                                               int64_t hidden, int64_t chunkRows,
                                                               int64_t elementBytes,
                                                               bool weightGrad) {
  auto align = [](int64_t slots) { return (slots + 63) / 64 * 64; };
  auto slots = [](int64_t elements, int64_t bytes) { return (elements * bytes + 3) / 4; };
  int64_t perVector = std::max<int64_t>(1, 16 / std::max<int64_t>(1, elementBytes));
  int64_t chunk = std::min(rows, chunkRows);
  LinearCrossEntropyWorkspace w;
  w.paddedVocab = (vocab + perVector - 1) / perVector * perVector;
  bool padded = w.paddedVocab != vocab;
  w.logits = 0;
  w.losses = align(slots(chunk * w.paddedVocab, elementBytes));
  w.weight = w.losses + align(rows);
  w.accumulator = w.weight + (padded ? align(slots(w.paddedVocab * hidden, elementBytes)) : 0);
  bool accumulate = weightGrad && (elementBytes != 4 || padded);
  w.counter = w.accumulator + (accumulate ? align(w.paddedVocab * hidden) : 0);
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
