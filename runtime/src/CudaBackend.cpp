//===- CudaBackend.cpp - Runs a plan's phases on a CUDA device ------------===//
//
// In a build with the CUDA backend (BONSAI_HAVE_CUDA), the CUDA KernelBackend: one device arena
// per plan arena (cudaMalloc once, zeroed; cudaHostAlloc for a pinned host arena), a view per
// plan tensor at the same offsets as on the host, and each kernel handed to the CUDA backend's
// handler of its kind (CudaKernelHandlers.cpp). Each phase is captured as a CUDA Graph the first
// time it runs and replayed after, so a step costs a few graph launches instead of hundreds of
// kernel launches; if a capture fails (a kernel that cannot be captured), the phase runs eagerly
// and says so once. A kernel on the host stream (docs/offload.md, "The host step") is a host
// function in stream order (cudaLaunchHostFunc; a host node of the graph) that runs the kind's
// host handler (HostKernelHandlers.cpp) on pinned host memory. In a build without CUDA, asking
// for a GPU is an error that says why.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/KernelBackend.h"

#ifdef BONSAI_HAVE_CUDA

#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/NcclCommunicator.h"

#include "CudaKernelCall.h"
#include "HostKernelHandlers.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace bonsai::rt {

namespace {

/// Throws rt::Error naming the call unless `status` is cudaSuccess.
void check(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    throw Error(std::string("cuda backend: ") + call + " failed: " + cudaGetErrorName(status) +
                ": " + cudaGetErrorString(status));
}

class CudaBackend final : public KernelBackend {
public:
  CudaBackend(const LoadedPlan &plan, const CudaBackendOptions &options, const RankContext *ranks)
      : plan_(plan), useGraphs_(options.useGraphs), deterministic_(options.deterministic),
        ranks_(ranks) {
    const int ordinal = options.ordinal;
    const bool offloadTiming = options.offloadTiming;
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0)
      throw Error(std::string("no CUDA device is available (") +
                  (status != cudaSuccess ? cudaGetErrorString(status) : "none found") +
                  "); use --backend=cpu");
    if (ordinal < 0 || ordinal >= count)
      throw Error("cuda backend: device " + std::to_string(ordinal) + " requested, " +
                  std::to_string(count) + " present");
    check(cudaSetDevice(ordinal), "cudaSetDevice");
    check(cudaGetDeviceProperties(&props_, ordinal), "cudaGetDeviceProperties");
    size_t freeBefore = 0, total = 0;
    check(cudaMemGetInfo(&freeBefore, &total), "cudaMemGetInfo");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    gemm_ = std::make_unique<cuda::GemmEngine>();
    check(cudaMalloc(&deviceError_, sizeof(cuda::DeviceError)), "cudaMalloc(device error)");
    check(cudaMemset(deviceError_, 0, sizeof(cuda::DeviceError)), "cudaMemset(device error)");
    for (const ArenaInfo &arena : plan_.arenas) {
      void *p = nullptr;
      size_t bytes = std::max<uint64_t>(arena.size, 1);
      // A pinned host arena (offloaded state, docs/offload.md) is page-locked host memory the
      // copy kernels move over PCIe by DMA; the Executor has checked that the host has it.
      bool pinned = arena.space == MemorySpace::PinnedHost;
      cudaError_t status =
          pinned ? cudaHostAlloc(&p, bytes, cudaHostAllocDefault) : cudaMalloc(&p, bytes);
      if (status != cudaSuccess)
        throw Error("cuda backend: cannot allocate " +
                    std::string(pinned ? "pinned host arena '" : "arena '") + arena.name + "' of " +
                    std::to_string(arena.size) + " bytes " + (pinned ? "for " : "on ") +
                    props_.name + ": " + cudaGetErrorString(status));
      arenas_.push_back(p);
      pinned_.push_back(pinned);
      if (pinned)
        std::memset(p, 0, bytes);
      else
        check(cudaMemset(p, 0, bytes), "cudaMemset(arena)");
    }
    for (const TensorInfo &t : plan_.tensors) {
      TensorView v;
      v.data = static_cast<char *>(arenas_[t.arena]) + t.offset;
      v.dtype = t.dtype;
      v.shape = t.shape;
      v.quantBlock = t.quantBlock;
      v.quantDoubleBlock = t.quantDoubleBlock;
      views_.push_back(std::move(v));
    }
    // Offloaded plans issue their PCIe copies on a stream per direction (docs/offload.md,
    // "Overlap") and their host steps on a stream of their own; an event after each kernel
    // another stream waits for.
    if (plan_.usesSideStreams()) {
      for (unsigned s = 1; s < kNumStreams; ++s) {
        check(cudaStreamCreateWithFlags(&streams_[s], cudaStreamNonBlocking),
              "cudaStreamCreate(side stream)");
        check(cudaEventCreateWithFlags(&joinEvents_[s], cudaEventDisableTiming),
              "cudaEventCreate(join)");
      }
      check(cudaEventCreateWithFlags(&forkEvent_, cudaEventDisableTiming), "cudaEventCreate(fork)");
      kernelEvents_.assign(plan_.kernels.size(), nullptr);
      for (size_t i = 0; i < plan_.kernels.size(); ++i)
        if (plan_.kernels[i].signals)
          check(cudaEventCreateWithFlags(&kernelEvents_[i], cudaEventDisableTiming),
                "cudaEventCreate(kernel)");
      enqueuedIn_.assign(plan_.kernels.size(), 0);
    }
    // The offload telemetry's clock readings: a pair per compute-stream wait and per join of
    // the side streams (TelemetrySite), zero until the step's work writes them. The copies
    // are timed with events (TimedRun).
    timed_ = offloadTiming && plan_.offloads();
    if (timed_) {
      size_t bytes = stampCount() * sizeof(unsigned long long);
      check(cudaMalloc(&stamps_, bytes), "cudaMalloc(offload telemetry)");
      check(cudaMemset(stamps_, 0, bytes), "cudaMemset(offload telemetry)");
    }
    // The host steps' threads, started once; each host kernel's callback argument.
    for (size_t i = 0; i < plan_.kernels.size(); ++i)
      if (plan_.kernels[i].stream == StreamId::Host) {
        if (!hostPool_) {
          hostPool_ = std::make_unique<host::ThreadPool>();
          hostLaunches_.resize(plan_.kernels.size());
        }
        hostLaunches_[i] = HostLaunch{this, i};
      }
    // The collectives' NCCL communicator, started over the executor's host communicator
    // (every rank builds its backend at the same point, so every rank is here at once).
    // Ring attention (docs/ring-attention.md) passes its blocks through NCCL too, on a stream
    // of their own beside the compute stream.
    const bool ring = plan_.ringRanks > 1;
    if (plan_.hasCollectives() || ring) {
      const char *what = ring ? "ring attention" : "collectives";
      if (!ranks_ || !ranks_->host)
        throw Error("internal error: plan '" + plan_.path + "' has " + what +
                    " but the CUDA backend was given no communicator");
#ifdef BONSAI_HAVE_NCCL
      NcclCommunicatorOptions options;
      options.device = ordinal;
      nccl_ = NcclCommunicator::create(*ranks_->host, options);
#else
      throw Error("plan '" + plan_.path + "' has " + what +
                  ", but this build has no NCCL: the CUDA backend cannot run it (rebuild where "
                  "the CUDA toolkit has NCCL, or use --backend=cpu)");
#endif
    }
    if (ring)
      check(cudaStreamCreateWithFlags(&ringStream_, cudaStreamNonBlocking),
            "cudaStreamCreate(ring stream)");
    // Generated kernels are JIT-compiled now, once per plan: loading is not allowed while a
    // phase is being captured into a graph.
    if (!plan_.generatedKernels.empty())
      generated_ = std::make_unique<cuda::GeneratedKernels>(plan_.generatedKernels);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    freeAtStart_ = freeBefore;
    samplePeak();
  }

  ~CudaBackend() override {
    // No host step may still be running on the arenas freed below.
    cudaDeviceSynchronize();
    // NCCL is finalized while the arenas its collectives used still exist.
    nccl_.reset();
    if (ringStream_)
      cudaStreamDestroy(ringStream_);
    for (cudaEvent_t e : events_)
      cudaEventDestroy(e);
    for (cudaEvent_t e : kernelEvents_)
      if (e)
        cudaEventDestroy(e);
    for (unsigned s = 1; s < kNumStreams; ++s) {
      if (joinEvents_[s])
        cudaEventDestroy(joinEvents_[s]);
      if (streams_[s])
        cudaStreamDestroy(streams_[s]);
    }
    if (forkEvent_)
      cudaEventDestroy(forkEvent_);
    if (stamps_)
      cudaFree(stamps_);
    for (auto &[key, run] : timedRuns_) {
      if (run.origin)
        cudaEventDestroy(run.origin);
      for (CopyTiming &c : run.copies) {
        cudaEventDestroy(c.begin);
        cudaEventDestroy(c.end);
      }
    }
    for (auto &entry : graphs_)
      if (entry.second)
        cudaGraphExecDestroy(entry.second);
    if (guardExec_)
      cudaGraphExecDestroy(guardExec_);
    for (size_t i = 0; i < arenas_.size(); ++i)
      pinned_[i] ? cudaFreeHost(arenas_[i]) : cudaFree(arenas_[i]);
    if (guard_)
      cudaFree(guard_);
    if (guardNorms_)
      cudaFree(guardNorms_);
    if (bodyStream_)
      cudaStreamDestroy(bodyStream_);
    if (deviceError_)
      cudaFree(deviceError_);
    gemm_.reset();
    if (stream_)
      cudaStreamDestroy(stream_);
  }

  bool hasOwnMemory() const override { return true; }

  void *sharedHostArena(size_t arena) const override {
    return pinned_.at(arena) ? arenas_[arena] : nullptr;
  }

  std::string describe() const override {
    // The device name is up to 256 characters: build the string instead of bounding a buffer.
    char rest[96];
    std::snprintf(rest, sizeof rest, " (sm_%d%d, %.1f GiB), CUDA Graphs %s%s", props_.major,
                  props_.minor, double(props_.totalGlobalMem) / (1 << 30),
                  useGraphs_ ? "on" : "off", deterministic_ ? "" : ", nondeterministic");
    return std::string(props_.name) + rest;
  }

  void uploadArena(size_t arena, uint64_t offset, const void *host, uint64_t bytes) override {
    // cudaMemcpyDefault: the arena may be device or pinned host memory (unified addressing
    // tells them apart).
    check(cudaMemcpyAsync(static_cast<char *>(arenas_.at(arena)) + offset, host, bytes,
                          cudaMemcpyDefault, stream_),
          "cudaMemcpyAsync(upload arena)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(upload arena)");
  }

  void downloadArena(size_t arena, void *host, uint64_t bytes) override {
    check(cudaMemcpyAsync(host, arenas_.at(arena), bytes, cudaMemcpyDefault, stream_),
          "cudaMemcpyAsync(download arena)");
    synchronize();
  }

  void uploadTensor(uint32_t tensor, const void *host) override {
    // Waits, so that the caller may reuse the host bytes at once.
    check(cudaMemcpyAsync(views_.at(tensor).data, host, plan_.tensors[tensor].bytes,
                          cudaMemcpyDefault, stream_),
          "cudaMemcpyAsync(upload tensor)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(upload tensor)");
  }

  void downloadTensor(uint32_t tensor, void *host) override {
    check(cudaMemcpyAsync(host, views_.at(tensor).data, plan_.tensors[tensor].bytes,
                          cudaMemcpyDefault, stream_),
          "cudaMemcpyAsync(download tensor)");
    synchronize();
  }

  void setProfiling(bool on) override {
    profiling_ = on;
    times_.assign(plan_.kernels.size(), 0.0);
  }

  const std::vector<double> &kernelMilliseconds() const override { return times_; }

  void kernelAttrsChanged() override {
    // Wait for any replay still reading the graphs before destroying them.
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    for (auto &entry : graphs_)
      if (entry.second)
        cudaGraphExecDestroy(entry.second);
    graphs_.clear();
    if (guardExec_)
      cudaGraphExecDestroy(guardExec_);
    guardExec_ = nullptr;
    guardCaptured_ = false;
  }

  void runKernels(const std::vector<size_t> &kernels) override {
    runKernelsOn(kernels, nullptr);
  }

  void runGuardedUpdate(const UpdateGuard &guard, bool skip, float normLimit) override {
    prepareGuard(guard);
    // The limit changes only where the spike rule is on; a write ahead of the graph, in
    // stream order (a pageable source is staged at once, so a local may go out of scope).
    if (!skip && guard.limitedNorm >= 0 &&
        std::memcmp(&normLimit, &deviceNormLimit_, sizeof normLimit) != 0) {
      check(cudaMemcpyAsync(&guard_->normLimit, &normLimit, sizeof normLimit,
                            cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync(guard limit)");
      deviceNormLimit_ = normLimit;
    }
    if (skip) {
      // The host saw a non-finite loss: nothing guarded runs, and there is nothing to check.
      runKernels(guard.check);
      runKernels(guard.always);
      hostSkipped_ = true;
      return;
    }
    hostSkipped_ = false;
    // A conditional body cannot hold host nodes: an update with a host step in it runs as
    // below, the host reading the verdict (a host step belongs in the backward pass anyway,
    // docs/offload.md, "The host step").
    // Nor, here, collectives: NCCL's captured work is not known to be conditional-node safe,
    // and every rank decides alike from the global norms anyway.
    if (useGraphs_ && !profiling_ && !hasHostKernel(guard.guarded) &&
        !hasCollective(guard.guarded)) {
      if (!guardCaptured_) {
        guardExec_ = captureGuarded(guard);
        guardCaptured_ = true;
      }
      if (guardExec_) {
        check(cudaGraphLaunch(guardExec_, stream_), "cudaGraphLaunch(update)");
        launched(guardRuns_);
        return;
      }
    }
    // Without a graph the host decides, after one synchronisation.
    runKernels(guard.check);
    cuda::guardCheck(guardNorms_, int(guard.norms.size()), guard.limitedNorm, guard_, 0, false,
                     stream_);
    if (updateVerdict() == UpdateVerdict::Ran)
      runKernels(guard.guarded);
    runKernels(guard.always);
  }

  UpdateVerdict updateVerdict() override {
    if (hostSkipped_)
      return UpdateVerdict::SkippedByHost;
    synchronize();
    int32_t verdict = 0;
    check(cudaMemcpy(&verdict, &guard_->verdict, sizeof verdict, cudaMemcpyDeviceToHost),
          "cudaMemcpy(guard verdict)");
    return UpdateVerdict(verdict);
  }

  void runPhase(Phase phase) override {
    if (profiling_) {
      runPhaseProfiled(phase);
      return;
    }
    if (!useGraphs_) {
      runPhaseEagerly(phase);
      return;
    }
    auto it = graphs_.find(phase);
    if (it == graphs_.end())
      it = graphs_.emplace(phase, capture(phase)).first;
    if (!it->second) {
      runPhaseEagerly(phase);
      return;
    }
    check(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
    launched(graphRuns_[phase]);
  }

  void synchronize() override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    samplePeak();
    rethrowHostError();
    cuda::DeviceError error;
    check(cudaMemcpy(&error, deviceError_, sizeof error, cudaMemcpyDeviceToHost),
          "cudaMemcpy(device error)");
    if (error.code == cuda::kNoDeviceError)
      return;
    check(cudaMemset(deviceError_, 0, sizeof error), "cudaMemset(device error)");
    std::string what = error.code == cuda::kIdOutOfRange ? "an id" : "a label";
    std::string kernel = error.kernel >= 0 && size_t(error.kernel) < plan_.kernels.size()
                             ? plan_.describeKernel(size_t(error.kernel))
                             : "kernel " + std::to_string(error.kernel);
    if (error.code == cuda::kZeroNorm)
      throw Error(kernel + ": row " + std::to_string(error.index) +
                  " of w + scale·lora_b·lora_a has norm 0: its direction is undefined");
    if (error.code == cuda::kZeroMagnitude)
      throw Error(kernel + ": magnitude[" + std::to_string(error.index) +
                  "] is 0: the row's pre-scale output cannot be recovered from y to form its "
                  "gradient (compile with --fuse-disable=dora to keep it instead)");
    throw Error(kernel + ": " + what + " out of range: element " + std::to_string(error.index) +
                " is " + std::to_string(error.value));
  }

  uint64_t measuredDeviceBytes() const override { return measured_; }

private:
  /// The driver's view of what this process holds on the device (arenas, the cuBLASLt
  /// workspace, the graphs' memory pools with the kernels' scratch), sampled at every
  /// synchronisation: the measured peak.
  void samplePeak() {
    size_t freeNow = 0, total = 0;
    check(cudaMemGetInfo(&freeNow, &total), "cudaMemGetInfo");
    if (freeAtStart_ > freeNow)
      measured_ = std::max<uint64_t>(measured_, freeAtStart_ - freeNow);
  }

  /// Captures the kernels of `phase` into an executable graph; null if capture fails.
  cudaGraphExec_t capture(Phase phase) {
    std::string failure;
    cudaGraphExec_t exec = captureGrowingScratch(
        [&](std::string &why) { return captureOnce(phase, why); }, failure);
    if (!exec)
      std::fprintf(stderr, "cuda backend: phase %d runs without a CUDA Graph: %s\n", int(phase),
                   failure.c_str());
    return exec;
  }

  cudaGraphExec_t captureOnce(Phase phase, std::string &failure) {
    cudaGraph_t graph = nullptr;
    capturedRuns_.clear();
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    try {
      runPhaseEagerly(phase);
    } catch (const Error &e) {
      failure = e.what();
    }
    graphRuns_[phase] = capturedRuns_;
    return endCapture(graph, failure);
  }

  /// Runs `attempt` (a capture), and again after growing the scratch arena while a capture
  /// fails because a conditional body's scratch did not fit it. A capture stops at the first
  /// request that does not fit, so a later, larger one is found by the next attempt: the
  /// attempts are bounded by the distinct sizes of the bodies' kernels.
  template <typename Attempt>
  cudaGraphExec_t captureGrowingScratch(Attempt attempt, std::string &failure) {
    cuda::ScratchArena::Lend lend(scratch_);
    cudaGraphExec_t exec = attempt(failure);
    while (!exec && scratch_.needed() > scratch_.capacity()) {
      scratch_.growToNeeded();
      failure.clear();
      exec = attempt(failure);
    }
    return exec;
  }

  /// Ends the capture on stream_ begun by the caller and instantiates its graph; null, with
  /// `failure` saying why, when `failure` was already set, the capture was invalidated or the
  /// driver will not instantiate the graph (its result code and the offending node's type).
  /// Errors are cleared so that the next launch's check does not report them: the work then
  /// runs eagerly.
  cudaGraphExec_t endCapture(cudaGraph_t graph, std::string &failure) {
    cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (failure.empty() && end != cudaSuccess)
      failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
    cudaGetLastError(); // Clear the error a failed capture leaves behind.
    cudaGraphExec_t exec = nullptr;
    if (failure.empty()) {
      cudaGraphInstantiateParams params{};
      cudaError_t instantiated = cudaGraphInstantiateWithParams(&exec, graph, &params);
      if (instantiated != cudaSuccess || params.result_out != cudaGraphInstantiateSuccess) {
        cudaGetLastError();
        exec = nullptr;
        failure = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(instantiated) +
                  " (" + instantiateResultName(params.result_out);
        cudaGraphNodeType type;
        if (params.errNode_out && cudaGraphNodeGetType(params.errNode_out, &type) == cudaSuccess)
          failure += std::string(", at a ") + nodeTypeName(type) + " node";
        failure += ")";
      }
    }
    if (graph)
      cudaGraphDestroy(graph);
    return exec;
  }

  static const char *instantiateResultName(cudaGraphInstantiateResult result) {
    switch (result) {
    case cudaGraphInstantiateSuccess:
      return "success";
    case cudaGraphInstantiateError:
      return "error";
    case cudaGraphInstantiateInvalidStructure:
      return "invalid structure";
    case cudaGraphInstantiateNodeOperationNotSupported:
      return "a node operation is not supported";
    case cudaGraphInstantiateMultipleDevicesNotSupported:
      return "multiple devices";
    case cudaGraphInstantiateConditionalHandleUnused:
      return "a conditional handle is unused";
    }
    return "unknown result";
  }

  static const char *nodeTypeName(cudaGraphNodeType type) {
    switch (type) {
    case cudaGraphNodeTypeKernel:
      return "kernel";
    case cudaGraphNodeTypeMemcpy:
      return "memcpy";
    case cudaGraphNodeTypeMemset:
      return "memset";
    case cudaGraphNodeTypeHost:
      return "host";
    case cudaGraphNodeTypeGraph:
      return "child graph";
    case cudaGraphNodeTypeEmpty:
      return "empty";
    case cudaGraphNodeTypeMemAlloc:
      return "memory allocation";
    case cudaGraphNodeTypeMemFree:
      return "memory free";
    case cudaGraphNodeTypeConditional:
      return "conditional";
    default:
      return "other";
    }
  }

  /// The guard's device memory: its scalars and the array of its norms' addresses, once.
  void prepareGuard(const UpdateGuard &guard) {
    if (guard_)
      return;
    check(cudaMalloc(&guard_, sizeof(cuda::GuardState)), "cudaMalloc(guard state)");
    cuda::GuardState initial{0, deviceNormLimit_};
    check(cudaMemcpy(guard_, &initial, sizeof initial, cudaMemcpyHostToDevice),
          "cudaMemcpy(guard state)");
    std::vector<const float *> norms;
    for (uint32_t t : guard.norms)
      norms.push_back(static_cast<const float *>(views_[t].data));
    check(cudaMalloc(&guardNorms_, std::max<size_t>(norms.size(), 1) * sizeof(float *)),
          "cudaMalloc(guard norms)");
    if (!norms.empty())
      check(cudaMemcpy(guardNorms_, norms.data(), norms.size() * sizeof(float *),
                       cudaMemcpyHostToDevice),
            "cudaMemcpy(guard norms)");
  }

  /// The guarded update as one executable graph, captured once on the backend's stream:
  ///
  ///   the check kernels -> guard_check, which sets the handle to 1 when the norms are finite
  ///   -> an IF node on the handle (CUDA 12.4 conditional nodes), whose body, captured on a
  ///      second stream straight into the node's graph, holds the guarded kernels
  ///   -> the always kernels (clearing the accumulators)
  ///
  /// The node is added in the middle of the capture, as GaLore's refresh adds its own
  /// (cuda/GaLore.cu, captureIfDue). Null, after a message, if it cannot be built (a guarded
  /// kernel that allocates scratch memory, which a conditional body may not): the update then
  /// runs eagerly, the host reading the flag.
  cudaGraphExec_t captureGuarded(const UpdateGuard &guard) {
    if (!bodyStream_)
      check(cudaStreamCreateWithFlags(&bodyStream_, cudaStreamNonBlocking),
            "cudaStreamCreate(conditional body)");
    std::string failure;
    cudaGraphExec_t exec = captureGrowingScratch(
        [&](std::string &why) { return captureGuardedOnce(guard, why); }, failure);
    if (!exec)
      std::fprintf(stderr,
                   "cuda backend: the guarded update runs without a CUDA Graph (one "
                   "synchronisation per step): %s\n",
                   failure.c_str());
    return exec;
  }

  cudaGraphExec_t captureGuardedOnce(const UpdateGuard &guard, std::string &failure) {
    cudaGraph_t graph = nullptr;
    capturedRuns_.clear();
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    try {
      // The check and always kernels stay on stream_, in order, copies included (the first
      // update's prefetched copies may lead the phase): a copy stream that joined this
      // capture could not then join the conditional body's, a capture of its own.
      runStreamed(guard.check, stream_, /*scratchScopes=*/false, /*copyStreams=*/false);
      cudaStreamCaptureStatus status;
      cudaGraph_t capturing = nullptr;
      check(cudaStreamGetCaptureInfo(stream_, &status, nullptr, &capturing, nullptr, nullptr,
                                     nullptr),
            "cudaStreamGetCaptureInfo");
      cudaGraphConditionalHandle handle;
      check(cudaGraphConditionalHandleCreate(&handle, capturing, 0, cudaGraphCondAssignDefault),
            "cudaGraphConditionalHandleCreate");
      cuda::guardCheck(guardNorms_, int(guard.norms.size()), guard.limitedNorm, guard_, handle,
                       true, stream_);
      const cudaGraphNode_t *dependencies = nullptr;
      size_t count = 0;
      check(cudaStreamGetCaptureInfo(stream_, &status, nullptr, &capturing, &dependencies,
                                     nullptr, &count),
            "cudaStreamGetCaptureInfo");
      cudaGraphNodeParams params{};
      params.type = cudaGraphNodeTypeConditional;
      params.conditional.handle = handle;
      params.conditional.type = cudaGraphCondTypeIf;
      params.conditional.size = 1;
      cudaGraphNode_t node = nullptr;
      check(cudaGraphAddNode(&node, capturing, dependencies, nullptr, count, &params),
            "cudaGraphAddNode(conditional)");
      check(cudaStreamUpdateCaptureDependencies(stream_, &node, nullptr, 1,
                                                cudaStreamSetCaptureDependencies),
            "cudaStreamUpdateCaptureDependencies");
      check(cudaStreamBeginCaptureToGraph(bodyStream_, params.conditional.phGraph_out[0],
                                          nullptr, nullptr, 0,
                                          cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCaptureToGraph");
      try {
        // The body may not allocate: each kernel's scratch comes from the arena, reused by
        // the next kernel (the body's compute stream runs them in order; the copies on the
        // copy streams take none).
        runStreamed(guard.guarded, bodyStream_, /*scratchScopes=*/true);
      } catch (...) {
        cudaGraph_t ended = nullptr;
        cudaStreamEndCapture(bodyStream_, &ended);
        throw;
      }
      cudaGraph_t ended = nullptr;
      check(cudaStreamEndCapture(bodyStream_, &ended), "cudaStreamEndCapture(conditional body)");
      runStreamed(guard.always, stream_, /*scratchScopes=*/false, /*copyStreams=*/false);
    } catch (const Error &e) {
      failure = e.what();
    }
    guardRuns_ = capturedRuns_;
    return endCapture(graph, failure);
  }

  /// Each kernel between two events; the times are read once the phase is done.
  void runPhaseProfiled(Phase phase) {
    std::vector<size_t> kernels;
    for (size_t i = 0; i < plan_.kernels.size(); ++i)
      if (plan_.kernels[i].phase == phase)
        kernels.push_back(i);
    runKernelsProfiled(kernels);
  }

  void runKernelsProfiled(const std::vector<size_t> &kernels) {
    while (events_.size() < 2 * kernels.size()) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    for (size_t j = 0; j < kernels.size(); ++j) {
      check(cudaEventRecord(events_[2 * j], stream_), "cudaEventRecord");
      try {
        runKernel(kernels[j]);
      } catch (const Error &e) {
        throw Error(plan_.describeKernel(kernels[j]) + ": " + e.what());
      }
      check(cudaEventRecord(events_[2 * j + 1], stream_), "cudaEventRecord");
    }
    synchronize();
    for (size_t j = 0; j < kernels.size(); ++j) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[2 * j], events_[2 * j + 1]),
            "cudaEventElapsedTime");
      times_[kernels[j]] += ms;
    }
  }

  void runPhasePrefix(Phase phase, size_t end) override {
    runPhaseEagerly(phase, std::min(end, plan_.kernels.size()));
  }

  void runPhaseEagerly(Phase phase) { runPhaseEagerly(phase, plan_.kernels.size()); }

  void runPhaseEagerly(Phase phase, size_t end) {
    std::vector<size_t> kernels;
    for (size_t i = 0; i < end; ++i)
      if (plan_.kernels[i].phase == phase)
        kernels.push_back(i);
    runStreamed(kernels, stream_, /*scratchScopes=*/false);
  }

  /// Enqueues `kernels` (plan indices) in order on `stream` (null: the backend's, timed
  /// kernel by kernel when profiling, on that one stream).
  void runKernelsOn(const std::vector<size_t> &kernels, cudaStream_t stream) {
    if (profiling_ && !stream) {
      runKernelsProfiled(kernels);
      return;
    }
    runStreamed(kernels, stream ? stream : stream_, /*scratchScopes=*/false);
  }

  /// Enqueues `kernels` (plan indices of one phase, in plan order): a compute-stream kernel
  /// on `compute`, a copy on its copy stream, a host step on the host stream. The side streams
  /// start from the work enqueued on `compute` before these kernels (an event), each kernel
  /// first waits for the kernels of other streams it must follow (KernelInfo::waits, an event
  /// each), and `compute` ends waiting for each side stream's last kernel, so that to the
  /// caller the kernels are one block of `compute`'s work, as on one stream. Under a capture
  /// the events are the graph's edges. A wait for a kernel not among `kernels` is left out: that
  /// kernel ran before them on `compute` (the guard's check kernels) and the fork covers it. With
  /// `scratchScopes` (a conditional body), each compute kernel's scratch is a
  /// ScratchArena::BodyScope. Without `copyStreams`, every kernel runs on `compute`, in plan order.
  void runStreamed(const std::vector<size_t> &kernels, cudaStream_t compute, bool scratchScopes,
                   bool copyStreams = true) {
    std::array<bool, kNumStreams> used{};
    bool forked = false;
    TimedRun *run = nullptr;
    ++run_;
    auto join = [&] {
      for (unsigned s = 1; s < kNumStreams; ++s)
        if (used[s]) {
          check(cudaEventRecord(joinEvents_[s], streams_[s]), "cudaEventRecord(join)");
          check(cudaStreamWaitEvent(compute, joinEvents_[s], 0), "cudaStreamWaitEvent(join)");
        }
    };
    for (size_t at = 0; at < kernels.size(); ++at) {
      size_t i = kernels[at];
      const KernelInfo &kernel = plan_.kernels[i];
      unsigned s = copyStreams ? unsigned(kernel.stream) : 0;
      cudaStream_t stream = s == 0 ? compute : streams_[s];
      try {
        if (size_t run = zeroRun(kernels, at, copyStreams); run > 1) {
          // One memset for the run (GPT-2's update zeroes its 148 gradient accumulators, one
          // 475 MiB range): the bytes the kernels would write, one graph node instead of 148.
          const TensorView &first = views_[kernel.outputs[0]];
          const TensorView &last = views_[plan_.kernels[kernels[at + run - 1]].outputs[0]];
          size_t bytes = size_t(static_cast<const char *>(last.data) + last.bytes() -
                                static_cast<const char *>(first.data));
          check(cudaMemsetAsync(first.data, 0, bytes, compute), "cudaMemsetAsync(zero run)");
          at += run - 1;
          continue;
        }
        if (s != 0 && !forked) {
          check(cudaEventRecord(forkEvent_, compute), "cudaEventRecord(fork)");
          forked = true;
        }
        if (s != 0 && !used[s])
          check(cudaStreamWaitEvent(stream, forkEvent_, 0), "cudaStreamWaitEvent(fork)");
        used[s] = true;
        // A compute kernel's waits for other streams are timed: what the compute stream
        // stood still for is the offload's exposed time.
        bool waits = timed_ && copyStreams && s == 0 &&
                     std::any_of(kernel.waits.begin(), kernel.waits.end(),
                                 [&](uint32_t w) { return enqueuedIn_[w] == run_; });
        if (waits)
          stamp(i, TelemetrySite::Wait, 0, stream);
        for (uint32_t w : kernel.waits)
          if (copyStreams && enqueuedIn_[w] == run_)
            check(cudaStreamWaitEvent(stream, kernelEvents_[w], 0), "cudaStreamWaitEvent");
        if (waits)
          stamp(i, TelemetrySite::Wait, 1, stream);
        // A copy is timed between two events (no SM needed, unlike a clock-reading kernel,
        // which would wait behind the compute stream's blocks); a conditional body may hold
        // no event records, so copies there go untimed.
        CopyTiming *copy = nullptr;
        if (timed_ && !scratchScopes &&
            kernelKindInfo(kernel.kind).has(kernel_traits::kCrossesSpaces)) {
          if (!run)
            run = &beginTimedRun(kernels, compute);
          copy = &run->copy(i, s == 0);
          recordTimingEvent(copy->begin, stream);
        }
        if (scratchScopes && s == 0) {
          cuda::ScratchArena::BodyScope scratch;
          runKernel(i, stream);
        } else {
          runKernel(i, stream);
        }
        if (copy)
          recordTimingEvent(copy->end, stream);
        if (kernel.signals) {
          check(cudaEventRecord(kernelEvents_[i], stream), "cudaEventRecord");
          enqueuedIn_[i] = run_;
        }
      } catch (const Error &e) {
        // Join what was forked, so that a capture ends cleanly and reports this error.
        join();
        throw Error(plan_.describeKernel(i) + ": " + e.what());
      }
    }
    // The compute stream's wait for the side streams' last kernels is timed as well.
    bool joins = std::any_of(used.begin() + 1, used.end(), [](bool u) { return u; });
    if (joins)
      stamp(kernels.back(), TelemetrySite::Join, 0, compute);
    join();
    if (joins)
      stamp(kernels.back(), TelemetrySite::Join, 1, compute);
  }

  /// The number of kernels from position `at` of `kernels` that one memset can zero: a run of
  /// Zero kernels on the compute stream, none waiting for another stream or waited for, whose
  /// outputs follow one another in memory (the update zeroes the gradient accumulators in the
  /// order the memory plan lays them out). 1 when kernels[at] is not the start of such a run.
  size_t zeroRun(const std::vector<size_t> &kernels, size_t at, bool copyStreams) const {
    auto mergeable = [&](size_t i) {
      const KernelInfo &k = plan_.kernels[i];
      return k.kind == KernelKind::Zero && k.outputs.size() == 1 && !k.signals &&
             (!copyStreams || (k.stream == StreamId::Compute && k.waits.empty()));
    };
    if (!mergeable(kernels[at]))
      return 1;
    const TensorView *previous = &views_[plan_.kernels[kernels[at]].outputs[0]];
    size_t run = 1;
    for (size_t j = at + 1; j < kernels.size() && mergeable(kernels[j]); ++j, ++run) {
      const TensorView &next = views_[plan_.kernels[kernels[j]].outputs[0]];
      if (next.data != static_cast<const char *>(previous->data) + previous->bytes())
        break;
      previous = &next;
    }
    return run;
  }

  /// The offload telemetry's waits: the compute stream's waits before a kernel, and its wait
  /// for the side streams after the last kernel of a run of runStreamed, each between two
  /// readings of the GPU's clock (a kernel on the compute stream, which runs in order anyway:
  /// it costs the launch, and works inside a conditional body too).
  enum class TelemetrySite : unsigned { Wait = 0, Join = 1 };
  static constexpr unsigned kTelemetrySites = 2;

  /// A copy's pair of timing events and whether the compute stream ran it.
  struct CopyTiming {
    size_t kernel = 0;
    bool onCompute = false;
    cudaEvent_t begin = nullptr, end = nullptr;
  };
  /// The copies of one run of runStreamed (its kernels, outside a conditional body), timed
  /// from an event the compute stream records before them; `pending` once enqueued or
  /// launched in a graph since the last takeOffloadTimes.
  struct TimedRun {
    cudaEvent_t origin = nullptr;
    std::vector<CopyTiming> copies;
    bool pending = false;
    CopyTiming &copy(size_t kernel, bool onCompute) {
      for (CopyTiming &c : copies)
        if (c.kernel == kernel) {
          c.onCompute = onCompute;
          return c;
        }
      CopyTiming c;
      c.kernel = kernel;
      c.onCompute = onCompute;
      check(cudaEventCreate(&c.begin), "cudaEventCreate(copy timing)");
      check(cudaEventCreate(&c.end), "cudaEventCreate(copy timing)");
      copies.push_back(c);
      return copies.back();
    }
  };

  /// The timing record of the run of `kernels` (the same kernels reuse it), its origin
  /// recorded on `compute` now; a graph being captured launches it (capturedRuns_), else it
  /// is pending at once.
  TimedRun &beginTimedRun(const std::vector<size_t> &kernels, cudaStream_t compute) {
    auto key = std::make_pair(kernels.front(), kernels.size());
    TimedRun &run = timedRuns_[key];
    if (!run.origin)
      check(cudaEventCreate(&run.origin), "cudaEventCreate(copy timing)");
    recordTimingEvent(run.origin, compute);
    if (capturing(compute))
      capturedRuns_.push_back(&run);
    else
      run.pending = true;
    return run;
  }

  /// Whether `stream` is capturing (an invalidated capture included: nothing it records runs).
  static bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }

  /// Records a timing event; in a capture, as an event record node of the graph.
  static void recordTimingEvent(cudaEvent_t event, cudaStream_t stream) {
    check(cudaEventRecordWithFlags(
              event, stream, capturing(stream) ? cudaEventRecordExternal : cudaEventRecordDefault),
          "cudaEventRecord(copy timing)");
  }

  /// Marks the timed runs a graph holds as launched.
  static void launched(const std::vector<TimedRun *> &runs) {
    for (TimedRun *run : runs)
      run->pending = true;
  }
  size_t stampCount() const { return plan_.kernels.size() * kTelemetrySites * 2; }
  size_t stampIndex(size_t kernel, TelemetrySite site, unsigned end) const {
    return (kernel * kTelemetrySites + unsigned(site)) * 2 + end;
  }
  void stamp(size_t kernel, TelemetrySite site, unsigned end, cudaStream_t stream) {
    if (timed_)
      cuda::stampTime(stamps_ + stampIndex(kernel, site, end), stream);
  }

  void runKernel(size_t index) { runKernel(index, stream_); }

  void runKernel(size_t index, cudaStream_t stream) {
    if (plan_.kernels[index].stream == StreamId::Host) {
      // In stream order on whichever stream runs it (the host stream, or the compute stream
      // when kernels run in order); a failure is kept for the next synchronisation.
      check(cudaLaunchHostFunc(stream, &CudaBackend::runOnHost, &hostLaunches_[index]),
            "cudaLaunchHostFunc");
      return;
    }
    cuda::Context ctx;
    ctx.stream = stream;
    ctx.gemm = gemm_.get();
    ctx.deviceError = deviceError_;
    ctx.kernelIndex = int32_t(index);
    ctx.deterministic = deterministic_;
    launchOnCuda(CudaCall(KernelCall(plan_, index, views_, ranks_), ctx, generated_.get(),
                          nccl_.get(), ringStream_));
  }

  /// A host kernel's callback argument.
  struct HostLaunch {
    CudaBackend *backend = nullptr;
    size_t index = 0;
  };

  /// The host function of a kernel on the host stream, called by the driver's thread in stream
  /// order. It may not call CUDA, and cannot throw into it: its first failure is kept, and the
  /// kernels after a failure do nothing until the next synchronisation reports it.
  static void CUDART_CB runOnHost(void *argument) {
    const HostLaunch &launch = *static_cast<const HostLaunch *>(argument);
    CudaBackend &self = *launch.backend;
    std::lock_guard<std::mutex> lock(self.hostErrorMutex_);
    if (self.hostError_)
      return;
    try {
      auto start = std::chrono::steady_clock::now();
      launchOnHost(KernelCall(self.plan_, launch.index, self.views_), *self.hostPool_);
      self.hostSeconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } catch (const std::exception &e) {
      self.hostError_ = std::make_exception_ptr(
          Error(self.plan_.describeKernel(launch.index) + " (on the host): " + e.what()));
    }
  }

  OffloadTimes takeOffloadTimes() override {
    OffloadTimes times;
    times.timed = timed_;
    {
      std::lock_guard<std::mutex> lock(hostErrorMutex_);
      times.hostStepSeconds = std::exchange(hostSeconds_, 0.0);
    }
    if (!timed_)
      return times;
    // The readings of the work done since the last call (the caller synchronised); a site
    // not run since reads zero.
    std::vector<unsigned long long> stamps(stampCount());
    check(cudaMemcpy(stamps.data(), stamps_, stamps.size() * sizeof stamps[0],
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy(offload telemetry)");
    check(cudaMemsetAsync(stamps_, 0, stamps.size() * sizeof stamps[0], stream_),
          "cudaMemsetAsync(offload telemetry)");
    auto span = [&](size_t kernel, TelemetrySite site) -> std::pair<double, double> {
      unsigned long long begin = stamps[stampIndex(kernel, site, 0)];
      unsigned long long end = stamps[stampIndex(kernel, site, 1)];
      if (!begin || end < begin)
        return {0, 0};
      return {double(begin) * 1e-9, double(end) * 1e-9};
    };
    for (size_t i = 0; i < plan_.kernels.size(); ++i)
      for (TelemetrySite site : {TelemetrySite::Wait, TelemetrySite::Join}) {
        auto [begin, end] = span(i, site);
        times.exposedSeconds += end - begin;
      }
    // The copies of each run launched since, from its origin; runs follow one another on the
    // compute stream, so the union is taken run by run.
    for (auto &[key, run] : timedRuns_) {
      if (!run.pending || copyTimingBroken_)
        continue;
      run.pending = false;
      std::vector<std::pair<double, double>> toDevice, toHost;
      for (const CopyTiming &c : run.copies) {
        float begin = 0, end = 0;
        cudaError_t status = cudaEventElapsedTime(&begin, run.origin, c.begin);
        if (status == cudaSuccess)
          status = cudaEventElapsedTime(&end, run.origin, c.end);
        if (status != cudaSuccess) {
          cudaGetLastError();
          copyTimingBroken_ = true;
          std::fprintf(stderr,
                       "cuda backend: the copies cannot be timed (%s): the offload "
                       "metrics have no copy times\n",
                       cudaGetErrorString(status));
          break;
        }
        const KernelInfo &kernel = plan_.kernels[c.kernel];
        bool toPinned = plan_.copiesToHost(kernel);
        (toPinned ? times.toHostBytes : times.toDeviceBytes) +=
            plan_.tensors[kernel.outputs[0]].bytes;
        double from = double(begin) * 1e-3, to = double(end) * 1e-3;
        (toPinned ? toHost : toDevice).push_back({from, to});
        // A copy the compute stream ran itself (copies not overlapped) is exposed whole.
        if (c.onCompute)
          times.exposedSeconds += std::max(0.0, to - from);
      }
      times.toDeviceSeconds += unionLength(toDevice);
      times.toHostSeconds += unionLength(toHost);
    }
    return times;
  }

  /// The length of the union of the intervals [first, second).
  static double unionLength(std::vector<std::pair<double, double>> &intervals) {
    std::sort(intervals.begin(), intervals.end());
    double total = 0, coveredTo = -1;
    for (auto [begin, end] : intervals) {
      begin = std::max(begin, coveredTo);
      if (end > begin)
        total += end - begin;
      coveredTo = std::max(coveredTo, end);
    }
    return total;
  }

  void rethrowHostError() {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(hostErrorMutex_);
      std::swap(error, hostError_);
    }
    if (error)
      std::rethrow_exception(error);
  }

  bool hasCollective(const std::vector<size_t> &kernels) const {
    return std::any_of(kernels.begin(), kernels.end(), [&](size_t i) {
      return kernelKindInfo(plan_.kernels[i].kind).has(kernel_traits::kCollective);
    });
  }

  bool hasHostKernel(const std::vector<size_t> &kernels) const {
    return std::any_of(kernels.begin(), kernels.end(),
                       [&](size_t i) { return plan_.kernels[i].stream == StreamId::Host; });
  }

  /// The executor's plan (the only copy), read at every launch and capture.
  const LoadedPlan &plan_;
  bool useGraphs_;
  bool deterministic_; ///< every kernel's cuda::Context::deterministic
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::GemmEngine> gemm_;
  std::unique_ptr<cuda::GeneratedKernels> generated_;
  cuda::DeviceError *deviceError_ = nullptr;
  std::vector<void *> arenas_;
  /// Whether arena i is pinned host memory (cudaHostAlloc) rather than device memory.
  std::vector<bool> pinned_;
  std::vector<TensorView> views_;
  std::map<Phase, cudaGraphExec_t> graphs_;
  uint64_t measured_ = 0;
  size_t freeAtStart_ = 0;
  bool profiling_ = false;
  std::vector<double> times_;
  std::vector<cudaEvent_t> events_;
  /// The copy streams (index StreamId; [0] unused: the compute stream is stream_ or the
  /// conditional body's), null when the plan has no copies on them; the events that order
  /// them (kernelEvents_[i] for a kernel that signals); and, per kernel, the run of
  /// runStreamed that last recorded its event (run_ counts them), so that a wait refers to
  /// this run's record only.
  std::array<cudaStream_t, kNumStreams> streams_{};
  std::array<cudaEvent_t, kNumStreams> joinEvents_{};
  cudaEvent_t forkEvent_ = nullptr;
  std::vector<cudaEvent_t> kernelEvents_;
  std::vector<uint64_t> enqueuedIn_;
  uint64_t run_ = 0;
  /// The non-finite guard: its device scalars (the verdict, the norm's limit), the limit they
  /// hold, its norms' addresses, the guarded update's graph (captured once; null when it could
  /// not be), the stream its conditional body is captured on, and whether the host skipped the
  /// last update itself.
  cuda::GuardState *guard_ = nullptr;
  float deviceNormLimit_ = std::numeric_limits<float>::infinity();
  const float **guardNorms_ = nullptr;
  cudaGraphExec_t guardExec_ = nullptr;
  bool guardCaptured_ = false;
  cudaStream_t bodyStream_ = nullptr;
  /// Scratch of the kernels in conditional bodies, which may not allocate (ScratchArena).
  cuda::ScratchArena scratch_;
  /// The host steps: their threads (null without host kernels), each host kernel's callback
  /// argument, and the first failure of one since the last synchronisation.
  std::unique_ptr<host::ThreadPool> hostPool_;
  std::vector<HostLaunch> hostLaunches_;
  std::mutex hostErrorMutex_;
  std::exception_ptr hostError_;
  /// Wall seconds of the host functions since takeOffloadTimes() (under hostErrorMutex_).
  double hostSeconds_ = 0;
  /// The offload telemetry (bonsai-run --offload-timing, a plan with copies across memory
  /// spaces or host steps): the device's clock readings of the waits (stampIndex).
  bool timed_ = false;
  unsigned long long *stamps_ = nullptr;
  /// The copies' timing, per run of runStreamed; the runs each captured graph launches (the
  /// phases', the guarded update's) and those of the capture in progress; whether the driver
  /// refused to time them (then never tried again).
  std::map<std::pair<size_t, size_t>, TimedRun> timedRuns_;
  std::map<Phase, std::vector<TimedRun *>> graphRuns_;
  std::vector<TimedRun *> guardRuns_;
  std::vector<TimedRun *> capturedRuns_;
  bool copyTimingBroken_ = false;
  bool hostSkipped_ = false;
  /// The executor's ranks (null: one rank) and, for a plan with collectives, NCCL over them
  /// (finalized first in the destructor).
  const RankContext *ranks_ = nullptr;
  std::unique_ptr<NcclCommunicator> nccl_;
  /// Ring attention's transfers (null but in a plan with bonsai.ring).
  cudaStream_t ringStream_ = nullptr;
};
} // namespace

bool cudaDeviceAvailable() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

std::unique_ptr<KernelBackend> createCudaBackend(const LoadedPlan &plan,
                                                 const CudaBackendOptions &options,
                                                 const RankContext *ranks) {
  return std::make_unique<CudaBackend>(plan, options, ranks);
}

} // namespace bonsai::rt

#else // !BONSAI_HAVE_CUDA

namespace bonsai::rt {

bool cudaDeviceAvailable() { return false; }

std::unique_ptr<KernelBackend> createCudaBackend(const LoadedPlan &, const CudaBackendOptions &,
                                                 const RankContext *) {
  throw Error("this build has no CUDA backend: it was configured without a CUDA toolkit "
              "(use --backend=cpu, or rebuild where nvcc is installed)");
}

} // namespace bonsai::rt

#endif // BONSAI_HAVE_CUDA
