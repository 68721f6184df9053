//===- Fp8.cpp - Run the recipe's linears as FP8 GEMMs ---------------------===//
//
// The `bonsai-fp8` pass (see Passes.td and docs/fp8.md). It runs after bonsai-optimizer and
// rewrites, on a target with FP8 tensor cores, each linear the recipe's `bonsai.fp8` targets
// together with its two backward GEMMs into FP8 GEMMs that share one piece of scaling state,
// and adds the once-per-step update of that state to the update phase. On any other target it
// changes nothing and says so.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Dialect/Bonsai/IR/ModelSummary.h"
#include "bonsai/Target/TargetProfile.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIFP8PASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// The value `value` is a view or conversion of: follows views and single-operand casts back
/// to the tensor they read (GPT-2's transposed weights, a reshaped LM head output).
Value getViewedValue(Value value) {
  while (Operation *def = value.getDefiningOp()) {
    if (auto view = dyn_cast<ViewLikeOpInterface>(def))
      value = view.getViewSource();
    else if (auto cast = dyn_cast<CastOp>(def))
      value = cast.getInput();
    else
      break;
  }
  return value;
}

/// The linears `targets []` means: every linear of the model's own weights except the LM head
/// (a linear whose result is, through views and casts, the logits of a cross-entropy) and a
/// linear whose weight an embedding also reads (a tied embedding: its rows are looked up, not
/// multiplied, and its range is the vocabulary's). Those two are where FP8's precision costs
/// the most for the least GEMM time, as Transformer Engine's and torchao's recipes also leave
/// them. Adapters a pass added (LoRA's A and B) are not the model's: rank-r GEMMs gain nothing
/// from FP8, as target patterns never mean them either.
SmallVector<const LinearSummary *> getDefaultTargets(const ModelSummary &model) {
  llvm::SmallPtrSet<Operation *, 4> lmHeads, embedded;
  model.getFunction()->walk([&](Operation *op) {
    if (auto loss = dyn_cast<CrossEntropyOp>(op))
      if (Operation *def = getViewedValue(loss.getLogits()).getDefiningOp())
        lmHeads.insert(def);
    if (auto embedding = dyn_cast<EmbeddingOp>(op))
      if (Operation *def = getViewedValue(embedding.getTable()).getDefiningOp())
        embedded.insert(def);
  });
  SmallVector<const LinearSummary *> targets;
  for (const LinearSummary &linear : model.getLinears())
    if (isa<LinearOp>(linear.op) && !linear.weight->addedByPass &&
        !lmHeads.contains(linear.op) && !embedded.contains(linear.weight->op))
      targets.push_back(&linear);
  return targets;
}

/// A linear and the backward GEMMs that go with it.
struct LinearGroup {
  LinearOp linear;
  const ParamSummary *weight = nullptr;
  LinearGradInputOp gradInput;   ///< null when x needs no gradient
  LinearGradWeightOp gradWeight; ///< null when W needs no gradient
};

/// "f32", "bf16": the element type of a tensor, for remarks.
std::string elementName(Value value) {
  std::string name;
  llvm::raw_string_ostream os(name);
  os << cast<RankedTensorType>(value.getType()).getElementType();
  return name;
}

struct Fp8Pass : impl::BonsaiFp8PassBase<Fp8Pass> {
  using Base::Base;

  /// The linear with its backward, or the reason it cannot run in FP8.
  FailureOr<LinearGroup> match(const LinearSummary &summary, const ModelSummary &model,
                               std::string &reason) {
    llvm::raw_string_ostream why(reason);
    auto linear = cast<LinearOp>(summary.op);
    auto x = cast<RankedTensorType>(linear.getInput().getType());
    auto w = cast<RankedTensorType>(linear.getWeight().getType());
    Type element = x.getElementType();
    if (!isa<Float32Type, BFloat16Type, Float16Type>(element)) {
      why << "its element type is " << element << "; FP8 casts read f32, bf16 or f16";
      return failure();
    }
    int64_t k = w.getDimSize(1), n = w.getDimSize(0), m = getNumElements(x) / k;
    int64_t multiple = Fp8LinearOp::kDimensionMultiple;
    for (auto [name, value] : {std::pair<StringRef, int64_t>{"M (positions)", m},
                               {"N (output features)", n},
                               {"K (input features)", k}})
      if (value % multiple != 0) {
        why << name << " is " << value << ", not a multiple of " << multiple
            << " as FP8 tensor cores need";
        return failure();
      }
    // One piece of state per weight: a weight two linears read (tied) would mix the amaxes
    // of two inputs and two output gradients in one history.
    int64_t sharing = llvm::count_if(model.getLinears(), [&](const LinearSummary &other) {
      return other.weight == summary.weight;
    });
    if (sharing > 1) {
      why << "its weight is read by " << sharing
          << " linears (tied), and the scaling state is per linear";
      return failure();
    }

    LinearGroup group{linear, summary.weight, {}, {}};
    Value weight = linear.getWeight(), input = linear.getInput();
    SmallVector<LinearGradInputOp> gradInputs;
    for (Operation *user : weight.getUsers())
      if (auto gi = dyn_cast<LinearGradInputOp>(user); gi && gi.getType() == x)
        gradInputs.push_back(gi);
    // A frozen weight has no gradient: a linear_grad_weight reading x is another linear's.
    SmallVector<LinearGradWeightOp> gradWeights;
    if (summary.weight->trainable)
      for (Operation *user : input.getUsers())
        if (auto gw = dyn_cast<LinearGradWeightOp>(user);
            gw && gw.getInput() == input && gw.getType() == w)
          gradWeights.push_back(gw);
    if (gradInputs.size() > 1) {
      why << "its weight has " << gradInputs.size()
          << " linear_grad_input ops, so its backward cannot be told apart";
      return failure();
    }
    if (gradInputs.size() == 1) {
      group.gradInput = gradInputs.front();
      Value dy = group.gradInput.getResultGrad();
      llvm::erase_if(gradWeights,
                     [&](LinearGradWeightOp gw) { return gw.getResultGrad() != dy; });
      if (dy.getType() != linear.getType()) {
        why << "its linear_grad_input reads a gradient of type " << dy.getType()
            << ", not the linear's " << linear.getType();
        return failure();
      }
    }
    if (gradWeights.size() > 1) {
      why << gradWeights.size() << " linear_grad_weight ops of its weight's type read its input"
          << (group.gradInput ? " with its output gradient" : " and the input needs no gradient")
          << ", so its weight gradient cannot be told apart";
      return failure();
    }
    if (!gradWeights.empty()) {
      group.gradWeight = gradWeights.front();
      if (group.gradWeight.getResultGrad().getType() != linear.getType()) {
        why << "its linear_grad_weight reads a gradient of type "
            << group.gradWeight.getResultGrad().getType() << ", not the linear's "
            << linear.getType();
        return failure();
      }
    }
    return group;
  }

  /// Replaces `op` by `replacement` (same leading result), keeping the phase annotation.
  static void replaceGemm(Operation *op, Operation *replacement) {
    for (NamedAttribute attr : op->getDiscardableAttrs())
      replacement->setAttr(attr.getName(), attr.getValue());
    op->getResult(0).replaceAllUsesWith(replacement->getResult(0));
    op->erase();
  }

  /// Rewrites one group; returns the state's bytes.
  int64_t rewrite(LinearGroup &group, StepIncrementOp increment, FP8DirectiveOp directive) {
    MLIRContext *ctx = &getContext();
    OpBuilder builder(ctx);
    Type f32 = Float32Type::get(ctx);
    int64_t history = directive.getAmaxHistory();
    auto stateType =
        RankedTensorType::get({Fp8LinearOp::kStateRows, Fp8LinearOp::kStateColumns + history},
                              f32);
    auto statsType =
        RankedTensorType::get({Fp8LinearOp::kStatsRows, Fp8LinearOp::kStatsColumns}, f32);
    auto workspaceType = [&](Value a, Value b) {
      int64_t elements = Fp8LinearOp::getWorkspaceElements(
          getNumElements(cast<ShapedType>(a.getType())),
          getNumElements(cast<ShapedType>(b.getType())));
      return RankedTensorType::get({elements}, f32);
    };
    BoolAttr current = builder.getBoolAttr(directive.getScaling() == "current");
    IntegerAttr margin = builder.getI64IntegerAttr(directive.getMargin());

    // The state sits with its parameter: it must dominate the forward GEMM, and it reads as
    // part of the weight it scales.
    Operation *param = group.weight->op;
    builder.setInsertionPointAfter(param);
    Value state = StateOp::create(builder, param->getLoc(), stateType, StateKind::Optimizer,
                                  (group.weight->name + ".fp8").str(), StringAttr())
                      .getResult();

    LinearOp linear = group.linear;
    builder.setInsertionPoint(linear);
    Value x = linear.getInput(), w = linear.getWeight();
    // Only the forward GEMM may keep its sum in the tensor cores' accumulator, when the recipe
    // asks: the gradients' GEMMs always promote their partial sums to fp32 (as Transformer
    // Engine and torchao run them, docs/fp8.md).
    BoolAttr fastAccumulation = builder.getBoolAttr(directive.getForwardAccumulation() == "fast");
    auto forward = Fp8LinearOp::create(builder, linear.getLoc(), linear.getType(), statsType,
                                       workspaceType(x, w), x, w, state, linear.getBias(), current,
                                       margin, fastAccumulation);
    replaceGemm(linear, forward);

    Value backwardStats;
    if (LinearGradInputOp gi = group.gradInput) {
      builder.setInsertionPoint(gi);
      Value dy = gi.getResultGrad();
      auto fp8 = Fp8LinearGradInputOp::create(builder, gi.getLoc(), gi.getType(), statsType,
                                              workspaceType(dy, w), dy, w, state, current,
                                              margin);
      backwardStats = fp8.getStats();
      replaceGemm(gi, fp8);
    }
    if (LinearGradWeightOp gw = group.gradWeight) {
      builder.setInsertionPoint(gw);
      Value dy = gw.getResultGrad();
      auto fp8 = Fp8LinearGradWeightOp::create(builder, gw.getLoc(), gw.getType(), statsType,
                                               workspaceType(dy, x), dy, x, state, current,
                                               margin);
      // The output gradient's row comes from grad_input's cast when there is one (the same
      // dy, cast the same way); grad_weight's otherwise.
      if (!backwardStats)
        backwardStats = fp8.getStats();
      replaceGemm(gw, fp8);
    }

    // Before the increment: the history entry of this step is step % H.
    builder.setInsertionPoint(increment);
    auto update = Fp8UpdateScalesOp::create(builder, forward.getLoc(), increment.getStep(),
                                            forward.getStats(), backwardStats, state, current,
                                            margin);
    update->setAttr(BonsaiDialect::getPhaseAttrName(), builder.getStringAttr("update"));
    StringRef weight = group.weight->name;
    Operation *declared = foldOverMicroBatches(update.getForwardStatsMutable(), "forward_stats",
                                               state.getDefiningOp(), weight, update);
    if (backwardStats)
      foldOverMicroBatches(update.getBackwardStatsMutable()[0], "backward_stats", declared, weight,
                           update);
    return getNumElements(stateType) * 4;
  }

  /// The update reads the step's statistics rather than its last micro-batch's: each
  /// micro-batch's are folded into an accumulator (`<weight>.fp8.<name>`, the largest amax,
  /// underflow and saturation so far) that the update phase clears after the update. The amax
  /// history then records the step's largest value however many micro-batches the step is
  /// run in (bonsai-run --micro-batches), as one micro-batch of all its tokens would; and a
  /// sharded step, whose ranks' statistics bonsai-shard all-reduces the same way, is the
  /// one-rank step over every rank's micro-batches bit for bit. With one micro-batch the
  /// fold changes no bit: the statistics are never negative.
  /// The accumulator is declared after `declareAfter` (the scaling state, then the forward
  /// statistics' accumulator); returns its declaration.
  Operation *foldOverMicroBatches(OpOperand &statistics, StringRef name, Operation *declareAfter,
                                  StringRef weight, Fp8UpdateScalesOp update) {
    OpBuilder builder(declareAfter->getContext());
    Value stats = statistics.get();
    builder.setInsertionPointAfter(declareAfter);
    auto accumulator =
        StateOp::create(builder, declareAfter->getLoc(), stats.getType(), StateKind::Gradient,
                        (weight + ".fp8." + name).str(), StringAttr());
    // After the producer's results are read in its phase (a weight gradient's accumulation):
    // the gemm-epilogue fusion, which puts the GEMM where the accumulation is, needs the
    // statistics' readers after it.
    Operation *producer = stats.getDefiningOp();
    Operation *after = producer;
    Attribute phase = producer->getAttr(BonsaiDialect::getPhaseAttrName());
    for (Value result : producer->getResults())
      for (Operation *user : result.getUsers())
        if (user->getBlock() == after->getBlock() &&
            user->getAttr(BonsaiDialect::getPhaseAttrName()) == phase &&
            after->isBeforeInBlock(user))
          after = user;
    builder.setInsertionPointAfter(after);
    auto fold =
        AccumulateMaxOp::create(builder, producer->getLoc(), stats, accumulator.getResult());
    if (phase)
      fold->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
    statistics.set(accumulator.getResult());
    builder.setInsertionPointAfter(update);
    auto clear = ZeroOp::create(builder, update.getLoc(), accumulator.getResult());
    clear->setAttr(BonsaiDialect::getPhaseAttrName(), builder.getStringAttr("update"));
    return accumulator;
  }

  LogicalResult run(func::FuncOp function, FP8DirectiveOp directive,
                    const TargetProfile &profile) {
    ModelSummary model(function);
    SmallVector<StringRef> patterns = directive.getTargetPatterns();
    SmallVector<const LinearSummary *> targets =
        patterns.empty() ? getDefaultTargets(model) : model.matchLinears(patterns);
    // Linears already in FP8 (the pass run twice) are not targets again, and adapters a pass
    // added (LoRA's A and B, `bonsai.init`) are never what a recipe's patterns mean.
    llvm::erase_if(targets, [](const LinearSummary *l) {
      return !isa<LinearOp>(l->op) || l->weight->addedByPass;
    });
    int64_t count = targets.size();
    std::string precision =
        targets.empty() ? std::string("their precision") : elementName(targets.front()->op->getResult(0));
    if (llvm::any_of(targets, [&](const LinearSummary *l) {
          return elementName(l->op->getResult(0)) != precision;
        }))
      precision = "their precision";

    if (!profile.fp8TensorCores) {
      std::string arch = profile.arch == "cpu" ? std::string("the CPU target") : profile.arch;
      emitRemark(directive.getLoc())
          << "bonsai.fp8: " << arch
          << " has no FP8 tensor cores (they need sm_89 or newer); the " << count
          << (count == 1 ? " targeted linear stays in " : " targeted linears stay in ")
          << precision;
      numKept += count;
      return success();
    }
    if (targets.empty()) {
      emitRemark(directive.getLoc()) << "bonsai-fp8: no linear of '" << function.getSymName()
                                     << "' to run in FP8";
      return success();
    }

    // The update phase the scale updates join: bonsai-optimizer's, ended by the increment of
    // the step counter whose value indexes the amax histories.
    StepIncrementOp increment;
    function.walk([&](StepIncrementOp op) { increment = op; });
    if (!increment)
      return directive.emitError()
             << "bonsai-fp8 updates its scales once per step, in the update phase, but '"
             << function.getSymName()
             << "' has no step counter: run bonsai-autodiff and bonsai-optimizer first (a "
                "training step; the recipe needs a bonsai.optimizer)";

    // Every target is matched before any is rewritten, so that a backward GEMM two linears
    // would claim (their weights' gradients read the same input) is seen as ambiguous rather
    // than taken by the first.
    SmallVector<std::pair<const LinearSummary *, FailureOr<LinearGroup>>> matches;
    SmallVector<std::string> reasons(targets.size());
    llvm::DenseMap<Operation *, int64_t> claims;
    for (auto [i, summary] : llvm::enumerate(targets)) {
      matches.push_back({summary, match(*summary, model, reasons[i])});
      if (succeeded(matches.back().second))
        for (Operation *op : {matches.back().second->gradInput.getOperation(),
                              matches.back().second->gradWeight.getOperation()})
          if (op)
            ++claims[op];
    }

    int64_t converted = 0, kept = 0, stateBytes = 0;
    for (auto [i, entry] : llvm::enumerate(matches)) {
      auto &[summary, group] = entry;
      if (succeeded(group))
        for (Operation *op : {group->gradInput.getOperation(), group->gradWeight.getOperation()})
          if (op && claims.lookup(op) > 1) {
            reasons[i] = "its backward GEMM '" + op->getName().getStringRef().str() +
                         "' could be another targeted linear's, so its backward cannot be "
                         "told apart";
            group = failure();
            break;
          }
      if (failed(group)) {
        emitRemark(summary->op->getLoc())
            << "bonsai-fp8: '" << summary->weight->name << "' stays in "
            << elementName(summary->op->getResult(0)) << ": " << reasons[i];
        ++kept;
        continue;
      }
      Location loc = group->linear.getLoc();
      bool backward = group->gradInput || group->gradWeight;
      stateBytes += rewrite(*group, increment, directive);
      if (perLinearRemarks)
        emitRemark(loc) << "bonsai-fp8: '" << summary->weight->name << "' in FP8"
                        << (backward ? "" : " (forward only: no backward GEMM)")
                        << ", state '" << summary->weight->name << ".fp8'";
      ++converted;
    }
    numFp8 += converted;
    numKept += kept;
    bool current = directive.getScaling() == "current";
    InFlightDiagnostic summary = emitRemark(directive.getLoc());
    summary << "bonsai-fp8: " << converted << (converted == 1 ? " linear" : " linears")
            << " in FP8 on " << profile.arch << " (E4M3 forward, E5M2 gradients), "
            << (current ? "current scaling" : "delayed scaling") << " with an amax history of "
            << int64_t(directive.getAmaxHistory()) << ", margin " << int64_t(directive.getMargin())
            << ", " << directive.getForwardAccumulation() << " forward accumulation; state "
            << stateBytes << " bytes";
    if (kept)
      summary << "; " << kept
              << (kept == 1 ? " targeted linear stays as it was (see the remark on it)"
                            : " targeted linears stay as they were (see the remarks on them)");
    return success();
  }

  void runOnOperation() override {
    SmallVector<FP8DirectiveOp> directives;
    getOperation().walk([&](FP8DirectiveOp op) { directives.push_back(op); });
    // Without a directive every linear keeps its precision.
    if (directives.empty())
      return;
    if (directives.size() > 1) {
      directives[1].emitError("a recipe has at most one bonsai.fp8 directive");
      return signalPassFailure();
    }
    std::optional<TargetProfile> profile = lookupTargetProfile(target);
    if (!profile) {
      directives.front().emitError()
          << "bonsai-fp8: unknown target '" << target
          << "'; expected sm_XX, cpu or a named GPU (docs/targets.md)";
      return signalPassFailure();
    }
    for (auto function : getOperation().getOps<func::FuncOp>())
      if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
        if (failed(run(function, directives.front(), *profile)))
          return signalPassFailure();
  }
};
} // namespace
} // namespace mlir::bonsai
