//===- MemoryPlanner.h - Offsets for buffers with known lifetimes ---------===//
//
// The static memory planner: given buffers with a size and a live interval over the schedule,
// assign byte offsets in one arena so that no two buffers that are live at the same time
// overlap, keeping the arena (the peak) small. Plain C++ on plain data, so that the algorithm
// is unit-tested on hand-made cases and against an exhaustive search.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_ANALYSIS_MEMORYPLANNER_H
#define BONSAI_ANALYSIS_MEMORYPLANNER_H

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace mlir::bonsai {

/// One buffer to place: `size` bytes live from schedule step `firstUse` to `lastUse`
/// (inclusive).
struct BufferInterval {
  int64_t size = 0;
  int64_t firstUse = 0;
  int64_t lastUse = 0;

  bool overlapsInTime(const BufferInterval &other) const {
    return firstUse <= other.lastUse && other.firstUse <= lastUse;
  }
};

/// Offsets chosen for each buffer (same order as the input) and the arena size they need.
struct MemoryPlan {
  std::vector<int64_t> offsets;
  int64_t peak = 0;
};

/// Greedy by size with best fit: buffers are placed from the largest down (ties: the earlier
/// first use, then input order), each in the smallest gap between already-placed buffers that
/// are live at the same time where it fits, or above them all if none does. Offsets are
/// multiples of `alignment`. O(n² log n); the plans of 7B-parameter models take milliseconds.
MemoryPlan planGreedyBySize(const std::vector<BufferInterval> &buffers, int64_t alignment);

/// Places buffers in the given order, each at the lowest aligned offset where it fits. With
/// the right order this reaches the optimum (an optimal plan's buffers, placed in increasing
/// order of their offsets, each land no higher than in that plan).
MemoryPlan planFirstFitInOrder(const std::vector<BufferInterval> &buffers,
                               const std::vector<std::size_t> &order, int64_t alignment);

/// The optimal peak by trying every placement order with first fit: exponential, for tests
/// on at most about 8 buffers.
MemoryPlan planOptimalExhaustive(const std::vector<BufferInterval> &buffers, int64_t alignment);

/// A lower bound on any plan's peak: the largest total size live at one step.
int64_t livePeakLowerBound(const std::vector<BufferInterval> &buffers, int64_t alignment);

/// Checks a plan independently of how it was made: every buffer's offset is aligned and
/// non-negative, every buffer fits under the peak, and no two buffers live at the same time
/// share a byte. Returns the index pair of the first overlap found, or {-1, -1}.
std::pair<int64_t, int64_t> findOverlap(const std::vector<BufferInterval> &buffers,
                                        const MemoryPlan &plan);

/// `value` rounded up to a multiple of `alignment` (a power of two).
inline int64_t alignTo(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

} // namespace mlir::bonsai

#endif // BONSAI_ANALYSIS_MEMORYPLANNER_H
