//===- KernelBackend.h - Where a plan's kernels run: the CPU or a GPU -----===//
//
// The executor orchestrates a plan (arenas, weights, inputs, phases, copies) and hands its
// kernels to one KernelBackend: the CPU reference backend (CpuBackend.cpp), which runs them on
// the executor's host arenas, or the CUDA backend (CudaBackend.cpp), which owns device copies
// of the arenas, runs whole phases (captured once as CUDA Graphs and replayed), and moves bytes
// between the host arenas and the device. Each backend runs a kernel through its handler table,
// one handler per kind of the kernel table (docs/runtime.md). The executor's host arenas stay
// the place where weights are bound, inputs written and checkpoints read and written; for a
// backend with memory of its own the executor decides when to copy (docs/cuda.md).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_KERNELBACKEND_H
#define BONSAI_RUNTIME_KERNELBACKEND_H

#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bonsai::rt {

/// The update phase split for the non-finite guard (docs/training.md, "Non-finite steps"), in
/// plan kernel indices, each list in plan order: `check` runs first (the gradient norms and the
/// learning rate: kernels that write no persistent tensor), then the `guarded` kernels run only
/// when every f32 scalar in `norms` is finite (and the global norm within its limit, the spike
/// rule), then `always` (the Zero kernels that clear the gradient accumulators, so that a
/// skipped step's gradients do not reach the next step).
struct UpdateGuard {
  std::vector<size_t> check, guarded, always;
  std::vector<uint32_t> norms;
  /// The position in `norms` of the global gradient norm (the "grad_norm" metric), which
  /// runGuardedUpdate's limit bounds; -1 when the plan has none.
  int limitedNorm = -1;
};

/// What the last runGuardedUpdate did with its guarded kernels (the values the CUDA guard
/// kernel writes).
enum class UpdateVerdict : int32_t {
  Ran = 0,
  NonFiniteNorm = 1,  ///< skipped: a norm was not finite
  NormAboveLimit = 2, ///< skipped: the global gradient norm exceeded the limit
  SkippedByHost = 3,  ///< skipped: the caller asked (a non-finite or spiking loss)
};

/// Where the copies between pinned host memory and the device, and the updates on the host,
/// spent a step's time (docs/offload.md, "Telemetry"). The copies counted are those of the
/// phases run since the last KernelBackend::takeOffloadTimes (a phase run more than once, one
/// per micro-batch, counts its last run).
struct OffloadTimes {
  /// Bytes the timed copies moved to the device and to the host.
  uint64_t toDeviceBytes = 0, toHostBytes = 0;
  /// Seconds copies to the device (to the host) were in flight: the union of their intervals,
  /// so that two streams copying the same way at once count once.
  double toDeviceSeconds = 0, toHostSeconds = 0;
  /// Seconds the compute stream waited for copies and for the updates on the host: the part
  /// of their time the step's compute did not hide. On a backend that runs everything in
  /// order (the CPU), all of the copies' and host steps' time.
  double exposedSeconds = 0;
  /// Wall seconds the kernels of the host stream (the updates on the host) ran.
  double hostStepSeconds = 0;
  /// Whether the copies and waits were timed (the backend was asked to): without, only the
  /// bytes and hostStepSeconds hold.
  bool timed = true;

  /// Adds another step's figures (bonsai-run's per-step means).
  OffloadTimes &operator+=(const OffloadTimes &other) {
    toDeviceBytes += other.toDeviceBytes;
    toHostBytes += other.toHostBytes;
    toDeviceSeconds += other.toDeviceSeconds;
    toHostSeconds += other.toHostSeconds;
    exposedSeconds += other.exposedSeconds;
    hostStepSeconds += other.hostStepSeconds;
    return *this;
  }
};

/// The kernels of one plan, run on the CPU or on a GPU.
class KernelBackend {
public:
  virtual ~KernelBackend() = default;

  /// "cpu", or "NVIDIA H200 (sm_90, 139.8 GiB), CUDA Graphs on".
  virtual std::string describe() const = 0;
  /// Whether the backend runs on arenas of its own (a GPU's), which the executor keeps in step
  /// with its host arenas through the copies below; a backend without (the CPU) runs on the
  /// host arenas themselves and is never asked to copy.
  virtual bool hasOwnMemory() const = 0;
  /// Arena `arena`'s own bytes when the host can read and write them in place (a GPU's pinned
  /// host arena), else null. The executor then takes them as its host view of that arena and
  /// copies nothing either way: it waits for the backend (synchronize) before the host reads
  /// or writes them, so a pinned arena takes host memory once, not twice.
  virtual void *sharedHostArena(size_t arena) const {
    (void)arena;
    return nullptr;
  }
  /// Copies `bytes` host bytes to device arena `arena` at byte `offset`.
  virtual void uploadArena(size_t arena, uint64_t offset, const void *host, uint64_t bytes) = 0;
  /// Copies device arena `arena` into `bytes` host bytes.
  virtual void downloadArena(size_t arena, void *host, uint64_t bytes) = 0;
  /// Copies one tensor's bytes between host memory and its place on the device.
  virtual void uploadTensor(uint32_t tensor, const void *host) = 0;
  virtual void downloadTensor(uint32_t tensor, void *host) = 0;
  /// Enqueues the kernels of `phase`, in plan order. Errors are reported by `synchronize`.
  virtual void runPhase(Phase phase) = 0;
  /// Enqueues, one by one (no graph), the kernels of `phase` whose plan index is below `end`.
  virtual void runPhasePrefix(Phase phase, size_t end) = 0;
  /// Enqueues `kernels` (plan indices), in order, one by one (no graph): what
  /// Executor::findNonFinite runs between its checks.
  virtual void runKernels(const std::vector<size_t> &kernels) = 0;
  /// Enqueues the update phase split by `guard`: `check`, then `guarded` if `skip` is false,
  /// every norm is finite and the global norm (guard.limitedNorm) is at most `normLimit`, then
  /// `always`. The outcome is read by updateVerdict(). On a GPU with CUDA Graphs this is one
  /// graph whose guarded part is a conditional node, the limit a device scalar written before
  /// it: no host synchronisation.
  virtual void runGuardedUpdate(const UpdateGuard &guard, bool skip, float normLimit) = 0;
  /// What the last runGuardedUpdate did with its guarded kernels (waits for it on a GPU).
  virtual UpdateVerdict updateVerdict() = 0;
  /// Waits for all enqueued work and throws rt::Error for a failed kernel or a device-side
  /// error (an id or label out of range), naming the kernel.
  virtual void synchronize() = 0;
  /// The peak device memory the process held, by the driver's count (cudaMemGetInfo at start
  /// and at every synchronisation): arenas, workspaces and the kernels' scratch pools.
  virtual uint64_t measuredDeviceBytes() const = 0;
  /// With profiling on, phases run kernel by kernel (no graphs) between CUDA events, and each
  /// kernel's time is added to kernelMilliseconds()[kernel index].
  virtual void setProfiling(bool on) = 0;
  virtual const std::vector<double> &kernelMilliseconds() const = 0;
  /// What the copies across memory spaces and the host steps have taken since the last call,
  /// which starts the count again; complete after a synchronize().
  virtual OffloadTimes takeOffloadTimes() = 0;
  /// Forgets whatever was built from the plan's kernel attributes (the captured CUDA Graphs,
  /// whose launches hold them by value), after the executor changed them.
  virtual void kernelAttrsChanged() = 0;
};

class Communicator;

/// What a backend's collective kinds (kCollective, and ShardSlice) need beside their operands:
/// this process's rank among the plan's ranks, the host communicator (the CPU backend's
/// collectives go through it; the CUDA backend starts NCCL over it), and the executor's words
/// for where it is ("step 12"; empty when it does not know), which every collective's error
/// carries. Owned by the executor.
struct RankContext {
  int rank = 0;
  int size = 1;
  Communicator *host = nullptr;
  std::string where;
};

/// True when this build has the CUDA backend and a CUDA device is present.
bool cudaDeviceAvailable();

/// The CPU reference backend for `plan`, running its kernels on `views`, the executor's host
/// views of the plan's tensors. It keeps references to both, which must outlive it.
/// With `offloadTiming`, takeOffloadTimes times the copies (a wall clock around each). The
/// collectives go through `ranks`' host communicator (null: one rank, and a plan without
/// collectives); `ranks` must outlive the backend.
std::unique_ptr<KernelBackend> createCpuBackend(const LoadedPlan &plan,
                                                const std::vector<TensorView> &views,
                                                bool offloadTiming = false,
                                                const RankContext *ranks = nullptr);

/// The CUDA backend for `plan` on device `ordinal`: allocates and zeroes one device arena per
/// plan arena. The backend keeps a reference to `plan`, which must outlive it: the executor
/// owns the only copy of the plan, so that what it changes (bonsai-run's --lr) is what runs.
/// Throws rt::Error when the build has no CUDA backend, the device is missing, or an allocation
/// fails (naming the arena and the bytes asked for). A plan with collectives needs `ranks`
/// (which must outlive the backend): the backend starts an NcclCommunicator over its host
/// communicator, and throws rt::Error when the build has no NCCL.
struct CudaBackendOptions {
  int ordinal = 0;       ///< the CUDA device
  bool useGraphs = true; ///< capture each phase once and replay it
  /// Time the copies and the compute stream's waits for them (docs/offload.md, "Telemetry").
  bool offloadTiming = false;
  /// cuda::Context::deterministic of every kernel: off lets kernels add partial results in
  /// the order their blocks run (bonsai-run --nondeterministic).
  bool deterministic = true;
};
std::unique_ptr<KernelBackend> createCudaBackend(const LoadedPlan &plan,
                                                 const CudaBackendOptions &options,
                                                 const RankContext *ranks = nullptr);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_KERNELBACKEND_H
