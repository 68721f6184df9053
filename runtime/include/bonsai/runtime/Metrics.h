//===- Metrics.h - Per-step metrics: JSON lines and terminal progress -----===//
//
// What a training run reports each step, in the three forms bonsai-run writes: a plain line
// for logs and scripts ("step <n> loss <x>", plus grad_norm and lr when the plan has them), a
// single updating line with totals, throughput and ETA when stdout is a terminal, and one JSON
// object per line in a --metrics file. The formats are stable; docs/training.md spells them out.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_METRICS_H
#define BONSAI_RUNTIME_METRICS_H

#include "bonsai/runtime/KernelBackend.h"

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace bonsai::rt {

/// One scaled operand of an FP8 linear as the last fp8_update_scales left its state row
/// (docs/fp8.md): the scale the next casts use and the last cast's statistics.
struct Fp8OperandStats {
  std::string tensor;   ///< The weight whose state it is ("<weight>" of "<weight>.fp8").
  std::string operand;  ///< "input", "weight" or "grad_output" (the state's rows).
  float scale = 0;      ///< 0 until the first update.
  float amax = 0;
  float underflow = 0;  ///< Fraction of the values that became zero.
  float saturation = 0; ///< Fraction clipped to the format's largest value.
};

/// The FP8 telemetry of a step: every operand of every FP8 state, in plan and row order.
struct Fp8Summary {
  size_t tensors = 0; ///< FP8 states (weights cast to FP8).
  std::vector<Fp8OperandStats> operands;
};

/// The "fp8" object of a metrics line, no newline: {"tensors": n, "max_underflow":
/// {"tensor", "operand", "fraction"}, "max_saturation": {...}, "per_tensor": [{"tensor",
/// "operand", "scale", "amax", "underflow", "saturation"}, ...]} (the maxima null without
/// operands; a non-finite number is null). docs/training.md spells it out.
std::string formatFp8Json(const Fp8Summary &summary);

/// "" when no operand's underflow fraction exceeds `threshold`; otherwise one line naming the
/// step, the operand with the largest fraction, its tensor and fraction, and how many others
/// exceed it: "warning: step 20: FP8 underflow: 3.1% of grad_output of 'w' became zero
/// (--fp8-underflow-warn 1%; 2 more FP8 operands above it)".
std::string formatFp8UnderflowWarning(const Fp8Summary &summary, uint64_t step,
                                      double threshold);

/// What a step of a plan with pinned host memory (docs/offload.md) moved and ran there.
struct OffloadStats {
  uint64_t hostToDeviceBytes = 0; ///< Over PCIe, from the plan's copies.
  uint64_t deviceToHostBytes = 0;
  /// What the backend measured: the copies' time each way, the exposed time, the host steps.
  OffloadTimes times;
};

/// The rate the copies of `times` moved bytes one way, in bytes per second: bytes over the
/// time copies that way were in flight; nullopt when none was timed.
std::optional<double> achievedBytesPerSecond(uint64_t bytes, double seconds);

/// "" when each direction that moved at least 64 MiB did so at no less than half of
/// `linkBytesPerSecond` (the target profile's link, each way; 0: unknown, never a warning);
/// otherwise one line: "warning: step 3: copies to the device ran at 6.2 GB/s, below half of
/// the target's 64.0 GB/s each way (pageable memory, or another process on the bus?)".
std::string formatLinkWarning(const OffloadTimes &times, double linkBytesPerSecond, uint64_t step);

/// One step's numbers.
struct StepReport {
  uint64_t step = 0;     ///< The step just completed, from 1 (continues after a resume).
  uint64_t lastStep = 0; ///< The step this run ends at (for progress and ETA).
  float loss = 0;        ///< The mean micro-batch loss.
  std::optional<float> gradNorm;
  std::optional<float> lr;
  uint32_t microBatches = 1;
  uint64_t tokens = 0;        ///< Tokens this step consumed (micro-batches x batch x seq).
  double stepSeconds = 0;     ///< Wall time of this step.
  double elapsedSeconds = 0;  ///< Wall time since the run's first step started.
  uint64_t plannedBytes = 0;  ///< Sum of the planned arena sizes.
  uint64_t measuredBytes = 0; ///< Sum of the bytes measured so far.
  /// FP8 telemetry, on the steps it is read (bonsai-run --fp8-stats-every).
  std::optional<Fp8Summary> fp8;
  /// The mean loss on held-out data after this step's update, on the steps that evaluate
  /// (bonsai-run --eval-every).
  std::optional<float> valLoss;
  /// Steps of this run so far whose update was skipped for a non-finite loss or gradient
  /// norm (docs/training.md, "Non-finite steps").
  uint64_t skippedSteps = 0;
  /// For a plan with pinned host arenas.
  std::optional<OffloadStats> offload;
};

/// "step <n> loss <%.9g>", then " grad_norm <%.6g>" and " lr <%.6g>" for those the plan
/// reports, then " val_loss <%.9g>" on an evaluation step, then " skipped <n>" once the run has
/// skipped a step; no newline.
std::string formatStepLine(const StepReport &report);

/// One JSON object, no newline: step, loss, grad_norm, lr (null when the plan has none, or not
/// finite), val_loss (on an evaluation step only; null when not finite), tokens_per_s,
/// memory_planned_bytes, memory_measured_bytes, micro_batches, tokens, elapsed_s,
/// skipped_steps, then "offload" ({"pcie_h2d_bytes", "pcie_d2h_bytes", "h2d_s", "d2h_s",
/// "h2d_gb_per_s", "d2h_gb_per_s", "exposed_s", "host_step_s"}; a rate is null when no copy
/// that way was timed) for a plan with pinned host memory, then "fp8" (formatFp8Json) when the
/// report has FP8 telemetry.
std::string formatMetricsJson(const StepReport &report);

/// "step 12/100 | loss 2.7797 | grad_norm 0.53 | lr 0.001 | val_loss 2.9 | 1234 tok/s |
/// ETA 0:01:05" (val_loss: the last evaluation's, once there is one); the ETA
/// is the mean step time so far times the steps left, `firstStep` being the first step this
/// run made.
std::string formatProgress(const StepReport &report, uint64_t firstStep);

/// "1:02:05" or "2:05" for a duration in seconds ("?" when not finite).
std::string formatDuration(double seconds);

/// Appends one JSON line per step to a file, flushed after each line.
class MetricsFile {
public:
  /// Opens `path`, truncating it, or appending when `append` (a resumed run). Throws
  /// rt::Error naming the file.
  MetricsFile(const std::string &path, bool append);
  ~MetricsFile();
  MetricsFile(const MetricsFile &) = delete;
  MetricsFile &operator=(const MetricsFile &) = delete;

  /// Writes `report` as one line. Throws rt::Error when the write fails.
  void write(const StepReport &report);

private:
  std::string path_;
  std::FILE *file_ = nullptr;
};

/// Prints step reports to `out`: plain lines, or, on a terminal, one line rewritten in place.
class Progress {
public:
  Progress(std::FILE *out, bool terminal) : out_(out), terminal_(terminal) {}
  /// Reports a completed step. On a terminal the line keeps showing the last val_loss
  /// reported, between evaluations.
  void step(const StepReport &report, uint64_t firstStep);
  /// Prints a line of its own (a checkpoint saved; a warning, to stderr) on `to` (default: the
  /// progress stream), clearing the progress line first so that the next step redraws it.
  void note(const std::string &line, std::FILE *to = nullptr);
  /// Ends the progress line, if one is showing.
  void finish();

private:
  std::FILE *out_;
  bool terminal_;
  size_t shown_ = 0; ///< Length of the progress line on screen, 0 when none.
  std::optional<float> lastValLoss_;
};

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_METRICS_H
