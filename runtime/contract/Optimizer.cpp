//===- Optimizer.cpp - The contracts of the optimizer kernels -------------===//
//
// The operand contracts of the gradient norm, the learning rate, AdamW, SGD and the step counter:
// what the plan loader checks of each such kernel before any backend runs it (KernelChecker.h).
// Each kind's `verify` checks its attributes, then its operands, then the state it keeps.
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::checkMultiTensorShapes() {
  std::vector<std::string> shared = multiTensorShared();
  size_t first = shared.size(), n = multiTensorCount(), lists = multiTensorStates().size();
  size_t i = 0;
  if (kernel.kind == KernelKind::MultiTensorAdamWUpdate)
    expectScalarInput(i++, DType::I64);
  expectScalarInput(i++, DType::F32); // lr
  expectScalarInput(i, DType::F32);   // norm
  // One kernel instantiation serves every tensor: one gradient dtype, one parameter dtype.
  for (size_t t = 0; t < n; ++t) {
    expectFloat(first + t);
    if (in(first + t).dtype != in(first).dtype)
      fail(inName(first + t) + " dtype " + dtypeName(in(first + t).dtype) + " differs from " +
           inName(first) + "'s " + dtypeName(in(first).dtype) +
           " (a multi-tensor update has one gradient dtype)");
    const std::vector<int64_t> &shape = in(first + t).shape;
    expectFloatOutput(t, shape);
    if (out(t).dtype != out(0).dtype)
      fail(outName(t) + " dtype " + dtypeName(out(t).dtype) + " differs from " + outName(0) +
           "'s " + dtypeName(out(0).dtype) + " (a multi-tensor update has one parameter dtype)");
    for (size_t list = 1; list < lists; ++list)
      expectF32Output(list * n + t, shape);
    if (multiTensorHasMasters())
      expectF32Output(lists * n + t, shape);
  }
}

void KernelChecker::checkSgdAttrs() {
  const auto &a = kernel.attrsAs<SGDAttrs>();
  finiteAtLeast0("momentum", a.momentum);
  finiteAtLeast0("weight_decay", a.weightDecay);
  finiteAtLeast0("grad_clip", a.gradClip);
}

void KernelChecker::checkUpdateShapes() {
  bool adam = kernel.kind == KernelKind::AdamWUpdate;
  expectFloat(0);
  const std::vector<int64_t> &shape = in(0).shape;
  size_t i = 1;
  if (adam)
    expectScalarInput(i++, DType::I64);
  expectScalarInput(i++, DType::F32); // lr
  expectScalarInput(i, DType::F32);   // norm
  expectFloatOutput(0, shape);
  for (size_t j = 1; j < kernel.outputs.size(); ++j)
    expectF32Output(j, shape);
}

void KernelChecker::checkUpdateState() {
  bool adam = kernel.kind == KernelKind::AdamWUpdate;
  for (size_t j = 0; j < kernel.outputs.size(); ++j)
    expectPersistent(j);
  expectInit(1, TensorInit::Zeros, adam ? "moments start at zero" : "momentum starts at zero");
  if (adam)
    expectInit(2, TensorInit::Zeros, "moments start at zero");
  size_t master = adam ? 3 : 2;
  if (kernel.outputs.size() > master)
    expectMasterCopy(master, 0);
}

void KernelChecker::checkMultiTensorState() {
  size_t n = multiTensorCount(), lists = multiTensorStates().size();
  for (size_t j = 0; j < kernel.outputs.size(); ++j)
    expectPersistent(j);
  for (size_t j = n; j < lists * n; ++j)
    expectInit(j, TensorInit::Zeros,
               kernel.kind == KernelKind::MultiTensorAdamWUpdate ? "moments start at zero"
                                                                 : "momentum starts at zero");
  if (multiTensorHasMasters())
    for (size_t i = 0; i < n; ++i)
      expectMasterCopy(lists * n + i, i);
}

void KernelChecker::verify(kinds::GradNorm) {
  for (size_t i = 0; i < kernel.inputs.size(); ++i)
    expectFloat(i);
  expectScalarOutput(0, DType::F32);
}

void KernelChecker::verify(kinds::LearningRate) {
  const auto &a = attrs<kinds::LearningRate>();
  // Attributes.
  finiteAtLeast0("lr", a.lr);
  if (a.warmupSteps < 0)
    fail("warmup_steps must be non-negative, got " + std::to_string(a.warmupSteps));
  if (a.cosine && a.totalSteps <= a.warmupSteps)
    fail("a cosine schedule needs total_steps above warmup_steps, got total_steps " +
         std::to_string(a.totalSteps) + " and warmup_steps " + std::to_string(a.warmupSteps));
  if (!(a.minLrRatio >= 0 && a.minLrRatio <= 1))
    fail("min_lr_ratio must be in [0, 1], got " + num(a.minLrRatio));
  // Operands.
  expectScalarInput(0, DType::I64);
  expectScalarOutput(0, DType::F32);
}

void KernelChecker::verify(kinds::AdamWUpdate) {
  checkAdamWAttrs(attrs<kinds::AdamWUpdate>());
  checkUpdateShapes();
  checkUpdateState();
}

void KernelChecker::verify(kinds::SGDUpdate) {
  checkSgdAttrs();
  checkUpdateShapes();
  checkUpdateState();
}

void KernelChecker::verify(kinds::StepIncrement) {
  expectScalarOutput(0, DType::I64);
  // State.
  expectPersistent(0);
  expectInit(0, TensorInit::Zeros, "the step counter starts at zero");
}

void KernelChecker::verify(kinds::MultiTensorAdamWUpdate) {
  checkAdamWAttrs(attrs<kinds::MultiTensorAdamWUpdate>());
  checkMultiTensorShapes();
  checkMultiTensorState();
}

void KernelChecker::verify(kinds::MultiTensorSGDUpdate) {
  checkSgdAttrs();
  checkMultiTensorShapes();
  checkMultiTensorState();
}

} // namespace bonsai::rt::contract
