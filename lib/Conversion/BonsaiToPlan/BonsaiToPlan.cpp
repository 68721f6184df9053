//===- BonsaiToPlan.cpp - Lower model functions to bonsai_plan steps ------===//
//
// A direct walk over each model function: values become buffers, views stay views, kernels
// become launches. The function is replaced by the step. Ops are asked through interfaces
// (KernelOpInterface, ViewLikeOpInterface) what they become; nothing here names a model op.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Conversion/Passes.h"

#include "bonsai/Analysis/StepTime.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAILOWERTOPLANPASS
#include "bonsai/Conversion/Passes.h.inc"

namespace {

constexpr StringLiteral kWeightsArena = "weights";
constexpr StringLiteral kActivationsArena = "activations";
constexpr StringLiteral kGradientsArena = "gradients";
constexpr StringLiteral kOptimizerArena = "optimizer";
constexpr StringLiteral kGradientsHostArena = "gradients_host";
constexpr StringLiteral kOptimizerHostArena = "optimizer_host";
constexpr StringLiteral kStagingHostArena = "staging_host";

/// The name of a model input, from how the model uses it: the ids of an embedding, the labels
/// of a loss, or its position.
std::string getInputName(BlockArgument arg) {
  for (OpOperand &use : arg.getUses()) {
    if (auto embedding = dyn_cast<EmbeddingOp>(use.getOwner());
        embedding && use.get() == embedding.getIds())
      return "ids";
    if (auto loss = dyn_cast<CrossEntropyOp>(use.getOwner());
        loss && use.get() == loss.getLabels())
      return "labels";
    if (auto loss = dyn_cast<LinearCrossEntropyOp>(use.getOwner());
        loss && use.get() == loss.getLabels())
      return "labels";
    // Packed rows (docs/training.md): rope's positions and attention's segment ids.
    Operation *user = use.getOwner();
    if (isa<RoPEOp, RoPEGradOp>(user) && use.getOperandNumber() == 1)
      return "positions";
    if ((isa<AttentionOp, FlashAttentionOp>(user) && use.getOperandNumber() == 3) ||
        (isa<AttentionGradOp>(user) && use.getOperandNumber() == 5) ||
        (isa<FlashAttentionGradOp>(user) && use.getOperandNumber() == 6) ||
        (isa<FlashAttentionQkvOp>(user) && use.getOperandNumber() == 1) ||
        (isa<FlashAttentionQkvGradOp>(user) && use.getOperandNumber() == 4))
      return "segment_ids";
  }
  return "input" + std::to_string(arg.getArgNumber());
}

struct LowerToPlanPass : impl::BonsaiLowerToPlanPassBase<LowerToPlanPass> {
  using Base::Base;

  /// The buffer type of a tensor: a memref of the same shape and element type (NF4 buffers
  /// are sized by their packed layout, PackedElementTypeInterface).
  FailureOr<MemRefType> getBufferType(Operation *op, Type type) {
    auto tensor = cast<RankedTensorType>(type);
    return MemRefType::get(tensor.getShape(), tensor.getElementType());
  }

  LogicalResult lowerFunction(func::FuncOp function) {
    OpBuilder builder(function);
    Location loc = function.getLoc();
    Block &body = function.getBody().front();
    Operation *terminator = body.getTerminator();
    int64_t tokens = 0, vocab = 0;
    Value logits;
    function.walk([&](CrossEntropyOp loss) {
      tokens = getNumElements(cast<ShapedType>(loss.getLabels().getType()));
      logits = loss.getLogits();
    });
    // A fused LM head (bonsai-fuse) holds no logits tensor: a plan without one cannot
    // generate text (bonsai-run --generate says so), which training plans do not need.
    function.walk([&](LinearCrossEntropyOp loss) {
      tokens = getNumElements(cast<ShapedType>(loss.getLabels().getType()));
    });
    function.walk([&](EmbeddingOp embedding) {
      if (isa<BlockArgument>(embedding.getIds()) && !vocab)
        vocab = cast<ShapedType>(embedding.getTable().getType()).getDimSize(0);
    });
    auto step = plan::StepOp::create(builder, loc, function.getSymName(), target, deviceMemory,
                                     tokens, microBatches, vocab, hostMemory);
    // The adapters bonsai-insert-lora recorded become the plan's adapter metadata.
    // So do the data-parallel ranks bonsai-shard compiled the step for, and the ring's.
    for (StringRef name : {"bonsai.adapters", "bonsai.adapter_targets", "bonsai.ranks",
                           "bonsai.shard_strategy", "bonsai.ring_ranks"})
      if (Attribute attr = function->getAttr(name))
        step->setAttr(name, attr);
    builder.createBlock(&step.getBody());

    // Arenas: parameters, gradient accumulators and optimizer state persist across steps;
    // everything else lives for one step. Arenas are created when first needed. State placed
    // in pinned host memory (bonsai-offload) gets an arena of its own in that space, so that
    // the memory planner and the budget tell host bytes from device bytes.
    llvm::StringMap<bool> arenaCreated;
    Block *stepBody = &step.getBody().front();
    auto arena = [&](StringRef name, plan::Lifetime lifetime,
                     plan::MemorySpace space = plan::MemorySpace::Device) -> StringRef {
      if (!arenaCreated[name]) {
        OpBuilder::InsertionGuard guard(builder);
        builder.setInsertionPointToStart(stepBody);
        plan::ArenaOp::create(builder, loc, name, lifetime, space, 0, 256);
        arenaCreated[name] = true;
      }
      return name;
    };
    StringRef activations = arena(kActivationsArena, plan::Lifetime::Step);

    IRMapping mapping;
    for (BlockArgument arg : function.getArguments()) {
      FailureOr<MemRefType> type = getBufferType(function, arg.getType());
      if (failed(type))
        return failure();
      auto buffer = plan::BufferOp::create(
          builder, loc, *type, activations, IntegerAttr(), plan::BufferRole::Input,
          getInputName(arg), false, builder.getI64IntegerAttr(arg.getArgNumber()), StringAttr());
      mapping.map(arg, buffer.getResult());
    }

    auto declare = [&](Operation *op, Value value, StringRef arenaName, plan::BufferRole role,
                       StringRef name, bool trainable = false,
                       StringAttr copyOf = {}) -> LogicalResult {
      FailureOr<MemRefType> type = getBufferType(op, value.getType());
      if (failed(type))
        return failure();
      auto buffer = plan::BufferOp::create(builder, op->getLoc(), *type, arenaName,
                                           IntegerAttr(), role, name, trainable, IntegerAttr(),
                                           copyOf);
      mapping.map(value, buffer.getResult());
      return success();
    };

    unsigned counter = 0;
    for (Operation &op : body.without_terminator()) {
      if (auto param = dyn_cast<ParamOp>(op)) {
        if (failed(declare(&op, param.getResult(),
                           arena(kWeightsArena, plan::Lifetime::Persistent),
                           plan::BufferRole::Parameter, param.getName(), param.getTrainable())))
          return failure();
        // An adapter's initializer (bonsai-insert-lora) travels with its buffer to the plan.
        Operation *buffer = mapping.lookup(param.getResult()).getDefiningOp();
        for (StringRef name : {"bonsai.init", "bonsai.init_source"})
          if (Attribute attr = param->getAttr(name))
            buffer->setAttr(name, attr);
        // A rank's share (bonsai-shard) records the whole tensor it is a share of.
        if (ShardingAttr sharding = param.getShardingAttr())
          buffer->setAttr("bonsai.sharding", sharding);
        continue;
      }
      if (auto state = dyn_cast<StateOp>(op)) {
        bool gradient = state.getKind() == StateKind::Gradient;
        bool pinned = state.getPlacement() == MemorySpace::PinnedHost;
        StringRef name = pinned ? arena(gradient ? kGradientsHostArena : kOptimizerHostArena,
                                        plan::Lifetime::Persistent, plan::MemorySpace::PinnedHost)
                                : arena(gradient ? kGradientsArena : kOptimizerArena,
                                        plan::Lifetime::Persistent);
        if (failed(declare(&op, state.getResult(), name,
                           gradient ? plan::BufferRole::Gradient
                                    : plan::BufferRole::OptimizerState,
                           state.getName(), false, state.getCopyOfAttr())))
          return failure();
        if (ShardingAttr sharding = state.getShardingAttr())
          mapping.lookup(state.getResult()).getDefiningOp()->setAttr("bonsai.sharding", sharding);
        continue;
      }
      if (auto scale = dyn_cast<LossScaleOp>(op)) {
        if (failed(declare(&op, scale.getResult(), activations, plan::BufferRole::LossScale,
                           "loss_scale")))
          return failure();
        continue;
      }
      if (isa<MetricOp>(op))
        continue; // Its value's buffer was declared as a metric by the producer.
      if (auto view = dyn_cast<ViewLikeOpInterface>(op)) {
        FailureOr<MemRefType> type = getBufferType(&op, op.getResult(0).getType());
        if (failed(type))
          return failure();
        auto lowered = plan::ViewOp::create(builder, op.getLoc(), *type,
                                            mapping.lookup(view.getViewSource()));
        mapping.map(op.getResult(0), lowered.getResult());
        continue;
      }
      auto kernel = dyn_cast<KernelOpInterface>(op);
      if (!kernel)
        return op.emitError() << "'" << op.getName()
                              << "' has no runtime kernel and cannot be lowered to a plan";
      SmallVector<Value> outs;
      SmallVector<unsigned> workspaces = kernel.getWorkspaceResults();
      // Copies staged for an update on the host live in pinned host memory, for the step.
      StringRef resultArena =
          kernel.hasHostResults()
              ? arena(kStagingHostArena, plan::Lifetime::Step, plan::MemorySpace::PinnedHost)
              : activations;
      for (Value result : op.getResults()) {
        plan::BufferRole role = plan::BufferRole::Activation;
        if (llvm::is_contained(workspaces, cast<OpResult>(result).getResultNumber()))
          role = plan::BufferRole::Workspace;
        std::string name = (kernel.getKernelName() + "." + Twine(counter++)).str();
        if (llvm::is_contained(terminator->getOperands(), result)) {
          role = plan::BufferRole::Loss;
        } else if (result == logits) {
          // The runtime reads the logits by this name to generate text.
          name = "logits";
        }
        for (Operation *user : result.getUsers())
          if (auto metric = dyn_cast<MetricOp>(user)) {
            role = plan::BufferRole::Metric;
            name = metric.getName().str();
          }
        if (failed(declare(&op, result, resultArena, role, name)))
          return failure();
        outs.push_back(mapping.lookup(result));
      }
      // Operands updated in place are outputs of the launch; the rest are its inputs.
      SmallVector<unsigned> inPlace = kernel.getInPlaceOperands();
      SmallVector<Value> ins;
      for (auto [i, operand] : llvm::enumerate(op.getOperands())) {
        if (llvm::is_contained(inPlace, i))
          outs.push_back(mapping.lookup(operand));
        else
          ins.push_back(mapping.lookup(operand));
      }
      plan::Phase phase = plan::Phase::Forward;
      if (auto attr = op.getAttrOfType<StringAttr>(BonsaiDialect::getPhaseAttrName())) {
        std::optional<plan::Phase> parsed = plan::symbolizePhase(attr.getValue());
        if (!parsed)
          return op.emitError() << "unknown phase '" << attr.getValue() << "'";
        phase = *parsed;
      }
      // Discardable bonsai.* annotations (the phase) are not kernel parameters.
      SmallVector<NamedAttribute> params;
      for (NamedAttribute attr : kernel.getKernelParams())
        if (!attr.getName().getValue().starts_with("bonsai."))
          params.push_back(attr);
      auto launch = plan::LaunchOp::create(builder, op.getLoc(), kernel.getKernelName(), ins, outs,
                                           builder.getDictionaryAttr(params), 0, phase);
      // bonsai-time-ops' estimate, for bonsai-predict-step's simulation of the step.
      if (Attribute seconds = op.getAttr(kOpSecondsAttr))
        launch->setAttr(kOpSecondsAttr, seconds);
    }
    function.erase();
    return success();
  }

  void runOnOperation() override {
    SmallVector<func::FuncOp> models;
    for (auto function : getOperation().getOps<func::FuncOp>())
      if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
        models.push_back(function);
    if (models.empty()) {
      getOperation().emitError("no model function to lower: no func.func declares a "
                               "bonsai.param");
      return signalPassFailure();
    }
    for (func::FuncOp function : models)
      if (failed(lowerFunction(function)))
        return signalPassFailure();
  }
};
} // namespace
} // namespace mlir::bonsai
