//===- CudaCheck.h - Error checks, operand checks and scratch of the CUDA backend ===//
//
// Private to runtime/cuda, plain C++ (no kernels), so both the .cu kernels and the host-only
// .cpp files use it. Every CUDA runtime call of the backend goes through checkCuda and every
// launch is followed by checkLaunch, so a failure throws rt::Error naming the backend kernel
// (the plan kernel kind, "cuda add"), the CUDA call or device kernel, and CUDA's own message.
// The operand checks are the CPU backend's (OperandChecks.h: same conditions, same messages,
// "cuda" prefix): shapes are checked on the host before anything is enqueued. Scratch is stream-ordered device
// memory (cudaMallocAsync), freed on the same stream after the work that uses it.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CUDA_CUDACHECK_H
#define BONSAI_RUNTIME_CUDA_CUDACHECK_H

#include "bonsai/runtime/CudaKernels.h"

#include "OperandChecks.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace bonsai::rt::cuda::detail {

// The operand checks shared with the CPU kernels (OperandChecks.h), prefixed "cuda".
BONSAI_BIND_OPERAND_CHECKS("cuda")

/// Throws "cuda <kernel>: <call> failed: <CUDA error name>: <description>" unless `status` is
/// cudaSuccess.
void checkCuda(cudaError_t status, const char *call, const char *kernel);

/// Checks the launch of device kernel `deviceKernel` just made for backend kernel `kernel`
/// (cudaGetLastError: bad configurations, missing images, earlier sticky faults).
void checkLaunch(const char *kernel, const char *deviceKernel);

/// Throws unless `t` is a float scalar (one element).
void checkScalar(const char *kernel, const char *operand, const TensorView &t);

/// Whether an elementwise or row kernel may write `out` while reading `in`: they are disjoint,
/// or `out` is `in` itself element for element (same address, same element size), in which
/// case every element is read by the thread that later writes it.
bool safeInPlace(const TensorView &in, const TensorView &out);
/// Whether every tensor listed has `dtype`.
bool allDType(DType dtype, std::initializer_list<const TensorView *> tensors);
/// Whether `p` is aligned to 16 bytes (a vector access).
inline bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// Multiprocessors of the current device (cached per device).
int multiprocessorCount(const char *kernel);
/// Blocks for a grid-stride loop over `work` items, `perBlock` items per block per sweep: enough
/// to cover the work, at most `blocksPerSm` waves of the device.
unsigned gridFor(const char *kernel, int64_t work, int64_t perBlock, int blocksPerSm = 8);
/// The largest dynamic shared memory a block may opt into on the current device.
size_t maxDynamicSharedMemory(const char *kernel);

/// Device memory for the duration of one backend kernel, allocated and freed in stream order
/// (cudaMallocAsync / cudaFreeAsync on the kernel's stream), so the host never waits; inside
/// a conditional graph body, carved from the backend's ScratchArena instead (CudaKernels.h).
class Scratch {
public:
  Scratch(const char *kernel, Stream stream, size_t bytes);
  ~Scratch();
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  Scratch(Scratch &&other) noexcept;

  void *get() const { return ptr_; }
  template <typename T> T *as() const { return static_cast<T *>(ptr_); }

private:
  const char *kernel_;
  Stream stream_;
  void *ptr_ = nullptr;
  bool fromArena_ = false;
};

/// A dense copy of `t` in scratch memory (same dtype and shape), made on `stream`.
TensorView copyToScratch(const char *kernel, Stream stream, const TensorView &t,
                         std::vector<Scratch> &keep);

/// Converts between float dtypes on the device, y = x rounded to y's dtype (same shape);
/// implemented in Elementwise.cu.
void castOnDevice(const char *kernel, Stream stream, const TensorView &x, const TensorView &y);

/// loss = the mean cross-entropy of the rows whose nll (f32, one per row) is not -inf (ignored
/// labels), summed in fp64 by one block in a fixed order; NaN when no row counts, as PyTorch.
/// Implemented in Loss.cu; the fused LM head (Fused.cu) ends with it too.
void meanOfCountedRows(const char *kernel, Stream stream, const float *nll, int64_t rows,
                       const TensorView &loss);

/// *count = the rows whose label is neither ignoreIndex nor out of [0, vocab) (an integer sum by
/// one block: deterministic); out-of-range labels are recorded in `error`. Implemented in
/// Loss.cu; cross_entropy_grad and the fused LM head count the mean's denominator with it.
void countLabels(const char *kernel, Stream stream, const void *labels, bool wide, int64_t rows,
                 int64_t vocab, int64_t ignoreIndex, int64_t *count, DeviceError *error,
                 int32_t kernelIndex);

/// fp32 views of a kernel's operands when their storage dtypes differ. Kernels are written for
/// one storage type; given mixed dtypes they run in fp32 on converted copies, which is exactly
/// the CPU backend's semantics (inputs converted to fp32, results rounded once into each
/// output), at the cost of the extra conversion passes.
class F32Staging {
public:
  F32Staging(const char *kernel, Stream stream) : kernel_(kernel), stream_(stream) {}
  /// An fp32 view of input `t` (t itself when already f32).
  TensorView in(const TensorView &t);
  /// An fp32 view for output `t`: t itself when f32 and disjoint from every staged input, else
  /// scratch that finish() converts into t.
  TensorView out(const TensorView &t);
  /// Converts the scratch outputs into their tensors; call after the kernel was enqueued.
  void finish();

private:
  const char *kernel_;
  Stream stream_;
  std::vector<Scratch> keep_;
  std::vector<TensorView> inputs_;
  std::vector<std::pair<TensorView, TensorView>> outputs_; // (scratch, destination)
};

} // namespace bonsai::rt::cuda::detail

#endif // BONSAI_RUNTIME_CUDA_CUDACHECK_H
