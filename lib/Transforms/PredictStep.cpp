//===- PredictStep.cpp - The step time bonsai-compile predicts ------------===//
//
// The `bonsai-predict-step` pass (see Passes.td and docs/offload.md, "Predicted step time"):
// each planned step's launches as StepSimulation.h sees them (stream, phase, seconds, the
// bytes they touch, the link direction they take), simulated, the prediction recorded on the
// step for the plan and the compiler's report.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/StepSimulation.h"
#include "bonsai/Analysis/StepTime.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "bonsai/Target/TargetProfile.h"
#include "bonsai/Transforms/Passes.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIPREDICTSTEPPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// The launches of a planned `step` for the simulation; none when no launch carries its
/// seconds (bonsai-time-ops had no rates for the target).
std::optional<std::vector<SimLaunch>> collectLaunches(plan::StepOp step) {
  Block &body = step.getBody().front();
  llvm::StringMap<std::pair<unsigned, plan::MemorySpace>> arenas;
  for (auto arena : body.getOps<plan::ArenaOp>())
    arenas[arena.getSymName()] = {unsigned(arenas.size()), arena.getSpace()};
  std::vector<SimLaunch> launches;
  bool timed = false;
  for (auto launch : body.getOps<plan::LaunchOp>()) {
    SimLaunch sim;
    sim.stream = plan::PlanStream(launch.getStream());
    sim.phase = unsigned(launch.getPhase());
    if (auto seconds = launch->getAttrOfType<FloatAttr>(kOpSecondsAttr)) {
      sim.seconds = seconds.getValueAsDouble();
      timed = true;
    }
    bool readsHost = false, readsDevice = false, writesHost = false, writesDevice = false;
    auto access = [&](Value value, bool writes) {
      plan::BufferOp buffer = plan::getUnderlyingBuffer(value);
      if (!buffer || !buffer.getOffset())
        return;
      auto [arena, space] = arenas.lookup(buffer.getArena());
      bool host = space == plan::MemorySpace::PinnedHost;
      (writes ? (host ? writesHost : writesDevice) : (host ? readsHost : readsDevice)) = true;
      int64_t begin = *buffer.getOffset();
      sim.accesses.push_back(
          {arena, begin, begin + plan::getMemRefBytes(cast<MemRefType>(value.getType())), writes});
    };
    for (Value in : launch.getIns())
      access(in, false);
    for (Value out : launch.getOuts())
      access(out, true);
    // A copy crosses spaces (as bonsai-schedule tells them), on whichever stream it runs.
    if (readsHost && !readsDevice && writesDevice && !writesHost)
      sim.link = SimLink::ToDevice;
    else if (readsDevice && !readsHost && writesHost && !writesDevice)
      sim.link = SimLink::ToHost;
    launches.push_back(std::move(sim));
  }
  if (!timed)
    return std::nullopt;
  return launches;
}

struct PredictStepPass : impl::BonsaiPredictStepPassBase<PredictStepPass> {
  using Base::Base;

  void runOnOperation() override {
    std::optional<TargetProfile> profile = lookupTargetProfile(target);
    if (!profile) {
      getOperation().emitError() << "unknown target '" << target << "'";
      return signalPassFailure();
    }
    StepRates rates = sustainedStepRates(*profile, profile->hostUpdateGParamsPerSecond);
    SimMachine machine;
    machine.toDeviceUnderHost = rates.toDeviceShareUnderHost;
    machine.toHostUnderHost = rates.toHostShareUnderHost;
    machine.hostUnderCopies = rates.hostShareUnderCopies;
    // The CUDA backend runs the update phase in a conditional graph node, whose body runs
    // its streams' launches one after another (docs/benchmarks.md, 2026-12-03).
    machine.updateInOrder = true;
    Builder builder(&getContext());
    for (auto step : getOperation().getOps<plan::StepOp>()) {
      std::optional<std::vector<SimLaunch>> launches = collectLaunches(step);
      // The estimates were for this simulation; the plan does not carry them.
      for (auto launch : step.getBody().getOps<plan::LaunchOp>())
        launch->removeAttr(kOpSecondsAttr);
      if (!launches)
        continue;
      SimulatedStep prediction = simulateStep(*launches, step.getMicroBatches(), machine);
      step->setAttr("bonsai.predicted_step_seconds",
                    builder.getF64FloatAttr(prediction.stepSeconds));
      step->setAttr("bonsai.predicted_exposed_seconds",
                    builder.getF64FloatAttr(prediction.exposedSeconds));
      // The host steps' share, against which bonsai-run's measured host time (its metrics'
      // `host_step_s`) tells a slow host from a mis-simulated overlap.
      if (prediction.hostSeconds > 0)
        step->setAttr("bonsai.predicted_host_seconds",
                      builder.getF64FloatAttr(prediction.hostSeconds));
    }
  }
};

} // namespace
} // namespace mlir::bonsai
