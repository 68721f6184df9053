//===- KernelChecker.h - The operand contract of every plan kernel --------===//
//
// Private to the runtime. The plan loader (Plan.cpp) runs one KernelChecker per kernel, after
// the kernel's tensors were read and checked: the arity and operand names come from the kernel
// table (KernelKinds.def), then the kind's own contract, `verify(kinds::K)`, checks its
// attributes, operand dtypes and shapes, workspace sizes and the state it keeps. Each contract
// lives with its family in runtime/contract/ (Norm.cpp, Fp8.cpp, ...); a kind of the table
// without one does not link. Generic rules (overlap, phase, NF4 operands) are checked here for
// every kind. Kernels then run on calls that passed: the backends re-check nothing the
// contract checked (docs/runtime.md).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_SRC_KERNELCHECKER_H
#define BONSAI_RUNTIME_SRC_KERNELCHECKER_H

#include "bonsai/runtime/Fp8.h"
#include "bonsai/runtime/Fusion.h"
#include "bonsai/runtime/GaLore.h"
#include "bonsai/runtime/KernelKinds.h"
#include "bonsai/runtime/Nf4.h"
#include "bonsai/runtime/Plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace bonsai::rt::contract {

// FP8 scaling state (docs/fp8.md): the amax history's length (the recipe's option bound), the
// largest margin (2^32 below the largest finite value is already below every subnormal), and
// the dimensions FP8 tensor-core GEMMs take (multiples of 16).
inline constexpr int64_t kMaxFp8History = 1024;
inline constexpr int32_t kMaxFp8Margin = 32;
inline constexpr int64_t kFp8GemmMultiple = 16;

/// i32 or i64: token ids, labels and steps.
inline bool isIndexType(DType t) { return t == DType::I32 || t == DType::I64; }
/// f32, f16 or bf16: what the float kernels read and write.
inline bool isFloatStorage(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}
/// Whether two tensors share a byte of one arena.
inline bool rangesOverlap(const TensorInfo &a, const TensorInfo &b) {
  return a.arena == b.arena && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}
/// Whether two tensors are the very same bytes (an exact alias).
inline bool sameStorage(const TensorInfo &a, const TensorInfo &b) {
  return a.arena == b.arena && a.offset == b.offset && a.bytes == b.bytes;
}
/// Whether `t` is a scalar [] of `dtype`.
inline bool isScalar(const TensorInfo &t, DType dtype) {
  return t.shape.empty() && t.dtype == dtype;
}
/// A double for messages: "1e-08", "0.9", "inf".
inline std::string num(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  return buf;
}

/// Verification of one kernel against its kind's operand conventions.
class KernelChecker {
public:
  KernelChecker(const LoadedPlan &plan, size_t index)
      : plan(plan), index(index), kernel(plan.kernels[index]) {}

  void check();

private:
  [[noreturn]] void fail(const std::string &message) const {
    throw Error("plan file '" + plan.path + "': " + plan.describeKernel(index) + ": " + message);
  }

  /// The attributes of `Kind`'s table (kinds::K::Attrs): the kernel is of that kind.
  template <typename Kind> const typename Kind::Attrs &attrs() const {
    return kernel.attrsAs<typename Kind::Attrs>();
  }
  const TensorInfo &in(size_t i) const { return plan.tensors[kernel.inputs[i]]; }
  const TensorInfo &out(size_t i = 0) const { return plan.tensors[kernel.outputs[i]]; }
  const ArenaInfo &arenaOf(const TensorInfo &t) const { return plan.arenas[t.arena]; }

  std::string inName(size_t i) const {
    std::string name = variadic ? operandNames[0] + std::to_string(i + 1) : operandNames[i];
    return name + " (" + plan.describeTensor(kernel.inputs[i]) + ")";
  }
  std::string outName(size_t i = 0) const {
    return resultNames[i] + " (" + plan.describeTensor(kernel.outputs[i]) + ")";
  }

  void expectFloat(size_t i) const {
    if (!isFloatStorage(in(i).dtype))
      fail(inName(i) + " dtype: expected f32, f16 or bf16, got " + dtypeName(in(i).dtype));
  }
  void expectIndex(size_t i) const {
    if (!isIndexType(in(i).dtype))
      fail(inName(i) + " dtype: expected i32 or i64, got " + dtypeName(in(i).dtype));
  }
  void expectInputDType(size_t i, DType dtype) const {
    if (in(i).dtype != dtype)
      fail(inName(i) + " dtype: expected " + dtypeName(dtype) + " (as " + operandNames[0] +
           "), got " + dtypeName(in(i).dtype));
  }
  void expectInputShape(size_t i, const std::vector<int64_t> &shape) const {
    if (in(i).shape != shape)
      fail(inName(i) + " shape: expected " + formatShape(shape) + ", got " +
           formatShape(in(i).shape));
  }
  void expectRankAtLeast(size_t i, size_t rank) const {
    if (in(i).shape.size() < rank)
      fail(inName(i) + " rank: expected at least " + std::to_string(rank) + ", got " +
           std::to_string(in(i).shape.size()));
  }
  void expectRank(size_t i, size_t rank) const {
    if (in(i).shape.size() != rank)
      fail(inName(i) + " rank: expected " + std::to_string(rank) + ", got " +
           std::to_string(in(i).shape.size()) + " " + formatShape(in(i).shape));
  }
  void expectScalarInput(size_t i, DType dtype) const {
    if (!isScalar(in(i), dtype))
      fail(inName(i) + " must be a scalar [] of dtype " + dtypeName(dtype) + ", got " +
           formatShape(in(i).shape) + " " + dtypeName(in(i).dtype));
  }
  void expectScalarOutput(size_t j, DType dtype) const {
    if (!isScalar(out(j), dtype))
      fail(outName(j) + " must be a scalar [] of dtype " + dtypeName(dtype) + ", got " +
           formatShape(out(j).shape) + " " + dtypeName(out(j).dtype));
  }
  void expectOutput(const std::vector<int64_t> &shape, DType dtype) const {
    if (out().shape != shape)
      fail(outName() + " shape: expected " + formatShape(shape) + ", got " +
           formatShape(out().shape));
    if (out().dtype != dtype)
      fail(outName() + " dtype: expected " + std::string(dtypeName(dtype)) + ", got " +
           dtypeName(out().dtype));
  }
  /// The result has the type of input `i`.
  void expectOutputLike(size_t i) const { expectOutput(in(i).shape, in(i).dtype); }
  /// Output `j` has `shape` and any float storage (gradients may be kept in another precision
  /// than the values they differentiate; the kernels convert through fp32).
  void expectFloatOutput(size_t j, const std::vector<int64_t> &shape) const {
    if (!isFloatStorage(out(j).dtype))
      fail(outName(j) + " dtype: expected f32, f16 or bf16, got " + dtypeName(out(j).dtype));
    if (out(j).shape != shape)
      fail(outName(j) + " shape: expected " + formatShape(shape) + ", got " +
           formatShape(out(j).shape));
  }
  /// Output `j` is an f32 tensor of `shape` (optimizer moments and master weights).
  void expectF32Output(size_t j, const std::vector<int64_t> &shape) const {
    if (out(j).dtype != DType::F32)
      fail(outName(j) + " dtype: expected f32, got " + dtypeName(out(j).dtype));
    if (out(j).shape != shape)
      fail(outName(j) + " shape: expected " + formatShape(shape) + ", got " +
           formatShape(out(j).shape));
  }
  /// The forward linear's inputs, y = x · Wᵀ (+ b): x a float tensor [..., K], W [N, K] and,
  /// when `thirdIsBias`, the optional bias [N] (input 2) of x's dtype. Returns y's shape
  /// [..., N].
  std::vector<int64_t> checkLinearInputs(bool thirdIsBias = true) const {
    expectFloat(0);
    expectRankAtLeast(0, 1);
    expectRank(1, 2);
    expectInputDType(1, in(0).dtype);
    int64_t k = in(0).shape.back(), n = in(1).shape[0];
    if (in(1).shape[1] != k)
      fail(inName(1) + " shape: expected [out, " + std::to_string(k) +
           "] ([out, in] layout), got " + formatShape(in(1).shape));
    if (thirdIsBias && kernel.inputs.size() == 3) {
      expectInputDType(2, in(0).dtype);
      expectInputShape(2, {n});
    }
    std::vector<int64_t> shape(in(0).shape.begin(), in(0).shape.end() - 1);
    shape.push_back(n);
    return shape;
  }
  /// Input `i` is a float tensor of `shape`.
  void expectFloatInput(size_t i, const std::vector<int64_t> &shape) const {
    expectFloat(i);
    expectInputShape(i, shape);
  }
  /// `small` broadcasts into `large`'s trailing dimensions (each equal or 1).
  void expectBroadcast(const std::string &smallName, const std::vector<int64_t> &small,
                       const std::string &largeName, const std::vector<int64_t> &large) const {
    if (small.size() > large.size())
      fail(smallName + " rank " + std::to_string(small.size()) + " exceeds " + largeName +
           " rank " + std::to_string(large.size()) + " (only rhs is broadcast)");
    for (size_t i = 0; i < small.size(); ++i) {
      int64_t want = large[large.size() - small.size() + i];
      if (small[i] != want && small[i] != 1)
        fail(smallName + " shape " + formatShape(small) + " does not broadcast to " +
             formatShape(large) + ": dimension " + std::to_string(i) + " is " +
             std::to_string(small[i]) + ", expected " + std::to_string(want) + " or 1");
    }
  }
  /// Input 0 lives in an arena of space `from` and output 0 in one of space `to` (the
  /// host-offload copies).
  void expectSpaces(MemorySpace from, MemorySpace to) const;
  /// The tensor that carries output `j`'s state from step to step: output `j` itself or, when
  /// the latest earlier kernel that writes it stages state (kStagesState: a device copy of state
  /// kept in pinned host memory, docs/offload.md), the tensor that kernel copied.
  uint32_t stateTensor(size_t j) const {
    uint32_t t = kernel.outputs[j];
    for (size_t k = index; k-- > 0;) {
      const KernelInfo &earlier = plan.kernels[k];
      if (std::find(earlier.outputs.begin(), earlier.outputs.end(), t) == earlier.outputs.end())
        continue;
      if (kernelKindInfo(earlier.kind).has(kernel_traits::kStagesState))
        return earlier.inputs[0];
      break;
    }
    return t;
  }
  /// outName(j), and the state it stands for when that is another tensor.
  std::string stateName(size_t j) const {
    uint32_t state = stateTensor(j);
    if (state == kernel.outputs[j])
      return outName(j);
    return outName(j) + ", a copy of " + plan.describeTensor(state) + ",";
  }
  /// Output `j` carries state from step to step: it (or the state it is a copy of) must live
  /// in a persistent arena.
  void expectPersistent(size_t j) const {
    const TensorInfo &state = plan.tensors[stateTensor(j)];
    const ArenaInfo &arena = arenaOf(state);
    if (arena.lifetime != Lifetime::Persistent)
      fail(stateName(j) + " is in step arena " + std::to_string(state.arena) + " '" + arena.name +
           "': state updated in place must live in a persistent arena");
  }
  /// Output `j` is state the kernel reads before its first update: it must start as `init`.
  void expectInit(size_t j, TensorInit init, const char *why) const {
    if (plan.tensors[stateTensor(j)].init != init)
      fail(stateName(j) + " must have init " + (init == TensorInit::Zeros ? "Zeros" : "CopyOf") +
           " (" + why + ")");
  }
  /// Output `master` holds the fp32 master weights of output `param`: a copy of it at init.
  void expectMasterCopy(size_t master, size_t param) const {
    expectInit(master, TensorInit::CopyOf, "master weights start as a copy of the parameter");
    uint32_t from = plan.tensors[stateTensor(master)].initSource;
    // On the host stream the parameter output is the pinned host mirror of the parameter (a
    // copy of it too, copied back to the device after the update): both are its copies.
    const TensorInfo &target = out(param);
    bool mirror = kernel.stream == StreamId::Host && target.init == TensorInit::CopyOf &&
                  sameStorage(plan.tensors[from], plan.tensors[target.initSource]);
    // A parameter updated through a staged copy (this rank's ShardSlice of it under ZeRO-1/2,
    // docs/sharding.md) has masters copied from the parameter itself.
    bool staged = sameStorage(plan.tensors[from], plan.tensors[stateTensor(param)]);
    if (!mirror && !staged && !sameStorage(plan.tensors[from], target))
      fail(stateName(master) + " is a copy of " + plan.describeTensor(from) + ", not of " +
           outName(param));
  }
  /// Attribute `name` is finite and non-negative.
  void finiteAtLeast0(const char *name, double v) const {
    if (!(v >= 0) || !std::isfinite(v))
      fail(std::string(name) + " must be finite and non-negative, got " + num(v));
  }
  /// The hyperparameters AdamW and GaLore's AdamW share.
  void checkAdamWAttrs(const AdamWAttrs &a) const {
    if (!(a.beta1 >= 0 && a.beta1 < 1))
      fail("beta1 must be in [0, 1), got " + num(a.beta1));
    if (!(a.beta2 >= 0 && a.beta2 < 1))
      fail("beta2 must be in [0, 1), got " + num(a.beta2));
    if (!(a.eps > 0) || !std::isfinite(a.eps))
      fail("eps must be positive and finite, got " + num(a.eps));
    finiteAtLeast0("weight_decay", a.weightDecay);
    finiteAtLeast0("grad_clip", a.gradClip);
  }

  /// GaLore projects the smaller side of a 2-D gradient (`left`: rows); either for a square one.
  void checkGaloreSide(const std::vector<int64_t> &shape, bool left) const {
    if ((left && shape[0] > shape[1]) || (!left && shape[0] < shape[1]))
      fail("projects the " + std::string(left ? "left" : "right") + " side of a " +
           formatShape(shape) + " matrix; GaLore projects the smaller side");
  }
  /// Input `i` is a GaLore projector: f32 [rows, rank] with 0 < rank < rows.
  void expectGaloreProjector(size_t i, int64_t rows) const {
    const TensorInfo &p = in(i);
    if (p.dtype != DType::F32 || p.shape.size() != 2 || p.shape[0] != rows || p.shape[1] < 1 ||
        p.shape[1] >= rows)
      fail(inName(i) + ": expected an f32 [" + std::to_string(rows) +
           ", rank] projector with 0 < rank < " + std::to_string(rows) + ", got " +
           formatShape(p.shape) + " " + dtypeName(p.dtype));
  }
  void checkArity();
  /// The shared scalars of a multi-tensor update (step for AdamW, lr, norm): the table's inputs.
  std::vector<std::string> multiTensorShared() const { return kernelKindInfo(kernel.kind).inputs; }
  /// The per-parameter output lists of a multi-tensor update, masters excluded: the table's
  /// outputs.
  std::vector<std::string> multiTensorStates() const { return kernelKindInfo(kernel.kind).outputs; }
  /// Names the operands of a multi-tensor update (g1 .. gn; param1 .. paramn, ...) from its
  /// counts; fails unless there is at least one gradient and one output per list and gradient.
  void nameMultiTensorOperands();
  /// Checks shapes and dtypes of a multi-tensor update (names from nameMultiTensorOperands).
  void checkMultiTensorShapes();
  /// Parameters of a multi-tensor update, and whether it has master weights.
  size_t multiTensorCount() const { return kernel.inputs.size() - multiTensorShared().size(); }
  bool multiTensorHasMasters() const {
    return kernel.outputs.size() == (multiTensorStates().size() + 1) * multiTensorCount();
  }
  /// A FusedElementwise kernel: a generated kernel of the plan, whose program has as many
  /// inputs and outputs as the kernel, each of the tensor's dtype; outputs of one numel,
  /// each input's numel divides it.
  void checkGeneratedArity();
  /// NF4 tensors are read by Dequantize only (no other kernel knows the layout) and written
  /// by none (weights are quantized when they are bound) but the AllGather of a sharded
  /// weight's u8 shares, which are read by that AllGather only. The copies between device and
  /// pinned host memory move an NF4 tensor's bytes as they are (a gathered weight that the
  /// backward pass dequantizes again, offloaded between the passes like an activation).
  void checkNf4Operands() const {
    const bool gather = kernel.kind == KernelKind::AllGather;
    const bool copy = kernelKindInfo(kernel.kind).has(kernel_traits::kCrossesSpaces);
    for (size_t i = 0; i < kernel.inputs.size(); ++i) {
      if (in(i).dtype == DType::NF4 && kernel.kind != KernelKind::Dequantize && !copy)
        fail(inName(i) + " is nf4, which only a Dequantize kernel (or a copy) reads");
      if (in(i).dtype == DType::U8 && !gather)
        fail(inName(i) + " is u8 (a share of nf4 storage), which only an AllGather reads");
    }
    for (size_t j = 0; j < kernel.outputs.size(); ++j) {
      if (out(j).dtype == DType::NF4 && !gather && !copy)
        fail(outName(j) + " is nf4: no kernel writes NF4 (weights are quantized when bound) "
                          "but the AllGather of its shares (or a copy)");
      if (out(j).dtype == DType::U8)
        fail(outName(j) + " is u8: a share of nf4 storage is bound, not written by a kernel");
    }
  }
  void checkOverlap() const;
  void checkPhase() const;
  /// Only kinds with the kCrossesSpaces trait have operands in pinned host arenas.
  void checkSpaces() const;
  /// Only kinds with the kCrossesSpaces trait run on a copy stream.
  void checkStream() const;

  /// The contract of each kind (runtime/contract/<family>.cpp): its attributes, operand
  /// shapes and dtypes, and the state it keeps, checked after its arity.
#define BONSAI_KERNEL_KIND(Name, ...) void verify(kinds::Name);
#include "bonsai/runtime/KernelKinds.def"

  // Checks that several kinds of a family share (runtime/contract/).
  /// An FP8 GEMM kind's contract: its attributes, its `operands` check, its persistent state.
  void verifyFp8Gemm(void (KernelChecker::*operands)());
  /// The collectives' attributes (Collective.cpp): ranks equal the plan's, and a reduction
  /// other than Sum only where the kind `takesReduction` (AllReduce).
  void checkCollectiveAttrs(bool takesReduction);
  /// `full` holds the plan's ranks times `shard`'s elements, of the same dtype.
  void checkShardOf(const TensorInfo &full, const std::string &fullName, const TensorInfo &shard,
                    const std::string &shardName);
  /// The normalization epsilon is positive.
  void checkEpsilon();
  /// The rotary base theta is positive; llama3 scaling, when present, is consistent.
  void checkTheta();
  /// The optional per-token input `i` (positions, segment_ids), when the kernel has it, is an
  /// i32 or i64 [batch, seq] of input `of` ([batch, seq, ...]).
  void checkTokenInput(size_t i, size_t of) const;
  /// The attention scale is positive and finite.
  void checkAttentionScale();
  /// The axis attribute indexes a dimension of the input.
  void checkAxisOfInput(int32_t axis);
  /// The hyperparameters of SGD and its multi-tensor form.
  void checkSgdAttrs();
  /// The margin of every FP8 kind, and fast accumulation on the forward GEMMs only.
  void checkFp8Attrs();
  /// The gradients of RMSNorm and LayerNorm.
  void checkNormGradShapes();
  /// The gradients of attention, with or without the saved log-sum-exp.
  void checkAttentionGradShapes();
  /// dx = f'(x) dy of an elementwise op: dy, x and dx of one shape.
  void checkUnaryGradShapes();
  /// The operands of AdamW and SGD.
  void checkUpdateShapes();
  /// sum = lhs + rhs and its norm.
  void checkAddNormShapes();
  /// A norm's gradients with an addend added into dx.
  void checkNormGradAddShapes();
  /// The FP8 GEMMs of the forward and of the input gradient.
  void checkFp8LinearShapes();
  /// The FP8 weight-gradient GEMMs, plain and accumulating.
  void checkFp8GradWeightShapes();
  /// The fused FP8 backwards that read another kernel's cast of x.
  void checkFp8BackwardCastShapes();
  /// lhs and a trailing-broadcast rhs of one dtype.
  void checkBinaryShapes();
  /// x [..., D] and its weight (and bias) [D].
  void checkNormShapes();
  /// y has the type of x.
  void checkUnaryShapes();
  /// AdamW and SGD update persistent, zero-initialized state (and master copies).
  void checkUpdateState();
  /// The multi-tensor updates' state: persistent, zero-initialized, masters copied.
  void checkMultiTensorState();
  /// The FP8 GEMMs' scaling state lives in a persistent arena.
  void checkFp8StateIsPersistent();
  void checkAttentionShapes(size_t q, size_t k, size_t v) const;
  void checkLse(size_t lse, bool isOutput) const;
  /// The log-sum-exp (output or input `i`) is f32 [batch, heads, seq] of `query` [batch, seq,
  /// heads, head_dim].
  void checkLseOf(size_t i, bool isOutput, const std::vector<int64_t> &query) const;
  /// Input `qkv` packs the query heads of `output` ([batch, seq, heads, head_dim], named
  /// `outputName`) and then two equal numbers of key/value heads that divide them, in one float
  /// type with the output.
  void checkPackedQkv(size_t qkv, const TensorInfo &output, const std::string &outputName) const;
  /// flash_attention_qkv and its gradient take q, k and v apart from no ring (docs/fusion.md).
  void checkNoRing();
  /// FP8 GEMM kinds (docs/fp8.md): an FP8 scaling state f32 [3, 4 + H], 1 <= H <= 1024.
  void checkFp8State(const TensorInfo &t, const std::string &name) const;
  /// The statistics of two casts: f32 [2, 4].
  void checkFp8Stats(const TensorInfo &t, const std::string &name) const;
  /// GEMM dimension `what` (M, N or K) is a multiple of 16, as FP8 tensor cores need.
  void checkFp8Dimension(const char *what, int64_t value, const std::string &from) const;
  /// The state (input 2), the stats (output `stats`: 1, or 0 for the accumulating
  /// Fp8LinearGradWeightAccumulate) and the workspace (output `workspace`, by default the one after
  /// the stats, at least fp8::gemmWorkspaceBytes / 4 f32 elements for casts of `a` and `b`
  /// elements) of kinds 90..92, 94 and 98.
  void checkFp8GemmOperands(int64_t aElements, int64_t bElements, size_t stats = 1,
                            std::optional<size_t> workspace = std::nullopt) const;
  /// `t` (named `name`) holds xᵀ's codes for x [..., K] of M rows: f8_e4m3 [K, M] (kinds 98
  /// and 99; `whose` says whose codes they are, or is empty).
  void checkFp8TransposedCodes(const TensorInfo &t, const std::string &name, int64_t k, int64_t m,
                               const std::string &whose) const;
  /// Output `j` is a 1-D f32 workspace of at least `bytes` / 4 elements; `what` says what it
  /// holds.
  void checkFp8Workspace(size_t j, int64_t bytes, const std::string &what) const;
  /// Inputs `cast` and `stats` are another FP8 kernel's workspace (f32, at least `bytes`,
  /// holding x's codes; `what` says whose) and statistics.
  void checkFp8SharedCast(size_t cast, size_t stats, int64_t elements, int64_t bytes,
                          const std::string &what) const;

  const LoadedPlan &plan;
  size_t index;
  const KernelInfo &kernel;
  std::vector<std::string> operandNames;
  std::vector<std::string> resultNames = {"result"};
  bool variadic = false; ///< Any number >= 1 of inputs named operandNames[0] + 1, 2, ...
};

} // namespace bonsai::rt::contract

#endif // BONSAI_RUNTIME_SRC_KERNELCHECKER_H
