//===- UpdatePlacement.h - Host or streamed, per optimizer update ---------===//
//
// With offloaded optimizer state an update can run on the CPU, over its state where it is
// kept (its gradient copied to the host, its parameter back), or on the device, its state
// streamed in before it and out after it. The two use different resources (the host's cores;
// the PCIe link), so a split of the updates between them finishes sooner than either alone.
// This is the simulation the offload pass's `update "auto"` decides with (docs/offload.md,
// "Choosing per update"): plain arithmetic over figures the pass computes from the IR and the
// target profile, so that it can be tested without MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_ANALYSIS_UPDATEPLACEMENT_H
#define BONSAI_ANALYSIS_UPDATEPLACEMENT_H

#include <cstdint>
#include <vector>

namespace mlir::bonsai {

/// The machine's rates the split depends on.
struct OffloadRates {
  /// Pinned host memory <-> device copies, each direction at once, bytes/s.
  double linkBytesPerSecond = 0;
  /// The CPU optimizer over every core, parameters/s.
  double hostParamsPerSecond = 0;
};

/// One optimizer update, in the order the step issues them.
struct UpdateWork {
  /// When its gradient is complete: the compute stream's work before it, in seconds, counting
  /// no update and no wait.
  double readySeconds = 0;
  /// The update kernel's time on the device when it runs there.
  double deviceSeconds = 0;
  /// Elements of the parameter it updates.
  int64_t params = 0;
  /// Bytes copied to the device before it, and the same back after it, when it is streamed.
  int64_t streamedBytes = 0;
  /// Bytes copied to the host before it (the gradient, the scalars) when it runs there.
  int64_t toHostBytes = 0;
  /// Bytes copied to the device after it (the parameter) when it runs there.
  int64_t toDeviceBytes = 0;
  /// Whether it has a host implementation.
  bool canRunOnHost = true;
  /// When its streamed state may start coming in: the start of its phase, within which
  /// bonsai-schedule hoists the copies (compute-stream time, as readySeconds).
  double earliestCopySeconds = 0;
};

/// Which updates `placeUpdates` puts where.
enum class UpdatePolicy {
  Streamed, ///< every update on the device, its state streamed
  Host,     ///< every update that can on the host, the others streamed
  Split,    ///< each update where the simulation finishes it sooner
};

/// The chosen placement and the simulated step.
struct UpdatePlacement {
  /// Per update: on the host (else streamed through the device).
  std::vector<bool> onHost;
  /// When the compute stream ends, its waits for streamed state included.
  double computeSeconds = 0;
  /// How long the compute stream waited for streamed state.
  double stallSeconds = 0;
  /// When the last host update ends.
  double hostSeconds = 0;
  /// When the last copy in each direction ends (to the device: the host updates' copies back
  /// included).
  double toDeviceSeconds = 0;
  double toHostSeconds = 0;
  /// Bytes over the link per step, each direction.
  int64_t toDeviceBytes = 0;
  int64_t toHostBytes = 0;

  /// The step's predicted time: the last of the compute stream, the host and the copies.
  double stepSeconds() const;
};

/// Simulates the step's updates under `policy`. The compute stream runs `computeSeconds` of
/// work with the updates at their ready times; a streamed update's state is copied in one
/// streamed update ahead (as bonsai-schedule issues it), the compute stream waits for it, the
/// update runs there and its state is copied out; a host update's gradient is copied out, the
/// host runs the updates one after another, and the parameter is copied back (on a stream of
/// its own, so the host does not wait for it). Each direction of the link carries one copy at
/// a time. With `Split`, each update in turn goes where its
/// work ends sooner, a wait of the compute stream counting twice (it delays every later
/// gradient).
UpdatePlacement placeUpdates(const std::vector<UpdateWork> &updates, double computeSeconds,
                             const OffloadRates &rates, UpdatePolicy policy);

/// The same simulation with the placement given: `onHost[i]` says whether update i runs on
/// the host (it must have a host implementation) or is streamed. What the step-time
/// prediction of a compiled step uses, whose placement is decided.
UpdatePlacement simulateUpdates(const std::vector<UpdateWork> &updates, double computeSeconds,
                                const OffloadRates &rates, const std::vector<bool> &onHost);

} // namespace mlir::bonsai

#endif // BONSAI_ANALYSIS_UPDATEPLACEMENT_H
