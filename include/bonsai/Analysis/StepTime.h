//===- StepTime.h - How long a compiled training step takes ---------------===//
//
// The compute stream's time from each op's cost (CostOpInterface) at the rates a target's
// kernels reach, and with offloaded state the link and the host beside it (UpdatePlacement.h):
// what `update "auto"` weighs its split with, and the step time bonsai-compile predicts for the
// step as it will run, recomputation and fusion included (docs/offload.md, "Predicted step
// time").
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
};

/// The rates from a target's peaks (bf16 tensor-core TFLOP/s, memory GB/s, link GB/s each
/// way) and `hostGParamsPerSecond`: the shares of them measured on the H200 (a large bf16
/// GEMM at 78% of peak, a streaming kernel at 80% of HBM bandwidth, a pinned copy at 87% of
/// the link's 64 GB/s; docs/benchmarks.md), and the attention kernels at the profile's
/// measured rate.
StepRates achievedStepRates(const TargetProfile &profile, double hostGParamsPerSecond);

/// The rates a whole step reaches, for its predicted time: achievedStepRates' kernels other
/// than attention at 84% of their estimate (Llama-2-7B's on-device step measured 1521 ms where
/// the estimate, its attention at the kernels' measured rate, says 1291 ms; 793 for 681 at
/// half the batch), the attention kernels at their measured rate, the link at 50.5 GB/s each
/// way (the H200's 101
/// GB/s with both directions busy, as an offloaded step keeps them) and the host's optimizer
/// at 80% of its rate alone (3.6 of 4.5 G parameters/s measured while the link copies).
/// Measured on the H200 alone (docs/benchmarks.md, 2026-12-03 fifth session).
StepRates sustainedStepRates(const TargetProfile &profile, double hostGParamsPerSecond);

/// Seconds `op` takes on the device by its cost: the longer of its tensor-core work and its
/// memory traffic; nothing for an op without a cost.
double estimateOpSeconds(Operation *op, const StepRates &rates);

/// One step of a training function, predicted.
struct StepPrediction {
  /// The whole step: the last of the compute stream, the host and the copies.
  double stepSeconds = 0;
  /// The compute stream's kernels alone (streamed updates included), no wait.
  double kernelSeconds = 0;
  /// What the offload adds to the kernels: the compute stream's waits for streamed state
  /// and the host's and the copies' tail after it.
  double exposedSeconds = 0;
  int64_t hostUpdates = 0, streamedUpdates = 0;
  UpdatePlacement placement;
};

/// Predicts a step of `function` as it will run (after remat and fusion): its ops in order on
/// the compute stream, those of the forward and backward phases once per micro-batch; each
/// update whose state is streamed (operands from `bonsai.copy_h2d`) or that runs on the host
/// (operands from `bonsai.copy_to_host`) placed as the IR says, in the simulation of
/// UpdatePlacement.h, its streamed state coming in from the start of its phase on. Offloaded
/// activations (bonsai-offload-activations' copies) go out on the link as the forward pass
/// computes, all before the backward pass starts, and come back one ahead of their readers,
/// which wait for them.
StepPrediction predictStep(func::FuncOp function, const StepRates &rates, int64_t microBatches);

} // namespace mlir::bonsai

#endif // BONSAI_ANALYSIS_STEPTIME_H
