//===- Ring.cpp - The sequence split over the ranks of a ring -------------===//
//
// The `bonsai-ring` pass (see Passes.td and docs/ring-attention.md). Every rank of the ring
// runs the same model on its share of each row's tokens: the sequence of S tokens is cut into
// 2N chunks of C = S/2N and rank r keeps chunks r and 2N-1-r (the zigzag layout), so that
// every rank has as much causal attention work as any other. Position-wise ops (embeddings,
// linears, norms, elementwise ops, the loss) run unchanged on the share; RoPE reads each
// token's position in the whole sequence from the `positions` input; attention reads every
// rank's keys and values, passed around the ring (`ring_ranks` on bonsai.attention, carried
// by its gradient and its flash form). What mixes tokens any other way is refused.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Target/TargetProfile.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"

#include <cmath>

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAIRINGPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// The share of the sequence every rank holds: the token dimensions [batch, seq] of the
/// model's rows and seq / ranks.
struct RingShape {
  int64_t batch = 0, seq = 0, ranks = 0;
  int64_t localSeq() const { return seq / ranks; }
};

/// Whether `type` is a tensor over the rows' tokens: [batch, seq, ...].
bool hasTokenDims(Type type, const RingShape &shape) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  return tensor && tensor.getRank() >= 2 && tensor.getDimSize(0) == shape.batch &&
         tensor.getDimSize(1) == shape.seq;
}

/// `type` as the IR prints it, for messages.
std::string typeString(Type type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << type;
  return text;
}

/// `type` with its sequence dimension cut to one rank's share.
RankedTensorType localType(Type type, const RingShape &shape) {
  auto tensor = cast<RankedTensorType>(type);
  SmallVector<int64_t> dims(tensor.getShape());
  dims[1] = shape.localSeq();
  return tensor.clone(dims);
}

struct RingPass : impl::BonsaiRingPassBase<RingPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<RingDirectiveOp> directives;
    module.walk([&](RingDirectiveOp op) { directives.push_back(op); });
    if (directives.empty())
      return;
    if (directives.size() > 1) {
      directives[1].emitError() << "a recipe splits its sequence once: found " << directives.size()
                                << " bonsai.ring directives";
      return signalPassFailure();
    }
    RingDirectiveOp directive = directives.front();
    for (auto function : llvm::to_vector(module.getOps<func::FuncOp>()))
      if (!function.isExternal() && !function.getBody().getOps<ParamOp>().empty())
        if (failed(splitFunction(function, directive)))
          return signalPassFailure();
  }

  /// Why `op`, which reads a value over the ring's share of the tokens, cannot run on the
  /// share as it is (empty when it can): it must compute each token's results from that
  /// token alone, reading nothing else that varies along the sequence.
  std::string notPositionWise(Operation *op, const llvm::DenseSet<Value> &split,
                              const RingShape &shape) {
    // The loss is a mean over the tokens: each rank's is over its share, and the runtime
    // weights the shares' means by their counted tokens (docs/ring-attention.md, "Loss").
    if (isa<CrossEntropyOp>(op))
      return "";
    for (Value result : op->getResults())
      if (!hasTokenDims(result.getType(), shape))
        return "its result " + typeString(result.getType()) + " is not over the rows' tokens [" +
               std::to_string(shape.batch) + ", " + std::to_string(shape.seq) + ", ...]";
    // What this pass rewrites into ring steps.
    if (isa<AttentionOp>(op))
      return "";
    if (auto tokenwise = dyn_cast<TokenwiseOpInterface>(op))
      return tokenwise.whyNotTokenwise(
          [&](unsigned i) { return split.contains(op->getOperand(i)); });
    if (isa<ElementwiseOpInterface>(op)) {
      // Operands broadcast over the trailing dimensions: one that is not over the tokens but
      // has the whole sequence on the axis aligned with the result's (a learned position
      // table) would need its rows picked per rank.
      const int64_t rank = cast<RankedTensorType>(op->getResult(0).getType()).getRank();
      for (Value operand : op->getOperands()) {
        auto type = dyn_cast<RankedTensorType>(operand.getType());
        const int64_t seqAxis = type ? 1 - (rank - type.getRank()) : -1;
        if (!split.contains(operand) && seqAxis >= 0 && type.getDimSize(seqAxis) == shape.seq &&
            shape.seq > 1)
          return "its operand " + typeString(operand.getType()) +
                 " varies along the sequence but is not computed from the tokens (a learned "
                 "position table: ring attention needs RoPE positions)";
      }
      return "";
    }
    return "it is not known to compute each token from that token alone";
  }

  LogicalResult splitFunction(func::FuncOp function, RingDirectiveOp directive) {
    Block &body = function.getBody().front();
    if (body.getNumArguments() < 2)
      return function.emitError() << "bonsai-ring expects @" << function.getSymName()
                                  << "(%ids, %labels, ...), found " << body.getNumArguments()
                                  << " arguments";
    auto ids = dyn_cast<RankedTensorType>(body.getArgument(0).getType());
    if (!ids || ids.getRank() != 2)
      return function.emitError() << "bonsai-ring expects the ids to be [batch, seq], got "
                                  << body.getArgument(0).getType();
    RingShape shape{ids.getDimSize(0), ids.getDimSize(1), int64_t(directive.getRanks())};
    if (shape.seq % (2 * shape.ranks) != 0)
      return directive.emitError()
             << "sequence length " << shape.seq << " does not split into " << 2 * shape.ranks
             << " equal chunks (the zigzag layout gives each of the " << shape.ranks
             << " ranks two); use a length that is a multiple of " << 2 * shape.ranks;

    // Every input over the tokens is the rank's share: the loader hands each rank its chunks.
    llvm::DenseSet<Value> split;
    for (BlockArgument arg : body.getArguments())
      if (hasTokenDims(arg.getType(), shape)) {
        arg.setType(localType(arg.getType(), shape));
        split.insert(arg);
      }

    // RoPE needs each token's position in the whole sequence, which a share no longer has
    // in its index: a model without `positions` gets the input (the loader fills it with
    // each token's index, or its position in its document for packed rows).
    Value positions;
    for (Operation &op : body)
      if (auto rope = dyn_cast<RoPEOp>(op); rope && rope.getPositions())
        positions = rope.getPositions();
    int64_t attentions = 0, ropes = 0;
    AttentionOp firstAttention;
    for (Operation &op : llvm::make_early_inc_range(body)) {
      if (llvm::none_of(op.getOperands(), [&](Value v) { return split.contains(v); }))
        continue;
      if (auto rope = dyn_cast<RoPEOp>(op); rope && !rope.getPositions()) {
        if (!positions) {
          auto type = RankedTensorType::get({shape.batch, shape.localSeq()},
                                            IntegerType::get(&getContext(), 32));
          positions = body.addArgument(type, function.getLoc());
          split.insert(positions);
          SmallVector<Type> inputs(body.getArgumentTypes());
          function.setFunctionType(
              FunctionType::get(&getContext(), inputs, function.getFunctionType().getResults()));
        }
        rope.getPositionsMutable().assign(positions);
        ++ropes;
      }
      std::string why = notPositionWise(&op, split, shape);
      if (!why.empty())
        return op.emitError() << "bonsai-ring cannot split the sequence through '" << op.getName()
                              << "': " << why;
      if (auto attention = dyn_cast<AttentionOp>(op)) {
        attention.setRingRanksAttr(
            IntegerAttr::get(IntegerType::get(&getContext(), 64), shape.ranks));
        if (!firstAttention)
          firstAttention = attention;
        ++attentions;
      }
      for (Value result : op.getResults())
        if (hasTokenDims(result.getType(), shape)) {
          result.setType(localType(result.getType(), shape));
          split.insert(result);
        }
    }
    if (attentions == 0)
      return directive.emitError() << "ring attention needs a model with attention: @"
                                   << function.getSymName() << " has none";
    // The function's inputs changed type with their block arguments.
    function.setFunctionType(FunctionType::get(&getContext(), body.getArgumentTypes(),
                                               function.getFunctionType().getResults()));
    OpBuilder builder(&getContext());
    function->setAttr("bonsai.ranks", builder.getI64IntegerAttr(shape.ranks));
    function->setAttr("bonsai.ring_ranks", builder.getI64IntegerAttr(shape.ranks));
    std::string overlap = predictOverlap(directive, firstAttention, shape);
    emitRemark(directive.getLoc())
        << "ring: the sequence of " << shape.seq << " tokens split over " << shape.ranks
        << " ranks (" << shape.localSeq() << " each, zigzag chunks of "
        << shape.seq / (2 * shape.ranks) << "); " << attentions
        << (attentions == 1 ? " attention passes" : " attentions pass")
        << " key/value blocks around the ring"
        << (ropes ? "; RoPE reads each token's position from the 'positions' input" : "")
        << overlap;
    return success();
  }

  /// The overlap condition on the target (docs/ring-attention.md, "Overlap"), as a clause of
  /// the summary remark; warns when the recipe's tokens per rank are below it.
  std::string predictOverlap(RingDirectiveOp directive, AttentionOp attention,
                             const RingShape &shape) {
    std::optional<TargetProfile> profile = lookupTargetProfile(target);
    double rate =
        profile ? (profile->attentionTflops > 0 ? profile->attentionTflops : profile->bf16Tflops)
                : 0;
    double link = profile ? profile->linkBandwidthGBs : 0;
    if (rate <= 0 || link <= 0)
      return "; the target '" + target +
             "' has no link bandwidth or attention rate, so the overlap is not predicted";
    auto q = cast<RankedTensorType>(attention.getQuery().getType());
    auto k = cast<RankedTensorType>(attention.getKey().getType());
    const double heads = double(q.getDimSize(2)), kvHeads = double(k.getDimSize(2));
    const double elementBytes = double(k.getElementTypeBitWidth()) / 8;
    // Per step and per token of the block, per batch row and head dim: a causal step scores
    // half of the L x L pairs (zigzag), a full one all of them; 4 FLOPs per pair and head dim
    // forward, 10 backward. The forward sends the block's k and v, the backward also their
    // fp32 gradients.
    const double pairs = attention.getCausal() ? 0.5 : 1.0;
    const double seconds = 1.0 / (rate * 1e12), perByte = 1.0 / (link * 1e9);
    auto smallest = [&](double flopsPerPair, double bytesPerElement) {
      // flops(L) = flopsPerPair * heads * pairs * L^2 * seconds >= 2 * kvHeads * bytes * L.
      return 2 * kvHeads * bytesPerElement * perByte / (flopsPerPair * heads * pairs * seconds);
    };
    const int64_t needed =
        int64_t(std::ceil(std::max(smallest(4, elementBytes), smallest(10, elementBytes + 4))));
    std::string figures = "a link of " + formatRate(link) + " GB/s and attention at " +
                          formatRate(rate) + " TFLOP/s on '" + target + "'";
    if (shape.localSeq() < needed) {
      directive.emitWarning() << "ring: " << shape.localSeq()
                              << " tokens per rank are too few for the key/value "
                              << "transfer to hide behind the attention: with " << figures
                              << " each step needs at "
                              << "least " << needed
                              << " tokens per rank (fewer ranks or a longer sequence)";
      return "; the transfer is exposed (" + std::to_string(shape.localSeq()) +
             " tokens per rank, " + std::to_string(needed) + " needed)";
    }
    return "; the transfer hides behind the attention from " + std::to_string(needed) +
           " tokens per rank with " + figures;
  }

  /// "64", "317", "4.5".
  static std::string formatRate(double value) {
    std::string text = std::to_string(value);
    text.erase(text.find_last_not_of('0') + 1);
    if (!text.empty() && text.back() == '.')
      text.pop_back();
    return text;
  }
};

} // namespace
} // namespace mlir::bonsai
