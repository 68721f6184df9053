//===- HostOptimizer.h - AdamW and SGD steps on host memory, the GPU's bits --===//
//
// The optimizer step of a host-offloaded plan (issue #24): optimizer state, fp32 master weights
// and gradients live in (pinned) host memory and the CPU updates them while the GPU computes.
// The step is the CUDA kernels' (runtime/cuda/Optimizer.cu, multiTensorAdamwUpdate and
// multiTensorSgdUpdate) bit for bit, not the CPU backend's (runtime/cpu/Optimizer.cpp, which
// computes in fp64): a plan that moves its update from the GPU to the host trains the same
// numbers. Every element is updated with the GPU kernel's fp32 operations in the GPU kernel's
// order, each rounded on its own (the file is compiled with -ffp-contract=off, so no FMA), with
// IEEE sqrt and division, and the step's scalars are derived in fp64 exactly as the kernel's
// adamwScalars derives them. A NaN result is a NaN on both, but its payload may differ (x86
// propagates payloads, NVIDIA GPUs write one canonical NaN).
//
// Threads: a ThreadPool started once (a step starts no thread) takes fixed chunks of every
// tensor; each element is independent, so the bits do not depend on the number of threads.
// Vectorisation: the element loop is compiled for AVX-512, AVX2 and baseline x86-64 and the
// widest the CPU supports is picked at run time, so one binary runs everywhere.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_HOSTOPTIMIZER_H
#define BONSAI_RUNTIME_HOSTOPTIMIZER_H

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace bonsai::rt::host {

/// A fixed set of threads that run one task at a time: started once, so that a step of the
/// optimizer costs a wake-up, not a thread creation per call.
class ThreadPool {
public:
  /// A pool of `threads` workers, the calling thread counted as worker 0 (threads - 1 are
  /// started); 0 takes hostThreads() (HostThreads.h).
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  /// The number of workers, the calling thread included.
  int size() const;
  /// Runs fn(worker) once for every worker in [0, size()) at the same time, worker 0 on the
  /// calling thread, and returns when all have returned. The exception of the lowest worker
  /// that threw is rethrown then (not the first in time, so that which error surfaces does not
  /// depend on timing). One run at a time: a pool is not to be shared by concurrent callers.
  void run(const std::function<void(int)> &fn);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The instruction set the element loops were picked for on this CPU: "avx512", "avx2" or
/// "baseline".
const char *vectorIsa();
/// Makes the steps use the loops of instruction set `name` ("avx512", "avx2", "baseline")
/// instead of the widest, for tests and benchmarks (their bits are the same). Throws
/// rt::Error for an unknown name or one this CPU lacks. Not to be called during a step.
void useVectorIsa(const std::string &name);

/// The fp32 scalars of one AdamW step, as the CUDA kernels' adamwScalars derives them: in
/// fp64 from the step counter, the learning rate and the gradient norm, each rounded once.
struct AdamWScalars {
  float clip;     ///< min(1, grad_clip / (norm + 1e-6)), or 1 without clipping
  float decay;    ///< 1 - lr * weight_decay
  float stepSize; ///< lr / (1 - beta1^t)
  float bc2Sqrt;  ///< sqrt(1 - beta2^t)
};

/// The scalars of the t-th update, t = done + 1 (`done`: the updates already done, what the
/// plan's step counter holds before step_increment).
AdamWScalars adamwScalars(const cpu::AdamWHyper &hyper, int64_t done, float lr, float gradNorm);

/// One AdamW step in place over every (grads[i], params[i], m[i], v[i], masters[i]) on host
/// memory, with the operands of cpu::multiTensorAdamwUpdate: `step` the i64 counter of updates
/// done, `lr` and `gradNorm` float scalars (any float dtype), gradients and parameters f32,
/// f16 or bf16, m, v and masters f32 (what the CUDA kernels support; `masters` empty or one
/// per parameter: with a master the update applies to it and the parameter is it rounded).
/// Bit for bit the CUDA kernel's results on the same inputs, whatever pool.size(). Throws
/// rt::Error naming the operand on bad input, before anything is written.
void adamwStep(ThreadPool &pool, const std::vector<TensorView> &grads, const TensorView &step,
               const TensorView &lr, const TensorView &gradNorm, const cpu::AdamWHyper &hyper,
               const std::vector<TensorView> &params, const std::vector<TensorView> &m,
               const std::vector<TensorView> &v, const std::vector<TensorView> &masters);

/// One SGD step in place (PyTorch's torch.optim.SGD with global-norm clipping), the CUDA
/// kernel's multiTensorSgdUpdate bit for bit, with the operands of
/// cpu::multiTensorSgdUpdate: `momentum` f32 buffers, written even without momentum (then not
/// read), as the CUDA kernel does.
void sgdStep(ThreadPool &pool, const std::vector<TensorView> &grads, const TensorView &lr,
             const TensorView &gradNorm, const cpu::SGDHyper &hyper,
             const std::vector<TensorView> &params, const std::vector<TensorView> &momentum,
             const std::vector<TensorView> &masters);

} // namespace bonsai::rt::host

#endif // BONSAI_RUNTIME_HOSTOPTIMIZER_H
