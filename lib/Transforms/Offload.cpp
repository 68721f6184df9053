//===- Offload.cpp - Training state in pinned host memory -----------------===//
//
// The `bonsai-offload` pass (see Passes.td and docs/offload.md). It places the state classes
// the recipe's `bonsai.offload` names in pinned host memory and makes each optimizer update
// stream its own state through the device: a copy in right before the update, which then
// updates the device copy in place, and a copy back right after it. With `update "host"` the
// update runs on the host instead, over its state where it is kept, the tensors it reads
// copied to the host before it and the parameter copied back after it. The updates say which
// operands hold which class (OptimizerStateOpInterface); nothing here matches names.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIOFFLOADPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// The classes a `bonsai.offload` may name, as the directive spells them.
constexpr StringLiteral kOptimizerState = "optimizer_state";
constexpr StringLiteral kMasterWeights = "master_weights";

/// What to offload.
struct OffloadRequest {
  bool optimizerState = false;
  bool masterWeights = false;
  /// The updates run on the host (`update "host"`) rather than streaming their state.
  bool hostStep = false;
  /// Where diagnostics about the request point: the directive, or the module for the option.
  Location loc;
};

struct OffloadPass : impl::BonsaiOffloadPassBase<OffloadPass> {
  using Base::Base;

  /// The classes to offload: the `classes` option, else the recipe's directive; nothing when
  /// neither names any.
  FailureOr<std::optional<OffloadRequest>> getRequest() {
    ModuleOp module = getOperation();
    SmallVector<std::string> names(classes.begin(), classes.end());
    std::string where = update;
    Location loc = module.getLoc();
    if (names.empty()) {
      SmallVector<OffloadDirectiveOp> directives;
      module.walk([&](OffloadDirectiveOp op) { directives.push_back(op); });
      if (directives.empty())
        return std::optional<OffloadRequest>();
      if (directives.size() > 1) {
        directives[1].emitError("a recipe has at most one bonsai.offload; list every class in "
                                "one directive");
        return failure();
      }
      for (StringRef name : directives.front().getClasses().getAsValueRange<StringAttr>())
        names.push_back(name.str());
      if (where.empty())
        where = directives.front().getUpdate().value_or("").str();
      loc = directives.front().getLoc();
    }
    OffloadRequest request{false, false, false, loc};
    if (where == "host") {
      request.hostStep = true;
    } else if (!where.empty() && where != "device") {
      emitError(loc) << "unknown update placement '" << where << "'; expected 'device' or 'host'";
      return failure();
    }
    for (StringRef name : names) {
      if (name == kOptimizerState) {
        request.optimizerState = true;
      } else if (name == kMasterWeights) {
        request.masterWeights = true;
      } else if (llvm::is_contained({"parameters", "gradients", "activations"}, name)) {
        emitError(loc) << "offloading '" << name
                       << "' is not built yet: this compiler offloads 'optimizer_state' and "
                          "'master_weights' (docs/offload.md)";
        return failure();
      } else {
        emitError(loc) << "unknown state class '" << name
                       << "'; expected 'optimizer_state' or 'master_weights'";
        return failure();
      }
    }
    if (request.hostStep && !request.optimizerState) {
      emitError(loc) << "update \"host\" runs the optimizer updates on the CPU over their state "
                        "in pinned host memory: offload 'optimizer_state' too";
      return failure();
    }
    return std::optional<OffloadRequest>(request);
  }

  /// The operands of `update` that hold a class `request` names.
  static SmallVector<unsigned> getOffloadedOperands(OptimizerStateOpInterface update,
                                                    const OffloadRequest &request) {
    SmallVector<unsigned> operands;
    if (request.optimizerState)
      llvm::append_range(operands, update.getOptimizerStateOperands());
    if (request.masterWeights)
      llvm::append_range(operands, update.getMasterWeightOperands());
    return operands;
  }

  /// Fails, naming the class and the cause, unless `function` has state of every class
  /// `request` names.
  static LogicalResult checkClassesExist(func::FuncOp function,
                                         ArrayRef<OptimizerStateOpInterface> updates,
                                         const OffloadRequest &request) {
    auto missing = [&](StringRef name) {
      return emitError(request.loc)
             << "cannot offload '" << name << "': '" << function.getSymName() << "' ";
    };
    if (updates.empty() && (request.optimizerState || request.masterWeights)) {
      missing(request.optimizerState ? kOptimizerState : kMasterWeights)
          << "updates no parameter (every parameter is frozen, or the recipe has no "
             "bonsai.optimizer), so it keeps no optimizer state";
      return failure();
    }
    bool state = false, masters = false;
    for (OptimizerStateOpInterface update : updates) {
      state |= !update.getOptimizerStateOperands().empty();
      masters |= !update.getMasterWeightOperands().empty();
    }
    if (request.optimizerState && !state) {
      missing(kOptimizerState) << "has optimizer updates that keep no per-parameter state "
                                  "(SGD with momentum 0 keeps none)";
      return failure();
    }
    if (request.masterWeights && !masters) {
      missing(kMasterWeights)
          << "has no fp32 master weights: they are kept for trainable parameters stored in "
             "bf16 or f16 (unless bonsai.optimizer sets master_weights false), and its "
             "trainable parameters are f32 or keep none";
      return failure();
    }
    return success();
  }

  LogicalResult offload(func::FuncOp function, const OffloadRequest &request) {
    SmallVector<OptimizerStateOpInterface> updates;
    function.walk([&](OptimizerStateOpInterface update) { updates.push_back(update); });
    if (failed(checkClassesExist(function, updates, request)))
      return failure();
    if (request.hostStep)
      return offloadToHostSteps(function, updates, request);

    MLIRContext *ctx = &getContext();
    auto pinned = MemorySpaceAttr::get(ctx, MemorySpace::PinnedHost);
    int64_t tensors = 0, bytes = 0;
    for (OptimizerStateOpInterface update : updates) {
      SmallVector<unsigned> operands = getOffloadedOperands(update, request);
      if (operands.empty())
        continue;
      // Validate every operand before rewriting any, so that a failure leaves the update as
      // it was.
      SmallVector<StateOp> states;
      for (unsigned index : operands) {
        FailureOr<StateOp> state = getStateReadByItsUpdateAlone(update, index);
        if (failed(state))
          return failure();
        states.push_back(*state);
      }

      OpBuilder builder(update);
      Attribute phase = update->getAttr("bonsai.phase");
      SmallVector<std::pair<Value, Value>> copies; // (device copy, host state)
      for (auto [index, state] : llvm::zip(operands, states)) {
        state.setPlacementAttr(pinned);
        auto copy = CopyH2DOp::create(builder, update.getLoc(), state.getType(), state);
        if (phase)
          copy->setAttr("bonsai.phase", phase);
        update->setOperand(index, copy.getResult());
        copies.push_back({copy.getResult(), state.getResult()});
        int64_t size = getStorageBytes(state.getType());
        ++tensors;
        bytes += size;
        if (perTensorRemarks)
          emitRemark(state.getLoc())
              << "'" << state.getName() << "' (" << formatBytes(size)
              << ") is kept in pinned host memory; its update copies it to the device and back";
      }
      builder.setInsertionPointAfter(update);
      for (auto [device, host] : copies) {
        auto back = CopyD2HOp::create(builder, update.getLoc(), device, host);
        if (phase)
          back->setAttr("bonsai.phase", phase);
      }
    }
    numOffloaded += tensors;
    bytesOffloaded += bytes;
    emitRemark(request.loc) << "offload: " << tensors << " state tensors of '"
                            << function.getSymName() << "' (" << formatBytes(bytes)
                            << ") in pinned host memory, each copied to the device before its "
                               "update and back after it: "
                            << formatBytes(bytes) << " over PCIe each way per step";
    return success();
  }

  /// The bonsai.state that operand `index` of `update` holds, when the update is its only
  /// reader; else an error naming the other. Pinned host memory is all either kind of update
  /// needs (copied in and out around a device update, read in place by a host step), and a
  /// kernel reading it elsewhere would read host memory.
  static FailureOr<StateOp> getStateReadByItsUpdateAlone(Operation *update, unsigned index) {
    auto state = update->getOperand(index).getDefiningOp<StateOp>();
    if (!state)
      return update->emitOpError()
             << "operand #" << index
             << " holds optimizer state but is not a bonsai.state: it cannot be offloaded";
    if (state->hasOneUse())
      return state;
    Operation *other = nullptr;
    for (Operation *user : state->getUsers())
      if (user != update)
        other = user;
    InFlightDiagnostic diag = state.emitError() << "cannot offload '" << state.getName() << "': ";
    if (other)
      diag << "'" << other->getName() << "' reads it besides its optimizer update";
    else
      diag << "its optimizer update reads it twice";
    diag.attachNote(update->getLoc()) << "the update";
    return failure();
  }

  /// The state operands of `update` (every operand it updates in place but the parameter),
  /// each a bonsai.state read by the update alone; fails naming the first that is not.
  static FailureOr<SmallVector<StateOp>> getHostStepStates(OptimizerStateOpInterface update,
                                                           unsigned param) {
    SmallVector<StateOp> states;
    auto kernel = cast<KernelOpInterface>(update.getOperation());
    for (unsigned index : kernel.getInPlaceOperands()) {
      if (index == param || index >= update->getNumOperands())
        continue;
      FailureOr<StateOp> state = getStateReadByItsUpdateAlone(update, index);
      if (failed(state))
        return failure();
      states.push_back(*state);
    }
    return states;
  }

  /// `update "host"`: each update runs on the host over its state in pinned host memory and a
  /// pinned host copy of its parameter; the tensors it only reads are copied to the host
  /// right before it and the parameter's copy into the parameter right after it.
  LogicalResult offloadToHostSteps(func::FuncOp function,
                                   ArrayRef<OptimizerStateOpInterface> updates,
                                   const OffloadRequest &request) {
    MLIRContext *ctx = &getContext();
    auto pinned = MemorySpaceAttr::get(ctx, MemorySpace::PinnedHost);
    // Validate every update before rewriting any.
    SmallVector<std::pair<unsigned, SmallVector<StateOp>>> plans;
    for (OptimizerStateOpInterface update : updates) {
      std::optional<unsigned> param = update.getHostStepParamOperand();
      if (!param)
        return update->emitOpError()
               << "has no host implementation (AdamW and SGD have one), so update \"host\" "
                  "cannot run it; keep update \"device\" for this recipe";
      if (!update->getOperand(*param).getDefiningOp<ParamOp>())
        return update->emitOpError() << "updates operand #" << *param
                                     << ", which is not a bonsai.param: it cannot run on the host";
      if (!update.getMasterWeightOperands().empty() && !request.masterWeights)
        return emitError(request.loc)
               << "update \"host\" runs each update over its state in pinned host memory, and '"
               << function.getSymName()
               << "' keeps fp32 master weights: offload 'master_weights' too";
      FailureOr<SmallVector<StateOp>> states = getHostStepStates(update, *param);
      if (failed(states))
        return failure();
      plans.push_back({*param, std::move(*states)});
    }

    int64_t tensors = 0, stateBytes = 0, toHost = 0, toDevice = 0;
    for (auto [i, plan] : llvm::enumerate(plans)) {
      OptimizerStateOpInterface update = updates[i];
      auto &[paramIndex, states] = plan;
      Attribute phase = update->getAttr("bonsai.phase");
      auto inPhase = [&](Operation *op) {
        if (phase)
          op->setAttr("bonsai.phase", phase);
      };
      for (StateOp state : states) {
        state.setPlacementAttr(pinned);
        int64_t size = getStorageBytes(state.getType());
        ++tensors;
        stateBytes += size;
        if (perTensorRemarks)
          emitRemark(state.getLoc())
              << "'" << state.getName() << "' (" << formatBytes(size)
              << ") is kept in pinned host memory, where its update runs on the host";
      }
      OpBuilder builder(update);
      auto param = update->getOperand(paramIndex).getDefiningOp<ParamOp>();
      auto copy = StateOp::create(builder, param.getLoc(), param.getType(), StateKind::Optimizer,
                                  (param.getName() + ".host_copy").str(),
                                  builder.getStringAttr(param.getName()));
      copy.setPlacementAttr(pinned);
      stateBytes += getStorageBytes(param.getType());
      ++tensors;
      // What the update only reads comes to the host first.
      auto kernel = cast<KernelOpInterface>(update.getOperation());
      SmallVector<unsigned> inPlace = kernel.getInPlaceOperands();
      for (OpOperand &operand : update->getOpOperands()) {
        if (llvm::is_contained(inPlace, operand.getOperandNumber()))
          continue;
        auto staged =
            CopyToHostOp::create(builder, update.getLoc(), operand.get().getType(), operand.get());
        inPhase(staged);
        toHost += getStorageBytes(operand.get().getType());
        operand.set(staged.getResult());
      }
      update->setOperand(paramIndex, copy.getResult());
      builder.setInsertionPointAfter(update);
      inPhase(CopyToDeviceOp::create(builder, update.getLoc(), copy.getResult(), param));
      toDevice += getStorageBytes(param.getType());
    }
    numOffloaded += tensors;
    bytesOffloaded += stateBytes;
    emitRemark(request.loc) << "offload: " << updates.size() << " updates of '"
                            << function.getSymName() << "' run on the host over " << tensors
                            << " state tensors (" << formatBytes(stateBytes)
                            << ") in pinned host memory: " << formatBytes(toHost)
                            << " over PCIe to the host and " << formatBytes(toDevice)
                            << " to the device per step";
    return success();
  }

  void runOnOperation() override {
    FailureOr<std::optional<OffloadRequest>> request = getRequest();
    if (failed(request))
      return signalPassFailure();
    if (!*request)
      return markAllAnalysesPreserved();
    for (auto function : getOperation().getOps<func::FuncOp>())
      if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
        if (failed(offload(function, **request)))
          return signalPassFailure();
  }
};
} // namespace
} // namespace mlir::bonsai
