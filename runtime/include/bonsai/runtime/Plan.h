//===- Plan.h - Loading and verifying a compiled training-step plan -------===//
//
// A plan file (schema/plan.fbs) comes from outside the process, so it is checked in three layers
// before anything uses it: the file identifier ("BNSP"), the FlatBuffers verifier (every offset
// and length inside the buffer), then the semantics the kernels rely on (version, arenas, tensor
// byte ranges, operand counts, shapes and dtypes per kernel kind). Only then is it copied into
// the plain structs below, so that the executor never reads unverified bytes and never depends
// on the generated FlatBuffers code. See docs/plan-format.md.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_PLAN_H
#define BONSAI_RUNTIME_PLAN_H

#include "bonsai/runtime/Tensor.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bonsai::rt {

/// The plan schema version this runtime runs (Plan.version); bumped on incompatible change.
inline constexpr uint32_t kPlanVersion = 1;

/// Where an arena lives; values match bonsai.plan.MemorySpace.
enum class MemorySpace : uint8_t { Device = 0, PinnedHost = 1 };
/// Whether an arena survives across steps; values match bonsai.plan.Lifetime.
enum class Lifetime : uint8_t { Persistent = 0, Step = 1 };
/// Why a tensor exists; values match bonsai.plan.TensorRole.
enum class TensorRole : uint8_t {
  Parameter = 0,
  Input = 1,
  Activation = 2,
  Gradient = 3,
  OptimizerState = 4,
  Workspace = 5,
  Loss = 6
};
/// The kernels of a plan; values match bonsai.plan.KernelKind.
enum class KernelKind : uint16_t {
  Embedding = 0,
  Linear = 1,
  Matmul = 2,
  Add = 3,
  Mul = 4,
  RMSNorm = 5,
  LayerNorm = 6,
  RoPE = 7,
  Attention = 8,
  SiLU = 9,
  GeLU = 10,
  SwiGLU = 11,
  Softmax = 12,
  CrossEntropy = 13,
  Transpose = 14,
  Slice = 15,
  Cast = 16,
  Copy = 17
};

/// "Linear", "RMSNorm", ... as spelled in plan.fbs.
const char *kernelKindName(KernelKind kind);
/// "parameter", "activation", ... (the memory class a tensor is reported under).
const char *tensorRoleName(TensorRole role);

/// One verified arena: `size` bytes, allocated once with at least `alignment`.
struct ArenaInfo {
  std::string name;
  MemorySpace space = MemorySpace::Device;
  Lifetime lifetime = Lifetime::Step;
  uint64_t size = 0;
  uint64_t alignment = 256;
};

/// One verified tensor: bytes [offset, offset + bytes) of arena `arena`, dense row-major.
/// Several tensors may share storage (views); `bytes == numel * dtypeSize(dtype)`.
struct TensorInfo {
  std::string name; ///< Checkpoint key of a parameter; "ids"/"labels" or a debug name otherwise.
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::Activation;
  bool trainable = false;
  uint32_t arena = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int64_t numel = 1; ///< Product of the dimensions (1 for a scalar).
};

/// The attributes of a kernel, flattened: only the fields of the kind's attribute table are
/// meaningful (NormAttrs -> epsilon, RoPEAttrs -> theta, AttentionAttrs -> causal and scale,
/// GeLUAttrs -> geluTanh, AxisAttrs and SliceAttrs -> axis, SliceAttrs -> start,
/// CrossEntropyAttrs -> ignoreIndex, TransposeAttrs -> permutation).
struct KernelAttrsInfo {
  double epsilon = 0;
  double theta = 0;
  bool causal = false;
  double scale = 0;
  bool geluTanh = false;
  int32_t axis = 0;
  int64_t start = 0;
  int64_t ignoreIndex = -100;
  std::vector<int64_t> permutation;
};

/// One verified kernel: indices into LoadedPlan::tensors, checked against the kind's operand
/// conventions.
struct KernelInfo {
  KernelKind kind = KernelKind::Copy;
  std::vector<uint32_t> inputs;
  std::vector<uint32_t> outputs;
  KernelAttrsInfo attrs;
  uint8_t stream = 0;
  std::string name;
};

/// Planned bytes by memory class, as the compiler computed them (Plan.memory).
struct MemorySummaryInfo {
  uint64_t weights = 0;
  uint64_t gradients = 0;
  uint64_t optimizerState = 0;
  uint64_t activations = 0;
  uint64_t workspace = 0;
  uint64_t inputs = 0;
  uint64_t peakDevice = 0;
  uint64_t peakHost = 0;
};

/// A plan that passed every verification layer, as plain C++ values.
struct LoadedPlan {
  std::string path; ///< Where it was loaded from, for messages.
  uint32_t version = 0;
  std::string model;
  std::string targetArch;
  uint64_t targetDeviceMemory = 0;
  std::vector<ArenaInfo> arenas;
  std::vector<TensorInfo> tensors;
  std::vector<KernelInfo> kernels;
  std::vector<uint32_t> inputs; ///< Tensors filled by the data loader: ids, then labels.
  uint32_t loss = 0;
  MemorySummaryInfo memory;
  uint64_t tokensPerStep = 0;

  /// "tensor 3 'h.0.ln_1.weight'", for messages.
  std::string describeTensor(uint32_t index) const;
  /// "kernel 7 'loc(...)' (Linear)", for messages.
  std::string describeKernel(size_t index) const;
  /// Rows of the first Embedding kernel's table (the vocabulary size), if there is one.
  std::optional<int64_t> vocabularySize() const;
};

/// Reads, verifies and loads the plan file at `path`. Throws rt::Error naming the file and the
/// first problem found (missing, not a plan, truncated or corrupted, wrong version, or a
/// semantic error naming the arena, tensor or kernel).
LoadedPlan loadPlanFile(const std::string &path);

/// Verifies and loads a plan held in memory; `what` names it in messages (usually the path).
/// The buffer must be 8-byte aligned (as std::vector and new[] memory is) for the verifier.
LoadedPlan loadPlanBuffer(const void *data, size_t size, const std::string &what);

/// Reads a whole file; throws rt::Error naming `path` when it is missing or unreadable.
std::vector<uint8_t> readFileBytes(const std::string &path);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_PLAN_H
