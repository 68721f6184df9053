//===- Offload.cpp - The contracts of the host-offload copies -------------===//
//
// What the plan loader checks of the copies between pinned host and device arenas
// (docs/offload.md): the two tensors have the same shape and dtype, and each is in the space
// its direction names. A copy between two device tensors under these kinds would be a
// compiler bug that CUDA reports only as a failed cudaMemcpyAsync mid-step; the loader names it.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::expectSpaces(MemorySpace from, MemorySpace to) const {
  auto name = [](MemorySpace space) {
    return std::string(space == MemorySpace::Device ? "a device" : "a pinned host");
  };
  if (arenaOf(in(0)).space != from)
    fail(inName(0) + " is in arena '" + arenaOf(in(0)).name + "', not in " + name(from) + " arena");
  if (arenaOf(out()).space != to)
    fail(outName() + " is in arena '" + arenaOf(out()).name + "', not in " + name(to) + " arena");
}

void KernelChecker::verify(kinds::CopyHostToDevice) {
  expectOutputLike(0);
  expectSpaces(MemorySpace::PinnedHost, MemorySpace::Device);
}

void KernelChecker::verify(kinds::CopyDeviceToHost) {
  expectOutputLike(0);
  expectSpaces(MemorySpace::Device, MemorySpace::PinnedHost);
}

} // namespace bonsai::rt::contract
