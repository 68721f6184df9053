//===- SpikeRule.h - Skipping updates on loss and gradient-norm spikes ----===//
//
// The optional spike rule of the training loop (bonsai-run --spike-zscore; docs/training.md,
// "Loss and gradient spikes"), after llm.c's outlier detector: a step whose loss or global
// gradient norm lies more than Z standard deviations above the mean of the latest N steps'
// values skips its update, as a non-finite step does. The host keeps the windows; each step
// gets its bounds (mean + Z·sd) before it runs, and the executor checks them where the values
// are computed (the gradient norm on the device, without a synchronisation of its own).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_SPIKERULE_H
#define BONSAI_RUNTIME_SPIKERULE_H

#include "bonsai/runtime/Executor.h"

#include <cstddef>
#include <deque>
#include <optional>
#include <vector>

namespace bonsai::rt {

/// The windows of recent losses and gradient norms, and the bounds they give.
///
/// A window holds every step's finite value, whether its update ran or not: a lone spike is
/// skipped, while a lasting change of level enters the window and is accepted after a few
/// steps (or, sooner, stops the run through bonsai-run --max-nonfinite, which counts skipped
/// steps in a row).
class SpikeRule {
public:
  /// `zscore` > 0 standard deviations, over windows of `window` >= 2 steps.
  SpikeRule(double zscore, size_t window);

  /// The bounds for the next step: mean + zscore·sd of each window (population standard
  /// deviation, in double), +inf while a window holds fewer than `window` values.
  SpikeLimits limits() const;
  /// Adds a step's values to the windows (a non-finite or absent one is left out).
  void record(float loss, std::optional<float> gradNorm);

  /// The windows, oldest first: what a checkpoint keeps (TrainingPosition) so that a resumed
  /// run decides as the uninterrupted one.
  std::vector<float> losses() const { return {losses_.begin(), losses_.end()}; }
  std::vector<float> gradNorms() const { return {gradNorms_.begin(), gradNorms_.end()}; }
  /// Takes windows back from a checkpoint (the newest `window` values of each).
  void restore(const std::vector<float> &losses, const std::vector<float> &gradNorms);

  double zscore() const { return zscore_; }
  size_t window() const { return window_; }

private:
  double zscore_;
  size_t window_;
  std::deque<float> losses_, gradNorms_;
};

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_SPIKERULE_H
