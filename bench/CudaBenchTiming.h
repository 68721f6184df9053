//===- CudaBenchTiming.h - Error checks and event timing of the CUDA benches --===//
//
// What the C++ benchmark programs that time CUDA calls share (attention_bench,
// ring_attention_bench): a CUDA error ends the program with a message naming the
// call, and a call is timed as the median over repetitions, each between its own
// pair of events after two warm-up calls.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_BENCH_CUDABENCHTIMING_H
#define BONSAI_BENCH_CUDABENCHTIMING_H

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace bonsai::bench {

/// Ends the program when `status` is an error, naming the program and `call`.
inline void check(cudaError_t status, const char *call) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s failed: %s\n", program_invocation_short_name, call,
                 cudaGetErrorString(status));
    std::exit(1);
  }
}

/// Median milliseconds of `fn` over `reps` calls after two warm-up calls, each call between its
/// own pair of events on the default stream.
template <typename F> double medianMs(F fn, int reps) {
  fn();
  fn();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<cudaEvent_t> events(size_t(2 * reps));
  for (cudaEvent_t &e : events)
    check(cudaEventCreate(&e), "cudaEventCreate");
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(events[2 * r]), "cudaEventRecord");
    fn();
    check(cudaEventRecord(events[2 * r + 1]), "cudaEventRecord");
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r)
    check(cudaEventElapsedTime(&ms[size_t(r)], events[2 * r], events[2 * r + 1]),
          "cudaEventElapsedTime");
  for (cudaEvent_t e : events)
    cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]);
}

} // namespace bonsai::bench

#endif // BONSAI_BENCH_CUDABENCHTIMING_H
