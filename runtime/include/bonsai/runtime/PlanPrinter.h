//===- PlanPrinter.h - A compiled plan as readable text -------------------===//
//
// What `bonsai-run PLAN --print-plan` prints: the plan's header, its arenas, every tensor
// (index, name, dtype, shape, role, arena and byte range), every kernel in execution order
// (phase, kind, inputs -> outputs, attributes), the adapters, the memory summary and what a
// checkpoint of it holds. Reads a verified LoadedPlan only; runs nothing. The format is for
// people and FileCheck tests, not a contract for programs (use the plan itself for that).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_PLANPRINTER_H
#define BONSAI_RUNTIME_PLANPRINTER_H

#include "bonsai/runtime/Plan.h"

#include <string>

namespace bonsai::rt {

/// The attributes of `kernel` as "{name = value, ...}", or "" for a kind without any.
std::string formatKernelAttrs(const KernelInfo &kernel);

/// The whole plan as text, one item per line (docs/plan-format.md, "Reading a plan").
std::string printPlan(const LoadedPlan &plan);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_PLANPRINTER_H
