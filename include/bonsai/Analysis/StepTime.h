//===- StepTime.h - How long a compiled training step takes ---------------===//
//
// How long each op of a step takes on a target: its cost (CostOpInterface) at the rates the
// target's kernels reach, a copy at the link's, an update on the host at the host's. What
// `update "auto"` weighs its split with (UpdatePlacement.h), and the durations the step-time
// prediction simulates the scheduled step with (StepSimulation.h; docs/offload.md,
// "Predicted step time").
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_ANALYSIS_STEPTIME_H
#define BONSAI_ANALYSIS_STEPTIME_H

#include "bonsai/Analysis/UpdatePlacement.h"
#include "bonsai/Target/TargetProfile.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::bonsai {

/// The rates a step's kernels, copies and host updates reach on a machine.
struct StepRates {
  double tensorFlopsPerSecond = 0; ///< GEMM-shaped work
  /// The fused attention kernels' work (OpCost::attentionFlops); 0: tensorFlopsPerSecond.
  double attentionFlopsPerSecond = 0;
  double memoryBytesPerSecond = 0; ///< everything else, bound by memory traffic
  OffloadRates offload;            ///< the link each way, the host's optimizer
  /// The shares of their rates the copies to the device, those to the host and the host's
  /// optimizer keep while the other uses the host's memory (StepSimulation.h's contention).
  double toDeviceShareUnderHost = 1, toHostShareUnderHost = 1, hostShareUnderCopies = 1;
  /// What each kernel launched on the device costs beyond its work in a whole step (its
  /// start and tail in the CUDA Graph); 0 for a roofline estimate.
  double kernelLatencySeconds = 0;
};

/// The rates from a target's peaks (bf16 tensor-core TFLOP/s, memory GB/s, link GB/s each
/// way) and `hostGParamsPerSecond`: the shares of them measured on the H200 (a large bf16
/// GEMM at 78% of peak, a streaming kernel at 80% of HBM bandwidth, a pinned copy at 87% of
/// the link's 64 GB/s; docs/benchmarks.md), and the attention kernels at the profile's
/// measured rate.
StepRates achievedStepRates(const TargetProfile &profile, double hostGParamsPerSecond);

/// The rates a whole step reaches, for its predicted time: achievedStepRates' kernels other
/// than attention at 85% of their estimate and 10 us more a kernel (fitted to the on-device
/// steps measured on the H200: Llama-2-7B's 1839 kernels in 1521 ms where the estimate, its
/// attention at the kernels' measured rate, says 1291 ms; Llama 124M's 567 in 33.0 ms where
/// it says 22.5), the attention kernels at their measured rate, the link at 50.5 GB/s each
/// way (the H200's 101 GB/s with both directions busy, as an offloaded step keeps them), the
/// host's optimizer at `hostGParamsPerSecond`, and how the host's memory is shared between
/// the host's optimizer and the copies (the ...ShareUnderHost/Copies fields), fitted to the
/// offloaded steps measured on the H200 (docs/offload.md, "Predicted step time").
StepRates sustainedStepRates(const TargetProfile &profile, double hostGParamsPerSecond);

/// Seconds `op` takes on the device by its cost: the longer of its tensor-core work and its
/// memory traffic; nothing for an op without a cost.
double estimateOpSeconds(Operation *op, const StepRates &rates);

/// The discardable attribute bonsai-time-ops puts on each op that becomes a launch: its
/// seconds on the resource it runs on (docs/offload.md, "Predicted step time").
inline constexpr llvm::StringLiteral kOpSecondsAttr = "bonsai.seconds";

/// Seconds `op` (one that becomes a launch) takes where it runs, once: a copy between pinned
/// host memory and the device its bytes over one direction of the link plus the link's
/// per-copy latency, an update on the host (its operands copied there by bonsai-offload) its
/// parameters at the host's rate, a collective over N ranks (N - 1) / N of the whole tensor
/// over the link (twice for an all-reduce), a kernel on the device estimateOpSeconds plus the
/// rates' kernelLatencySeconds. Negative when a rate it needs is missing (a copy or a
/// collective without the link's rate, an update on the host without the host's).
double estimateLaunchSeconds(Operation *op, const StepRates &rates);

} // namespace mlir::bonsai

#endif // BONSAI_ANALYSIS_STEPTIME_H
