//===- PlannedStep.h - A step's memory plan and its simulation ------------===//
//
// What bonsai-plan-memory and bonsai-predict-step do to a step, as functions, so that
// bonsai-schedule can plan and time a copy of a step under each order it weighs (the prefetch
// distance of the all-gathers, docs/sharding.md, "Overlap") and choose with the figures the
// pipeline will report.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TRANSFORMS_PLANNEDSTEP_H
#define BONSAI_TRANSFORMS_PLANNEDSTEP_H

#include "bonsai/Analysis/StepSimulation.h"
#include "bonsai/Dialect/Plan/IR/PlanDialect.h"

#include <optional>
#include <vector>

namespace mlir::bonsai {

struct TargetProfile;

/// Gives every buffer of `step` an offset in its arena and sizes the arenas: liveness over the
/// step's order, one after another in persistent arenas, the greedy-by-size planner of
/// MemoryPlanner.h in per-step ones. Returns the bytes reuse saved in the per-step arenas.
int64_t planStepBuffers(plan::StepOp step);

/// The launches of a planned `step` as the simulation sees them (stream, phase, the seconds
/// bonsai-time-ops estimated, the bytes they touch, the link direction of a copy); none when
/// no launch carries its seconds (no rates for the target).
std::optional<std::vector<SimLaunch>> collectSimLaunches(plan::StepOp step);

/// How the CUDA runtime runs a step on `profile`'s machine (the contention shares of
/// sustainedStepRates; the update phase in order, as its conditional graph node runs it).
SimMachine runtimeMachine(const TargetProfile &profile);

} // namespace mlir::bonsai

#endif // BONSAI_TRANSFORMS_PLANNEDSTEP_H
