//===- Fuse.cpp - Replace chains of ops with fused kernels ----------------===//
//
// The `bonsai-fuse` pass (see Passes.td) and the registry of fusion families (Fusion.h). The
// families themselves live under Fusion/, one file each.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Transforms/Fusion.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/ADT/StringSet.h"

#include <map>
#include <optional>

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIFUSEPASS
#include "bonsai/Transforms/Passes.h.inc"

ArrayRef<FusionFamily> getFusionFamilies() {
  // The order is a priority: a family applies to what the families before it left. `dora`
  // comes first: it matches recomputed clones against the forward ops they copy
  // (isSameValue), which the other families rewrite differently in the two passes (a
  // recomputed norm stays a norm while the forward one joins its residual add); `dora-weight`
  // follows it, since it needs the pre-scale sum that `dora` leaves unread. The LM
  // head's chunked loss and the flash attention pair replace the most work, so they come
  // before the GEMM epilogues (which would otherwise take the head's weight-gradient GEMM);
  // `packed-qkv` follows `flash-attention`, whose ops it packs, and `slice-gradients`, whose
  // concat of q, k and v's gradients it replaces; the FP8 backward pairs come after the
  // accumulation they include (and before the sharing of their input casts, which takes fused
  // backwards, and the forward's keeping of the cast, which takes shared ones), and the
  // generated kernels take whatever elementwise ops remain at the end.
  static const std::vector<FusionFamily> families = {
      {"dora",
       "a DoRA output's gradients from the rescaled output: no pre-scale output kept, one pass",
       nullptr, fuseDoraGradients},
      {"dora-weight",
       "a DoRA output's row scale on the weight and lora_b rows: no [tokens, out] rescale pass",
       nullptr, scaleDoraWeights},
      {"linear-cross-entropy", "LM head + cross-entropy + their gradients, chunked over positions",
       populateLinearCrossEntropyFusionPatterns},
      {"flash-attention",
       "attention + attention_grad: the forward saves the log-sum-exp the backward reads",
       populateFlashAttentionFusionPatterns},
      {"residual-norm", "residual add + RMSNorm/LayerNorm, and norm gradient + gradient add",
       populateResidualNormFusionPatterns},
      {"slice-gradients",
       "the sum of adjacent slices' gradients (GPT-2's q, k, v) as one concat of the pieces",
       populateSliceGradientsFusionPatterns},
      {"packed-qkv",
       "flash attention of slices of one projection (GPT-2's q, k, v) reading them in place, "
       "and its gradients written into one tensor instead of concatenated",
       populatePackedQkvFusionPatterns},
      {"gemm-epilogue",
       "accumulation and GELU in the epilogues of the GEMMs that produce their inputs",
       populateGemmEpilogueFusionPatterns, nullptr},
      {"fp8-backward",
       "an FP8 linear's input and weight gradients from one cast of the output gradient",
       populateFp8BackwardFusionPatterns, nullptr},
      {"fp8-shared-input",
       "FP8 linears of one input (q, k, v; gate, up) from one cast of it, forward and backward",
       nullptr, shareFp8InputCasts},
      {"fp8-saved-input",
       "FP8 linears' backwards from the forward's transposed cast of their input", nullptr,
       saveFp8InputCasts},
      {"optimizer", "the update phase's optimizer updates as multi-tensor kernels", nullptr,
       fuseOptimizerUpdates},
      {"elementwise", "remaining chains of elementwise ops -> one generated kernel each", nullptr,
       fuseElementwiseChains},
  };
  return families;
}

namespace {
struct FusePass : impl::BonsaiFusePassBase<FusePass> {
  using Base::Base;

  void runOnOperation() override {
    ArrayRef<FusionFamily> families = getFusionFamilies();
    // Family names given to `disable` and `only` must exist; `only` keeps the families it
    // names (how a test looks at one family), `disable` leaves out those it names.
    auto known = [&](ArrayRef<std::string> names) {
      for (const std::string &name : names) {
        if (llvm::any_of(families, [&](const FusionFamily &f) { return f.name == name; }))
          continue;
        InFlightDiagnostic diag = getOperation().emitError()
                                  << "bonsai-fuse: unknown fusion family '" << name
                                  << "'; the families are:";
        for (const FusionFamily &family : families)
          diag << " " << family.name;
        return false;
      }
      return true;
    };
    if (!known(disable) || !known(only))
      return signalPassFailure();
    llvm::StringSet<> disabled;
    for (const std::string &name : disable)
      disabled.insert(name);
    if (!only.empty())
      for (const FusionFamily &family : families)
        if (!llvm::is_contained(only, family.name.str()))
          disabled.insert(family.name);

    // Every fused op is counted per family and function for the summary remark.
    std::map<std::string, unsigned> counts;
    FusionOptions options;
    options.target = target;
    options.notifyFused = [&](Operation *fused, StringRef what) {
      ++numFused;
      ++counts[what.str()];
      if (perSiteRemarks)
        fused->emitRemark() << "fused " << what;
    };

    // One frozen pattern set per pattern family, built once for all functions.
    std::vector<std::optional<FrozenRewritePatternSet>> frozen(families.size());
    for (auto [family, set] : llvm::zip_equal(families, frozen)) {
      if (!family.populatePatterns || disabled.contains(family.name))
        continue;
      RewritePatternSet patterns(&getContext());
      family.populatePatterns(patterns, options);
      set.emplace(std::move(patterns));
    }

    for (auto function : getOperation().getOps<FunctionOpInterface>()) {
      if (function.isExternal())
        continue;
      counts.clear();
      // Fusion only combines existing ops; it must not fold, reorder or erase anything else.
      GreedyRewriteConfig config;
      config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
      config.enableFolding(false);
      config.enableConstantCSE(false);
      // Families apply one after another, in the registry's order (its comment says why).
      for (auto [family, set] : llvm::zip_equal(families, frozen)) {
        if (disabled.contains(family.name))
          continue;
        if (set && failed(applyPatternsGreedily(function, *set, config))) {
          function.emitError() << "bonsai-fuse: the " << family.name
                               << " fusion patterns did not converge";
          return signalPassFailure();
        }
        if (family.runOnFunction && failed(family.runOnFunction(function, options)))
          return signalPassFailure();
      }
      if (counts.empty())
        continue;
      InFlightDiagnostic remark = function.emitRemark() << "bonsai-fuse:";
      llvm::interleave(
          counts, remark,
          [&](const auto &entry) { remark << " " << entry.second << " " << entry.first; },
          ";");
    }
  }
};
} // namespace
} // namespace mlir::bonsai
