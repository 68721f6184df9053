//===- Guard.cu - The non-finite guard's check on CUDA ---------------------===//
//
// After the update phase's gradient norms, one thread reads them and decides whether the
// step's update runs (docs/training.md, "Non-finite steps" and "Loss and gradient spikes"):
// every norm finite, and the global norm within the limit the host wrote before the step.
// Inside the update phase's CUDA Graph it sets the handle of the conditional node whose body
// is the guarded update, so the decision never leaves the device; run eagerly, the host reads
// the verdict instead.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"

#include <cuda_runtime.h>

namespace bonsai::rt::cuda {

namespace {

// The verdicts are UpdateVerdict's (KernelBackend.h); the order of the tests is the CPU
// backend's.
__global__ void guardCheckKernel(const float *const *norms, int count, int limitedNorm,
                                 GuardState *state, cudaGraphConditionalHandle handle,
                                 int setHandle) {
  int32_t verdict = 0;
  for (int i = 0; i < count; ++i)
    if (!isfinite(*norms[i]))
      verdict = 1;
  if (verdict == 0 && limitedNorm >= 0 && *norms[limitedNorm] > state->normLimit)
    verdict = 2;
  state->verdict = verdict;
  if (setHandle)
    cudaGraphSetConditional(handle, verdict == 0 ? 1u : 0u);
}

} // namespace

void guardCheck(const float *const *norms, int count, int limitedNorm, GuardState *state,
                unsigned long long handle, bool setHandle, CUstream_st *stream) {
  guardCheckKernel<<<1, 1, 0, stream>>>(norms, count, limitedNorm, state,
                                        cudaGraphConditionalHandle(handle), setHandle ? 1 : 0);
  detail::checkLaunch("guard_check", "guardCheckKernel");
}

} // namespace bonsai::rt::cuda
