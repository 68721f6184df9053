//===- StepSimulation.h - A scheduled step on its streams, simulated ------===//
//
// The step time bonsai-compile predicts (docs/offload.md, "Predicted step time") is that of
// the plan as the runtime will run it: each launch on its stream, in plan order, waiting for
// the launches of other streams whose bytes it shares (the runtime's orderStreams, from the
// memory plan), the copies of one direction sharing that direction of the link, every stream
// joined at the end of a phase. The durations come from the model-level op timing
// (StepTime.h, bonsai-time-ops). Plain figures, so that it can be tested without MLIR;
// bonsai-predict-step reads them from a planned `bonsai_plan.step`.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_ANALYSIS_STEPSIMULATION_H
#define BONSAI_ANALYSIS_STEPSIMULATION_H

#include "bonsai/Dialect/Plan/IR/PlanStreams.h"

#include <cstdint>
#include <vector>

namespace mlir::bonsai {

/// The runtime's streams, as bonsai-schedule assigns them.
using SimStream = plan::PlanStream;
inline constexpr unsigned kNumSimStreams = plan::kNumPlanStreams;

/// Which direction of the link a launch moves bytes over.
enum class SimLink { None, ToDevice, ToHost };

/// Bytes [begin, end) of one arena that a launch reads or writes.
struct SimAccess {
  unsigned arena = 0;
  int64_t begin = 0, end = 0;
  bool writes = false;
};

/// One launch of a scheduled step.
struct SimLaunch {
  SimStream stream = SimStream::Compute;
  /// 0 forward, 1 backward, 2 update (bonsai_plan's Phase).
  unsigned phase = 0;
  /// Its own time on its resource, from bonsai-time-ops.
  double seconds = 0;
  /// The direction whose bandwidth it takes (a copy), wherever it is issued.
  SimLink link = SimLink::None;
  std::vector<SimAccess> accesses;
};

/// A simulated step.
struct SimulatedStep {
  /// From the step's start to the end of its last phase, every stream joined.
  double stepSeconds = 0;
  /// The compute stream's kernels alone, copies issued on it excluded: what the step would
  /// take with no wait.
  double kernelSeconds = 0;
  /// stepSeconds - kernelSeconds: what the copies and the host add (the telemetry's
  /// "exposed" time, docs/offload.md).
  double exposedSeconds = 0;
  /// Seconds each direction of the link was busy, and the host stream's.
  double toDeviceSeconds = 0, toHostSeconds = 0, hostSeconds = 0;
};

/// How the machine and the runtime run what the launches say.
struct SimMachine {
  /// How the host's memory, which the host's optimizer and both directions of the link use,
  /// is shared: the share of its rate a copy to the device (to the host) keeps while the host
  /// stream runs, and the host stream while the link copies (the mean of both directions'
  /// busy shares).
  double toDeviceUnderHost = 1, toHostUnderHost = 1;
  double hostUnderCopies = 1;
  /// Whether the update phase runs its launches one after another whatever their streams
  /// (the CUDA backend's: the body of the conditional graph node that skips a non-finite
  /// step runs its streams' copies in order, docs/benchmarks.md).
  bool updateInOrder = false;
};

/// Simulates `launches` (plan order) for a step of `microBatches` runs of the forward and
/// backward phases and one update phase. Within a phase a launch starts when its stream is
/// free and every launch it waits for has ended: of each other stream, the latest earlier one
/// of its phase whose accesses overlap its own where one of the two writes (what the runtime
/// derives). A launch with a link takes that direction's bandwidth: it fills the direction's
/// idle time from its start on, so that two streams copying one way share it. Every stream
/// joins at the end of a phase. A copy or a host launch that overlaps the other resource runs
/// at `contention`'s share of its rate for the overlapping part (what overlaps taken from the
/// pass before; three passes).
SimulatedStep simulateStep(const std::vector<SimLaunch> &launches, int64_t microBatches,
                           const SimMachine &machine = {});

} // namespace mlir::bonsai

#endif // BONSAI_ANALYSIS_STEPSIMULATION_H
