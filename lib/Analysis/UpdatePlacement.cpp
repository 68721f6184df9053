//===- UpdatePlacement.cpp - Host or streamed, per optimizer update -------===//
//
// A list simulation of the step's updates over four resources: the compute stream, the two
// directions of the link and the host's cores (see UpdatePlacement.h).
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/UpdatePlacement.h"

#include <algorithm>

using namespace mlir::bonsai;

double UpdatePlacement::stepSeconds() const {
  return std::max({computeSeconds, hostSeconds, toDeviceSeconds, toHostSeconds});
}

namespace {
/// Where the resources stand after the updates simulated so far.
struct Timeline {
  double shift = 0;         ///< the compute stream's waits so far
  double toDevice = 0;      ///< the host-to-device direction is free from here
  double toHost = 0;        ///< the device-to-host direction is free from here
  double host = 0;          ///< the host stream is free from here
  double results = 0;       ///< the stream of the host updates' copies back is free from here
  double streamedIssue = 0; ///< the previous streamed update's start (its successor's
                            ///< state is copied in from there on)
  double deviceUpdates = 0; ///< the streamed updates' kernels on the compute stream
  int64_t toDeviceBytes = 0;
  int64_t toHostBytes = 0;
};

/// `update` run on the host: its gradient out after the transfers queued before it, the host
/// steps one after another, each parameter's copy back after its step on a stream of their
/// own (bonsai-schedule's host-results stream). Returns when its copy back ends.
double runOnHost(Timeline &t, const UpdateWork &update, const OffloadRates &rates) {
  double ready = update.readySeconds + t.shift;
  double gradient = std::max(ready, t.toHost) + update.toHostBytes / rates.linkBytesPerSecond;
  t.toHost = gradient;
  t.host = std::max(gradient, t.host) + double(update.params) / rates.hostParamsPerSecond;
  double back = update.toDeviceBytes / rates.linkBytesPerSecond;
  t.results = std::max(t.host, t.results) + back;
  // The copy back is not in the copy stream's queue, but it shares the direction's bandwidth.
  t.toDevice += back;
  t.toHostBytes += update.toHostBytes;
  t.toDeviceBytes += update.toDeviceBytes;
  return t.results;
}

/// `update` streamed: its state copied in from the previous streamed update's start on, the
/// compute stream waiting for it, the update there, its state copied out. Returns when the
/// copy out ends; adds the wait to the timeline's shift.
double streamThroughDevice(Timeline &t, const UpdateWork &update, const OffloadRates &rates) {
  double ready = update.readySeconds + t.shift;
  double copy = update.streamedBytes / rates.linkBytesPerSecond;
  double in = std::max({t.toDevice, t.streamedIssue, update.earliestCopySeconds}) + copy;
  t.toDevice = in;
  double start = std::max(ready, in);
  t.shift += start - ready + update.deviceSeconds;
  t.deviceUpdates += update.deviceSeconds;
  t.streamedIssue = start;
  double out = std::max(start + update.deviceSeconds, t.toHost) + copy;
  t.toHost = out;
  t.toHostBytes += update.streamedBytes;
  t.toDeviceBytes += update.streamedBytes;
  return out;
}
} // namespace

namespace {
/// Simulates `updates` in order, each placed by `place(t, i)` given the timeline so far.
template <typename Place>
UpdatePlacement simulate(const std::vector<UpdateWork> &updates, double computeSeconds,
                         const OffloadRates &rates, Place place) {
  UpdatePlacement placement;
  Timeline t;
  for (size_t i = 0; i < updates.size(); ++i) {
    const UpdateWork &update = updates[i];
    bool onHost = place(t, i);
    placement.onHost.push_back(onHost);
    if (onHost)
      runOnHost(t, update, rates);
    else
      streamThroughDevice(t, update, rates);
  }
  placement.computeSeconds = computeSeconds + t.shift;
  placement.stallSeconds = t.shift - t.deviceUpdates;
  placement.hostSeconds = t.host;
  placement.toDeviceSeconds = std::max(t.toDevice, t.results);
  placement.toHostSeconds = t.toHost;
  placement.toDeviceBytes = t.toDeviceBytes;
  placement.toHostBytes = t.toHostBytes;
  return placement;
}
} // namespace

UpdatePlacement mlir::bonsai::simulateUpdates(const std::vector<UpdateWork> &updates,
                                              double computeSeconds, const OffloadRates &rates,
                                              const std::vector<bool> &onHost) {
  return simulate(updates, computeSeconds, rates,
                  [&](const Timeline &, size_t i) { return i < onHost.size() && onHost[i]; });
}

UpdatePlacement mlir::bonsai::placeUpdates(const std::vector<UpdateWork> &updates,
                                           double computeSeconds, const OffloadRates &rates,
                                           UpdatePolicy policy) {
  return simulate(updates, computeSeconds, rates, [&](const Timeline &t, size_t i) {
    const UpdateWork &update = updates[i];
    bool onHost = update.canRunOnHost && policy != UpdatePolicy::Streamed;
    if (onHost && policy == UpdatePolicy::Split) {
      Timeline host = t, streamed = t;
      double hostEnd = runOnHost(host, update, rates);
      double streamedEnd = streamThroughDevice(streamed, update, rates);
      // A wait of the compute stream delays every later gradient as well as this update.
      double wait = streamed.shift - t.shift - update.deviceSeconds;
      onHost = hostEnd <= streamedEnd + wait;
    }
    return onHost;
  });
}
