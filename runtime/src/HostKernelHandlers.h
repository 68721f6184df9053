//===- HostKernelHandlers.h - Kernels on the host stream of a GPU backend -===//
//
// Private to runtime/src. A kernel on the host stream (StreamId::Host; docs/offload.md, "The
// host step") runs on the CPU over pinned host memory, in stream order with a GPU backend's
// work. Only kinds with trait kHostStep may run there (the loader checks it), and each has a
// handler here, `launch(kinds::K, const KernelCall &, host::ThreadPool &)`, that computes
// what the kind's CUDA kernel computes, bit for bit (HostOptimizer.h). The CPU backend does
// not use them: every kernel runs on the host there, with its own handlers, so a plan that
// moves an update to the host trains the same numbers as before on either backend.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_SRC_HOSTKERNELHANDLERS_H
#define BONSAI_RUNTIME_SRC_HOSTKERNELHANDLERS_H

#include "KernelCall.h"

#include "bonsai/runtime/HostOptimizer.h"

namespace bonsai::rt {

/// Runs `call`, a verified kernel on the host stream (its kind has trait kHostStep and its
/// operands are in pinned host arenas), on `pool`'s threads. Throws rt::Error on failure.
void launchOnHost(const KernelCall &call, host::ThreadPool &pool);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_SRC_HOSTKERNELHANDLERS_H
