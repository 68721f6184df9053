//===- KernelCall.h - One kernel launch, as a backend's handler sees it ---===//
//
// Private to runtime/src. Each backend has one handler per kernel kind (CpuKernelHandlers.cpp,
// CudaKernelHandlers.cpp), an overload `launch(kinds::K, const Call &)`, gathered into a table
// in kernel-table order by the X-macro of KernelKinds.def: a kind a backend has no handler for
// is a compile error, and dispatch is an index, not a switch. A handler reads its operands by
// name (`call.in(kinds::Linear::In::bias)`) from a kernel the plan loader already verified, so
// it checks nothing the contract checked (docs/runtime.md).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_SRC_KERNELCALL_H
#define BONSAI_RUNTIME_SRC_KERNELCALL_H

#include "bonsai/runtime/KernelBackend.h"
#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Tensor.h"

#include <cstddef>
#include <string>
#include <vector>

namespace bonsai::rt {

/// The tensors of a MultiTensorAdamWUpdate or MultiTensorSGDUpdate kernel (verified counts:
/// inputs are the shared scalars then g1 .. gn; outputs the lists of n, masters last).
struct MultiTensorOperands {
  std::vector<TensorView> grads;
  std::vector<std::vector<TensorView>> lists; ///< params, then each optimizer state
  std::vector<TensorView> masters;           ///< empty, or one per parameter
};

/// One verified kernel of a plan and the views its operands resolve to on a backend (host
/// views on the CPU, device views on a GPU).
class KernelCall {
public:
  KernelCall(const LoadedPlan &plan, size_t index, const std::vector<TensorView> &views,
             const RankContext *ranks = nullptr)
      : plan_(plan), index_(index), kernel_(plan.kernels[index]), views_(views), ranks_(ranks) {}

  const LoadedPlan &plan() const { return plan_; }
  /// The kernel's position in the plan.
  size_t index() const { return index_; }
  const KernelInfo &kernel() const { return kernel_; }
  /// The attributes of `Kind`'s table (kinds::K::Attrs): the kernel must be of that kind.
  template <typename Kind> const typename Kind::Attrs &attrs() const {
    return kernel_.attrsAs<typename Kind::Attrs>();
  }

  /// Input `i` (a kinds::K::In name).
  const TensorView &in(unsigned i) const { return views_[kernel_.inputs[i]]; }
  /// Optional input `i`, or null when the kernel has fewer inputs.
  const TensorView *optionalIn(unsigned i) const {
    return i < kernel_.inputs.size() ? &in(i) : nullptr;
  }
  /// Output `j` (a kinds::K::Out name).
  const TensorView &out(unsigned j) const { return views_[kernel_.outputs[j]]; }
  /// Optional output `j`, or null when the kernel has fewer outputs.
  const TensorView *optionalOut(unsigned j) const {
    return j < kernel_.outputs.size() ? &out(j) : nullptr;
  }

  /// The ranks the kernel runs among; one rank (rank 0, no communicator) when the backend was
  /// given none.
  const RankContext &ranks() const {
    static const RankContext single;
    return ranks_ ? *ranks_ : single;
  }
  /// What a collective's errors say it was: "step 12, all_gather of 'layers.0.wq'" (or
  /// without the step when the executor does not know it).
  std::string collectiveContext(uint32_t tensor) const {
    const RankContext &r = ranks();
    return (r.where.empty() ? std::string() : r.where + ", ") +
           kernelKindInfo(kernel_.kind).opName + " of '" + plan_.tensors[tensor].name + "'";
  }

  /// Every input from `first` on (a variadic kind's list).
  std::vector<TensorView> inputsFrom(size_t first) const {
    std::vector<TensorView> views;
    views.reserve(kernel_.inputs.size() - first);
    for (size_t i = first; i < kernel_.inputs.size(); ++i)
      views.push_back(views_[kernel_.inputs[i]]);
    return views;
  }
  /// Every input and every output, as pointers (a generated kernel's operands).
  std::vector<const TensorView *> inputPointers() const { return pointers(kernel_.inputs); }
  std::vector<const TensorView *> outputPointers() const { return pointers(kernel_.outputs); }

  /// The operands of a multi-tensor update: `shared` scalars first, then g1 .. gn; `lists`
  /// output lists of n, then the masters when there are n more.
  MultiTensorOperands multiTensor(size_t shared, size_t lists) const {
    size_t n = kernel_.inputs.size() - shared;
    MultiTensorOperands t;
    t.grads = inputsFrom(shared);
    t.lists.resize(lists);
    for (size_t l = 0; l < lists; ++l)
      for (size_t i = 0; i < n; ++i)
        t.lists[l].push_back(out(unsigned(l * n + i)));
    if (kernel_.outputs.size() > lists * n)
      for (size_t i = 0; i < n; ++i)
        t.masters.push_back(out(unsigned(lists * n + i)));
    return t;
  }

private:
  std::vector<const TensorView *> pointers(const std::vector<uint32_t> &tensors) const {
    std::vector<const TensorView *> result;
    result.reserve(tensors.size());
    for (uint32_t t : tensors)
      result.push_back(&views_[t]);
    return result;
  }

  const LoadedPlan &plan_;
  size_t index_;
  const KernelInfo &kernel_;
  const std::vector<TensorView> &views_;
  const RankContext *ranks_;
};

/// Runs one kernel on the CPU reference backend (CpuKernelHandlers.cpp).
void launchOnCpu(const KernelCall &call);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_SRC_KERNELCALL_H
