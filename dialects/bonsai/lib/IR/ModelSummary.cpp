//===- ModelSummary.cpp - What a recipe needs to know about a model -------===//
//
// Collects parameters and linears of a model function and matches recipe target patterns
// against Hugging Face weight names.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/ModelSummary.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/Support/GlobPattern.h"

using namespace mlir;
using namespace mlir::bonsai;

/// The parameter a value is a view of: follows single-operand ops (transpose, reshape, cast,
/// dequantize) back to a `bonsai.param`, so that GPT-2's transposed Conv1D weights and QLoRA's
/// dequantized weights are still attributed to their checkpoint tensor; and a mul's left-hand
/// side of the result's shape, a weight whose rows bonsai-fuse's `dora-weight` rescales.
static ParamOp getUnderlyingParam(Value value) {
  while (Operation *def = value.getDefiningOp()) {
    if (auto param = dyn_cast<ParamOp>(def))
      return param;
    if (auto mul = dyn_cast<MulOp>(def); mul && mul.getLhs().getType() == mul.getType()) {
      value = mul.getLhs();
      continue;
    }
    if (def->getNumOperands() != 1)
      return nullptr;
    value = def->getOperand(0);
  }
  return nullptr;
}

ModelSummary::ModelSummary(Operation *function) : function(function) {
  llvm::DenseMap<Operation *, size_t> paramIndex;
  function->walk([&](ParamOp param) {
    paramIndex[param] = params.size();
    // A rank's share (bonsai-shard) stands for the whole tensor, which recipes speak of.
    RankedTensorType type = param.getResult().getType();
    if (ShardingAttr sharding = param.getShardingAttr())
      type =
          RankedTensorType::get(sharding.getShape(), sharding.getStorage() ? sharding.getStorage()
                                                                           : type.getElementType());
    params.push_back(
        {param, param.getName(), type, param.getTrainable(), param->hasAttr("bonsai.init")});
  });
  function->walk([&](Operation *op) {
    // The attention's sequence, also once bonsai-fuse has made it flash attention (of q, k
    // and v apart or packed in one tensor, whose dim 1 is the sequence too); a ring's rank
    // holds 1/ring_ranks of it (bonsai-ring), and recipes speak of the whole.
    Value query;
    std::optional<int64_t> ring;
    if (auto attention = dyn_cast<AttentionOp>(op))
      query = attention.getQuery(), ring = attention.getRingRanks();
    else if (auto flash = dyn_cast<FlashAttentionOp>(op))
      query = flash.getQuery(), ring = flash.getRingRanks();
    else if (auto packed = dyn_cast<FlashAttentionQkvOp>(op))
      query = packed.getQkv();
    if (query) {
      sequenceLength =
          cast<RankedTensorType>(query.getType()).getDimSize(1) * ring.value_or(int64_t(1));
      return;
    }
    // The LM head is a linear of the model also once bonsai-fuse has made it part of a
    // linear_cross_entropy, and so are a linear fused with its GELU or with an add, and a
    // linear bonsai-fp8 has made an FP8 GEMM, in each form bonsai-fuse gives it (recipes are
    // verified against the model after every pass).
    Value weight;
    if (auto linear = dyn_cast<LinearOp>(op))
      weight = linear.getWeight();
    else if (auto head = dyn_cast<LinearCrossEntropyOp>(op))
      weight = head.getWeight();
    else if (auto gelu = dyn_cast<LinearGeLUOp>(op))
      weight = gelu.getWeight();
    else if (auto sum = dyn_cast<LinearAddOp>(op))
      weight = sum.getWeight();
    else if (auto fp8 = dyn_cast<Fp8LinearOp>(op))
      weight = fp8.getWeight();
    else if (auto shared = dyn_cast<Fp8LinearSharedInputOp>(op))
      weight = shared.getWeight();
    else if (auto withCast = dyn_cast<Fp8LinearWithInputCastOp>(op))
      weight = withCast.getWeight();
    if (!weight)
      return;
    ParamOp param = getUnderlyingParam(weight);
    if (!param)
      return;
    auto weightType = cast<RankedTensorType>(weight.getType());
    LinearSummary summary;
    summary.op = op;
    summary.weight = &params[paramIndex.lookup(param)];
    StringRef name = param.getName();
    summary.modulePath = name.ends_with(".weight") ? name.drop_back(7) : name;
    summary.outFeatures = weightType.getDimSize(0);
    summary.inFeatures = weightType.getDimSize(1);
    linears.push_back(summary);
  });
}

bool mlir::bonsai::matchesTargetPattern(StringRef pattern, StringRef modulePath,
                                        StringRef weightName) {
  if (pattern.find_first_of("*?[") != StringRef::npos) {
    llvm::Expected<llvm::GlobPattern> glob = llvm::GlobPattern::create(pattern);
    if (!glob) {
      llvm::consumeError(glob.takeError());
      return false;
    }
    return glob->match(weightName) || glob->match(modulePath);
  }
  return modulePath == pattern ||
         (modulePath.ends_with(pattern) &&
          modulePath.drop_back(pattern.size()).ends_with("."));
}

SmallVector<const LinearSummary *> ModelSummary::matchLinears(StringRef pattern) const {
  SmallVector<const LinearSummary *> matched;
  for (const LinearSummary &linear : linears)
    if (matchesTargetPattern(pattern, linear.modulePath, linear.weight->name))
      matched.push_back(&linear);
  return matched;
}

SmallVector<const LinearSummary *>
ModelSummary::matchLinears(ArrayRef<StringRef> patterns) const {
  SmallVector<const LinearSummary *> matched;
  for (const LinearSummary &linear : linears)
    if (llvm::any_of(patterns, [&](StringRef p) {
          return matchesTargetPattern(p, linear.modulePath, linear.weight->name);
        }))
      matched.push_back(&linear);
  return matched;
}

LogicalResult mlir::bonsai::verifyLoraTargets(function_ref<InFlightDiagnostic()> emitError,
                                              ArrayRef<StringRef> targets, int64_t rank,
                                              bool dora, const ModelSummary &model) {
  if (rank <= 0)
    return emitError() << "rank must be positive, got " << rank;
  for (StringRef pattern : targets) {
    if (!model.matchLinears(pattern).empty())
      continue;
    InFlightDiagnostic diag = emitError() << "target '" << pattern
                                          << "' matches no linear of the model";
    if (!model.getLinears().empty())
      diag << " (linear weights are named like '" << model.getLinears().front().weight->name
           << "')";
    return diag;
  }
  for (const LinearSummary *linear : model.matchLinears(targets)) {
    StringRef name = linear->weight->name;
    int64_t smaller = std::min(linear->inFeatures, linear->outFeatures);
    if (rank >= smaller)
      return emitError() << "rank " << rank << " is not below min(in, out) = " << smaller
                         << " of weight '" << name
                         << "': the adapter would be as large as the weight";
    // The weight reaches the linear through single-use views only, and the parameter has no
    // other user: an adapter on a tied weight (an LM head tied to the embeddings) would change
    // the head but not the embedding lookup, silently untying them.
    // A linear or a fused LM head: both read the weight as operand 1.
    Operation *lin = linear->op;
    Value linWeight = lin->getOperand(1), value = linWeight;
    Operation *consumer = lin;
    bool directOrConverted = true;
    while (true) {
      for (OpOperand &use : value.getUses()) {
        if (use.getOwner() == consumer && use.getOperandNumber() == (consumer == lin ? 1u : 0u))
          continue;
        InFlightDiagnostic diag = emitError()
                                  << "weight '" << name
                                  << "' has another use (a tied or shared weight); an adapter "
                                     "on one use would untie them: leave it out of the targets";
        diag.attachNote(use.getOwner()->getLoc()) << "the other use";
        return diag;
      }
      Operation *def = value.getDefiningOp();
      if (!def || isa<ParamOp>(def))
        break;
      if (!isa<CastOp, DequantizeOp>(def))
        directOrConverted = false;
      consumer = def;
      value = def->getOperand(0);
    }
    bool layoutAsStored = directOrConverted && linear->weight->type.getShape() ==
                                                   cast<RankedTensorType>(linWeight.getType())
                                                       .getShape();
    // The plan's Adapter table, the runtime's checks and PEFT's export all take the base in
    // [out, in]; GPT-2's Conv1D weights are stored [in, out] and transposed by the model
    // (PEFT's fan_in_fan_out), which none of them expresses yet.
    if (!dora && !layoutAsStored)
      return emitError() << "LoRA on weight '" << name
                         << "', which the linear reads through a transpose or reshape (GPT-2's "
                            "Conv1D [in, out] layout), is not supported: adapters need the "
                            "weight stored in [out, in] layout";
    if (!dora)
      continue;
    if (auto plain = dyn_cast<LinearOp>(lin); plain && plain.getBias())
      return emitError() << "DoRA on weight '" << name
                         << "', whose linear has a bias, is not supported: the magnitude "
                            "would scale the bias too";
    if (!layoutAsStored)
      return emitError() << "DoRA needs weight '" << name
                         << "' in [out, in] layout (the magnitude is initialized to its row "
                            "norms), but the linear reads it through a transpose or reshape";
  }
  return success();
}
