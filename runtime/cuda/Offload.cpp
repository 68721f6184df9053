//===- Offload.cpp - Copies between pinned host and device memory ---------===//
//
// The CUDA kernels of the host-offload kinds (docs/offload.md): one asynchronous copy over
// PCIe on the call's stream. The host side lives in a pinned arena (cudaHostAlloc), so the
// copy engines move it by DMA without a staging buffer, the call returns at once, and a CUDA
// Graph capture records it like any kernel.
//
//===----------------------------------------------------------------------===//

#include "CudaCheck.h"

#include <string>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

/// Copies the bytes of `x` to `y` (tensors of equal size) on `ctx`'s stream.
void copyAcross(const char *kernel, const Context &ctx, const TensorView &x, const TensorView &y,
                cudaMemcpyKind kind) {
  checkView(kernel, "x", x);
  checkView(kernel, "y", y);
  if (x.bytes() != y.bytes())
    fail(kernel, "y (" + std::to_string(y.bytes()) + " bytes) and x (" + std::to_string(x.bytes()) +
                     " bytes) differ in size");
  if (x.bytes())
    checkCuda(cudaMemcpyAsync(y.data, x.data, x.bytes(), kind, ctx.stream), "cudaMemcpyAsync",
              kernel);
}

} // namespace

void copyHostToDevice(const Context &ctx, const TensorView &x, const TensorView &y) {
  copyAcross("copy_h2d", ctx, x, y, cudaMemcpyHostToDevice);
}

void copyDeviceToHost(const Context &ctx, const TensorView &x, const TensorView &y) {
  copyAcross("copy_d2h", ctx, x, y, cudaMemcpyDeviceToHost);
}

} // namespace bonsai::rt::cuda
