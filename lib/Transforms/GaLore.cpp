//===- GaLore.cpp - Project the AdamW moments of 2-D weights (GaLore) -----===//
//
// The `bonsai-galore` pass (see Passes.td and docs/galore.md). It runs after bonsai-optimizer
// and rewrites, for every weight the recipe's `bonsai.galore` targets, the full-size AdamW
// update into a refresh of the weight's projector, a projection of its gradient and an AdamW
// step on the projection; the moments shrink from m x n to the projection's shape.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Dialect/Bonsai/IR/ModelSummary.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIGALOREPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// "716 B", "1.50 MiB", "2.25 GiB", for remarks.
std::string formatBytes(int64_t bytes) {
  if (bytes < 1024)
    return llvm::formatv("{0} B", bytes).str();
  if (bytes < 1024 * 1024)
    return llvm::formatv("{0:F2} KiB", double(bytes) / 1024.0).str();
  if (bytes < int64_t(1) << 30)
    return llvm::formatv("{0:F2} MiB", double(bytes) / (1024.0 * 1024.0)).str();
  return llvm::formatv("{0:F2} GiB", double(bytes) / double(int64_t(1) << 30)).str();
}

struct GaLorePass : impl::BonsaiGaLorePassBase<GaLorePass> {
  using Base::Base;

  LogicalResult rewrite(func::FuncOp function, GaloreDirectiveOp directive) {
    ModelSummary model(function);
    SmallVector<StringRef> patterns = directive.getTargetPatterns();
    // Slots (and so offsets and sketch seeds) follow the model's order of the weights, which
    // a reference implementation can reproduce from the model alone.
    llvm::DenseMap<Operation *, int64_t> slotOf;
    llvm::SmallPtrSet<Operation *, 32> targeted;
    for (const LinearSummary *linear : model.matchLinears(patterns))
      if (targeted.insert(linear->weight->op).second) {
        int64_t slot = slotOf.size();
        slotOf[linear->weight->op] = slot;
      }
    if (targeted.empty())
      return directive.emitError()
             << "no linear of '" << function.getSymName() << "' matches the GaLore targets";

    // The updates to rewrite, in program order (the backward pass's), each in its own place.
    SmallVector<AdamWUpdateOp> updates;
    llvm::SmallPtrSet<Operation *, 32> updated;
    int64_t plain = 0;
    function.walk([&](Operation *op) {
      if (auto adamw = dyn_cast<AdamWUpdateOp>(op)) {
        Operation *param = adamw.getParam().getDefiningOp();
        if (targeted.contains(param)) {
          updates.push_back(adamw);
          updated.insert(param);
        } else {
          ++plain;
        }
      }
    });
    for (Operation *param : targeted)
      if (!updated.contains(param))
        return param->emitError()
               << "GaLore target '" << cast<ParamOp>(param).getName()
               << "' has no AdamW update to rewrite: run bonsai-optimizer (with \"adamw\") "
                  "before bonsai-galore";

    int64_t rank = directive.getRank(), gap = directive.getUpdateProjGap();
    StringRef kind = directive.getProjector();
    // The exact projector needs a symmetric eigensolver on the device, which only the CPU
    // backend has; saying so here beats a plan that fails at its first step.
    if (kind == "svd" && target != "cpu")
      return directive.emitOpError()
             << "the exact (\"svd\") GaLore projector is not available on the CUDA backend "
                "(target "
             << target << "); use projector \"randomized\"";

    OpBuilder builder(updates.front());
    auto f32 = builder.getF32Type();
    int64_t count = updates.size();
    auto status = StateOp::create(builder, directive.getLoc(), RankedTensorType::get({count}, f32),
                                  StateKind::Optimizer, "galore.status", StringAttr());
    int64_t fullBytes = 0, galoreBytes = 0;
    for (AdamWUpdateOp adamw : updates) {
      auto param = cast<ParamOp>(adamw.getParam().getDefiningOp());
      int64_t slot = slotOf.lookup(param);
      RankedTensorType type = param.getType();
      if (type.getRank() != 2)
        return param.emitError() << "GaLore needs a 2-D weight, '" << param.getName() << "' is "
                                 << type;
      int64_t m = type.getDimSize(0), n = type.getDimSize(1);
      if (rank >= std::min(m, n))
        return directive.emitOpError()
               << "rank " << rank << " is not smaller than min(m, n) = " << std::min(m, n)
               << " of weight '" << param.getName() << "'";
      // Projecting the smaller side keeps the moments and the projector smallest.
      bool left = m <= n;
      SmallVector<int64_t> projectorShape = {left ? m : n, rank};
      SmallVector<int64_t> reducedShape =
          left ? SmallVector<int64_t>{rank, n} : SmallVector<int64_t>{m, rank};
      auto reducedType = RankedTensorType::get(reducedShape, f32);
      // Without a master copy the back-projection accumulates into the weight itself, on
      // tensor cores that take bf16 operands: an f16 accumulator is not among their outputs.
      if (type.getElementType().isF16() && !adamw.getMaster())
        return param.emitError() << "GaLore on the f16 weight '" << param.getName()
                                 << "' needs its fp32 master copy: set master_weights = true "
                                    "(or store the model in bf16)";
      Location loc = param.getLoc();
      // The rewrite runs where the update did: the update phase, or the backward pass right
      // where the gradient is complete when the optimizer has update_in_backward.
      Attribute phase = adamw->getAttr(BonsaiDialect::getPhaseAttrName());
      builder.setInsertionPoint(adamw);
      auto state = [&](StringRef suffix, RankedTensorType stateType) {
        return StateOp::create(builder, loc, stateType, StateKind::Optimizer,
                               (param.getName() + suffix).str(), StringAttr())
            .getResult();
      };
      Value projector = state(".galore_projector", RankedTensorType::get(projectorShape, f32));
      Value expAvg = state(".exp_avg", reducedType), expAvgSq = state(".exp_avg_sq", reducedType);

      int64_t small = std::min(m, n), large = std::max(m, n);
      auto workspace =
          RankedTensorType::get({GaloreRefreshOp::getWorkspaceElements(small, large, rank)}, f32);
      int64_t offset = slot * gap / count;
      auto refresh = GaloreRefreshOp::create(builder, loc, workspace, adamw.getGradient(),
                                             adamw.getStep(), projector, status.getResult(), rank,
                                             gap, offset, slot, left, kind, powerIterations, seed);
      if (phase)
        refresh->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
      // A half-precision weight's projections run on bf16 operands (tensor cores); the
      // rounding is part of the update's semantics, so both backends do it.
      bool bf16 = !type.getElementType().isF32();
      auto project = GaloreProjectOp::create(builder, loc, reducedType, adamw.getGradient(),
                                             projector, left, bf16);
      if (phase)
        project->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
      auto galore = GaloreAdamWUpdateOp::create(
          builder, loc, project.getResult(), adamw.getStep(), adamw.getLr(), adamw.getGradNorm(),
          projector, param.getResult(), expAvg, expAvgSq, adamw.getMaster(), adamw.getBeta1Attr(),
          adamw.getBeta2Attr(), adamw.getEpsAttr(), adamw.getWeightDecayAttr(),
          adamw.getGradClipAttr(), directive.getScaleAttr(), builder.getBoolAttr(left));
      if (phase)
        galore->setAttr(BonsaiDialect::getPhaseAttrName(), phase);

      // The full-size moments go with the update that used them.
      Value oldAvg = adamw.getExpAvg(), oldAvgSq = adamw.getExpAvgSq();
      adamw.erase();
      for (Value old : {oldAvg, oldAvgSq})
        if (Operation *def = old.getDefiningOp(); def && isa<StateOp>(def) && def->use_empty())
          def->erase();

      int64_t full = 2 * m * n * 4,
              reduced = (2 * getNumElements(reducedType) + projectorShape[0] * rank) * 4;
      fullBytes += full;
      galoreBytes += reduced;
      stateBytesSaved += full - reduced;
      ++numGalore;
      if (perWeightRemarks)
        emitRemark(loc) << "GaLore on '" << param.getName() << "' (" << m << "x" << n
                        << ", projected on the " << (left ? "left" : "right") << ", offset "
                        << offset << "): moments " << reducedShape[0] << "x" << reducedShape[1]
                        << ", projector " << projectorShape[0] << "x" << rank << ", " << reduced / 4
                        << " floats instead of " << full / 4;
    }
    galoreBytes += count * 4;
    numAdamW += plain;
    emitRemark(directive.getLoc())
        << "GaLore (rank " << rank << ", " << kind << " projector refreshed every " << gap
        << " steps, staggered): " << count << (count == 1 ? " weight" : " weights")
        << ", optimizer state " << formatBytes(galoreBytes) << " instead of "
        << formatBytes(fullBytes) << " ("
        << llvm::formatv("{0:F3}", double(galoreBytes) / double(fullBytes)) << "x); " << plain
        << (plain == 1 ? " parameter keeps AdamW" : " parameters keep AdamW");
    return success();
  }

  void runOnOperation() override {
    SmallVector<GaloreDirectiveOp> directives;
    getOperation().walk([&](GaloreDirectiveOp op) { directives.push_back(op); });
    // Without a directive the optimizer stays as bonsai-optimizer made it.
    if (directives.empty())
      return;
    if (directives.size() > 1) {
      directives[1].emitError("a recipe has at most one bonsai.galore directive");
      return signalPassFailure();
    }
    for (auto function : getOperation().getOps<func::FuncOp>())
      if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
        if (failed(rewrite(function, directives.front())))
          return signalPassFailure();
  }
};
} // namespace
} // namespace mlir::bonsai
