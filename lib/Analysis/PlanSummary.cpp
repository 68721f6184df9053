//===- PlanSummary.cpp - Planned memory of a step by class ----------------===//
//
// Sums buffer sizes by role and memory space, arena sizes by memory space, and the bytes the
// launches move between the two spaces.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Format.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::bonsai;

std::string mlir::bonsai::formatBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format(u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return s;
}

std::string mlir::bonsai::overBudgetAdvice(StringRef memoryClass, bool recomputing) {
  if (memoryClass == "weights")
    return "train low-rank adapters on a quantized frozen base (bonsai.lora with "
           "bonsai.quantize), or a bf16 model";
  if (memoryClass == "activations")
    return recomputing ? "keep them in host memory between the passes (bonsai.offload "
                         "[\"activations\"]), run the MLPs over chunks of the sequence "
                         "(bonsai.remat sequence_chunks), or lower the batch size or the "
                         "sequence length"
                       : "recompute activations (bonsai.remat), keep them in host memory "
                         "(bonsai.offload [\"activations\"]), run the MLPs over chunks of "
                         "the sequence (bonsai.remat sequence_chunks), or lower the batch size "
                         "or sequence length";
  if (memoryClass == "gradients")
    return "apply the updates in the backward pass (update_in_backward on bonsai.optimizer), "
           "or train adapters (bonsai.lora)";
  if (memoryClass == "optimizer state")
    return "keep it in pinned host memory (bonsai.offload [\"optimizer_state\"]), project the "
           "moments (bonsai.galore), or train adapters (bonsai.lora)";
  return "lower the batch size or the sequence length";
}

bool mlir::bonsai::isOverBudgetError(StringRef diagnostics) {
  SmallVector<StringRef> lines;
  diagnostics.split(lines, '\n');
  return llvm::any_of(lines, [](StringRef line) {
    return line.contains("error: ") && line.contains("budget") && line.contains(kOverBudget);
  });
}

PlanMemorySummary mlir::bonsai::summarizePlanMemory(plan::StepOp step) {
  PlanMemorySummary summary;
  int64_t stepArenas = 0;
  llvm::StringMap<bool> persistent, onHost;
  for (auto arena : step.getBody().getOps<plan::ArenaOp>()) {
    int64_t size = arena.getSizeAttr().getInt();
    bool host = arena.getSpace() == plan::MemorySpace::PinnedHost;
    (host ? summary.peakHost : summary.peakDevice) += size;
    persistent[arena.getSymName()] = arena.getLifetime() == plan::Lifetime::Persistent;
    onHost[arena.getSymName()] = host;
    if (arena.getLifetime() == plan::Lifetime::Step)
      (host ? summary.hostStaging : stepArenas) += size;
  }
  // Persistent classes are sums of their buffers; the per-step arenas' peak is split into the
  // inputs, workspace and per-step gradients they hold, and the activations (the rest).
  int64_t stepOther = 0;
  for (auto buffer : step.getBody().getOps<plan::BufferOp>()) {
    int64_t bytes = buffer.getSizeInBytes();
    bool inStepArena = !persistent.lookup(buffer.getArena());
    bool host = onHost.lookup(buffer.getArena());
    switch (buffer.getRole()) {
    case plan::BufferRole::Parameter:
      (host ? summary.hostWeights : summary.weights) += bytes;
      break;
    case plan::BufferRole::OptimizerState:
      (host ? summary.hostOptimizerState : summary.optimizerState) += bytes;
      break;
    case plan::BufferRole::Gradient:
      (host ? summary.hostGradients : summary.gradients) += bytes;
      stepOther += inStepArena ? bytes : 0;
      break;
    case plan::BufferRole::Input:
      summary.inputs += bytes;
      stepOther += inStepArena ? bytes : 0;
      break;
    case plan::BufferRole::Workspace:
      summary.workspace += bytes;
      stepOther += inStepArena ? bytes : 0;
      break;
    case plan::BufferRole::Activation:
    case plan::BufferRole::Loss:
    case plan::BufferRole::Metric:
    case plan::BufferRole::LossScale:
      break;
    }
    if (inStepArena)
      summary.stepBytesWithoutReuse += bytes;
  }
  summary.activations = std::max<int64_t>(0, stepArenas - stepOther);

  // A launch that reads a buffer of a pinned host arena moves it to the device; one that
  // writes one moves it back; one that touches pinned host buffers only runs on the host and
  // moves nothing. Forward and backward launches run once per micro-batch.
  int64_t microBatches = step.getMicroBatchesAttr().getInt();
  auto hostBytes = [&](Value operand) -> int64_t {
    plan::BufferOp buffer = plan::getUnderlyingBuffer(operand);
    if (!buffer || !onHost.lookup(buffer.getArena()))
      return 0;
    return plan::getMemRefBytes(cast<MemRefType>(operand.getType()));
  };
  for (auto launch : step.getBody().getOps<plan::LaunchOp>()) {
    bool onDevice = llvm::any_of(launch->getOperands(), [&](Value operand) {
      plan::BufferOp buffer = plan::getUnderlyingBuffer(operand);
      return buffer && !onHost.lookup(buffer.getArena());
    });
    if (!onDevice) {
      ++summary.hostSteps;
      continue;
    }
    summary.copyStreams |= launch.getStream() != 0;
    int64_t runs = launch.getPhase() == plan::Phase::Update ? 1 : microBatches;
    for (Value in : launch.getIns())
      summary.pcieHostToDevice += runs * hostBytes(in);
    for (Value out : launch.getOuts())
      summary.pcieDeviceToHost += runs * hostBytes(out);
  }
  return summary;
}

std::pair<const char *, int64_t> PlanMemorySummary::dominant() const {
  std::pair<const char *, int64_t> classes[] = {{"weights", weights},
                                                {"gradients", gradients},
                                                {"optimizer state", optimizerState},
                                                {"activations", activations},
                                                {"workspace", workspace},
                                                {"inputs", inputs}};
  auto best = classes[0];
  for (auto c : classes)
    if (c.second > best.second)
      best = c;
  return best;
}

void PlanMemorySummary::print(llvm::raw_ostream &os, int64_t budget, double linkGBs,
                              int64_t hostBudget) const {
  auto row = [&](const char *name, int64_t bytes) {
    os << "    " << llvm::left_justify(name, 17) << llvm::right_justify(formatBytes(bytes), 12)
       << "\n";
  };
  row("weights", weights);
  row("gradients", gradients);
  row("optimizer state", optimizerState);
  row("activations", activations);
  row("workspace", workspace);
  row("inputs", inputs);
  row("peak device", peakDevice);
  if (budget)
    row("budget", budget);
  os << "    (per-step buffers: " << formatBytes(stepBytesWithoutReuse)
     << " without reuse)\n";
  if (peakHost) {
    os << "  pinned host memory:\n";
    if (hostWeights)
      row("weights", hostWeights);
    if (hostGradients)
      row("gradients", hostGradients);
    if (hostOptimizerState)
      row("optimizer state", hostOptimizerState);
    if (hostStaging)
      row("staging", hostStaging);
    row("peak pinned host", peakHost);
    if (hostBudget)
      row("host budget", hostBudget);
    if (hostSteps)
      os << "  updates on the host: " << hostSteps << "\n";
    os << "  PCIe per step:\n";
    row("host to device", pcieHostToDevice);
    row("device to host", pcieDeviceToHost);
    if (linkGBs > 0) {
      // On the copy streams the two directions share the time; in order they add up.
      double each = double(std::max(pcieHostToDevice, pcieDeviceToHost)) / (linkGBs * 1e9);
      double both = double(pcieHostToDevice + pcieDeviceToHost) / (linkGBs * 1e9);
      std::string label, time;
      llvm::raw_string_ostream(label) << llvm::format("at %.0f GB/s", linkGBs);
      double seconds = copyStreams ? each : both;
      llvm::raw_string_ostream(time) << (seconds < 1e-3 ? llvm::format("%.1f us", seconds * 1e6)
                                         : seconds < 1  ? llvm::format("%.1f ms", seconds * 1e3)
                                                        : llvm::format("%.2f s", seconds));
      os << "    " << llvm::left_justify(label, 17) << llvm::right_justify(time, 12)
         << (copyStreams ? " (both directions at once, on the copy streams)"
                         : " (one direction after the other, in order)")
         << "\n";
    }
  }
}

PlanCollectiveSummary mlir::bonsai::summarizePlanCollectives(plan::StepOp step) {
  PlanCollectiveSummary summary;
  // A ring's operands may be views (reshapes): their type says their bytes.
  auto elementsOf = [](Value operand) {
    return cast<MemRefType>(operand.getType()).getNumElements();
  };
  auto bytesOf = [&](Value operand) -> int64_t {
    auto type = cast<MemRefType>(operand.getType());
    return elementsOf(operand) * int64_t(type.getElementTypeBitWidth()) / 8;
  };
  for (auto launch : step.getBody().getOps<plan::LaunchOp>()) {
    StringRef kernel = launch.getKernel();
    if (auto ring = launch.getParams().getAs<IntegerAttr>("ring_ranks")) {
      // q, k, v, [segment ids] of a forward; dO, q, k, v, o, [lse], [segment ids] of a grad.
      const int64_t n = ring.getInt();
      const bool grad = kernel.ends_with("_grad"), keepsLse = kernel == "flash_attention_grad";
      const unsigned k = grad ? 2 : 1, segments = grad ? (keepsLse ? 6 : 5) : 3;
      auto ins = launch.getIns();
      int64_t block = bytesOf(ins[k]) + bytesOf(ins[k + 1]);
      if (ins.size() > segments)
        block += 8 * elementsOf(ins[segments]); // Segment ids travel as int64.
      int64_t bytes = (n - 1) * block;
      if (grad)
        bytes += n * 4 * (elementsOf(ins[k]) + elementsOf(ins[k + 1])) +
                 (keepsLse ? 0 : (n - 1) * block);
      ++summary.ring.launches;
      summary.ring.bytes += bytes;
      summary.ringRanks = std::max(summary.ringRanks, n);
      continue;
    }
    int kind = kernel == "all_gather"       ? PlanCollectiveSummary::AllGather
               : kernel == "reduce_scatter" ? PlanCollectiveSummary::ReduceScatter
               : kernel == "all_reduce"     ? PlanCollectiveSummary::AllReduce
                                            : -1;
    if (kind < 0)
      continue;
    // The whole tensor is the largest operand (the share is 1/N of it; an all-reduce's are
    // alike).
    int64_t whole = 0;
    for (Value operand : launch->getOperands())
      if (auto buffer = operand.getDefiningOp<plan::BufferOp>())
        whole = std::max(whole, buffer.getSizeInBytes());
    PlanCollectiveSummary::Traffic &traffic =
        summary.traffic[kind][launch.getPhase() == plan::Phase::Update ? 1 : 0];
    ++traffic.launches;
    traffic.bytes += whole;
    if (auto ranks = launch.getParams().getAs<IntegerAttr>("ranks"))
      summary.ranks = std::max(summary.ranks, ranks.getInt());
    else
      summary.ranks = std::max<int64_t>(summary.ranks, 1);
  }
  return summary;
}

void PlanCollectiveSummary::print(llvm::raw_ostream &os, double linkGBs) const {
  if (ring.launches) {
    os << "  ring attention per rank (rings of " << ringRanks
       << "; each rank sends its ring's next rank and receives from the previous):\n"
       << "    key/value blocks per micro-batch" << llvm::format_decimal(ring.launches, 5)
       << (ring.launches == 1 ? " launch  " : " launches")
       << llvm::right_justify(formatBytes(ring.bytes), 12);
    if (linkGBs > 0)
      os << llvm::format("  %.4g ms at %.4g GB/s", double(ring.bytes) / (linkGBs * 1e9) * 1e3,
                         linkGBs);
    os << "\n";
  }
  if (ranks == 0)
    return;
  static constexpr const char *kNames[NumKinds] = {"all-gather", "reduce-scatter", "all-reduce"};
  os << "  collectives per rank (over " << ranks << (ranks == 1 ? " rank" : " ranks")
     << "; each rank sends and receives " << ranks - 1 << "/" << ranks
     << " of each whole tensor, an all-reduce twice):\n";
  for (int kind = 0; kind < NumKinds; ++kind)
    for (int phase = 0; phase < 2; ++phase) {
      const Traffic &t = traffic[kind][phase];
      if (t.launches == 0)
        continue;
      os << "    " << llvm::left_justify(kNames[kind], 15)
         << llvm::left_justify(phase ? "per step" : "per micro-batch", 16)
         << llvm::format_decimal(t.launches, 5) << (t.launches == 1 ? " launch  " : " launches")
         << llvm::right_justify(formatBytes(t.bytes), 12);
      if (linkGBs > 0 && ranks > 1) {
        double passes = kind == AllReduce ? 2 : 1;
        double seconds =
            passes * double(t.bytes) * double(ranks - 1) / double(ranks) / (linkGBs * 1e9);
        if (seconds < 1e-5)
          os << llvm::format("  < 0.01 ms at %.4g GB/s", linkGBs);
        else
          os << llvm::format("  %.4g ms at %.4g GB/s", seconds * 1e3, linkGBs);
      }
      os << "\n";
    }
}
