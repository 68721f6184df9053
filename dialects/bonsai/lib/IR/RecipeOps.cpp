//===- RecipeOps.cpp - bonsai.recipe and its directives -------------------===//
//
// A recipe is verified in three layers: each directive checks its own values (verify), each
// directive checks itself against the model it applies to (RecipeDirectiveOpInterface, run from
// the recipe's symbol-use verification once the model is known), and the recipe checks that
// its directives do not contradict each other.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/GlobPattern.h"

#include <cmath>

using namespace mlir;
using namespace mlir::bonsai;

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

/// Fails unless `value` is one of `allowed`, naming the valid choices.
static LogicalResult expectOneOf(Operation *op, StringRef what, StringRef value,
                                 ArrayRef<StringRef> allowed) {
  if (llvm::is_contained(allowed, value))
    return success();
  InFlightDiagnostic diag = op->emitOpError() << "unknown " << what << " '" << value
                                              << "'; expected one of: ";
  llvm::interleaveComma(allowed, diag, [&](StringRef s) { diag << "'" << s << "'"; });
  return diag;
}

static SmallVector<StringRef> toStrings(ArrayAttr array) {
  return llvm::to_vector(array.getAsValueRange<StringAttr>());
}

/// Local checks of a target list: not empty, no empty or malformed pattern.
static LogicalResult verifyTargetList(Operation *op, ArrayAttr targets) {
  if (targets.empty())
    return op->emitOpError("needs at least one target pattern");
  for (StringRef pattern : targets.getAsValueRange<StringAttr>()) {
    if (pattern.empty())
      return op->emitOpError("has an empty target pattern");
    if (pattern.find_first_of("*?[") == StringRef::npos)
      continue;
    llvm::Expected<llvm::GlobPattern> glob = llvm::GlobPattern::create(pattern);
    if (!glob) {
      std::string message = llvm::toString(glob.takeError());
      return op->emitOpError() << "target pattern '" << pattern << "' is malformed: "
                               << message;
    }
  }
  return success();
}

/// Checks that every pattern of `targets` names at least one linear of the model.
static LogicalResult verifyTargetsMatch(Operation *op, ArrayAttr targets,
                                        const ModelSummary &model) {
  for (StringRef pattern : targets.getAsValueRange<StringAttr>()) {
    if (!model.matchLinears(pattern).empty())
      continue;
    InFlightDiagnostic diag = op->emitOpError()
                              << "target '" << pattern << "' matches no linear of the model";
    if (!model.getLinears().empty())
      diag << " (linear weights are named like '" << model.getLinears().front().weight->name
           << "')";
    return diag;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// TargetDirectiveOp
//===----------------------------------------------------------------------===//

LogicalResult TargetDirectiveOp::verify() {
  StringRef arch = getArch();
  unsigned capability = 0;
  // "cpu" compiles for the reference backend; "sm_90a" is Hopper with its arch-specific
  // instructions (wgmma, TMA).
  if (arch == "cpu")
    return success();
  bool ok = arch.consume_front("sm_");
  arch.consume_back("a");
  if (!ok || arch.getAsInteger(10, capability) || capability < 70)
    return emitOpError() << "target '" << getArch()
                         << "' is not 'cpu' or a CUDA architecture sm_XX (or sm_XXa) with "
                            "XX >= 70 (sm_80 Ampere, sm_86 A10G, sm_89 Ada, sm_90 Hopper)";
  if (IntegerAttr mib = getDeviceMemoryMibAttr(); mib && mib.getInt() <= 0)
    return emitOpError() << "device memory must be positive, got " << mib.getInt() << " MiB";
  if (IntegerAttr mib = getHostMemoryMibAttr(); mib && mib.getInt() <= 0)
    return emitOpError() << "host memory must be positive, got " << mib.getInt() << " MiB";
  return success();
}

LogicalResult TargetDirectiveOp::verifyAgainstModel(const ModelSummary &) { return success(); }

//===----------------------------------------------------------------------===//
// QuantizeDirectiveOp
//===----------------------------------------------------------------------===//

LogicalResult QuantizeDirectiveOp::verify() {
  if (failed(expectOneOf(*this, "quantization format", getFormat(), {"nf4"})))
    return failure();
  int64_t block = int64_t(getBlockSize());
  if (block < 16 || block > 4096 || (block & (block - 1)) != 0)
    return emitOpError() << "block size must be a power of two in [16, 4096], got " << block;
  if (int64_t(getDoubleQuantBlock()) <= 0)
    return emitOpError() << "double-quantization block must be positive, got "
                         << int64_t(getDoubleQuantBlock());
  return verifyTargetList(*this, getTargets());
}

LogicalResult QuantizeDirectiveOp::verifyAgainstModel(const ModelSummary &model) {
  if (failed(verifyTargetsMatch(*this, getTargets(), model)))
    return failure();
  for (const LinearSummary *linear : model.matchLinears(getTargetPatterns())) {
    // The parameter is what gets quantized, whatever view of it the linear reads.
    int64_t n = getNumElements(linear->weight->type);
    if (n % int64_t(getBlockSize()) != 0)
      return emitOpError() << "weight '" << linear->weight->name << "' has " << n
                           << " elements, not a multiple of the block size " << int64_t(getBlockSize());
  }
  return success();
}

SmallVector<StringRef> QuantizeDirectiveOp::getTargetPatterns() {
  return toStrings(getTargets());
}

//===----------------------------------------------------------------------===//
// LoraDirectiveOp
//===----------------------------------------------------------------------===//

LogicalResult LoraDirectiveOp::verify() {
  if (int64_t(getRank()) <= 0)
    return emitOpError() << "rank must be positive, got " << int64_t(getRank());
  double alpha = getAlpha().convertToDouble();
  if (!(alpha > 0) || !std::isfinite(alpha))
    return emitOpError() << "alpha must be positive and finite, got " << alpha;
  return verifyTargetList(*this, getTargets());
}

LogicalResult LoraDirectiveOp::verifyAgainstModel(const ModelSummary &model) {
  // Once bonsai-insert-lora has carried the directive out, the model holds the adapters (and
  // later passes clone the linears): the checks were made on the model before it.
  if (model.getFunction()->hasAttr("bonsai.adapters"))
    return success();
  return verifyLoraTargets([&] { return emitOpError(); }, getTargetPatterns(),
                           int64_t(getRank()), getDora(), model);
}

SmallVector<StringRef> LoraDirectiveOp::getTargetPatterns() { return toStrings(getTargets()); }

//===----------------------------------------------------------------------===//
// OptimizerDirectiveOp
//===----------------------------------------------------------------------===//

LogicalResult OptimizerDirectiveOp::verify() {
  if (failed(expectOneOf(*this, "optimizer", getKind(), {"adamw", "sgd"})) ||
      failed(expectOneOf(*this, "schedule", getSchedule(), {"constant", "cosine"})))
    return failure();
  double lr = getLr().convertToDouble();
  if (!(lr > 0) || !std::isfinite(lr))
    return emitOpError() << "learning rate must be positive and finite, got " << lr;
  for (auto [name, value] : {std::pair<StringRef, double>{"beta1", getBeta1().convertToDouble()},
                             {"beta2", getBeta2().convertToDouble()},
                             {"momentum", getMomentum().convertToDouble()}})
    if (!(value >= 0 && value < 1))
      return emitOpError() << name << " must be in [0, 1), got " << value;
  if (!(getEps().convertToDouble() > 0))
    return emitOpError() << "eps must be positive, got " << getEps().convertToDouble();
  if (!(getWeightDecay().convertToDouble() >= 0))
    return emitOpError() << "weight_decay must be non-negative, got "
                         << getWeightDecay().convertToDouble();
  if (!(getGradClip().convertToDouble() >= 0))
    return emitOpError() << "grad_clip must be non-negative (0 disables clipping), got "
                         << getGradClip().convertToDouble();
  double minRatio = getMinLrRatio().convertToDouble();
  if (!(minRatio >= 0 && minRatio <= 1))
    return emitOpError() << "min_lr_ratio must be in [0, 1], got " << minRatio;
  if (getKind() == "adamw" && getMomentum().convertToDouble() != 0)
    return emitOpError("momentum applies to sgd; adamw uses beta1 and beta2");
  if (int64_t(getWarmupSteps()) < 0)
    return emitOpError() << "warmup_steps must be non-negative, got " << int64_t(getWarmupSteps());
  if (getSchedule() == "cosine") {
    if (int64_t(getTotalSteps()) <= 0)
      return emitOpError("a cosine schedule needs total_steps > 0");
    if (int64_t(getWarmupSteps()) >= int64_t(getTotalSteps()))
      return emitOpError() << "warmup_steps (" << int64_t(getWarmupSteps())
                           << ") must be below total_steps for a cosine decay ("
                           << int64_t(getTotalSteps()) << ")";
  }
  if (int64_t(getMicroBatches()) < 1)
    return emitOpError() << "micro_batches must be at least 1, got " << int64_t(getMicroBatches());
  // Both need every gradient of the step before the first update.
  if (getUpdateInBackward() && getGradClip().convertToDouble() > 0)
    return emitOpError("update_in_backward updates each parameter as soon as its gradient is "
                       "complete, before the global norm that grad_clip needs is known: set "
                       "grad_clip = 0 or drop update_in_backward");
  if (getUpdateInBackward() && int64_t(getMicroBatches()) > 1)
    return emitOpError() << "update_in_backward updates each parameter in the backward pass, "
                            "so a step has one micro-batch, not "
                         << int64_t(getMicroBatches());
  return success();
}

LogicalResult OptimizerDirectiveOp::verifyAgainstModel(const ModelSummary &) {
  return success();
}

//===----------------------------------------------------------------------===//
// GaloreDirectiveOp
//===----------------------------------------------------------------------===//

LogicalResult GaloreDirectiveOp::verify() {
  if (int64_t(getRank()) <= 0)
    return emitOpError() << "rank must be positive, got " << int64_t(getRank());
  if (int64_t(getUpdateProjGap()) <= 0)
    return emitOpError() << "update_proj_gap must be positive (steps between projector "
                            "refreshes), got "
                         << int64_t(getUpdateProjGap());
  if (!(getScale().convertToDouble() > 0))
    return emitOpError() << "scale must be positive, got " << getScale().convertToDouble();
  if (failed(expectOneOf(*this, "projector", getProjector(), {"svd", "randomized"})))
    return failure();
  return verifyTargetList(*this, getTargets());
}

LogicalResult GaloreDirectiveOp::verifyAgainstModel(const ModelSummary &model) {
  if (failed(verifyTargetsMatch(*this, getTargets(), model)))
    return failure();
  for (const LinearSummary *linear : model.matchLinears(getTargetPatterns())) {
    int64_t smaller = std::min(linear->inFeatures, linear->outFeatures);
    if (int64_t(getRank()) >= smaller)
      return emitOpError() << "rank " << int64_t(getRank()) << " is not smaller than min(m, n) = "
                           << smaller << " of weight '" << linear->weight->name
                           << "'; a projection would save nothing";
    if (!linear->weight->trainable)
      return emitOpError() << "weight '" << linear->weight->name
                           << "' is frozen; GaLore applies to trainable weights";
  }
  return success();
}

SmallVector<StringRef> GaloreDirectiveOp::getTargetPatterns() {
  return toStrings(getTargets());
}

//===----------------------------------------------------------------------===//
// FP8DirectiveOp
//===----------------------------------------------------------------------===//

LogicalResult FP8DirectiveOp::verify() {
  if (failed(expectOneOf(*this, "scaling", getScaling(), {"delayed", "current"})) ||
      failed(expectOneOf(*this, "forward_accumulation", getForwardAccumulation(),
                         {"fast", "promoted"})))
    return failure();
  if (int64_t(getAmaxHistory()) < 1 || int64_t(getAmaxHistory()) > 1024)
    return emitOpError() << "amax_history must be in [1, 1024], got " << int64_t(getAmaxHistory());
  if (int64_t(getMargin()) < 0 || int64_t(getMargin()) > 16)
    return emitOpError() << "margin must be in [0, 16], got " << int64_t(getMargin());
  // `targets []` is FP8's default set (every linear but the LM head and a tied embedding's;
  // bonsai-fp8 resolves it), so an empty list is allowed here.
  if (getTargets().empty())
    return success();
  return verifyTargetList(*this, getTargets());
}

LogicalResult FP8DirectiveOp::verifyAgainstModel(const ModelSummary &model) {
  if (failed(verifyTargetsMatch(*this, getTargets(), model)))
    return failure();
  // FP8 tensor-core GEMMs (cuBLASLt) need both matrix dimensions to be multiples of 16.
  // Adapters a pass added (LoRA's) are not what the patterns mean: bonsai-fp8 skips them.
  for (const LinearSummary *linear : model.matchLinears(getTargetPatterns()))
    if (!linear->weight->addedByPass &&
        (linear->inFeatures % 16 != 0 || linear->outFeatures % 16 != 0))
      return emitOpError() << "weight '" << linear->weight->name << "' is "
                           << linear->outFeatures << "x" << linear->inFeatures
                           << "; FP8 GEMMs need dimensions that are multiples of 16";
  return success();
}

SmallVector<StringRef> FP8DirectiveOp::getTargetPatterns() { return toStrings(getTargets()); }

//===----------------------------------------------------------------------===//
// ShardDirectiveOp, OffloadDirectiveOp, RingDirectiveOp, RematDirectiveOp
//===----------------------------------------------------------------------===//

LogicalResult ShardDirectiveOp::verify() {
  if (failed(expectOneOf(*this, "sharding strategy", getStrategy(), {"zero1", "zero2", "zero3"})))
    return failure();
  if (int64_t(getRanks()) < 1)
    return emitOpError() << "ranks must be at least 1, got " << int64_t(getRanks());
  if (auto choice = dyn_cast_or_null<StringAttr>(getReshardAfterForwardAttr());
      choice && choice.getValue() != "auto")
    return emitOpError() << "reshard_after_forward is true, false or \"auto\", got \""
                         << choice.getValue() << "\"";
  if ((keepsGathered() || choosesReshard()) && getStrategy() != "zero3")
    return emitOpError() << "reshard_after_forward " << (keepsGathered() ? "false" : "\"auto\"")
                         << " applies to \"zero3\", whose parameters are gathered for each use; \""
                         << getStrategy() << "\" keeps every parameter whole on every rank";
  return success();
}

LogicalResult ShardDirectiveOp::verifyAgainstModel(const ModelSummary &) { return success(); }

LogicalResult OffloadDirectiveOp::verify() {
  if (getClasses().empty())
    return emitOpError("needs at least one state class to offload");
  llvm::StringSet<> seen;
  for (StringRef cls : getClasses().getAsValueRange<StringAttr>()) {
    if (failed(expectOneOf(
            *this, "state class", cls,
            {"parameters", "gradients", "optimizer_state", "master_weights", "activations"})))
      return failure();
    if (!seen.insert(cls).second)
      return emitOpError() << "state class '" << cls << "' is listed twice";
  }
  if (std::optional<StringRef> update = getUpdate()) {
    if (failed(expectOneOf(*this, "update", *update, {"device", "host", "auto"})))
      return failure();
    // On the host, the update reads and writes its state where it is kept.
    if (*update != "device" && !seen.contains("optimizer_state"))
      return emitOpError() << "update \"" << *update << "\" runs "
                           << (*update == "host" ? "the" : "some")
                           << " optimizer updates on the CPU over their state in pinned host "
                              "memory: list \"optimizer_state\"";
  }
  return success();
}

LogicalResult OffloadDirectiveOp::verifyAgainstModel(const ModelSummary &) {
  return success();
}

LogicalResult RingDirectiveOp::verify() {
  if (int64_t(getRanks()) < 2)
    return emitOpError() << "ring attention needs at least 2 ranks, got " << int64_t(getRanks());
  return success();
}

LogicalResult RingDirectiveOp::verifyAgainstModel(const ModelSummary &model) {
  int64_t seq = model.getSequenceLength();
  if (seq == 0)
    return emitOpError("ring attention needs a model with attention");
  // The zigzag layout (issue #26) gives rank r chunks r and 2N - 1 - r of 2N equal chunks, so
  // that every rank has as much causal work as any other.
  const int64_t ranks = int64_t(getRanks());
  if (seq % (2 * ranks) != 0)
    return emitOpError() << "sequence length " << seq << " does not split into " << 2 * ranks
                         << " equal chunks (the zigzag layout gives each of the " << ranks
                         << " ranks two); use a length that is a multiple of " << 2 * ranks;
  return success();
}

LogicalResult RematDirectiveOp::verify() {
  if (IntegerAttr chunks = getSequenceChunksAttr(); chunks && chunks.getInt() < 1)
    return emitOpError() << "sequence_chunks must be at least 1, got " << chunks.getInt();
  return expectOneOf(*this, "remat policy", getPolicy(), {"none", "full", "selective", "auto"});
}

LogicalResult RematDirectiveOp::verifyAgainstModel(const ModelSummary &) { return success(); }

//===----------------------------------------------------------------------===//
// RecipeOp
//===----------------------------------------------------------------------===//

namespace {
/// The directives of a recipe, at most one of each kind.
struct Directives {
  TargetDirectiveOp target;
  QuantizeDirectiveOp quantize;
  LoraDirectiveOp lora;
  OptimizerDirectiveOp optimizer;
  GaloreDirectiveOp galore;
  FP8DirectiveOp fp8;
  RematDirectiveOp remat;

  explicit Directives(RecipeOp recipe) {
    for (Operation &op : recipe.getBody().front()) {
      if (auto d = dyn_cast<TargetDirectiveOp>(op))
        target = d;
      else if (auto d = dyn_cast<QuantizeDirectiveOp>(op))
        quantize = d;
      else if (auto d = dyn_cast<LoraDirectiveOp>(op))
        lora = d;
      else if (auto d = dyn_cast<OptimizerDirectiveOp>(op))
        optimizer = d;
      else if (auto d = dyn_cast<GaloreDirectiveOp>(op))
        galore = d;
      else if (auto d = dyn_cast<FP8DirectiveOp>(op))
        fp8 = d;
      else if (auto d = dyn_cast<RematDirectiveOp>(op))
        remat = d;
    }
  }
};
} // namespace

LogicalResult RecipeOp::verifyRegions() {
  llvm::StringMap<Operation *> seen;
  for (Operation &op : getBody().front()) {
    if (!isa<RecipeDirectiveOpInterface>(op))
      return op.emitOpError("is not a recipe directive");
    // A directive's options are its inherent attributes; any other would be ignored by every
    // pass, so a misspelt or unsupported option is an error rather than a silent default.
    for (NamedAttribute attr : op.getDiscardableAttrs())
      return op.emitOpError() << "has no option '" << attr.getName().getValue()
                              << "' (see docs/recipes.md)";
    auto [it, inserted] = seen.try_emplace(op.getName().getStringRef(), &op);
    if (!inserted)
      return (op.emitOpError("appears twice in recipe @") << getSymName())
          .attachNote(it->second->getLoc())
             << "first occurrence";
  }
  Directives d(*this);
  // `bonsai.remat "auto"` without a recipe budget is valid: the budget may come from the
  // command line (bonsai-compile --device-memory); bonsai-remat reports a step with none.
  if (d.galore && d.optimizer && d.optimizer.getKind() != "adamw")
    return d.galore.emitOpError() << "rewrites AdamW's moments, but the optimizer is '"
                                  << d.optimizer.getKind() << "'";
  return success();
}

/// The function a recipe applies to: the one `for @model` names or, without it, the only
/// function of the enclosing symbol table that declares parameters. Null if there is none;
/// an error if the choice is ambiguous.
static FailureOr<FunctionOpInterface> resolveModel(RecipeOp recipe,
                                                   SymbolTableCollection &symbolTable) {
  if (FlatSymbolRefAttr ref = recipe.getModelAttr()) {
    auto function =
        symbolTable.lookupNearestSymbolFrom<FunctionOpInterface>(recipe, ref.getAttr());
    if (!function)
      return recipe.emitOpError() << "'" << ref << "' does not name a model function";
    if (function.isExternal() || function.getFunctionBody().getOps<ParamOp>().empty())
      return recipe.emitOpError() << "'" << ref
                                  << "' is not a model function: it has no body or declares "
                                     "no bonsai.param";
    return function;
  }
  Operation *scope = SymbolTable::getNearestSymbolTable(recipe->getParentOp());
  FunctionOpInterface model;
  unsigned count = 0;
  if (scope)
    for (Region &region : scope->getRegions())
      for (auto function : region.getOps<FunctionOpInterface>()) {
        if (function.isExternal() || function.getFunctionBody().getOps<ParamOp>().empty())
          continue;
        model = function;
        ++count;
      }
  if (count > 1)
    return recipe.emitOpError() << "the module has " << count
                                << " model functions; name the one this recipe applies to "
                                   "with 'for @name'";
  return model;
}

LogicalResult RecipeOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  FailureOr<FunctionOpInterface> function = resolveModel(*this, symbolTable);
  if (failed(function))
    return failure();
  if (!*function)
    return success(); // A recipe on its own: only the local checks apply.

  ModelSummary model(*function);
  for (Operation &op : getBody().front())
    if (failed(cast<RecipeDirectiveOpInterface>(op).verifyAgainstModel(model)))
      return failure();

  // Contradictions that only show on the model's weights.
  Directives d(*this);
  auto targeted = [&](Operation *directive) {
    llvm::SmallPtrSet<const ParamSummary *, 16> set;
    if (directive)
      for (const LinearSummary *l :
           model.matchLinears(cast<RecipeDirectiveOpInterface>(directive).getTargetPatterns()))
        set.insert(l->weight);
    return set;
  };
  auto quantized = targeted(d.quantize), adapted = targeted(d.lora), galore = targeted(d.galore),
       fp8 = targeted(d.fp8);
  for (const LinearSummary &linear : model.getLinears()) {
    const ParamSummary *w = linear.weight;
    if (quantized.contains(w) && fp8.contains(w))
      return d.fp8.emitOpError() << "weight '" << w->name
                                 << "' is also quantized to NF4; a weight is either NF4 or FP8";
    if (adapted.contains(w) && galore.contains(w))
      return d.galore.emitOpError() << "weight '" << w->name
                                    << "' also has a LoRA adapter; its base is frozen, so "
                                       "GaLore has no gradient to project";
    if (quantized.contains(w) && w->trainable && !adapted.contains(w) && !w->addedByPass)
      return d.quantize.emitOpError()
             << "weight '" << w->name
             << "' is trainable, but NF4 weights are frozen: give it a LoRA adapter or "
                "declare it frozen";
  }
  if (d.optimizer && !d.lora &&
      llvm::none_of(model.getParams(), [](const ParamSummary &p) { return p.trainable; }))
    return d.optimizer.emitOpError(
        "the model has no trainable parameter and the recipe adds no adapter: nothing to train");
  return success();
}
