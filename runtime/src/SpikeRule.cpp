//===- SpikeRule.cpp - Skipping updates on loss and gradient-norm spikes --===//

#include "bonsai/runtime/SpikeRule.h"

#include <cmath>
#include <limits>
#include <string>

namespace bonsai::rt {

namespace {

/// mean + zscore·sd of a full window, else +inf.
float bound(const std::deque<float> &values, size_t window, double zscore) {
  if (values.size() < window)
    return std::numeric_limits<float>::infinity();
  double sum = 0;
  for (float v : values)
    sum += double(v);
  double mean = sum / double(values.size());
  // Two passes: the deviations are small next to the mean of a loss that barely moves.
  double squares = 0;
  for (float v : values)
    squares += (double(v) - mean) * (double(v) - mean);
  return float(mean + zscore * std::sqrt(squares / double(values.size())));
}

void push(std::deque<float> &values, float v, size_t window) {
  values.push_back(v);
  while (values.size() > window)
    values.pop_front();
}

} // namespace

SpikeRule::SpikeRule(double zscore, size_t window) : zscore_(zscore), window_(window) {
  if (!(zscore > 0) || !std::isfinite(zscore))
    throw Error("the spike rule's z-score must be a positive number, not " +
                std::to_string(zscore));
  if (window < 2)
    throw Error("the spike rule's window must hold at least 2 steps, not " +
                std::to_string(window));
}

SpikeLimits SpikeRule::limits() const {
  return {bound(losses_, window_, zscore_), bound(gradNorms_, window_, zscore_)};
}

void SpikeRule::record(float loss, std::optional<float> gradNorm) {
  if (std::isfinite(loss))
    push(losses_, loss, window_);
  if (gradNorm && std::isfinite(*gradNorm))
    push(gradNorms_, *gradNorm, window_);
}

void SpikeRule::restore(const std::vector<float> &losses, const std::vector<float> &gradNorms) {
  losses_.clear();
  gradNorms_.clear();
  for (float v : losses)
    push(losses_, v, window_);
  for (float v : gradNorms)
    push(gradNorms_, v, window_);
}

} // namespace bonsai::rt
