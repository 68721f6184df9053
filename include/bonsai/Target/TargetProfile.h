//===- TargetProfile.h - What the compiler knows about a GPU ---------------===//
//
// A target profile: the facts passes consult when they decide for a GPU (compute capability,
// multiprocessors, shared memory per block, memory size, FP8 tensor cores, link and memory
// bandwidth, peak rates). Named profiles for the GPUs Bonsai is built for, and a generic one
// for any sm_XX. Documented in docs/targets.md.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TARGET_TARGETPROFILE_H
#define BONSAI_TARGET_TARGETPROFILE_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>

namespace mlir::bonsai {

/// The facts about one target.
struct TargetProfile {
  std::string name;       ///< "h200", "rtx4090", "sm_89", "cpu"
  std::string arch;       ///< "sm_90", "sm_89", ..., or "cpu"
  int computeCapability = 0; ///< 90 for sm_90; 0 for the CPU
  int multiprocessors = 0;
  int64_t sharedMemoryPerBlock = 0; ///< bytes, the opt-in maximum
  int64_t memoryBytes = 0;          ///< device memory; the default budget
  bool fp8TensorCores = false;      ///< E4M3/E5M2 MMA (sm_89 and sm_90)
  double memoryBandwidthGBs = 0;    ///< HBM/GDDR, GB/s
  double linkBandwidthGBs = 0;      ///< host link (PCIe) or NVLink per direction, GB/s
  double bf16Tflops = 0;            ///< dense bf16 tensor-core peak
  double fp8Tflops = 0;             ///< dense FP8 peak (0 without FP8 tensor cores)
  /// The optimizer step on the host the GPU is in: fused fp32 AdamW over every core, G
  /// parameters/s (what `update "auto"` weighs the host against the link with).
  double hostUpdateGParamsPerSecond = 0;
  /// Bonsai's flash attention kernels, forward and backward, bf16, causal, TFLOP/s of the
  /// scored pairs, measured on this GPU (0: not measured; estimates then take a GEMM's rate).
  double attentionTflops = 0;

  /// Whether the profile has the rates that `update "auto"` weighs: compute, memory, link and
  /// host (every named GPU; not "cpu" or a generic sm_XX).
  bool hasOffloadRates() const {
    return bf16Tflops > 0 && memoryBandwidthGBs > 0 && linkBandwidthGBs > 0 &&
           hostUpdateGParamsPerSecond > 0;
  }
};

/// The profile named `name` ("a100", "a10g", "rtx4090", "l40s", "h100", "h200", "cpu") or a
/// generic profile for "sm_XX" / "sm_XXa"; nullopt for anything else.
std::optional<TargetProfile> lookupTargetProfile(llvm::StringRef name);

/// The named profiles, for documentation and error messages.
llvm::ArrayRef<TargetProfile> getNamedTargetProfiles();

} // namespace mlir::bonsai

#endif // BONSAI_TARGET_TARGETPROFILE_H
