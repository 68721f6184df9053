//===- Init.h - Deterministic random initialization of parameters ---------===//
//
// When bonsai-run gets no weights, every Parameter tensor is initialized from the seed:
// normal(0, 0.02) for matrices and higher-rank tensors (GPT-2's and Llama's initializer range),
// 1 for normalization weights, 0 for biases and every other vector or scalar. Each tensor draws
// from its own stream, derived from the seed and its name, so a tensor's values do not change
// when other tensors are added to or removed from the plan.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_INIT_H
#define BONSAI_RUNTIME_INIT_H

#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace bonsai::rt {

/// Standard deviation of the normal initializer for tensors of rank >= 2.
inline constexpr double kInitStd = 0.02;

/// How a parameter is initialized.
enum class InitRule { Normal, Ones, Zeros };

/// The rule for a parameter named `name` of rank `rank`: Normal for rank >= 2; for rank 1,
/// Zeros when the name ends in "bias", Ones when it contains "norm" or "ln_" (RMSNorm and
/// LayerNorm weights: "model.norm.weight", "h.0.ln_1.weight"), Zeros otherwise; Zeros for
/// scalars.
InitRule initRuleFor(const std::string &name, size_t rank);

/// Fills `view` (F32, F16 or BF16) by `rule` from the stream of (`seed`, `name`).
void initTensor(const std::string &name, InitRule rule, uint64_t seed, const TensorView &view);

/// Initializes every Parameter tensor of `plan` through `views` (one per plan tensor).
void initParameters(const LoadedPlan &plan, const std::vector<TensorView> &views, uint64_t seed);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_INIT_H
