//===- Executor.h - Runs a verified plan on the CPU backend ---------------===//
//
// The executor owns the arenas of one plan: each is allocated once (aligned, zeroed), and every
// plan tensor becomes a TensorView at arena base + offset, so tensors that the compiler placed at
// the same bytes are views of one another. Parameters are bound from a checkpoint or initialized
// from the seed, the data loader's batch is written into the plan inputs, and a step runs the
// kernels in plan order. The executor also measures, per arena, the highest byte any binding,
// input or kernel operand actually touched, to report beside the planned size.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_EXECUTOR_H
#define BONSAI_RUNTIME_EXECUTOR_H

#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Safetensors.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bonsai::rt {

/// Planned and measured bytes of one arena.
struct ArenaUsage {
  const ArenaInfo *arena = nullptr; ///< The executor's copy of the arena's description.
  uint64_t planned = 0;  ///< The arena size the compiler planned (and the runtime allocated).
  uint64_t measured = 0; ///< The highest offset + bytes touched so far.
};

/// Runs one verified plan on the CPU reference backend.
class Executor {
public:
  /// Allocates and zeroes every arena of `plan` (which the executor copies). Throws rt::Error
  /// naming the arena when an allocation fails.
  explicit Executor(const LoadedPlan &plan);
  ~Executor();
  /// Not copyable: it owns the arenas its views point into.
  Executor(const Executor &) = delete;
  Executor &operator=(const Executor &) = delete;

  /// The plan it runs.
  const LoadedPlan &plan() const { return plan_; }
  /// One view per plan tensor, in plan order.
  const std::vector<TensorView> &views() const { return views_; }
  const TensorView &view(uint32_t tensor) const { return views_.at(tensor); }

  /// Binds every parameter from `checkpoint` (see bindCheckpoint).
  void bindWeights(const Checkpoint &checkpoint);
  /// Initializes every parameter from `seed` (see initParameters).
  void initWeights(uint64_t seed);
  /// Writes a batch into the plan's ids and labels tensors.
  void setInputs(const TokenBatch &batch);
  /// The [batch, seq] shape of the plan's inputs.
  std::vector<int64_t> inputShape() const;

  /// Runs every kernel in order and returns the loss. A kernel's error is rethrown with the
  /// kernel's index, name and kind in front.
  float runStep();

  /// Planned and measured bytes of each arena, in plan order.
  std::vector<ArenaUsage> memoryUsage() const;

private:
  void touch(uint32_t tensor);
  void runKernel(size_t index);

  LoadedPlan plan_;
  struct ArenaFree {
    void operator()(void *p) const;
  };
  std::vector<std::unique_ptr<void, ArenaFree>> arenas_;
  std::vector<TensorView> views_;
  std::vector<uint64_t> measured_;
};

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_EXECUTOR_H
