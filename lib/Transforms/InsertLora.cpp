//===- InsertLora.cpp - LoRA and DoRA adapters on targeted linears --------===//
//
// The `bonsai-insert-lora` pass (see Passes.td and docs/lora.md). The adapter path is built
// from model ops that already have gradient rules (linear, mul, add, fill) plus one op of its
// own, bonsai.dora_scale, whose rule treats DoRA's norm as a constant. The new parameters
// carry their initializers (`bonsai.init`), and the function records its adapters
// (`bonsai.adapters`, `bonsai.adapter_targets`) for the plan's metadata.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Dialect/Bonsai/IR/ModelSummary.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIINSERTLORAPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// What to insert: the recipe's bonsai.lora or the pass options.
struct LoraConfig {
  int64_t rank = 0;
  double alpha = 0;
  bool dora = false;
  SmallVector<std::string> targets;
  /// Where diagnostics about the configuration point.
  Location loc;
};

struct InsertLoraPass : impl::BonsaiInsertLoraPassBase<InsertLoraPass> {
  using Base::Base;

  /// The configuration: the options when they name targets, else the module's bonsai.lora
  /// directive (none: nothing to do).
  FailureOr<std::optional<LoraConfig>> getConfig() {
    ModuleOp module = getOperation();
    if (!targets.empty()) {
      LoraConfig config{rank, alpha > 0 ? double(alpha) : double(rank), dora,
                        {targets.begin(), targets.end()}, module.getLoc()};
      if (!(config.alpha > 0)) {
        module.emitError() << "bonsai-insert-lora: alpha must be positive, got " << config.alpha;
        return failure();
      }
      return std::optional<LoraConfig>(config);
    }
    SmallVector<LoraDirectiveOp> found;
    module.walk([&](LoraDirectiveOp op) { found.push_back(op); });
    if (found.empty())
      return std::optional<LoraConfig>();
    if (found.size() > 1) {
      found[1].emitError("bonsai-insert-lora applies one bonsai.lora directive; the module has "
                         "another")
          .attachNote(found[0].getLoc())
          << "the first one";
      return failure();
    }
    LoraDirectiveOp directive = found.front();
    LoraConfig config{int64_t(directive.getRank()), directive.getAlpha().convertToDouble(),
                      directive.getDora(), {}, directive.getLoc()};
    for (StringRef t : directive.getTargets().getAsValueRange<StringAttr>())
      config.targets.push_back(t.str());
    return std::optional<LoraConfig>(config);
  }

  LogicalResult adapt(func::FuncOp function, const LoraConfig &config) {
    MLIRContext *ctx = &getContext();
    ModelSummary model(function);
    SmallVector<StringRef> patterns(config.targets.begin(), config.targets.end());
    auto emit = [&] { return emitError(config.loc) << "bonsai-insert-lora: "; };
    if (failed(verifyLoraTargets(emit, patterns, config.rank, config.dora, model)))
      return failure();
    llvm::StringSet<> names;
    for (const ParamSummary &param : model.getParams())
      names.insert(param.name);

    // PEFT trains the adapters alone: every parameter of the base model is frozen.
    for (const ParamSummary &param : model.getParams())
      if (auto op = cast<ParamOp>(param.op); op.getTrainable()) {
        op.setTrainable(false);
        ++numFrozen;
      }

    Block &body = function.getBody().front();
    OpBuilder builder(ctx);
    double scale = config.alpha / double(config.rank);
    // One scalar per element type holds the scale; the mul broadcasts it.
    llvm::DenseMap<Type, Value> scales;
    auto getScale = [&](Type element) {
      Value &value = scales[element];
      if (!value) {
        OpBuilder::InsertionGuard guard(builder);
        builder.setInsertionPointToStart(&body);
        value = FillOp::create(builder, function.getLoc(), RankedTensorType::get({}, element),
                               builder.getF64FloatAttr(scale));
      }
      return value;
    };

    SmallVector<Attribute> adapters;
    for (const LinearSummary *linear : model.matchLinears(patterns)) {
      auto lin = dyn_cast<LinearOp>(linear->op);
      if (!lin)
        return linear->op->emitError()
               << "'" << linear->modulePath << "' is already fused with its loss "
               << "(bonsai-fuse): insert adapters before fusing";
      Location loc = lin.getLoc();
      StringRef module = linear->modulePath;
      auto weightType = cast<RankedTensorType>(lin.getWeight().getType());
      Type element = weightType.getElementType();
      int64_t out = linear->outFeatures, in = linear->inFeatures, r = config.rank;
      std::string aName = (module + ".lora_A.weight").str();
      std::string bName = (module + ".lora_B.weight").str();
      std::string mName = (module + ".lora_magnitude_vector").str();
      for (StringRef name : {StringRef(aName), StringRef(bName),
                             config.dora ? StringRef(mName) : StringRef()}) {
        if (name.empty())
          continue;
        if (!names.insert(name).second)
          return lin.emitError() << "bonsai-insert-lora: the model already declares a "
                                    "parameter named '"
                                 << name << "'";
      }

      builder.setInsertionPoint(lin);
      auto param = [&](StringRef name, ArrayRef<int64_t> shape, StringRef init) {
        auto op = ParamOp::create(builder, loc, RankedTensorType::get(shape, element),
                                  builder.getStringAttr(name), builder.getUnitAttr(),
                                  /*placement=*/nullptr, /*sharding=*/nullptr);
        op->setAttr("bonsai.init", builder.getStringAttr(init));
        adapterParams += getNumElements(op.getType());
        return op;
      };
      ParamOp a = param(aName, {r, in}, "kaiming_uniform");
      ParamOp b = param(bName, {out, r}, "zeros");
      ParamOp m;
      if (config.dora) {
        m = param(mName, {out}, "row_norm");
        m->setAttr("bonsai.init_source", builder.getStringAttr(linear->weight->name));
      }

      // y' = y + s·(x·Aᵀ)·Bᵀ, the scale on the rank-r intermediate; DoRA: y' ⊙ m/‖W+sBA‖.
      builder.setInsertionPointAfter(lin);
      Value x = lin.getInput();
      auto inputType = cast<RankedTensorType>(x.getType());
      SmallVector<int64_t> lowShape(inputType.getShape().drop_back());
      lowShape.push_back(r);
      auto lowType = RankedTensorType::get(lowShape, element);
      Value xa = LinearOp::create(builder, loc, lowType, x, a, Value());
      Value xs = MulOp::create(builder, loc, lowType, xa, getScale(element));
      Type yType = lin.getResult().getType();
      Value delta = LinearOp::create(builder, loc, yType, xs, b, Value());
      auto sum = AddOp::create(builder, loc, yType, lin.getResult(), delta);
      Value adapted = sum;
      if (config.dora) {
        Value rowScale = DoraScaleOp::create(builder, loc, m.getType(), m, lin.getWeight(), a,
                                             b, builder.getF64FloatAttr(scale));
        adapted = MulOp::create(builder, loc, yType, adapted, rowScale);
      }
      // Every reader of y now reads the adapted value; the sum itself still reads y.
      lin.getResult().replaceAllUsesExcept(adapted, sum);
      SmallVector<NamedAttribute> entry = {
          builder.getNamedAttr("module", builder.getStringAttr(module)),
          builder.getNamedAttr("base", builder.getStringAttr(linear->weight->name)),
          builder.getNamedAttr("lora_a", builder.getStringAttr(aName)),
          builder.getNamedAttr("lora_b", builder.getStringAttr(bName)),
          builder.getNamedAttr("rank", builder.getI64IntegerAttr(r)),
          builder.getNamedAttr("alpha", builder.getF64FloatAttr(config.alpha))};
      if (config.dora)
        entry.push_back(builder.getNamedAttr("magnitude", builder.getStringAttr(mName)));
      adapters.push_back(builder.getDictionaryAttr(entry));
      ++numAdapters;
    }
    SmallVector<Attribute> targetAttrs;
    for (StringRef t : patterns)
      targetAttrs.push_back(builder.getStringAttr(t));
    function->setAttr("bonsai.adapters", builder.getArrayAttr(adapters));
    function->setAttr("bonsai.adapter_targets", builder.getArrayAttr(targetAttrs));
    return success();
  }

  void runOnOperation() override {
    FailureOr<std::optional<LoraConfig>> config = getConfig();
    if (failed(config))
      return signalPassFailure();
    if (!*config)
      return;
    for (auto function : getOperation().getOps<func::FuncOp>()) {
      if (function.isExternal() || function.getBody().getOps<ParamOp>().empty())
        continue;
      if (function->hasAttr("bonsai.adapters")) {
        function.emitError("bonsai-insert-lora: the function already has adapters");
        return signalPassFailure();
      }
      if (failed(adapt(function, **config)))
        return signalPassFailure();
    }
  }
};
} // namespace
} // namespace mlir::bonsai
