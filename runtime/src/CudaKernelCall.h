//===- CudaKernelCall.h - One kernel launch on the CUDA backend -----------===//
//
// Private to runtime/src, in a build with the CUDA backend: a KernelCall with what the CUDA
// handlers (CudaKernelHandlers.cpp) need beside the operands: the stream, GEMM engine and
// device-error slot of the backend, and its generated kernels.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_SRC_CUDAKERNELCALL_H
#define BONSAI_RUNTIME_SRC_CUDAKERNELCALL_H

#include "KernelCall.h"

#include "bonsai/runtime/CudaKernels.h"

namespace bonsai::rt {

class NcclCommunicator;

/// A kernel call on the CUDA backend: its operands are device views.
struct CudaCall : KernelCall {
  CudaCall(const KernelCall &call, const cuda::Context &ctx,
           const cuda::GeneratedKernels *generated, NcclCommunicator *nccl = nullptr,
           cuda::Stream ringStream = nullptr)
      : KernelCall(call), ctx(ctx), generated(generated), nccl(nccl), ringStream(ringStream) {}

  cuda::Context ctx;
  /// The plan's generated kernels, loaded once (null when it has none).
  const cuda::GeneratedKernels *generated;
  /// The backend's NCCL communicator, started when the plan has collectives (null otherwise,
  /// and in a build without NCCL).
  NcclCommunicator *nccl;
  /// The stream ring attention's blocks travel on beside ctx.stream (null but in a plan with
  /// bonsai.ring).
  cuda::Stream ringStream;
};

/// Enqueues one kernel on the CUDA backend's stream (CudaKernelHandlers.cpp).
void launchOnCuda(const CudaCall &call);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_SRC_CUDAKERNELCALL_H
