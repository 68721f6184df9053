//===- TileSequence.cpp - MLP blocks over chunks of the sequence ----------===//
//
// The `bonsai-tile-sequence` pass (see Passes.td and docs/remat.md, "Tiling the sequence"):
// the MLP's intermediates are several times wider than the residual stream, so at long
// sequences one layer's MLP (forward, or backward with its recomputation) is the step's
// peak. Computing it over chunks of the sequence keeps one chunk's intermediates alive at a
// time for the same FLOPs (Arctic's TiledMLP, Unsloth's chunked MLP do the same by hand).
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/PlanSummary.h"
#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::bonsai {
#define GEN_PASS_DEF_BONSAITILESEQUENCEPASS
#include "bonsai/Transforms/Passes.h.inc"

namespace {

/// A token-wise region: the ops that compute, row by row, from one value X of shape
/// [..., S, H] (the sequence S at axis rank - 2).
struct TokenRegion {
  Value input;
  /// In block order.
  SmallVector<Operation *> ops;
  /// Values of the region that something outside it reads.
  SmallVector<Value> outputs;
  /// Bytes of the widest value inside (neither the input nor an output).
  int64_t widestInside = 0;
};

int64_t bytesOf(Value v) {
  auto type = cast<RankedTensorType>(v.getType());
  return type.getNumElements() * int64_t(type.getElementTypeBitWidth()) / 8;
}

/// Whether `v` has X's token dimensions (all but the last).
bool hasTokenDims(Value v, RankedTensorType x) {
  auto type = dyn_cast<RankedTensorType>(v.getType());
  return type && type.getRank() == x.getRank() &&
         type.getShape().drop_back() == x.getShape().drop_back();
}

/// Whether `op` computes each row of its results from the same row of its operands in
/// `region` alone, reading nothing else that varies by token: a linear of a region value, or
/// an elementwise op whose other operands broadcast over the token dimensions (a scale, a
/// per-channel vector).
bool isTokenWise(Operation *op, const llvm::SetVector<Value> &region, RankedTensorType x) {
  if (op->getNumResults() != 1 || !hasTokenDims(op->getResult(0), x))
    return false;
  if (auto linear = dyn_cast<LinearOp>(op))
    return region.contains(linear.getInput()) && !region.contains(linear.getWeight()) &&
           !(linear.getBias() && region.contains(linear.getBias()));
  if (!isa<ElementwiseOpInterface>(op))
    return false;
  return llvm::all_of(op->getOperands(), [&](Value operand) {
    if (region.contains(operand))
      return true;
    auto type = dyn_cast<RankedTensorType>(operand.getType());
    return type && type.getRank() <= x.getRank() - 2;
  });
}

/// The token-wise region grown from `x`: ops in block order whose operands are in the region
/// or do not vary by token. Empty when no linear reads x.
TokenRegion growRegion(Value x) {
  TokenRegion region;
  region.input = x;
  auto xType = cast<RankedTensorType>(x.getType());
  if (xType.getRank() < 2 || !llvm::any_of(x.getUsers(), [&](Operation *user) {
        auto linear = dyn_cast<LinearOp>(user);
        return linear && linear.getInput() == x;
      }))
    return region;
  llvm::SetVector<Value> values;
  values.insert(x);
  Operation *start = x.getDefiningOp();
  Block *block = start ? start->getBlock() : cast<BlockArgument>(x).getOwner();
  auto begin = start ? std::next(start->getIterator()) : block->begin();
  for (Operation &op : llvm::make_range(begin, block->end())) {
    if (!llvm::any_of(op.getOperands(), [&](Value v) { return values.contains(v); }))
      continue;
    if (!isTokenWise(&op, values, xType))
      continue;
    region.ops.push_back(&op);
    values.insert(op.getResult(0));
  }
  llvm::SmallPtrSet<Operation *, 16> inside(region.ops.begin(), region.ops.end());
  for (Operation *op : region.ops) {
    Value result = op->getResult(0);
    if (llvm::any_of(result.getUsers(), [&](Operation *user) { return !inside.contains(user); }))
      region.outputs.push_back(result);
    else
      region.widestInside = std::max(region.widestInside, bytesOf(result));
  }
  return region;
}

/// Whether chunking pays: something inside is wider than what comes in and what goes out
/// (the MLP's intermediate; a Q/K/V projection's region has none).
bool isExpanding(const TokenRegion &region) {
  if (region.ops.empty() || region.outputs.empty())
    return false;
  int64_t boundary = bytesOf(region.input);
  for (Value output : region.outputs)
    boundary = std::max(boundary, bytesOf(output));
  return region.widestInside > boundary;
}

RankedTensorType withDim(RankedTensorType type, int64_t axis, int64_t size) {
  SmallVector<int64_t> shape(type.getShape());
  shape[axis] = size;
  return RankedTensorType::get(shape, type.getElementType());
}

/// Replaces the region with `chunks` copies, each on a slice of the input, joined by
/// concats, placed where the region's last op was (every operand from outside is defined
/// by then). Adds the results of the ops it erases to `erased`.
void tileRegion(const TokenRegion &region, int64_t chunks, llvm::DenseSet<Value> &erased) {
  auto xType = cast<RankedTensorType>(region.input.getType());
  int64_t axis = xType.getRank() - 2, length = xType.getDimSize(axis) / chunks;
  Operation *last = region.ops.back();
  OpBuilder b(last);
  Location loc = region.input.getLoc();
  SmallVector<SmallVector<Value>> parts(region.outputs.size());
  for (int64_t c = 0; c < chunks; ++c) {
    IRMapping mapping;
    Value slice = SliceOp::create(b, loc, withDim(xType, axis, length), region.input,
                                  b.getI64IntegerAttr(axis), b.getI64IntegerAttr(c * length));
    mapping.map(region.input, slice);
    for (Operation *op : region.ops) {
      Operation *clone = b.clone(*op, mapping);
      auto type = cast<RankedTensorType>(op->getResult(0).getType());
      clone->getResult(0).setType(withDim(type, axis, length));
    }
    for (auto [i, output] : llvm::enumerate(region.outputs))
      parts[i].push_back(mapping.lookup(output));
  }
  for (auto [output, part] : llvm::zip_equal(region.outputs, parts)) {
    Value joined =
        ConcatOp::create(b, output.getLoc(), output.getType(), part, b.getI64IntegerAttr(axis));
    Value(output).replaceAllUsesWith(joined);
  }
  for (Operation *op : llvm::reverse(region.ops)) {
    erased.insert(op->getResult(0));
    op->erase();
  }
}

struct TileSequencePass : impl::BonsaiTileSequencePassBase<TileSequencePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    int64_t n = chunks;
    if (n == 0)
      module.walk([&](RematDirectiveOp remat) {
        if (IntegerAttr attr = remat.getSequenceChunksAttr())
          n = attr.getInt();
      });
    if (n < 0) {
      module.emitError() << "sequence chunks must be at least 1, got " << n;
      return signalPassFailure();
    }
    if (n <= 1)
      return;
    // FP8's delayed scaling keeps one amax history per linear: the chunks' linears would
    // share a weight, which bonsai-fp8 leaves in bf16 (it cannot give them one state).
    WalkResult fp8 = module.walk([&](FP8DirectiveOp directive) {
      directive.emitError() << "sequence_chunks " << n
                            << " with bonsai.fp8 is not supported: delayed scaling keeps one "
                               "state per linear, and each MLP chunk's linears share the weight";
      return WalkResult::interrupt();
    });
    if (fp8.wasInterrupted())
      return signalPassFailure();
    for (auto function : module.getOps<func::FuncOp>()) {
      if (function.isExternal())
        continue;
      if (failed(tileFunction(function, n)))
        return signalPassFailure();
    }
  }

  LogicalResult tileFunction(func::FuncOp function, int64_t n) {
    // The candidate inputs first, so that tiling one region does not disturb the walk.
    SmallVector<Value> inputs(function.getArguments());
    for (Operation &op : function.getBody().front())
      for (Value result : op.getResults())
        inputs.push_back(result);
    int64_t tiled = 0, widest = 0;
    llvm::DenseSet<Value> erased;
    for (Value x : inputs) {
      if (erased.contains(x))
        continue;
      TokenRegion region = growRegion(x);
      if (!isExpanding(region))
        continue;
      auto xType = cast<RankedTensorType>(x.getType());
      int64_t axis = xType.getRank() - 2, length = xType.getDimSize(axis);
      if (length % n != 0) {
        return region.ops.front()->emitError()
               << "sequence_chunks " << n << " does not divide the sequence length " << length
               << " of the MLP's input " << xType;
      }
      widest = std::max(widest, region.widestInside);
      tileRegion(region, n, erased);
      ++tiled;
    }
    numTiled += tiled;
    if (tiled == 0) {
      function.emitRemark() << "bonsai-tile-sequence: no expanding token-wise region (an MLP) "
                               "to compute in "
                            << n << " chunks";
      return success();
    }
    function.emitRemark() << "bonsai-tile-sequence: " << tiled << " MLP blocks in " << n
                          << " chunks of the sequence; their widest intermediate "
                          << formatBytes(widest) << " -> " << formatBytes(widest / n)
                          << " per chunk";
    return success();
  }
};

} // namespace
} // namespace mlir::bonsai
