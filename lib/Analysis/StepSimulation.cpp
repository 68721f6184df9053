//===- StepSimulation.cpp - A scheduled step on its streams, simulated ----===//
//
// See StepSimulation.h. The waits are derived as the runtime's loader derives them
// (runtime/src/StreamOrder.cpp): the simulation has to see the waits the memory plan makes
// (a staging buffer reused by the next host update's gradient, a prefetched copy landing
// where a compute kernel still reads), not only those the dataflow implies, because on an
// in-order stream one such wait holds up every copy behind it.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/StepSimulation.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <limits>
#include <map>

using namespace mlir::bonsai;

namespace {
bool conflict(const std::vector<SimAccess> &a, const std::vector<SimAccess> &b) {
  for (const SimAccess &x : a)
    for (const SimAccess &y : b)
      if ((x.writes || y.writes) && x.arena == y.arena && x.begin < y.end && y.begin < x.end)
        return true;
  return false;
}

/// Per launch, the launches of other streams it waits for: within its phase, of each other
/// stream the latest conflicting one, unless an earlier wait already implies it (a vector
/// clock per stream of how many launches of each stream are known complete), as
/// bonsai::rt::orderStreams derives them.
std::vector<std::vector<size_t>> deriveWaits(const std::vector<SimLaunch> &launches) {
  using Clock = std::array<size_t, kNumSimStreams>;
  std::vector<std::vector<size_t>> waits(launches.size());
  for (unsigned phase = 0; phase < 3; ++phase) {
    std::array<std::vector<size_t>, kNumSimStreams> issued;
    std::array<std::vector<Clock>, kNumSimStreams> clockAfter;
    std::array<Clock, kNumSimStreams> known{};
    for (size_t index = 0; index < launches.size(); ++index) {
      const SimLaunch &launch = launches[index];
      if (launch.phase != phase)
        continue;
      unsigned s = unsigned(launch.stream);
      for (unsigned t = 0; t < kNumSimStreams; ++t) {
        if (t == s)
          continue;
        for (size_t j = issued[t].size(); j-- > known[s][t];) {
          size_t other = issued[t][j];
          if (!conflict(launch.accesses, launches[other].accesses))
            continue;
          waits[index].push_back(other);
          for (unsigned u = 0; u < kNumSimStreams; ++u)
            known[s][u] = std::max(known[s][u], clockAfter[t][j][u]);
          break;
        }
      }
      issued[s].push_back(index);
      known[s][s] = issued[s].size();
      clockAfter[s].push_back(known[s]);
    }
  }
  return waits;
}

/// The intervals a resource (a direction of the link, the host) is busy, disjoint and merged.
class BusyTimeline {
public:
  /// Places `seconds` of work from `from` on in the idle time, after the work placed before
  /// it (a copy sharing a direction with the copies of another stream); returns when it ends.
  double occupy(double from, double seconds) {
    busySeconds += seconds;
    double t = skipBusy(from);
    double remaining = seconds;
    while (remaining > 0) {
      auto next = busy.upper_bound(t);
      double gapEnd = next == busy.end() ? std::numeric_limits<double>::infinity() : next->first;
      double take = std::min(remaining, gapEnd - t);
      add(t, t + take);
      remaining -= take;
      t += take;
      if (remaining > 0)
        t = skipBusy(t);
    }
    return t;
  }

  /// The seconds of [begin, end) it is busy.
  double covered(double begin, double end) const {
    double total = 0;
    auto it = busy.upper_bound(begin);
    if (it != busy.begin())
      --it;
    for (; it != busy.end() && it->first < end; ++it)
      total += std::max(0.0, std::min(end, it->second) - std::max(begin, it->first));
    return total;
  }

  double busySeconds = 0;

private:
  /// `t`, or the end of the busy interval it falls in.
  double skipBusy(double t) const {
    auto next = busy.upper_bound(t);
    if (next != busy.begin() && std::prev(next)->second > t)
      return std::prev(next)->second;
    return t;
  }

  void add(double begin, double end) {
    auto it = busy.emplace(begin, end).first;
    // Merge with the interval before (which may end where this begins) and those after.
    if (it != busy.begin() && std::prev(it)->second >= begin) {
      auto before = std::prev(it);
      before->second = std::max(before->second, end);
      busy.erase(it);
      it = before;
    }
    for (auto after = std::next(it); after != busy.end() && after->first <= it->second;
         after = busy.erase(after))
      it->second = std::max(it->second, after->second);
  }

  std::map<double, double> busy;
};

/// What the resources were busy with in a pass of the simulation.
struct Timelines {
  BusyTimeline toDevice, toHost, host;
};

/// `seconds` of work at `share` of its rate for `fraction` of its time, at its full rate for
/// the rest.
double slowed(double seconds, double share, double fraction) {
  return seconds / (1 - (1 - share) * std::clamp(fraction, 0.0, 1.0));
}

/// One pass of the simulation, the contention taken from the resources' busy times in
/// `previous` (none in the first pass).
SimulatedStep simulatePass(const std::vector<SimLaunch> &launches,
                           const std::vector<std::vector<size_t>> &waits, int64_t microBatches,
                           const SimMachine &machine, const Timelines *previous,
                           Timelines &timelines) {
  std::vector<double> ends(launches.size(), 0);
  SimulatedStep step;
  double clock = 0;
  auto runPhase = [&](unsigned phase) {
    std::array<double, kNumSimStreams> free;
    free.fill(clock);
    double phaseEnd = clock;
    for (size_t i = 0; i < launches.size(); ++i) {
      const SimLaunch &launch = launches[i];
      if (launch.phase != phase)
        continue;
      // In order, every launch takes the compute stream's place.
      unsigned s = phase == 2 && machine.updateInOrder ? 0 : unsigned(launch.stream);
      double start = free[s];
      for (size_t other : waits[i])
        start = std::max(start, ends[other]);
      double seconds = launch.seconds, end;
      auto share = [&](const BusyTimeline &other) {
        return seconds > 0 ? other.covered(start, start + seconds) / seconds : 0.0;
      };
      if (launch.link == SimLink::ToDevice) {
        if (previous)
          seconds = slowed(seconds, machine.toDeviceUnderHost, share(previous->host));
        end = timelines.toDevice.occupy(start, seconds);
      } else if (launch.link == SimLink::ToHost) {
        if (previous)
          seconds = slowed(seconds, machine.toHostUnderHost, share(previous->host));
        end = timelines.toHost.occupy(start, seconds);
      } else if (launch.stream == SimStream::Host) {
        if (previous)
          seconds = slowed(seconds, machine.hostUnderCopies,
                           (share(previous->toDevice) + share(previous->toHost)) / 2);
        end = timelines.host.occupy(start, seconds);
        step.hostSeconds += seconds;
      } else {
        end = start + seconds;
        if (launch.stream == SimStream::Compute)
          step.kernelSeconds += seconds;
      }
      ends[i] = end;
      free[s] = end;
      phaseEnd = std::max(phaseEnd, end);
    }
    // The runtime joins every stream at the end of a phase.
    clock = phaseEnd;
  };
  for (int64_t run = 0; run < std::max<int64_t>(microBatches, 1); ++run) {
    runPhase(0);
    runPhase(1);
  }
  runPhase(2);
  step.stepSeconds = clock;
  step.exposedSeconds = std::max(0.0, step.stepSeconds - step.kernelSeconds);
  step.toDeviceSeconds = timelines.toDevice.busySeconds;
  step.toHostSeconds = timelines.toHost.busySeconds;
  return step;
}
} // namespace

SimulatedStep mlir::bonsai::simulateStep(const std::vector<SimLaunch> &launches,
                                         int64_t microBatches, const SimMachine &machine) {
  std::vector<std::vector<size_t>> waits = deriveWaits(launches);
  // Contention depends on what overlaps, which depends on the contention: each pass takes it
  // from the one before. Three passes settle it to well under a percent on the plans of
  // docs/offload.md.
  constexpr int kPasses = 3;
  Timelines timelines[2];
  SimulatedStep step;
  for (int pass = 0; pass < kPasses; ++pass) {
    Timelines &current = timelines[pass % 2];
    current = Timelines();
    step = simulatePass(launches, waits, microBatches, machine,
                        pass ? &timelines[(pass + 1) % 2] : nullptr, current);
  }
  return step;
}
