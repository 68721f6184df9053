//===- PlanEmitter.cpp - Write a planned step as a flatbuffer plan --------===//
//
// One pass over the step: arenas get indices, buffers and views become tensors (a view shares
// its source's arena and offset), launches become kernels whose attributes are packed into the
// schema's typed tables.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Target/PlanEmitter.h"

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Conversion/ElementwiseKernels.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.h"
#include "bonsai/runtime/plan_generated.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSwitch.h"

using namespace mlir;
using namespace mlir::bonsai;
namespace fb = ::bonsai::plan;

namespace {

std::optional<fb::DType> getDType(Type type) {
  if (type.isF32())
    return fb::DType::F32;
  if (type.isF16())
    return fb::DType::F16;
  if (type.isBF16())
    return fb::DType::BF16;
  if (isa<Float8E4M3FNType>(type))
    return fb::DType::F8E4M3FN;
  if (isa<Float8E5M2Type>(type))
    return fb::DType::F8E5M2;
  if (type.isSignlessInteger(32))
    return fb::DType::I32;
  if (type.isSignlessInteger(64))
    return fb::DType::I64;
  if (isa<NF4Type>(type))
    return fb::DType::NF4;
  if (type.isUnsignedInteger(8))
    return fb::DType::U8;
  return std::nullopt;
}

std::optional<fb::KernelKind> getKernelKind(StringRef name) {
  return llvm::StringSwitch<std::optional<fb::KernelKind>>(name)
#define BONSAI_KERNEL_KIND(Name, Value, OpName, ...) .Case(OpName, fb::KernelKind::Name)
#include "bonsai/runtime/KernelKinds.def"
      .Default(std::nullopt);
}

fb::TensorRole getRole(plan::BufferRole role) {
  switch (role) {
  case plan::BufferRole::Parameter:
    return fb::TensorRole::Parameter;
  case plan::BufferRole::Input:
    return fb::TensorRole::Input;
  case plan::BufferRole::Activation:
    return fb::TensorRole::Activation;
  case plan::BufferRole::Gradient:
    return fb::TensorRole::Gradient;
  case plan::BufferRole::OptimizerState:
    return fb::TensorRole::OptimizerState;
  case plan::BufferRole::Workspace:
    return fb::TensorRole::Workspace;
  case plan::BufferRole::Loss:
    return fb::TensorRole::Loss;
  case plan::BufferRole::Metric:
    return fb::TensorRole::Metric;
  case plan::BufferRole::LossScale:
    return fb::TensorRole::LossScale;
  }
  llvm_unreachable("unknown buffer role");
}

/// Reads a parameter of a launch, failing with an error naming it when absent or mistyped.
template <typename AttrT>
FailureOr<AttrT> getParam(plan::LaunchOp launch, StringRef name) {
  auto attr = launch.getParams().getAs<AttrT>(name);
  if (!attr) {
    launch.emitError() << "kernel '" << launch.getKernel() << "' needs parameter '" << name
                       << "'";
    return failure();
  }
  return attr;
}

/// The attribute table (plan.fbs KernelAttrs) a kind requires, from the kernel table.
fb::KernelAttrs attrsTableOf(fb::KernelKind kind) {
  switch (kind) {
#define BONSAI_KERNEL_KIND(Name, Value, OpName, Attrs, ...)                                       \
  case fb::KernelKind::Name:                                                                     \
    return fb::KernelAttrs::Attrs;
#include "bonsai/runtime/KernelKinds.def"
  }
  return fb::KernelAttrs::NONE;
}

/// Packs a launch's parameters into the schema's attribute table for its kind.
LogicalResult packAttrs(flatbuffers::FlatBufferBuilder &fbb, plan::LaunchOp launch,
                        fb::KernelKind kind, fb::KernelAttrs &type,
                        flatbuffers::Offset<void> &attrs) {
  auto f64 = [&](StringRef name) -> FailureOr<double> {
    FailureOr<FloatAttr> a = getParam<FloatAttr>(launch, name);
    if (failed(a))
      return failure();
    return a->getValueAsDouble();
  };
  auto i64 = [&](StringRef name) -> FailureOr<int64_t> {
    FailureOr<IntegerAttr> a = getParam<IntegerAttr>(launch, name);
    if (failed(a))
      return failure();
    return a->getInt();
  };
  switch (attrsTableOf(kind)) {
  case fb::KernelAttrs::NormAttrs: {
    FailureOr<double> eps = f64("epsilon");
    if (failed(eps))
      return failure();
    type = fb::KernelAttrs::NormAttrs;
    attrs = fb::CreateNormAttrs(fbb, *eps).Union();
    return success();
  }
  case fb::KernelAttrs::RoPEAttrs: {
    FailureOr<double> theta = f64("theta");
    if (failed(theta))
      return failure();
    // llama3 scaling: the four parameters together (the op verifier checked), or none.
    double factor = 0, low = 0, high = 0;
    int64_t original = 0;
    if (launch.getParams().get("scaling_factor")) {
      FailureOr<double> f = f64("scaling_factor"), l = f64("low_freq_factor"),
                        h = f64("high_freq_factor");
      FailureOr<int64_t> o = i64("original_max_positions");
      if (failed(f) || failed(l) || failed(h) || failed(o))
        return failure();
      factor = *f, low = *l, high = *h, original = *o;
    }
    type = fb::KernelAttrs::RoPEAttrs;
    attrs = fb::CreateRoPEAttrs(fbb, *theta, factor, low, high, original).Union();
    return success();
  }
  case fb::KernelAttrs::AttentionAttrs: {
    FailureOr<double> scale = f64("scale");
    if (failed(scale))
      return failure();
    bool causal = bool(launch.getParams().get("causal"));
    uint32_t ringRanks = 0;
    if (launch.getParams().get("ring_ranks")) {
      FailureOr<int64_t> ranks = i64("ring_ranks");
      if (failed(ranks))
        return failure();
      ringRanks = uint32_t(*ranks);
    }
    type = fb::KernelAttrs::AttentionAttrs;
    attrs = fb::CreateAttentionAttrs(fbb, causal, *scale, ringRanks).Union();
    return success();
  }
  case fb::KernelAttrs::GeLUAttrs: {
    FailureOr<BoolAttr> tanh = getParam<BoolAttr>(launch, "tanh");
    if (failed(tanh))
      return failure();
    type = fb::KernelAttrs::GeLUAttrs;
    attrs = fb::CreateGeLUAttrs(fbb, tanh->getValue()).Union();
    return success();
  }
  case fb::KernelAttrs::AxisAttrs: {
    FailureOr<int64_t> axis = i64("axis");
    if (failed(axis))
      return failure();
    type = fb::KernelAttrs::AxisAttrs;
    attrs = fb::CreateAxisAttrs(fbb, int32_t(*axis)).Union();
    return success();
  }
  case fb::KernelAttrs::CrossEntropyAttrs: {
    FailureOr<int64_t> ignore = i64("ignore_index");
    if (failed(ignore))
      return failure();
    type = fb::KernelAttrs::CrossEntropyAttrs;
    attrs = fb::CreateCrossEntropyAttrs(fbb, *ignore).Union();
    return success();
  }
  case fb::KernelAttrs::Fp8Attrs: {
    FailureOr<BoolAttr> current = getParam<BoolAttr>(launch, "current");
    FailureOr<int64_t> margin = i64("margin");
    if (failed(current) || failed(margin))
      return failure();
    // Only the forward GEMMs have the option (`fast_accumulation`, false when absent).
    auto fast = launch.getParams().getAs<BoolAttr>("fast_accumulation");
    type = fb::KernelAttrs::Fp8Attrs;
    attrs = fb::CreateFp8Attrs(fbb, current->getValue(), int32_t(*margin), fast && fast.getValue())
                .Union();
    return success();
  }
  case fb::KernelAttrs::LinearCrossEntropyAttrs: {
    FailureOr<int64_t> ignore = i64("ignore_index"), chunk = i64("chunk_rows");
    if (failed(ignore) || failed(chunk))
      return failure();
    type = fb::KernelAttrs::LinearCrossEntropyAttrs;
    attrs = fb::CreateLinearCrossEntropyAttrs(fbb, *ignore, *chunk).Union();
    return success();
  }
  case fb::KernelAttrs::TransposeAttrs: {
    FailureOr<DenseI64ArrayAttr> perm = getParam<DenseI64ArrayAttr>(launch, "permutation");
    if (failed(perm))
      return failure();
    std::vector<int64_t> values(perm->asArrayRef().begin(), perm->asArrayRef().end());
    type = fb::KernelAttrs::TransposeAttrs;
    attrs = fb::CreateTransposeAttrsDirect(fbb, &values).Union();
    return success();
  }
  case fb::KernelAttrs::SliceAttrs: {
    FailureOr<int64_t> axis = i64("axis"), start = i64("start");
    if (failed(axis) || failed(start))
      return failure();
    type = fb::KernelAttrs::SliceAttrs;
    attrs = fb::CreateSliceAttrs(fbb, int32_t(*axis), *start).Union();
    return success();
  }
  case fb::KernelAttrs::FillAttrs: {
    FailureOr<double> value = f64("value");
    if (failed(value))
      return failure();
    type = fb::KernelAttrs::FillAttrs;
    attrs = fb::CreateFillAttrs(fbb, *value).Union();
    return success();
  }
  case fb::KernelAttrs::LearningRateAttrs: {
    FailureOr<double> lr = f64("lr"), minRatio = f64("min_lr_ratio");
    FailureOr<int64_t> warmup = i64("warmup_steps"), total = i64("total_steps");
    FailureOr<StringAttr> schedule = getParam<StringAttr>(launch, "schedule");
    if (failed(lr) || failed(minRatio) || failed(warmup) || failed(total) || failed(schedule))
      return failure();
    type = fb::KernelAttrs::LearningRateAttrs;
    attrs = fb::CreateLearningRateAttrs(fbb, *lr, schedule->getValue() == "cosine", *warmup,
                                        *total, *minRatio)
                .Union();
    return success();
  }
  case fb::KernelAttrs::AdamWAttrs: {
    FailureOr<double> b1 = f64("beta1"), b2 = f64("beta2"), eps = f64("eps"),
                      wd = f64("weight_decay"), clip = f64("grad_clip");
    if (failed(b1) || failed(b2) || failed(eps) || failed(wd) || failed(clip))
      return failure();
    type = fb::KernelAttrs::AdamWAttrs;
    attrs = fb::CreateAdamWAttrs(fbb, *b1, *b2, *eps, *wd, *clip).Union();
    return success();
  }
  case fb::KernelAttrs::SGDAttrs: {
    FailureOr<double> momentum = f64("momentum"), wd = f64("weight_decay"),
                      clip = f64("grad_clip");
    if (failed(momentum) || failed(wd) || failed(clip))
      return failure();
    type = fb::KernelAttrs::SGDAttrs;
    attrs = fb::CreateSGDAttrs(fbb, *momentum, *wd, *clip).Union();
    return success();
  }
  case fb::KernelAttrs::DoraScaleAttrs: {
    FailureOr<double> scale = f64("scale");
    if (failed(scale))
      return failure();
    type = fb::KernelAttrs::DoraScaleAttrs;
    attrs = fb::CreateDoraScaleAttrs(fbb, *scale).Union();
    return success();
  }
  case fb::KernelAttrs::GaloreRefreshAttrs: {
    FailureOr<int64_t> rank = i64("rank"), gap = i64("update_proj_gap"), offset = i64("offset"),
                       slot = i64("slot"), power = i64("power_iterations"), seed = i64("seed");
    FailureOr<BoolAttr> left = getParam<BoolAttr>(launch, "left");
    FailureOr<StringAttr> kind = getParam<StringAttr>(launch, "projector_kind");
    if (failed(rank) || failed(gap) || failed(offset) || failed(slot) || failed(power) ||
        failed(seed) || failed(left) || failed(kind))
      return failure();
    type = fb::KernelAttrs::GaloreRefreshAttrs;
    attrs = fb::CreateGaloreRefreshAttrs(fbb, *rank, *gap, *offset, *slot, left->getValue(),
                                         kind->getValue() == "randomized", *power, *seed)
                .Union();
    return success();
  }
  case fb::KernelAttrs::GaloreProjectAttrs: {
    FailureOr<BoolAttr> left = getParam<BoolAttr>(launch, "left");
    FailureOr<BoolAttr> bf16 = getParam<BoolAttr>(launch, "bf16_operands");
    if (failed(left) || failed(bf16))
      return failure();
    type = fb::KernelAttrs::GaloreProjectAttrs;
    attrs = fb::CreateGaloreProjectAttrs(fbb, left->getValue(), bf16->getValue()).Union();
    return success();
  }
  case fb::KernelAttrs::GaloreAdamWAttrs: {
    FailureOr<double> b1 = f64("beta1"), b2 = f64("beta2"), eps = f64("eps"),
                      wd = f64("weight_decay"), clip = f64("grad_clip"), scale = f64("scale");
    FailureOr<BoolAttr> left = getParam<BoolAttr>(launch, "left");
    if (failed(b1) || failed(b2) || failed(eps) || failed(wd) || failed(clip) ||
        failed(scale) || failed(left))
      return failure();
    type = fb::KernelAttrs::GaloreAdamWAttrs;
    attrs = fb::CreateGaloreAdamWAttrs(fbb, *b1, *b2, *eps, *wd, *clip, *scale,
                                       left->getValue())
                .Union();
    return success();
  }
  case fb::KernelAttrs::CollectiveAttrs: {
    FailureOr<int64_t> ranks = i64("ranks");
    if (failed(ranks))
      return failure();
    // AllGather, ReduceScatter and ShardSlice have no reduction; AllReduce names its own.
    fb::CollectiveReduction reduction = fb::CollectiveReduction::Sum;
    if (auto name = launch.getParams().getAs<StringAttr>("reduction")) {
      if (name.getValue() == "l2")
        reduction = fb::CollectiveReduction::L2Norm;
      else if (name.getValue() == "max")
        reduction = fb::CollectiveReduction::Max;
      else if (name.getValue() != "sum")
        return launch.emitError() << "unknown reduction '" << name.getValue() << "'";
    }
    if (*ranks < 1 || *ranks > int64_t(UINT32_MAX))
      return launch.emitError() << "ranks " << *ranks << " out of range";
    type = fb::KernelAttrs::CollectiveAttrs;
    attrs = fb::CreateCollectiveAttrs(fbb, uint32_t(*ranks), reduction).Union();
    return success();
  }
  default:
    type = fb::KernelAttrs::NONE;
    return success();
  }
}

static_assert(uint8_t(fb::ElementwiseOpcode::Erf) == uint8_t(ElementwiseOpcode::Erf) &&
                  uint8_t(fb::ElementwiseOpcode::MAX) == kMaxElementwiseOpcode,
              "ElementwiseOpcode must match the plan schema");
static_assert(uint8_t(fb::DType::BF16) == uint8_t(ElementwiseType::BF16) &&
                  uint8_t(fb::DType::F16) == uint8_t(ElementwiseType::F16),
              "ElementwiseType must match the plan schema's DType");

/// The plan's generated kernels, one per kernel name, in order of first launch.
class GeneratedKernels {
public:
  explicit GeneratedKernels(flatbuffers::FlatBufferBuilder &fbb) : fbb(fbb) {}

  /// The index of the kernel a fused_elementwise launch runs, added on its first launch.
  FailureOr<uint32_t> add(plan::LaunchOp launch, StringRef target) {
    FailureOr<StringAttr> name = getParam<StringAttr>(launch, "generated_kernel");
    if (failed(name))
      return launch.emitError("run bonsai-generate-elementwise-kernels before emitting a plan");
    auto encoded = launch.getParams().getAs<DenseI32ArrayAttr>("program");
    if (!encoded)
      return launch.emitError() << "kernel '" << name->getValue() << "' has no program";
    std::string error;
    std::optional<ElementwiseProgram> program = ElementwiseProgram::decode(encoded, error);
    if (!program)
      return launch.emitError() << "kernel '" << name->getValue()
                                << "': malformed program (" << error << ")";
    auto elementType = [](Value v) {
      return getDType(cast<MemRefType>(v.getType()).getElementType());
    };
    if (program->inputs.size() != launch.getIns().size() ||
        program->outputs.size() != launch.getOuts().size())
      return launch.emitError() << "kernel '" << name->getValue() << "': its program has "
                                << program->inputs.size() << " inputs and "
                                << program->outputs.size() << " outputs, the launch "
                                << launch.getIns().size() << " and " << launch.getOuts().size();
    for (auto [type, input] : llvm::zip(program->inputs, launch.getIns()))
      if (elementType(input) != fb::DType(type))
        return launch.emitError() << "kernel '" << name->getValue()
                                  << "': an input's element type differs from its program's";
    auto ptx = launch.getParams().getAs<StringAttr>("ptx");
    auto arch = launch.getParams().getAs<StringAttr>("arch");
    if (target.starts_with("sm_") && (!ptx || !arch || arch.getValue() != target))
      return launch.emitError() << "kernel '" << name->getValue() << "' has no PTX for "
                                << target << ": run bonsai-generate-elementwise-kernels with "
                                   "target="
                                << target;
    auto [it, inserted] = index.try_emplace(name->getValue(), kernels.size());
    if (!inserted)
      return it->second;
    std::vector<fb::DType> inputs;
    for (ElementwiseType type : program->inputs)
      inputs.push_back(fb::DType(type));
    std::vector<fb::ElementwiseInstruction> instructions;
    for (const ElementwiseInstruction &inst : program->instructions)
      instructions.emplace_back(fb::ElementwiseOpcode(inst.opcode), fb::DType(inst.type),
                                inst.a, inst.b, inst.imm);
    std::vector<uint16_t> outputs(program->outputs.begin(), program->outputs.end());
    auto encodedProgram =
        fb::CreateElementwiseProgramDirect(fbb, &inputs, &instructions, &outputs);
    kernels.push_back(fb::CreateGeneratedKernelDirect(
        fbb, name->getValue().str().c_str(), encodedProgram,
        ptx ? ptx.getValue().str().c_str() : nullptr,
        arch ? arch.getValue().str().c_str() : nullptr));
    return it->second;
  }

  /// The table for Plan.generated_kernels (null when there are none).
  std::vector<flatbuffers::Offset<fb::GeneratedKernel>> *get() {
    return kernels.empty() ? nullptr : &kernels;
  }

private:
  flatbuffers::FlatBufferBuilder &fbb;
  std::vector<flatbuffers::Offset<fb::GeneratedKernel>> kernels;
  llvm::StringMap<uint32_t> index;
};
} // namespace

LogicalResult mlir::bonsai::emitPlan(plan::StepOp step, std::string &bytes,
                                     const PlanTargetInfo &info) {
  flatbuffers::FlatBufferBuilder fbb(1 << 20);
  Block &body = step.getBody().front();

  llvm::StringMap<uint32_t> arenaIndex;
  std::vector<flatbuffers::Offset<fb::Arena>> arenas;
  for (auto arena : body.getOps<plan::ArenaOp>()) {
    arenaIndex[arena.getSymName()] = arenas.size();
    arenas.push_back(fb::CreateArenaDirect(
        fbb, arena.getSymName().str().c_str(),
        arena.getSpace() == plan::MemorySpace::Device ? fb::MemorySpace::Device
                                                      : fb::MemorySpace::PinnedHost,
        arena.getLifetime() == plan::Lifetime::Persistent ? fb::Lifetime::Persistent
                                                          : fb::Lifetime::Step,
        arena.getSizeAttr().getInt(), arena.getAlignmentAttr().getInt()));
  }

  // Tensors: one per buffer and one per view, in IR order.
  llvm::DenseMap<Value, uint32_t> tensorIndex;
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  std::vector<std::pair<int64_t, uint32_t>> inputs;
  std::optional<uint32_t> loss;
  llvm::StringMap<uint32_t> parameterIndex;
  auto addTensor = [&](Operation *op, Value value, plan::BufferOp buffer, StringRef name,
                       fb::TensorRole role) -> LogicalResult {
    auto type = cast<MemRefType>(value.getType());
    std::optional<fb::DType> dtype = getDType(type.getElementType());
    if (!dtype)
      return op->emitError() << "element type " << type.getElementType()
                             << " has no encoding in the plan format";
    if (!buffer.getOffsetAttr())
      return buffer.emitError() << "buffer '" << buffer.getName()
                                << "' has no offset: run bonsai-plan-memory first";
    std::vector<int64_t> shape(type.getShape().begin(), type.getShape().end());
    // Persistent state other than parameters starts zeroed, or as a copy of a parameter.
    fb::TensorInit init = fb::TensorInit::None;
    uint32_t initSource = 0;
    if (value == buffer.getResult() && (role == fb::TensorRole::Gradient ||
                                        role == fb::TensorRole::OptimizerState)) {
      init = fb::TensorInit::Zeros;
      if (StringAttr source = buffer.getCopyOfAttr()) {
        auto it = parameterIndex.find(source.getValue());
        if (it == parameterIndex.end())
          return buffer.emitError() << "'" << buffer.getName() << "' is a copy of '"
                                    << source.getValue()
                                    << "', which is not a parameter declared before it";
        init = fb::TensorInit::CopyOf;
        initSource = it->second;
      }
    }
    // Adapter parameters (bonsai-insert-lora) carry the initializer the runtime applies when
    // the weights file does not hold them.
    if (auto rule = buffer->getAttrOfType<StringAttr>("bonsai.init");
        rule && value == buffer.getResult()) {
      std::optional<fb::TensorInit> parsed =
          llvm::StringSwitch<std::optional<fb::TensorInit>>(rule.getValue())
              .Case("kaiming_uniform", fb::TensorInit::KaimingUniform)
              .Case("zeros", fb::TensorInit::Zeros)
              .Case("row_norm", fb::TensorInit::RowNorm)
              .Default(std::nullopt);
      if (!parsed)
        return buffer.emitError() << "unknown initializer '" << rule.getValue() << "' of '"
                                  << buffer.getName() << "'";
      init = *parsed;
      if (init == fb::TensorInit::RowNorm) {
        auto source = buffer->getAttrOfType<StringAttr>("bonsai.init_source");
        auto it = source ? parameterIndex.find(source.getValue()) : parameterIndex.end();
        if (it == parameterIndex.end())
          return buffer.emitError() << "'" << buffer.getName()
                                    << "' is initialized from the row norms of a parameter "
                                       "not declared before it";
        initSource = it->second;
      }
    }
    if (role == fb::TensorRole::Parameter)
      parameterIndex[name] = tensors.size();
    tensorIndex[value] = tensors.size();
    // NF4 tensors carry their block sizes: the runtime sizes, binds and dequantizes by them.
    auto nf4 = dyn_cast<NF4Type>(type.getElementType());
    // A rank's share of a sharded tensor (bonsai-shard) carries the whole tensor's shape: the
    // runtime binds and saves the rank's slice of it. A share of an NF4 tensor's storage
    // bytes (u8) carries the whole tensor's block sizes too.
    uint32_t shardRanks = 0;
    std::vector<int64_t> fullShape;
    if (auto sharding = buffer->getAttrOfType<ShardingAttr>("bonsai.sharding");
        sharding && value == buffer.getResult()) {
      shardRanks = uint32_t(sharding.getRanks());
      fullShape.assign(sharding.getShape().begin(), sharding.getShape().end());
      if (auto storage = dyn_cast_if_present<NF4Type>(sharding.getStorage()))
        nf4 = storage;
      else if (sharding.getStorage())
        return buffer.emitError() << "'" << buffer.getName() << "' is a share of the storage of "
                                  << sharding.getStorage()
                                  << ", which the plan format cannot describe";
    }
    tensors.push_back(fb::CreateTensorDirect(
        fbb, name.str().c_str(), *dtype, &shape, role, buffer.getTrainable() && value == buffer,
        arenaIndex.lookup(buffer.getArena()), buffer.getOffsetAttr().getInt(),
        plan::getMemRefBytes(type), init, initSource, nf4 ? nf4.getBlockSize() : 0,
        nf4 ? nf4.getDoubleQuantBlockSize() : 0, shardRanks,
        fullShape.empty() ? nullptr : &fullShape));
    return success();
  };

  std::vector<flatbuffers::Offset<fb::Kernel>> kernels;
  GeneratedKernels generated(fbb);
  for (Operation &op : body) {
    if (auto buffer = dyn_cast<plan::BufferOp>(op)) {
      if (failed(addTensor(&op, buffer.getResult(), buffer, buffer.getName(),
                           getRole(buffer.getRole()))))
        return failure();
      if (buffer.getRole() == plan::BufferRole::Input)
        inputs.push_back({buffer.getInputIndexAttr().getInt(), tensorIndex[buffer.getResult()]});
      if (buffer.getRole() == plan::BufferRole::Loss) {
        if (loss)
          return buffer.emitError("a step has one loss; this is the second");
        loss = tensorIndex[buffer.getResult()];
      }
      continue;
    }
    if (auto view = dyn_cast<plan::ViewOp>(op)) {
      plan::BufferOp buffer = plan::getUnderlyingBuffer(view.getSource());
      if (!buffer)
        return view.emitError("views no buffer");
      // A view is another shape of the same bytes. The runtime binds, saves and reports
      // tensors by name and role through their buffer, so every view is a plain activation.
      std::string name = (buffer.getName() + ".view" + Twine(tensors.size())).str();
      if (failed(addTensor(&op, view.getResult(), buffer, name, fb::TensorRole::Activation)))
        return failure();
      continue;
    }
    // A retain only shaped the memory plan; the runtime derives the streams' order itself.
    if (isa<plan::ArenaOp, plan::RetainOp>(op))
      continue;
    auto launch = dyn_cast<plan::LaunchOp>(op);
    if (!launch)
      return op.emitError() << "'" << op.getName()
                            << "' is not supported by the plan format version " << kPlanVersion;
    std::optional<fb::KernelKind> kind = getKernelKind(launch.getKernel());
    if (!kind)
      return launch.emitError() << "kernel '" << launch.getKernel()
                                << "' has no runtime implementation";
    std::vector<uint32_t> ins, outs;
    for (Value v : launch.getIns())
      ins.push_back(tensorIndex.lookup(v));
    for (Value v : launch.getOuts())
      outs.push_back(tensorIndex.lookup(v));
    fb::KernelAttrs attrsType = fb::KernelAttrs::NONE;
    flatbuffers::Offset<void> attrs;
    if (*kind == fb::KernelKind::FusedElementwise) {
      FailureOr<uint32_t> kernel = generated.add(launch, step.getTarget());
      if (failed(kernel))
        return failure();
      attrsType = fb::KernelAttrs::GeneratedKernelAttrs;
      attrs = fb::CreateGeneratedKernelAttrs(fbb, *kernel).Union();
    } else if (failed(packAttrs(fbb, launch, *kind, attrsType, attrs))) {
      return failure();
    }
    std::string location;
    llvm::raw_string_ostream os(location);
    launch.getLoc().print(os);
    kernels.push_back(fb::CreateKernelDirect(
        fbb, *kind, &ins, &outs, attrsType, attrs, uint8_t(launch.getStreamAttr().getInt()),
        location.c_str(), static_cast<fb::Phase>(launch.getPhase())));
  }
  if (!loss)
    return step.emitError("the step has no loss buffer");
  llvm::sort(inputs);
  std::vector<uint32_t> inputIndices;
  for (auto [position, index] : inputs)
    inputIndices.push_back(index);

  // Adapters: the names bonsai-insert-lora recorded, resolved to tensor indices.
  std::vector<flatbuffers::Offset<fb::Adapter>> adapters;
  auto lookupParam = [&](DictionaryAttr entry, StringRef key,
                         uint32_t &index) -> LogicalResult {
    auto name = entry.getAs<StringAttr>(key);
    auto it = name ? parameterIndex.find(name.getValue()) : parameterIndex.end();
    if (it == parameterIndex.end())
      return step.emitError() << "adapter " << entry << ": '" << key
                              << "' does not name a parameter of the step";
    index = it->second;
    return success();
  };
  if (auto list = step->getAttrOfType<ArrayAttr>("bonsai.adapters")) {
    for (Attribute attr : list) {
      auto entry = dyn_cast<DictionaryAttr>(attr);
      auto module = entry ? entry.getAs<StringAttr>("module") : StringAttr();
      auto rank = entry ? entry.getAs<IntegerAttr>("rank") : IntegerAttr();
      auto alpha = entry ? entry.getAs<FloatAttr>("alpha") : FloatAttr();
      if (!module || !rank || !alpha)
        return step.emitError() << "malformed adapter record " << attr
                                << " (needs module, rank and alpha)";
      uint32_t base, a, b, magnitude;
      if (failed(lookupParam(entry, "base", base)) || failed(lookupParam(entry, "lora_a", a)) ||
          failed(lookupParam(entry, "lora_b", b)))
        return failure();
      int32_t magnitudeIndex = -1;
      if (entry.get("magnitude")) {
        if (failed(lookupParam(entry, "magnitude", magnitude)))
          return failure();
        magnitudeIndex = int32_t(magnitude);
      }
      adapters.push_back(fb::CreateAdapterDirect(fbb, base, a, b, magnitudeIndex,
                                                 uint32_t(rank.getInt()),
                                                 alpha.getValueAsDouble(),
                                                 module.getValue().str().c_str()));
    }
  }
  std::vector<flatbuffers::Offset<flatbuffers::String>> adapterTargets;
  if (auto list = step->getAttrOfType<ArrayAttr>("bonsai.adapter_targets"))
    for (auto target : list.getAsValueRange<StringAttr>())
      adapterTargets.push_back(fbb.CreateString(target.str()));

  PlanMemorySummary summary = summarizePlanMemory(step);
  // The plan's classes are whole, wherever they live; the peaks say where.
  auto memory = fb::CreateMemorySummary(
      fbb, summary.weights + summary.hostWeights, summary.gradients + summary.hostGradients,
      summary.optimizerState + summary.hostOptimizerState, summary.activations, summary.workspace,
      summary.inputs, summary.peakDevice, summary.peakHost);
  auto seconds = [&](StringRef name) {
    auto attr = step->getAttrOfType<FloatAttr>(name);
    return attr ? attr.getValueAsDouble() : 0.0;
  };
  auto target = fb::CreateTargetDirect(
      fbb, step.getTarget().str().c_str(), step.getDeviceMemoryAttr().getInt(), info.linkGBs,
      seconds("bonsai.predicted_step_seconds"), seconds("bonsai.predicted_exposed_seconds"));
  // Data-parallel ranks (bonsai-shard): every rank runs this plan.
  uint32_t ranks = 0;
  std::string shardStrategy;
  if (auto attr = step->getAttrOfType<IntegerAttr>("bonsai.ranks"))
    ranks = uint32_t(attr.getInt());
  if (auto attr = step->getAttrOfType<StringAttr>("bonsai.shard_strategy"))
    shardStrategy = attr.str();
  // The ring's ranks (bonsai-ring) among them.
  uint32_t ringRanks = 0;
  if (auto attr = step->getAttrOfType<IntegerAttr>("bonsai.ring_ranks"))
    ringRanks = uint32_t(attr.getInt());
  auto root = fb::CreatePlanDirect(
      fbb, kPlanVersion, step.getSymName().str().c_str(), target, &arenas, &tensors, &kernels,
      &inputIndices, *loss, memory, step.getTokensPerStepAttr().getInt(),
      step.getMicroBatchesAttr().getInt(), step.getVocabSizeAttr().getInt(),
      adapters.empty() ? nullptr : &adapters, adapterTargets.empty() ? nullptr : &adapterTargets,
      generated.get(), ranks, shardStrategy.empty() ? nullptr : shardStrategy.c_str(), ringRanks);
  fb::FinishPlanBuffer(fbb, root);
  bytes.assign(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fbb.GetSize());
  return success();
}
