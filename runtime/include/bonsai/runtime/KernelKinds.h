//===- KernelKinds.h - Plan kernel kinds, from the one kernel table -------===//
//
// The kernel kinds of a plan and what the runtime knows of each one's signature, all generated
// from KernelKinds.def: the KernelKind enum, a KernelKindInfo per kind (names, operand names
// and counts, traits), and named operand indices per kind, so that a handler reads
// `call.in(kinds::Linear::In::bias)` rather than `in(2)`. See docs/adding-a-kernel.md.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_KERNELKINDS_H
#define BONSAI_RUNTIME_KERNELKINDS_H

#include "bonsai/runtime/KernelAttrs.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bonsai::rt {

/// The kernels of a plan; values match bonsai.plan.KernelKind (checked at compile time in
/// Plan.cpp).
enum class KernelKind : uint16_t {
#define BONSAI_KERNEL_KIND(Name, Value, ...) Name = Value,
#include "bonsai/runtime/KernelKinds.def"
};

/// Traits of a kind: the Traits column of KernelKinds.def.
namespace kernel_traits {
enum : uint32_t {
  /// An output may be the very storage of an input: each output element depends only on input
  /// elements at the same position, which every kernel reads before it writes.
  kInPlace = 1u << 0,
  /// One or more inputs, all named after the single input of the table (g1, g2, ...).
  kVariadic = 1u << 1,
  /// Operand counts that the kind's contract checks itself (generated kernels, multi-tensor
  /// updates).
  kCustomArity = 1u << 2,
  /// Updates persistent state once per step: runs in the Update phase only, after every
  /// micro-batch's gradient was accumulated...
  kUpdateOnly = 1u << 3,
  /// ...or, for a plan that applies each update as soon as its gradient is complete (the
  /// recipe's update_in_backward), in the Backward phase.
  kMayRunInBackward = 1u << 4,
  /// Writes a parameter: in the Backward phase it makes the plan an update-in-backward plan.
  kUpdatesParameter = 1u << 5,
  /// An FP8 GEMM (docs/fp8.md): a persistent scaling state among its inputs.
  kFp8Gemm = 1u << 6,
  /// Copies state into a step tensor: from a pinned host arena to the device (docs/offload.md)
  /// or this rank's share of a parameter (ShardSlice, docs/sharding.md). A later kernel that
  /// updates that tensor in place updates the state its input holds.
  kStagesState = 1u << 7,
  /// Moves bytes between a pinned host arena and a device arena (docs/offload.md); every other
  /// kind reads and writes device arenas only.
  kCrossesSpaces = 1u << 8,
  /// Has a host implementation that computes the CUDA kernel's bits (HostOptimizer.h): may
  /// run on the host stream, over operands in pinned host arenas only (docs/offload.md, "The
  /// host step").
  kHostStep = 1u << 9,
  /// Exchanges data with the other ranks (docs/sharding.md): every rank must launch it, in the
  /// same order, with the same counts.
  kCollective = 1u << 10,
};
} // namespace kernel_traits

/// One kind of KernelKinds.def.
struct KernelKindInfo {
  KernelKind kind;
  const char *name;   ///< "Linear", as spelled in plan.fbs.
  const char *opName; ///< "linear", the bonsai_plan launch's kernel name.
  uint32_t minInputs;
  uint32_t minOutputs;
  std::vector<std::string> inputs;  ///< Names, in order ("do", not the table's "do_").
  std::vector<std::string> outputs; ///< Names, in order.
  /// Per output: the kernel reads it before it writes it (state and accumulators updated in
  /// place). For a multi-tensor update, per output list.
  std::vector<bool> readWrite;
  uint32_t traits;

  /// Whether the kind has every trait of `mask` (kernel_traits).
  bool has(uint32_t mask) const { return (traits & mask) == mask; }
};

/// Every kind, in table order.
const std::vector<KernelKindInfo> &kernelKinds();
/// The kind whose plan.fbs value is `value`, or null when no kind has it.
const KernelKindInfo *findKernelKind(uint32_t value);
/// The table entry of `kind`.
const KernelKindInfo &kernelKindInfo(KernelKind kind);
/// The position of `kind` in table order: the index of per-kind tables (handlers, contracts).
size_t kernelKindIndex(KernelKind kind);

/// "Linear", "RMSNorm", ... as spelled in plan.fbs; "unknown" for a value of no kind.
const char *kernelKindName(KernelKind kind);

/// How many kinds the table has.
inline constexpr size_t kKernelKindCount = 0
#define BONSAI_KERNEL_KIND(...) +1
#include "bonsai/runtime/KernelKinds.def"
    ;

/// Named operand indices and the attribute struct, one struct per kind: kinds::Linear::In::bias
/// is 2, kinds::AdamWUpdate::Out::master is 3, kinds::AdamWUpdate::Attrs is AdamWAttrs. A
/// struct also serves as the kind's tag type, which backends overload their handlers on.
namespace kinds {
#define BONSAI_OPERAND_LIST(...) __VA_ARGS__
#define BONSAI_KERNEL_KIND(Name, Value, OpName, AttrTable, MinInputs, Inputs, MinOutputs, Outputs, \
                           ReadWrite, Traits)                                                      \
  struct Name {                                                                                    \
    static constexpr KernelKind kind = KernelKind::Name;                                           \
    static constexpr uint32_t traits = [] {                                                        \
      using namespace kernel_traits;                                                               \
      return uint32_t(Traits);                                                                     \
    }();                                                                                           \
    using Attrs = attribute_tables::AttrTable;                                                     \
    struct In {                                                                                    \
      enum : unsigned { BONSAI_OPERAND_LIST Inputs };                                              \
    };                                                                                             \
    struct Out {                                                                                   \
      enum : unsigned { BONSAI_OPERAND_LIST Outputs };                                             \
    };                                                                                             \
  };
#include "bonsai/runtime/KernelKinds.def"
#undef BONSAI_OPERAND_LIST
} // namespace kinds

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_KERNELKINDS_H
