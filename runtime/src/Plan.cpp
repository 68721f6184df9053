//===- Plan.cpp - Loading and verifying a compiled training-step plan -----===//
//
// Verify, then load: the identifier and the FlatBuffers verifier make every read of the buffer
// safe, and the semantic checks below make every kernel launch safe (each operand's byte range
// lies inside its arena, and each kernel's shapes agree the way its CPU and GPU implementations
// assume). The checks mirror the bonsai dialect's op verifiers: a plan that passes them cannot
// make a kernel read or write outside its tensors. Every message names the plan file and the
// arena, tensor or kernel at fault.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Plan.h"

#include "bonsai/runtime/plan_generated.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

namespace bonsai::rt {

namespace fb = ::bonsai::plan;

// The runtime's enums are copies of the schema's, so that headers need no generated code.
static_assert(uint8_t(fb::DType::I64) == uint8_t(DType::I64) &&
                  uint8_t(fb::DType::F8E5M2) == uint8_t(DType::F8E5M2),
              "rt::DType must match plan.fbs");
static_assert(uint8_t(fb::TensorRole::Loss) == uint8_t(TensorRole::Loss),
              "rt::TensorRole must match plan.fbs");
static_assert(uint16_t(fb::KernelKind::Copy) == uint16_t(KernelKind::Copy) &&
                  uint16_t(fb::KernelKind::MAX) == uint16_t(KernelKind::Copy),
              "rt::KernelKind must match plan.fbs");
static_assert(uint8_t(fb::MemorySpace::PinnedHost) == uint8_t(MemorySpace::PinnedHost) &&
                  uint8_t(fb::Lifetime::Step) == uint8_t(Lifetime::Step),
              "rt::MemorySpace and rt::Lifetime must match plan.fbs");

const char *kernelKindName(KernelKind kind) {
  auto value = static_cast<fb::KernelKind>(kind);
  if (value > fb::KernelKind::MAX)
    return "unknown";
  return fb::EnumNameKernelKind(value);
}

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

std::optional<int64_t> LoadedPlan::vocabularySize() const {
  for (const KernelInfo &k : kernels)
    if (k.kind == KernelKind::Embedding)
      return tensors[k.inputs[0]].shape[0];
  return std::nullopt;
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

// Largest arena or tensor the runtime accepts: far beyond any real device, far below the
// point where offset + bytes could overflow.
constexpr uint64_t kMaxArenaBytes = uint64_t(1) << 50;
constexpr uint64_t kMaxAlignment = uint64_t(1) << 20;
constexpr size_t kMaxRank = 16;

std::string str(const flatbuffers::String *s) { return s ? s->str() : std::string(); }

bool isIndexType(DType t) { return t == DType::I32 || t == DType::I64; }
bool isFloatStorage(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

bool rangesOverlap(const TensorInfo &a, const TensorInfo &b) {
  return a.arena == b.arena && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

bool sameStorage(const TensorInfo &a, const TensorInfo &b) {
  return a.arena == b.arena && a.offset == b.offset && a.bytes == b.bytes;
}

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
  const TensorInfo &out() const { return plan.tensors[kernel.outputs[0]]; }

  std::string inName(size_t i) const {
    return operandNames[i] + " (" + plan.describeTensor(kernel.inputs[i]) + ")";
  }
  std::string outName() const {
    return std::string(resultName) + " (" + plan.describeTensor(kernel.outputs[0]) + ")";
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

  void checkArity();
  void checkAttrs();
  void checkOverlap() const;
  void checkShapes();

  const LoadedPlan &plan;
  size_t index;
  const KernelInfo &kernel;
  std::vector<std::string> operandNames;
  const char *resultName = "result";
};

// Kinds whose output may be the very storage of one of their inputs: each output element
// depends only on input elements at the same position, which every kernel reads before it
// writes.
bool mayRunInPlace(KernelKind kind) {
  switch (kind) {
  case KernelKind::Add:
  case KernelKind::Mul:
  case KernelKind::SiLU:
  case KernelKind::GeLU:
  case KernelKind::SwiGLU:
  case KernelKind::Copy:
    return true;
  default:
    return false;
  }
}

void KernelChecker::checkArity() {
  size_t minIn = 1, maxIn = 1;
  switch (kernel.kind) {
  case KernelKind::Embedding:
    operandNames = {"table", "ids"};
    break;
  case KernelKind::Linear:
    operandNames = {"x", "w", "bias"};
    minIn = 2;
    resultName = "y";
    break;
  case KernelKind::Matmul:
    operandNames = {"a", "b"};
    resultName = "c";
    break;
  case KernelKind::Add:
  case KernelKind::Mul:
    operandNames = {"lhs", "rhs"};
    break;
  case KernelKind::RMSNorm:
    operandNames = {"x", "weight"};
    resultName = "y";
    break;
  case KernelKind::LayerNorm:
    operandNames = {"x", "weight", "bias"};
    resultName = "y";
    break;
  case KernelKind::Attention:
    operandNames = {"q", "k", "v"};
    resultName = "o";
    break;
  case KernelKind::SwiGLU:
    operandNames = {"gate", "up"};
    resultName = "y";
    break;
  case KernelKind::CrossEntropy:
    operandNames = {"logits", "labels"};
    resultName = "loss";
    break;
  case KernelKind::RoPE:
  case KernelKind::SiLU:
  case KernelKind::GeLU:
  case KernelKind::Softmax:
  case KernelKind::Transpose:
  case KernelKind::Slice:
  case KernelKind::Cast:
  case KernelKind::Copy:
    operandNames = {"x"};
    resultName = "y";
    break;
  }
  if (minIn == 1)
    minIn = operandNames.size();
  maxIn = operandNames.size();
  size_t n = kernel.inputs.size();
  if (n < minIn || n > maxIn) {
    std::string expected = minIn == maxIn ? std::to_string(minIn)
                                          : std::to_string(minIn) + " or " + std::to_string(maxIn);
    std::string names;
    for (const std::string &name : operandNames)
      names += (names.empty() ? "" : ", ") + name;
    fail("expected " + expected + " inputs (" + names + "), got " + std::to_string(n));
  }
  if (kernel.outputs.size() != 1)
    fail("expected 1 output, got " + std::to_string(kernel.outputs.size()));
  for (size_t i = 0; i < n; ++i)
    if (kernel.inputs[i] >= plan.tensors.size())
      fail("input " + std::to_string(i) + " (" + operandNames[i] + ") is tensor " +
           std::to_string(kernel.inputs[i]) + ", but the plan has " +
           std::to_string(plan.tensors.size()) + " tensors");
  if (kernel.outputs[0] >= plan.tensors.size())
    fail("output 0 is tensor " + std::to_string(kernel.outputs[0]) + ", but the plan has " +
         std::to_string(plan.tensors.size()) + " tensors");
}

void KernelChecker::checkAttrs() {
  const KernelAttrsInfo &a = kernel.attrs;
  switch (kernel.kind) {
  case KernelKind::RMSNorm:
  case KernelKind::LayerNorm:
    if (!(a.epsilon > 0))
      fail("epsilon must be positive, got " + std::to_string(a.epsilon));
    break;
  case KernelKind::RoPE:
    if (!(a.theta > 0))
      fail("theta must be positive, got " + std::to_string(a.theta));
    break;
  case KernelKind::Attention:
    if (!(a.scale > 0) || a.scale == std::numeric_limits<double>::infinity())
      fail("scale must be positive and finite, got " + std::to_string(a.scale));
    break;
  case KernelKind::Softmax:
  case KernelKind::Slice:
    if (a.axis < 0 || size_t(a.axis) >= in(0).shape.size())
      fail("axis " + std::to_string(a.axis) + " is out of range for " + inName(0) + " of rank " +
           std::to_string(in(0).shape.size()));
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
  default:
    break;
  }
}

void KernelChecker::checkOverlap() const {
  for (size_t i = 0; i < kernel.inputs.size(); ++i) {
    if (!rangesOverlap(in(i), out()))
      continue;
    if (mayRunInPlace(kernel.kind) && sameStorage(in(i), out()))
      continue;
    fail(outName() + " overlaps " + inName(i) + " in arena " + std::to_string(out().arena) +
         (mayRunInPlace(kernel.kind) ? " (only an exact alias is allowed for this kind)"
                                     : " (this kind cannot run in place)"));
  }
}

void KernelChecker::checkShapes() {
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
  case KernelKind::Linear: {
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
    expectOutput(shape, in(0).dtype);
    break;
  }
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
  }
}

void KernelChecker::check() {
  checkArity();
  checkAttrs();
  checkShapes();
  checkOverlap();
}

/// The union member each kind requires (NONE: the kind takes no attributes).
fb::KernelAttrs requiredAttrs(fb::KernelKind kind) {
  switch (kind) {
  case fb::KernelKind::RMSNorm:
  case fb::KernelKind::LayerNorm:
    return fb::KernelAttrs::NormAttrs;
  case fb::KernelKind::RoPE:
    return fb::KernelAttrs::RoPEAttrs;
  case fb::KernelKind::Attention:
    return fb::KernelAttrs::AttentionAttrs;
  case fb::KernelKind::GeLU:
    return fb::KernelAttrs::GeLUAttrs;
  case fb::KernelKind::Softmax:
    return fb::KernelAttrs::AxisAttrs;
  case fb::KernelKind::CrossEntropy:
    return fb::KernelAttrs::CrossEntropyAttrs;
  case fb::KernelKind::Transpose:
    return fb::KernelAttrs::TransposeAttrs;
  case fb::KernelKind::Slice:
    return fb::KernelAttrs::SliceAttrs;
  default:
    return fb::KernelAttrs::NONE;
  }
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
  void readKernels();
  void readInputsAndLoss();

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
  std::vector<std::pair<std::string, uint32_t>> parameterNames;
  for (flatbuffers::uoffset_t i = 0; i < tensors->size(); ++i) {
    const fb::Tensor *t = tensors->Get(i);
    TensorInfo info;
    info.name = str(t->name());
    std::string what = "tensor " + std::to_string(i) + " '" + info.name + "'";
    if (t->dtype() > fb::DType::MAX)
      fail(what + " has an unknown dtype " + std::to_string(unsigned(t->dtype())));
    if (t->role() > fb::TensorRole::MAX)
      fail(what + " has an unknown role " + std::to_string(unsigned(t->role())));
    info.dtype = static_cast<DType>(t->dtype());
    info.role = static_cast<TensorRole>(t->role());
    info.trainable = t->trainable();
    info.arena = t->arena();
    info.offset = t->offset();
    info.bytes = t->bytes();
    if (const auto *shape = t->shape())
      info.shape.assign(shape->begin(), shape->end());
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
    uint64_t expectedBytes = numel * dtypeSize(info.dtype);
    if (info.bytes != expectedBytes)
      fail(what + " bytes: expected " + std::to_string(expectedBytes) + " (" +
           formatShape(info.shape) + " " + dtypeName(info.dtype) + "), got " +
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
    // Kernels access elements through typed pointers: each must be naturally aligned.
    if (info.offset % dtypeSize(info.dtype) != 0)
      fail(what + " offset " + std::to_string(info.offset) + " is not a multiple of its " +
           dtypeName(info.dtype) + " element size");
    if (info.role == TensorRole::Parameter) {
      if (info.name.empty())
        fail(what + " is a parameter without a name (parameters are bound by name)");
      parameterNames.emplace_back(info.name, i);
    }
    plan.tensors.push_back(std::move(info));
  }
  std::sort(parameterNames.begin(), parameterNames.end());
  for (size_t i = 1; i < parameterNames.size(); ++i)
    if (parameterNames[i].first == parameterNames[i - 1].first)
      fail("tensors " + std::to_string(parameterNames[i - 1].second) + " and " +
           std::to_string(parameterNames[i].second) + " are both parameter '" +
           parameterNames[i].first + "' (a parameter is one tensor; views of it are not parameters)");
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
    if (k->kind() > fb::KernelKind::MAX)
      fail(what + " has an unknown kind " + std::to_string(unsigned(k->kind())) +
           " (a newer compiler? recompile the plan with this runtime's compiler)");
    info.kind = static_cast<KernelKind>(k->kind());
    what += std::string(" (") + kernelKindName(info.kind) + ")";
    if (const auto *v = k->inputs())
      info.inputs.assign(v->begin(), v->end());
    if (const auto *v = k->outputs())
      info.outputs.assign(v->begin(), v->end());

    fb::KernelAttrs want = requiredAttrs(k->kind());
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
    case fb::KernelAttrs::TransposeAttrs:
      if (const auto *perm = k->attrs_as_TransposeAttrs()->permutation())
        a.permutation.assign(perm->begin(), perm->end());
      break;
    case fb::KernelAttrs::SliceAttrs:
      a.axis = k->attrs_as_SliceAttrs()->axis();
      a.start = k->attrs_as_SliceAttrs()->start();
      break;
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
      written = written || o == plan.loss;
  if (!written)
    fail("the loss, " + plan.describeTensor(plan.loss) + ", is not written by any kernel");
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
  readKernels();
  readInputsAndLoss();
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
