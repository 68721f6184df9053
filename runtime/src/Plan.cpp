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

#include "KernelChecker.h"

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
                  uint8_t(fb::DType::U8) == uint8_t(DType::U8) &&
                  uint8_t(fb::DType::MAX) == uint8_t(DType::U8) &&
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

// Shared with the kernels' contracts (KernelChecker.h).
using contract::isFloatStorage;
using contract::isIndexType;
using contract::isScalar;
using contract::num;
using contract::rangesOverlap;
using contract::sameStorage;

// Largest arena or tensor the runtime accepts: far beyond any real device, far below the
// point where offset + bytes could overflow.
constexpr uint64_t kMaxArenaBytes = uint64_t(1) << 50;
constexpr uint64_t kMaxAlignment = uint64_t(1) << 20;
constexpr size_t kMaxRank = 16;
// Token files hold uint32 ids; far more micro-batches than any step needs.
constexpr uint64_t kMaxVocab = uint64_t(1) << 32;
constexpr uint32_t kMaxMicroBatches = uint32_t(1) << 20;

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

std::string LoadedPlan::rankDirectives() const {
  const uint32_t data = ranks / ringRanks;
  std::string shard = "bonsai.shard \"" + shardStrategy + "\" ranks " + std::to_string(data);
  std::string ring = "bonsai.ring ranks " + std::to_string(ringRanks);
  if (ringRanks <= 1)
    return shard;
  return shardStrategy.empty() ? ring : shard + " x " + ring;
}

int64_t LoadedPlan::lossIgnoreIndex() const {
  for (const KernelInfo &k : kernels) {
    if (const auto *a = std::get_if<CrossEntropyAttrs>(&k.attrs))
      return a->ignoreIndex;
    if (const auto *a = std::get_if<LinearCrossEntropyAttrs>(&k.attrs))
      return a->ignoreIndex;
  }
  return -100;
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

bool LoadedPlan::hasCollectives() const {
  for (const KernelInfo &k : kernels)
    if (kernelKindInfo(k.kind).has(kernel_traits::kCollective))
      return true;
  return false;
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

/// Whether opcode `op` takes two operands.
bool isBinary(ElementwiseOpcode op) {
  return op == ElementwiseOpcode::Add || op == ElementwiseOpcode::Sub ||
         op == ElementwiseOpcode::Mul || op == ElementwiseOpcode::Div;
}

/// Reads the hyperparameters AdamWAttrs and GaloreAdamWAttrs share.
template <typename AdamWTable> void readAdamW(const AdamWTable &t, AdamWAttrs &a) {
  a.beta1 = t.beta1();
  a.beta2 = t.beta2();
  a.eps = t.eps();
  a.weightDecay = t.weight_decay();
  a.gradClip = t.grad_clip();
}

/// A kernel's attributes as the struct of their table `table` (the kind's, checked already).
KernelAttrsInfo readAttrs(const fb::Kernel &k, fb::KernelAttrs table) {
  switch (table) {
  case fb::KernelAttrs::NormAttrs:
    return NormAttrs{k.attrs_as_NormAttrs()->epsilon()};
  case fb::KernelAttrs::RoPEAttrs:
  {
    const fb::RoPEAttrs *a = k.attrs_as_RoPEAttrs();
    return RoPEAttrs{a->theta(), a->scaling_factor(), a->low_freq_factor(),
                     a->high_freq_factor(), a->original_max_positions()};
  }
  case fb::KernelAttrs::AttentionAttrs:
    return AttentionAttrs{k.attrs_as_AttentionAttrs()->causal(),
                          k.attrs_as_AttentionAttrs()->scale(),
                          k.attrs_as_AttentionAttrs()->ring_ranks()};
  case fb::KernelAttrs::GeLUAttrs:
    return GeLUAttrs{k.attrs_as_GeLUAttrs()->tanh()};
  case fb::KernelAttrs::AxisAttrs:
    return AxisAttrs{k.attrs_as_AxisAttrs()->axis()};
  case fb::KernelAttrs::CrossEntropyAttrs:
    return CrossEntropyAttrs{k.attrs_as_CrossEntropyAttrs()->ignore_index()};
  case fb::KernelAttrs::LinearCrossEntropyAttrs:
    return LinearCrossEntropyAttrs{k.attrs_as_LinearCrossEntropyAttrs()->ignore_index(),
                                   k.attrs_as_LinearCrossEntropyAttrs()->chunk_rows()};
  case fb::KernelAttrs::TransposeAttrs: {
    TransposeAttrs a;
    if (const auto *perm = k.attrs_as_TransposeAttrs()->permutation())
      a.permutation = readInt64s(*perm);
    return a;
  }
  case fb::KernelAttrs::SliceAttrs:
    return SliceAttrs{k.attrs_as_SliceAttrs()->axis(), k.attrs_as_SliceAttrs()->start()};
  case fb::KernelAttrs::FillAttrs:
    return FillAttrs{k.attrs_as_FillAttrs()->value()};
  case fb::KernelAttrs::DoraScaleAttrs:
    return DoraScaleAttrs{k.attrs_as_DoraScaleAttrs()->scale()};
  case fb::KernelAttrs::LearningRateAttrs: {
    const fb::LearningRateAttrs *lr = k.attrs_as_LearningRateAttrs();
    return LearningRateAttrs{lr->lr(), lr->cosine(), lr->warmup_steps(), lr->total_steps(),
                             lr->min_lr_ratio()};
  }
  case fb::KernelAttrs::AdamWAttrs: {
    AdamWAttrs a;
    readAdamW(*k.attrs_as_AdamWAttrs(), a);
    return a;
  }
  case fb::KernelAttrs::SGDAttrs: {
    const fb::SGDAttrs *sgd = k.attrs_as_SGDAttrs();
    return SGDAttrs{sgd->momentum(), sgd->weight_decay(), sgd->grad_clip()};
  }
  case fb::KernelAttrs::GaloreRefreshAttrs: {
    const fb::GaloreRefreshAttrs *g = k.attrs_as_GaloreRefreshAttrs();
    GaloreRefreshAttrs a;
    a.rank = g->rank();
    a.updateProjGap = g->update_proj_gap();
    a.offset = g->offset();
    a.slot = g->slot();
    a.left = g->left();
    a.randomized = g->randomized();
    a.powerIterations = g->power_iterations();
    a.seed = g->seed();
    return a;
  }
  case fb::KernelAttrs::GaloreProjectAttrs:
    return GaloreProjectAttrs{k.attrs_as_GaloreProjectAttrs()->left(),
                              k.attrs_as_GaloreProjectAttrs()->bf16_operands()};
  case fb::KernelAttrs::GaloreAdamWAttrs: {
    const fb::GaloreAdamWAttrs *g = k.attrs_as_GaloreAdamWAttrs();
    GaloreAdamWAttrs a;
    readAdamW(*g, a);
    a.scale = g->scale();
    a.left = g->left();
    return a;
  }
  case fb::KernelAttrs::GeneratedKernelAttrs:
    return GeneratedKernelAttrs{k.attrs_as_GeneratedKernelAttrs()->kernel()};
  case fb::KernelAttrs::Fp8Attrs:
    return Fp8Attrs{k.attrs_as_Fp8Attrs()->current(), k.attrs_as_Fp8Attrs()->margin(),
                    k.attrs_as_Fp8Attrs()->fast_accumulation()};
  case fb::KernelAttrs::CollectiveAttrs:
    return CollectiveAttrs{
        k.attrs_as_CollectiveAttrs()->ranks(),
        static_cast<CollectiveReduction>(k.attrs_as_CollectiveAttrs()->reduction())};
  case fb::KernelAttrs::NONE:
    break;
  }
  return NoAttrs{};
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
  void readRanks();
  void readArenas();
  void readTensors();
  void readShard(const fb::Tensor &t, TensorInfo &info, const std::string &what);
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
    // NF4 tensors, and the u8 shares of their storage (readShard), carry the layout's blocks.
    if (info.dtype == DType::NF4 || info.dtype == DType::U8) {
      const std::string kind = info.dtype == DType::NF4 ? "nf4" : "a u8 share of nf4 storage";
      // Even blocks start on whole bytes of codes; the limits are the compiler's.
      if (info.quantBlock < 16 || info.quantBlock > 4096 ||
          (info.quantBlock & (info.quantBlock - 1)) != 0)
        fail(what + " is " + kind + " with block size " + std::to_string(info.quantBlock) +
             ": expected a power of two in [16, 4096]");
      if (info.quantDoubleBlock == 0 || info.quantDoubleBlock > (1u << 20))
        fail(what + " is " + kind + " with double-quantization block " +
             std::to_string(info.quantDoubleBlock) + ": expected 1 to 1048576 blocks");
      if (info.role == TensorRole::Parameter && info.trainable)
        fail(what + " is a trainable " +
             (info.dtype == DType::NF4 ? "nf4 parameter" : "u8 share of nf4 storage") +
             ": NF4 weights are frozen");
      if (info.dtype == DType::NF4)
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
    readShard(*t, info, what);
    plan.tensors.push_back(std::move(info));
  }
}

/// Plan.ranks, Plan.shard_strategy and Plan.ring_ranks: a plan of several ranks says which
/// ZeRO stage or ring made it.
void PlanReader::readRanks() {
  plan.ranks = std::max<uint32_t>(root.ranks(), 1);
  plan.shardStrategy = str(root.shard_strategy());
  plan.ringRanks = std::max<uint32_t>(root.ring_ranks(), 1);
  // Far more than any job; keeps ranks * numel far from overflow.
  constexpr uint32_t kMaxRanks = 1u << 16;
  if (plan.ranks > kMaxRanks)
    fail("ranks " + std::to_string(plan.ranks) + " is above the limit " +
         std::to_string(kMaxRanks));
  if (plan.ringRanks > 1 && plan.ranks % plan.ringRanks != 0)
    fail("ring_ranks " + std::to_string(plan.ringRanks) + " does not divide the plan's " +
         std::to_string(plan.ranks) + " ranks");
  // A plan of only a ring shards nothing; any other plan of several ranks is a ZeRO stage's.
  const bool ringOnly = plan.ringRanks == plan.ranks && plan.shardStrategy.empty();
  if (plan.ranks > 1 && !ringOnly && plan.shardStrategy != "zero1" &&
      plan.shardStrategy != "zero2" && plan.shardStrategy != "zero3")
    fail("the plan is for " + std::to_string(plan.ranks) + " ranks but its shard_strategy is '" +
         plan.shardStrategy + "' (expected zero1, zero2 or zero3)");
}

/// Tensor.shard_ranks and Tensor.full_shape: a sharded tensor is one rank's flat 1/ranks of a
/// whole tensor of the plan's ranks (every rank runs the same plan, so every rank's shard has
/// this tensor's shape).
void PlanReader::readShard(const fb::Tensor &t, TensorInfo &info, const std::string &what) {
  info.shardRanks = t.shard_ranks();
  if (const auto *full = t.full_shape())
    info.fullShape = readInt64s(*full);
  if (info.shardRanks == 0) {
    if (!info.fullShape.empty())
      fail(what + " has full_shape " + formatShape(info.fullShape) +
           " but shard_ranks 0 (a whole tensor has no full_shape)");
    if (info.dtype == DType::U8)
      fail(what + " is u8 but not sharded: u8 tensors are the shares of sharded nf4 storage");
    return;
  }
  if (info.shardRanks != plan.ranks)
    fail(what + " is sharded over " + std::to_string(info.shardRanks) +
         " ranks, but the plan is for " + std::to_string(plan.ranks) + " ranks (Plan.ranks)");
  if (info.dtype == DType::NF4)
    fail(what + " is an nf4 tensor sharded over ranks: a share of nf4 storage is u8 (its bytes)");
  if (info.fullShape.empty() || info.fullShape.size() > kMaxRank)
    fail(what + " is sharded over " + std::to_string(info.shardRanks) + " ranks with full_shape " +
         formatShape(info.fullShape) + ": expected the whole tensor's shape, of rank 1 to " +
         std::to_string(kMaxRank));
  uint64_t full = 1;
  for (int64_t d : info.fullShape) {
    if (d <= 0 || full > kMaxArenaBytes / uint64_t(d))
      fail(what + " full_shape " + formatShape(info.fullShape) +
           " has a non-positive dimension or more elements than any arena holds");
    full *= uint64_t(d);
  }
  if (info.dtype == DType::U8) {
    // A share of an NF4 tensor's storage: 1/ranks of its layout's bytes.
    uint64_t wholeBytes = nf4StorageBytes(full, info.quantBlock, info.quantDoubleBlock);
    if (info.shape.size() != 1 || wholeBytes != uint64_t(info.numel) * info.shardRanks)
      fail(what + " is a u8 share over " + std::to_string(info.shardRanks) +
           " ranks of the nf4 storage of full_shape " + formatShape(info.fullShape) + " (" +
           std::to_string(wholeBytes) + " bytes), expected shape [" +
           std::to_string(wholeBytes / info.shardRanks) + "]" +
           (wholeBytes % info.shardRanks ? " (the bytes do not split evenly)" : "") + ", got " +
           formatShape(info.shape));
    return;
  }
  if (full != uint64_t(info.numel) * info.shardRanks)
    fail(what + " is sharded over " + std::to_string(info.shardRanks) + " ranks: full_shape " +
         formatShape(info.fullShape) + " has " + std::to_string(full) + " elements, expected " +
         std::to_string(info.shardRanks) + " x " + std::to_string(info.numel) + " (shape " +
         formatShape(info.shape) + ")");
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
      // A shard is initialized as its slice of the whole tensor (docs/sharding.md).
      const std::vector<int64_t> &whole = t.sharded() ? t.fullShape : t.shape;
      if (t.init == TensorInit::KaimingUniform && whole.size() != 2)
        fail(what + " has init KaimingUniform but shape " + formatShape(whole) +
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
      // Either may be sharded (docs/sharding.md): the norms are of the whole source's rows,
      // and a sharded magnitude keeps its slice of them.
      const std::vector<int64_t> &rows = t.sharded() ? t.fullShape : t.shape;
      const std::vector<int64_t> &matrix = source.sharded() ? source.fullShape : source.shape;
      if (matrix.size() != 2 || rows != std::vector<int64_t>{matrix[0]})
        fail(what + " shape " + formatShape(rows) + " is not the row count of " + sourceName + " " +
             formatShape(matrix) + " (RowNorm gives one norm per row)");
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
    // A shard copies its slice of a whole source (ZeRO-1/2: the parameter is whole, its
    // masters sharded), or a shard of the same split.
    if (t.sharded() && !source.sharded()) {
      if (source.shape != t.fullShape)
        fail(what + " is a shard of " + formatShape(t.fullShape) + " but a copy of " + sourceName +
             " " + formatShape(source.shape) +
             " (a sharded copy of a whole tensor takes its slice of a tensor of its full_shape)");
    } else if (source.shape != t.shape || source.fullShape != t.fullShape) {
      fail(what + " shape " + formatShape(t.shape) +
           (t.sharded() ? " (a shard of " + formatShape(t.fullShape) + ")" : "") +
           " differs from that of its source " + sourceName + " " + formatShape(source.shape) +
           (source.sharded() ? " (a shard of " + formatShape(source.fullShape) + ")" : ""));
    }
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
    std::string what = "kernel " + std::to_string(i) +
                       (info.name.empty() ? std::string() : " '" + info.name + "'");
    if (k->stream() >= kNumStreams)
      fail(what + " runs on an unknown stream " + std::to_string(unsigned(k->stream())) +
           " (0 compute, 1 host-to-device copies, 2 device-to-host copies, 3 host, 4 copies of "
           "the host steps' results, 5 collectives)");
    info.stream = static_cast<StreamId>(k->stream());
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
    info.attrs = readAttrs(*k, want);
    // Every attention of a ring's plan reads the whole sequence around the ring; an attention
    // of the local share alone would silently see a fraction of the keys.
    if (const auto *a = std::get_if<AttentionAttrs>(&info.attrs);
        a && std::max<uint32_t>(a->ringRanks, 1) != plan.ringRanks)
      fail(what + " has ring_ranks " + std::to_string(a->ringRanks) + ", but the plan's " +
           (plan.ringRanks > 1
                ? "sequence is split over a ring of " + std::to_string(plan.ringRanks) + " ranks"
                : std::string("sequence is not split (no Plan.ring_ranks)")));
    plan.kernels.push_back(std::move(info));
    contract::KernelChecker(plan, i).check();
  }
}

void PlanReader::readInputsAndLoss() {
  std::vector<bool> isPlanInput(plan.tensors.size(), false);
  if (const auto *inputs = root.inputs())
    plan.inputs.assign(inputs->begin(), inputs->end());
  if (plan.inputs.size() < 2 || plan.inputs.size() > 4)
    fail("plan inputs: expected 2 to 4 tensors (ids, labels, then optionally positions and "
         "segment_ids), got " +
         std::to_string(plan.inputs.size()));
  const char *inputNames[] = {"ids", "labels"};
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    uint32_t t = plan.inputs[i];
    std::string what = std::string("plan input ") + std::to_string(i);
    if (i < 2)
      what += std::string(" (") + inputNames[i] + ")";
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
    // Packed rows' inputs are bound by name (the loader's positions and segment ids).
    if (i >= 2) {
      if (isPlanInput[t])
        fail(what + ", " + plan.describeTensor(t) + ", is already a plan input");
      if (info.name != "positions" && info.name != "segment_ids")
        fail(what + ", " + plan.describeTensor(t) +
             ", is neither \"positions\" nor \"segment_ids\"");
      std::optional<uint32_t> &slot =
          info.name == "positions" ? plan.positionsInput : plan.segmentIdsInput;
      if (slot)
        fail(what + ": a second \"" + info.name + "\" input");
      if (info.shape != plan.tensors[plan.inputs[0]].shape)
        fail(what + " shape " + formatShape(info.shape) + " differs from ids shape " +
             formatShape(plan.tensors[plan.inputs[0]].shape));
      slot = t;
    }
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
  // A ring's rank holds two equal zigzag chunks of every row.
  if (plan.ringRanks > 1 && plan.tensors[plan.inputs[0]].shape[1] % 2 != 0)
    fail("plan inputs: ids shape " + formatShape(plan.tensors[plan.inputs[0]].shape) +
         " is not two equal chunks of a row split over a ring of " +
         std::to_string(plan.ringRanks) + " ranks");

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
/// A kernel that indexes a tensor with the plan's token ids or labels: that tensor's rows
/// (its first dimension, or its last) must cover the vocabulary.
struct VocabularyIndex {
  KernelKind kind;
  bool byLabels;        ///< Indexed by the labels (else by the ids).
  unsigned index;       ///< The input holding the ids or labels.
  bool indexedIsOutput; ///< The indexed tensor is an output (else an input).
  unsigned indexed;
  bool lastDimension; ///< Its rows are its last dimension (else its first).
  const char *what;
};
const VocabularyIndex kVocabularyIndices[] = {
    {KernelKind::Embedding, false, kinds::Embedding::In::ids, false, kinds::Embedding::In::table,
     false, "the table indexed by the plan's ids"},
    {KernelKind::EmbeddingGrad, false, kinds::EmbeddingGrad::In::ids, true,
     kinds::EmbeddingGrad::Out::dtable, false, "the table gradient indexed by the plan's ids"},
    {KernelKind::CrossEntropy, true, kinds::CrossEntropy::In::labels, false,
     kinds::CrossEntropy::In::logits, true, "the logits indexed by the plan's labels"},
    {KernelKind::CrossEntropyGrad, true, kinds::CrossEntropyGrad::In::labels, false,
     kinds::CrossEntropyGrad::In::logits, true, "the logits indexed by the plan's labels"},
    {KernelKind::LinearCrossEntropy, true, kinds::LinearCrossEntropy::In::labels, false,
     kinds::LinearCrossEntropy::In::w, false, "the LM head weight indexed by the plan's labels"},
};

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
    for (const VocabularyIndex &v : kVocabularyIndices) {
      if (v.kind != kernel.kind)
        continue;
      const TensorInfo &index = plan.tensors[kernel.inputs[v.index]];
      if (!rangesOverlap(index, v.byLabels ? labels : ids))
        continue;
      uint32_t t = v.indexedIsOutput ? kernel.outputs[v.indexed] : kernel.inputs[v.indexed];
      const std::vector<int64_t> &shape = plan.tensors[t].shape;
      needRows(k, t, v.what, v.lastDimension ? shape.back() : shape[0]);
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
    // Adapters are checked on the whole tensors: a sharded one (bonsai-shard) by the shape it
    // is a share of.
    auto wholeShape = [&](uint32_t t) -> const std::vector<int64_t> & {
      const TensorInfo &tensor = plan.tensors[t];
      return tensor.sharded() ? tensor.fullShape : tensor.shape;
    };
    const std::vector<int64_t> &baseShape = wholeShape(info.base);
    if (baseShape.size() != 2)
      fail(what + " base " + plan.describeTensor(info.base) + " has shape " +
           formatShape(baseShape) + ", expected [out, in]");
    int64_t out = baseShape[0], in = baseShape[1], r = int64_t(info.rank);
    auto expectShape = [&](const char *field, uint32_t t, std::vector<int64_t> shape) {
      if (wholeShape(t) != shape)
        fail(what + " " + field + " " + plan.describeTensor(t) + " has shape " +
             formatShape(wholeShape(t)) + ", expected " + formatShape(shape) + " (base " +
             formatShape(baseShape) + ", rank " + std::to_string(r) + ")");
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
    double link = target->link_gb_per_s();
    if (!std::isfinite(link) || link < 0 || link > 1e6)
      fail("the target's link rate " + std::to_string(link) +
           " GB/s is not a rate (a finite number from 0 to 1e6)");
    plan.targetLinkBytesPerSecond = link * 1e9;
    double step = target->predicted_step_s(), exposed = target->predicted_exposed_s();
    if (!std::isfinite(step) || step < 0 || !std::isfinite(exposed) || exposed < 0 ||
        exposed > step)
      fail("the target's predicted step (" + std::to_string(step) + " s, of which " +
           std::to_string(exposed) + " s exposed offload) is not a time");
    plan.predictedStepSeconds = step;
    plan.predictedExposedSeconds = exposed;
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
  readRanks();
  readArenas();
  readTensors();
  checkTensorRoles();
  readGeneratedKernels();
  readKernels();
  orderStreams(plan);
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

TensorView wholeNf4View(const TensorInfo &share, std::vector<uint8_t> &storage) {
  if (!share.nf4Share())
    throw Error("internal error: '" + share.name + "' is not a share of nf4 storage");
  storage.assign(size_t(share.wholeBytes()), 0);
  TensorView whole{storage.data(), DType::NF4, share.fullShape};
  whole.quantBlock = share.quantBlock;
  whole.quantDoubleBlock = share.quantDoubleBlock;
  if (whole.bytes() != storage.size())
    throw Error("internal error: the nf4 layout of '" + share.name + "' is " +
                std::to_string(whole.bytes()) + " bytes, its shares " +
                std::to_string(storage.size()));
  return whole;
}

void copyNf4Share(const TensorInfo &share, const TensorView &whole, int rank,
                  const TensorView &view) {
  std::memcpy(view.data, static_cast<const uint8_t *>(whole.data) + share.shardOffset(rank),
              size_t(share.bytes));
}

} // namespace bonsai::rt
