//===- Executor.cpp - Runs a verified plan on a kernel backend -------------===//
//
// Everything here trusts the plan's verification (Plan.cpp): operand counts, indices, byte
// ranges, shapes, initializers and the phase order were checked once at load. The executor
// knows no kernel: it hands phases to its KernelBackend (CpuBackend.cpp, CudaBackend.cpp),
// whose handler tables run each kernel by its kind. Phases are contiguous in plan order,
// so running the kernels of one phase in plan order is running that slice of the schedule the
// memory planner saw.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Executor.h"

#include "RingAttention.h"

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Fp8.h"
#include "bonsai/runtime/GaLore.h"
#include "bonsai/runtime/Init.h"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include <sys/mman.h>
#include <unistd.h>

namespace bonsai::rt {

namespace {
/// Every arena starts at least this aligned: enough for any vector load of any dtype.
constexpr uint64_t kMinArenaAlignment = 256;

/// Whether `bytes` bytes at `p` are all zero. Reading an untouched page of an anonymous mapping
/// maps the kernel's shared zero page, so this takes no memory where a write would.
bool isZero(const void *p, uint64_t bytes) {
  const auto *c = static_cast<const unsigned char *>(p);
  uint64_t i = 0;
  // Word by word where aligned (arenas and tensors are), the tail byte by byte.
  for (; i < bytes && reinterpret_cast<uintptr_t>(c + i) % 8; ++i)
    if (c[i])
      return false;
  for (; i + 64 <= bytes; i += 64) {
    uint64_t w[8];
    std::memcpy(w, c + i, sizeof w);
    if (w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7])
      return false;
  }
  for (; i < bytes; ++i)
    if (c[i])
      return false;
  return true;
}

/// Splits the update phase for the non-finite guard (docs/training.md, "Non-finite steps"):
/// the leading kernels that write no state, only step-arena tensors and metrics (the gradient
/// norms, the learning rate), are the check; every kernel after them is guarded, but for the Zero kernels that clear
/// persistent tensors no later guarded kernel touches (the gradient accumulators), which run
/// after the guarded ones whatever the check says, so that a skipped step's gradients do not
/// reach the next one. The norms checked are the GradNorm outputs among the check kernels.
/// Null for a plan without update kernels, and for one whose updates run in the backward pass
/// (trainStep guards those by their loss).
std::unique_ptr<UpdateGuard> buildUpdateGuard(const LoadedPlan &plan) {
  if (plan.updateInBackward())
    return nullptr;
  auto persistent = [&](uint32_t t) {
    return plan.arenas[plan.tensors[t].arena].lifetime == Lifetime::Persistent;
  };
  // A metric is recomputed every step, wherever the planner put it.
  auto state = [&](uint32_t t) {
    return persistent(t) && plan.tensors[t].role != TensorRole::Metric;
  };
  // A collective over the gradients (ZeRO-1's all-reduce in the update) writes accumulators
  // that the always-run Zero kernels clear: it may run whatever the verdict, ahead of the norms.
  auto checkable = [&](const KernelInfo &k) {
    bool collective = kernelKindInfo(k.kind).has(kernel_traits::kCollective);
    return std::none_of(k.outputs.begin(), k.outputs.end(), [&](uint32_t t) {
      return state(t) && !(collective && plan.tensors[t].role == TensorRole::Gradient);
    });
  };
  // With several ranks every rank must take the same decision: only global norms count (the
  // L2Norm all-reduces of the ranks' norms; a non-finite local norm makes the global one
  // non-finite too).
  const bool global = plan.ranks > 1;
  std::vector<size_t> update;
  for (size_t i = 0; i < plan.kernels.size(); ++i)
    if (plan.kernels[i].phase == Phase::Update)
      update.push_back(i);
  if (update.empty())
    return nullptr;
  auto guard = std::make_unique<UpdateGuard>();
  size_t j = 0;
  for (; j < update.size(); ++j) {
    const KernelInfo &k = plan.kernels[update[j]];
    if (!checkable(k))
      break;
    guard->check.push_back(update[j]);
    bool norm = global ? k.kind == KernelKind::AllReduce &&
                             k.attrsAs<CollectiveAttrs>().reduction == CollectiveReduction::L2Norm
                       : k.kind == KernelKind::GradNorm;
    if (norm) {
      if (plan.metric("grad_norm") == k.outputs[0])
        guard->limitedNorm = int(guard->norms.size());
      guard->norms.push_back(k.outputs[0]);
    }
  }
  for (size_t a = j; a < update.size(); ++a) {
    const KernelInfo &k = plan.kernels[update[a]];
    bool clears = k.kind == KernelKind::Zero && persistent(k.outputs[0]);
    for (size_t b = a + 1; clears && b < update.size(); ++b) {
      const KernelInfo &later = plan.kernels[update[b]];
      if (later.kind == KernelKind::Zero)
        continue;
      auto same = [&](uint32_t t) { return t == k.outputs[0]; };
      if (std::any_of(later.inputs.begin(), later.inputs.end(), same) ||
          std::any_of(later.outputs.begin(), later.outputs.end(), same))
        clears = false;
    }
    (clears ? guard->always : guard->guarded).push_back(update[a]);
  }
  return guard;
}

/// `bytes` in GiB with two decimals, as the memory lines of bonsai-run print them.
std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", double(bytes) / double(uint64_t(1) << 30));
  return text;
}

} // namespace

std::optional<uint64_t> availableHostMemory(const std::string &meminfo) {
  std::ifstream in(meminfo);
  for (std::string line; std::getline(in, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1)
      return uint64_t(kib) * 1024;
  }
  return std::nullopt;
}

void checkHostMemory(const LoadedPlan &plan, Backend backend, std::optional<uint64_t> available) {
  if (!available)
    return;
  // The CPU backend computes in its arenas, so every byte of them is written. On CUDA the
  // pinned-host arenas are host memory (the executor's view of them, not a copy), and so are
  // the pages of the executor's host copies of the device arenas (mappings that take memory
  // only where written) that the host writes at start: the weights it binds and the state
  // initialised from them.
  uint64_t needed = 0, arenas = 0;
  const ArenaInfo *largest = nullptr;
  for (const ArenaInfo &arena : plan.arenas) {
    if (backend == Backend::Cuda && arena.space != MemorySpace::PinnedHost)
      continue;
    arenas += arena.size;
    if (!largest || arena.size > largest->size)
      largest = &arena;
  }
  uint64_t written = 0;
  if (backend == Backend::Cuda)
    for (const TensorInfo &t : plan.tensors)
      if (plan.arenas[t.arena].space != MemorySpace::PinnedHost &&
          (t.role == TensorRole::Parameter ||
           (t.init != TensorInit::None && t.init != TensorInit::Zeros)))
        written += t.bytes;
  needed = arenas + written;
  if (needed <= *available)
    return;
  std::string what = backend == Backend::Cuda
                         ? "pinned host arenas (" + gib(arenas) + ", the largest '" +
                               (largest ? largest->name : std::string("none")) + "', " +
                               gib(largest ? largest->size : 0) +
                               ") and the host copies of the device arenas' weights and the "
                               "state initialised from them (" +
                               gib(written) + ")"
                         : "arenas on the CPU backend (the largest, '" + largest->name + "', " +
                               gib(largest->size) + ")";
  throw Error("plan '" + plan.path + "' needs " + gib(needed) + " of host memory for its " + what +
              ", but this machine has " + gib(*available) +
              " available (MemAvailable in /proc/meminfo): it would run out of memory partway");
}

void Executor::ArenaFree::operator()(void *p) const {
  if (shared)
    return;
  if (mapped)
    munmap(p, size_t(bytes));
  else
    std::free(p);
}

void Executor::setUpRanks() {
  Communicator *comm = options_.communicator;
  if (!comm) {
    ownCommunicator_ = std::make_unique<SingleRankCommunicator>();
    comm = ownCommunicator_.get();
  }
  const int size = comm->size();
  const std::string ranks = std::to_string(plan_.ranks);
  if (plan_.ranks > 1 && uint32_t(size) != plan_.ranks)
    throw Error("plan '" + plan_.path + "' was compiled for " + ranks + " ranks (" +
                plan_.rankDirectives() + ")" +
                (size > 1 ? ", but this process is rank " + std::to_string(comm->rank()) + " of " +
                                std::to_string(size)
                          : std::string()) +
                ": start it as " + ranks + " processes, mpirun -np " + ranks + " bonsai-run ...");
  if (plan_.ranks <= 1 && size > 1)
    throw Error("plan '" + plan_.path + "' runs on one rank, but this process is rank " +
                std::to_string(comm->rank()) + " of " + std::to_string(size) +
                " (each rank would train the whole model on the same data): run it as one "
                "process, or compile it for " +
                std::to_string(size) + " ranks with bonsai.shard (docs/sharding.md)");
  rankContext_ = std::make_unique<RankContext>();
  rankContext_->rank = comm->rank();
  rankContext_->size = size;
  rankContext_->host = comm;
}

int Executor::rank() const { return rankContext_->rank; }
int Executor::ranks() const { return rankContext_->size; }
Communicator &Executor::communicator() const { return *rankContext_->host; }
void Executor::setWhere(const std::string &where) { rankContext_->where = where; }

Executor::Executor(const LoadedPlan &plan, const ExecutorOptions &options)
    : plan_(plan), options_(options) {
  // Before any allocation: refused now, on every rank alike.
  setUpRanks();
  ringIgnoreIndex_ = plan_.lossIgnoreIndex();
  // Before any allocation: refused now with the figures, not killed halfway by the OOM killer.
  checkHostMemory(plan_, options.backend, availableHostMemory());
  // A GPU backend first: its pinned host arenas are the executor's views of those arenas.
  if (options.backend == Backend::Cuda)
    backend_ = createCudaBackend(
        plan_, {options.device, options.cudaGraphs, options.offloadTiming, options.deterministic},
        rankContext_.get());
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < plan_.arenas.size(); ++i) {
    const ArenaInfo &arena = plan_.arenas[i];
    if (void *shared = backend_ ? backend_->sharedHostArena(i) : nullptr) {
      arenas_.emplace_back(shared, ArenaFree{0, false, true});
      continue;
    }
    uint64_t alignment = std::max(arena.alignment, kMinArenaAlignment);
    // aligned_alloc wants a size that is a multiple of the alignment, and never 0.
    uint64_t size = std::max<uint64_t>(arena.size, 1);
    size = (size + alignment - 1) / alignment * alignment;
    // An anonymous mapping is page-aligned and reads as zeros without taking memory until a
    // page is written: a GPU plan of 125 GiB needs host memory for its weights, not 125 GiB.
    ArenaFree owner{size, alignment <= page};
    void *p = nullptr;
    if (owner.mapped) {
      p = mmap(nullptr, size_t(size), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED)
        p = nullptr;
    } else if ((p = std::aligned_alloc(size_t(alignment), size_t(size)))) {
      std::memset(p, 0, size_t(size));
    }
    if (!p)
      throw Error("cannot allocate arena '" + arena.name + "' of " + std::to_string(arena.size) +
                  " bytes");
    arenas_.emplace_back(p, owner);
  }
  // A step arena holds nothing from one step to the next; a persistent one may hold what a
  // Forward kernel writes (a gradient accumulator a fused head adds to, say), which evaluate()
  // must not change.
  std::vector<bool> written(plan_.tensors.size(), false);
  for (const KernelInfo &k : plan_.kernels)
    if (k.phase == Phase::Forward)
      for (uint32_t t : k.outputs)
        written[t] = true;
  for (uint32_t t = 0; t < plan_.tensors.size(); ++t)
    if (written[t] && plan_.arenas[plan_.tensors[t].arena].lifetime == Lifetime::Persistent)
      forwardPersistentWrites_.push_back(t);
  if (options.guardNonFinite)
    guard_ = buildUpdateGuard(plan_);
  offloads_ = plan_.offloads();
  measured_.assign(plan_.arenas.size(), 0);
  hostDirty_.assign(plan_.arenas.size(), true);
  deviceAhead_.assign(plan_.arenas.size(), false);
  views_.reserve(plan_.tensors.size());
  for (const TensorInfo &t : plan_.tensors) {
    TensorView v;
    v.data = static_cast<char *>(arenas_[t.arena].get()) + t.offset;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.quantBlock = t.quantBlock;
    v.quantDoubleBlock = t.quantDoubleBlock;
    views_.push_back(std::move(v));
  }
  if (!backend_)
    backend_ = createCpuBackend(plan_, views_, options.offloadTiming, rankContext_.get());
  if (backend_->hasOwnMemory())
    device_ = backend_.get();
}

Executor::~Executor() = default;

void Executor::setProfiling(bool on) { backend_->setProfiling(on); }

std::vector<double> Executor::kernelMilliseconds() const { return backend_->kernelMilliseconds(); }

std::string Executor::describeBackend() const { return backend_->describe(); }

void Executor::syncToDevice() {
  if (!device_)
    return;
  for (size_t i = 0; i < plan_.arenas.size(); ++i) {
    if (!hostDirty_[i] || arenas_[i].get_deleter().shared)
      continue;
    hostDirty_[i] = false;
    const auto *host = static_cast<const char *>(arenas_[i].get());
    const uint64_t bytes = std::max<uint64_t>(plan_.arenas[i].size, 1);
    if (!deviceZero_) {
      device_->uploadArena(i, 0, host, bytes);
      continue;
    }
    // The device arena is still all zeros: send only the chunks with a nonzero byte (the
    // weights and their copies; optimizer state and gradients start at zero).
    constexpr uint64_t kChunk = uint64_t(4) << 20;
    uint64_t start = 0, end = 0; // the run of nonzero chunks not sent yet
    for (uint64_t at = 0; at < bytes; at += kChunk) {
      const uint64_t n = std::min(kChunk, bytes - at);
      if (isZero(host + at, n)) {
        if (end > start)
          device_->uploadArena(i, start, host + start, end - start);
        start = end = at + n;
      } else {
        end = at + n;
      }
    }
    if (end > start)
      device_->uploadArena(i, start, host + start, end - start);
  }
  // Every arena starts dirty, so the first call sent them all: the device is no longer zero.
  deviceZero_ = false;
}

void Executor::syncToHost() const {
  for (uint32_t i = 0; i < plan_.arenas.size(); ++i)
    syncArenaToHost(i);
}

void Executor::syncArenaToHost(uint32_t arena) const {
  if (!device_ || !deviceAhead_[arena])
    return;
  if (arenas_[arena].get_deleter().shared) {
    // The host's view is the arena itself: wait for the kernels, copy nothing.
    device_->synchronize();
    for (size_t i = 0; i < arenas_.size(); ++i)
      if (arenas_[i].get_deleter().shared)
        deviceAhead_[i] = false;
    return;
  }
  device_->downloadArena(arena, arenas_[arena].get(),
                         std::max<uint64_t>(plan_.arenas[arena].size, 1));
  deviceAhead_[arena] = false;
}

void Executor::downloadTensor(uint32_t tensor) const {
  const uint32_t arena = plan_.tensors[tensor].arena;
  if (!device_ || !deviceAhead_[arena])
    return;
  if (arenas_[arena].get_deleter().shared)
    syncArenaToHost(arena);
  else
    device_->downloadTensor(tensor, views_[tensor].data);
}

void Executor::uploadTensor(uint32_t tensor) {
  // An arena the host wrote goes to the device whole before the next kernel; otherwise only
  // this tensor. One the device shares with the host has it already (beforeHostWrite waited).
  const uint32_t arena = plan_.tensors[tensor].arena;
  if (device_ && !hostDirty_[arena] && !arenas_[arena].get_deleter().shared)
    device_->uploadTensor(tensor, views_[tensor].data);
}

void Executor::beforeHostWrite(uint32_t tensor) {
  const uint32_t arena = plan_.tensors[tensor].arena;
  if (arenas_[arena].get_deleter().shared)
    syncArenaToHost(arena);
}

void Executor::touch(uint32_t tensor) {
  const TensorInfo &t = plan_.tensors[tensor];
  measured_[t.arena] = std::max(measured_[t.arena], t.offset + t.bytes);
}

std::vector<std::string> Executor::bindWeights(const Checkpoint &checkpoint, uint64_t seed) {
  std::vector<std::string> ignored;
  std::vector<bool> bound = bindCheckpoint(plan_, checkpoint, views_, &ignored, rank());
  initUnboundParameters(plan_, views_, seed, bound, rank(), &communicator());
  for (uint32_t i = 0; i < plan_.tensors.size(); ++i)
    if (plan_.tensors[i].role == TensorRole::Parameter)
      touch(i);
  applyInits();
  return ignored;
}

void Executor::initWeights(uint64_t seed) {
  initParameters(plan_, views_, seed, rank(), &communicator());
  for (uint32_t i = 0; i < plan_.tensors.size(); ++i)
    if (plan_.tensors[i].role == TensorRole::Parameter)
      touch(i);
  applyInits();
}

void Executor::applyInits() {
  hostDirty_.assign(hostDirty_.size(), true);
  // Zeros first: a copy may read a zero-initialized tensor, never the other way round (the
  // plan verifier forbids copies of copies). Parameters are bound or initialized before
  // (an adapter's zero init applies only when the weights lack it).
  // Writing zeros over zeros would take host memory for every page of the optimizer state
  // and the gradients (the arenas start as untouched zero pages): only the chunks that are not
  // zero are cleared.
  for (uint32_t i = 0; i < plan_.tensors.size(); ++i)
    if (plan_.tensors[i].init == TensorInit::Zeros &&
        plan_.tensors[i].role != TensorRole::Parameter) {
      auto *bytes = static_cast<char *>(views_[i].data);
      const uint64_t size = uint64_t(plan_.tensors[i].bytes);
      constexpr uint64_t kChunk = uint64_t(64) << 10;
      for (uint64_t at = 0; at < size; at += kChunk) {
        const uint64_t n = std::min(kChunk, size - at);
        if (!isZero(bytes + at, n))
          std::memset(bytes + at, 0, size_t(n));
      }
      touch(i);
    }
  for (uint32_t i = 0; i < plan_.tensors.size(); ++i) {
    const TensorInfo &t = plan_.tensors[i];
    if (t.init != TensorInit::CopyOf)
      continue;
    TensorView src = views_[t.initSource];
    // A shard copied from a whole tensor (ZeRO-1/2's masters of a whole parameter) takes
    // this rank's flat slice of it.
    if (t.sharded() && !plan_.tensors[t.initSource].sharded()) {
      src.data = static_cast<char *>(src.data) + t.shardOffset(rank()) * dtypeSize(src.dtype);
      src.shape = t.shape;
    }
    if (src.dtype == views_[i].dtype) {
      std::memcpy(views_[i].data, src.data, size_t(t.bytes));
    } else {
      std::vector<float> values(size_t(t.numel));
      loadF32(src, values.data());
      storeF32(values.data(), views_[i]);
    }
    touch(t.initSource);
    touch(i);
  }
}

void Executor::overrideLearningRate(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr))
    throw Error("learning rate must be finite and non-negative, got " + std::to_string(lr));
  bool found = false;
  for (KernelInfo &k : plan_.kernels)
    if (k.kind == KernelKind::LearningRate) {
      k.attrsAs<LearningRateAttrs>().lr = lr;
      found = true;
    }
  if (!found)
    throw Error("plan '" + plan_.path + "' has no LearningRate kernel whose lr could be set");
  backend_->kernelAttrsChanged();
}

std::vector<int64_t> Executor::inputShape() const {
  std::vector<int64_t> shape = plan_.tensors[plan_.inputs[0]].shape;
  shape[1] *= int64_t(plan_.ringRanks);
  return shape;
}

namespace {

/// Writes the per-token `values` ([batch, seq], row-major) into a plan input (i32 or i64);
/// empty `values` write `fallback(row, column)` instead (a batch built without them, as
/// generation builds its own).
void writeTokenInput(const char *name, const std::vector<int64_t> &values, const TensorView &view,
                     int64_t (*fallback)(int64_t, int64_t)) {
  int64_t rows = view.shape[0], cols = view.shape[1];
  if (!values.empty() && values.size() != size_t(rows * cols))
    throw Error(std::string("token batch has ") + std::to_string(values.size()) + " " + name +
                ", the plan input of shape " + formatShape(view.shape) + " takes " +
                std::to_string(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      size_t i = size_t(r * cols + c);
      int64_t v = values.empty() ? fallback(r, c) : values[i];
      if (view.dtype == DType::I64) {
        static_cast<int64_t *>(view.data)[i] = v;
      } else {
        if (v > std::numeric_limits<int32_t>::max() || v < std::numeric_limits<int32_t>::min())
          throw Error(std::string(name) + " value " + std::to_string(v) +
                      " does not fit the plan's i32 input");
        static_cast<int32_t *>(view.data)[i] = int32_t(v);
      }
    }
}

} // namespace

Executor::RingShare Executor::ringShare(const TokenBatch &batch) const {
  RingShare result;
  if (plan_.ringRanks <= 1)
    return result;
  const int64_t ring = plan_.ringRanks, local = batch.seq / ring, ignore = ringIgnoreIndex_;
  std::vector<int64_t> index = ringTokenIndices(local, ring, rankContext_->rank % ring);
  int64_t counted = 0, mine = 0;
  for (int64_t b = 0; b < batch.batch; ++b) {
    for (int64_t t = 0; t < batch.seq; ++t)
      counted += batch.labels[size_t(b * batch.seq + t)] != ignore;
    for (int64_t i : index)
      mine += batch.labels[size_t(b * batch.seq + i)] != ignore;
  }
  result.share =
      counted ? double(mine) / double(counted) : std::numeric_limits<double>::quiet_NaN();
  result.seed = counted ? float(result.share) : 0.0f;
  return result;
}

TokenBatch Executor::ringShareOf(const TokenBatch &batch) const {
  const int64_t ring = plan_.ringRanks;
  const std::vector<int64_t> &shape = plan_.tensors[plan_.inputs[0]].shape;
  if (batch.batch != shape[0] || batch.seq != shape[1] * ring)
    throw Error("token batch is [" + std::to_string(batch.batch) + ", " +
                std::to_string(batch.seq) + "], the plan's ring of " + std::to_string(ring) +
                " ranks takes rows of " + std::to_string(shape[1] * ring) + " tokens, " +
                std::to_string(shape[0]) + " of them");
  std::vector<int64_t> index = ringTokenIndices(shape[1], ring, rankContext_->rank % ring);
  TokenBatch share;
  share.batch = batch.batch;
  share.seq = shape[1];
  // Without the loader's positions each token's position is its index in the whole row.
  auto pick = [&](const std::vector<int64_t> &all, std::vector<int64_t> &out, bool positions) {
    if (all.empty() && !positions)
      return;
    out.resize(size_t(share.batch * share.seq));
    for (int64_t b = 0; b < share.batch; ++b)
      for (int64_t i = 0; i < share.seq; ++i)
        out[size_t(b * share.seq + i)] =
            all.empty() ? index[size_t(i)] : all[size_t(b * batch.seq + index[size_t(i)])];
  };
  pick(batch.inputs, share.inputs, false);
  pick(batch.labels, share.labels, false);
  pick(batch.positions, share.positions, true);
  pick(batch.segmentIds, share.segmentIds, false);
  return share;
}

float Executor::ringLoss(float part) const {
  if (plan_.ringRanks <= 1)
    return part;
  std::vector<float> all(size_t(rankContext_->size));
  communicator().allGather(&part, all.data(), 1, DType::F32,
                           rankContext_->where.empty() ? "the ring's losses"
                                                       : rankContext_->where + ", losses");
  // This rank's ring: the consecutive group of ringRanks ranks that holds it.
  const int ring = int(plan_.ringRanks), first = rankContext_->rank - rankContext_->rank % ring;
  double sum = 0;
  for (int r = first; r < first + ring; ++r)
    sum += double(all[size_t(r)]);
  return float(sum);
}

void Executor::setInputs(const TokenBatch &whole) {
  const TokenBatch share = plan_.ringRanks > 1 ? ringShareOf(whole) : TokenBatch();
  const TokenBatch &batch = plan_.ringRanks > 1 ? share : whole;
  for (uint32_t input : plan_.inputs)
    beforeHostWrite(input);
  writeTokenBatch(batch, views_[plan_.inputs[0]], views_[plan_.inputs[1]]);
  // Packed rows (docs/training.md): the loader's positions and segment ids when the plan takes
  // them; a batch without them (generation) is one document per row.
  if (plan_.positionsInput)
    writeTokenInput("positions", batch.positions, views_[*plan_.positionsInput],
                    [](int64_t, int64_t c) { return c; });
  if (plan_.segmentIdsInput)
    writeTokenInput("segment_ids", batch.segmentIds, views_[*plan_.segmentIdsInput],
                    [](int64_t, int64_t) { return int64_t(0); });
  for (uint32_t input : plan_.inputs) {
    touch(input);
    uploadTensor(input);
  }
}

void Executor::setLossScale(float scale) {
  if (!plan_.lossScale)
    return;
  beforeHostWrite(*plan_.lossScale);
  std::memcpy(views_[*plan_.lossScale].data, &scale, sizeof scale);
  touch(*plan_.lossScale);
  uploadTensor(*plan_.lossScale);
}

void Executor::touchPhase(Phase phase, size_t end) {
  for (size_t i = 0; i < end; ++i)
    if (plan_.kernels[i].phase == phase) {
      for (uint32_t t : plan_.kernels[i].inputs)
        touch(t);
      for (uint32_t t : plan_.kernels[i].outputs)
        touch(t);
    }
}

void Executor::runPhase(Phase phase) {
  syncToDevice();
  touchPhase(phase, plan_.kernels.size());
  backend_->runPhase(phase);
  if (device_)
    deviceAhead_.assign(deviceAhead_.size(), true);
}

float Executor::loss() const {
  downloadTensor(plan_.loss);
  float value;
  std::memcpy(&value, views_[plan_.loss].data, sizeof value);
  return value;
}

std::optional<float> Executor::metric(const std::string &name) const {
  std::optional<uint32_t> t = plan_.metric(name);
  if (!t)
    return std::nullopt;
  downloadTensor(*t);
  float value;
  std::memcpy(&value, views_[*t].data, sizeof value);
  return value;
}

void Executor::checkMicroBatches(uint32_t count) const {
  std::string problem = plan_.microBatchProblem(count);
  if (!problem.empty())
    throw Error("plan '" + plan_.path + "' cannot run " + std::to_string(count) +
                " micro-batches per step: " + problem);
}

float Executor::forwardBackward(const TokenBatch &batch, float lossScale) {
  setInputs(batch);
  setLossScale(lossScale);
  runPhase(Phase::Forward);
  // Read before Backward: the planner may give the loss's bytes to a backward tensor.
  touch(plan_.loss);
  float value = loss();
  runPhase(Phase::Backward);
  return value;
}

float Executor::forward(const TokenBatch &batch) {
  setInputs(batch);
  setLossScale(1.0f);
  runPhase(Phase::Forward);
  touch(plan_.loss);
  return loss();
}

void Executor::forwardPrefix(const TokenBatch &batch, size_t end) {
  setInputs(batch);
  setLossScale(1.0f);
  end = std::min(end, plan_.kernels.size());
  syncToDevice();
  touchPhase(Phase::Forward, end);
  backend_->runPhasePrefix(Phase::Forward, end);
  if (device_)
    deviceAhead_.assign(deviceAhead_.size(), true);
}

StepResult Executor::trainStep(TokenLoader &loader, uint64_t firstMicroBatch, uint32_t count,
                               const SpikeLimits &limits) {
  if (count != checkedMicroBatches_) {
    checkMicroBatches(count);
    checkedMicroBatches_ = count;
  }
  StepResult result;
  // With N data ranks the step is N * count micro-batches, rank r's the r-th block of `count`
  // (docs/sharding.md): the gradient of their mean loss starts each backward pass from
  // d(step loss)/d(micro-batch loss) = 1/(N * count), and the ranks' collectives sum the rest.
  // The ranks of a ring (docs/ring-attention.md) share their micro-batches: each seeds its
  // backward pass with its share of the micro-batch's counted tokens on top.
  const int ranks = rankContext_->size, rank = rankContext_->rank;
  const int ring = int(plan_.ringRanks), dataRanks = ranks / ring, dataRank = rank / ring;
  const uint64_t total = uint64_t(count) * uint64_t(dataRanks);
  const uint64_t first = firstMicroBatch + uint64_t(dataRank) * count;
  float scale = 1.0f / float(total);
  // Updates in the backward pass (one micro-batch) are guarded by the loss alone: a non-finite
  // loss skips the backward pass, which holds them, and the update phase. Every rank decides
  // from every rank's loss, so that all skip the backward pass's collectives alike.
  const bool guardInBackward = options_.guardNonFinite && plan_.updateInBackward().has_value();
  std::vector<float> local;
  // The micro-batches' losses in global order: data rank d's micro-batch m is at d * count + m,
  // the sum of its ring ranks' parts (one rank's loss as it is without a ring).
  auto gather = [&](const std::vector<float> &mine, uint32_t at, std::vector<float> &global) {
    std::vector<float> all(mine.size() * size_t(ranks));
    communicator().allGather(mine.data(), all.data(), mine.size(), DType::F32,
                             rankContext_->where.empty() ? "the step's losses"
                                                         : rankContext_->where + ", losses");
    for (int d = 0; d < dataRanks; ++d)
      for (size_t m = 0; m < mine.size(); ++m) {
        double sum = 0;
        for (int r = d * ring; r < (d + 1) * ring; ++r)
          sum += double(all[size_t(r) * mine.size() + m]);
        global[size_t(d) * count + at + m] = float(sum);
      }
  };
  std::vector<float> losses(size_t(total), std::numeric_limits<float>::quiet_NaN());
  bool gathered = false;
  bool lossFinite = true;
  for (uint32_t m = 0; m < count; ++m) {
    TokenBatch batch = loader.batch(first + m);
    const RingShare share = ringShare(batch);
    setInputs(batch);
    setLossScale(scale * share.seed);
    runPhase(Phase::Forward);
    // Read before Backward: the planner may give the loss's bytes to a backward tensor.
    touch(plan_.loss);
    float value = share.part(loss());
    local.push_back(value);
    if (guardInBackward) {
      // One micro-batch (updateInBackward's plans have one): its losses are the step's.
      if (ranks > 1) {
        gather({value}, m, losses);
        gathered = m + 1 == count;
      } else {
        losses[m] = value;
      }
      // The step's loss (count is 1): as result.loss below takes it.
      bool finite = true;
      double stepSum = 0;
      for (uint64_t d = 0; d < uint64_t(dataRanks); ++d) {
        float v = losses[size_t(d * count + m)];
        finite = finite && std::isfinite(v);
        stepSum += double(v);
      }
      float stepLoss = dataRanks == 1 ? losses[m] : float(stepSum / double(dataRanks));
      if (!(finite && stepLoss <= limits.loss)) {
        lossFinite = finite;
        break;
      }
    }
    runPhase(Phase::Backward);
  }
  if (!gathered) {
    if (ranks > 1 && local.size() == count)
      gather(local, 0, losses);
    else
      std::copy(local.begin(), local.end(), losses.begin());
  }
  // A guarded backward pass stopped early leaves the later micro-batches' losses unknown.
  losses.resize(ranks > 1 || local.size() == count ? losses.size() : local.size());
  double sum = 0;
  for (float value : losses) {
    sum += double(value);
    lossFinite = lossFinite && std::isfinite(value);
  }
  result.microBatchLosses = losses;
  // The mean as one rank of N * count micro-batches takes it: one loss as it is, else the f64
  // mean in global order, so that every rank and the 1-rank run agree bit for bit.
  result.loss = losses.size() == 1 ? losses[0] : float(sum / double(losses.size()));
  const bool lossSpike = options_.guardNonFinite && lossFinite && result.loss > limits.loss;
  using Cause = StepResult::Cause;
  if (guardInBackward && (!lossFinite || lossSpike)) {
    result.skipped = true;
    result.cause = lossFinite ? Cause::LossSpike : Cause::NonFinite;
  } else if (guard_) {
    // The host already has every micro-batch's loss; the gradient norms are checked where
    // they are computed (on a GPU, by a kernel whose flag gates a conditional graph node).
    syncToDevice();
    touchPhase(Phase::Update, plan_.kernels.size());
    backend_->runGuardedUpdate(*guard_, !lossFinite || lossSpike, limits.gradNorm);
    if (device_)
      deviceAhead_.assign(deviceAhead_.size(), true);
    switch (backend_->updateVerdict()) {
    case UpdateVerdict::Ran:
      break;
    case UpdateVerdict::NonFiniteNorm:
      result.cause = Cause::NonFinite;
      break;
    case UpdateVerdict::NormAboveLimit:
      result.cause = Cause::GradNormSpike;
      break;
    case UpdateVerdict::SkippedByHost:
      result.cause = lossFinite ? Cause::LossSpike : Cause::NonFinite;
      break;
    }
    result.skipped = result.cause != Cause::None;
  } else {
    runPhase(Phase::Update);
  }
  result.gradNorm = metric("grad_norm");
  result.lr = metric("lr");
  if (result.skipped && guardInBackward) {
    // Neither was computed this step: their bytes may hold anything (a step arena's).
    result.gradNorm = std::numeric_limits<float>::quiet_NaN();
    result.lr = std::numeric_limits<float>::quiet_NaN();
  }
  if (!result.skipped)
    result.galoreSkipped = galoreSkipped();
  if (offloads_) {
    // The copies and host functions of this step are done once the device is.
    backend_->synchronize();
    result.offload = backend_->takeOffloadTimes();
  }
  return result;
}

std::string Executor::findNonFinite(TokenLoader &loader, uint64_t firstMicroBatch,
                                    uint32_t count) {
  if (rankContext_->size > 1)
    throw Error("finding the kernel that wrote a non-finite value is not supported with " +
                std::to_string(rankContext_->size) +
                " ranks yet (each rank would stop at its own kernel, out of step with the "
                "others' collectives): run the plan's model on one rank to find it");
  // The first non-finite element of tensor `t` as the last kernel left it, if any.
  auto nonFinite = [&](uint32_t t) -> std::string {
    const TensorInfo &info = plan_.tensors[t];
    if (!isComputeFloat(info.dtype))
      return "";
    downloadTensor(t);
    std::vector<float> values(size_t(info.numel));
    loadF32(views_[t], values.data());
    for (size_t e = 0; e < values.size(); ++e)
      if (!std::isfinite(values[e]))
        return plan_.describeTensor(t) + " (element " + std::to_string(e) + " is " +
               std::to_string(values[e]) + ")";
    return "";
  };
  const bool inBackward = plan_.updateInBackward().has_value();
  std::vector<size_t> kernels;
  for (Phase phase : {Phase::Forward, Phase::Backward})
    for (size_t i = 0; i < plan_.kernels.size(); ++i)
      if (plan_.kernels[i].phase == phase && !(inBackward && phase == Phase::Backward))
        kernels.push_back(i);
  const float scale = 1.0f / float(count);
  std::string found;
  for (uint32_t m = 0; m < count && found.empty(); ++m) {
    setInputs(loader.batch(firstMicroBatch + m));
    setLossScale(scale);
    std::vector<size_t> order = kernels;
    // The norms are computed once, after the last micro-batch's backward pass.
    if (guard_ && m + 1 == count)
      order.insert(order.end(), guard_->check.begin(), guard_->check.end());
    for (size_t i : order) {
      syncToDevice();
      backend_->runKernels({i});
      if (device_)
        deviceAhead_.assign(deviceAhead_.size(), true);
      const KernelInfo &k = plan_.kernels[i];
      for (uint32_t out : k.outputs) {
        std::string where = nonFinite(out);
        if (where.empty())
          continue;
        found = "micro-batch " + std::to_string(firstMicroBatch + m) + ": " +
                plan_.describeKernel(i) + " wrote a non-finite value to " + where;
        std::string inputs;
        for (uint32_t in : k.inputs) {
          std::string bad = nonFinite(in);
          if (!bad.empty())
            inputs += (inputs.empty() ? "" : ", ") + bad;
        }
        found += inputs.empty() ? "; its inputs are finite"
                                : "; non-finite inputs: " + inputs;
        break;
      }
      if (!found.empty())
        break;
    }
  }
  // Nothing that persists may keep this run's traces: the accumulators go back to zero.
  if (guard_) {
    syncToDevice();
    backend_->runKernels(guard_->always);
    if (device_)
      deviceAhead_.assign(deviceAhead_.size(), true);
  }
  return found;
}

float Executor::evaluate(TokenLoader &loader, uint64_t count) {
  if (count == 0)
    throw Error("evaluation needs at least one batch");
  // Saved from the host views: the device's newer bytes are fetched first.
  std::vector<std::vector<char>> saved;
  for (uint32_t t : forwardPersistentWrites_) {
    downloadTensor(t);
    const auto *bytes = static_cast<const char *>(views_[t].data);
    saved.emplace_back(bytes, bytes + plan_.tensors[t].bytes);
  }
  float scale = 1.0f;
  if (plan_.lossScale)
    std::memcpy(&scale, views_[*plan_.lossScale].data, sizeof scale);
  // The Forward phase alone, as a micro-batch of trainStep runs it (on a GPU, the same captured
  // graph: replaying it changes neither it nor its pointers, so training's graphs stay valid).
  double sum = 0;
  float first = 0;
  for (uint64_t m = 0; m < count; ++m) {
    TokenBatch batch = loader.batch(m);
    float value = ringLoss(ringShare(batch).part(forward(batch)));
    if (m == 0)
      first = value;
    sum += double(value);
  }
  for (size_t i = 0; i < saved.size(); ++i) {
    const uint32_t t = forwardPersistentWrites_[i];
    beforeHostWrite(t);
    std::memcpy(views_[t].data, saved[i].data(), saved[i].size());
    uploadTensor(t);
  }
  setLossScale(scale);
  // The mean as trainStep takes it: one batch's loss as it is, else the f64 mean.
  return count == 1 ? first : float(sum / double(count));
}

std::vector<std::pair<std::string, int>> Executor::galoreSkipped() const {
  // Every refresh writes its slot of one status vector: one small read per step.
  std::vector<std::pair<std::string, int>> skipped;
  std::optional<uint32_t> status;
  for (const KernelInfo &k : plan_.kernels)
    if (k.kind == KernelKind::GaloreRefresh) {
      if (!status) {
        status = k.outputs[2];
        downloadTensor(*status);
      }
      float value;
      std::memcpy(&value,
                  static_cast<const float *>(views_[*status].data) +
                      k.attrsAs<GaloreRefreshAttrs>().slot,
                  sizeof value);
      // Positive: this step's refresh failed; negative: an earlier failure not retried now.
      if (value > 0.0f)
        skipped.emplace_back(plan_.tensors[k.inputs[0]].name, int(value));
    }
  return skipped;
}

std::optional<Fp8Summary> Executor::fp8Summary() const {
  std::vector<uint32_t> states = plan_.fp8States();
  if (states.empty())
    return std::nullopt;
  static const char *const operands[3] = {"input", "weight", "grad_output"};
  Fp8Summary summary;
  summary.tensors = states.size();
  for (uint32_t t : states) {
    // One small copy per state, as for the loss and the metrics.
    downloadTensor(t);
    const TensorInfo &info = plan_.tensors[t];
    const int64_t columns = info.shape[1];
    std::vector<float> values(size_t(info.numel));
    std::memcpy(values.data(), views_[t].data, values.size() * sizeof(float));
    std::string weight = info.name.substr(0, info.name.size() - 4); // without ".fp8"
    for (int64_t row = 0; row < 3; ++row) {
      const float *r = values.data() + row * columns;
      summary.operands.push_back({weight, operands[row], r[fp8::ScaleColumn], r[fp8::AmaxColumn],
                                  r[fp8::UnderflowColumn], r[fp8::SaturationColumn]});
    }
  }
  return summary;
}

float Executor::runStep() {
  setLossScale(1.0f);
  runPhase(Phase::Forward);
  touch(plan_.loss);
  float value = loss();
  runPhase(Phase::Backward);
  runPhase(Phase::Update);
  return value;
}

std::vector<ArenaUsage> Executor::memoryUsage() const {
  std::vector<ArenaUsage> usage;
  for (size_t i = 0; i < plan_.arenas.size(); ++i)
    usage.push_back({&plan_.arenas[i], plan_.arenas[i].size, measured_[i]});
  return usage;
}

} // namespace bonsai::rt
