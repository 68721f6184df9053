//===- BonsaiCost.h - The cost of one op ----------------------------------===//
//
// OpCost is what CostOpInterface returns: FLOPs split by the hardware unit they run on, and the
// bytes an op reads and writes. Kept apart from the interface so that analyses can use it alone.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAICOST_H
#define BONSAI_DIALECT_BONSAI_IR_BONSAICOST_H

#include <cstdint>

namespace mlir::bonsai {

/// The work of one op (or a sum of ops).
struct OpCost {
  /// Multiply-add work of GEMM shape (two FLOPs per multiply-add), run on tensor cores.
  int64_t matmulFlops = 0;
  /// Elementwise and reduction FLOPs (norms, activations, softmax), run on CUDA cores.
  int64_t vectorFlops = 0;
  /// Bytes read from and written to memory, each operand and result touched once.
  int64_t bytesRead = 0;
  int64_t bytesWritten = 0;
  /// Of matmulFlops, those of a fused attention kernel (flash attention): its softmax between
  /// the two products keeps it below a GEMM's rate, so step-time estimates run it at the
  /// target's attention rate (bonsai/Analysis/StepTime.h).
  int64_t attentionFlops = 0; // last: positional initialisers name the four above

  /// All FLOPs.
  int64_t totalFlops() const { return matmulFlops + vectorFlops; }

  /// This cost with every field multiplied by `factor`.
  OpCost scaled(int64_t factor) const {
    return {matmulFlops * factor, vectorFlops * factor, bytesRead * factor, bytesWritten * factor,
            attentionFlops * factor};
  }

  OpCost &operator+=(const OpCost &other) {
    matmulFlops += other.matmulFlops;
    attentionFlops += other.attentionFlops;
    vectorFlops += other.vectorFlops;
    bytesRead += other.bytesRead;
    bytesWritten += other.bytesWritten;
    return *this;
  }
};

} // namespace mlir::bonsai

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAICOST_H
