//===- Timestamp.cu - The device's clock, written in stream order ----------===//
//
// The offload telemetry (docs/offload.md, "Telemetry") times copies and the compute stream's
// waits for them with a one-thread kernel that writes the GPU's global nanosecond timer
// before and after each. A kernel rather than a timing event, because the update's copies run
// inside the guard's conditional graph node, whose body may hold kernels but not event
// records; the global timer is one clock for every SM and stream, so stamps of different
// streams compare.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"

#include <cuda_runtime.h>

namespace bonsai::rt::cuda {

namespace {

__global__ void stampKernel(unsigned long long *slot) {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  *slot = now;
}

} // namespace

void stampTime(unsigned long long *slot, CUstream_st *stream) {
  stampKernel<<<1, 1, 0, stream>>>(slot);
  detail::checkLaunch("timestamp", "stampKernel");
}

} // namespace bonsai::rt::cuda
