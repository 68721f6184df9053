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

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace bonsai::rt {

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
};

/// "step <n> loss <%.9g>", then " grad_norm <%.6g>" and " lr <%.6g>" for those the plan
/// reports; no newline.
std::string formatStepLine(const StepReport &report);

/// One JSON object, no newline: step, loss, grad_norm, lr (null when the plan has none, or not
/// finite), tokens_per_s, memory_planned_bytes, memory_measured_bytes, micro_batches, tokens,
/// elapsed_s.
std::string formatMetricsJson(const StepReport &report);

/// "step 12/100 | loss 2.7797 | grad_norm 0.53 | lr 0.001 | 1234 tok/s | ETA 0:01:05"; the ETA
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
  /// Reports a completed step.
  void step(const StepReport &report, uint64_t firstStep);
  /// Prints a line of its own (a checkpoint saved), keeping the progress line below it.
  void note(const std::string &line);
  /// Ends the progress line, if one is showing.
  void finish();

private:
  std::FILE *out_;
  bool terminal_;
  size_t shown_ = 0; ///< Length of the progress line on screen, 0 when none.
};

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_METRICS_H
