//===- Loss.cpp - cross_entropy on the CPU --------------------------------===//
//
// The mean token cross-entropy (PyTorch's cross_entropy with reduction="mean" and ignore_index).
// Labels are validated before anything is computed. Each row's log-sum-exp is computed in fp64,
// the per-row losses are summed in fp64 in row order, and the mean is rounded once to the output:
// the result does not depend on the number of threads.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

void crossEntropy(const TensorView &logits, const TensorView &labels, int64_t ignoreIndex,
                  const TensorView &loss) {
  const char *k = "cross_entropy";
  checkFloat(k, "logits", logits);
  checkIndex(k, "labels", labels);
  checkFloat(k, "loss", loss);
  if (logits.rank() < 1)
    fail(k, "logits must have at least one dimension, got shape " + formatShape(logits.shape));
  checkShape(k, "labels", labels,
             std::vector<int64_t>(logits.shape.begin(), logits.shape.end() - 1),
             "for logits shape " + formatShape(logits.shape));
  if (loss.numel() != 1)
    fail(k, "loss shape " + formatShape(loss.shape) + " is not a scalar");

  int64_t vocab = logits.dim(-1), rows = labels.numel();
  std::vector<int64_t> label(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    label[size_t(r)] = loadIndex(labels, r);
    int64_t l = label[size_t(r)];
    if (l != ignoreIndex && (l < 0 || l >= vocab))
      fail(k, "label " + std::to_string(l) + " at labels" + formatIndex(r, labels.shape) +
                  " is outside [0, " + std::to_string(vocab) + ") and is not ignore_index " +
                  std::to_string(ignoreIndex));
  }

  std::vector<double> nll(size_t(rows), 0.0);
  int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, vocab));
  parallelFor(rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(vocab));
    for (int64_t r = r0; r < r1; ++r) {
      int64_t l = label[size_t(r)];
      if (l == ignoreIndex)
        continue;
      loadF32(subView(logits, r * vocab, vocab), row.data());
      double max = -std::numeric_limits<double>::infinity();
      for (float x : row)
        max = std::max(max, double(x));
      double sum = 0.0;
      for (float x : row)
        sum += std::exp(double(x) - max);
      nll[size_t(r)] = max + std::log(sum) - double(row[size_t(l)]);
    }
  });

  double total = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (label[size_t(r)] == ignoreIndex)
      continue;
    total += nll[size_t(r)];
    ++count;
  }
  // 0/0, as PyTorch: a batch of only ignored labels has a NaN loss.
  float result = count ? float(total / double(count)) : std::numeric_limits<float>::quiet_NaN();
  storeF32(&result, loss);
}

} // namespace bonsai::rt::cpu
