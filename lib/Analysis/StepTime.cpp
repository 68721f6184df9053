//===- StepTime.cpp - How long a compiled training step takes -------------===//
//
// See StepTime.h. The compute stream is a sum of per-op roofline estimates; the offloaded
// updates are UpdatePlacement's simulation, fed from the ops that carry them.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/StepTime.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"
#include "mlir/Interfaces/ViewLikeInterface.h"
#include "llvm/ADT/DenseSet.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::bonsai;

namespace {
/// Shares of the peaks the H200's kernels and copies reach (docs/benchmarks.md): 775 of 989
/// bf16 TFLOP/s in a large GEMM, about 80% of HBM bandwidth in a streaming kernel, 55.7 of
/// the link's 64 GB/s each way in a pinned copy.
constexpr double kTensorCoreShare = 0.78;
constexpr double kMemoryShare = 0.8;
constexpr double kLinkShare = 0.87;

/// The phase an op belongs to ("forward" when unmarked).
StringRef phaseOf(Operation *op) {
  if (auto phase = op->getAttrOfType<StringAttr>("bonsai.phase"))
    return phase.getValue();
  return "forward";
}
} // namespace

StepRates mlir::bonsai::achievedStepRates(const TargetProfile &profile,
                                          double hostGParamsPerSecond) {
  StepRates rates;
  rates.tensorFlopsPerSecond = profile.bf16Tflops * 1e12 * kTensorCoreShare;
  rates.attentionFlopsPerSecond = profile.attentionTflops * 1e12;
  rates.memoryBytesPerSecond = profile.memoryBandwidthGBs * 1e9 * kMemoryShare;
  rates.offload.linkBytesPerSecond = profile.linkBandwidthGBs * 1e9 * kLinkShare;
  rates.offload.hostParamsPerSecond = hostGParamsPerSecond * 1e9;
  return rates;
}

StepRates mlir::bonsai::sustainedStepRates(const TargetProfile &profile,
                                           double hostGParamsPerSecond) {
  constexpr double kKernelsOfEstimate = 0.84;
  constexpr double kLinkBothWaysShare = 101.0 / 2 / 64;
  constexpr double kHostUnderCopies = 0.8;
  StepRates rates = achievedStepRates(profile, hostGParamsPerSecond * kHostUnderCopies);
  // The attention rate is a measured kernel rate already; the other kernels run below the
  // roofline estimate in a whole step.
  rates.tensorFlopsPerSecond *= kKernelsOfEstimate;
  rates.memoryBytesPerSecond *= kKernelsOfEstimate;
  rates.offload.linkBytesPerSecond = profile.linkBandwidthGBs * 1e9 * kLinkBothWaysShare;
  return rates;
}

double mlir::bonsai::estimateOpSeconds(Operation *op, const StepRates &rates) {
  auto costed = dyn_cast<CostOpInterface>(op);
  if (!costed || !(rates.tensorFlopsPerSecond > 0) || !(rates.memoryBytesPerSecond > 0))
    return 0;
  OpCost cost = costed.getForwardCost();
  double attentionRate = rates.attentionFlopsPerSecond > 0 ? rates.attentionFlopsPerSecond
                                                           : rates.tensorFlopsPerSecond;
  double tensor = double(cost.matmulFlops - cost.attentionFlops) / rates.tensorFlopsPerSecond +
                  double(cost.attentionFlops) / attentionRate;
  double memory = double(cost.bytesRead + cost.bytesWritten) / rates.memoryBytesPerSecond;
  return std::max(tensor, memory);
}

StepPrediction mlir::bonsai::predictStep(func::FuncOp function, const StepRates &rates,
                                         int64_t microBatches) {
  StepPrediction prediction;
  std::vector<UpdateWork> updates;
  std::vector<bool> onHost;
  llvm::StringMap<double> phaseStart;
  double clock = 0;
  double kernels = 0;
  // Offloaded activations (bonsai-offload-activations): out on the device-to-host link as the
  // forward pass computes, all of them done before the backward pass starts (the runtime
  // joins the copy streams at the end of a phase); back on the host-to-device link, each
  // issued once the reader of the one before has started (bonsai-schedule's one group
  // ahead), its reader waiting for it. Their link time is not shared with streamed updates'.
  double runs = double(std::max<int64_t>(microBatches, 1));
  double link = rates.offload.linkBytesPerSecond;
  double outFree = 0, backFree = 0, previousReader = 0;
  bool forwardDone = false;
  llvm::DenseMap<Value, double> arrival;
  llvm::DenseSet<Value> read;
  for (Operation &op : function.getBody().front()) {
    if (auto out = dyn_cast<CopyToHostOp>(op);
        out && link > 0 && llvm::any_of(out->getUsers(), llvm::IsaPred<CopyH2DOp>)) {
      outFree = std::max(outFree, clock) + getStorageBytes(out.getType()) * runs / link;
      continue;
    }
    if (auto back = dyn_cast<CopyH2DOp>(op);
        back && link > 0 && back.getSource().getDefiningOp<CopyToHostOp>()) {
      backFree = std::max(backFree, previousReader) + getStorageBytes(back.getType()) * runs / link;
      arrival[back.getResult()] = backFree;
      continue;
    }
    // Copies run on the link, not on the compute stream: the updates they serve count them.
    if (isa<CopyH2DOp, CopyD2HOp, CopyToHostOp, CopyToDeviceOp>(op))
      continue;
    StringRef phase = phaseOf(&op);
    if (phase != "forward" && !forwardDone) {
      forwardDone = true;
      clock = std::max(clock, outFree);
    }
    if (auto view = dyn_cast<ViewLikeOpInterface>(op)) {
      // A view remade on a reloaded copy arrives with it.
      if (auto it = arrival.find(view.getViewSource()); it != arrival.end()) {
        double when = it->second;
        arrival[op.getResult(0)] = when;
        continue;
      }
    }
    bool firstRead = false;
    for (Value operand : op.getOperands())
      if (auto it = arrival.find(operand); it != arrival.end()) {
        clock = std::max(clock, it->second);
        firstRead |= read.insert(operand).second;
      }
    if (firstRead)
      previousReader = clock;
    phaseStart.try_emplace(phase, clock);
    double seconds = estimateOpSeconds(&op, rates);
    auto update = dyn_cast<OptimizerStateOpInterface>(op);
    bool streamed = false, host = false;
    int64_t streamedBytes = 0, toHostBytes = 0;
    if (update)
      for (Value operand : op.getOperands()) {
        if (operand.getDefiningOp<CopyH2DOp>()) {
          streamed = true;
          streamedBytes += getStorageBytes(operand.getType());
        } else if (auto copy = operand.getDefiningOp<CopyToHostOp>()) {
          host = true;
          toHostBytes += getStorageBytes(operand.getType());
        }
      }
    if (!streamed && !host) {
      // Forward and backward run once per micro-batch, the update once.
      double times = phase == "update" ? 1.0 : runs;
      clock += seconds * times;
      kernels += seconds * times;
      continue;
    }
    UpdateWork work;
    work.readySeconds = clock;
    work.earliestCopySeconds = phaseStart.lookup(phase);
    work.canRunOnHost = host;
    if (host) {
      std::optional<unsigned> param = update.getHostStepParamOperand();
      Type paramType = param ? op.getOperand(*param).getType() : Type();
      if (auto shaped = dyn_cast_or_null<ShapedType>(paramType)) {
        work.params = shaped.getNumElements();
        work.toDeviceBytes = getStorageBytes(paramType);
      }
      work.toHostBytes = toHostBytes;
      ++prediction.hostUpdates;
    } else {
      work.deviceSeconds = seconds;
      work.streamedBytes = streamedBytes;
      kernels += seconds;
      ++prediction.streamedUpdates;
    }
    updates.push_back(work);
    onHost.push_back(host);
  }
  prediction.placement = simulateUpdates(updates, clock, rates.offload, onHost);
  prediction.kernelSeconds = kernels;
  prediction.stepSeconds = prediction.placement.stepSeconds();
  prediction.exposedSeconds = std::max(0.0, prediction.stepSeconds - kernels);
  return prediction;
}
