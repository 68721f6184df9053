//===- KernelParams.h - Kernel parameters from a plan kernel's attributes -===//
//
// Private to runtime/src. The CPU and CUDA handlers (CpuKernelHandlers.cpp,
// CudaKernelHandlers.cpp) call kernels that take their hyperparameters as small structs; these
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

namespace bonsai::rt {

/// The schedule of a LearningRate kernel.
inline cpu::LearningRateSchedule learningRateSchedule(const LearningRateAttrs &a) {
  cpu::LearningRateSchedule schedule;
  schedule.lr = a.lr;
  schedule.cosine = a.cosine;
  schedule.warmupSteps = a.warmupSteps;
  schedule.totalSteps = a.totalSteps;
  schedule.minLrRatio = a.minLrRatio;
  return schedule;
}

/// The hyperparameters of an AdamWUpdate or GaloreAdamWUpdate kernel.
inline cpu::AdamWHyper adamwHyper(const AdamWAttrs &a) {
  cpu::AdamWHyper hyper;
  hyper.beta1 = a.beta1;
  hyper.beta2 = a.beta2;
  hyper.eps = a.eps;
  hyper.weightDecay = a.weightDecay;
  hyper.gradClip = a.gradClip;
  return hyper;
}

/// The hyperparameters of an SGDUpdate kernel.
inline cpu::SGDHyper sgdHyper(const SGDAttrs &a) {
  cpu::SGDHyper hyper;
  hyper.momentum = a.momentum;
  hyper.weightDecay = a.weightDecay;
  hyper.gradClip = a.gradClip;
  return hyper;
}

/// The parameters of a GaloreRefresh kernel.
inline galore::RefreshParams galoreRefreshParams(const GaloreRefreshAttrs &a) {
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

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_SRC_KERNELPARAMS_H
