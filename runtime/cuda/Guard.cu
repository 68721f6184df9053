//===- Guard.cu - The non-finite guard's check on CUDA ---------------------===//
//
// After the update phase's gradient norms, one thread reads them and decides whether the
// step's update runs (docs/training.md, "Non-finite steps"). Inside the update phase's CUDA
// Graph it sets the handle of the conditional node whose body is the guarded update, so the
// decision never leaves the device; run eagerly, the host reads `skipped` instead.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"

#include <cuda_runtime.h>

namespace bonsai::rt::cuda {

namespace {

__global__ void guardCheckKernel(const float *const *norms, int count, int32_t *skipped,
                                 cudaGraphConditionalHandle handle, int setHandle) {
  int bad = 0;
  for (int i = 0; i < count; ++i)
    if (!isfinite(*norms[i]))
      bad = 1;
  *skipped = bad;
  if (setHandle)
    cudaGraphSetConditional(handle, bad ? 0u : 1u);
}

} // namespace

void guardCheck(const float *const *norms, int count, int32_t *skipped,
                unsigned long long handle, bool setHandle, CUstream_st *stream) {
  guardCheckKernel<<<1, 1, 0, stream>>>(norms, count, skipped,
                                        cudaGraphConditionalHandle(handle), setHandle ? 1 : 0);
  detail::checkLaunch("guard_check", "guardCheckKernel");
}

} // namespace bonsai::rt::cuda
