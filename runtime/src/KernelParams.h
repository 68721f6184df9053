//===- KernelParams.h - Kernel parameters from a plan kernel's attributes -===//
//
// Private to runtime/src. The CPU executor (Executor.cpp) and the CUDA backend
// (DeviceBackend.cpp) call kernels that take their hyperparameters as small structs; these
// functions build each struct from a verified kernel's attributes, so that both backends read
// the same attributes the same way.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_SRC_KERNELPARAMS_H
#define BONSAI_RUNTIME_SRC_KERNELPARAMS_H

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/GaLore.h"
#include "bonsai/runtime/Plan.h"

#include <cstdint>
#include <vector>

namespace bonsai::rt {

/// The schedule of a LearningRate kernel.
inline cpu::LearningRateSchedule learningRateSchedule(const KernelAttrsInfo &a) {
  cpu::LearningRateSchedule schedule;
  schedule.lr = a.lr;
  schedule.cosine = a.cosine;
  schedule.warmupSteps = a.warmupSteps;
  schedule.totalSteps = a.totalSteps;
  schedule.minLrRatio = a.minLrRatio;
  return schedule;
}

/// The hyperparameters of an AdamWUpdate or GaloreAdamWUpdate kernel.
inline cpu::AdamWHyper adamwHyper(const KernelAttrsInfo &a) {
  cpu::AdamWHyper hyper;
  hyper.beta1 = a.beta1;
  hyper.beta2 = a.beta2;
  hyper.eps = a.eps;
  hyper.weightDecay = a.weightDecay;
  hyper.gradClip = a.gradClip;
  return hyper;
}

/// The hyperparameters of an SGDUpdate kernel.
inline cpu::SGDHyper sgdHyper(const KernelAttrsInfo &a) {
  cpu::SGDHyper hyper;
  hyper.momentum = a.momentum;
  hyper.weightDecay = a.weightDecay;
  hyper.gradClip = a.gradClip;
  return hyper;
}

/// The parameters of a GaloreRefresh kernel.
inline galore::RefreshParams galoreRefreshParams(const KernelAttrsInfo &a) {
  galore::RefreshParams params;
  params.rank = a.rank;
  params.updateProjGap = a.updateProjGap;
  params.offset = a.offset;
  params.slot = a.slot;
  params.left = a.left;
  params.randomized = a.randomized;
  params.powerIterations = a.powerIterations;
  params.seed = uint64_t(a.seed);
  return params;
}

/// The tensors of a MultiTensorAdamWUpdate or MultiTensorSGDUpdate kernel (verified counts:
/// inputs are the shared scalars then g1 .. gn; outputs the lists of n, masters last).
struct MultiTensorOperands {
  std::vector<TensorView> grads;
  std::vector<std::vector<TensorView>> lists; ///< params, then each optimizer state
  std::vector<TensorView> masters;           ///< empty, or one per parameter
};

inline MultiTensorOperands multiTensorOperands(const KernelInfo &k,
                                               const std::vector<TensorView> &views) {
  bool adam = k.kind == KernelKind::MultiTensorAdamWUpdate;
  size_t shared = adam ? 3 : 2, lists = adam ? 3 : 2;
  size_t n = k.inputs.size() - shared;
  MultiTensorOperands t;
  for (size_t i = 0; i < n; ++i)
    t.grads.push_back(views[k.inputs[shared + i]]);
  t.lists.resize(lists);
  for (size_t l = 0; l < lists; ++l)
    for (size_t i = 0; i < n; ++i)
      t.lists[l].push_back(views[k.outputs[l * n + i]]);
  if (k.outputs.size() > lists * n)
    for (size_t i = 0; i < n; ++i)
      t.masters.push_back(views[k.outputs[lists * n + i]]);
  return t;
}

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_SRC_KERNELPARAMS_H
