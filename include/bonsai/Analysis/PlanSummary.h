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

/// Bytes by class. Persistent classes are sums; `activations` is the peak of the per-step
/// arenas less the inputs and workspace that live in them.
struct PlanMemorySummary {
  int64_t weights = 0;
  int64_t gradients = 0;
  int64_t optimizerState = 0;
  int64_t activations = 0;
  int64_t workspace = 0;
  int64_t inputs = 0;
  int64_t peakDevice = 0;
  int64_t peakHost = 0;
  /// Bytes the per-step buffers would need without reuse (the sum of their sizes).
  int64_t stepBytesWithoutReuse = 0;

  /// Prints one line per class and the peaks.
  void print(llvm::raw_ostream &os) const;
  /// The largest class, by name ("weights", "activations", ...), and its bytes.
  std::pair<const char *, int64_t> dominant() const;
};

/// Summarises a step whose arenas have been sized by bonsai-plan-memory.
PlanMemorySummary summarizePlanMemory(plan::StepOp step);

/// "12.55 GiB".
std::string formatBytes(int64_t bytes);

} // namespace mlir::bonsai

#endif // BONSAI_ANALYSIS_PLANSUMMARY_H
