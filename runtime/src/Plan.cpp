//===- Plan.cpp - Loading and verifying a compiled training-step plan -----===//
//
// Verify, then load: the identifier and the FlatBuffers verifier make every read of the buffer
// safe, and the semantic checks below make every kernel launch safe (each operand's byte range
// lies inside its arena, and each kernel's shapes agree the way its CPU and GPU implementations
// assume). The checks mirror the bonsai dialect's op verifiers: a plan that passes them cannot
// make a kernel read or write outside its tensors. Version 2 adds the training contract on top:
// initializers (zeros, converting copies) only on persistent state, phases in order, optimizer
// state where an update can find it again next step, and the micro-batch rules that make
// gradient accumulation compute the gradient of the mean loss. Every message names the plan
// file and the arena, tensor or kernel at fault.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Plan.h"

#include "bonsai/runtime/Fp8.h"
#include "bonsai/runtime/Fusion.h"
#include "bonsai/runtime/GaLore.h"
#include "bonsai/runtime/Nf4.h"

#include "bonsai/runtime/plan_generated.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

namespace bonsai::rt {

namespace fb = ::bonsai::plan;

// The runtime's enums are copies of the schema's, so that headers need no generated code.
static_assert(uint8_t(fb::DType::I64) == uint8_t(DType::I64) &&
                  uint8_t(fb::DType::NF4) == uint8_t(DType::NF4) &&
                  uint8_t(fb::DType::F8E5M2) == uint8_t(DType::F8E5M2),
              "rt::DType must match plan.fbs");
static_assert(uint8_t(fb::TensorRole::LossScale) == uint8_t(TensorRole::LossScale) &&
                  uint8_t(fb::TensorRole::MAX) == uint8_t(TensorRole::LossScale) &&
                  uint8_t(fb::TensorRole::Metric) == uint8_t(TensorRole::Metric),
              "rt::TensorRole must match plan.fbs");
// Every kind of the kernel table has its plan.fbs value, and the schema has no kind the table
// lacks: equal counts of distinct kinds make the two one list.
#define BONSAI_KERNEL_KIND(Name, Value, ...)                                                      \
  static_assert(uint16_t(fb::KernelKind::Name) == Value,                                          \
                "KernelKinds.def: " #Name "'s value differs from plan.fbs");
#include "bonsai/runtime/KernelKinds.def"
static_assert(sizeof(fb::EnumValuesKernelKind()) / sizeof(fb::KernelKind) == kKernelKindCount,
              "plan.fbs has a KernelKind that KernelKinds.def lacks");
static_assert(uint8_t(fb::MemorySpace::PinnedHost) == uint8_t(MemorySpace::PinnedHost) &&
                  uint8_t(fb::Lifetime::Step) == uint8_t(Lifetime::Step),
              "rt::MemorySpace and rt::Lifetime must match plan.fbs");
static_assert(uint8_t(fb::TensorInit::CopyOf) == uint8_t(TensorInit::CopyOf) &&
                  uint8_t(fb::TensorInit::KaimingUniform) ==
                      uint8_t(TensorInit::KaimingUniform) &&
                  uint8_t(fb::TensorInit::MAX) == uint8_t(TensorInit::RowNorm),
              "rt::TensorInit must match plan.fbs");
static_assert(uint8_t(fb::ElementwiseOpcode::Truncate) == uint8_t(ElementwiseOpcode::Truncate) &&
                  uint8_t(fb::ElementwiseOpcode::MAX) == uint8_t(ElementwiseOpcode::Erf),
              "rt::ElementwiseOpcode must match plan.fbs");
static_assert(uint8_t(fb::Phase::Update) == uint8_t(Phase::Update) &&
                  uint8_t(fb::Phase::MAX) == uint8_t(Phase::Update),
              "rt::Phase must match plan.fbs");

namespace {

// Largest arena or tensor the runtime accepts: far beyond any real device, far below the
// point where offset + bytes could overflow.
constexpr uint64_t kMaxArenaBytes = uint64_t(1) << 50;
constexpr uint64_t kMaxAlignment = uint64_t(1) << 20;
constexpr size_t kMaxRank = 16;
// Token files hold uint32 ids; far more micro-batches than any step needs.
constexpr uint64_t kMaxVocab = uint64_t(1) << 32;
constexpr uint32_t kMaxMicroBatches = uint32_t(1) << 20;
// FP8 scaling state (docs/fp8.md): the amax history's length (the recipe's option bound), the
// largest margin (2^32 below the largest finite value is already below every subnormal), and
// the dimensions FP8 tensor-core GEMMs take (multiples of 16).
constexpr int64_t kMaxFp8History = 1024;
constexpr int32_t kMaxFp8Margin = 32;
constexpr int64_t kFp8GemmMultiple = 16;

std::string str(const flatbuffers::String *s) { return s ? s->str() : std::string(); }

/// The elements of a vector of int64. The FlatBuffers 2.0 verifier checks a vector's 4-byte
/// length prefix for alignment, not its 8-byte elements, so a corrupted offset can leave them
/// misaligned: they are copied bytewise instead of loaded through a typed pointer.
std::vector<int64_t> readInt64s(const flatbuffers::Vector<int64_t> &v) {
  std::vector<int64_t> out(v.size());
  const uint8_t *data = v.Data();
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t value;
    std::memcpy(&value, data + i * sizeof value, sizeof value);
    out[i] = flatbuffers::EndianScalar(value);
  }
  return out;
}

bool isIndexType(DType t) { return t == DType::I32 || t == DType::I64; }
bool isFloatStorage(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

bool rangesOverlap(const TensorInfo &a, const TensorInfo &b) {
  return a.arena == b.arena && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

bool sameStorage(const TensorInfo &a, const TensorInfo &b) {
  return a.arena == b.arena && a.offset == b.offset && a.bytes == b.bytes;
}

bool isScalar(const TensorInfo &t, DType dtype) { return t.shape.empty() && t.dtype == dtype; }

/// A double for messages: "1e-08", "0.9", "inf".
std::string num(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  return buf;
}

} // namespace

const char *tensorRoleName(TensorRole role) {
  switch (role) {
  case TensorRole::Parameter:
    return "parameter";
  case TensorRole::Input:
    return "input";
  case TensorRole::Activation:
    return "activation";
  case TensorRole::Gradient:
    return "gradient";
  case TensorRole::OptimizerState:
    return "optimizer state";
  case TensorRole::Workspace:
    return "workspace";
  case TensorRole::Loss:
    return "loss";
  case TensorRole::Metric:
    return "metric";
  case TensorRole::LossScale:
    return "loss scale";
  }
  return "unknown";
}

const char *phaseName(Phase phase) {
  switch (phase) {
  case Phase::Forward:
    return "forward";
  case Phase::Backward:
    return "backward";
  case Phase::Update:
    return "update";
  }
  return "unknown";
}

std::string LoadedPlan::describeTensor(uint32_t index) const {
  std::string s = "tensor " + std::to_string(index);
  if (index < tensors.size())
    s += " '" + tensors[index].name + "'";
  return s;
}

std::string LoadedPlan::describeKernel(size_t index) const {
  std::string s = "kernel " + std::to_string(index);
  if (index < kernels.size()) {
    if (!kernels[index].name.empty())
      s += " '" + kernels[index].name + "'";
    s += std::string(" (") + kernelKindName(kernels[index].kind) + ")";
  }
  return s;
}

bool LoadedPlan::trains() const {
  for (const KernelInfo &k : kernels)
    if (k.phase == Phase::Update)
      return true;
  return false;
}

std::optional<size_t> LoadedPlan::updateInBackward() const {
  for (size_t i = 0; i < kernels.size(); ++i)
    if (kernels[i].phase == Phase::Backward &&
        kernelKindInfo(kernels[i].kind).has(kernel_traits::kUpdatesParameter))
      return i;
  return std::nullopt;
}

bool LoadedPlan::hasBackward() const {
  for (const KernelInfo &k : kernels)
    if (k.phase == Phase::Backward)
      return true;
  return false;
}

std::optional<uint32_t> LoadedPlan::metric(const std::string &name) const {
  for (uint32_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].role == TensorRole::Metric && tensors[i].name == name)
      return i;
  return std::nullopt;
}

std::vector<uint32_t> LoadedPlan::fp8States() const {
  static const std::string suffix = ".fp8";
  std::vector<uint32_t> states;
  for (uint32_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo &t = tensors[i];
    if (t.role == TensorRole::OptimizerState && t.dtype == DType::F32 && t.shape.size() == 2 &&
        t.shape[0] == 3 && t.shape[1] > fp8::kStateColumns && t.name.size() > suffix.size() &&
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      states.push_back(i);
  }
  return states;
}

std::string LoadedPlan::microBatchProblem(uint32_t count) const {
  if (count == 0)
    return "the number of micro-batches must be at least 1";
  if (count == 1)
    return "";
  if (hasBackward() && !lossScale)
    return "the plan has no LossScale tensor, so " + std::to_string(count) +
           " micro-batches would sum their gradients instead of averaging them";
  if (std::optional<size_t> update = updateInBackward())
    return describeKernel(*update) +
           " updates its parameter in the backward pass (the recipe's update_in_backward), "
           "so every micro-batch would update the weights: the plan runs one micro-batch per "
           "step";
  // What an update kernel reads from a step arena must be written in the update phase: the
  // nearest earlier kernel that writes those bytes decides (the planner reuses step-arena bytes
  // across phases, so sharing storage with a backward tensor is not by itself a problem).
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (kernels[i].phase != Phase::Update)
      continue;
    for (size_t input = 0; input < kernels[i].inputs.size(); ++input) {
      uint32_t t = kernels[i].inputs[input];
      const TensorInfo &info = tensors[t];
      if (arenas[info.arena].lifetime == Lifetime::Persistent)
        continue;
      // FP8 scales are updated from the last micro-batch's cast statistics by design
      // (docs/fp8.md): the earlier micro-batches' are meant to be overwritten.
      if (kernels[i].kind == KernelKind::Fp8UpdateScales && input > 0)
        continue;
      std::optional<size_t> writer;
      for (size_t j = i; j-- > 0 && !writer;)
        for (uint32_t o : kernels[j].outputs)
          if (rangesOverlap(tensors[o], info))
            writer = j;
      if (writer && kernels[*writer].phase == Phase::Update)
        continue;
      return describeKernel(i) + " reads " + describeTensor(t) + ", which each micro-batch " +
             (writer ? "produces" : "overwrites") + " in step arena " + std::to_string(info.arena) +
             " '" + arenas[info.arena].name + "': with " + std::to_string(count) +
             " micro-batches only the last one's value would reach the update "
             "(accumulate it into a persistent tensor)";
    }
  }
  return "";
}

std::vector<uint8_t> readFileBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in)
    throw Error("cannot open '" + path + "'");
  std::streamoff size = in.tellg();
  if (size < 0)
    throw Error("cannot read '" + path + "' (not a regular file?)");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(reinterpret_cast<char *>(bytes.data()), size))
    throw Error("cannot read '" + path + "'");
  return bytes;
}

namespace {

/// Verification of one kernel against its kind's operand conventions.
class KernelChecker {
public:
  KernelChecker(const LoadedPlan &plan, size_t index)
      : plan(plan), index(index), kernel(plan.kernels[index]) {}

  void check();

private:
  [[noreturn]] void fail(const std::string &message) const {
    throw Error("plan file '" + plan.path + "': " + plan.describeKernel(index) + ": " +
                message);
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
  /// The forward linear's inputs, y = x · Wᵀ (+ b): x a float tensor [..., K], W [N, K] and the
  /// optional bias [N] (input 2) of x's dtype. Returns y's shape [..., N].
  std::vector<int64_t> checkLinearInputs() const {
    expectFloat(0);
    expectRankAtLeast(0, 1);
    expectRank(1, 2);
    expectInputDType(1, in(0).dtype);
    int64_t k = in(0).shape.back(), n = in(1).shape[0];
    if (in(1).shape[1] != k)
      fail(inName(1) + " shape: expected [out, " + std::to_string(k) + "] ([out, in] layout), got " +
           formatShape(in(1).shape));
    if (kernel.inputs.size() == 3) {
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
  /// Output `j` carries state from step to step: it must live in a persistent arena.
  void expectPersistent(size_t j) const {
    const ArenaInfo &arena = arenaOf(out(j));
    if (arena.lifetime != Lifetime::Persistent)
      fail(outName(j) + " is in step arena " + std::to_string(out(j).arena) + " '" + arena.name +
           "': state updated in place must live in a persistent arena");
  }
  /// Output `j` is state the kernel reads before its first update: it must start as `init`.
  void expectInit(size_t j, TensorInit init, const char *why) const {
    if (out(j).init != init)
      fail(outName(j) + " must have init " + (init == TensorInit::Zeros ? "Zeros" : "CopyOf") +
           " (" + why + ")");
  }
  /// Output `master` holds the fp32 master weights of output `param`: a copy of it at init.
  void expectMasterCopy(size_t master, size_t param) const {
    expectInit(master, TensorInit::CopyOf, "master weights start as a copy of the parameter");
    const TensorInfo &source = plan.tensors[out(master).initSource];
    if (!sameStorage(source, out(param)))
      fail(outName(master) + " is a copy of " + plan.describeTensor(out(master).initSource) +
           ", not of " + outName(param));
  }
  /// Attribute `name` is finite and non-negative.
  void finiteAtLeast0(const char *name, double v) const {
    if (!(v >= 0) || !std::isfinite(v))
      fail(std::string(name) + " must be finite and non-negative, got " + num(v));
  }
  /// The hyperparameters AdamW and GaLore's AdamW share.
  void checkAdamWAttrs() const {
    const KernelAttrsInfo &a = kernel.attrs;
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
  std::vector<std::string> multiTensorShared() const {
    return kernelKindInfo(kernel.kind).inputs;
  }
  /// The per-parameter output lists of a multi-tensor update, masters excluded: the table's
  /// outputs.
  std::vector<std::string> multiTensorStates() const {
    return kernelKindInfo(kernel.kind).outputs;
  }
  /// Names the operands of a multi-tensor update (g1 .. gn; param1 .. paramn, ...) from its
  /// counts; fails unless there is at least one gradient and one output per list and gradient.
  void nameMultiTensorOperands();
  /// Checks shapes and dtypes of a multi-tensor update (names from nameMultiTensorOperands).
  void checkMultiTensorShapes();
  /// Parameters of a multi-tensor update, and whether it has master weights.
  size_t multiTensorCount() const {
    return kernel.inputs.size() - multiTensorShared().size();
  }
  bool multiTensorHasMasters() const {
    return kernel.outputs.size() == (multiTensorStates().size() + 1) * multiTensorCount();
  }
  /// A FusedElementwise kernel: a generated kernel of the plan, whose program has as many
  /// inputs and outputs as the kernel, each of the tensor's dtype; outputs of one numel,
  /// each input's numel divides it.
  void checkGeneratedArity();
  /// NF4 tensors are read by Dequantize only (no other kernel knows the layout) and written
  /// by none (weights are quantized when they are bound).
  void checkNf4Operands() const {
    for (size_t i = 0; i < kernel.inputs.size(); ++i)
      if (in(i).dtype == DType::NF4 && kernel.kind != KernelKind::Dequantize)
        fail(inName(i) + " is nf4, which only a Dequantize kernel reads");
    for (size_t j = 0; j < kernel.outputs.size(); ++j)
      if (out(j).dtype == DType::NF4)
        fail(outName(j) + " is nf4: no kernel writes NF4 (weights are quantized when bound)");
  }
  void checkAttrs();
  void checkOverlap() const;
  void checkShapes();
  void checkShapesV1();
  void checkPhase() const;
  void checkState() const;
  void checkAttentionShapes(size_t q, size_t k, size_t v) const;
  void checkLse(size_t lse, bool isOutput) const;
  /// FP8 GEMM kinds (docs/fp8.md): an FP8 scaling state f32 [3, 4 + H], 1 <= H <= 1024.
  void checkFp8State(const TensorInfo &t, const std::string &name) const;
  /// The statistics of two casts: f32 [2, 4].
  void checkFp8Stats(const TensorInfo &t, const std::string &name) const;
  /// GEMM dimension `what` (M, N or K) is a multiple of 16, as FP8 tensor cores need.
  void checkFp8Dimension(const char *what, int64_t value, const std::string &from) const;
  /// The state (input 2), the stats (output `stats`: 1, or 0 for the accumulating kind 94) and
  /// the workspace (output `workspace`, by default the one after the stats, at least
  /// fp8::gemmWorkspaceBytes / 4 f32 elements for casts of `a` and `b` elements) of kinds
  /// 90..92, 94 and 98.
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

/// Whether opcode `op` takes two operands.
bool isBinary(ElementwiseOpcode op) {
  return op == ElementwiseOpcode::Add || op == ElementwiseOpcode::Sub ||
         op == ElementwiseOpcode::Mul || op == ElementwiseOpcode::Div;
}

void KernelChecker::checkArity() {
  const KernelKindInfo &info = kernelKindInfo(kernel.kind);
  if (kernel.kind == KernelKind::FusedElementwise)
    return checkGeneratedArity(); // its arity is its generated kernel's
  size_t minIn = info.minInputs, minOut = info.minOutputs;
  if (info.has(kernel_traits::kCustomArity)) {
    nameMultiTensorOperands(); // names as many operands as the counts are right for
    minIn = operandNames.size();
    minOut = resultNames.size();
  } else {
    operandNames = info.inputs;
    resultNames = info.outputs;
    variadic = info.has(kernel_traits::kVariadic);
  }
  size_t maxIn = variadic ? std::numeric_limits<size_t>::max() : operandNames.size();
  size_t maxOut = resultNames.size();
  size_t n = kernel.inputs.size();
  if (n < minIn || n > maxIn) {
    std::string expected = variadic ? std::string("1 or more")
                           : minIn == maxIn
                               ? std::to_string(minIn)
                               : std::to_string(minIn) + " or " + std::to_string(maxIn);
    std::string names;
    for (const std::string &name : operandNames)
      names += (names.empty() ? "" : ", ") + name;
    fail("expected " + expected + " inputs" + (names.empty() ? "" : " (" + names + ")") + ", got " +
         std::to_string(n));
  }
  size_t m = kernel.outputs.size();
  if (m < minOut || m > maxOut) {
    std::string expected = minOut == maxOut
                               ? std::to_string(minOut)
                               : std::to_string(minOut) + " or " + std::to_string(maxOut);
    std::string names;
    for (const std::string &name : resultNames)
      names += (names.empty() ? "" : ", ") + name;
    fail("expected " + expected + (maxOut == 1 ? " output" : " outputs") +
         (maxOut == 1 ? "" : " (" + names + ")") + ", got " + std::to_string(m));
  }
  for (size_t i = 0; i < n; ++i)
    if (kernel.inputs[i] >= plan.tensors.size())
      fail("input " + std::to_string(i) + " (" +
           (variadic ? operandNames[0] + std::to_string(i + 1) : operandNames[i]) + ") is tensor " +
           std::to_string(kernel.inputs[i]) + ", but the plan has " +
           std::to_string(plan.tensors.size()) + " tensors");
  for (size_t j = 0; j < m; ++j)
    if (kernel.outputs[j] >= plan.tensors.size())
      fail("output " + std::to_string(j) + " is tensor " + std::to_string(kernel.outputs[j]) +
           ", but the plan has " + std::to_string(plan.tensors.size()) + " tensors");
}

void KernelChecker::nameMultiTensorOperands() {
  std::vector<std::string> shared = multiTensorShared(), lists = multiTensorStates();
  size_t inputs = kernel.inputs.size(), outputs = kernel.outputs.size();
  std::string sharedNames;
  for (const std::string &name : shared)
    sharedNames += name + ", ";
  if (inputs <= shared.size())
    fail("expected " + sharedNames + "and at least one gradient (g1 ..) as inputs, got " +
         std::to_string(inputs) + " inputs");
  size_t n = inputs - shared.size();
  bool masters = outputs == (lists.size() + 1) * n;
  if (outputs != lists.size() * n && !masters) {
    std::string listNames;
    for (const std::string &name : lists)
      listNames += name + "1 .. " + name + std::to_string(n) + ", ";
    fail("expected " + std::to_string(lists.size() * n) + " or " +
         std::to_string((lists.size() + 1) * n) + " outputs (" + listNames + "[master1 .. master" +
         std::to_string(n) + "]) for " + std::to_string(n) + " gradients, got " +
         std::to_string(outputs));
  }
  operandNames = shared;
  for (size_t i = 1; i <= n; ++i)
    operandNames.push_back("g" + std::to_string(i));
  if (masters)
    lists.push_back("master");
  resultNames.clear();
  for (const std::string &list : lists)
    for (size_t i = 1; i <= n; ++i)
      resultNames.push_back(list + std::to_string(i));
}

void KernelChecker::checkMultiTensorShapes() {
  std::vector<std::string> shared = multiTensorShared();
  size_t first = shared.size(), n = multiTensorCount(), lists = multiTensorStates().size();
  size_t i = 0;
  if (kernel.kind == KernelKind::MultiTensorAdamWUpdate)
    expectScalarInput(i++, DType::I64);
  expectScalarInput(i++, DType::F32); // lr
  expectScalarInput(i, DType::F32);   // norm
  // One kernel instantiation serves every tensor: one gradient dtype, one parameter dtype.
  for (size_t t = 0; t < n; ++t) {
    expectFloat(first + t);
    if (in(first + t).dtype != in(first).dtype)
      fail(inName(first + t) + " dtype " + dtypeName(in(first + t).dtype) + " differs from " +
           inName(first) + "'s " + dtypeName(in(first).dtype) +
           " (a multi-tensor update has one gradient dtype)");
    const std::vector<int64_t> &shape = in(first + t).shape;
    expectFloatOutput(t, shape);
    if (out(t).dtype != out(0).dtype)
      fail(outName(t) + " dtype " + dtypeName(out(t).dtype) + " differs from " + outName(0) +
           "'s " + dtypeName(out(0).dtype) + " (a multi-tensor update has one parameter dtype)");
    for (size_t list = 1; list < lists; ++list)
      expectF32Output(list * n + t, shape);
    if (multiTensorHasMasters())
      expectF32Output(lists * n + t, shape);
  }
}

void KernelChecker::checkGeneratedArity() {
  uint32_t g = kernel.attrs.generatedKernel;
  if (g >= plan.generatedKernels.size())
    fail("runs generated kernel " + std::to_string(g) + ", but the plan has " +
         std::to_string(plan.generatedKernels.size()) + " generated kernels");
  const GeneratedKernelInfo &generated = plan.generatedKernels[g];
  const ElementwiseProgramInfo &program = generated.program;
  std::string what = "generated kernel " + std::to_string(g) + " '" + generated.name + "'";
  if (kernel.inputs.size() != program.inputs.size() ||
      kernel.outputs.size() != program.outputs.size())
    fail("expected " + std::to_string(program.inputs.size()) + " inputs and " +
         std::to_string(program.outputs.size()) + " outputs (those of " + what + "), got " +
         std::to_string(kernel.inputs.size()) + " and " + std::to_string(kernel.outputs.size()));
  operandNames = {"x"};
  resultNames.clear();
  for (size_t j = 0; j < kernel.outputs.size(); ++j)
    resultNames.push_back("y" + std::to_string(j + 1));
  variadic = true;
  for (size_t i = 0; i < kernel.inputs.size(); ++i)
    if (kernel.inputs[i] >= plan.tensors.size())
      fail("input " + std::to_string(i) + " is tensor " + std::to_string(kernel.inputs[i]) +
           ", but the plan has " + std::to_string(plan.tensors.size()) + " tensors");
  for (size_t j = 0; j < kernel.outputs.size(); ++j)
    if (kernel.outputs[j] >= plan.tensors.size())
      fail("output " + std::to_string(j) + " is tensor " + std::to_string(kernel.outputs[j]) +
           ", but the plan has " + std::to_string(plan.tensors.size()) + " tensors");
  int64_t n = out(0).numel;
  for (size_t j = 0; j < kernel.outputs.size(); ++j) {
    DType want = program.registerType(program.outputs[j]);
    if (out(j).dtype != want)
      fail(outName(j) + " dtype: " + what + " computes " + dtypeName(want) + ", got " +
           dtypeName(out(j).dtype));
    if (out(j).numel != n)
      fail(outName(j) + " has " + std::to_string(out(j).numel) + " elements, " + outName(0) +
           " " + std::to_string(n) + " (the outputs of an elementwise kernel agree)");
  }
  for (size_t i = 0; i < kernel.inputs.size(); ++i) {
    if (in(i).dtype != program.inputs[i])
      fail(inName(i) + " dtype: " + what + " reads " + dtypeName(program.inputs[i]) +
           ", got " + dtypeName(in(i).dtype));
    if (in(i).numel < 1 || n % in(i).numel != 0)
      fail(inName(i) + " has " + std::to_string(in(i).numel) +
           " elements, which do not divide the outputs' " + std::to_string(n) +
           " (an input is read at the element index modulo its size)");
  }
}

void KernelChecker::checkAttrs() {
  const KernelAttrsInfo &a = kernel.attrs;
  switch (kernel.kind) {
  case KernelKind::RMSNorm:
  case KernelKind::LayerNorm:
  case KernelKind::RMSNormGrad:
  case KernelKind::LayerNormGrad:
  case KernelKind::AddRMSNorm:
  case KernelKind::AddLayerNorm:
  case KernelKind::RMSNormGradAdd:
  case KernelKind::LayerNormGradAdd:
    if (!(a.epsilon > 0))
      fail("epsilon must be positive, got " + num(a.epsilon));
    break;
  case KernelKind::RoPE:
  case KernelKind::RoPEGrad:
    if (!(a.theta > 0))
      fail("theta must be positive, got " + num(a.theta));
    break;
  case KernelKind::Attention:
  case KernelKind::AttentionGrad:
  case KernelKind::FlashAttention:
  case KernelKind::FlashAttentionGrad:
    if (!(a.scale > 0) || a.scale == std::numeric_limits<double>::infinity())
      fail("scale must be positive and finite, got " + num(a.scale));
    break;
  case KernelKind::Softmax:
  case KernelKind::Slice:
  case KernelKind::SoftmaxGrad:
    if (a.axis < 0 || size_t(a.axis) >= in(0).shape.size())
      fail("axis " + std::to_string(a.axis) + " is out of range for " + inName(0) + " of rank " +
           std::to_string(in(0).shape.size()));
    break;
  case KernelKind::SliceGrad:
    if (a.axis < 0 || size_t(a.axis) >= out().shape.size())
      fail("axis " + std::to_string(a.axis) + " is out of range for " + outName() + " of rank " +
           std::to_string(out().shape.size()));
    break;
  case KernelKind::Transpose: {
    size_t rank = in(0).shape.size();
    if (a.permutation.size() != rank)
      fail("permutation has " + std::to_string(a.permutation.size()) + " entries, " +
           inName(0) + " has rank " + std::to_string(rank));
    std::vector<bool> seen(rank, false);
    for (int64_t p : a.permutation) {
      if (p < 0 || size_t(p) >= rank || seen[size_t(p)])
        fail("permutation " + formatShape(a.permutation) + " is not a permutation of [0, " +
             std::to_string(rank) + ")");
      seen[size_t(p)] = true;
    }
    break;
  }
  case KernelKind::Fill:
    if (!std::isfinite(a.value))
      fail("value must be finite, got " + num(a.value));
    break;
  case KernelKind::DoraScale:
    if (!std::isfinite(a.scale))
      fail("scale must be finite, got " + num(a.scale));
    break;
  case KernelKind::LearningRate:
    finiteAtLeast0("lr", a.lr);
    if (a.warmupSteps < 0)
      fail("warmup_steps must be non-negative, got " + std::to_string(a.warmupSteps));
    if (a.cosine && a.totalSteps <= a.warmupSteps)
      fail("a cosine schedule needs total_steps above warmup_steps, got total_steps " +
           std::to_string(a.totalSteps) + " and warmup_steps " + std::to_string(a.warmupSteps));
    if (!(a.minLrRatio >= 0 && a.minLrRatio <= 1))
      fail("min_lr_ratio must be in [0, 1], got " + num(a.minLrRatio));
    break;
  case KernelKind::AdamWUpdate:
  case KernelKind::MultiTensorAdamWUpdate:
    checkAdamWAttrs();
    break;
  case KernelKind::SGDUpdate:
  case KernelKind::MultiTensorSGDUpdate:
    finiteAtLeast0("momentum", a.momentum);
    finiteAtLeast0("weight_decay", a.weightDecay);
    finiteAtLeast0("grad_clip", a.gradClip);
    break;
  case KernelKind::GaloreRefresh:
    if (a.updateProjGap <= 0)
      fail("update_proj_gap must be positive, got " + std::to_string(a.updateProjGap));
    if (a.offset < 0 || a.offset >= a.updateProjGap)
      fail("offset " + std::to_string(a.offset) + " is outside [0, update_proj_gap = " +
           std::to_string(a.updateProjGap) + ")");
    if (a.powerIterations < 0 || a.powerIterations > 16)
      fail("power_iterations must be in [0, 16], got " + std::to_string(a.powerIterations));
    break;
  case KernelKind::GaloreAdamWUpdate:
    checkAdamWAttrs();
    if (!(a.scale > 0) || !std::isfinite(a.scale))
      fail("scale must be positive and finite, got " + num(a.scale));
    break;
  case KernelKind::LinearCrossEntropy:
    if (a.chunkRows <= 0)
      fail("chunk_rows must be positive, got " + std::to_string(a.chunkRows));
    break;
  case KernelKind::Fp8Linear:
  case KernelKind::Fp8LinearGradInput:
  case KernelKind::Fp8LinearGradWeight:
  case KernelKind::Fp8LinearGradWeightAccumulate:
  case KernelKind::Fp8LinearBackward:
  case KernelKind::Fp8LinearSharedInput:
  case KernelKind::Fp8LinearBackwardSharedInput:
  case KernelKind::Fp8LinearWithInputCast:
  case KernelKind::Fp8LinearBackwardFromInputCast:
  case KernelKind::Fp8UpdateScales:
    if (a.fp8Margin < 0 || a.fp8Margin > kMaxFp8Margin)
      fail("margin must be in [0, " + std::to_string(kMaxFp8Margin) + "], got " +
           std::to_string(a.fp8Margin));
    // The gradients' GEMMs always promote their partial sums (docs/fp8.md).
    if (a.fp8FastAccumulation && kernel.kind != KernelKind::Fp8Linear &&
        kernel.kind != KernelKind::Fp8LinearSharedInput &&
        kernel.kind != KernelKind::Fp8LinearWithInputCast)
      fail("fast_accumulation is the forward GEMMs' option (Fp8Linear, Fp8LinearSharedInput, "
           "Fp8LinearWithInputCast); a gradient GEMM always promotes its partial sums to fp32");
    break;
  default:
    break;
  }
}

void KernelChecker::checkOverlap() const {
  for (size_t j = 0; j < kernel.outputs.size(); ++j) {
    for (size_t k = j + 1; k < kernel.outputs.size(); ++k)
      if (rangesOverlap(out(j), out(k)))
        fail(outName(k) + " overlaps " + outName(j) + " in arena " + std::to_string(out(j).arena) +
             " (the outputs of a kernel are distinct tensors)");
    for (size_t i = 0; i < kernel.inputs.size(); ++i) {
      if (!rangesOverlap(in(i), out(j)))
        continue;
      if (kernelKindInfo(kernel.kind).has(kernel_traits::kInPlace) && sameStorage(in(i), out(j)))
        continue;
      // Element k of an output depends on element k of a full-size input only: a broadcast
      // input is read at other positions after they are written.
      if (kernel.kind == KernelKind::FusedElementwise && sameStorage(in(i), out(j)) &&
          in(i).numel == out(j).numel)
        continue;
      fail(outName(j) + " overlaps " + inName(i) + " in arena " + std::to_string(out(j).arena) +
           (kernelKindInfo(kernel.kind).has(kernel_traits::kInPlace) ? " (only an exact alias is allowed for this kind)"
                                       : " (this kind cannot run in place)"));
    }
  }
}

void KernelChecker::checkPhase() const {
  const KernelKindInfo &info = kernelKindInfo(kernel.kind);
  if (info.has(kernel_traits::kUpdateOnly) && kernel.phase != Phase::Update &&
      !(kernel.phase == Phase::Backward && info.has(kernel_traits::kMayRunInBackward)))
    fail(std::string("runs in the ") + phaseName(kernel.phase) +
         " phase, but optimizer kernels run once per step, in the update phase (or, for "
         "updates applied as gradients complete, in the backward pass)");
}

void KernelChecker::checkState() const {
  switch (kernel.kind) {
  case KernelKind::AdamWUpdate:
  case KernelKind::SGDUpdate: {
    bool adam = kernel.kind == KernelKind::AdamWUpdate;
    for (size_t j = 0; j < kernel.outputs.size(); ++j)
      expectPersistent(j);
    expectInit(1, TensorInit::Zeros, adam ? "moments start at zero" : "momentum starts at zero");
    if (adam)
      expectInit(2, TensorInit::Zeros, "moments start at zero");
    size_t master = adam ? 3 : 2;
    if (kernel.outputs.size() > master)
      expectMasterCopy(master, 0);
    break;
  }
  case KernelKind::MultiTensorAdamWUpdate:
  case KernelKind::MultiTensorSGDUpdate: {
    size_t n = multiTensorCount(), lists = multiTensorStates().size();
    for (size_t j = 0; j < kernel.outputs.size(); ++j)
      expectPersistent(j);
    for (size_t j = n; j < lists * n; ++j)
      expectInit(j, TensorInit::Zeros,
                 kernel.kind == KernelKind::MultiTensorAdamWUpdate ? "moments start at zero"
                                                                   : "momentum starts at zero");
    if (multiTensorHasMasters())
      for (size_t i = 0; i < n; ++i)
        expectMasterCopy(lists * n + i, i);
    break;
  }
  case KernelKind::StepIncrement:
    expectPersistent(0);
    expectInit(0, TensorInit::Zeros, "the step counter starts at zero");
    break;
  case KernelKind::Fp8UpdateScales:
    // Checkpointed with the optimizer's state, and read before its first update as "no scale
    // yet, no history".
    expectPersistent(0);
    expectInit(0, TensorInit::Zeros, "an FP8 state has no scale and no history before the "
                                     "first update");
    if (out(0).role != TensorRole::OptimizerState)
      fail(outName(0) + " has role " + tensorRoleName(out(0).role) +
           ", expected optimizer state (FP8 scales and histories are checkpointed with it)");
    break;
  case KernelKind::Fp8Linear:
  case KernelKind::Fp8LinearGradInput:
  case KernelKind::Fp8LinearGradWeight:
  case KernelKind::Fp8LinearGradWeightAccumulate:
  case KernelKind::Fp8LinearBackward:
  case KernelKind::Fp8LinearSharedInput:
  case KernelKind::Fp8LinearBackwardSharedInput:
  case KernelKind::Fp8LinearWithInputCast:
  case KernelKind::Fp8LinearBackwardFromInputCast: {
    // The state follows the GEMM operands: input 2, 3 for the fused backward and the forward
    // that shares its input's cast, 4 for the backwards that read another kernel's.
    const size_t state = kernel.kind == KernelKind::Fp8LinearBackwardSharedInput ||
                                 kernel.kind == KernelKind::Fp8LinearBackwardFromInputCast
                             ? 4
                         : kernel.kind == KernelKind::Fp8LinearBackward ||
                                 kernel.kind == KernelKind::Fp8LinearSharedInput
                             ? 3
                             : 2;
    const ArenaInfo &arena = arenaOf(in(state));
    if (arena.lifetime != Lifetime::Persistent)
      fail(inName(state) + " is in step arena " + std::to_string(in(state).arena) + " '" +
           arena.name + "': FP8 scaling state must live in a persistent arena");
    break;
  }
  case KernelKind::GaloreRefresh:
    expectPersistent(1);
    expectPersistent(2);
    expectInit(1, TensorInit::Zeros, "the projector is zero until its first refresh");
    expectInit(2, TensorInit::Zeros, "no refresh has failed before the first step");
    break;
  case KernelKind::GaloreAdamWUpdate:
    // The projected gradient (output 0) is this step's scratch; the rest is state.
    for (size_t j = 1; j < kernel.outputs.size(); ++j)
      expectPersistent(j);
    expectInit(2, TensorInit::Zeros, "moments start at zero");
    expectInit(3, TensorInit::Zeros, "moments start at zero");
    if (kernel.outputs.size() > 4)
      expectMasterCopy(4, 1);
    break;
  default:
    break;
  }
}

void KernelChecker::checkAttentionShapes(size_t qi, size_t ki, size_t vi) const {
  expectFloat(qi);
  expectRank(qi, 4);
  expectRank(ki, 4);
  expectInputShape(vi, in(ki).shape);
  const std::vector<int64_t> &q = in(qi).shape, &k = in(ki).shape;
  if (k[0] != q[0] || k[1] != q[1] || k[3] != q[3])
    fail(inName(ki) + " shape " + formatShape(k) + " does not match " + inName(qi) + " shape " +
         formatShape(q) + " in batch, sequence or head_dim");
  if (q[2] % k[2] != 0)
    fail("query heads (" + std::to_string(q[2]) + ") must be a multiple of key/value heads (" +
         std::to_string(k[2]) + ")");
}

/// The log-sum-exp of flash attention (output or input `i`) is f32 [batch, heads, seq] of the
/// query (input 0 of FlashAttention, 1 of FlashAttentionGrad).
void KernelChecker::checkLse(size_t i, bool isOutput) const {
  const std::vector<int64_t> &q = in(isOutput ? 0 : 1).shape;
  std::vector<int64_t> want = {q[0], q[2], q[1]};
  const TensorInfo &lse = isOutput ? out(i) : in(i);
  std::string name = isOutput ? outName(i) : inName(i);
  if (lse.dtype != DType::F32 || lse.shape != want)
    fail(name + ": expected an f32 " + formatShape(want) +
         " log-sum-exp ([batch, heads, seq] of the query), got " + formatShape(lse.shape) + " " +
         dtypeName(lse.dtype));
}

void KernelChecker::checkFp8State(const TensorInfo &t, const std::string &name) const {
  const std::vector<int64_t> &s = t.shape;
  if (t.dtype != DType::F32 || s.size() != 2 || s[0] != 3 ||
      s[1] < fp8::kStateColumns + 1 || s[1] > fp8::kStateColumns + kMaxFp8History)
    fail(name + ": expected an f32 [3, 4 + H] FP8 scaling state (rows input, weight, "
                "output gradient; scale, amax, underflow, saturation, then an amax history of "
                "1 <= H <= " + std::to_string(kMaxFp8History) + "), got " + formatShape(s) + " " +
         dtypeName(t.dtype));
}

void KernelChecker::checkFp8Stats(const TensorInfo &t, const std::string &name) const {
  if (t.dtype != DType::F32 || t.shape != std::vector<int64_t>{2, fp8::kStatsColumns})
    fail(name + ": expected f32 [2, 4] FP8 cast statistics (a row per cast operand: amax, "
                "underflow fraction, saturation fraction, scale), got " + formatShape(t.shape) +
         " " + dtypeName(t.dtype));
}

void KernelChecker::checkFp8Dimension(const char *what, int64_t value,
                                      const std::string &from) const {
  if (value % kFp8GemmMultiple != 0)
    fail(std::string(what) + " = " + std::to_string(value) + " (" + from +
         ") is not a multiple of " + std::to_string(kFp8GemmMultiple) +
         ", which FP8 tensor-core GEMMs need");
}

void KernelChecker::checkFp8GemmOperands(int64_t aElements, int64_t bElements, size_t stats,
                                         std::optional<size_t> workspace) const {
  checkFp8State(in(2), inName(2));
  checkFp8Stats(out(stats), outName(stats));
  checkFp8Workspace(workspace.value_or(stats + 1), fp8::gemmWorkspaceBytes(aElements, bElements),
                    "fp8::gemmWorkspaceBytes of casts of " + std::to_string(aElements) + " and " +
                        std::to_string(bElements) + " elements");
}

void KernelChecker::checkFp8TransposedCodes(const TensorInfo &t, const std::string &name, int64_t k,
                                            int64_t m, const std::string &whose) const {
  if (t.dtype != DType::F8E4M3FN || t.shape != std::vector<int64_t>{k, m})
    fail(name + ": expected f8_e4m3 " + formatShape({k, m}) + " (x's transposed codes" +
         (whose.empty() ? "" : ", " + whose) + "), got " + formatShape(t.shape) + " " +
         dtypeName(t.dtype));
}

/// Inputs `cast` and `stats` of a GEMM that reads another's cast of its input (kinds 96 and
/// 97): that kernel's workspace (f32, at least `bytes`, holding the codes of `elements`
/// input elements) and its stats.
void KernelChecker::checkFp8SharedCast(size_t cast, size_t stats, int64_t elements, int64_t bytes,
                                       const std::string &what) const {
  const TensorInfo &c = in(cast);
  int64_t want = bytes / int64_t(sizeof(float));
  if (c.dtype != DType::F32 || c.shape.size() != 1 || c.shape[0] < want)
    fail(inName(cast) + ": expected " + what + ", f32 [" + std::to_string(want) +
         "] or larger for the codes of " + std::to_string(elements) + " elements, got " +
         formatShape(c.shape) + " " + dtypeName(c.dtype));
  checkFp8Stats(in(stats), inName(stats));
}

void KernelChecker::checkFp8Workspace(size_t j, int64_t bytes, const std::string &what) const {
  int64_t want = bytes / int64_t(sizeof(float));
  const TensorInfo &w = out(j);
  if (w.dtype != DType::F32 || w.shape.size() != 1 || w.shape[0] < want)
    fail(outName(j) + ": expected a 1-D f32 workspace of at least " + std::to_string(want) +
         " elements (" + what + "), got " + formatShape(w.shape) + " " + dtypeName(w.dtype));
}

void KernelChecker::checkShapes() {
  if (kernel.kind <= KernelKind::Copy)
    return checkShapesV1();
  switch (kernel.kind) {
  case KernelKind::Fill:
    expectFloatOutput(0, out().shape);
    break;
  case KernelKind::EmbeddingGrad: {
    expectFloat(0);
    expectIndex(1);
    if (out().shape.size() != 2)
      fail(outName() + " rank: expected 2 ([vocab, dim]), got " + formatShape(out().shape));
    std::vector<int64_t> shape = in(1).shape;
    shape.push_back(out().shape[1]);
    expectInputShape(0, shape);
    expectFloatOutput(0, out().shape);
    break;
  }
  case KernelKind::LinearGradInput: {
    expectFloat(0);
    expectRankAtLeast(0, 1);
    expectFloat(1);
    expectRank(1, 2);
    int64_t n = in(0).shape.back();
    if (in(1).shape[0] != n)
      fail(inName(1) + " shape: expected [" + std::to_string(n) + ", in] ([out, in] layout), got " +
           formatShape(in(1).shape));
    std::vector<int64_t> shape(in(0).shape.begin(), in(0).shape.end() - 1);
    shape.push_back(in(1).shape[1]);
    expectFloatOutput(0, shape);
    break;
  }
  case KernelKind::LinearGradWeight: {
    expectFloat(0);
    expectFloat(1);
    expectRankAtLeast(0, 1);
    expectRankAtLeast(1, 1);
    const std::vector<int64_t> &dy = in(0).shape, &x = in(1).shape;
    if (dy.size() != x.size() || !std::equal(dy.begin(), dy.end() - 1, x.begin()))
      fail("leading dimensions differ: " + inName(0) + " " + formatShape(dy) + ", " + inName(1) +
           " " + formatShape(x));
    expectFloatOutput(0, {dy.back(), x.back()});
    break;
  }
  case KernelKind::ReduceTo:
    expectFloat(0);
    expectBroadcast(outName(), out().shape, inName(0), in(0).shape);
    expectFloatOutput(0, out().shape);
    break;
  case KernelKind::RMSNormGrad:
  case KernelKind::LayerNormGrad: {
    expectFloat(0);
    expectRankAtLeast(0, 1);
    expectFloatInput(1, in(0).shape);
    int64_t d = in(0).shape.back();
    expectFloatInput(2, {d});
    expectFloatOutput(0, in(0).shape);
    for (size_t j = 1; j < kernel.outputs.size(); ++j)
      expectFloatOutput(j, {d});
    break;
  }
  case KernelKind::RoPEGrad:
    expectFloat(0);
    expectRank(0, 4);
    if (in(0).shape[3] % 2 != 0)
      fail(inName(0) + " head_dim must be even to rotate pairs, got " +
           std::to_string(in(0).shape[3]));
    expectFloatOutput(0, in(0).shape);
    break;
  case KernelKind::AttentionGrad:
  case KernelKind::FlashAttentionGrad:
    checkAttentionShapes(1, 2, 3);
    expectFloat(2);
    expectFloat(3);
    expectFloatInput(0, in(1).shape);
    expectFloatInput(4, in(1).shape);
    expectFloatOutput(0, in(1).shape);
    expectFloatOutput(1, in(2).shape);
    expectFloatOutput(2, in(2).shape);
    if (kernel.kind == KernelKind::FlashAttentionGrad)
      checkLse(5, /*isOutput=*/false);
    break;
  case KernelKind::FlashAttention:
    // As Attention: one storage type for q, k, v and o.
    checkAttentionShapes(0, 1, 2);
    expectInputDType(1, in(0).dtype);
    expectInputDType(2, in(0).dtype);
    expectOutputLike(0);
    checkLse(1, /*isOutput=*/true);
    break;
  case KernelKind::SiLUGrad:
  case KernelKind::GeLUGrad:
  case KernelKind::SoftmaxGrad:
    expectFloat(0);
    expectFloatInput(1, in(0).shape);
    expectFloatOutput(0, in(0).shape);
    break;
  case KernelKind::SwiGLUGrad:
    expectFloat(0);
    expectFloatInput(1, in(0).shape);
    expectFloatInput(2, in(0).shape);
    expectFloatOutput(0, in(0).shape);
    expectFloatOutput(1, in(0).shape);
    break;
  case KernelKind::CrossEntropyGrad: {
    expectScalarInput(0, DType::F32);
    expectFloat(1);
    expectRankAtLeast(1, 2);
    expectIndex(2);
    std::vector<int64_t> shape(in(1).shape.begin(), in(1).shape.end() - 1);
    expectInputShape(2, shape);
    expectFloatOutput(0, in(1).shape);
    break;
  }
  case KernelKind::SliceGrad: {
    expectFloat(0);
    size_t axis = size_t(kernel.attrs.axis);
    if (out().shape.size() != in(0).shape.size())
      fail(outName() + " rank: expected " + std::to_string(in(0).shape.size()) + ", got " +
           std::to_string(out().shape.size()));
    std::vector<int64_t> shape = in(0).shape;
    shape[axis] = out().shape[axis];
    expectFloatOutput(0, shape);
    int64_t start = kernel.attrs.start, size = in(0).shape[axis], dim = out().shape[axis];
    if (start < 0 || start > dim || size > dim - start)
      fail("range [" + std::to_string(start) + ", " + std::to_string(start) + " + " +
           std::to_string(size) + ") is outside dimension " + std::to_string(axis) + " of size " +
           std::to_string(dim));
    break;
  }
  case KernelKind::GradNorm:
    for (size_t i = 0; i < kernel.inputs.size(); ++i)
      expectFloat(i);
    expectScalarOutput(0, DType::F32);
    break;
  case KernelKind::LearningRate:
    expectScalarInput(0, DType::I64);
    expectScalarOutput(0, DType::F32);
    break;
  case KernelKind::AdamWUpdate:
  case KernelKind::SGDUpdate: {
    bool adam = kernel.kind == KernelKind::AdamWUpdate;
    expectFloat(0);
    const std::vector<int64_t> &shape = in(0).shape;
    size_t i = 1;
    if (adam)
      expectScalarInput(i++, DType::I64);
    expectScalarInput(i++, DType::F32); // lr
    expectScalarInput(i, DType::F32);   // norm
    expectFloatOutput(0, shape);
    for (size_t j = 1; j < kernel.outputs.size(); ++j)
      expectF32Output(j, shape);
    break;
  }
  case KernelKind::MultiTensorAdamWUpdate:
  case KernelKind::MultiTensorSGDUpdate:
    checkMultiTensorShapes();
    break;
  case KernelKind::LinearGeLU: {
    std::vector<int64_t> shape = checkLinearInputs();
    for (size_t j = 0; j < 2; ++j) {
      if (out(j).shape != shape)
        fail(outName(j) + " shape: expected " + formatShape(shape) + ", got " +
             formatShape(out(j).shape));
      if (out(j).dtype != in(0).dtype)
        fail(outName(j) + " dtype: expected " + dtypeName(in(0).dtype) + " (as x), got " +
             dtypeName(out(j).dtype));
    }
    break;
  }
  case KernelKind::LinearGradWeightAccumulate: {
    expectFloat(0);
    expectFloat(1);
    expectRankAtLeast(0, 1);
    expectRankAtLeast(1, 1);
    const std::vector<int64_t> &dy = in(0).shape, &x = in(1).shape;
    if (dy.size() != x.size() || !std::equal(dy.begin(), dy.end() - 1, x.begin()))
      fail("leading dimensions differ: " + inName(0) + " " + formatShape(dy) + ", " + inName(1) +
           " " + formatShape(x));
    expectFloatOutput(0, {dy.back(), x.back()});
    break;
  }
  case KernelKind::StepIncrement:
    expectScalarOutput(0, DType::I64);
    break;
  case KernelKind::Accumulate:
    expectFloat(0);
    expectFloatOutput(0, in(0).shape);
    break;
  case KernelKind::Zero:
    if (!isFloatStorage(out().dtype) && !isIndexType(out().dtype))
      fail(outName() + " dtype: expected f32, f16, bf16, i32 or i64, got " +
           dtypeName(out().dtype));
    break;
  case KernelKind::DoraScale: {
    // magnitude [out], w [out, in], lora_a [r, in], lora_b [out, r]; y like magnitude.
    for (size_t i = 0; i < 4; ++i)
      expectFloat(i);
    expectRank(1, 2);
    expectRank(2, 2);
    int64_t outRows = in(1).shape[0], inCols = in(1).shape[1], rank = in(2).shape[0];
    expectInputShape(0, {outRows});
    expectInputShape(2, {rank, inCols});
    expectInputShape(3, {outRows, rank});
    expectFloatOutput(0, {outRows});
    for (size_t i = 0; i < 4; ++i)
      if (in(i).dtype != in(1).dtype)
        fail(inName(i) + " dtype " + dtypeName(in(i).dtype) + " differs from " + inName(1) +
             "'s " + dtypeName(in(1).dtype));
    if (out().dtype != in(1).dtype)
      fail(outName() + " dtype " + dtypeName(out().dtype) + " differs from " + inName(1) + "'s " +
           dtypeName(in(1).dtype));
    break;
  }
  case KernelKind::Dequantize:
    if (in(0).dtype != DType::NF4)
      fail(inName(0) + " dtype: expected nf4, got " + dtypeName(in(0).dtype));
    expectFloatOutput(0, in(0).shape);
    break;
  case KernelKind::GaloreRefresh: {
    const KernelAttrsInfo &a = kernel.attrs;
    expectFloat(0);
    expectRank(0, 2);
    const std::vector<int64_t> &g = in(0).shape;
    checkGaloreSide(g, a.left);
    int64_t small = std::min(g[0], g[1]), large = std::max(g[0], g[1]);
    if (a.rank <= 0 || a.rank >= small)
      fail("rank " + std::to_string(a.rank) + " must be positive and below min(m, n) = " +
           std::to_string(small));
    expectScalarInput(1, DType::I64);
    expectF32Output(0, {galore::workspaceElements(small, large, a.rank)});
    expectF32Output(1, {small, a.rank});
    if (out(2).dtype != DType::F32 || out(2).shape.size() != 1)
      fail(outName(2) + ": expected a 1-D f32 status vector, got " + formatShape(out(2).shape) +
           " " + dtypeName(out(2).dtype));
    if (a.slot < 0 || a.slot >= out(2).shape[0])
      fail("slot " + std::to_string(a.slot) + " is outside " + outName(2) + " of " +
           std::to_string(out(2).shape[0]) + (out(2).shape[0] == 1 ? " weight" : " weights"));
    break;
  }
  case KernelKind::GaloreProject: {
    expectFloat(0);
    expectRank(0, 2);
    const std::vector<int64_t> &g = in(0).shape;
    bool left = kernel.attrs.left;
    checkGaloreSide(g, left);
    expectGaloreProjector(1, left ? g[0] : g[1]);
    int64_t r = in(1).shape[1];
    expectF32Output(0, left ? std::vector<int64_t>{r, g[1]} : std::vector<int64_t>{g[0], r});
    break;
  }
  case KernelKind::GaloreAdamWUpdate: {
    expectScalarInput(0, DType::I64);
    expectScalarInput(1, DType::F32); // lr
    expectScalarInput(2, DType::F32); // norm
    if (out(1).shape.size() != 2)
      fail(outName(1) + " rank: expected 2, got " + formatShape(out(1).shape));
    const std::vector<int64_t> w = out(1).shape;
    bool left = kernel.attrs.left;
    checkGaloreSide(w, left);
    expectFloatOutput(1, w);
    expectGaloreProjector(3, left ? w[0] : w[1]);
    int64_t r = in(3).shape[1];
    std::vector<int64_t> reduced = left ? std::vector<int64_t>{r, w[1]}
                                        : std::vector<int64_t>{w[0], r};
    expectF32Output(0, reduced);
    expectF32Output(2, reduced);
    expectF32Output(3, reduced);
    if (kernel.outputs.size() > 4)
      expectF32Output(4, w);
    break;
  }
  case KernelKind::LinearCrossEntropy: {
    expectFloat(0);
    expectRankAtLeast(0, 2);
    expectInputDType(1, in(0).dtype);
    expectRank(1, 2);
    const std::vector<int64_t> &x = in(0).shape, &w = in(1).shape;
    if (w[1] != x.back())
      fail(inName(1) + " shape: expected [vocab, " + std::to_string(x.back()) +
           "] ([out, in] layout), got " + formatShape(w));
    expectIndex(2);
    expectInputShape(2, std::vector<int64_t>(x.begin(), x.end() - 1));
    expectScalarInput(3, DType::F32);
    expectScalarOutput(0, DType::F32);
    if (out(1).shape != x || out(1).dtype != in(0).dtype)
      fail(outName(1) + ": expected " + formatShape(x) + " " + dtypeName(in(0).dtype) +
           " (as x), got " + formatShape(out(1).shape) + " " + dtypeName(out(1).dtype));
    bool weightGrad = kernel.outputs.size() > 3;
    if (weightGrad && (out(3).shape != w || out(3).dtype != in(1).dtype))
      fail(outName(3) + ": expected " + formatShape(w) + " " + dtypeName(in(1).dtype) +
           " (as w), got " + formatShape(out(3).shape) + " " + dtypeName(out(3).dtype));
    int64_t rows = in(2).numel;
    int64_t elements = linearCrossEntropyWorkspaceElements(
        rows, w[0], w[1], kernel.attrs.chunkRows, int64_t(dtypeSize(in(0).dtype)), weightGrad);
    expectF32Output(2, {elements});
    break;
  }
  case KernelKind::AddRMSNorm:
  case KernelKind::AddLayerNorm: {
    expectFloat(0);
    expectRankAtLeast(0, 1);
    expectInputDType(1, in(0).dtype);
    expectInputShape(1, in(0).shape);
    int64_t d = in(0).shape.back();
    for (size_t i = 2; i < kernel.inputs.size(); ++i)
      expectFloatInput(i, {d});
    for (size_t j = 0; j < 2; ++j)
      if (out(j).shape != in(0).shape || out(j).dtype != in(0).dtype)
        fail(outName(j) + ": expected " + formatShape(in(0).shape) + " " +
             dtypeName(in(0).dtype) + " (as lhs), got " + formatShape(out(j).shape) + " " +
             dtypeName(out(j).dtype));
    break;
  }
  case KernelKind::RMSNormGradAdd:
  case KernelKind::LayerNormGradAdd: {
    expectFloat(0);
    expectRankAtLeast(0, 1);
    expectFloatInput(1, in(0).shape);
    int64_t d = in(0).shape.back();
    expectFloatInput(2, {d});
    expectFloatInput(3, in(0).shape);
    expectFloatOutput(0, in(0).shape);
    for (size_t j = 1; j < kernel.outputs.size(); ++j)
      expectFloatOutput(j, {d});
    break;
  }
  case KernelKind::Fp8Linear:
  case KernelKind::Fp8LinearWithInputCast:
  case KernelKind::Fp8LinearGradInput: {
    // x [..., K] · w [N, K]ᵀ, or dy [..., N] · w [N, K]: the activation's leading dimensions
    // are M. Kind 98 also writes xᵀ's codes (output 2, before its workspace).
    bool forward = kernel.kind != KernelKind::Fp8LinearGradInput;
    expectFloat(0);
    expectRankAtLeast(0, 1);
    expectFloat(1);
    expectRank(1, 2);
    const std::vector<int64_t> &a = in(0).shape, &w = in(1).shape;
    int64_t n = w[0], k = w[1], m = in(0).numel / a.back();
    if (a.back() != (forward ? k : n))
      fail(inName(1) + " shape: expected " +
           (forward ? "[out, " + std::to_string(a.back()) + "]"
                    : "[" + std::to_string(a.back()) + ", in]") +
           " ([out, in] layout), got " + formatShape(w));
    std::string rows = "the rows of " + operandNames[0] + " " + formatShape(a);
    checkFp8Dimension("M", m, rows);
    checkFp8Dimension("N", n, "the rows of " + operandNames[1] + " " + formatShape(w));
    checkFp8Dimension("K", k, "the columns of " + operandNames[1] + " " + formatShape(w));
    if (forward && kernel.inputs.size() == 4)
      expectFloatInput(3, {n});
    std::vector<int64_t> shape(a.begin(), a.end() - 1);
    shape.push_back(forward ? n : k);
    expectFloatOutput(0, shape);
    if (kernel.kind == KernelKind::Fp8LinearWithInputCast) {
      checkFp8GemmOperands(in(0).numel, in(1).numel, 1, 3);
      checkFp8TransposedCodes(out(2), outName(2), k, m, "");
    } else {
      checkFp8GemmOperands(in(0).numel, in(1).numel);
    }
    break;
  }
  case KernelKind::Fp8LinearGradWeight:
  case KernelKind::Fp8LinearGradWeightAccumulate: {
    expectFloat(0);
    expectFloat(1);
    expectRankAtLeast(0, 1);
    expectRankAtLeast(1, 1);
    const std::vector<int64_t> &dy = in(0).shape, &x = in(1).shape;
    if (dy.size() != x.size() || !std::equal(dy.begin(), dy.end() - 1, x.begin()))
      fail("leading dimensions differ: " + inName(0) + " " + formatShape(dy) + ", " + inName(1) +
           " " + formatShape(x));
    checkFp8Dimension("M", in(0).numel / dy.back(), "the rows of dy " + formatShape(dy));
    checkFp8Dimension("N", dy.back(), "the columns of dy " + formatShape(dy));
    checkFp8Dimension("K", x.back(), "the columns of x " + formatShape(x));
    // dw, or the accumulator after the statistics and the workspace: f32 only (cuBLASLt's
    // FP8 GEMM adding into a bf16 C was off by tens of ulps on the H200, docs/fp8.md).
    const bool accumulate = kernel.kind == KernelKind::Fp8LinearGradWeightAccumulate;
    if (accumulate)
      expectF32Output(2, {dy.back(), x.back()});
    else
      expectFloatOutput(0, {dy.back(), x.back()});
    checkFp8GemmOperands(in(0).numel, in(1).numel, accumulate ? 0 : 1);
    break;
  }
  case KernelKind::Fp8LinearBackward: {
    // dx = dy [..., N] · w [N, K] and acc [N, K] += dyᵀ · x [..., K]; dy and x share a dtype
    // (one cast launch converts both), dx has it too, acc is f32.
    expectFloat(0);
    expectRankAtLeast(0, 1);
    expectFloat(1);
    expectRank(1, 2);
    const std::vector<int64_t> &dy = in(0).shape, &w = in(1).shape;
    int64_t n = w[0], k = w[1];
    if (dy.back() != n)
      fail(inName(1) + " shape: expected [" + std::to_string(dy.back()) +
           ", in] ([out, in] layout), got " + formatShape(w));
    std::vector<int64_t> shape(dy.begin(), dy.end() - 1);
    shape.push_back(k);
    expectFloatInput(2, shape);
    expectInputDType(2, in(0).dtype);
    checkFp8Dimension("M", in(0).numel / n, "the rows of dy " + formatShape(dy));
    checkFp8Dimension("N", n, "the rows of w " + formatShape(w));
    checkFp8Dimension("K", k, "the columns of w " + formatShape(w));
    expectFloatOutput(0, shape);
    if (out(0).dtype != in(0).dtype)
      fail(outName(0) + " dtype: expected " + dtypeName(in(0).dtype) + " (as dy), got " +
           dtypeName(out(0).dtype));
    expectF32Output(4, {n, k});
    checkFp8State(in(3), inName(3));
    checkFp8Stats(out(1), outName(1));
    checkFp8Stats(out(2), outName(2));
    checkFp8Workspace(3,
                      fp8::gemmWorkspaceBytes(in(0).numel, in(1).numel) +
                          fp8::gemmWorkspaceBytes(in(0).numel, in(2).numel),
                      "the workspaces of kinds 91 and 94 for these operands");
    break;
  }
  case KernelKind::Fp8LinearSharedInput: {
    // y [..., N] = x [..., K] · w [N, K]ᵀ with x's codes and scale from another kind 90's
    // workspace and stats: y gives M.
    expectFloat(2);
    expectRank(2, 2);
    expectFloatOutput(0, out(0).shape);
    if (out(0).shape.empty())
      fail(outName(0) + " must have at least one dimension");
    const std::vector<int64_t> &w = in(2).shape, &y = out(0).shape;
    int64_t n = w[0], k = w[1];
    if (y.back() != n)
      fail(inName(2) + " shape: expected [" + std::to_string(y.back()) +
           ", in] ([out, in] layout), got " + formatShape(w));
    int64_t m = out(0).numel / n;
    checkFp8Dimension("M", m, "the rows of y " + formatShape(y));
    checkFp8Dimension("N", n, "the rows of w " + formatShape(w));
    checkFp8Dimension("K", k, "the columns of w " + formatShape(w));
    if (kernel.inputs.size() == 5)
      expectFloatInput(4, {n});
    checkFp8SharedCast(0, 1, m * k, fp8::gemmWorkspaceBytes(m * k, 0),
                       "an Fp8Linear's workspace holding x's codes");
    checkFp8State(in(3), inName(3));
    checkFp8Stats(out(1), outName(1));
    checkFp8Workspace(2, fp8::gemmWorkspaceBytes(0, in(2).numel),
                      "fp8::gemmWorkspaceBytes of w's cast alone");
    break;
  }
  case KernelKind::Fp8LinearBackwardSharedInput:
  case KernelKind::Fp8LinearBackwardFromInputCast: {
    // Kind 95 with x's transposed codes and scale from another kind 95's workspace and
    // weight-gradient stats (97), or from kind 98's codes and stats (99).
    expectFloat(0);
    expectRankAtLeast(0, 1);
    expectFloat(1);
    expectRank(1, 2);
    const std::vector<int64_t> &dy = in(0).shape, &w = in(1).shape;
    int64_t n = w[0], k = w[1], m = in(0).numel / dy.back();
    if (dy.back() != n)
      fail(inName(1) + " shape: expected [" + std::to_string(dy.back()) +
           ", in] ([out, in] layout), got " + formatShape(w));
    std::vector<int64_t> shape(dy.begin(), dy.end() - 1);
    shape.push_back(k);
    checkFp8Dimension("M", m, "the rows of dy " + formatShape(dy));
    checkFp8Dimension("N", n, "the rows of w " + formatShape(w));
    checkFp8Dimension("K", k, "the columns of w " + formatShape(w));
    expectFloatOutput(0, shape);
    if (out(0).dtype != in(0).dtype)
      fail(outName(0) + " dtype: expected " + dtypeName(in(0).dtype) + " (as dy), got " +
           dtypeName(out(0).dtype));
    expectF32Output(4, {n, k});
    if (kernel.kind == KernelKind::Fp8LinearBackwardFromInputCast) {
      checkFp8TransposedCodes(in(2), inName(2), k, m, "an Fp8LinearWithInputCast's");
      checkFp8Stats(in(3), inName(3));
    } else {
      // The source's workspace holds at least its x codes and both GEMMs' control blocks.
      checkFp8SharedCast(2, 3, m * k,
                         fp8::gemmWorkspaceBytes(0, 0) + fp8::gemmWorkspaceBytes(0, m * k),
                         "an Fp8LinearBackward's workspace holding x's transposed codes");
    }
    checkFp8State(in(4), inName(4));
    checkFp8Stats(out(1), outName(1));
    checkFp8Stats(out(2), outName(2));
    checkFp8Workspace(3,
                      fp8::gemmWorkspaceBytes(in(0).numel, in(1).numel) +
                          fp8::gemmWorkspaceBytes(in(0).numel, 0),
                      "kind 95's workspace without x's codes");
    break;
  }
  case KernelKind::Fp8UpdateScales:
    expectScalarInput(0, DType::I64);
    for (size_t i = 1; i < kernel.inputs.size(); ++i)
      checkFp8Stats(in(i), inName(i));
    checkFp8State(out(0), outName(0));
    break;
  default:
    break;
  }
}

void KernelChecker::checkShapesV1() {
  switch (kernel.kind) {
  case KernelKind::Embedding: {
    expectFloat(0);
    expectIndex(1);
    expectRank(0, 2);
    std::vector<int64_t> shape = in(1).shape;
    shape.push_back(in(0).shape[1]);
    expectOutput(shape, in(0).dtype);
    break;
  }
  case KernelKind::Linear:
    expectOutput(checkLinearInputs(), in(0).dtype);
    break;
  case KernelKind::Matmul: {
    expectFloat(0);
    expectRankAtLeast(0, 2);
    size_t rank = in(0).shape.size();
    expectRank(1, rank);
    expectInputDType(1, in(0).dtype);
    const std::vector<int64_t> &a = in(0).shape, &b = in(1).shape;
    if (!std::equal(a.begin(), a.end() - 2, b.begin()))
      fail("batch dimensions differ: " + inName(0) + " " + formatShape(a) + ", " + inName(1) +
           " " + formatShape(b));
    if (a[rank - 1] != b[rank - 2])
      fail("contraction dimension: " + inName(0) + " has " + std::to_string(a[rank - 1]) + ", " +
           inName(1) + " has " + std::to_string(b[rank - 2]));
    std::vector<int64_t> shape(a.begin(), a.end() - 1);
    shape.push_back(b[rank - 1]);
    expectOutput(shape, in(0).dtype);
    break;
  }
  case KernelKind::Add:
  case KernelKind::Mul: {
    expectFloat(0);
    expectInputDType(1, in(0).dtype);
    const std::vector<int64_t> &l = in(0).shape, &r = in(1).shape;
    if (r.size() > l.size())
      fail(inName(1) + " rank " + std::to_string(r.size()) + " exceeds " + inName(0) + " rank " +
           std::to_string(l.size()) + " (only rhs is broadcast)");
    for (size_t i = 0; i < r.size(); ++i) {
      int64_t want = l[l.size() - r.size() + i];
      if (r[i] != want && r[i] != 1)
        fail(inName(1) + " shape " + formatShape(r) + " does not broadcast to " + formatShape(l) +
             ": dimension " + std::to_string(i) + " is " + std::to_string(r[i]) + ", expected " +
             std::to_string(want) + " or 1");
    }
    expectOutputLike(0);
    break;
  }
  case KernelKind::RMSNorm:
  case KernelKind::LayerNorm:
    expectFloat(0);
    expectRankAtLeast(0, 1);
    for (size_t i = 1; i < kernel.inputs.size(); ++i) {
      expectInputDType(i, in(0).dtype);
      expectInputShape(i, {in(0).shape.back()});
    }
    expectOutputLike(0);
    break;
  case KernelKind::RoPE:
    expectFloat(0);
    expectRank(0, 4);
    if (in(0).shape[3] % 2 != 0)
      fail(inName(0) + " head_dim must be even to rotate pairs, got " +
           std::to_string(in(0).shape[3]));
    expectOutputLike(0);
    break;
  case KernelKind::Attention: {
    expectFloat(0);
    expectRank(0, 4);
    expectRank(1, 4);
    expectInputShape(2, in(1).shape);
    expectInputDType(1, in(0).dtype);
    expectInputDType(2, in(0).dtype);
    const std::vector<int64_t> &q = in(0).shape, &k = in(1).shape;
    if (k[0] != q[0] || k[1] != q[1] || k[3] != q[3])
      fail(inName(1) + " shape " + formatShape(k) + " does not match " + inName(0) + " shape " +
           formatShape(q) + " in batch, sequence or head_dim");
    if (q[2] % k[2] != 0)
      fail("query heads (" + std::to_string(q[2]) + ") must be a multiple of key/value heads (" +
           std::to_string(k[2]) + ")");
    expectOutputLike(0);
    break;
  }
  case KernelKind::SiLU:
  case KernelKind::GeLU:
  case KernelKind::Softmax:
    expectFloat(0);
    expectOutputLike(0);
    break;
  case KernelKind::SwiGLU:
    expectFloat(0);
    expectInputDType(1, in(0).dtype);
    expectInputShape(1, in(0).shape);
    expectOutputLike(0);
    break;
  case KernelKind::CrossEntropy: {
    expectFloat(0);
    expectIndex(1);
    expectRankAtLeast(0, 2);
    std::vector<int64_t> shape(in(0).shape.begin(), in(0).shape.end() - 1);
    expectInputShape(1, shape);
    expectOutput({}, DType::F32);
    break;
  }
  case KernelKind::Transpose: {
    std::vector<int64_t> shape;
    for (int64_t p : kernel.attrs.permutation)
      shape.push_back(in(0).shape[size_t(p)]);
    expectOutput(shape, in(0).dtype);
    break;
  }
  case KernelKind::Slice: {
    size_t axis = size_t(kernel.attrs.axis);
    if (out().shape.size() != in(0).shape.size())
      fail(outName() + " rank: expected " + std::to_string(in(0).shape.size()) + ", got " +
           std::to_string(out().shape.size()));
    std::vector<int64_t> shape = in(0).shape;
    shape[axis] = out().shape[axis];
    expectOutput(shape, in(0).dtype);
    int64_t start = kernel.attrs.start, size = out().shape[axis], dim = in(0).shape[axis];
    if (start < 0 || start > dim || size > dim - start)
      fail("range [" + std::to_string(start) + ", " + std::to_string(start) + " + " +
           std::to_string(size) + ") is outside dimension " + std::to_string(axis) + " of size " +
           std::to_string(dim));
    break;
  }
  case KernelKind::Cast:
    expectFloat(0);
    if (!isFloatStorage(out().dtype))
      fail(outName() + " dtype: expected f32, f16 or bf16, got " + dtypeName(out().dtype));
    expectOutput(in(0).shape, out().dtype);
    break;
  case KernelKind::Copy:
    if (out().bytes != in(0).bytes)
      fail(outName() + " has " + std::to_string(out().bytes) + " bytes, " + inName(0) + " has " +
           std::to_string(in(0).bytes));
    break;
  default:
    break;
  }
}

void KernelChecker::check() {
  checkArity();
  checkNf4Operands();
  checkAttrs();
  checkShapes();
  checkOverlap();
  checkPhase();
  checkState();
}

/// Reads the hyperparameters AdamWAttrs and GaloreAdamWAttrs share.
template <typename AdamWTable> void readAdamWAttrs(const AdamWTable &t, KernelAttrsInfo &a) {
  a.beta1 = t.beta1();
  a.beta2 = t.beta2();
  a.eps = t.eps();
  a.weightDecay = t.weight_decay();
  a.gradClip = t.grad_clip();
}

/// The union member each kind requires (NONE: the kind takes no attributes), from the table.
fb::KernelAttrs requiredAttrs(KernelKind kind) {
  static const fb::KernelAttrs table[] = {
#define BONSAI_KERNEL_KIND(Name, Value, OpName, Attrs, ...) fb::KernelAttrs::Attrs,
#include "bonsai/runtime/KernelKinds.def"
  };
  return table[kernelKindIndex(kind)];
}

std::string attrsName(fb::KernelAttrs a) {
  if (a > fb::KernelAttrs::MAX)
    return "unknown attributes type " + std::to_string(unsigned(a));
  return a == fb::KernelAttrs::NONE ? "none" : fb::EnumNameKernelAttrs(a);
}

/// Copies the verified buffer into plain structs, checking as it goes.
class PlanReader {
public:
  PlanReader(const fb::Plan &root, const std::string &path) : root(root) { plan.path = path; }
  LoadedPlan read();

private:
  [[noreturn]] void fail(const std::string &message) const {
    throw Error("plan file '" + plan.path + "': " + message);
  }
  void readArenas();
  void readTensors();
  void checkTensorRoles();
  void readGeneratedKernels();
  void readKernels();
  void readInputsAndLoss();
  void checkTraining();
  void checkVocabulary();
  void readAdapters();

  const fb::Plan &root;
  LoadedPlan plan;
};

void PlanReader::readArenas() {
  const auto *arenas = root.arenas();
  if (!arenas || arenas->size() == 0)
    fail("the plan has no arenas");
  for (flatbuffers::uoffset_t i = 0; i < arenas->size(); ++i) {
    const fb::Arena *a = arenas->Get(i);
    ArenaInfo info;
    info.name = str(a->name());
    std::string what = "arena " + std::to_string(i) + " '" + info.name + "'";
    if (a->space() > fb::MemorySpace::MAX)
      fail(what + " has an unknown memory space " + std::to_string(unsigned(a->space())));
    if (a->lifetime() > fb::Lifetime::MAX)
      fail(what + " has an unknown lifetime " + std::to_string(unsigned(a->lifetime())));
    info.space = static_cast<MemorySpace>(a->space());
    info.lifetime = static_cast<Lifetime>(a->lifetime());
    info.size = a->size();
    info.alignment = a->alignment();
    if (info.size > kMaxArenaBytes)
      fail(what + " size " + std::to_string(info.size) + " bytes is beyond any machine (limit " +
           std::to_string(kMaxArenaBytes) + ")");
    if (info.alignment == 0 || (info.alignment & (info.alignment - 1)) != 0 ||
        info.alignment > kMaxAlignment)
      fail(what + " alignment " + std::to_string(info.alignment) +
           " is not a power of two up to " + std::to_string(kMaxAlignment));
    plan.arenas.push_back(std::move(info));
  }
}

void PlanReader::readTensors() {
  const auto *tensors = root.tensors();
  if (!tensors)
    return;
  for (flatbuffers::uoffset_t i = 0; i < tensors->size(); ++i) {
    const fb::Tensor *t = tensors->Get(i);
    TensorInfo info;
    info.name = str(t->name());
    std::string what = "tensor " + std::to_string(i) + " '" + info.name + "'";
    if (t->dtype() > fb::DType::MAX)
      fail(what + " has an unknown dtype " + std::to_string(unsigned(t->dtype())));
    if (t->role() > fb::TensorRole::MAX)
      fail(what + " has an unknown role " + std::to_string(unsigned(t->role())));
    if (t->init() > fb::TensorInit::MAX)
      fail(what + " has an unknown init " + std::to_string(unsigned(t->init())));
    info.dtype = static_cast<DType>(t->dtype());
    info.role = static_cast<TensorRole>(t->role());
    info.init = static_cast<TensorInit>(t->init());
    info.initSource = t->init_source();
    info.trainable = t->trainable();
    info.arena = t->arena();
    info.offset = t->offset();
    info.bytes = t->bytes();
    if (const auto *shape = t->shape())
      info.shape = readInt64s(*shape);
    if (info.shape.size() > kMaxRank)
      fail(what + " has rank " + std::to_string(info.shape.size()) + ", above the limit " +
           std::to_string(kMaxRank));
    // numel, then bytes, without overflow: every dimension is positive, so dividing the limit
    // by each one in turn bounds the product.
    uint64_t numel = 1;
    for (int64_t d : info.shape) {
      if (d <= 0)
        fail(what + " has a non-positive dimension in shape " + formatShape(info.shape));
      if (numel > kMaxArenaBytes / uint64_t(d))
        fail(what + " shape " + formatShape(info.shape) + " has more elements than any arena holds");
      numel *= uint64_t(d);
    }
    info.numel = int64_t(numel);
    info.quantBlock = t->quant_block();
    info.quantDoubleBlock = t->quant_double_block();
    uint64_t expectedBytes = numel * dtypeSize(info.dtype);
    if (info.dtype == DType::NF4) {
      // Even blocks start on whole bytes of codes; the limits are the compiler's.
      if (info.quantBlock < 16 || info.quantBlock > 4096 ||
          (info.quantBlock & (info.quantBlock - 1)) != 0)
        fail(what + " is nf4 with block size " + std::to_string(info.quantBlock) +
             ": expected a power of two in [16, 4096]");
      if (info.quantDoubleBlock == 0 || info.quantDoubleBlock > (1u << 20))
        fail(what + " is nf4 with double-quantization block " +
             std::to_string(info.quantDoubleBlock) + ": expected 1 to 1048576 blocks");
      if (info.role == TensorRole::Parameter && info.trainable)
        fail(what + " is a trainable nf4 parameter: NF4 weights are frozen");
      expectedBytes = nf4StorageBytes(numel, info.quantBlock, info.quantDoubleBlock);
    } else if (info.quantBlock || info.quantDoubleBlock) {
      fail(what + " is " + dtypeName(info.dtype) +
           " but has NF4 block sizes (quant_block " + std::to_string(info.quantBlock) +
           ", quant_double_block " + std::to_string(info.quantDoubleBlock) + ")");
    }
    if (info.bytes != expectedBytes)
      fail(what + " bytes: expected " + std::to_string(expectedBytes) + " (" +
           formatShape(info.shape) + " " + dtypeName(info.dtype) +
           (info.dtype == DType::NF4 ? " layout" : "") + "), got " +
           std::to_string(info.bytes));
    if (info.arena >= plan.arenas.size())
      fail(what + " is in arena " + std::to_string(info.arena) + ", but the plan has " +
           std::to_string(plan.arenas.size()) + " arenas");
    const ArenaInfo &arena = plan.arenas[info.arena];
    if (info.offset > arena.size || info.bytes > arena.size - info.offset)
      fail(what + " bytes [" + std::to_string(info.offset) + ", " + std::to_string(info.offset) +
           " + " + std::to_string(info.bytes) + ") are outside arena " +
           std::to_string(info.arena) + " '" + arena.name + "' of " + std::to_string(arena.size) +
           " bytes");
    // Kernels access elements through typed pointers: each must be naturally aligned (the f32
    // scales of an NF4 layout sit at multiples of 4 from its start).
    if (info.dtype == DType::NF4 && info.offset % 4 != 0)
      fail(what + " offset " + std::to_string(info.offset) +
           " is not a multiple of 4, which the f32 scales of its nf4 layout need");
    if (info.offset % dtypeSize(info.dtype) != 0)
      fail(what + " offset " + std::to_string(info.offset) + " is not a multiple of its " +
           dtypeName(info.dtype) + " element size");
    plan.tensors.push_back(std::move(info));
  }
}

/// What each role and initializer promises: names the runtime binds or reports by are unique,
/// runtime-written scalars have the type the runtime writes, and only persistent state starts
/// from an initializer (a step arena's bytes belong to whatever the planner put there last).
void PlanReader::checkTensorRoles() {
  // Checkpoint keys and reported names: (role, name) -> first tensor.
  std::map<std::pair<TensorRole, std::string>, uint32_t> named;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    std::string what = plan.describeTensor(i);
    switch (t.role) {
    case TensorRole::Parameter:
    case TensorRole::OptimizerState:
    case TensorRole::Metric: {
      const char *role = tensorRoleName(t.role);
      if (t.name.empty())
        fail(what + " is " + (t.role == TensorRole::OptimizerState ? "an " : "a ") + role +
             " without a name (" +
             (t.role == TensorRole::Metric ? "metrics are reported by name"
                                           : "checkpoints store it by name") +
             ")");
      auto [it, inserted] = named.emplace(std::make_pair(t.role, t.name), i);
      if (!inserted)
        fail("tensors " + std::to_string(it->second) + " and " + std::to_string(i) + " are both " +
             role + " '" + t.name + "' (a " + role +
             " is one tensor; views of it take another role)");
      break;
    }
    case TensorRole::LossScale:
      if (plan.lossScale)
        fail("tensors " + std::to_string(*plan.lossScale) + " and " + std::to_string(i) +
             " both have role loss scale (a plan has at most one)");
      plan.lossScale = i;
      break;
    default:
      break;
    }
    if ((t.role == TensorRole::Metric || t.role == TensorRole::LossScale) &&
        !isScalar(t, DType::F32))
      fail(what + " has role " + tensorRoleName(t.role) + " but is " + formatShape(t.shape) + " " +
           dtypeName(t.dtype) + ", not a scalar [] of dtype f32");

    if (t.init == TensorInit::None)
      continue;
    const char *init = t.init == TensorInit::Zeros            ? "Zeros"
                       : t.init == TensorInit::CopyOf         ? "CopyOf"
                       : t.init == TensorInit::KaimingUniform ? "KaimingUniform"
                                                              : "RowNorm";
    // Adapter parameters (docs/lora.md) carry the initializer applied when the weights do
    // not hold them: Zeros, KaimingUniform or RowNorm; these two are for parameters only.
    bool adapterInit = t.init == TensorInit::KaimingUniform || t.init == TensorInit::RowNorm;
    if (t.role == TensorRole::Parameter && t.init != TensorInit::CopyOf) {
      if (!isFloatStorage(t.dtype))
        fail(what + " has init " + init + " but dtype " + dtypeName(t.dtype) +
             " (initializers write f32, f16 or bf16)");
      if (t.init == TensorInit::KaimingUniform && t.shape.size() != 2)
        fail(what + " has init KaimingUniform but shape " + formatShape(t.shape) +
             " (fan_in is the second dimension of a 2-D tensor)");
    } else if (adapterInit || t.role == TensorRole::Parameter || t.role == TensorRole::Input ||
               t.role == TensorRole::LossScale) {
      fail(what + " has role " + tensorRoleName(t.role) + " and init " + init +
           (adapterInit ? ", which only a parameter can have"
                        : ", but the runtime binds or writes it (only computed state and "
                          "adapter parameters have an initializer)"));
    }
    const ArenaInfo &arena = plan.arenas[t.arena];
    if (arena.lifetime != Lifetime::Persistent)
      fail(what + " has init " + init + " but is in step arena " + std::to_string(t.arena) + " '" +
           arena.name + "' (initialized state must live in a persistent arena)");
    if (t.init == TensorInit::RowNorm) {
      if (t.initSource >= plan.tensors.size())
        fail(what + " is the row norms of tensor " + std::to_string(t.initSource) +
             ", but the plan has " + std::to_string(plan.tensors.size()) + " tensors");
      const TensorInfo &source = plan.tensors[t.initSource];
      std::string sourceName = plan.describeTensor(t.initSource);
      if (source.role != TensorRole::Parameter || source.init != TensorInit::None)
        fail(what + " is the row norms of " + sourceName +
             ", which is not a bound parameter (role " + tensorRoleName(source.role) + ")");
      if (source.shape.size() != 2 || t.shape != std::vector<int64_t>{source.shape[0]})
        fail(what + " shape " + formatShape(t.shape) + " is not the row count of " + sourceName +
             " " + formatShape(source.shape) + " (RowNorm gives one norm per row)");
      continue;
    }
    if (t.init != TensorInit::CopyOf)
      continue;
    if (t.initSource >= plan.tensors.size())
      fail(what + " is a copy of tensor " + std::to_string(t.initSource) + ", but the plan has " +
           std::to_string(plan.tensors.size()) + " tensors");
    const TensorInfo &source = plan.tensors[t.initSource];
    std::string sourceName = plan.describeTensor(t.initSource);
    if (t.initSource == i || rangesOverlap(source, t))
      fail(what + " is a copy of " + sourceName + ", which shares its storage");
    if (source.init == TensorInit::CopyOf)
      fail(what + " is a copy of " + sourceName +
           ", which is itself a copy (copies are made "
           "from bound or zeroed tensors, in one pass)");
    if (source.shape != t.shape)
      fail(what + " shape " + formatShape(t.shape) + " differs from that of its source " +
           sourceName + " " + formatShape(source.shape));
    bool convertible =
        source.dtype == t.dtype || (isFloatStorage(source.dtype) && isFloatStorage(t.dtype));
    if (!convertible)
      fail(what + " (" + dtypeName(t.dtype) + ") cannot be a converted copy of " + sourceName +
           " (" + dtypeName(source.dtype) + ")");
  }
}

void PlanReader::readGeneratedKernels() {
  const auto *kernels = root.generated_kernels();
  if (!kernels)
    return;
  bool gpu = plan.targetArch.rfind("sm_", 0) == 0;
  for (flatbuffers::uoffset_t g = 0; g < kernels->size(); ++g) {
    const fb::GeneratedKernel *k = kernels->Get(g);
    GeneratedKernelInfo info;
    info.name = str(k->name());
    info.ptx = str(k->ptx());
    info.arch = str(k->arch());
    std::string what = "generated kernel " + std::to_string(g) + " '" + info.name + "'";
    if (info.name.empty())
      fail("generated kernel " + std::to_string(g) + " has no name");
    const fb::ElementwiseProgram *program = k->program();
    if (!program)
      fail(what + " has no program");
    ElementwiseProgramInfo &p = info.program;
    if (const auto *inputs = program->inputs())
      for (flatbuffers::uoffset_t i = 0; i < inputs->size(); ++i) {
        auto type = static_cast<DType>(inputs->Get(i));
        if (!isFloatStorage(type))
          fail(what + ": input " + std::to_string(i) + " type must be f32, f16 or bf16, got " +
               (inputs->Get(i) > fb::DType::MAX ? "unknown" : dtypeName(type)));
        p.inputs.push_back(type);
      }
    // Each instruction reads registers defined before it, of the types its opcode takes.
    auto typeName = [](DType t) { return std::string(dtypeName(t)); };
    if (const auto *instructions = program->instructions())
      for (flatbuffers::uoffset_t i = 0; i < instructions->size(); ++i) {
        const fb::ElementwiseInstruction *inst = instructions->Get(i);
        std::string where = what + ": instruction " + std::to_string(i);
        if (inst->opcode() > fb::ElementwiseOpcode::MAX)
          fail(where + " has an unknown opcode " + std::to_string(unsigned(inst->opcode())));
        ElementwiseInstruction e;
        e.opcode = static_cast<ElementwiseOpcode>(inst->opcode());
        where += std::string(" (") + fb::EnumNameElementwiseOpcode(inst->opcode()) + ")";
        e.type = static_cast<DType>(inst->type());
        if (inst->type() > fb::DType::MAX || !isFloatStorage(e.type))
          fail(where + " defines a value of type " + std::to_string(unsigned(inst->type())) +
               "; programs compute on f32, f16 and bf16");
        e.a = inst->a();
        e.b = inst->b();
        e.imm = inst->imm();
        size_t defined = p.inputs.size() + p.instructions.size();
        auto expectDefined = [&](uint16_t r) {
          if (r >= defined)
            fail(where + " reads register " + std::to_string(r) + ", but only " +
                 std::to_string(defined) + " are defined before it");
        };
        if (e.opcode != ElementwiseOpcode::Constant)
          expectDefined(e.a);
        if (isBinary(e.opcode))
          expectDefined(e.b);
        DType a = e.opcode == ElementwiseOpcode::Constant ? DType::F32 : p.registerType(e.a);
        switch (e.opcode) {
        case ElementwiseOpcode::Constant:
          if (e.type != DType::F32)
            fail(where + " type mismatch: constants are f32, got " + typeName(e.type));
          break;
        case ElementwiseOpcode::Extend:
          if (a == DType::F32 || e.type != DType::F32)
            fail(where + " type mismatch: extends f16 or bf16 to f32, got " + typeName(a) +
                 " to " + typeName(e.type));
          break;
        case ElementwiseOpcode::Truncate:
          if (a != DType::F32 || e.type == DType::F32)
            fail(where + " type mismatch: rounds f32 to f16 or bf16, got " + typeName(a) +
                 " to " + typeName(e.type));
          break;
        default: {
          bool ok = a == DType::F32 && e.type == DType::F32 &&
                    (!isBinary(e.opcode) || p.registerType(e.b) == DType::F32);
          if (!ok)
            fail(where + " type mismatch: computes on f32 registers, got " + typeName(a) +
                 (isBinary(e.opcode) ? " and " + typeName(p.registerType(e.b)) : "") +
                 " giving " + typeName(e.type));
          break;
        }
        }
        p.instructions.push_back(e);
      }
    size_t registers = p.inputs.size() + p.instructions.size();
    if (const auto *outputs = program->outputs())
      p.outputs.assign(outputs->begin(), outputs->end());
    if (p.outputs.empty())
      fail(what + " has no outputs");
    for (size_t j = 0; j < p.outputs.size(); ++j)
      if (p.outputs[j] >= registers)
        fail(what + ": output " + std::to_string(j) + " is register " +
             std::to_string(p.outputs[j]) + ", but the program defines " +
             std::to_string(registers));
    if (gpu) {
      // The CUDA backend loads every generated kernel's PTX when it loads the plan.
      if (info.ptx.empty())
        fail(what + " has no PTX, but the plan targets " + plan.targetArch +
             " (recompile the plan for the GPU)");
      if (info.arch != plan.targetArch)
        fail(what + " is PTX for " + (info.arch.empty() ? "no architecture" : info.arch) +
             ", but the plan targets " + plan.targetArch);
      if (info.ptx.find(".entry " + info.name + "(") == std::string::npos)
        fail(what + ": its PTX has no .entry " + info.name);
    }
    plan.generatedKernels.push_back(std::move(info));
  }
}

void PlanReader::readKernels() {
  const auto *kernels = root.kernels();
  if (!kernels || kernels->size() == 0)
    fail("the plan has no kernels");
  for (flatbuffers::uoffset_t i = 0; i < kernels->size(); ++i) {
    const fb::Kernel *k = kernels->Get(i);
    KernelInfo info;
    info.name = str(k->name());
    info.stream = k->stream();
    std::string what = "kernel " + std::to_string(i) +
                       (info.name.empty() ? std::string() : " '" + info.name + "'");
    // The kinds are sparse (families own ranges): a value in a gap is as unknown as one past
    // the end.
    if (!findKernelKind(uint32_t(k->kind())))
      fail(what + " has an unknown kind " + std::to_string(unsigned(k->kind())) +
           " (a newer compiler? recompile the plan with this runtime's compiler)");
    info.kind = static_cast<KernelKind>(k->kind());
    what += std::string(" (") + kernelKindName(info.kind) + ")";
    if (k->phase() > fb::Phase::MAX)
      fail(what + " has an unknown phase " + std::to_string(unsigned(k->phase())));
    info.phase = static_cast<Phase>(k->phase());
    if (const auto *v = k->inputs())
      info.inputs.assign(v->begin(), v->end());
    if (const auto *v = k->outputs())
      info.outputs.assign(v->begin(), v->end());

    fb::KernelAttrs want = requiredAttrs(info.kind);
    fb::KernelAttrs got = k->attrs_type();
    // A union whose type is set but whose table is absent reads as absent.
    if (got != fb::KernelAttrs::NONE && !k->attrs())
      got = fb::KernelAttrs::NONE;
    if (got != want)
      fail(what + " attributes: expected " + attrsName(want) + ", got " + attrsName(got));
    KernelAttrsInfo &a = info.attrs;
    switch (want) {
    case fb::KernelAttrs::NormAttrs:
      a.epsilon = k->attrs_as_NormAttrs()->epsilon();
      break;
    case fb::KernelAttrs::RoPEAttrs:
      a.theta = k->attrs_as_RoPEAttrs()->theta();
      break;
    case fb::KernelAttrs::AttentionAttrs:
      a.causal = k->attrs_as_AttentionAttrs()->causal();
      a.scale = k->attrs_as_AttentionAttrs()->scale();
      break;
    case fb::KernelAttrs::GeLUAttrs:
      a.geluTanh = k->attrs_as_GeLUAttrs()->tanh();
      break;
    case fb::KernelAttrs::AxisAttrs:
      a.axis = k->attrs_as_AxisAttrs()->axis();
      break;
    case fb::KernelAttrs::CrossEntropyAttrs:
      a.ignoreIndex = k->attrs_as_CrossEntropyAttrs()->ignore_index();
      break;
    case fb::KernelAttrs::LinearCrossEntropyAttrs:
      a.ignoreIndex = k->attrs_as_LinearCrossEntropyAttrs()->ignore_index();
      a.chunkRows = k->attrs_as_LinearCrossEntropyAttrs()->chunk_rows();
      break;
    case fb::KernelAttrs::TransposeAttrs:
      if (const auto *perm = k->attrs_as_TransposeAttrs()->permutation())
        a.permutation = readInt64s(*perm);
      break;
    case fb::KernelAttrs::SliceAttrs:
      a.axis = k->attrs_as_SliceAttrs()->axis();
      a.start = k->attrs_as_SliceAttrs()->start();
      break;
    case fb::KernelAttrs::FillAttrs:
      a.value = k->attrs_as_FillAttrs()->value();
      break;
    case fb::KernelAttrs::DoraScaleAttrs:
      a.scale = k->attrs_as_DoraScaleAttrs()->scale();
      break;
    case fb::KernelAttrs::LearningRateAttrs: {
      const fb::LearningRateAttrs *lr = k->attrs_as_LearningRateAttrs();
      a.lr = lr->lr();
      a.cosine = lr->cosine();
      a.warmupSteps = lr->warmup_steps();
      a.totalSteps = lr->total_steps();
      a.minLrRatio = lr->min_lr_ratio();
      break;
    }
    case fb::KernelAttrs::AdamWAttrs:
      readAdamWAttrs(*k->attrs_as_AdamWAttrs(), a);
      break;
    case fb::KernelAttrs::GaloreRefreshAttrs: {
      const fb::GaloreRefreshAttrs *g = k->attrs_as_GaloreRefreshAttrs();
      a.rank = g->rank();
      a.updateProjGap = g->update_proj_gap();
      a.offset = g->offset();
      a.slot = g->slot();
      a.left = g->left();
      a.randomized = g->randomized();
      a.powerIterations = g->power_iterations();
      a.seed = g->seed();
      break;
    }
    case fb::KernelAttrs::GaloreProjectAttrs:
      a.left = k->attrs_as_GaloreProjectAttrs()->left();
      a.bf16Operands = k->attrs_as_GaloreProjectAttrs()->bf16_operands();
      break;
    case fb::KernelAttrs::GaloreAdamWAttrs: {
      const fb::GaloreAdamWAttrs *g = k->attrs_as_GaloreAdamWAttrs();
      readAdamWAttrs(*g, a);
      a.scale = g->scale();
      a.left = g->left();
      break;
    }
    case fb::KernelAttrs::GeneratedKernelAttrs:
      a.generatedKernel = k->attrs_as_GeneratedKernelAttrs()->kernel();
      break;
    case fb::KernelAttrs::Fp8Attrs:
      a.fp8Current = k->attrs_as_Fp8Attrs()->current();
      a.fp8Margin = k->attrs_as_Fp8Attrs()->margin();
      a.fp8FastAccumulation = k->attrs_as_Fp8Attrs()->fast_accumulation();
      break;
    case fb::KernelAttrs::SGDAttrs: {
      const fb::SGDAttrs *sgd = k->attrs_as_SGDAttrs();
      a.momentum = sgd->momentum();
      a.weightDecay = sgd->weight_decay();
      a.gradClip = sgd->grad_clip();
      break;
    }
    default:
      break;
    }
    plan.kernels.push_back(std::move(info));
    KernelChecker(plan, i).check();
  }
}

void PlanReader::readInputsAndLoss() {
  std::vector<bool> isPlanInput(plan.tensors.size(), false);
  if (const auto *inputs = root.inputs())
    plan.inputs.assign(inputs->begin(), inputs->end());
  if (plan.inputs.size() != 2)
    fail("plan inputs: expected 2 tensors (ids, labels), got " +
         std::to_string(plan.inputs.size()));
  const char *inputNames[] = {"ids", "labels"};
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    uint32_t t = plan.inputs[i];
    std::string what = std::string("plan input ") + std::to_string(i) + " (" + inputNames[i] + ")";
    if (t >= plan.tensors.size())
      fail(what + " is tensor " + std::to_string(t) + ", but the plan has " +
           std::to_string(plan.tensors.size()) + " tensors");
    const TensorInfo &info = plan.tensors[t];
    if (info.role != TensorRole::Input)
      fail(what + ", " + plan.describeTensor(t) + ", has role " + tensorRoleName(info.role) +
           ", expected input");
    if (!isIndexType(info.dtype))
      fail(what + ", " + plan.describeTensor(t) + ", dtype: expected i32 or i64, got " +
           dtypeName(info.dtype));
    if (info.shape.size() != 2)
      fail(what + ", " + plan.describeTensor(t) + ", shape: expected [batch, seq], got " +
           formatShape(info.shape));
    isPlanInput[t] = true;
  }
  if (plan.inputs[0] == plan.inputs[1] ||
      rangesOverlap(plan.tensors[plan.inputs[0]], plan.tensors[plan.inputs[1]]))
    fail("plan inputs ids and labels share storage");
  if (plan.tensors[plan.inputs[0]].shape != plan.tensors[plan.inputs[1]].shape)
    fail("plan inputs: ids shape " + formatShape(plan.tensors[plan.inputs[0]].shape) +
         " differs from labels shape " + formatShape(plan.tensors[plan.inputs[1]].shape));
  for (size_t t = 0; t < plan.tensors.size(); ++t)
    if (plan.tensors[t].role == TensorRole::Input && !isPlanInput[t])
      fail(plan.describeTensor(uint32_t(t)) + " has role input but is not one of the plan inputs");

  plan.loss = root.loss();
  if (plan.loss >= plan.tensors.size())
    fail("the loss is tensor " + std::to_string(plan.loss) + ", but the plan has " +
         std::to_string(plan.tensors.size()) + " tensors");
  const TensorInfo &loss = plan.tensors[plan.loss];
  if (loss.role != TensorRole::Loss || loss.dtype != DType::F32 || !loss.shape.empty())
    fail("the loss, " + plan.describeTensor(plan.loss) + ", must be an f32 scalar with role loss, got " +
         formatShape(loss.shape) + " " + dtypeName(loss.dtype) + " " + tensorRoleName(loss.role));
  bool written = false;
  for (const KernelInfo &k : plan.kernels)
    for (uint32_t o : k.outputs)
      written = written || (o == plan.loss && k.phase == Phase::Forward);
  if (!written)
    fail("the loss, " + plan.describeTensor(plan.loss) +
         ", is not written by any kernel of the forward phase");
}

/// The phase order and the micro-batch contract. (Kernels may write over the bytes of the
/// inputs and the loss scale after their last use: the runtime writes them again before each
/// micro-batch.)
void PlanReader::checkTraining() {
  for (size_t i = 1; i < plan.kernels.size(); ++i)
    if (plan.kernels[i].phase < plan.kernels[i - 1].phase)
      fail(plan.describeKernel(i) + " runs in the " + phaseName(plan.kernels[i].phase) +
           " phase but comes after " + plan.describeKernel(i - 1) + " of the " +
           phaseName(plan.kernels[i - 1].phase) +
           " phase: kernels are ordered forward, backward, update");
  plan.microBatches = root.micro_batches();
  if (plan.microBatches == 0 || plan.microBatches > kMaxMicroBatches)
    fail("micro_batches must be in [1, " + std::to_string(kMaxMicroBatches) + "], got " +
         std::to_string(plan.microBatches));
  std::string problem = plan.microBatchProblem(plan.microBatches);
  if (!problem.empty())
    fail("micro_batches " + std::to_string(plan.microBatches) + ": " + problem);
}

/// vocab_size bounds the ids the data loader accepts; every table the ids index and every
/// logits row the labels index must be at least that large, so no id the loader lets through
/// can reach outside a tensor.
void PlanReader::checkVocabulary() {
  plan.vocabSize = root.vocab_size();
  if (plan.vocabSize == 0 || plan.vocabSize > kMaxVocab)
    fail("vocab_size must be in [1, 2^32], got " + std::to_string(plan.vocabSize));
  const TensorInfo &ids = plan.tensors[plan.inputs[0]];
  const TensorInfo &labels = plan.tensors[plan.inputs[1]];
  uint64_t limit = uint64_t(std::numeric_limits<int32_t>::max()) + 1;
  if ((ids.dtype == DType::I32 || labels.dtype == DType::I32) && plan.vocabSize > limit)
    fail("vocab_size " + std::to_string(plan.vocabSize) + " does not fit the plan's i32 inputs");
  auto needRows = [&](size_t k, uint32_t t, const char *what, int64_t rows) {
    if (uint64_t(rows) < plan.vocabSize)
      fail(plan.describeKernel(k) + ": " + what + ", " + plan.describeTensor(t) + ", has " +
           std::to_string(rows) + " rows, fewer than vocab_size " + std::to_string(plan.vocabSize));
  };
  for (size_t k = 0; k < plan.kernels.size(); ++k) {
    const KernelInfo &kernel = plan.kernels[k];
    auto tensor = [&](uint32_t i) -> const TensorInfo & { return plan.tensors[i]; };
    switch (kernel.kind) {
    case KernelKind::Embedding:
      if (rangesOverlap(tensor(kernel.inputs[1]), ids))
        needRows(k, kernel.inputs[0], "the table indexed by the plan's ids",
                 tensor(kernel.inputs[0]).shape[0]);
      break;
    case KernelKind::EmbeddingGrad:
      if (rangesOverlap(tensor(kernel.inputs[1]), ids))
        needRows(k, kernel.outputs[0], "the table gradient indexed by the plan's ids",
                 tensor(kernel.outputs[0]).shape[0]);
      break;
    case KernelKind::CrossEntropy:
      if (rangesOverlap(tensor(kernel.inputs[1]), labels))
        needRows(k, kernel.inputs[0], "the logits indexed by the plan's labels",
                 tensor(kernel.inputs[0]).shape.back());
      break;
    case KernelKind::CrossEntropyGrad:
      if (rangesOverlap(tensor(kernel.inputs[2]), labels))
        needRows(k, kernel.inputs[1], "the logits indexed by the plan's labels",
                 tensor(kernel.inputs[1]).shape.back());
      break;
    case KernelKind::LinearCrossEntropy:
      if (rangesOverlap(tensor(kernel.inputs[2]), labels))
        needRows(k, kernel.inputs[1], "the LM head weight indexed by the plan's labels",
                 tensor(kernel.inputs[1]).shape[0]);
      break;
    default:
      break;
    }
  }
}

/// Adapter metadata (docs/lora.md): every index names a parameter of the right shape, and no
/// tensor belongs to two adapters. Exporters (PEFT adapters, merged weights) rely on it.
void PlanReader::readAdapters() {
  if (const auto *targets = root.adapter_targets())
    for (const flatbuffers::String *target : *targets)
      plan.adapterTargets.push_back(str(target));
  const auto *adapters = root.adapters();
  if (!adapters)
    return;
  std::map<uint32_t, size_t> owner; // tensor -> adapter that uses it
  for (flatbuffers::uoffset_t i = 0; i < adapters->size(); ++i) {
    const fb::Adapter *a = adapters->Get(i);
    AdapterInfo info;
    info.module = str(a->module_()); // flatc renames `module` (a C++20 keyword)
    std::string what = "adapter " + std::to_string(i) + " '" + info.module + "'";
    if (info.module.empty())
      fail(what + " has no module name");
    info.rank = a->rank();
    info.alpha = a->alpha();
    if (info.rank == 0)
      fail(what + " has rank 0");
    if (!(info.alpha > 0) || !std::isfinite(info.alpha))
      fail(what + " alpha must be positive and finite, got " + num(info.alpha));
    auto param = [&](const char *field, int64_t index) -> uint32_t {
      if (index < 0 || uint64_t(index) >= plan.tensors.size())
        fail(what + " " + field + " is tensor " + std::to_string(index) + ", but the plan has " +
             std::to_string(plan.tensors.size()) + " tensors");
      uint32_t t = uint32_t(index);
      if (plan.tensors[t].role != TensorRole::Parameter)
        fail(what + " " + field + " is " + plan.describeTensor(t) + " of role " +
             tensorRoleName(plan.tensors[t].role) + ", not a parameter");
      auto [it, inserted] = owner.emplace(t, i);
      if (!inserted)
        fail(what + " " + field + " is " + plan.describeTensor(t) + ", already used by adapter " +
             std::to_string(it->second));
      return t;
    };
    info.base = param("base", a->base());
    info.loraA = param("lora_a", a->lora_a());
    info.loraB = param("lora_b", a->lora_b());
    if (a->magnitude() != -1)
      info.magnitude = param("magnitude", a->magnitude());
    const TensorInfo &base = plan.tensors[info.base];
    if (base.shape.size() != 2)
      fail(what + " base " + plan.describeTensor(info.base) + " has shape " +
           formatShape(base.shape) + ", expected [out, in]");
    int64_t out = base.shape[0], in = base.shape[1], r = int64_t(info.rank);
    auto expectShape = [&](const char *field, uint32_t t, std::vector<int64_t> shape) {
      if (plan.tensors[t].shape != shape)
        fail(what + " " + field + " " + plan.describeTensor(t) + " has shape " +
             formatShape(plan.tensors[t].shape) + ", expected " + formatShape(shape) +
             " (base " + formatShape(base.shape) + ", rank " + std::to_string(r) + ")");
      if (!isFloatStorage(plan.tensors[t].dtype))
        fail(what + " " + field + " " + plan.describeTensor(t) + " has dtype " +
             dtypeName(plan.tensors[t].dtype) + ", expected f32, f16 or bf16");
    };
    expectShape("lora_a", info.loraA, {r, in});
    expectShape("lora_b", info.loraB, {out, r});
    if (info.magnitude)
      expectShape("magnitude", *info.magnitude, {out});
    plan.adapters.push_back(std::move(info));
  }
}

LoadedPlan PlanReader::read() {
  plan.version = root.version();
  if (plan.version != kPlanVersion)
    fail("plan version " + std::to_string(plan.version) + " is not supported by this runtime (it runs version " +
         std::to_string(kPlanVersion) + "): recompile the plan with a matching bonsai-compile");
  plan.model = str(root.model());
  if (const fb::Target *target = root.target()) {
    plan.targetArch = str(target->arch());
    plan.targetDeviceMemory = target->device_memory();
  }
  if (const fb::MemorySummary *m = root.memory()) {
    plan.memory.weights = m->weights();
    plan.memory.gradients = m->gradients();
    plan.memory.optimizerState = m->optimizer_state();
    plan.memory.activations = m->activations();
    plan.memory.workspace = m->workspace();
    plan.memory.inputs = m->inputs();
    plan.memory.peakDevice = m->peak_device();
    plan.memory.peakHost = m->peak_host();
  }
  plan.tokensPerStep = root.tokens_per_step();
  readArenas();
  readTensors();
  checkTensorRoles();
  readGeneratedKernels();
  readKernels();
  readInputsAndLoss();
  checkTraining();
  checkVocabulary();
  readAdapters();
  return std::move(plan);
}

} // namespace

LoadedPlan loadPlanBuffer(const void *data, size_t size, const std::string &what) {
  const auto *bytes = static_cast<const uint8_t *>(data);
  // Root offset (4 bytes) and identifier (4 bytes) come first.
  if (size < 8 || !fb::PlanBufferHasIdentifier(bytes))
    throw Error("not a Bonsai plan: '" + what +
                "' does not carry the plan file identifier \"BNSP\"");
  if (size >= FLATBUFFERS_MAX_BUFFER_SIZE)
    throw Error("plan file '" + what + "' is larger than a FlatBuffer can be (2 GiB)");
  if (reinterpret_cast<uintptr_t>(bytes) % 8 != 0)
    throw Error("internal error: plan buffer for '" + what + "' is not 8-byte aligned");
  flatbuffers::Verifier verifier(bytes, size);
  if (!fb::VerifyPlanBuffer(verifier))
    throw Error("plan file '" + what + "' is truncated or corrupted (FlatBuffers verification failed)");
  return PlanReader(*fb::GetPlan(bytes), what).read();
}

LoadedPlan loadPlanFile(const std::string &path) {
  std::vector<uint8_t> bytes = readFileBytes(path);
  if (bytes.empty())
    throw Error("plan file '" + path + "' is empty");
  return loadPlanBuffer(bytes.data(), bytes.size(), path);
}

} // namespace bonsai::rt
