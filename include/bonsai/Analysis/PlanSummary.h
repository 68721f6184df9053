//===- PlanSummary.h - Planned memory of a step by class ------------------===//
//
// What a planned bonsai_plan.step needs, by memory class: the figures bonsai-compile prints,
// the over-budget error explains, and the plan file records for the runtime to report.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_ANALYSIS_PLANSUMMARY_H
#define BONSAI_ANALYSIS_PLANSUMMARY_H

#include "bonsai/Dialect/Plan/IR/PlanDialect.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mlir::bonsai {

/// Bytes by class. Persistent classes are sums of their buffers in device arenas, and the
/// `host...` fields the same in pinned host arenas (bonsai-offload); `activations` is the peak
/// of the per-step arenas less the inputs and workspace that live in them (the device copies
/// of offloaded state are per-step buffers: they count there).
struct PlanMemorySummary {
  int64_t weights = 0;
  int64_t gradients = 0;
  int64_t optimizerState = 0;
  int64_t activations = 0;
  int64_t workspace = 0;
  int64_t inputs = 0;
  int64_t hostWeights = 0;
  int64_t hostGradients = 0;
  int64_t hostOptimizerState = 0;
  int64_t peakDevice = 0;
  int64_t peakHost = 0;
  /// Bytes the per-step buffers would need without reuse (the sum of their sizes).
  int64_t stepBytesWithoutReuse = 0;
  /// Bytes the launches of one optimizer step (every micro-batch's forward and backward, and
  /// the update) read from pinned host arenas into the device, and write back to them: the
  /// PCIe traffic of each direction.
  int64_t pcieHostToDevice = 0;
  int64_t pcieDeviceToHost = 0;
  /// Whether the copies run on the copy streams (bonsai-schedule's overlap), so that both
  /// directions move at once.
  bool copyStreams = false;
  /// The per-step pinned host buffers (what updates on the host read, copied there) and the
  /// number of launches that run on the host (updates over pinned host memory only).
  int64_t hostStaging = 0;
  int64_t hostSteps = 0;

  /// Prints one line per class of device memory, the device peak and `budget` (0: none),
  /// then, when there are pinned host arenas, their classes, their peak, `hostBudget` (0:
  /// none) and the PCIe bytes, with the time they take at `linkGBs` per direction (0:
  /// unknown, not printed).
  void print(llvm::raw_ostream &os, int64_t budget = 0, double linkGBs = 0,
             int64_t hostBudget = 0) const;
  /// The largest class in device memory, by name ("weights", "activations", ...), and its
  /// bytes.
  std::pair<const char *, int64_t> dominant() const;
};

/// What to do about a plan over its device budget whose largest class is `memoryClass` (a name
/// dominant() returns): only what this compiler implements (bonsai.shard is parsed but refused
/// until its pass exists; bonsai.offload moves optimizer state and master weights only). With
/// `recomputing`, bonsai-remat has already recomputed what it can, so activations get no
/// recomputation advice.
std::string overBudgetAdvice(llvm::StringRef memoryClass, bool recomputing);

/// Whether printed `diagnostics` hold the error of a step over its device budget, as
/// bonsai-plan-memory and bonsai-remat emit it (both end their figures with kOverBudget and
/// the excess): what bonsai-compile's offload fitting retries.
bool isOverBudgetError(llvm::StringRef diagnostics);
/// The words in front of the excess in both over-budget errors.
inline constexpr llvm::StringLiteral kOverBudget = "over by ";

/// Summarises a step whose arenas have been sized by bonsai-plan-memory.
PlanMemorySummary summarizePlanMemory(plan::StepOp step);

/// The collectives of a sharded step (bonsai-shard's all-gathers, reduce-scatters and
/// all-reduces), by kind and by when they run: what each rank's link carries.
struct PlanCollectiveSummary {
  /// Launches and the bytes of the whole tensors they gather or reduce.
  struct Traffic {
    int64_t launches = 0;
    int64_t bytes = 0;
  };
  enum Kind { AllGather, ReduceScatter, AllReduce, NumKinds };
  /// [kind][0]: per micro-batch (forward and backward); [kind][1]: per step (update).
  Traffic traffic[NumKinds][2];
  /// The ranks they run over (the largest a launch names; 0 when there is no collective).
  int64_t ranks = 0;
  /// Ring attention (docs/ring-attention.md), per micro-batch: its launches and the bytes each
  /// rank sends to the next rank of its ring (and receives from the previous): N - 1 passes of
  /// the key/value block (and segment ids) per forward, and per backward also N passes of the
  /// block's fp32 dk/dv accumulators (plus a forward's, for a grad that keeps no lse).
  Traffic ring;
  int64_t ringRanks = 0;

  bool empty() const { return ranks == 0 && ring.launches == 0; }
  /// Prints one line per kind and phase that has launches: their count, the whole tensors'
  /// bytes and, with `linkGBs` > 0 and several ranks, the time on a link of that rate per
  /// direction when each rank sends and receives (N - 1) / N of them (an all-reduce twice).
  void print(llvm::raw_ostream &os, double linkGBs = 0) const;
};

/// Summarises the collective launches of `step`.
PlanCollectiveSummary summarizePlanCollectives(plan::StepOp step);

/// "12.55 GiB".
std::string formatBytes(int64_t bytes);

} // namespace mlir::bonsai

#endif // BONSAI_ANALYSIS_PLANSUMMARY_H
