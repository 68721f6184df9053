//===- CpuBackend.cpp - Runs a plan's phases on the CPU -------------------===//
//
// The reference backend: fp32 accumulation, OpenBLAS GEMMs, one kernel after another on the
// executor's host arenas (it has no memory of its own, so the executor never copies for it).
// Each kernel goes to the CPU handler of its kind (CpuKernelHandlers.cpp); with profiling on,
// each kernel's wall-clock time is added up per plan kernel.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/KernelBackend.h"

#include "KernelCall.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

namespace bonsai::rt {

namespace {

class CpuBackend final : public KernelBackend {
public:
  CpuBackend(const LoadedPlan &plan, const std::vector<TensorView> &views, bool offloadTiming,
             const RankContext *ranks)
      : plan_(plan), views_(views), offloadTiming_(offloadTiming), ranks_(ranks) {
    offload_.timed = offloadTiming;
  }

  std::string describe() const override { return "cpu"; }
  bool hasOwnMemory() const override { return false; }

  // The executor copies only for a backend with memory of its own.
  void uploadArena(size_t, uint64_t, const void *, uint64_t) override {}
  void downloadArena(size_t, void *, uint64_t) override {}
  void uploadTensor(uint32_t, const void *) override {}
  void downloadTensor(uint32_t, void *) override {}

  void runPhase(Phase phase) override { runPhasePrefix(phase, plan_.kernels.size()); }

  void runPhasePrefix(Phase phase, size_t end) override {
    end = std::min(end, plan_.kernels.size());
    for (size_t i = 0; i < end; ++i)
      if (plan_.kernels[i].phase == phase)
        runKernel(i);
  }

  void runKernels(const std::vector<size_t> &kernels) override {
    for (size_t i : kernels)
      runKernel(i);
  }

  void runGuardedUpdate(const UpdateGuard &guard, bool skip, float normLimit) override {
    runKernels(guard.check);
    // The norms are f32 scalars the check kernels just wrote; the order of the tests is the
    // CUDA guard kernel's (runtime/cuda/Guard.cu).
    auto norm = [&](size_t i) {
      float value;
      std::memcpy(&value, views_[guard.norms[i]].data, sizeof value);
      return value;
    };
    verdict_ = UpdateVerdict::Ran;
    for (size_t i = 0; i < guard.norms.size(); ++i)
      if (!std::isfinite(norm(i)))
        verdict_ = UpdateVerdict::NonFiniteNorm;
    if (verdict_ == UpdateVerdict::Ran && guard.limitedNorm >= 0 &&
        norm(size_t(guard.limitedNorm)) > normLimit)
      verdict_ = UpdateVerdict::NormAboveLimit;
    if (skip)
      verdict_ = UpdateVerdict::SkippedByHost;
    if (verdict_ == UpdateVerdict::Ran)
      runKernels(guard.guarded);
    runKernels(guard.always);
  }

  UpdateVerdict updateVerdict() override { return verdict_; }

  // Kernels run synchronously; their errors were thrown as they ran.
  void synchronize() override {}
  uint64_t measuredDeviceBytes() const override { return 0; }

  void setProfiling(bool on) override {
    profiling_ = on;
    times_.assign(plan_.kernels.size(), 0.0);
  }
  const std::vector<double> &kernelMilliseconds() const override { return times_; }
  OffloadTimes takeOffloadTimes() override {
    OffloadTimes fresh;
    fresh.timed = offloadTiming_;
    return std::exchange(offload_, fresh);
  }

  // Every launch reads the attributes from the executor's plan.
  void kernelAttrsChanged() override {}

private:

  void runKernel(size_t i) {
    auto start = std::chrono::steady_clock::now();
    try {
      launchOnCpu(KernelCall(plan_, i, views_, ranks_));
    } catch (const Error &e) {
      throw Error(plan_.describeKernel(i) + ": " + e.what());
    }
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (profiling_)
      times_[i] += seconds * 1e3;
    // Everything runs in order here: a copy's or host step's time is all exposed.
    const KernelInfo &kernel = plan_.kernels[i];
    if (kernel.stream == StreamId::Host) {
      offload_.hostStepSeconds += seconds;
      if (offloadTiming_)
        offload_.exposedSeconds += seconds;
    } else if (kernelKindInfo(kernel.kind).has(kernel_traits::kCrossesSpaces) && offloadTiming_) {
      const TensorInfo &out = plan_.tensors[kernel.outputs[0]];
      if (plan_.copiesToHost(kernel)) {
        offload_.toHostBytes += out.bytes;
        offload_.toHostSeconds += seconds;
      } else {
        offload_.toDeviceBytes += out.bytes;
        offload_.toDeviceSeconds += seconds;
      }
      offload_.exposedSeconds += seconds;
    }
  }

  /// The executor's plan and host views, read at every launch.
  const LoadedPlan &plan_;
  const std::vector<TensorView> &views_;
  bool profiling_ = false;
  std::vector<double> times_;
  OffloadTimes offload_; ///< takeOffloadTimes()
  bool offloadTiming_ = false;
  UpdateVerdict verdict_ = UpdateVerdict::Ran;
  /// The executor's ranks, read at every collective (null: one rank).
  const RankContext *ranks_;
};

} // namespace

std::unique_ptr<KernelBackend> createCpuBackend(const LoadedPlan &plan,
                                                const std::vector<TensorView> &views,
                                                bool offloadTiming, const RankContext *ranks) {
  return std::make_unique<CpuBackend>(plan, views, offloadTiming, ranks);
}

} // namespace bonsai::rt
