//===- Fusion.h - The fusion families of bonsai-fuse ------------*- C++ -*-===//
//
// bonsai-fuse applies families of fusions, each in its own file under lib/Transforms/Fusion/.
// A family either adds rewrite patterns (applied by one greedy rewrite) or transforms a whole
// function. Families apply one after another in the order of the registry (getFusionFamilies,
// in Fuse.cpp), which is a priority: each family sees what the ones before it left. The pass,
// its `disable` and `only` options and docs/fusion.md follow the registry.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TRANSFORMS_FUSION_H
#define BONSAI_TRANSFORMS_FUSION_H

#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/FunctionInterfaces.h"

#include <functional>
#include <string>

namespace mlir::bonsai {

/// What every fusion family is told: the target architecture, and whom to tell about each
/// fused op it creates (the pass counts them and remarks on them).
struct FusionOptions {
  /// "cpu" or "sm_XX": fused kernels may depend on what the target's hardware has.
  std::string target = "cpu";
  /// Called with each fused op a family creates and a short description of what it replaced.
  std::function<void(Operation *fused, StringRef what)> notifyFused;

  /// Reports `fused` to the pass (no-op without a listener).
  void fused(Operation *fused, StringRef what) const {
    if (notifyFused)
      notifyFused(fused, what);
  }
};

/// One family of fusions: its name (for `disable=` and remarks), a one-line summary, and how
/// it applies: by adding rewrite patterns, or by transforming a whole function.
struct FusionFamily {
  StringRef name;
  StringRef summary;
  /// Adds the family's patterns; null for a whole-function family.
  void (*populatePatterns)(RewritePatternSet &patterns, const FusionOptions &options) = nullptr;
  /// Transforms `function`; null for a pattern family.
  LogicalResult (*runOnFunction)(FunctionOpInterface function,
                                 const FusionOptions &options) = nullptr;
};

/// Every fusion family, in the order the pass applies them.
ArrayRef<FusionFamily> getFusionFamilies();

/// `linear-cross-entropy` (Fusion/LinearCrossEntropy.cpp): the LM head, its loss and their
/// gradients as one chunked kernel that never holds the whole batch's logits.
void populateLinearCrossEntropyFusionPatterns(RewritePatternSet &patterns,
                                              const FusionOptions &options);
/// `residual-norm` (Fusion/ResidualNorm.cpp): residual adds joined to the norm that reads
/// the sum (forward) and to the norm gradient whose input gradient they sum (backward).
void populateResidualNormFusionPatterns(RewritePatternSet &patterns,
                                        const FusionOptions &options);
/// `slice-gradients` (Fusion/SliceGradients.cpp): the sum of the gradients of adjacent slices
/// of one tensor (GPT-2's q, k and v) as one concat, not zero tensors of the whole shape added.
void populateSliceGradientsFusionPatterns(RewritePatternSet &patterns,
                                          const FusionOptions &options);
/// `packed-qkv` (Fusion/PackedQkv.cpp): flash attention whose q, k and v are slices of one
/// tensor (GPT-2's c_attn) reads them out of it (flash_attention_qkv), and its gradient writes
/// dq, dk and dv into one tensor of its shape (flash_attention_qkv_grad) instead of the concat.
void populatePackedQkvFusionPatterns(RewritePatternSet &patterns, const FusionOptions &options);
/// Family `dora` (Fusion/Dora.cpp): a DoRA output's backward muls, reduce_to and magnitude
/// dora_scale -> one dora_grad reading the rescaled output instead of the pre-scale one.
LogicalResult fuseDoraGradients(FunctionOpInterface function, const FusionOptions &options);

/// Family `dora-weight` (Fusion/DoraWeightScale.cpp): a DoRA output's forward rescale
/// s ⊙ (x·Wᵀ + u·Bᵀ) -> x·(s ⊙ W)ᵀ + u·(s ⊙ B)ᵀ, the scale applied to weight rows.
LogicalResult scaleDoraWeights(FunctionOpInterface function, const FusionOptions &options);
/// Family `optimizer` (Fusion/Optimizer.cpp): groups of update-phase optimizer updates ->
/// one multi-tensor update each.
LogicalResult fuseOptimizerUpdates(FunctionOpInterface function, const FusionOptions &options);

/// Family `gemm-epilogue` (Fusion/GemmEpilogue.cpp): accumulation into the producing GEMM
/// (beta = 1) and linear + tanh GELU as one GEMM with a GELU epilogue.
void populateGemmEpilogueFusionPatterns(RewritePatternSet &patterns,
                                        const FusionOptions &options);
/// Family `fp8-backward` (Fusion/Fp8Backward.cpp): an FP8 linear's fp8_linear_grad_input and
/// fp8_linear_grad_weight_accumulate -> one fp8_linear_backward, which casts dy once.
void populateFp8BackwardFusionPatterns(RewritePatternSet &patterns, const FusionOptions &options);
/// Family `fp8-shared-input` (Fusion/Fp8SharedInput.cpp): FP8 GEMMs of one input after the
/// first read its cast (fp8_linear_shared_input, fp8_linear_backward_shared_input).
LogicalResult shareFp8InputCasts(FunctionOpInterface function, const FusionOptions &options);
/// Family `fp8-saved-input` (Fusion/Fp8SavedInput.cpp): the forward FP8 GEMM that casts an
/// input also writes its transposed codes, and the fused backwards of that input read them
/// (fp8_linear_with_input_cast, fp8_linear_backward_from_input_cast).
LogicalResult saveFp8InputCasts(FunctionOpInterface function, const FusionOptions &options);
/// The `elementwise` family (Fusion/Elementwise.cpp): connected ElementwiseOpInterface ops
/// of one iteration shape and phase become bonsai.fused_elementwise regions.
LogicalResult fuseElementwiseChains(FunctionOpInterface function, const FusionOptions &options);
/// `flash-attention` (Fusion/FlashAttention.cpp): an attention whose result feeds an
/// attention_grad returns its log-sum-exp, and the grad reads it instead of recomputing it.
void populateFlashAttentionFusionPatterns(RewritePatternSet &patterns,
                                          const FusionOptions &options);

} // namespace mlir::bonsai

#endif // BONSAI_TRANSFORMS_FUSION_H
