//===- TargetProfile.cpp - What the compiler knows about a GPU ------------===//
//
// Vendor datasheet figures (dense rates, no sparsity) for the named GPUs; a generic sm_XX gets
// the capabilities of its architecture and no size, so that a budget must be given. The host
// update rate is the host's, not the GPU's: 4.5 G parameters/s is Bonsai's AdamW on the 16
// cores of the H200 machine measured (docs/benchmarks.md), assumed for the other data-centre
// parts; 2.0 for the workstation and cloud-inference parts, whose hosts have fewer cores.
// `bonsai-compile --host-update-rate` overrides it for the machine at hand.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Target/TargetProfile.h"

#include "llvm/ADT/StringExtras.h"

using namespace mlir::bonsai;

namespace {
constexpr int64_t GiB = int64_t(1) << 30;

const TargetProfile kProfiles[] = {
    // name, arch, cc, SMs, smem/block, memory, fp8, HBM GB/s, link GB/s, bf16, fp8 TFLOP/s,
    // host AdamW G params/s, flash attention TFLOP/s (measured on the H200: issue #28's
    // fwd+bwd at 4k and 16k tokens, MHA and GQA, 308-332; the H100 has the same SMs and
    // clock, so the same compute-bound rate; not measured elsewhere yet)
    {"a100", "sm_80", 80, 108, 163 * 1024, 80 * GiB, false, 2039, 32, 312, 0, 4.5},
    {"a10g", "sm_86", 86, 80, 99 * 1024, 24 * GiB, false, 600, 32, 70, 0, 2.0},
    {"rtx4090", "sm_89", 89, 128, 99 * 1024, 24 * GiB, true, 1008, 32, 165, 330, 2.0},
    {"l40s", "sm_89", 89, 142, 99 * 1024, 48 * GiB, true, 864, 32, 362, 733, 4.5},
    {"h100", "sm_90", 90, 132, 227 * 1024, 80 * GiB, true, 3350, 64, 989, 1979, 4.5, 317},
    {"h200", "sm_90", 90, 132, 227 * 1024, 141 * GiB, true, 4800, 64, 989, 1979, 4.5, 317},
    {"cpu", "cpu", 0, 0, 0, 0, false, 0, 0, 0, 0, 0},
};
} // namespace

llvm::ArrayRef<TargetProfile> mlir::bonsai::getNamedTargetProfiles() { return kProfiles; }

std::optional<TargetProfile> mlir::bonsai::lookupTargetProfile(llvm::StringRef name) {
  std::string lower = name.lower();
  for (const TargetProfile &profile : kProfiles)
    if (profile.name == lower)
      return profile;
  llvm::StringRef arch = lower;
  unsigned capability = 0;
  if (!arch.consume_front("sm_"))
    return std::nullopt;
  arch.consume_back("a");
  if (arch.getAsInteger(10, capability) || capability < 70)
    return std::nullopt;
  TargetProfile generic;
  generic.name = lower;
  generic.arch = "sm_" + std::to_string(capability);
  generic.computeCapability = capability;
  // FP8 tensor cores arrived with Ada (8.9) and Hopper (9.0).
  generic.fp8TensorCores = capability == 89 || capability >= 90;
  generic.sharedMemoryPerBlock = capability >= 90 ? 227 * 1024 : capability >= 80 ? 163 * 1024
                                                                                  : 96 * 1024;
  return generic;
}
