//===- HostThreads.cpp - The threads the runtime's host work may use -----===//

#include "bonsai/runtime/HostThreads.h"

#include <algorithm>
#include <atomic>
#include <thread>

namespace bonsai::rt {

namespace {
/// 0 until setHostThreads names a count.
std::atomic<unsigned> gHostThreads{0};
} // namespace

unsigned hostThreads() {
  unsigned set = gHostThreads.load(std::memory_order_relaxed);
  return set ? set : std::max(1u, std::thread::hardware_concurrency());
}

void setHostThreads(unsigned threads) { gHostThreads.store(threads, std::memory_order_relaxed); }

unsigned hostThreadsPerRank(unsigned cores, unsigned ranksOnHost) {
  return std::max(1u, cores / std::max(1u, ranksOnHost));
}

} // namespace bonsai::rt
