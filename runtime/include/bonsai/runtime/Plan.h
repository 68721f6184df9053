//===- Plan.h - Loading and verifying a compiled training-step plan -------===//
//
// A plan file (schema/plan.fbs) comes from outside the process, so it is checked in three layers
// before anything uses it: the file identifier ("BNSP"), the FlatBuffers verifier (every offset
// and length inside the buffer), then the semantics the kernels rely on (version, arenas, tensor
// byte ranges, operand counts, shapes and dtypes per kernel kind, initializers, phases and the
// training contract of version 2). Only then is it copied into the plain structs below, so that
// the executor never reads unverified bytes and never depends on the generated FlatBuffers code.
// See docs/plan-format.md and docs/training.md.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_PLAN_H
#define BONSAI_RUNTIME_PLAN_H

#include "bonsai/runtime/ElementwiseProgram.h"
#include "bonsai/runtime/KernelKinds.h"
#include "bonsai/runtime/Tensor.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bonsai::rt {

/// The plan schema version this runtime runs (Plan.version); bumped on incompatible change.
inline constexpr uint32_t kPlanVersion = 2;

/// Where an arena lives; values match bonsai.plan.MemorySpace.
enum class MemorySpace : uint8_t { Device = 0, PinnedHost = 1 };
/// Whether an arena survives across steps; values match bonsai.plan.Lifetime.
enum class Lifetime : uint8_t { Persistent = 0, Step = 1 };
/// Why a tensor exists; values match bonsai.plan.TensorRole.
enum class TensorRole : uint8_t {
  Parameter = 0,
  Input = 1,
  Activation = 2,
  Gradient = 3,
  OptimizerState = 4,
  Workspace = 5,
  Loss = 6,
  Metric = 7,   ///< An f32 scalar the runtime reports by name ("grad_norm", "lr").
  LossScale = 8 ///< The f32 scalar the runtime writes before each micro-batch (1 / micro-batches).
};
/// How a tensor is initialized at start-up; values match bonsai.plan.TensorInit.
enum class TensorInit : uint8_t {
  None = 0,  ///< Parameters are bound; everything else is computed by kernels.
  Zeros = 1, ///< Optimizer moments, gradient accumulators, the step counter.
  CopyOf = 2, ///< A dtype-converting copy of TensorInfo::initSource (fp32 master weights).
  /// Adapter parameters (docs/lora.md), applied when the weights do not hold the tensor:
  KaimingUniform = 3, ///< U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = shape[1] (lora_A).
  RowNorm = 4 ///< y[o] = ||W[o, :]||_2 of the 2-D parameter initSource (DoRA's magnitude).
};
/// When a kernel runs; values match bonsai.plan.Phase. A training step runs Forward and
/// Backward once per micro-batch, then Update once; generation runs Forward alone.
enum class Phase : uint8_t { Forward = 0, Backward = 1, Update = 2 };
/// "parameter", "activation", ... (the memory class a tensor is reported under).
const char *tensorRoleName(TensorRole role);
/// "forward", "backward", "update".
const char *phaseName(Phase phase);

/// One verified arena: `size` bytes, allocated once with at least `alignment`.
struct ArenaInfo {
  std::string name;
  MemorySpace space = MemorySpace::Device;
  Lifetime lifetime = Lifetime::Step;
  uint64_t size = 0;
  uint64_t alignment = 256;
};

/// One verified tensor: bytes [offset, offset + bytes) of arena `arena`, dense row-major.
/// Several tensors may share storage (views); `bytes == numel * dtypeSize(dtype)`, or the NF4
/// layout's size (nf4StorageBytes) for an NF4 tensor.
struct TensorInfo {
  std::string name; ///< Checkpoint key of a parameter; "ids"/"labels" or a debug name otherwise.
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::Activation;
  bool trainable = false;
  uint32_t arena = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int64_t numel = 1; ///< Product of the dimensions (1 for a scalar).
  TensorInit init = TensorInit::None;
  uint32_t initSource = 0; ///< The tensor copied, for TensorInit::CopyOf.
  /// NF4 only: elements per block and blocks per double-quantization group (Nf4.h); `bytes`
  /// is then the layout's size.
  uint32_t quantBlock = 0;
  uint32_t quantDoubleBlock = 0;
  /// Sharded over ranks (Tensor.shard_ranks; docs/sharding.md): > 0 when this tensor holds one
  /// rank's contiguous slice of the row-major flattened tensor of shape `fullShape`, rank r
  /// holding elements [r * numel, (r + 1) * numel) of it; 0 when the tensor is whole.
  uint32_t shardRanks = 0;
  std::vector<int64_t> fullShape; ///< Sharded tensors only: the whole tensor's shape.

  bool sharded() const { return shardRanks > 0; }
  /// One rank's share of the storage bytes of a sharded NF4 tensor (u8; quantBlock and
  /// quantDoubleBlock are the whole tensor's layout).
  bool nf4Share() const { return dtype == DType::U8 && sharded(); }
  /// The whole tensor's dtype and storage bytes (this tensor's own when it is whole).
  DType wholeDType() const { return nf4Share() ? DType::NF4 : dtype; }
  uint64_t wholeBytes() const { return sharded() ? bytes * shardRanks : bytes; }
  /// The first element of the whole tensor that rank `rank`'s shard holds (for an NF4 share,
  /// the first byte of the whole tensor's storage).
  int64_t shardOffset(int rank) const { return int64_t(rank) * numel; }
};

/// For an NF4 share (TensorInfo::nf4Share): a view of the whole NF4 tensor over `storage`,
/// which it resizes to the layout's bytes. Binding or initializing a share fills the whole
/// tensor there (quantizing needs every block's absmax), then keeps the rank's bytes
/// (copyNf4Share).
TensorView wholeNf4View(const TensorInfo &share, std::vector<uint8_t> &storage);
/// Copies rank `rank`'s bytes of the whole NF4 storage `whole` into the share's view.
void copyNf4Share(const TensorInfo &share, const TensorView &whole, int rank,
                  const TensorView &view);

/// The streams a kernel is issued on (KernelInfo::stream). Kernels of one stream run in plan
/// order; a kernel waits for the kernels of other streams it conflicts with (KernelInfo::waits),
/// and each phase's copy streams start after the work before the phase and end before the
/// work after it. Only the copies between pinned host and device memory (trait
/// kCrossesSpaces) may run on a copy stream, one per direction so that both PCIe directions
/// move at once (docs/offload.md, "Overlap"). The host stream runs kernels on the CPU, over
/// pinned host memory, in stream order with the GPU's work: the optimizer updates of a plan
/// that updates on the host (trait kHostStep; docs/offload.md, "The host step").
/// `HostResults` carries the copies to the device of what the host steps wrote: each waits for
/// its host step, so on the host-to-device stream it would hold up every copy behind it, and on
/// the host stream it would hold up the next host step.
/// `Collectives` carries the exchanges with the other ranks (kinds with the kCollective trait;
/// docs/sharding.md, "Overlap"), so that a parameter's all-gather runs while the compute stream
/// works on the layer before it, and a gradient's reduce-scatter while it works on the next.
/// The compiler's copy of these numbers: bonsai::plan::PlanStream (PlanStreams.h).
enum class StreamId : uint8_t {
  Compute = 0,
  HostToDevice = 1,
  DeviceToHost = 2,
  Host = 3,
  HostResults = 4,
  Collectives = 5
};
constexpr unsigned kNumStreams = 6;

/// "compute", "host-to-device", "device-to-host", "host", "host-results" or "collectives".
const char *streamName(StreamId stream);

/// One verified kernel: indices into LoadedPlan::tensors, checked against the kind's operand
/// conventions.
struct KernelInfo {
  KernelKind kind = KernelKind::Copy;
  std::vector<uint32_t> inputs;
  std::vector<uint32_t> outputs;
  /// The struct of the kind's attribute table (KernelAttrs.h).
  KernelAttrsInfo attrs;
  StreamId stream = StreamId::Compute;
  std::string name;
  Phase phase = Phase::Forward;
  /// Earlier kernels of the same phase, on other streams, that must be complete before this
  /// one starts: of each other stream, the latest one whose bytes this one's conflict with (one
  /// writes what the other reads or writes), unless an earlier wait already implies it. Derived
  /// by the loader from the memory plan (orderStreams), never read from the file, so that a
  /// plan cannot race whatever streams its compiler chose.
  std::vector<uint32_t> waits;
  /// Whether a later kernel waits for this one (a backend with streams records an event
  /// after it).
  bool signals = false;

  /// The attributes as `Table` (NormAttrs, ...), which must be the kind's attribute table.
  template <typename Table> const Table &attrsAs() const { return std::get<Table>(attrs); }
  template <typename Table> Table &attrsAs() { return std::get<Table>(attrs); }
};

/// Planned bytes by memory class, as the compiler computed them (Plan.memory).
struct MemorySummaryInfo {
  uint64_t weights = 0;
  uint64_t gradients = 0;
  uint64_t optimizerState = 0;
  uint64_t activations = 0;
  uint64_t workspace = 0;
  uint64_t inputs = 0;
  uint64_t peakDevice = 0;
  uint64_t peakHost = 0;
};

/// One verified LoRA/DoRA adapter (bonsai-insert-lora; docs/lora.md): indices into
/// LoadedPlan::tensors, shapes checked (base [out, in], loraA [rank, in], loraB [out, rank],
/// magnitude [out]).
struct AdapterInfo {
  uint32_t base = 0;
  uint32_t loraA = 0;
  uint32_t loraB = 0;
  std::optional<uint32_t> magnitude; ///< DoRA only.
  uint32_t rank = 0;
  double alpha = 0;
  std::string module; ///< "model.layers.0.self_attn.q_proj"
};

/// A plan that passed every verification layer, as plain C++ values.
struct LoadedPlan {
  std::string path; ///< Where it was loaded from, for messages.
  uint32_t version = 0;
  std::string model;
  std::string targetArch;
  uint64_t targetDeviceMemory = 0;
  /// The target profile's host link each way, bytes/s (Plan.target.link_gb_per_s; 0: unknown).
  double targetLinkBytesPerSecond = 0;
  /// The compiler's predicted step time on the target and what the offload adds to its
  /// kernels, seconds (Plan.target; 0: no prediction).
  double predictedStepSeconds = 0, predictedExposedSeconds = 0;
  std::vector<ArenaInfo> arenas;
  std::vector<TensorInfo> tensors;
  std::vector<KernelInfo> kernels;
  /// Tensors filled by the data loader: ids, then labels, then the optional packed-row inputs
  /// below in either order.
  std::vector<uint32_t> inputs;
  /// The optional inputs of packed rows (docs/training.md), bound by name: "positions" (rope's
  /// token positions) and "segment_ids" (attention's document ids), i32 or i64 [batch, seq].
  std::optional<uint32_t> positionsInput, segmentIdsInput;
  uint32_t loss = 0;
  MemorySummaryInfo memory;
  uint64_t tokensPerStep = 0; ///< Per micro-batch: batch x sequence of the inputs.
  uint32_t microBatches = 1;  ///< Forward+Backward runs per Update the plan was compiled for.
  uint64_t vocabSize = 0;     ///< Token ids must be below it (checked as data is read).
  std::optional<uint32_t> lossScale; ///< The LossScale tensor, if the plan has one.
  std::vector<AdapterInfo> adapters;       ///< LoRA/DoRA adapters (Plan.adapters).
  std::vector<std::string> adapterTargets; ///< The recipe's patterns (PEFT target_modules).
  /// Kernels the compiler generated (Plan.generated_kernels), run by FusedElementwise.
  std::vector<GeneratedKernelInfo> generatedKernels;
  /// The data-parallel ranks the step was compiled for (Plan.ranks; 0 in the file reads as 1):
  /// every rank runs this plan on its own micro-batches (docs/sharding.md).
  uint32_t ranks = 1;
  /// "zero1", "zero2" or "zero3" for a sharded plan of several ranks; empty otherwise.
  std::string shardStrategy;
  /// The ranks each row's sequence is split over (Plan.ring_ranks; 0 in the file reads as
  /// 1): consecutive groups of ringRanks ranks share each micro-batch, rank r of a group
  /// holding the zigzag chunks r and 2N-1-r of every row (docs/ring-attention.md).
  uint32_t ringRanks = 1;

  /// "tensor 3 'h.0.ln_1.weight'", for messages.
  std::string describeTensor(uint32_t index) const;
  /// "kernel 7 'loc(...)' (Linear)", for messages.
  std::string describeKernel(size_t index) const;
  /// The directives that made a plan of several ranks, for messages: `bonsai.shard "zero3"
  /// ranks 2`, `bonsai.ring ranks 2`, or both (`... x ...`, a grid of 4).
  std::string rankDirectives() const;
  /// The ignore index of the plan's loss kernel (CrossEntropy or LinearCrossEntropy), -100
  /// when it has none: the labels that count no token.
  int64_t lossIgnoreIndex() const;
  /// The vocabulary size (Plan.vocab_size).
  int64_t vocabularySize() const { return int64_t(vocabSize); }
  /// Whether the plan has Update kernels (it trains; otherwise it only computes the loss).
  bool trains() const;
  /// Whether the plan has Backward kernels.
  bool hasBackward() const;
  /// Whether a kernel exchanges data with other ranks (trait kCollective).
  bool hasCollectives() const;
  /// Whether a kernel runs on a stream other than the compute stream (a copy stream or the
  /// host stream).
  bool usesSideStreams() const;
  /// Whether a kernel runs on the host stream (an update on the host, docs/offload.md).
  bool hasHostSteps() const;
  /// Whether a kernel copies between pinned host memory and the device or runs on the host
  /// stream: a step of the plan has offload telemetry (KernelBackend::takeOffloadTimes).
  bool offloads() const;
  /// The bytes a step of `microBatches` micro-batches moves between pinned host memory and the
  /// device, each way: every kernel that crosses the two spaces (the copies), its output's
  /// bytes, once per micro-batch in the forward and backward phases and once in the update.
  struct PcieBytes {
    uint64_t hostToDevice = 0, deviceToHost = 0;
  };
  PcieBytes pcieBytesPerStep(uint32_t microBatches) const;
  /// Whether `kernel`, a copy across memory spaces (kCrossesSpaces), writes pinned host
  /// memory (a copy to the host) rather than the device.
  bool copiesToHost(const KernelInfo &kernel) const {
    return arenas[tensors[kernel.outputs[0]].arena].space == MemorySpace::PinnedHost;
  }
  /// The first kernel that updates a parameter in the backward pass (a plan compiled with the
  /// recipe's update_in_backward keeps no gradients), if any.
  std::optional<size_t> updateInBackward() const;
  /// The Metric tensor named `name`, if there is one.
  std::optional<uint32_t> metric(const std::string &name) const;
  /// The FP8 scaling states (docs/fp8.md), in plan order: the optimizer-state tensors named
  /// "<weight>.fp8" that are f32 [3, 4 + H], H >= 1.
  std::vector<uint32_t> fp8States() const;
  /// Why `microBatches` Forward+Backward runs per Update would compute something else than the
  /// gradient of the mean micro-batch loss, or "" when they are fine: more than one needs a
  /// LossScale tensor (when there is a backward pass), and every step-arena tensor an Update
  /// kernel reads must have been written by an earlier Update kernel, since the next
  /// micro-batch reuses step arenas (gradients reach the update through persistent
  /// accumulators); an Fp8UpdateScales kernel's statistics are exempt, being meant to be the
  /// last micro-batch's.
  std::string microBatchProblem(uint32_t microBatches) const;
};

/// Reads, verifies and loads the plan file at `path`. Throws rt::Error naming the file and the
/// first problem found (missing, not a plan, truncated or corrupted, wrong version, or a
/// semantic error naming the arena, tensor or kernel).
LoadedPlan loadPlanFile(const std::string &path);

/// Verifies and loads a plan held in memory; `what` names it in messages (usually the path).
/// The buffer must be 8-byte aligned (as std::vector and new[] memory is) for the verifier.
LoadedPlan loadPlanBuffer(const void *data, size_t size, const std::string &what);

/// Fills every kernel's `waits` and `signals` from the plan's streams and memory plan: within
/// each phase, in plan order, a kernel waits for the latest kernel of each other stream whose
/// tensors' bytes overlap its own where at least one of the two writes them, unless an earlier
/// wait (on the same stream, or carried by the kernel it waited for) already implies it. The
/// loader calls it; a plan whose kernels all run on the compute stream gets no waits.
void orderStreams(LoadedPlan &plan);

/// Reads a whole file; throws rt::Error naming `path` when it is missing or unreadable.
std::vector<uint8_t> readFileBytes(const std::string &path);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_PLAN_H
