//===- HostThreads.h - The threads the runtime's host work may use -------===//
//
// The runtime's parallel host work (the CPU backend's kernels and GEMMs, the host optimizer,
// weight initialisation, checkpoint hashing) draws on one budget of threads: the machine's
// cores by default. A rank that shares its host with other ranks of the same job takes its part
// of them instead (bonsai-run sets it), as torchrun's OMP_NUM_THREADS does: four ranks each
// running a thread per core on a 2-core host oversubscribe it fourfold. Results do not depend
// on the budget (parallel loops split independent items; cpu::gemm splits rows).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_HOSTTHREADS_H
#define BONSAI_RUNTIME_HOSTTHREADS_H

namespace bonsai::rt {

/// The threads this process's host work may run at once: what setHostThreads set, else
/// std::thread::hardware_concurrency() (at least 1).
unsigned hostThreads();

/// Sets hostThreads() to `threads` (0: back to the default). Parallel loops read it on every
/// call; a pool (the host optimizer's) when it is made.
void setHostThreads(unsigned threads);

/// One rank's share of a host's `cores` when `ranksOnHost` ranks run on it: cores divided
/// evenly, at least 1.
unsigned hostThreadsPerRank(unsigned cores, unsigned ranksOnHost);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_HOSTTHREADS_H
