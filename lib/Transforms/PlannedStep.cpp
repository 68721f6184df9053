//===- PlannedStep.cpp - A step's memory plan and its simulation ----------===//
//
// See PlannedStep.h.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Transforms/PlannedStep.h"

#include "bonsai/Analysis/MemoryPlanner.h"
#include "bonsai/Analysis/StepTime.h"
#include "bonsai/Target/TargetProfile.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringMap.h"

using namespace mlir;
using namespace mlir::bonsai;

int64_t mlir::bonsai::planStepBuffers(plan::StepOp step) {
  using plan::BufferOp;
  Block &body = step.getBody().front();
  llvm::StringMap<plan::ArenaOp> arenas;
  for (auto arena : body.getOps<plan::ArenaOp>())
    arenas[arena.getSymName()] = arena;

  // Live interval of every buffer: the positions of the ops that touch it, through views.
  // Position 0 is before the first op (inputs), `end` after the last (the loss).
  llvm::MapVector<Operation *, BufferInterval> live;
  for (auto buffer : body.getOps<BufferOp>()) {
    BufferInterval interval{buffer.getSizeInBytes(), INT64_MAX, INT64_MIN};
    // The runtime writes inputs and the loss scale before the first op.
    if (buffer.getRole() == plan::BufferRole::Input ||
        buffer.getRole() == plan::BufferRole::LossScale)
      interval.firstUse = 0;
    live[buffer] = interval;
  }
  int64_t position = 1;
  for (Operation &op : body) {
    if (isa<plan::ArenaOp, BufferOp, plan::ViewOp>(op))
      continue;
    for (Value operand : op.getOperands())
      if (BufferOp buffer = plan::getUnderlyingBuffer(operand)) {
        BufferInterval &interval = live[buffer];
        interval.firstUse = std::min(interval.firstUse, position);
        interval.lastUse = std::max(interval.lastUse, position);
      }
    ++position;
  }
  for (auto &[op, interval] : live) {
    // The runtime reads the loss and the metrics after the last op; inputs and the loss
    // scale, which the runtime writes, are never reused within a step (they are small, and
    // the runtime may read them back, to report or to generate).
    plan::BufferRole role = cast<BufferOp>(op).getRole();
    if (role == plan::BufferRole::Loss || role == plan::BufferRole::Metric ||
        role == plan::BufferRole::Input || role == plan::BufferRole::LossScale)
      interval.lastUse = position;
    if (interval.firstUse == INT64_MAX) // Never used: give it a slot of its own moment.
      interval.firstUse = interval.lastUse = 0;
    interval.lastUse = std::max(interval.lastUse, interval.firstUse);
  }

  int64_t bytesSaved = 0;
  for (auto &[name, arena] : arenas) {
    int64_t alignment = arena.getAlignmentAttr().getInt();
    SmallVector<BufferOp> buffers;
    std::vector<BufferInterval> intervals;
    for (auto &[op, interval] : live) {
      auto buffer = cast<BufferOp>(op);
      if (buffer.getArena() != name)
        continue;
      buffers.push_back(buffer);
      intervals.push_back(interval);
    }
    MemoryPlan memoryPlan;
    if (arena.getLifetime() == plan::Lifetime::Persistent) {
      // Persistent state is live for the whole run: one after another.
      int64_t offset = 0;
      for (const BufferInterval &b : intervals) {
        memoryPlan.offsets.push_back(offset);
        offset = alignTo(offset + b.size, alignment);
      }
      memoryPlan.peak = offset;
    } else {
      memoryPlan = planGreedyBySize(intervals, alignment);
      int64_t withoutReuse = 0;
      for (const BufferInterval &b : intervals)
        withoutReuse += alignTo(b.size, alignment);
      bytesSaved += withoutReuse - memoryPlan.peak;
    }
    OpBuilder builder(arena);
    for (auto [buffer, offset] : llvm::zip(buffers, memoryPlan.offsets))
      buffer.setOffsetAttr(builder.getI64IntegerAttr(offset));
    arena.setSize(memoryPlan.peak);
  }
  return bytesSaved;
}

std::optional<std::vector<SimLaunch>> mlir::bonsai::collectSimLaunches(plan::StepOp step) {
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

SimMachine mlir::bonsai::runtimeMachine(const TargetProfile &profile) {
  StepRates rates = sustainedStepRates(profile, profile.hostUpdateGParamsPerSecond);
  SimMachine machine;
  machine.toDeviceUnderHost = rates.toDeviceShareUnderHost;
  machine.toHostUnderHost = rates.toHostShareUnderHost;
  machine.hostUnderCopies = rates.hostShareUnderCopies;
  // The CUDA backend runs the update phase in a conditional graph node, whose body runs
  // its streams' launches one after another (docs/benchmarks.md, 2026-12-03).
  machine.updateInOrder = true;
  return machine;
}
