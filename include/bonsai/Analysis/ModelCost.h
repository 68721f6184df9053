//===- ModelCost.h - Parameters, FLOPs and bytes of a model ---------------===//
//
// Sums the per-op costs (CostOpInterface) of a model function into the figures a user plans
// with: parameters by class, FLOPs per step and per token, weight and activation bytes per
// layer. Used by the cost-report pass and by bonsai-compile.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_ANALYSIS_MODELCOST_H
#define BONSAI_ANALYSIS_MODELCOST_H

#include "bonsai/Dialect/Bonsai/IR/BonsaiCost.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mlir::bonsai {

/// Count and storage of a class of parameters.
struct ParamCount {
  int64_t elements = 0;
  int64_t bytes = 0;
  void add(int64_t n, int64_t b) {
    elements += n;
    bytes += b;
  }
};

/// Weights, activations and work attributed to one transformer block (or to the embedding
/// before the first block, or the head after the last).
struct LayerCost {
  std::string name;
  int64_t weightBytes = 0;
  /// Bytes of the values the layer's ops produce: what backward would keep without remat.
  int64_t activationBytes = 0;
  OpCost forward;
};

/// The cost report of a model function.
struct ModelCost {
  std::string function;
  /// Tokens per step: the element count of the loss labels (or of the first embedding's ids).
  int64_t tokensPerStep = 0;
  ParamCount trainable, frozen, quantized;
  /// Parameters used only as embedding lookup tables (no FLOPs in a matmul).
  ParamCount embeddingOnly;
  /// Parameters used as linear weights (N in the 6·N FLOPs-per-token rule).
  ParamCount gemmWeights;
  OpCost forward, backward;
  /// GEMM FLOPs of attention (Q·Kᵀ and P·V, and their gradients), included in the totals.
  int64_t attentionForwardFlops = 0;
  int64_t attentionTrainingFlops = 0;
  llvm::SmallVector<LayerCost> layers;

  ParamCount total() const {
    ParamCount all = trainable;
    all.add(frozen.elements, frozen.bytes);
    all.add(quantized.elements, quantized.bytes);
    return all;
  }

  /// Prints the report; `perLayer` adds the per-layer table.
  void print(llvm::raw_ostream &os, bool perLayer = true) const;
};

/// Computes the cost report of `function`.
ModelCost computeModelCost(FunctionOpInterface function);

/// Layer index of a Hugging Face parameter name ("model.layers.12.mlp..." or
/// "transformer.h.3.attn..."), or -1 if the name is not inside a numbered block.
int64_t getLayerIndex(llvm::StringRef paramName);

} // namespace mlir::bonsai

#endif // BONSAI_ANALYSIS_MODELCOST_H
