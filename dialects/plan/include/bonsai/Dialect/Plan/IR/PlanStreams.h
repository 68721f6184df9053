//===- PlanStreams.h - The streams a planned launch runs on ---------------===//
//
// The values of a `bonsai_plan.launch`'s `stream` attribute. They are the runtime's stream ids
// (bonsai::rt::StreamId, runtime/include/bonsai/runtime/Plan.h): the plan schema carries the
// number, and the runtime does not link the compiler, so the two lists are kept equal by hand
// (the end-to-end tests print compiled plans' launches by the runtime's stream names). Plain
// C++, so that the step simulation (bonsai/Analysis/StepSimulation.h) can use it without MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_PLAN_IR_PLANSTREAMS_H
#define BONSAI_DIALECT_PLAN_IR_PLANSTREAMS_H

#include <cstdint>

namespace mlir::bonsai::plan {

/// Where bonsai-schedule issues a launch (docs/offload.md, "Overlap" and "The host step").
enum class PlanStream : int64_t {
  /// The kernels, and every launch when copies do not overlap.
  Compute = 0,
  /// Copies from pinned host memory to the device.
  HostToDevice = 1,
  /// Copies from the device to pinned host memory.
  DeviceToHost = 2,
  /// Updates on the host, in stream order with the GPU's work.
  Host = 3,
  /// The copies back to the device of what the host updates wrote.
  HostResults = 4,
  /// The exchanges with the other ranks: all-gathers, reduce-scatters, all-reduces
  /// (docs/sharding.md, "Overlap").
  Collectives = 5
};
/// The number of PlanStream values.
inline constexpr unsigned kNumPlanStreams = 6;

} // namespace mlir::bonsai::plan

#endif // BONSAI_DIALECT_PLAN_IR_PLANSTREAMS_H
