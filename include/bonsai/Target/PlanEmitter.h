//===- PlanEmitter.h - Write a planned step as a flatbuffer plan ----------===//
//
// Translates a scheduled and memory-planned bonsai_plan.step into the flatbuffer the runtime
// loads (runtime/schema/plan.fbs): arenas, tensors (buffers and views), kernels with typed
// attributes, inputs, the loss and the memory summary.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TARGET_PLANEMITTER_H
#define BONSAI_TARGET_PLANEMITTER_H

#include "bonsai/Dialect/Plan/IR/PlanDialect.h"

#include <string>

namespace mlir::bonsai {

/// The plan format version this compiler writes (plan.fbs `Plan.version`).
constexpr uint32_t kPlanVersion = 2;

/// What a plan says of the machine it was compiled for beyond the step's target
/// architecture and budget (plan.fbs `Target`).
struct PlanTargetInfo {
  /// The target profile's host link each way, GB/s (0: unknown): the runtime warns when a
  /// step's copies run below half of it (docs/offload.md, "Telemetry").
  double linkGBs = 0;
};

/// Serialises `step` into `bytes`. Fails, with an error at the offending op, on what the
/// format cannot express: an unplaced buffer, a kernel the runtime does not know, a missing
/// parameter, an element type with no runtime encoding.
LogicalResult emitPlan(plan::StepOp step, std::string &bytes, const PlanTargetInfo &info = {});

} // namespace mlir::bonsai

#endif // BONSAI_TARGET_PLANEMITTER_H
