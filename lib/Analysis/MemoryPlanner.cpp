//===- MemoryPlanner.cpp - Offsets for buffers with known lifetimes -------===//
//
// Greedy-by-size placement (as in TensorFlow Lite's arena planner) with a best-fit choice of
// gap, plus the exhaustive search and the independent overlap check the tests use.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/MemoryPlanner.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

using namespace mlir::bonsai;

namespace {
/// A placed buffer: its byte range.
struct Placed {
  int64_t offset;
  int64_t end;
};

/// The offset for a buffer of `size` bytes among `conflicts` (ranges of buffers live at the
/// same time). With `bestFit`, the smallest gap that fits; otherwise the lowest.
int64_t chooseOffset(std::vector<Placed> &conflicts, int64_t size, int64_t alignment,
                     bool bestFit) {
  std::sort(conflicts.begin(), conflicts.end(),
            [](const Placed &a, const Placed &b) { return a.offset < b.offset; });
  int64_t candidate = 0;
  int64_t bestOffset = -1, bestGap = INT64_MAX;
  for (const Placed &p : conflicts) {
    if (candidate + size <= p.offset) {
      int64_t gap = p.offset - candidate;
      if (!bestFit)
        return candidate;
      if (gap < bestGap) {
        bestGap = gap;
        bestOffset = candidate;
      }
    }
    candidate = std::max(candidate, alignTo(p.end, alignment));
  }
  return bestOffset >= 0 ? bestOffset : candidate;
}

MemoryPlan placeInOrder(const std::vector<BufferInterval> &buffers,
                        const std::vector<size_t> &order, int64_t alignment, bool bestFit) {
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), -1);
  std::vector<size_t> placed;
  std::vector<Placed> conflicts;
  for (size_t i : order) {
    const BufferInterval &b = buffers[i];
    conflicts.clear();
    for (size_t j : placed)
      if (b.overlapsInTime(buffers[j]))
        conflicts.push_back({plan.offsets[j], plan.offsets[j] + buffers[j].size});
    int64_t offset = chooseOffset(conflicts, b.size, alignment, bestFit);
    plan.offsets[i] = offset;
    plan.peak = std::max(plan.peak, alignTo(offset + b.size, alignment));
    placed.push_back(i);
  }
  return plan;
}
} // namespace

MemoryPlan mlir::bonsai::planGreedyBySize(const std::vector<BufferInterval> &buffers,
                                          int64_t alignment) {
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (buffers[a].size != buffers[b].size)
      return buffers[a].size > buffers[b].size;
    return buffers[a].firstUse < buffers[b].firstUse;
  });
  return placeInOrder(buffers, order, alignment, /*bestFit=*/true);
}

MemoryPlan mlir::bonsai::planFirstFitInOrder(const std::vector<BufferInterval> &buffers,
                                             const std::vector<size_t> &order,
                                             int64_t alignment) {
  return placeInOrder(buffers, order, alignment, /*bestFit=*/false);
}

MemoryPlan mlir::bonsai::planOptimalExhaustive(const std::vector<BufferInterval> &buffers,
                                               int64_t alignment) {
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  MemoryPlan best;
  best.peak = INT64_MAX;
  do {
    MemoryPlan plan = planFirstFitInOrder(buffers, order, alignment);
    if (plan.peak < best.peak)
      best = std::move(plan);
  } while (std::next_permutation(order.begin(), order.end()));
  if (buffers.empty())
    best.peak = 0;
  return best;
}

int64_t mlir::bonsai::livePeakLowerBound(const std::vector<BufferInterval> &buffers,
                                         int64_t alignment) {
  // Sweep over interval starts and ends.
  std::map<int64_t, int64_t> delta;
  for (const BufferInterval &b : buffers) {
    delta[b.firstUse] += alignTo(b.size, alignment);
    delta[b.lastUse + 1] -= alignTo(b.size, alignment);
  }
  int64_t live = 0, peak = 0;
  for (auto [step, d] : delta) {
    live += d;
    peak = std::max(peak, live);
  }
  return peak;
}

std::pair<int64_t, int64_t> mlir::bonsai::findOverlap(const std::vector<BufferInterval> &buffers,
                                                      const MemoryPlan &plan) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    int64_t a = plan.offsets[i];
    if (a < 0 || a + buffers[i].size > plan.peak)
      return {int64_t(i), int64_t(i)};
    for (size_t j = i + 1; j < buffers.size(); ++j) {
      if (!buffers[i].overlapsInTime(buffers[j]))
        continue;
      int64_t b = plan.offsets[j];
      if (a < b + buffers[j].size && b < a + buffers[i].size)
        return {int64_t(i), int64_t(j)};
    }
  }
  return {-1, -1};
}
