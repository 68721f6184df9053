//===- StreamOrder.cpp - Which kernels of other streams a kernel waits for -===//
//
// A plan issues the copies of offloaded state on copy streams so that PCIe transfers overlap
// the compute stream's work (docs/offload.md, "Overlap"). The plan says only on which stream
// each kernel runs and in which order they are issued; what must finish before what is
// derived here, from the bytes each kernel reads and writes, so that the order the plan's
// single-stream meaning gives (what the CPU backend runs) is what every backend computes.
//
// Within a phase, in plan order, kernel k on stream s conflicts with an earlier kernel m on
// stream t != s when their tensors share bytes of one arena and at least one of them writes
// them (read-after-write, write-after-read or write-after-write). Kernel k then waits for the
// latest such m of stream t: a stream runs in order, so m's completion implies that of every
// earlier kernel of t. Each stream's knowledge is a vector clock (how many kernels of each
// stream are known complete), so that a conflict already implied by an earlier wait adds
// nothing, and only the kernels not yet known complete are compared.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Plan.h"

#include <algorithm>
#include <array>

namespace bonsai::rt {

const char *streamName(StreamId stream) {
  switch (stream) {
  case StreamId::Compute:
    return "compute";
  case StreamId::HostToDevice:
    return "host-to-device";
  case StreamId::DeviceToHost:
    return "device-to-host";
  case StreamId::Host:
    return "host";
  case StreamId::HostResults:
    return "host-results";
  case StreamId::Collectives:
    return "collectives";
  }
  return "unknown";
}

bool LoadedPlan::usesSideStreams() const {
  return std::any_of(kernels.begin(), kernels.end(),
                     [](const KernelInfo &k) { return k.stream != StreamId::Compute; });
}

bool LoadedPlan::hasHostSteps() const {
  return std::any_of(kernels.begin(), kernels.end(),
                     [](const KernelInfo &k) { return k.stream == StreamId::Host; });
}

bool LoadedPlan::offloads() const {
  return std::any_of(kernels.begin(), kernels.end(), [](const KernelInfo &k) {
    return k.stream == StreamId::Host || kernelKindInfo(k.kind).has(kernel_traits::kCrossesSpaces);
  });
}

LoadedPlan::PcieBytes LoadedPlan::pcieBytesPerStep(uint32_t microBatches) const {
  PcieBytes bytes;
  for (const KernelInfo &k : kernels) {
    if (!kernelKindInfo(k.kind).has(kernel_traits::kCrossesSpaces) || k.outputs.empty())
      continue;
    uint64_t moved = tensors[k.outputs[0]].bytes * (k.phase == Phase::Update ? 1 : microBatches);
    (copiesToHost(k) ? bytes.deviceToHost : bytes.hostToDevice) += moved;
  }
  return bytes;
}

namespace {
/// Bytes [begin, end) of one arena that a kernel reads or writes.
struct Access {
  uint32_t arena;
  uint64_t begin, end;
  bool writes;
};

std::vector<Access> accessesOf(const LoadedPlan &plan, const KernelInfo &kernel) {
  std::vector<Access> accesses;
  auto add = [&](uint32_t index, bool writes) {
    const TensorInfo &t = plan.tensors[index];
    accesses.push_back({t.arena, t.offset, t.offset + t.bytes, writes});
  };
  for (uint32_t index : kernel.inputs)
    add(index, false);
  for (uint32_t index : kernel.outputs)
    add(index, true);
  return accesses;
}

bool conflict(const std::vector<Access> &a, const std::vector<Access> &b) {
  for (const Access &x : a)
    for (const Access &y : b)
      if ((x.writes || y.writes) && x.arena == y.arena && x.begin < y.end && y.begin < x.end)
        return true;
  return false;
}

using Clock = std::array<size_t, kNumStreams>;
} // namespace

void orderStreams(LoadedPlan &plan) {
  for (KernelInfo &k : plan.kernels) {
    k.waits.clear();
    k.signals = false;
  }
  if (!plan.usesSideStreams())
    return;
  for (Phase phase : {Phase::Forward, Phase::Backward, Phase::Update}) {
    // Per stream: its kernels so far (plan indices), their accesses, and the clock each one
    // completes with (what is known complete once it is).
    std::array<std::vector<size_t>, kNumStreams> issued;
    std::array<std::vector<std::vector<Access>>, kNumStreams> accesses;
    std::array<std::vector<Clock>, kNumStreams> clockAfter;
    std::array<Clock, kNumStreams> known{};
    for (size_t index = 0; index < plan.kernels.size(); ++index) {
      KernelInfo &kernel = plan.kernels[index];
      if (kernel.phase != phase)
        continue;
      unsigned s = unsigned(kernel.stream);
      std::vector<Access> mine = accessesOf(plan, kernel);
      for (unsigned t = 0; t < kNumStreams; ++t) {
        if (t == s)
          continue;
        for (size_t j = issued[t].size(); j-- > known[s][t];) {
          if (!conflict(mine, accesses[t][j]))
            continue;
          size_t other = issued[t][j];
          kernel.waits.push_back(uint32_t(other));
          plan.kernels[other].signals = true;
          for (unsigned u = 0; u < kNumStreams; ++u)
            known[s][u] = std::max(known[s][u], clockAfter[t][j][u]);
          break;
        }
      }
      std::sort(kernel.waits.begin(), kernel.waits.end());
      issued[s].push_back(index);
      accesses[s].push_back(std::move(mine));
      known[s][s] = issued[s].size();
      clockAfter[s].push_back(known[s]);
    }
  }
}

} // namespace bonsai::rt
