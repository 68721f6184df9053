//===- Executor.h - Runs a verified plan on a kernel backend ---------------===//
//
// The executor owns the arenas of one plan: each is allocated once (aligned, zeroed), and every
// plan tensor becomes a TensorView at arena base + offset, so tensors that the compiler placed at
// the same bytes are views of one another. Parameters are bound from a checkpoint or initialized
// from the seed, then every tensor's initializer is applied (zeros; converting copies such as
// fp32 master weights). A training step runs, for each of its k micro-batches, the Forward and
// Backward kernels on that micro-batch's tokens with the LossScale tensor set to 1/k, then the
// Update kernels once; generation runs the Forward kernels alone. The kernels themselves run on
// a KernelBackend, the CPU's or a GPU's (KernelBackend.h). The executor also measures,
// per arena, the highest byte any binding, input or kernel operand actually touched, to report
// beside the planned size. See docs/training.md.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_EXECUTOR_H
#define BONSAI_RUNTIME_EXECUTOR_H

#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/KernelBackend.h"
#include "bonsai/runtime/Metrics.h"
#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Safetensors.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace bonsai::rt {

class Communicator;

/// Planned and measured bytes of one arena.
struct ArenaUsage {
  const ArenaInfo *arena = nullptr; ///< The executor's copy of the arena's description.
  uint64_t planned = 0;  ///< The arena size the compiler planned (and the runtime allocated).
  uint64_t measured = 0; ///< The highest offset + bytes touched so far.
};

/// What one training step produced.
struct StepResult {
  /// The mean of the micro-batch losses: of every rank's, for a plan of several ranks (the
  /// same on every rank).
  float loss = 0;
  /// In global micro-batch order: every rank's, rank 0's first, for a plan of several ranks.
  std::vector<float> microBatchLosses;
  std::optional<float> gradNorm;       ///< The Metric tensor "grad_norm" after the update.
  std::optional<float> lr;             ///< The Metric tensor "lr" after the update.
  /// GaLore weights whose due projector refresh was skipped at this step (the projector was
  /// kept), with the reason: galore::Status (1: non-finite gradient, 2: rank-deficient sketch).
  std::vector<std::pair<std::string, int>> galoreSkipped;
  /// The step's update was skipped (`cause` says why): weights, optimizer state, FP8 scales,
  /// GaLore state and the step counter are as before the step (docs/training.md, "Non-finite
  /// steps").
  bool skipped = false;
  /// Why: the loss or a gradient norm was not finite, or the loss or the global gradient norm
  /// exceeded its SpikeLimits bound.
  enum class Cause { None, NonFinite, LossSpike, GradNormSpike } cause = Cause::None;
  /// For a plan with copies across memory spaces or updates on the host (docs/offload.md,
  /// "Telemetry"): what they moved and took this step.
  std::optional<OffloadTimes> offload;
};

/// The bounds a step's loss and global gradient norm must not exceed for its update to run
/// (the spike rule, bonsai-run --spike-zscore; docs/training.md, "Loss and gradient spikes").
/// +inf (the default) is no bound. The gradient norm's bound is checked where the norm is
/// computed (on a GPU, by the guard kernel), so it needs the non-finite guard and a plan whose
/// update runs after the backward pass.
struct SpikeLimits {
  float loss = std::numeric_limits<float>::infinity();
  float gradNorm = std::numeric_limits<float>::infinity();
};

/// Where the kernels run.
enum class Backend { Cpu, Cuda };

/// How an executor runs its plan.
struct ExecutorOptions {
  Backend backend = Backend::Cpu;
  int device = 0;          ///< CUDA device ordinal
  bool cudaGraphs = true;  ///< capture each phase once and replay it
  /// Off: the CUDA kernels may add partial results in the order their blocks run, faster and
  /// not bit-reproducible from run to run (bonsai-run --nondeterministic; docs/cuda.md). The
  /// CPU backend's kernels are deterministic either way.
  bool deterministic = true;
  /// Time the copies across memory spaces and the compute stream's waits for them, each step
  /// (docs/offload.md, "Telemetry"; bonsai-run --offload-timing). Off by default: on a GPU
  /// the timing events slow an offloaded step by 3-20%. The bytes and the host steps' time
  /// are counted either way.
  bool offloadTiming = false;
  /// Skip the update of a step whose loss or gradient norm is not finite (trainStep). Off,
  /// every update runs whatever it reads (bonsai-run --max-nonfinite 0).
  bool guardNonFinite = true;
  /// The ranks this process runs among (docs/sharding.md): null is one rank. A plan compiled
  /// for N > 1 ranks (LoadedPlan::ranks) needs a communicator of N ranks, every rank running
  /// the same plan; a plan of one rank refuses a communicator of several. The CPU backend runs
  /// the plan's collectives through it, the CUDA backend through an NcclCommunicator it starts
  /// over it. It must outlive the executor.
  Communicator *communicator = nullptr;
};

/// The host memory the machine can give without swapping: MemAvailable of `meminfo` in
/// bytes; nullopt where it cannot be read.
std::optional<uint64_t> availableHostMemory(const std::string &meminfo = "/proc/meminfo");

/// Throws rt::Error, naming the plan, the bytes and its largest arena, when the host memory
/// the plan takes on `backend` exceeds `available`: every arena on the CPU; on CUDA the
/// pinned-host arenas and the host copies of the device arenas' tensors the executor writes at
/// start (the parameters, and state initialised from them such as master weights). Nothing is
/// checked without a figure. The Executor calls it before it allocates anything.
void checkHostMemory(const LoadedPlan &plan, Backend backend, std::optional<uint64_t> available);

/// Runs one verified plan on the CPU reference backend or, with Backend::Cuda, on a GPU. The
/// host arenas are always there: weights are bound, inputs written and checkpoints read and
/// written through them. With a GPU, the executor copies an arena to the device before the
/// first kernel after a host write into it, and back when the host reads a tensor of it that
/// the device wrote (a view of one tensor brings back its arena alone, so a checkpoint does
/// not bring back the activations); per step only the inputs, the loss scale, the loss and the
/// metrics cross. A GPU's pinned host arenas (offloaded state, docs/offload.md) have no
/// second copy: the executor's view of one is the arena itself, read and written after the
/// kernels finish.
class Executor {
public:
  /// Allocates every arena of `plan` (which the executor copies), zeroed. The zeros are the
  /// operating system's untouched pages: host memory is taken only where bytes are written
  /// (weights, their copies, what is read back), not for the whole plan, which on a GPU lives
  /// on the device. Throws rt::Error naming the arena when an allocation fails.
  explicit Executor(const LoadedPlan &plan, const ExecutorOptions &options = {});
  ~Executor();
  /// Refuses, before anything is allocated, a plan of several ranks without a communicator of
  /// that many ranks, and a plan of one rank with a communicator of several (naming the
  /// plan, its ranks and how to start it).
  /// Not copyable: it owns the arenas its views point into.
  Executor(const Executor &) = delete;
  Executor &operator=(const Executor &) = delete;

  /// The plan it runs.
  const LoadedPlan &plan() const { return plan_; }
  /// One host view per plan tensor, in plan order. With a GPU, taking the views first brings
  /// the device's newer bytes back, and then marks the host as the copy to send before the next
  /// kernel (the executor cannot tell whether the caller reads or writes, so both are safe).
  const std::vector<TensorView> &views() const {
    syncToHost();
    hostDirty_.assign(hostDirty_.size(), true);
    return views_;
  }
  /// One tensor's host view, as views() but for the tensor's arena alone.
  const TensorView &view(uint32_t tensor) const {
    const TensorView &v = views_.at(tensor);
    const uint32_t arena = plan_.tensors[tensor].arena;
    syncArenaToHost(arena);
    hostDirty_[arena] = true;
    return v;
  }

  /// With a GPU: copies every arena the kernels wrote since its last copy back to the host.
  void syncToHost() const;
  /// This process's rank among the plan's ranks, and their number (1 for a plan of one rank).
  int rank() const;
  int ranks() const;
  /// The host communicator the executor runs with (its own single-rank one when given none).
  Communicator &communicator() const;
  /// Where the executor is, for the collectives' errors: "step 12" (bonsai-run sets it before
  /// each step); empty says nothing.
  void setWhere(const std::string &where);
  /// "cpu" or the GPU's description.
  std::string describeBackend() const;
  /// Whether the kernels run on a device with memory of its own, reached over a link (a GPU).
  bool hasDevice() const { return device_ != nullptr; }
  /// Turns per-kernel timing on (GPU: kernel by kernel between CUDA events, no graphs; CPU:
  /// wall-clock around each kernel) and clears the times.
  void setProfiling(bool on);
  /// Milliseconds spent in each plan kernel since profiling was turned on.
  std::vector<double> kernelMilliseconds() const;
  /// Device bytes the GPU backend holds as measured by the driver (0 on the CPU).
  uint64_t measuredDeviceBytes() const { return backend_->measuredDeviceBytes(); }

  /// Binds every parameter from `checkpoint` (see bindCheckpoint), initializes the adapters
  /// it lacks from `seed` (initUnboundParameters), then applies the initializers (applyInits).
  /// Returns the Hugging Face tensors it skipped (ignoredHfTensorReason).
  std::vector<std::string> bindWeights(const Checkpoint &checkpoint, uint64_t seed = 0);
  /// Initializes every parameter from `seed` (see initParameters), then applies the
  /// initializers (applyInits).
  void initWeights(uint64_t seed);
  /// Applies the TensorInit of every tensor but the parameters: Zeros first, then each CopyOf converts its source's
  /// current values (the bound parameters) into the copy's dtype. Called by bindWeights and
  /// initWeights; call it again after writing parameters some other way (a checkpoint's
  /// optimizer state is loaded after it, over its result).
  void applyInits();
  /// Records that `tensor` was written from outside (a checkpoint), for the measured memory.
  void markWritten(uint32_t tensor) {
    hostDirty_.at(plan_.tensors.at(tensor).arena) = true;
    touch(tensor);
  }
  /// With a GPU: copies one tensor the kernels wrote (the logits, say) to its host view.
  void fetch(uint32_t tensor) const { downloadTensor(tensor); }

  /// Replaces the lr of every LearningRate kernel, on the CPU and on the GPU alike (a GPU's
  /// captured phases are captured again). Throws rt::Error when the plan has none or `lr` is
  /// negative or not finite.
  void overrideLearningRate(double lr);

  /// Writes a batch into the plan's ids and labels tensors (and positions and segment ids when
  /// it takes them). A ring's rank (docs/ring-attention.md) writes its zigzag share of each
  /// row, the positions of its tokens in the whole row included.
  void setInputs(const TokenBatch &batch);
  /// The [batch, seq] shape of the batches the plan takes: its inputs' shape, with a ring's
  /// whole rows (the inputs hold a rank's share).
  std::vector<int64_t> inputShape() const;
  /// Writes `scale` into the LossScale tensor; does nothing when the plan has none.
  void setLossScale(float scale);

  /// Runs the kernels of `phase` in plan order. A kernel's error is rethrown with the kernel's
  /// index, name and kind in front.
  void runPhase(Phase phase);
  /// The loss tensor's current value.
  float loss() const;
  /// The Metric tensor named `name`, if the plan has one.
  std::optional<float> metric(const std::string &name) const;

  /// Throws rt::Error (LoadedPlan::microBatchProblem) unless `count` micro-batches per step
  /// compute the gradient of the mean micro-batch loss with this plan.
  void checkMicroBatches(uint32_t count) const;
  /// One training step of `count` micro-batches per rank: micro-batch m (from 0) of rank r of
  /// N reads loader.batch(firstMicroBatch + r * count + m), runs Forward and Backward with
  /// LossScale 1/(N * count); then the Update kernels run once. The step thus takes the N *
  /// count micro-batches from firstMicroBatch on, and equals one rank's step of N * count
  /// micro-batches (docs/sharding.md). A plan without Update or Backward kernels just runs
  /// Forward per micro-batch. Returns the mean loss of all N * count micro-batches (the ranks'
  /// losses are gathered, so every rank has the same) and the "grad_norm" and "lr" metrics.
  /// With the non-finite guard on, the update is skipped when the loss or a gradient norm is
  /// not finite, or exceeds `limits`; every rank decides alike (the losses are the gathered
  /// ones, the norms the global ones).
  StepResult trainStep(TokenLoader &loader, uint64_t firstMicroBatch, uint32_t count,
                       const SpikeLimits &limits = {});
  /// After a step that trainStep skipped (bonsai-run --find-nonfinite): runs its micro-batches
  /// again kernel by kernel (Forward, Backward, then the update's check kernels: the gradient
  /// norms; Forward alone for a plan that updates in the backward pass), reading every output
  /// after each kernel, and describes the first kernel that wrote a non-finite value, the
  /// tensor and element, and which of its inputs already held one; "" when none did. Nothing
  /// that persists changes: the gradient accumulators are cleared after, as the skipped
  /// update cleared them. Slow (a copy per output on a GPU): for debugging. Refused for a
  /// plan of several ranks (each rank would stop at its own kernel, out of step with the
  /// others' collectives).
  std::string findNonFinite(TokenLoader &loader, uint64_t firstMicroBatch, uint32_t count);
  /// Forward and Backward on `batch` with LossScale `lossScale`, no Update; returns the loss.
  float forwardBackward(const TokenBatch &batch, float lossScale);
  /// Forward alone on `batch` (generation); returns the loss.
  float forward(const TokenBatch &batch);
  /// The Forward kernels of `batch` whose plan index is below `end`, kernel by kernel: what
  /// generation runs to read the operands of a kernel it computes itself (the fused LM head).
  void forwardPrefix(const TokenBatch &batch, size_t end);

  /// Evaluation on held-out data (bonsai-run --eval-data): runs the Forward kernels alone on
  /// loader.batch(0), ..., loader.batch(count - 1) with the current weights and returns the
  /// mean of their losses, averaged as trainStep averages micro-batch losses. Training goes on
  /// exactly as without it: nothing of the Backward or Update phases runs (no gradient, no
  /// optimizer state, step counter or FP8 scale changes), the tensors of persistent arenas
  /// that Forward kernels write are restored afterwards, and the loss scale is set back. What
  /// it leaves in step arenas (activations, the last update's metrics) is not kept: read
  /// metric() before. Throws rt::Error when `count` is 0. With several ranks, every rank runs
  /// the same batches in step (their collectives pair up) and gets the same loss.
  float evaluate(TokenLoader &loader, uint64_t count);

  /// Runs every kernel in plan order (Forward, Backward, Update) on the inputs already set,
  /// with LossScale 1, and returns the loss: one step of one micro-batch.
  float runStep();

  /// The GaLore weights (named like their parameters) whose due projector refresh was skipped
  /// in the last update, with the galore::Status that says why; empty without GaLore.
  std::vector<std::pair<std::string, int>> galoreSkipped() const;

  /// The FP8 telemetry (docs/fp8.md): each FP8 state's rows (input, weight, grad_output) as
  /// the last update left them, read from the device when a GPU has them; nullopt when the
  /// plan has no FP8 state (LoadedPlan::fp8States).
  std::optional<Fp8Summary> fp8Summary() const;

  /// Planned and measured bytes of each arena, in plan order.
  std::vector<ArenaUsage> memoryUsage() const;

private:
  /// Checks the communicator against the plan's ranks and sets rankContext_.
  void setUpRanks();
  /// A ring rank's part of a micro-batch's mean loss (docs/ring-attention.md): the share of the
  /// micro-batch's counted tokens (labels other than the loss's ignore index) it holds.
  struct RingShare {
    /// What the backward pass's seed is multiplied by: the share (1 without a ring; 0 when
    /// no token of the micro-batch counts, whose loss is NaN).
    float seed = 1.0f;
    /// The share, NaN when no token counts.
    double share = 1.0;
    /// The rank's part of the micro-batch's loss: its mean loss times its share (0 for a
    /// share of no token, whose own mean is NaN).
    float part(float loss) const {
      return share == 1.0 ? loss : share == 0.0 ? 0.0f : float(share * double(loss));
    }
  };
  RingShare ringShare(const TokenBatch &batch) const;
  /// This ring rank's zigzag share of every row of `batch`.
  TokenBatch ringShareOf(const TokenBatch &batch) const;
  /// Σ over the ring's ranks of their parts: the micro-batch's loss (`part` without a ring).
  float ringLoss(float part) const;
  void touch(uint32_t tensor);
  /// Counts every tensor the kernels of `phase` below plan index `end` name as touched: the
  /// measured memory of a step (the backends measure nothing per tensor).
  void touchPhase(Phase phase, size_t end);
  /// With a GPU: copies every host arena to the device if the host was written since.
  void syncToDevice();
  /// With a GPU: copies one small tensor (loss, metric, input) between host and device.
  void downloadTensor(uint32_t tensor) const;
  void uploadTensor(uint32_t tensor);
  /// Before the host writes `tensor` through its view: waits for the kernels when the view is
  /// the device's own memory (a shared pinned arena), which they may still be using.
  void beforeHostWrite(uint32_t tensor);

  /// The only copy of the plan: the backend reads this one.
  LoadedPlan plan_;
  /// The loss's ignore index (plan_.lossIgnoreIndex()), which ringShare counts tokens by.
  int64_t ringIgnoreIndex_ = -100;
  ExecutorOptions options_;
  /// The single-rank communicator, when the options gave none.
  std::unique_ptr<Communicator> ownCommunicator_;
  /// The ranks the backend's collectives run among; read by the backend, declared before it.
  std::unique_ptr<RankContext> rankContext_;
  /// The update phase split for the non-finite guard; null when the guard is off or the plan
  /// has no update phase.
  std::unique_ptr<UpdateGuard> guard_;
  /// plan_.offloads(), asked once rather than every step.
  bool offloads_ = false;
  /// The tensors of persistent arenas that a Forward kernel writes (a gradient accumulator a
  /// fused head adds to, say), in plan order: evaluate() restores them.
  std::vector<uint32_t> forwardPersistentWrites_;
  /// With a GPU: copies arena `arena` back to the host if kernels wrote it since its last copy.
  void syncArenaToHost(uint32_t arena) const;

  /// Per arena: the host has bytes the device has not seen.
  mutable std::vector<bool> hostDirty_;
  /// Per arena: kernels wrote the device copy since its last download.
  mutable std::vector<bool> deviceAhead_;
  /// No byte has gone to the device yet: its arenas hold the zeros they were created with, so
  /// the first upload skips the host's zero ranges.
  bool deviceZero_ = true;

  /// Frees a host arena: munmap for the mapped ones (`bytes` long), else free; nothing for
  /// one the backend shares (KernelBackend::sharedHostArena), which the backend frees.
  struct ArenaFree {
    uint64_t bytes = 0;
    bool mapped = false;
    bool shared = false;
    void operator()(void *p) const;
  };
  std::vector<std::unique_ptr<void, ArenaFree>> arenas_;
  std::vector<TensorView> views_;
  std::vector<uint64_t> measured_;
  uint32_t checkedMicroBatches_ = 0; ///< The count trainStep last verified (0: none yet).
  /// Where the kernels run; it reads plan_ and, on the CPU, views_, declared before it.
  std::unique_ptr<KernelBackend> backend_;
  /// backend_ when it has memory of its own (a GPU), which the executor copies to and from;
  /// null for the CPU, which runs on the host arenas.
  KernelBackend *device_ = nullptr;
};

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_EXECUTOR_H
