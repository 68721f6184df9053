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

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIFUSEPASS
#include "bonsai/Transforms/Passes.h.inc"

ArrayRef<FusionFamily> getFusionFamilies() {
  static const std::vector<FusionFamily> families = {
      {"linear-cross-entropy",
       "LM head + cross-entropy + their gradients, chunked over positions",
       populateLinearCrossEntropyFusionPatterns},
      {"residual-norm", "residual add + RMSNorm/LayerNorm, and norm gradient + gradient add",
       populateResidualNormFusionPatterns},
      {"gemm-epilogue",
       "accumulation and GELU in the epilogues of the GEMMs that produce their inputs",
       populateGemmEpilogueFusionPatterns, nullptr},
      {"optimizer", "the update phase's optimizer updates as multi-tensor kernels", nullptr,
       fuseOptimizerUpdates},
      {"elementwise",
       "remaining chains of elementwise ops -> one generated kernel each (runs last: the "
       "pattern families take their ops first)",
       nullptr, fuseElementwiseChains},
      {"flash-attention",
       "attention + attention_grad: the forward saves the log-sum-exp the backward reads",
       populateFlashAttentionFusionPatterns},
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

    RewritePatternSet patterns(&getContext());
    for (const FusionFamily &family : families)
      if (family.populatePatterns && !disabled.contains(family.name))
        family.populatePatterns(patterns, options);
    bool anyPatterns = !patterns.getNativePatterns().empty();
    FrozenRewritePatternSet frozen(std::move(patterns));

    for (auto function : getOperation().getOps<FunctionOpInterface>()) {
      if (function.isExternal())
        continue;
      counts.clear();
      // Fusion only combines existing ops; it must not fold, reorder or erase anything else.
      GreedyRewriteConfig config;
      config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
      config.enableFolding(false);
      config.enableConstantCSE(false);
      if (anyPatterns &&
          failed(applyPatternsGreedily(function, frozen, config))) {
        function.emitError() << "bonsai-fuse: fusion patterns did not converge";
        return signalPassFailure();
      }
      for (const FusionFamily &family : families)
        if (family.runOnFunction && !disabled.contains(family.name) &&
            failed(family.runOnFunction(function, options)))
          return signalPassFailure();
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
