//===- ModelCost.cpp - Parameters, FLOPs and bytes of a model -------------===//
//
// Walks a model function once, asking every op for its forward and backward cost, classifying
// parameters by how they are declared and used, and attributing work and memory to layers by
// the Hugging Face names of the parameters each op (transitively) consumes.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/ModelCost.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"

#include <limits>
#include <map>

using namespace mlir;
using namespace mlir::bonsai;

int64_t mlir::bonsai::getLayerIndex(StringRef name) {
  SmallVector<StringRef> parts;
  name.split(parts, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] != "layers" && parts[i] != "h" && parts[i] != "blocks")
      continue;
    int64_t index;
    if (!parts[i + 1].getAsInteger(10, index))
      return index;
  }
  return -1;
}

namespace {
/// Layer keys: real blocks are 0..L-1; the embedding comes before, the head after.
constexpr int64_t kEmbeddingKey = -1;
constexpr int64_t kHeadKey = std::numeric_limits<int64_t>::max();

/// Follows single-operand ops back to a parameter (see ModelSummary).
ParamOp getUnderlyingParam(Value value) {
  while (Operation *def = value.getDefiningOp()) {
    if (auto param = dyn_cast<ParamOp>(def))
      return param;
    if (def->getNumOperands() != 1)
      return nullptr;
    value = def->getOperand(0);
  }
  return nullptr;
}
} // namespace

ModelCost mlir::bonsai::computeModelCost(FunctionOpInterface function) {
  ModelCost cost;
  cost.function = function.getName().str();

  // Values that depend on a trainable parameter need a gradient.
  llvm::DenseSet<Value> needsGradient;
  // Layer key of every value: a parameter's block, or the latest block among an op's inputs.
  llvm::DenseMap<Value, int64_t> layerOf;
  std::map<int64_t, LayerCost> layers;
  // How each parameter is used: as a GEMM weight, or only as an embedding table.
  llvm::DenseSet<Operation *> usedAsGemmWeight, usedAsTable, usedOtherwise;

  for (BlockArgument arg : function.getArguments())
    layerOf[arg] = kEmbeddingKey;

  function.walk([&](Operation *op) {
    if (auto param = dyn_cast<ParamOp>(op)) {
      int64_t n = getNumElements(param.getResult().getType());
      int64_t bytes = getStorageBytes(param.getResult().getType());
      if (isa<NF4Type>(param.getResult().getType().getElementType()))
        cost.quantized.add(n, bytes);
      else if (param.getTrainable())
        cost.trainable.add(n, bytes);
      else
        cost.frozen.add(n, bytes);
      if (param.getTrainable())
        needsGradient.insert(param.getResult());
      int64_t index = getLayerIndex(param.getName());
      StringRef name = param.getName();
      int64_t key = index >= 0 ? index
                    : (name.contains("embed") || name.contains("wte") || name.contains("wpe"))
                        ? kEmbeddingKey
                        : kHeadKey;
      layerOf[param.getResult()] = key;
      layers[key].weightBytes += bytes;
      return;
    }

    // Record how parameters are consumed.
    if (auto linear = dyn_cast<LinearOp>(op)) {
      if (ParamOp w = getUnderlyingParam(linear.getWeight()))
        usedAsGemmWeight.insert(w);
    } else if (auto embedding = dyn_cast<EmbeddingOp>(op)) {
      if (ParamOp t = getUnderlyingParam(embedding.getTable()))
        usedAsTable.insert(t);
    } else if (auto slice = dyn_cast<SliceOp>(op)) {
      // Taking the first T rows of a position table is a lookup of positions 0..T-1.
      if (ParamOp t = dyn_cast_or_null<ParamOp>(slice.getInput().getDefiningOp()))
        usedAsTable.insert(t);
    } else {
      for (Value operand : op->getOperands())
        if (ParamOp p = dyn_cast_or_null<ParamOp>(operand.getDefiningOp()))
          usedOtherwise.insert(p);
    }

    if (auto loss = dyn_cast<CrossEntropyOp>(op))
      cost.tokensPerStep = getNumElements(cast<ShapedType>(loss.getLabels().getType()));
    else if (auto embedding = dyn_cast<EmbeddingOp>(op); embedding && !cost.tokensPerStep)
      cost.tokensPerStep = getNumElements(cast<ShapedType>(embedding.getIds().getType()));

    int64_t key = kEmbeddingKey;
    bool anyGradient = false;
    for (Value operand : op->getOperands()) {
      key = std::max(key, layerOf.lookup(operand));
      anyGradient |= needsGradient.contains(operand);
    }
    for (Value result : op->getResults()) {
      layerOf[result] = key;
      if (anyGradient)
        needsGradient.insert(result);
    }

    auto costOp = dyn_cast<CostOpInterface>(op);
    if (!costOp)
      return;
    OpCost forward = costOp.getForwardCost();
    OpCost backward =
        costOp.getBackwardCost([&](Value v) { return needsGradient.contains(v); });
    cost.forward += forward;
    cost.backward += backward;
    if (isa<AttentionOp>(op)) {
      cost.attentionForwardFlops += forward.matmulFlops;
      cost.attentionTrainingFlops += forward.matmulFlops + backward.matmulFlops;
    }
    LayerCost &layer = layers[key];
    layer.forward += forward;
    layer.activationBytes += forward.bytesWritten;
  });

  for (ParamOp param : function.getFunctionBody().getOps<ParamOp>()) {
    int64_t n = getNumElements(param.getResult().getType());
    int64_t bytes = getStorageBytes(param.getResult().getType());
    if (usedAsGemmWeight.contains(param))
      cost.gemmWeights.add(n, bytes);
    else if (usedAsTable.contains(param) && !usedOtherwise.contains(param))
      cost.embeddingOnly.add(n, bytes);
  }

  for (auto &[key, layer] : layers) {
    if (key == kEmbeddingKey)
      layer.name = "embedding";
    else if (key == kHeadKey)
      layer.name = "head";
    else
      layer.name = "layer " + std::to_string(key);
    cost.layers.push_back(layer);
  }
  return cost;
}

//===----------------------------------------------------------------------===//
// Printing
//===----------------------------------------------------------------------===//

namespace {
/// 1234567 -> "1,234,567".
std::string withCommas(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

/// Bytes in the largest binary unit that keeps the figure above 1.
std::string humanBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = bytes;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format(u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return s;
}

/// FLOPs with an SI suffix (GFLOP, TFLOP) next to the exact count.
std::string humanFlops(int64_t flops) {
  const char *units[] = {"", "K", "M", "G", "T", "P"};
  double v = flops;
  int u = 0;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << withCommas(flops) << " (" << llvm::format("%.2f", v) << " " << units[u] << "FLOP)";
  return s;
}

void printParamRow(llvm::raw_ostream &os, StringRef label, const ParamCount &count) {
  os << "    " << llvm::left_justify(label, 22)
     << llvm::right_justify(withCommas(count.elements), 16) << "  " << humanBytes(count.bytes)
     << "\n";
}
} // namespace

void ModelCost::print(llvm::raw_ostream &os, bool perLayer) const {
  os << "cost report for @" << function << "\n";
  os << "  parameters:\n";
  printParamRow(os, "trainable", trainable);
  printParamRow(os, "frozen", frozen);
  printParamRow(os, "quantized (nf4)", quantized);
  printParamRow(os, "total", total());
  printParamRow(os, "embedding lookups", embeddingOnly);
  printParamRow(os, "GEMM weights (N)", gemmWeights);
  os << "  tokens per step: " << withCommas(tokensPerStep) << "\n";

  OpCost training = forward;
  training += backward;
  os << "  FLOPs per step:\n";
  os << "    forward   " << humanFlops(forward.totalFlops()) << "; GEMM "
     << withCommas(forward.matmulFlops) << ", vector " << withCommas(forward.vectorFlops)
     << "\n";
  os << "    backward  " << humanFlops(backward.totalFlops()) << "; GEMM "
     << withCommas(backward.matmulFlops) << ", vector " << withCommas(backward.vectorFlops)
     << "\n";
  os << "    training  " << humanFlops(training.totalFlops()) << "\n";
  if (tokensPerStep > 0) {
    auto perToken = [&](int64_t v) { return withCommas(v / tokensPerStep); };
    os << "  FLOPs per token:\n";
    os << "    forward   " << perToken(forward.totalFlops()) << "; GEMM "
       << perToken(forward.matmulFlops) << " (attention " << perToken(attentionForwardFlops)
       << ")\n";
    os << "    training  " << perToken(training.totalFlops()) << "; GEMM "
       << perToken(training.matmulFlops) << " (attention " << perToken(attentionTrainingFlops)
       << ")\n";
    os << "    6*N       " << withCommas(6 * gemmWeights.elements)
       << " (N = GEMM weights; training GEMM = 6*N + attention when every weight trains)\n";
  }
  os << "  bytes moved per step: forward " << humanBytes(forward.bytesRead + forward.bytesWritten)
     << ", backward " << humanBytes(backward.bytesRead + backward.bytesWritten) << "\n";
  if (!perLayer)
    return;
  os << "  per layer:" << llvm::right_justify("weights", 16)
     << llvm::right_justify("activations", 16) << llvm::right_justify("forward FLOPs", 22)
     << "\n";
  for (const LayerCost &layer : layers)
    os << "    " << llvm::left_justify(layer.name, 10)
       << llvm::right_justify(humanBytes(layer.weightBytes), 14)
       << llvm::right_justify(humanBytes(layer.activationBytes), 16)
       << llvm::right_justify(withCommas(layer.forward.totalFlops()), 22) << "\n";
}
