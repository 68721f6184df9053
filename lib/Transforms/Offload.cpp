//===- Offload.cpp - Training state in pinned host memory -----------------===//
//
// The `bonsai-offload` pass (see Passes.td and docs/offload.md). It places the state classes
// the recipe's `bonsai.offload` names in pinned host memory and makes each optimizer update
// stream its own state through the device: a copy in right before the update, which then
// updates the device copy in place, and a copy back right after it. With `update "host"` the
// update runs on the host instead, over its state where it is kept, the tensors it reads
// copied to the host before it and the parameter copied back after it. With `update "auto"`
// each update goes where a simulation of the step (UpdatePlacement.h) finishes it sooner, the
// host's cores and the link working at once. The updates say which operands hold which class
// (OptimizerStateOpInterface); nothing here matches names.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Analysis/StepTime.h"
#include "bonsai/Analysis/UpdatePlacement.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Target/TargetProfile.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIOFFLOADPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// The classes a `bonsai.offload` may name, as the directive spells them.
constexpr StringLiteral kOptimizerState = "optimizer_state";
constexpr StringLiteral kMasterWeights = "master_weights";

/// Where the updates of offloaded state run (the directive's `update`).
enum class UpdatePlace {
  Device, ///< each update streams its state through the device
  Host,   ///< each update runs on the host, over its state where it is kept
  Auto,   ///< each update where the step finishes sooner (UpdatePlacement.h)
};

/// What to offload.
struct OffloadRequest {
  bool optimizerState = false;
  bool masterWeights = false;
  /// Saved activations: bonsai-remat keeps them in host memory (its third choice); this pass
  /// only checks that the step has some.
  bool activations = false;
  UpdatePlace place = UpdatePlace::Device;
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
    OffloadRequest request{false, false, false, UpdatePlace::Device, loc};
    if (where == "host") {
      request.place = UpdatePlace::Host;
    } else if (where == "auto") {
      request.place = UpdatePlace::Auto;
    } else if (!where.empty() && where != "device") {
      emitError(loc) << "unknown update placement '" << where
                     << "'; expected 'device', 'host' or 'auto'";
      return failure();
    }
    for (StringRef name : names) {
      if (name == kOptimizerState) {
        request.optimizerState = true;
      } else if (name == kMasterWeights) {
        request.masterWeights = true;
      } else if (name == "activations") {
        request.activations = true;
      } else if (llvm::is_contained({"parameters", "gradients"}, name)) {
        emitError(loc) << "offloading '" << name
                       << "' is not built yet: this compiler offloads 'optimizer_state', "
                          "'master_weights' and 'activations' (docs/offload.md)";
        return failure();
      } else {
        emitError(loc) << "unknown state class '" << name
                       << "'; expected 'optimizer_state', 'master_weights' or 'activations'";
        return failure();
      }
    }
    if (request.place != UpdatePlace::Device && !request.optimizerState) {
      emitError(loc) << "update \"" << where << "\" runs "
                     << (request.place == UpdatePlace::Host ? "the" : "some")
                     << " optimizer updates on the CPU over their state in pinned host memory: "
                        "offload 'optimizer_state' too";
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

  /// How one update is rewritten: its state streamed through the device, or the update on
  /// the host.
  struct UpdateRewrite {
    OptimizerStateOpInterface update;
    bool onHost = false;
    /// Streamed: the operands holding offloaded state and their bonsai.states.
    SmallVector<unsigned> streamedOperands;
    SmallVector<StateOp> states;
    /// On the host: the parameter operand (its state is `states`).
    unsigned param = 0;
  };

  /// What the rewrites moved, for the summary remark and the statistics.
  struct OffloadTotals {
    int64_t hostUpdates = 0, streamedUpdates = 0;
    int64_t tensors = 0, stateBytes = 0;
    int64_t toHost = 0, toDevice = 0; // per step
  };

  /// Whether `update` may run on the host: it has a host implementation over a bonsai.param.
  /// With `update "host"` (`required`) an update that cannot is an error naming it; so is one
  /// that keeps fp32 master weights the request leaves on the device.
  FailureOr<bool> canRunOnHost(func::FuncOp function, OptimizerStateOpInterface update,
                               const OffloadRequest &request, bool required) {
    std::optional<unsigned> param = update.getHostStepParamOperand();
    if (!param) {
      if (!required)
        return false;
      update->emitOpError() << "has no host implementation (AdamW and SGD have one), so update "
                               "\"host\" cannot run it; keep update \"device\" for this recipe";
      return failure();
    }
    if (!update->getOperand(*param).getDefiningOp<ParamOp>()) {
      if (!required)
        return false;
      update->emitOpError() << "updates operand #" << *param
                            << ", which is not a bonsai.param: it cannot run on the host";
      return failure();
    }
    if (!update.getMasterWeightOperands().empty() && !request.masterWeights) {
      emitError(request.loc) << (required ? "update \"host\" runs" : "update \"auto\" may run")
                             << " each update over its state in pinned host memory, and '"
                             << function.getSymName()
                             << "' keeps fp32 master weights: offload 'master_weights' too";
      return failure();
    }
    return true;
  }

  LogicalResult offload(func::FuncOp function, const OffloadRequest &request) {
    if (request.activations && !function
                                    .walk([](Operation *op) {
                                      auto phase = op->getAttrOfType<StringAttr>(
                                          BonsaiDialect::getPhaseAttrName());
                                      return phase && phase.getValue() == "backward"
                                                 ? WalkResult::interrupt()
                                                 : WalkResult::advance();
                                    })
                                    .wasInterrupted())
      return emitError(request.loc)
             << "cannot offload 'activations': '" << function.getSymName()
             << "' has no backward pass (the recipe has no bonsai.optimizer), so it keeps no "
                "activations for one";
    if (!request.optimizerState && !request.masterWeights)
      return success(); // Activations only: bonsai-remat offloads them.
    SmallVector<OptimizerStateOpInterface> updates;
    function.walk([&](OptimizerStateOpInterface update) { updates.push_back(update); });
    if (failed(checkClassesExist(function, updates, request)))
      return failure();

    // Where each update runs.
    SmallVector<bool> hostCapable;
    for (OptimizerStateOpInterface update : updates) {
      bool capable = false;
      if (request.place != UpdatePlace::Device) {
        FailureOr<bool> host =
            canRunOnHost(function, update, request, request.place == UpdatePlace::Host);
        if (failed(host))
          return failure();
        capable = *host;
      }
      hostCapable.push_back(capable);
    }
    SmallVector<bool> onHost = hostCapable;
    if (request.place == UpdatePlace::Auto) {
      FailureOr<SmallVector<bool>> chosen =
          chooseUpdatePlaces(function, updates, hostCapable, request);
      if (failed(chosen))
        return failure();
      onHost = std::move(*chosen);
    }

    // Validate every update before rewriting any, so that a failure leaves the function as
    // it was.
    SmallVector<UpdateRewrite> rewrites;
    for (auto [update, host] : llvm::zip(updates, onHost)) {
      UpdateRewrite rewrite{update, host, {}, {}, 0};
      if (host) {
        rewrite.param = *update.getHostStepParamOperand();
        FailureOr<SmallVector<StateOp>> states = getHostStepStates(update, rewrite.param);
        if (failed(states))
          return failure();
        rewrite.states = std::move(*states);
      } else {
        rewrite.streamedOperands = getOffloadedOperands(update, request);
        if (rewrite.streamedOperands.empty())
          continue;
        for (unsigned index : rewrite.streamedOperands) {
          FailureOr<StateOp> state = getStateReadByItsUpdateAlone(update, index);
          if (failed(state))
            return failure();
          rewrite.states.push_back(*state);
        }
      }
      rewrites.push_back(std::move(rewrite));
    }

    OffloadTotals totals;
    for (UpdateRewrite &rewrite : rewrites) {
      if (rewrite.onHost)
        runOnHost(rewrite, totals);
      else
        streamThroughDevice(rewrite, totals);
    }
    numOffloaded += totals.tensors;
    bytesOffloaded += totals.stateBytes;
    InFlightDiagnostic remark = emitRemark(request.loc) << "offload: ";
    if (request.place == UpdatePlace::Device) {
      remark << totals.tensors << " state tensors of '" << function.getSymName() << "' ("
             << formatBytes(totals.stateBytes)
             << ") in pinned host memory, each copied to the device before its update and back "
                "after it: "
             << formatBytes(totals.toDevice) << " over PCIe each way per step";
      return success();
    }
    if (request.place == UpdatePlace::Host)
      remark << totals.hostUpdates << " updates of '" << function.getSymName()
             << "' run on the host";
    else
      remark << totals.hostUpdates << " updates of '" << function.getSymName()
             << "' run on the host and " << totals.streamedUpdates
             << " stream their state through the device";
    remark << " over " << totals.tensors << " state tensors (" << formatBytes(totals.stateBytes)
           << ") in pinned host memory: " << formatBytes(totals.toHost)
           << " over PCIe to the host and " << formatBytes(totals.toDevice)
           << " to the device per step";
    return success();
  }

  /// `update "auto"`: simulates the step (UpdatePlacement.h) with the compute stream's time
  /// estimated from each op's cost on the target and the updates' bytes, and puts each update
  /// that can run on the host where its work ends sooner. A remark gives the split, the
  /// predicted step and the two alternatives it was weighed against.
  FailureOr<SmallVector<bool>> chooseUpdatePlaces(func::FuncOp function,
                                                  ArrayRef<OptimizerStateOpInterface> updates,
                                                  ArrayRef<bool> hostCapable,
                                                  const OffloadRequest &request) {
    std::optional<TargetProfile> profile = lookupTargetProfile(target);
    if (!profile) {
      emitError(request.loc) << "unknown target '" << target << "'";
      return failure();
    }
    if (!profile->hasOffloadRates()) {
      emitError(request.loc)
          << "update \"auto\" weighs the host against the link from the target's compute, "
             "memory and link rates, and target '"
          << target
          << "' has none: compile for a named GPU (docs/targets.md), or choose update \"host\" "
             "or \"device\"";
      return failure();
    }
    // The option overrides the profile's host rate.
    double hostRate = hostUpdateRate > 0 ? hostUpdateRate : profile->hostUpdateGParamsPerSecond;
    StepRates stepRates = achievedStepRates(*profile, hostRate);
    const OffloadRates &rates = stepRates.offload;

    // Each update is ready when the compute stream reaches the op of the body that holds it
    // (the update itself today).
    Block &body = function.getBody().front();
    llvm::DenseMap<Operation *, SmallVector<size_t>> updatesIn;
    for (auto [i, update] : llvm::enumerate(updates))
      updatesIn[body.findAncestorOpInBlock(*update)].push_back(i);
    std::vector<UpdateWork> work(updates.size());
    double clock = 0;
    for (Operation &op : body) {
      auto it = updatesIn.find(&op);
      if (it == updatesIn.end()) {
        clock += estimateOpSeconds(&op, stepRates);
        continue;
      }
      for (size_t i : it->second) {
        OptimizerStateOpInterface update = updates[i];
        UpdateWork &w = work[i];
        w.readySeconds = clock;
        w.deviceSeconds = estimateOpSeconds(update, stepRates);
        w.canRunOnHost = hostCapable[i];
        for (unsigned index : getOffloadedOperands(update, request))
          w.streamedBytes += getStorageBytes(update->getOperand(index).getType());
        if (!w.canRunOnHost)
          continue;
        Type paramType = update->getOperand(*update.getHostStepParamOperand()).getType();
        w.params = cast<ShapedType>(paramType).getNumElements();
        w.toDeviceBytes = getStorageBytes(paramType);
        SmallVector<unsigned> inPlace =
            cast<KernelOpInterface>(update.getOperation()).getInPlaceOperands();
        for (OpOperand &operand : update->getOpOperands())
          if (!llvm::is_contained(inPlace, operand.getOperandNumber()))
            w.toHostBytes += getStorageBytes(operand.get().getType());
      }
    }

    UpdatePlacement split = placeUpdates(work, clock, rates, UpdatePolicy::Split);
    UpdatePlacement allHost = placeUpdates(work, clock, rates, UpdatePolicy::Host);
    UpdatePlacement streamed = placeUpdates(work, clock, rates, UpdatePolicy::Streamed);
    // The greedy split is not optimal: where a single placement is predicted sooner, it wins.
    UpdatePlacement chosen = split;
    for (const UpdatePlacement *single : {&allHost, &streamed})
      if (single->stepSeconds() < chosen.stepSeconds())
        chosen = *single;
    int64_t hostParams = 0, streamedParams = 0, hostCount = 0;
    for (auto [w, host] : llvm::zip(work, chosen.onHost)) {
      (host ? hostParams : streamedParams) += w.params;
      hostCount += host;
    }
    auto seconds = [](double s) { return llvm::formatv("{0:F3} ms", s * 1e3).str(); };
    InFlightDiagnostic remark = emitRemark(request.loc);
    remark << "offload: update \"auto\" puts " << hostCount << " of " << updates.size()
           << " updates on the host (" << hostParams << " parameters) and streams the rest";
    if (streamedParams)
      remark << " (" << streamedParams << " parameters with a host implementation)";
    remark << ": predicted step " << seconds(chosen.stepSeconds()) << " (compute "
           << seconds(chosen.computeSeconds) << " with " << seconds(chosen.stallSeconds)
           << " waiting for streamed state, host until " << seconds(chosen.hostSeconds)
           << ", copies until " << seconds(std::max(chosen.toDeviceSeconds, chosen.toHostSeconds))
           << "), against " << seconds(split.stepSeconds()) << " split update by update, "
           << seconds(allHost.stepSeconds()) << " with every update on the host and "
           << seconds(streamed.stepSeconds()) << " with every update streamed, at "
           << llvm::formatv("{0:F1}", rates.linkBytesPerSecond / 1e9).str() << " GB/s each way and "
           << llvm::formatv("{0:F2}", hostRate).str()
           << " G parameters/s on the host; the compute is estimated from each op's cost, "
              "before recomputation";
    return SmallVector<bool>(chosen.onHost.begin(), chosen.onHost.end());
  }

  /// Streams the update's state through the device: each state in pinned host memory, copied
  /// to the device right before the update, which updates the copy, and back right after it.
  void streamThroughDevice(UpdateRewrite &rewrite, OffloadTotals &totals) {
    auto pinned = MemorySpaceAttr::get(&getContext(), MemorySpace::PinnedHost);
    Operation *update = rewrite.update;
    OpBuilder builder(update);
    Attribute phase = update->getAttr(BonsaiDialect::getPhaseAttrName());
    SmallVector<std::pair<Value, Value>> copies; // (device copy, host state)
    for (auto [index, state] : llvm::zip(rewrite.streamedOperands, rewrite.states)) {
      state.setPlacementAttr(pinned);
      auto copy = CopyH2DOp::create(builder, update->getLoc(), state.getType(), state);
      if (phase)
        copy->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
      update->setOperand(index, copy.getResult());
      copies.push_back({copy.getResult(), state.getResult()});
      int64_t size = getStorageBytes(state.getType());
      ++totals.tensors;
      totals.stateBytes += size;
      totals.toHost += size;
      totals.toDevice += size;
      if (perTensorRemarks)
        emitRemark(state.getLoc())
            << "'" << state.getName() << "' (" << formatBytes(size)
            << ") is kept in pinned host memory; its update copies it to the device and back";
    }
    builder.setInsertionPointAfter(update);
    for (auto [device, host] : copies) {
      auto back = CopyD2HOp::create(builder, update->getLoc(), device, host);
      if (phase)
        back->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
    }
    ++totals.streamedUpdates;
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

  /// Runs the update on the host over its state in pinned host memory and a pinned host copy
  /// of its parameter; the tensors it only reads are copied to the host right before it and
  /// the parameter's copy into the parameter right after it.
  void runOnHost(UpdateRewrite &rewrite, OffloadTotals &totals) {
    auto pinned = MemorySpaceAttr::get(&getContext(), MemorySpace::PinnedHost);
    Operation *update = rewrite.update;
    Attribute phase = update->getAttr(BonsaiDialect::getPhaseAttrName());
    auto inPhase = [&](Operation *op) {
      if (phase)
        op->setAttr(BonsaiDialect::getPhaseAttrName(), phase);
    };
    for (StateOp state : rewrite.states) {
      state.setPlacementAttr(pinned);
      int64_t size = getStorageBytes(state.getType());
      ++totals.tensors;
      totals.stateBytes += size;
      if (perTensorRemarks)
        emitRemark(state.getLoc())
            << "'" << state.getName() << "' (" << formatBytes(size)
            << ") is kept in pinned host memory, where its update runs on the host";
    }
    OpBuilder builder(update);
    auto param = update->getOperand(rewrite.param).getDefiningOp<ParamOp>();
    auto copy = StateOp::create(builder, param.getLoc(), param.getType(), StateKind::Optimizer,
                                (param.getName() + ".host_copy").str(),
                                builder.getStringAttr(param.getName()));
    copy.setPlacementAttr(pinned);
    totals.stateBytes += getStorageBytes(param.getType());
    ++totals.tensors;
    // What the update only reads comes to the host first.
    SmallVector<unsigned> inPlace = cast<KernelOpInterface>(update).getInPlaceOperands();
    for (OpOperand &operand : update->getOpOperands()) {
      if (llvm::is_contained(inPlace, operand.getOperandNumber()))
        continue;
      auto staged =
          CopyToHostOp::create(builder, update->getLoc(), operand.get().getType(), operand.get());
      inPhase(staged);
      totals.toHost += getStorageBytes(operand.get().getType());
      operand.set(staged.getResult());
    }
    update->setOperand(rewrite.param, copy.getResult());
    builder.setInsertionPointAfter(update);
    inPhase(CopyToDeviceOp::create(builder, update->getLoc(), copy.getResult(), param));
    totals.toDevice += getStorageBytes(param.getType());
    ++totals.hostUpdates;
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
