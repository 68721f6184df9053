//===- Shard.cpp - ZeRO-1/2/3 sharding over data-parallel ranks -----------===//
//
// The `bonsai-shard` pass (see Passes.td and docs/sharding.md). Every rank runs the same step
// on its own micro-batches; what differs between the stages is which training state each rank
// keeps only a share of, and so which collectives keep the ranks equal:
//
//   stage  sharded                                  collectives per step
//   zero1  optimizer state, masters                 reduce-scatter grads, all-gather params
//   zero2  + gradient accumulators                  reduce-scatter each gradient as produced
//   zero3  + parameters (NF4 ones by their bytes)   + all-gather each parameter before its
//                                                     forward and its backward uses (once,
//                                                     kept between them, with
//                                                     reshard_after_forward false)
//
// The updates are elementwise (AdamW, SGD), so they run unchanged on flat shares.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAISHARDPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// The ZeRO stage: how much of the training state is sharded.
enum class Stage { Zero1 = 1, Zero2 = 2, Zero3 = 3 };

/// The phase an op runs in (bonsai.phase; the forward pass when unmarked).
StringRef phaseOf(Operation *op) {
  auto phase = op->getAttrOfType<StringAttr>(BonsaiDialect::getPhaseAttrName());
  return phase ? phase.getValue() : StringRef("forward");
}

/// What the pass sharded and what the collectives move, for the summary remark.
struct ShardTotals {
  int64_t tensors = 0;
  /// Persistent bytes of the sharded tensors, whole and per rank.
  int64_t wholeBytes = 0, shardBytes = 0;
  /// Bytes gathered (whole tensors) and reduce-scattered (whole gradients), per micro-batch
  /// and once per step (the update phase).
  int64_t gatheredPerMicroBatch = 0, scatteredPerMicroBatch = 0;
  int64_t gatheredPerStep = 0, scatteredPerStep = 0;
  /// Frozen parameters left whole on every rank (zero3): their elements (or, NF4, their
  /// storage bytes) do not split evenly.
  int64_t keptWhole = 0, keptWholeBytes = 0;
  /// Frozen NF4 parameters shared out by their storage bytes (zero3).
  int64_t packed = 0;
  /// Trainable parameters whose update is not elementwise, kept whole on every rank.
  int64_t replicated = 0;
  /// Zero3 with reshard_after_forward false: parameters gathered once per micro-batch for
  /// both passes, and the gathered bytes kept from the forward to the backward pass.
  int64_t keptGathered = 0, keptGatheredBytes = 0;
  /// FP8 cast statistics all-reduced (max) once per step, and their bytes.
  int64_t fp8Statistics = 0, fp8StatisticsBytes = 0;
};

/// Whether `state` is bonsai-fp8's accumulator of a linear's cast statistics over
/// micro-batches (read by bonsai.accumulate_max), which every rank keeps whole.
bool isFp8Statistics(StateOp state) {
  return llvm::any_of(state->getUsers(),
                      [](Operation *user) { return isa<AccumulateMaxOp>(user); });
}

struct ShardPass : impl::BonsaiShardPassBase<ShardPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<ShardDirectiveOp> directives;
    module.walk([&](ShardDirectiveOp op) { directives.push_back(op); });
    if (directives.empty())
      return;
    if (directives.size() > 1) {
      directives[1].emitError() << "a recipe shards its step once: found " << directives.size()
                                << " bonsai.shard directives";
      return signalPassFailure();
    }
    ShardDirectiveOp directive = directives.front();
    if (failed(checkComposition(module, directive)))
      return signalPassFailure();
    SmallVector<func::FuncOp> models;
    for (auto function : module.getOps<func::FuncOp>())
      if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
        models.push_back(function);
    for (func::FuncOp function : models)
      if (failed(shardFunction(function, directive)))
        return signalPassFailure();
  }

  /// What sharding does not compose with yet is refused, naming the directive, rather than
  /// producing a step whose ranks drift apart.
  LogicalResult checkComposition(ModuleOp module, ShardDirectiveOp directive) {
    LogicalResult result = success();
    module.walk([&](OptimizerDirectiveOp op) {
      if (op.getUpdateInBackward()) {
        op.emitError() << "bonsai.shard does not compose with update_in_backward yet: the "
                          "sharded update runs after every rank's gradients are reduced";
        result = failure();
      }
    });
    return result;
  }

  /// Gives `op`'s single result one rank's share of its type, marked with `sharding`.
  template <typename OpTy> void shardValue(OpTy op, ShardingAttr sharding, ShardTotals &totals) {
    auto type = cast<RankedTensorType>(op.getResult().getType());
    RankedTensorType shard = sharding.getShardType(type.getElementType());
    totals.wholeBytes += getStorageBytes(type);
    totals.shardBytes += getStorageBytes(shard);
    ++totals.tensors;
    op.getResult().setType(shard);
    op.setShardingAttr(sharding);
  }

  /// ZeRO-3: `param` becomes its rank's share, gathered whole before its first use in the
  /// forward pass and again before its first use in the backward pass (`update`, which
  /// updates the share in place, reads the share). With `keepGathered` (reshard_after_forward
  /// false) a parameter the forward pass reads is gathered once, before its first use, and
  /// the backward pass reads the same gathered value.
  LogicalResult shardParameter(Block &body, ParamOp param, ShardingAttr sharding, Operation *update,
                               bool keepGathered, ShardTotals &totals) {
    auto wholeType = cast<RankedTensorType>(param.getResult().getType());
    SmallVector<OpOperand *> forward, backward;
    for (OpOperand &use : param.getResult().getUses()) {
      Operation *user = use.getOwner();
      if (user == update)
        continue;
      if (user->getBlock() != &body)
        return user->emitError() << "bonsai-shard: parameter '" << param.getName()
                                 << "' is read inside a region; sharding needs the step's "
                                    "ops at the top level";
      StringRef phase = phaseOf(user);
      if (phase == "forward")
        forward.push_back(&use);
      else if (phase == "backward")
        backward.push_back(&use);
      else
        return user->emitError() << "bonsai-shard: parameter '" << param.getName()
                                 << "' is read in the " << phase << " phase by '" << user->getName()
                                 << "', which cannot read a sharded "
                                 << "parameter";
    }
    shardValue(param, sharding, totals);
    if (keepGathered && !forward.empty() && !backward.empty()) {
      forward.append(backward);
      backward.clear();
      ++totals.keptGathered;
      totals.keptGatheredBytes += getStorageBytes(wholeType);
    }
    OpBuilder builder(param.getContext());
    for (auto [uses, phase] :
         {std::pair{&forward, StringRef("forward")}, std::pair{&backward, StringRef("backward")}}) {
      if (uses->empty())
        continue;
      Operation *first = (*uses)[0]->getOwner();
      for (OpOperand *use : *uses)
        if (use->getOwner()->isBeforeInBlock(first))
          first = use->getOwner();
      builder.setInsertionPoint(first);
      auto gather = AllGatherOp::create(builder, param.getLoc(), wholeType, param.getResult(),
                                        sharding.getRanks());
      if (phase != "forward")
        gather->setAttr(BonsaiDialect::getPhaseAttrName(), builder.getStringAttr(phase));
      else if (keepGathered)
        gather.setKept(true);
      for (OpOperand *use : *uses)
        use->set(gather.getResult());
      totals.gatheredPerMicroBatch += getStorageBytes(wholeType);
    }
    return success();
  }

  LogicalResult shardFunction(func::FuncOp function, ShardDirectiveOp directive) {
    MLIRContext *ctx = &getContext();
    Block &body = function.getBody().front();
    // With a ring (bonsai-ring) every rank of each ring is a rank of the grid: the shards
    // spread over all of them (a data x ring grid, as torchtitan's FSDP over dp x cp), and the
    // gradients reduce-scattered over all of them are summed over the ring too.
    const int64_t ringRanks = ringRanksOf(function);
    const int64_t ranks = directive.getRanks() * ringRanks;
    const Stage stage = directive.getStrategy() == "zero1"   ? Stage::Zero1
                        : directive.getStrategy() == "zero2" ? Stage::Zero2
                                                             : Stage::Zero3;
    const bool keepGathered = directive.keepsGathered();
    SmallVector<Operation *> updates;
    SmallVector<GradNormOp> norms;
    for (Operation &op : body) {
      if (isa<MultiTensorUpdateOpInterface>(op))
        updates.push_back(&op);
      if (auto norm = dyn_cast<GradNormOp>(op))
        norms.push_back(norm);
    }
    if (updates.empty())
      return directive.emitError()
             << "bonsai.shard shards training state, but '" << function.getSymName()
             << "' has no optimizer update (a training step needs "
                "bonsai.optimizer)";
    if (norms.size() != 1)
      return function.emitError() << "bonsai-shard expects one bonsai.grad_norm in the update "
                                     "phase (bonsai-optimizer's), found "
                                  << norms.size();
    GradNormOp norm = norms.front();

    OpBuilder builder(ctx);
    StringAttr updatePhase = builder.getStringAttr("update");
    ShardTotals totals;
    llvm::SmallPtrSet<Operation *, 32> updatedParams, handledGradients;
    for (Operation *update : updates) {
      SmallVector<Value> tensors = cast<MultiTensorUpdateOpInterface>(update).getTensorOperands();
      auto param = tensors[1].getDefiningOp<ParamOp>();
      auto gradient = tensors[0].getDefiningOp<StateOp>();
      if (!param || !gradient || gradient.getKind() != StateKind::Gradient)
        return update->emitError() << "bonsai-shard cannot shard this update: its parameter is "
                                      "not a bonsai.param or its gradient not an accumulator";
      auto type = cast<RankedTensorType>(param.getResult().getType());
      int64_t numel = getNumElements(type);
      if (numel % ranks != 0)
        return param.emitError() << "bonsai.shard over " << ranks << " ranks: parameter '"
                                 << param.getName() << "' has " << numel
                                 << " elements, which do not split evenly over " << ranks
                                 << " ranks; use a rank count that divides every trainable "
                                    "parameter's element count";
      auto sharding = ShardingAttr::get(ctx, ranks, type.getShape());
      auto shardType = [&](Value whole) {
        return sharding.getShardType(cast<RankedTensorType>(whole.getType()).getElementType());
      };
      auto operandIndex = [&](Value value) {
        for (OpOperand &operand : update->getOpOperands())
          if (operand.get() == value)
            return operand.getOperandNumber();
        llvm_unreachable("a tensor operand of the update");
      };
      const unsigned gradientIndex = operandIndex(gradient.getResult());
      const unsigned paramIndex = operandIndex(param.getResult());

      // The optimizer's own state and the masters: only this update reads them.
      auto stateful = cast<OptimizerStateOpInterface>(update);
      SmallVector<unsigned> stateOperands = stateful.getOptimizerStateOperands();
      llvm::append_range(stateOperands, stateful.getMasterWeightOperands());
      for (unsigned index : stateOperands) {
        Value value = update->getOperand(index);
        auto state = value.getDefiningOp<StateOp>();
        if (!state || !value.hasOneUse())
          return update->emitError() << "bonsai-shard: the optimizer state of '" << param.getName()
                                     << "' is read by ops other than its update";
        shardValue(state, sharding, totals);
      }

      // The gradient: reduce-scattered once per step (zero1), or as each micro-batch's
      // backward pass produces it, into a sharded accumulator (zero2, zero3).
      const int64_t gradientBytes = getStorageBytes(gradient.getResult().getType());
      if (stage == Stage::Zero1) {
        builder.setInsertionPoint(norm);
        auto reduced =
            ReduceScatterOp::create(builder, update->getLoc(), shardType(gradient.getResult()),
                                    gradient.getResult(), ranks);
        reduced->setAttr(BonsaiDialect::getPhaseAttrName(), updatePhase);
        update->setOperand(gradientIndex, reduced.getResult());
        for (OpOperand &operand : norm->getOpOperands())
          if (operand.get() == gradient.getResult())
            operand.set(reduced.getResult());
        totals.scatteredPerStep += gradientBytes;
      } else {
        for (OpOperand &use : llvm::make_early_inc_range(gradient.getResult().getUses())) {
          Operation *user = use.getOwner();
          if (auto accumulate = dyn_cast<AccumulateOp>(user);
              accumulate && use.get() == accumulate.getAccumulator()) {
            builder.setInsertionPoint(accumulate);
            Value produced = accumulate.getGradient();
            auto reduced = ReduceScatterOp::create(builder, accumulate.getLoc(),
                                                   shardType(produced), produced, ranks);
            if (auto phase = accumulate->getAttr(BonsaiDialect::getPhaseAttrName()))
              reduced->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
            accumulate.getGradientMutable().assign(reduced.getResult());
            totals.scatteredPerMicroBatch += getStorageBytes(produced.getType());
            continue;
          }
          if (user == norm.getOperation() || user == update || isa<ZeroOp>(user))
            continue;
          return user->emitError()
                 << "bonsai-shard cannot shard the gradient of '" << param.getName() << "': '"
                 << user->getName() << "' uses its accumulator";
        }
        shardValue(gradient, sharding, totals);
      }

      // The parameter: whole on every rank, its share copied out, updated and gathered back
      // (zero1, zero2); or stored as the share and gathered before use (zero3).
      if (stage != Stage::Zero3) {
        builder.setInsertionPoint(update);
        auto slice = ShardSliceOp::create(builder, update->getLoc(), shardType(param.getResult()),
                                          param.getResult(), ranks);
        slice->setAttr(BonsaiDialect::getPhaseAttrName(), updatePhase);
        update->setOperand(paramIndex, slice.getResult());
        builder.setInsertionPointAfter(update);
        auto gather = AllGatherIntoOp::create(builder, update->getLoc(), slice.getResult(),
                                              param.getResult(), ranks);
        gather->setAttr(BonsaiDialect::getPhaseAttrName(), updatePhase);
        totals.gatheredPerStep += getStorageBytes(type);
      } else if (failed(shardParameter(body, param, sharding, update, keepGathered, totals))) {
        return failure();
      }
      updatedParams.insert(param);
      handledGradients.insert(gradient);
    }

    // Updates that are not elementwise (GaLore's projects whole matrices) keep their parameter
    // and state whole on every rank, as plain data parallelism does: the accumulator is
    // reduce-scattered for the norm, which then counts each element once, and gathered back
    // whole for the update, which every rank then computes alike.
    llvm::StringSet<> wholeParams;
    for (auto gradient : body.getOps<StateOp>()) {
      if (gradient.getKind() != StateKind::Gradient || handledGradients.contains(gradient) ||
          isFp8Statistics(gradient))
        continue;
      auto type = cast<RankedTensorType>(gradient.getResult().getType());
      int64_t numel = getNumElements(type);
      if (numel % ranks != 0)
        return gradient.emitError()
               << "bonsai.shard over " << ranks << " ranks: the gradient of '" << gradient.getName()
               << "' has " << numel << " elements, which do not split evenly over " << ranks
               << " ranks";
      builder.setInsertionPoint(norm);
      auto reduced = ReduceScatterOp::create(
          builder, gradient.getLoc(),
          ShardingAttr::get(ctx, ranks, type.getShape()).getShardType(type.getElementType()),
          gradient.getResult(), ranks);
      reduced->setAttr(BonsaiDialect::getPhaseAttrName(), updatePhase);
      auto whole =
          AllGatherOp::create(builder, gradient.getLoc(), type, reduced.getResult(), ranks);
      whole->setAttr(BonsaiDialect::getPhaseAttrName(), updatePhase);
      for (OpOperand &use : llvm::make_early_inc_range(gradient.getResult().getUses())) {
        Operation *user = use.getOwner();
        if (user == reduced.getOperation() || isa<ZeroOp>(user) || phaseOf(user) != "update")
          continue;
        use.set(user == norm.getOperation() ? reduced.getResult() : whole.getResult());
      }
      wholeParams.insert(gradient.getName());
      totals.scatteredPerStep += getStorageBytes(type);
      totals.gatheredPerStep += getStorageBytes(type);
      ++totals.replicated;
    }

    // Zero3 shards the frozen parameters too. A packed (NF4) weight is shared out by its
    // storage bytes, the 4-bit codes and their block constants alike, and gathered whole
    // before its dequantize (FSDP-QLoRA's flat uint8 shards). A tensor that does not split
    // evenly stays whole on every rank (NF4 storage is a multiple of 4 bytes, so every NF4
    // weight splits over 2 and 4 ranks).
    if (stage == Stage::Zero3)
      for (auto param : llvm::make_early_inc_range(body.getOps<ParamOp>())) {
        if (updatedParams.contains(param) || wholeParams.contains(param.getName()))
          continue;
        auto type = cast<RankedTensorType>(param.getResult().getType());
        Type element = type.getElementType();
        bool packed = isa<plan::PackedElementTypeInterface>(element);
        if ((packed ? getStorageBytes(type) : getNumElements(type)) % ranks != 0) {
          ++totals.keptWhole;
          totals.keptWholeBytes += getStorageBytes(type);
          continue;
        }
        auto sharding = packed ? ShardingAttr::get(ctx, ranks, type.getShape(), element)
                               : ShardingAttr::get(ctx, ranks, type.getShape());
        if (failed(shardParameter(body, param, sharding, nullptr, keepGathered, totals)))
          return failure();
        if (packed)
          ++totals.packed;
      }

    // FP8's delayed scales are training state every rank keeps whole, updated from each
    // step's cast statistics: the largest over the ranks, so that every rank's amax history,
    // and so its scales and its casts, stay those of the one-rank step over all the ranks'
    // micro-batches (bonsai-fp8 folds a rank's micro-batches the same way).
    for (auto update : body.getOps<Fp8UpdateScalesOp>()) {
      SmallVector<OpOperand *, 2> statistics = {&update.getForwardStatsMutable()};
      if (update.getBackwardStats())
        statistics.push_back(&update.getBackwardStatsMutable()[0]);
      for (OpOperand *operand : statistics) {
        builder.setInsertionPoint(update);
        Value local = operand->get();
        auto largest = AllReduceOp::create(builder, update.getLoc(), local.getType(), local, ranks,
                                           builder.getStringAttr("max"));
        largest->setAttr(BonsaiDialect::getPhaseAttrName(), updatePhase);
        operand->set(largest.getResult());
        ++totals.fp8Statistics;
        totals.fp8StatisticsBytes += getStorageBytes(local.getType());
      }
    }

    // The norm of every rank's shares, combined: the norm of the whole gradient.
    builder.setInsertionPointAfter(norm);
    auto global = AllReduceOp::create(builder, norm.getLoc(), norm.getResult().getType(),
                                      norm.getResult(), ranks, builder.getStringAttr("l2"));
    global->setAttr(BonsaiDialect::getPhaseAttrName(), updatePhase);
    norm.getResult().replaceAllUsesExcept(global.getResult(), global);

    function->setAttr("bonsai.ranks", builder.getI64IntegerAttr(ranks));
    function->setAttr("bonsai.shard_strategy", directive.getStrategyAttr());
    numSharded += totals.tensors;
    emitSummary(function, directive, totals);
    return success();
  }

  /// The ranks of the function's ring (bonsai-ring's bonsai.ring_ranks), 1 without one.
  static int64_t ringRanksOf(func::FuncOp function) {
    auto ring = function->getAttrOfType<IntegerAttr>("bonsai.ring_ranks");
    return ring ? ring.getInt() : 1;
  }

  void emitSummary(func::FuncOp function, ShardDirectiveOp directive, const ShardTotals &t) {
    const int64_t ring = ringRanksOf(function), ranks = directive.getRanks() * ring;
    InFlightDiagnostic remark = emitRemark(directive.getLoc())
                                << "shard: " << directive.getStrategy() << " over " << ranks
                                << (ranks == 1 ? " rank" : " ranks");
    if (ring > 1)
      remark << " (" << directive.getRanks() << " data x a ring of " << ring << ")";
    remark << ": " << t.tensors << " tensors of '" << function.getSymName() << "' sharded ("
           << formatBytes(t.shardBytes) << " per rank instead of " << formatBytes(t.wholeBytes)
           << ")";
    if (t.packed)
      remark << ", " << t.packed
             << (t.packed == 1 ? " of them an NF4 weight shared out by its storage bytes"
                               : " of them NF4 weights shared out by their storage bytes");
    if (t.keptWhole)
      remark << ", " << t.keptWhole
             << (t.keptWhole == 1 ? " frozen parameter (" : " frozen parameters (")
             << formatBytes(t.keptWholeBytes) << ") kept whole on every rank ("
             << (t.keptWhole == 1 ? "it does" : "they do") << " not split evenly)";
    if (t.keptGathered)
      remark << ", " << t.keptGathered << " parameters (" << formatBytes(t.keptGatheredBytes)
             << ") gathered once per micro-batch and kept from the forward to the backward "
                "pass (reshard_after_forward false)";
    if (directive.choosesReshard())
      remark << ", each parameter gathered again for the backward pass (reshard_after_forward "
                "\"auto\" is bonsai-compile's choice, which compiles the step both ways; this "
                "pass alone frees)";
    if (t.replicated)
      remark << ", " << t.replicated
             << (t.replicated == 1 ? " trainable parameter" : " trainable parameters")
             << " kept whole on every rank (not elementwise updates; gradients reduced whole)";
    auto traffic = [&](StringRef when, int64_t gathered, int64_t scattered) {
      if (!gathered && !scattered)
        return;
      remark << "; " << when << ":";
      if (gathered)
        remark << " all-gather " << formatBytes(gathered);
      if (scattered)
        remark << (gathered ? "," : "") << " reduce-scatter " << formatBytes(scattered);
    };
    traffic("per micro-batch", t.gatheredPerMicroBatch, t.scatteredPerMicroBatch);
    traffic("per step", t.gatheredPerStep, t.scatteredPerStep);
    remark << " (whole tensors; each rank sends and receives " << ranks - 1 << "/" << ranks
           << " of them)";
    if (t.fp8Statistics)
      remark << "; " << t.fp8Statistics << " FP8 cast statistics ("
             << formatBytes(t.fp8StatisticsBytes)
             << ") all-reduced to their largest once per step, so that every rank's delayed "
                "scales stay equal";
  }
};

} // namespace
} // namespace mlir::bonsai
