//===- StepTime.cpp - How long a compiled training step takes -------------===//
//
// See StepTime.h: per-op roofline estimates at shares of the target's peaks measured on the
// H200.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Analysis/StepTime.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiOps.h"

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
/// What a copy costs beyond its bytes: the copy engine's start and the event it signals.
/// What a copy costs beyond its bytes, and an update on the host beyond its parameters: the
/// copy engine's start and the event it signals; the host node's callback and the threads'
/// wake-up. Fitted with the contention shares below to the offloaded steps measured on the
/// H200 (docs/offload.md, "Predicted step time"): Llama 124M's 111 small updates on the host
/// take 20 ms longer than their parameters at the host's rate.
constexpr double kCopyLatencySeconds = 10e-6;
constexpr double kHostStepLatencySeconds = 100e-6;

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
  // Fitted to the on-device steps measured on the H200 (docs/benchmarks.md, 2026-12-04,
  // ninth session): Llama-2-7B at 4k, 8k and 16k tokens, TinyLlama-1.1B, Llama and GPT-2
  // 124M. The latency is what the small models' many short kernels show (124M: 6 ms of a
  // 33 ms step beyond the estimate at the 7B's share); the share is then the 7B's.
  constexpr double kKernelsOfEstimate = 0.848;
  constexpr double kKernelLatencySeconds = 10e-6;
  constexpr double kLinkBothWaysShare = 101.0 / 2 / 64;
  StepRates rates = achievedStepRates(profile, hostGParamsPerSecond);
  // The attention rate is a measured kernel rate already; the other kernels run below the
  // roofline estimate in a whole step.
  rates.tensorFlopsPerSecond *= kKernelsOfEstimate;
  rates.memoryBytesPerSecond *= kKernelsOfEstimate;
  rates.kernelLatencySeconds = kKernelLatencySeconds;
  rates.offload.linkBytesPerSecond = profile.linkBandwidthGBs * 1e9 * kLinkBothWaysShare;
  // The host's memory, shared by the host's optimizer and the link's DMA both ways: the
  // shares each keeps while the other runs (fitted, see kCopyLatencySeconds).
  rates.toDeviceShareUnderHost = 0.6;
  rates.toHostShareUnderHost = 0.8;
  rates.hostShareUnderCopies = 0.9;
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

double mlir::bonsai::estimateLaunchSeconds(Operation *op, const StepRates &rates) {
  auto overLink = [&](Value copied) {
    double link = rates.offload.linkBytesPerSecond;
    if (!(link > 0))
      return -1.0;
    return double(getStorageBytes(copied.getType())) / link + kCopyLatencySeconds;
  };
  if (isa<CopyH2DOp, CopyToHostOp>(op))
    return overLink(op->getResult(0));
  if (isa<CopyD2HOp, CopyToDeviceOp>(op))
    return overLink(op->getOperand(0));
  // A collective over N ranks sends and receives (N - 1) / N of the whole tensor over the link
  // between the GPUs (twice for an all-reduce: a reduce-scatter and an all-gather); the
  // profile's link is the one consumer GPUs share with the host (PCIe), a floor for NVLink.
  if (auto collective = dyn_cast<LinkOpInterface>(op)) {
    double link = rates.offload.linkBytesPerSecond;
    int64_t ranks = collective.getLinkRanks();
    if (ranks <= 1)
      return estimateOpSeconds(op, rates) + rates.kernelLatencySeconds;
    if (!(link > 0))
      return -1.0;
    return double(collective.getLinkPasses()) *
               double(getStorageBytes(collective.getWholeTensor().getType())) * double(ranks - 1) /
               double(ranks) / link +
           kCopyLatencySeconds;
  }
  // An update whose operands bonsai-offload copied to the host runs there.
  if (auto update = dyn_cast<OptimizerStateOpInterface>(op);
      update && llvm::any_of(op->getOperands(), [](Value operand) {
        return operand.getDefiningOp<CopyToHostOp>() != nullptr;
      })) {
    std::optional<unsigned> param = update.getHostStepParamOperand();
    auto shaped = param ? dyn_cast<ShapedType>(op->getOperand(*param).getType()) : ShapedType();
    if (!shaped || !(rates.offload.hostParamsPerSecond > 0))
      return -1;
    return double(shaped.getNumElements()) / rates.offload.hostParamsPerSecond +
           kHostStepLatencySeconds;
  }
  return estimateOpSeconds(op, rates) + rates.kernelLatencySeconds;
}
