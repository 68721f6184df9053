//===- Init.h - Deterministic random initialization of parameters ---------===//
//
// When bonsai-run gets no weights, every Parameter tensor is initialized from the seed:
// normal(0, 0.02) for matrices and higher-rank tensors (GPT-2's and Llama's initializer range),
// 1 for normalization weights, 0 for biases and every other vector or scalar. Each tensor draws
// from its own stream, derived from the seed and its name, so a tensor's values do not change
// when other tensors are added to or removed from the plan. Adapter parameters (docs/lora.md)
// carry their own initializer in the plan (KaimingUniform, Zeros, RowNorm), applied without
// weights and whenever the weights file does not hold them.
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

class Communicator;

/// Standard deviation of the normal initializer for tensors of rank >= 2.
inline constexpr double kInitStd = 0.02;

/// How a parameter is initialized.
enum class InitRule { Normal, Ones, Zeros };

/// The rule for a parameter named `name` of rank `rank`: Normal for rank >= 2; for rank 1,
/// Zeros when the name ends in "bias", Ones when it contains "norm" or "ln_" (RMSNorm and
/// LayerNorm weights: "model.norm.weight", "h.0.ln_1.weight"), Zeros otherwise; Zeros for
/// scalars.
InitRule initRuleFor(const std::string &name, size_t rank);

/// Fills `view` (F32, F16 or BF16) by `rule` from the stream of (`seed`, `name`); an NF4
/// view gets the quantization (Nf4.h) of the values an F32 view would get.
/// With `first` > 0, `view` is a slice of a larger tensor that starts at element `first`: it
/// gets exactly the values that tensor's elements [first, first + numel) get (a shard of a
/// sharded parameter, docs/sharding.md; the draws before it are made and dropped).
void initTensor(const std::string &name, InitRule rule, uint64_t seed, const TensorView &view,
                int64_t first = 0);

/// Initializes every Parameter tensor of `plan` through `views` (one per plan tensor): by
/// initRuleFor, or by the tensor's own initializer (adapters, initUnboundParameters). A sharded
/// parameter gets rank `rank`'s slice of what one rank initializes for its name and full shape;
/// `comm` gathers what a row norm of a sharded weight needs (required when there is one).
void initParameters(const LoadedPlan &plan, const std::vector<TensorView> &views, uint64_t seed,
                    int rank = 0, Communicator *comm = nullptr);

/// Fills a 2-D `view` with U(-b, b), b = 1/sqrt(shape[1]) (torch's kaiming_uniform_ with
/// a = sqrt(5), PEFT's lora_A init), from the stream of (`seed`, `name`). With `fanIn` > 0,
/// `view` is the slice from element `first` of a [*, fanIn] tensor (a shard), initialized as
/// that tensor's elements.
void initKaimingUniform(const std::string &name, uint64_t seed, const TensorView &view,
                        int64_t fanIn = 0, int64_t first = 0);

/// Writes the L2 norm of each row of the 2-D `source` (dequantized when NF4, then rounded to
/// `view`'s dtype) into `view` [rows] (DoRA's magnitude). Each row is summed in double, in
/// order, as the CPU dora_scale kernel does.
void initRowNorm(const TensorView &source, const TensorView &view);

/// Applies the initializer (TensorInit Zeros, KaimingUniform, RowNorm) of every Parameter
/// tensor that has one and is not `bound` (adapters absent from the weights file); row norms
/// last, from their (bound or initialized) base weights. Indices are plan tensor indices. A
/// sharded one gets rank `rank`'s slice. The row norms of a sharded base weight (ZeRO-3) are
/// of the whole weight, which `comm` gathers: every rank calls this with the same `bound`, so
/// the gathers match; without `comm` such a plan is an error.
void initUnboundParameters(const LoadedPlan &plan, const std::vector<TensorView> &views,
                           uint64_t seed, const std::vector<bool> &bound, int rank = 0,
                           Communicator *comm = nullptr);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_INIT_H
