//===- bonsai-compile.cpp - Compile a model and recipe into a plan --------===//
//
// bonsai-compile model.mlir [recipe.mlir] [-o step.plan] [--target=sm_90]
//                [--device-memory=24GiB] [--host-memory=64GiB] [--fuse=false]
//                [--fuse-disable=family,...]
//                [--remat-time-limit=60] [--overlap-copies=false] [--fit-offload=false]
//                [--gathers-ahead=2] [--host-update-rate=4.5]
//
// Parses the model (and the recipe, if given, into the same module), runs the standard
// pipeline (with the backward pass, the optimizer and activation recomputation when the
// recipe has a bonsai.optimizer: the recipe's bonsai.remat policy, else `auto` when there is
// a budget), writes the flatbuffer plan and prints what the step needs: parameters and FLOPs
// from the cost model, and the planned memory by class. A training step over the memory
// budget whose recipe has no bonsai.offload is compiled again with the offload choices below,
// the least taken off the device first, and the first that fits is taken and printed; when
// none fits (or with --fit-offload=false) it is an error that says by how much and what
// dominates. A recipe with `bonsai.shard "zero3" ... reshard_after_forward "auto"` is compiled
// with the gathered weights freed and kept, and the one chooseReshard prefers is taken.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/ModelCost.h"
#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/InitAll.h"
#include "bonsai/Pipelines/Pipelines.h"
#include "bonsai/Target/PlanEmitter.h"
#include "bonsai/Target/TargetProfile.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

#include <chrono>

using namespace mlir;
using namespace mlir::bonsai;

/// Bonsai's own flags: with the few MLIR flags below, the only ones --help lists.
static llvm::cl::OptionCategory bonsaiCategory("Bonsai options");
/// MLIR's pass-manager, timing and IR-printing flags most useful on a compile; the rest of
/// MLIR's and all of LLVM's stay hidden (--help-hidden lists them).
static llvm::cl::OptionCategory mlirCategory("MLIR options (all of them: --help-hidden)");

static llvm::cl::opt<std::string> modelFile(llvm::cl::Positional, llvm::cl::Required,
                                            llvm::cl::desc("<model.mlir>"),
                                            llvm::cl::cat(bonsaiCategory));
static llvm::cl::opt<std::string> recipeFile(llvm::cl::Positional, llvm::cl::Optional,
                                             llvm::cl::desc("[recipe.mlir]"),
                                             llvm::cl::cat(bonsaiCategory));
static llvm::cl::opt<std::string> outputFile("o", llvm::cl::desc("Plan file to write"),
                                             llvm::cl::value_desc("step.plan"),
                                             llvm::cl::cat(bonsaiCategory));
static llvm::cl::opt<std::string>
    targetOption("target",
                 llvm::cl::desc("a100, a10g, rtx4090, l40s, h100, h200, sm_XX or cpu (default: the "
                                "recipe's bonsai.target, else cpu); see docs/targets.md"),
                 llvm::cl::cat(bonsaiCategory));
static llvm::cl::opt<std::string>
    memoryOption("device-memory",
                 llvm::cl::desc("Per-device budget, e.g. 24GiB, 512MiB or bytes (default: the "
                                "recipe's, else none)"),
                 llvm::cl::cat(bonsaiCategory));
static llvm::cl::opt<std::string> hostMemoryOption(
    "host-memory",
    llvm::cl::desc("Pinned host memory each process may hold (offloaded state and activations), "
                   "e.g. 64GiB (default: the recipe's, else none)"),
    llvm::cl::cat(bonsaiCategory));

static llvm::cl::opt<double> rematTimeLimitOption(
    "remat-time-limit",
    llvm::cl::desc("Seconds the search of bonsai.remat \"auto\" may take; past them it uses the "
                   "cheapest set it has planned that fits, with a remark (default 60; 0: no "
                   "limit)"),
    llvm::cl::init(60), llvm::cl::cat(bonsaiCategory));

static llvm::cl::opt<bool>
    fuseOption("fuse",
               llvm::cl::desc("Fuse chains of ops into single kernels (default true; "
                              "--fuse=false compiles every op as its own kernel)"),
               llvm::cl::init(true), llvm::cl::cat(bonsaiCategory));
static llvm::cl::opt<bool> overlapCopiesOption(
    "overlap-copies",
    llvm::cl::desc("Issue the host-offload copies on copy streams, one update ahead, beside the "
                   "compute (default true; --overlap-copies=false keeps them in order on the "
                   "compute stream; docs/offload.md)"),
    llvm::cl::init(true), llvm::cl::cat(bonsaiCategory));
static llvm::cl::opt<unsigned> prefetchDistanceOption(
    "gathers-ahead",
    llvm::cl::desc("How many all-gathers ahead of its reader each is issued on the collectives "
                   "stream (default 0: the distance whose predicted step on the target "
                   "profile is shortest within the device budget, one ahead where the target "
                   "has no rates; docs/sharding.md)"),
    llvm::cl::init(0), llvm::cl::cat(bonsaiCategory));
static llvm::cl::opt<double> hostUpdateRateOption(
    "host-update-rate",
    llvm::cl::desc("The host's optimizer rate in G parameters/s, which bonsai.offload's update "
                   "\"auto\" weighs against the link (default: the target profile's; "
                   "docs/offload.md)"),
    llvm::cl::init(0), llvm::cl::cat(bonsaiCategory));
static llvm::cl::opt<bool> fitOffloadOption(
    "fit-offload",
    llvm::cl::desc("When a training step does not fit the budget and its recipe has no "
                   "bonsai.offload, offload optimizer state (then master weights, then run the "
                   "updates on the host) until it fits, and say which (default true; "
                   "docs/offload.md)"),
    llvm::cl::init(true), llvm::cl::cat(bonsaiCategory));
static llvm::cl::list<std::string>
    fuseDisableOption("fuse-disable",
                      llvm::cl::desc("Fusion families to leave out, e.g. "
                                     "--fuse-disable=linear-cross-entropy,residual-norm "
                                     "(names as in docs/fusion.md)"),
                      llvm::cl::CommaSeparated, llvm::cl::cat(bonsaiCategory));

/// Parses "24GiB", "1.5 GiB", "512MiB", "80GB", "1000" (bytes).
static std::optional<int64_t> parseBytes(StringRef text) {
  text = text.trim();
  size_t digits = text.find_first_not_of("0123456789.");
  StringRef number = text.take_front(digits), unit = text.drop_front(number.size()).trim();
  double value;
  if (number.empty() || number.getAsDouble(value) || value < 0)
    return std::nullopt;
  double scale = llvm::StringSwitch<double>(unit.lower())
                     .Cases({"", "b"}, 1)
                     .Cases({"kib", "k"}, 1024.0)
                     .Cases({"mib", "m"}, 1024.0 * 1024)
                     .Cases({"gib", "g"}, 1024.0 * 1024 * 1024)
                     .Case("kb", 1e3)
                     .Case("mb", 1e6)
                     .Case("gb", 1e9)
                     .Default(-1);
  if (scale < 0)
    return std::nullopt;
  return int64_t(value * scale);
}

/// Moves the ops of `from` into `into` (a recipe file into the model's module).
static void appendModule(ModuleOp into, ModuleOp from) {
  Block &dest = *into.getBody();
  for (Operation &op : llvm::make_early_inc_range(*from.getBody()))
    op.moveBefore(&dest, dest.end());
}

/// Recipe directives this compiler carries out. The rest are verified but would be ignored,
/// so they are refused rather than silently dropped.
static LogicalResult checkSupportedDirectives(ModuleOp module) {
  for (auto recipe : module.getOps<RecipeOp>())
    for (Operation &op : recipe.getBody().front()) {
      if (isa<TargetDirectiveOp, OptimizerDirectiveOp, RematDirectiveOp, LoraDirectiveOp,
              GaloreDirectiveOp, QuantizeDirectiveOp, FP8DirectiveOp, OffloadDirectiveOp,
              ShardDirectiveOp, RingDirectiveOp>(op))
        continue;
      return op.emitError() << "'" << op.getName()
                            << "' is not carried out by this version of bonsai-compile (the "
                               "pass that applies it is part of a later release); remove it "
                               "from the recipe";
    }
  return success();
}

/// One offload choice that bonsai-compile may add to a recipe to fit its budget.
struct OffloadChoice {
  SmallVector<StringRef> classes;
  /// Where the updates run: "" (streamed through the device), "host" or "auto".
  StringRef update;
  /// As the recipe would spell it.
  std::string directive() const {
    std::string text = "bonsai.offload [";
    for (auto [i, c] : llvm::enumerate(classes))
      text += (i ? ", \"" : "\"") + c.str() + "\"";
    return text + "]" + (update.empty() ? "" : " update \"" + update.str() + "\"");
  }
};

/// The choices, the least taken off the device first: the moments (streamed through the
/// GPU around each update), then the fp32 masters with them, then the updates themselves off
/// the streamed path. For a GPU whose profile has the rates `update "auto"` weighs, the split
/// comes before `update "host"` (measured faster on every model tried, docs/offload.md,
/// "Choosing per update"), which stays as the choice that needs the least device memory;
/// elsewhere only `update "host"`. Then the saved activations (bonsai-remat's third choice,
/// docs/remat.md), alone and with each of those: what the state cannot free, a long sequence's
/// activations can.
static SmallVector<OffloadChoice> offloadChoices(const TargetProfile &profile) {
  SmallVector<OffloadChoice> choices = {{{"optimizer_state"}, ""},
                                        {{"optimizer_state", "master_weights"}, ""}};
  for (SmallVector<StringRef> classes :
       {SmallVector<StringRef>{"optimizer_state", "master_weights"},
        SmallVector<StringRef>{"optimizer_state"}}) {
    if (profile.hasOffloadRates())
      choices.push_back({classes, "auto"});
    choices.push_back({classes, "host"});
  }
  SmallVector<OffloadChoice> withActivations = {{{"activations"}, ""}};
  for (OffloadChoice choice : choices) {
    choice.classes.push_back("activations");
    withActivations.push_back(choice);
  }
  llvm::append_range(choices, withActivations);
  return choices;
}

/// What one run of both pipelines made of a copy of the module.
struct Attempt {
  OwningOpRef<ModuleOp> module;
  std::vector<ModelCost> costs;
  /// Every diagnostic the attempt emitted, as the handler prints them.
  std::string diagnostics;
  bool succeeded = false;
};

/// Runs the model pipeline (whose result the cost report reads) and the step pipeline on a
/// copy of `source`, with `choice` added to its recipe when given and, given `reshard`, the
/// shard directive's reshard_after_forward set to it. Diagnostics are kept, not printed, so
/// that a failed attempt the caller retries leaves no error behind.
static Attempt compileAttempt(ModuleOp source, const PipelineOptions &options,
                              const OffloadChoice *choice, std::optional<bool> reshard,
                              llvm::SourceMgr &sourceMgr, TimingScope &timing) {
  Attempt attempt;
  attempt.module = source.clone();
  MLIRContext *context = source.getContext();
  llvm::raw_string_ostream os(attempt.diagnostics);
  SourceMgrDiagnosticHandler handler(sourceMgr, context, os);
  if (reshard)
    for (auto recipe : attempt.module->getOps<RecipeOp>())
      for (auto shard : recipe.getBody().getOps<ShardDirectiveOp>())
        shard.setReshardAfterForwardAttr(BoolAttr::get(context, *reshard));
  if (choice) {
    for (auto recipe : attempt.module->getOps<RecipeOp>()) {
      OpBuilder builder = OpBuilder::atBlockEnd(&recipe.getBody().front());
      OffloadDirectiveOp::create(builder, recipe.getLoc(), builder.getStrArrayAttr(choice->classes),
                                 choice->update.empty() ? nullptr
                                                        : builder.getStringAttr(choice->update));
      break;
    }
  }
  // One of the two pipelines over the attempt's module, timed under `name`.
  auto runPipeline = [&](StringRef name, void (*build)(OpPassManager &, const PipelineOptions &)) {
    PassManager pm(context);
    if (failed(applyPassManagerCLOptions(pm)))
      return false;
    TimingScope scope = timing.nest(name);
    pm.enableTiming(scope);
    build(pm, options);
    return succeeded(pm.run(*attempt.module));
  };
  if (!runPipeline("model pipeline", buildModelPipeline))
    return attempt;
  for (auto function : attempt.module->getOps<FunctionOpInterface>())
    if (!function.isExternal() && !function.getFunctionBody().getOps<ParamOp>().empty())
      attempt.costs.push_back(computeModelCost(function));
  attempt.succeeded = runPipeline("step pipeline", buildStepPipeline);
  return attempt;
}

/// The first error of an attempt's diagnostics, without its location: why it does not serve.
static std::string firstError(const Attempt &attempt) {
  SmallVector<StringRef> lines;
  StringRef(attempt.diagnostics).split(lines, '\n');
  for (StringRef line : lines)
    if (size_t at = line.find("error: "); at != StringRef::npos)
      return line.drop_front(at).trim().str();
  return "failed";
}

/// A successful attempt's predicted step seconds (none without the target's rates) and its
/// planned device peak.
static std::pair<std::optional<double>, int64_t> stepFigures(Attempt &attempt) {
  for (auto step : attempt.module->getOps<plan::StepOp>()) {
    std::optional<double> seconds;
    if (auto predicted = step->getAttrOfType<FloatAttr>("bonsai.predicted_step_seconds"))
      seconds = predicted.getValueAsDouble();
    return {seconds, summarizePlanMemory(step).peakDevice};
  }
  return {std::nullopt, 0};
}

/// A recipe's `reshard_after_forward "auto"`: compiles the step with the gathered weights
/// freed after the forward pass and kept to the backward pass, and takes the kept one where
/// it compiles (fits the budget) and its predicted step is shorter by more than the
/// simulation's error; else the freed one, which needs less memory. Prints which and why;
/// returns the choice (true: reshard) and its attempt.
static std::pair<bool, Attempt> chooseReshard(ModuleOp source, const PipelineOptions &options,
                                              llvm::SourceMgr &sourceMgr, TimingScope &timing) {
  constexpr double kWorthwhile = 0.005;
  llvm::errs() << "bonsai-compile: reshard_after_forward \"auto\": compiling the step with the "
                  "gathered weights freed after the forward pass, then kept to the backward "
                  "pass\n";
  Attempt freed = compileAttempt(source, options, nullptr, true, sourceMgr, timing);
  Attempt kept = compileAttempt(source, options, nullptr, false, sourceMgr, timing);
  std::string why;
  llvm::raw_string_ostream os(why);
  bool keep = false;
  if (!kept.succeeded) {
    os << "keeping them does not compile: " << firstError(kept);
  } else if (!freed.succeeded) {
    keep = true;
    os << "freeing them does not compile: " << firstError(freed);
  } else {
    auto [freedSeconds, freedPeak] = stepFigures(freed);
    auto [keptSeconds, keptPeak] = stepFigures(kept);
    if (!freedSeconds || !keptSeconds) {
      os << "no step time on this target to weigh the second all-gather by (a profile with "
            "rates, e.g. --target=h100, has one); freeing needs "
         << formatBytes(freedPeak) << " against " << formatBytes(keptPeak);
    } else {
      keep = *keptSeconds < *freedSeconds * (1 - kWorthwhile);
      os << "predicted step " << llvm::format("%.2f", *keptSeconds * 1e3) << " ms kept against "
         << llvm::format("%.2f", *freedSeconds * 1e3) << " ms freed, peak " << formatBytes(keptPeak)
         << " against " << formatBytes(freedPeak) << "; ";
      if (keep)
        os << "the link does not hide the second all-gather";
      else
        os << "keeping saves less than " << llvm::format("%.1f", kWorthwhile * 100)
           << "% of the step";
    }
  }
  llvm::errs() << "bonsai-compile: reshard_after_forward \"auto\": "
               << (keep ? "false, the gathered weights kept to the backward pass"
                        : "true, the gathered weights freed after the forward pass")
               << " (" << why << ")\n";
  return {!keep, std::move(keep ? kept : freed)};
}

/// Registers MLIR's pass-manager, timing, context and IR-printing flags, and hides every flag
/// that is neither Bonsai's nor one of the MLIR flags worth listing. The LLVM backends linked in
/// register some 350 flags (AMDGPU, ARM, NVPTX, ...) that mean nothing to a Bonsai user; they are
/// made Hidden, not ReallyHidden as cl::HideUnrelatedOptions would, so --help-hidden still
/// lists them.
static void registerCommandLineOptions() {
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();
  registerAsmPrinterCLOptions();
  registerMLIRContextCLOptions();

  static constexpr llvm::StringLiteral listedMlirOptions[] = {
      "mlir-print-ir-before-all",   "mlir-print-ir-after-all",
      "mlir-print-ir-after-change", "mlir-print-ir-after-failure",
      "mlir-print-ir-tree-dir",     "mlir-print-debuginfo",
      "mlir-print-op-generic",      "mlir-timing",
      "mlir-pass-statistics",       "mlir-elide-elementsattrs-if-larger",
      "mlir-disable-threading"};
  for (auto &entry : llvm::cl::getRegisteredOptions()) {
    llvm::cl::Option *option = entry.second;
    if (llvm::is_contained(listedMlirOptions, entry.first)) {
      option->addCategory(mlirCategory);
      option->setHiddenFlag(llvm::cl::NotHidden); // some are registered Hidden
      continue;
    }
    // --help, --version and the other flags of LLVM's "Generic Options" stay listed.
    bool listed = llvm::any_of(option->Categories, [](const llvm::cl::OptionCategory *category) {
      return category == &bonsaiCategory || category->getName() == "Generic Options";
    });
    if (!listed && option->getOptionHiddenFlag() == llvm::cl::NotHidden)
      option->setHiddenFlag(llvm::cl::Hidden);
  }
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  registerCommandLineOptions();
  llvm::cl::ParseCommandLineOptions(argc, argv,
                                    "Bonsai compiler: model (+ recipe) -> step plan\n");
  auto start = std::chrono::steady_clock::now();

  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  // A failing pass would otherwise print the whole step (thousands of lines for a 7B model)
  // under its error.
  context.printOpOnDiagnostic(false);

  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context);
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(modelFile, sourceMgr, &context);
  if (!module)
    return 1;
  if (!recipeFile.empty()) {
    // A SourceMgr parses one main buffer; the diagnostic handler opens the recipe file itself
    // when an error points into it.
    llvm::SourceMgr recipeSourceMgr;
    OwningOpRef<ModuleOp> recipe =
        parseSourceFile<ModuleOp>(recipeFile, recipeSourceMgr, &context);
    if (!recipe)
      return 1;
    appendModule(*module, *recipe);
    if (failed(verify(*module)))
      return 1;
  }
  if (failed(checkSupportedDirectives(*module)))
    return 1;

  // Target and budget: the command line, else the recipe, else the CPU with no budget.
  PipelineOptions options;
  options.target = "cpu";
  for (auto recipe : module->getOps<RecipeOp>()) {
    for (auto target : recipe.getBody().getOps<TargetDirectiveOp>()) {
      options.target = target.getArch().str();
      if (IntegerAttr mib = target.getDeviceMemoryMibAttr())
        options.deviceMemory = mib.getInt() * 1024 * 1024;
      if (IntegerAttr mib = target.getHostMemoryMibAttr())
        options.hostMemory = mib.getInt() * 1024 * 1024;
    }
    // An optimizer directive makes this a training step.
    for (auto optimizer : recipe.getBody().getOps<OptimizerDirectiveOp>()) {
      options.train = true;
      options.microBatches = optimizer.getMicroBatchesAttr().getInt();
    }
    for (auto remat : recipe.getBody().getOps<RematDirectiveOp>())
      options.remat = remat.getPolicy().str();
  }
  // Recomputation trades backward work for memory: without a backward pass it cannot apply.
  if (!options.train && !options.remat.empty() && options.remat != "none") {
    for (auto recipe : module->getOps<RecipeOp>())
      for (auto remat : recipe.getBody().getOps<RematDirectiveOp>())
        remat.emitError() << "policy '" << remat.getPolicy()
                          << "' recomputes activations in the backward pass, but the recipe "
                             "has no bonsai.optimizer, so the step has none";
    return 1;
  }
  if (rematTimeLimitOption < 0) {
    llvm::errs() << "bonsai-compile: error: --remat-time-limit must be 0 (no limit) or a "
                    "number of seconds, not "
                 << rematTimeLimitOption << "\n";
    return 1;
  }
  options.rematTimeLimit = rematTimeLimitOption;
  if (hostUpdateRateOption < 0) {
    llvm::errs() << "bonsai-compile: error: --host-update-rate must be a positive number of G "
                    "parameters per second (0: the target profile's), not "
                 << hostUpdateRateOption << "\n";
    return 1;
  }
  options.hostUpdateRate = hostUpdateRateOption;
  options.fuse = fuseOption;
  options.overlapCopies = overlapCopiesOption;
  options.prefetchDistance = prefetchDistanceOption;
  options.fuseDisable = llvm::to_vector(fuseDisableOption);
  if (!targetOption.empty())
    options.target = targetOption;
  std::optional<TargetProfile> profile = lookupTargetProfile(options.target);
  if (!profile) {
    llvm::errs() << "bonsai-compile: error: unknown target '" << options.target
                 << "'; expected one of";
    for (const TargetProfile &named : getNamedTargetProfiles())
      llvm::errs() << " " << named.name;
    llvm::errs() << " or sm_XX\n";
    return 1;
  }
  // The plan records the architecture; a named GPU's memory is the budget unless one is given,
  // and its rates are what the offload pass's cost model weighs.
  options.target = profile->arch;
  options.profile = profile->name;
  if (!options.deviceMemory && profile->memoryBytes)
    options.deviceMemory = profile->memoryBytes;
  if (!memoryOption.empty()) {
    std::optional<int64_t> bytes = parseBytes(memoryOption);
    if (!bytes) {
      llvm::errs() << "bonsai-compile: error: --device-memory='" << memoryOption
                   << "' is not a size (examples: 24GiB, 512MiB, 1000000)\n";
      return 1;
    }
    options.deviceMemory = *bytes;
  }
  if (!hostMemoryOption.empty()) {
    std::optional<int64_t> bytes = parseBytes(hostMemoryOption);
    if (!bytes || *bytes <= 0) {
      llvm::errs() << "bonsai-compile: error: --host-memory='" << hostMemoryOption
                   << "' is not a positive size (examples: 64GiB, 512MiB, 1000000)\n";
      return 1;
    }
    options.hostMemory = *bytes;
  }

  // One timing report (--mlir-timing) for both pipelines and the plan's emission, printed when
  // `timing` goes out of scope at the end of main.
  DefaultTimingManager timing;
  applyDefaultTimingManagerCLOptions(timing);
  TimingScope rootTiming = timing.getRootScope();

  // The cost report comes from the model as the recipe rewrote it (adapters, NF4 weights),
  // before it is lowered.
  // A recipe that leaves reshard_after_forward to the compiler is compiled both ways.
  std::optional<bool> reshard;
  Attempt attempt;
  bool choosesReshard = false;
  for (auto recipe : module->getOps<RecipeOp>())
    for (auto shard : recipe.getBody().getOps<ShardDirectiveOp>())
      choosesReshard |= shard.choosesReshard();
  if (choosesReshard) {
    auto [chosen, chosenAttempt] = chooseReshard(*module, options, sourceMgr, rootTiming);
    reshard = chosen;
    attempt = std::move(chosenAttempt);
  } else {
    attempt = compileAttempt(*module, options, nullptr, std::nullopt, sourceMgr, rootTiming);
  }
  // Over the budget, a training step whose recipe leaves offload out tries the offload
  // choices; the first that fits is the plan.
  std::optional<OffloadChoice> fitted;
  bool offloadInRecipe = false;
  for (auto recipe : module->getOps<RecipeOp>())
    offloadInRecipe |= !recipe.getBody().getOps<OffloadDirectiveOp>().empty();
  if (!attempt.succeeded && fitOffloadOption && options.train && !offloadInRecipe &&
      isOverBudgetError(attempt.diagnostics)) {
    llvm::errs() << "bonsai-compile: the step does not fit the budget of "
                 << formatBytes(options.deviceMemory)
                 << " as the recipe is; trying offload to pinned host memory "
                    "(--fit-offload=false: no)\n";
    std::string tried;
    for (const OffloadChoice &choice : offloadChoices(*profile)) {
      llvm::errs() << "bonsai-compile:   with " << choice.directive() << "\n";
      Attempt retry = compileAttempt(*module, options, &choice, reshard, sourceMgr, rootTiming);
      if (retry.succeeded) {
        attempt = std::move(retry);
        fitted = choice;
        break;
      }
      // Each choice's first error says why it does not serve (remarks may come before it).
      tried += "  " + choice.directive() + ": " + firstError(retry) + "\n";
    }
    if (!fitted) {
      llvm::errs() << attempt.diagnostics;
      llvm::errs() << "bonsai-compile: error: no offload choice fits the budget either:\n"
                   << tried;
      return 1;
    }
  }
  llvm::errs() << attempt.diagnostics;
  if (!attempt.succeeded)
    return 1;
  module = std::move(attempt.module);
  std::vector<ModelCost> costs = std::move(attempt.costs);

  auto steps = llvm::to_vector(module->getOps<plan::StepOp>());
  if (steps.size() != 1) {
    llvm::errs() << "bonsai-compile: error: expected one model function, found "
                 << steps.size() << "\n";
    return 1;
  }
  std::string bytes;
  TimingScope emitTiming = rootTiming.nest("emit plan");
  PlanTargetInfo targetInfo;
  targetInfo.linkGBs = profile->linkBandwidthGBs;
  if (failed(emitPlan(steps.front(), bytes, targetInfo)))
    return 1;
  emitTiming.stop();

  std::string output = outputFile;
  if (output.empty()) {
    SmallString<128> path(modelFile.getValue());
    llvm::sys::path::replace_extension(path, "plan");
    output = std::string(llvm::sys::path::filename(path));
  }
  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> file = openOutputFile(output, &error);
  if (!file) {
    llvm::errs() << "bonsai-compile: error: " << error << "\n";
    return 1;
  }
  file->os() << bytes;
  file->keep();

  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  plan::StepOp step = steps.front();
  size_t kernels = llvm::range_size(step.getBody().getOps<plan::LaunchOp>());
  llvm::outs() << "bonsai-compile: " << modelFile << " -> " << output << " (target "
               << step.getTarget() << ", " << kernels << " kernels, " << bytes.size()
               << " bytes, " << llvm::format("%.2f", seconds) << " s)\n";
  for (const ModelCost &cost : costs)
    cost.print(llvm::outs(), /*perLayer=*/false);
  if (fitted)
    llvm::outs() << "  fitted to the budget by " << fitted->directive()
                 << " (add it to the recipe to keep it; docs/offload.md)\n";
  // A sharded step's plan is each rank's (bonsai-shard): so are its bytes.
  // A ring's rank holds its share of the sequence (bonsai-ring): so are its activations.
  if (auto ranks = step->getAttrOfType<IntegerAttr>("bonsai.ranks")) {
    auto strategy = step->getAttrOfType<StringAttr>("bonsai.shard_strategy");
    auto ring = step->getAttrOfType<IntegerAttr>("bonsai.ring_ranks");
    llvm::outs() << "  planned memory per rank ("
                 << (strategy ? strategy.getValue() : StringRef("the sequence split by a ring"))
                 << " over " << ranks.getInt() << " ranks";
    if (ring && strategy)
      llvm::outs() << ", a ring of " << ring.getInt();
    llvm::outs() << "; every rank runs this plan):\n";
  } else {
    llvm::outs() << "  planned memory:\n";
  }
  summarizePlanMemory(step).print(llvm::outs(), step.getDeviceMemoryAttr().getInt(),
                                  profile->linkBandwidthGBs, step.getHostMemoryAttr().getInt());
  // What each rank's link carries: the profile's link is the host's (PCIe), a floor for
  // NVLink machines, as in the step-time prediction.
  if (PlanCollectiveSummary collectives = summarizePlanCollectives(step); !collectives.empty())
    collectives.print(llvm::outs(), profile->linkBandwidthGBs);
  if (auto predicted = step->getAttrOfType<FloatAttr>("bonsai.predicted_step_seconds")) {
    auto exposed = step->getAttrOfType<FloatAttr>("bonsai.predicted_exposed_seconds");
    llvm::outs() << "  predicted step on " << profile->name << ": "
                 << llvm::format("%.4g ms", predicted.getValueAsDouble() * 1e3);
    if (exposed && exposed.getValueAsDouble() > 0)
      llvm::outs() << " (" << llvm::format("%.4g ms", exposed.getValueAsDouble() * 1e3)
                   << " of it the offload's exposed transfers and host steps)";
    if (auto host = step->getAttrOfType<FloatAttr>("bonsai.predicted_host_seconds"))
      llvm::outs() << "; host steps " << llvm::format("%.4g ms", host.getValueAsDouble() * 1e3);
    llvm::outs() << "\n";
  }
  return 0;
}
