//===- GeneratedKernels.cpp - Load and launch the plan's generated PTX ----===//
//
// The compiler embeds one PTX module per generated kernel in the plan (schema
// GeneratedKernel). They are loaded with the runtime API's library management
// (cudaLibraryLoadData, which JIT-compiles PTX for the current device; no driver-API link), once
// per plan, before any phase is captured: loading inside a CUDA Graph capture is not allowed,
// launching is.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {
/// Threads per block (unless a kernel allows fewer): a multiple of the warp size that keeps
/// every SM busy for a memory-bound loop.
constexpr unsigned kBlock = 256;
/// Grid-stride loops need no more blocks than fill the device a few times over.
constexpr unsigned kBlocksPerSM = 8;
} // namespace

struct GeneratedKernels::Impl {
  std::vector<cudaLibrary_t> libraries;
  std::vector<cudaKernel_t> kernels;
  std::vector<std::string> names;
  std::vector<unsigned> blockSizes; ///< Threads per block of each kernel.
  unsigned maxBlocks = 0;

  // Here rather than in ~GeneratedKernels, so that a constructor that throws half-way still
  // unloads what it loaded.
  ~Impl() {
    for (cudaLibrary_t library : libraries)
      cudaLibraryUnload(library);
  }
};

GeneratedKernels::GeneratedKernels(const std::vector<GeneratedKernelInfo> &kernels)
    : impl_(std::make_unique<Impl>()) {
  const char *k = "fused_elementwise";
  int device = 0, sms = 0;
  checkCuda(cudaGetDevice(&device), "cudaGetDevice", k);
  checkCuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
            "cudaDeviceGetAttribute", k);
  impl_->maxBlocks = unsigned(std::max(sms, 1)) * kBlocksPerSM;
  for (const GeneratedKernelInfo &info : kernels) {
    if (info.ptx.empty())
      fail(k, "generated kernel '" + info.name + "' has no PTX (a plan compiled for the CPU?)");
    // The JIT's error log names the PTX line it rejects.
    char log[4096] = {};
    cudaJitOption options[] = {cudaJitErrorLogBuffer, cudaJitErrorLogBufferSizeBytes};
    void *values[] = {log, reinterpret_cast<void *>(uintptr_t(sizeof log))};
    auto rejected = [&](cudaError_t status, const char *call) {
      cudaGetLastError();
      fail(k, "the driver rejects the PTX of generated kernel '" + info.name + "' (" +
                  info.arch + "): " + call + ": " + cudaGetErrorName(status) + ": " +
                  cudaGetErrorString(status) + (log[0] ? std::string(": ") + log : ""));
    };
    cudaLibrary_t library = nullptr;
    cudaError_t status = cudaLibraryLoadData(&library, info.ptx.c_str(), options, values, 2,
                                             nullptr, nullptr, 0);
    if (status != cudaSuccess)
      rejected(status, "cudaLibraryLoadData");
    impl_->libraries.push_back(library);
    cudaKernel_t kernel = nullptr;
    status = cudaLibraryGetKernel(&kernel, library, info.name.c_str());
    if (status != cudaSuccess)
      rejected(status, "cudaLibraryGetKernel");
    // Asking for the attributes loads the kernel into the current context now: with lazy
    // module loading it would otherwise load at its first launch, which may be inside a
    // CUDA Graph capture. The block size must also fit what the compiled kernel allows.
    cudaFuncAttributes attributes{};
    status = cudaFuncGetAttributes(&attributes, reinterpret_cast<const void *>(kernel));
    if (status != cudaSuccess)
      rejected(status, "cudaFuncGetAttributes");
    impl_->kernels.push_back(kernel);
    impl_->names.push_back(info.name);
    impl_->blockSizes.push_back(
        unsigned(std::min<int>(int(kBlock), std::max(attributes.maxThreadsPerBlock, 32))) /
        32 * 32);
  }
}

GeneratedKernels::~GeneratedKernels() = default;

void GeneratedKernels::launch(const Context &ctx, size_t index,
                              const std::vector<const TensorView *> &inputs,
                              const std::vector<const TensorView *> &outputs) const {
  const char *k = "fused_elementwise";
  if (index >= impl_->kernels.size())
    fail(k, "generated kernel " + std::to_string(index) + " is not loaded (" +
                std::to_string(impl_->kernels.size()) + " are)");
  if (outputs.empty())
    fail(k, "no outputs");
  // The PTX's parameters: a pointer per input, a pointer per output, the element count.
  int64_t n = outputs[0]->numel();
  std::vector<void *> pointers;
  for (const TensorView *t : inputs) {
    checkFloat(k, "input", *t);
    if (t->numel() < 1 || n % t->numel() != 0)
      fail(k, "an input of " + std::to_string(t->numel()) +
                  " elements does not divide the outputs' " + std::to_string(n));
    pointers.push_back(t->data);
  }
  for (const TensorView *t : outputs) {
    checkFloat(k, "output", *t);
    if (t->numel() != n)
      fail(k, "outputs of " + std::to_string(t->numel()) + " and " + std::to_string(n) +
                  " elements");
    pointers.push_back(t->data);
  }
  if (n == 0)
    return;
  std::vector<void *> args;
  for (void *&p : pointers)
    args.push_back(&p);
  args.push_back(&n);
  unsigned block = impl_->blockSizes[index];
  unsigned blocks =
      unsigned(std::min<int64_t>((n + block - 1) / block, int64_t(impl_->maxBlocks)));
  checkCuda(cudaLaunchKernel(reinterpret_cast<const void *>(impl_->kernels[index]),
                             dim3(blocks), dim3(block), args.data(), 0, ctx.stream),
            "cudaLaunchKernel", k);
  checkLaunch(k, impl_->names[index].c_str());
}

} // namespace bonsai::rt::cuda
