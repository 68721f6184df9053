//===- KernelUtil.h - Checks, sub-views and threading of the CPU kernels --===//
//
// Private to runtime/cpu: the operand checks every kernel runs before it writes anything (dtype,
// shape agreement, null data), sub-views of contiguous element ranges through which kernels
// convert bounded pieces to fp32, and a deterministic parallel loop over independent items.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CPU_KERNELUTIL_H
#define BONSAI_RUNTIME_CPU_KERNELUTIL_H

#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

namespace bonsai::rt::cpu::detail {

/// Throws rt::Error("cpu <kernel>: <message>").
[[noreturn]] void fail(const char *kernel, const std::string &message);

/// Checks that `t` has non-negative dimensions and, unless empty, data.
void checkView(const char *kernel, const char *operand, const TensorView &t);
/// checkView, plus the dtype is F32, F16 or BF16.
void checkFloat(const char *kernel, const char *operand, const TensorView &t);
/// checkView, plus the dtype is I32 or I64.
void checkIndex(const char *kernel, const char *operand, const TensorView &t);

/// Throws "<operand> shape A should be E <context>" unless `a` has shape `expected`; the
/// context names the operands the expectation comes from and their shapes.
void checkShape(const char *kernel, const char *operand, const TensorView &a,
                const std::vector<int64_t> &expected, const std::string &context);
/// Throws naming both operands and shapes unless they have the same shape.
void checkSameShape(const char *kernel, const char *nameA, const TensorView &a, const char *nameB,
                    const TensorView &b);

/// The sizes of a linear's GEMMs: rows (the product of the activation's leading dimensions),
/// output and input features.
struct LinearSizes {
  int64_t rows, out, in;
};
/// Checks the operands of y = x · wᵀ (+ bias): float x [..., in], w [out, in], bias [out], and
/// y [..., out] (linear and fp8_linear).
LinearSizes checkLinear(const char *kernel, const TensorView &x, const TensorView &w,
                        const TensorView *bias, const TensorView &y);
/// Checks the operands of dx = dy · w: float dy [..., out], w [out, in], dx [..., in].
LinearSizes checkLinearGradInput(const char *kernel, const TensorView &dy, const TensorView &w,
                                 const TensorView &dx);
/// Checks the operands of dw = dyᵀ · x: float dy [..., out] and x [..., in] with the same
/// leading dimensions, dw [out, in] (named `dwName` in errors: "acc" for the accumulating
/// kernels).
LinearSizes checkLinearGradWeight(const char *kernel, const TensorView &dy, const TensorView &x,
                                  const TensorView &dw, const char *dwName = "dw");

/// `axis` in [-rank, rank) made non-negative; throws otherwise.
int64_t normalizeAxis(const char *kernel, int64_t axis, int64_t rank);

/// A one-dimensional view of elements [offset, offset + count) of `t`.
TensorView subView(const TensorView &t, int64_t offset, int64_t count);

/// The elements of a float tensor as fp32: its own data when it is F32, else `scratch` filled
/// by loadF32.
const float *loadFloats(const TensorView &t, std::vector<float> &scratch);

/// Where a kernel puts the fp32 result for `out`: `out`'s own data when it is F32 and shares no
/// byte with an input (a kernel that reads inputs while writing must not see its own writes),
/// else `scratch`, which the kernel then stores into `out` with storeF32.
float *resultBuffer(const TensorView &out, std::initializer_list<const TensorView *> inputs,
                    std::vector<float> &scratch);

/// Whether the byte ranges of two tensors intersect.
bool overlaps(const TensorView &a, const TensorView &b);

/// "[1, 4]": the multi-index of flat position `flat` in `shape`.
std::string formatIndex(int64_t flat, const std::vector<int64_t> &shape);

/// Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items, on
/// up to hardware_concurrency threads. Each item must be independent of the others, so the
/// result does not depend on the split. Exceptions are rethrown after every thread has joined.
void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn);

/// y = x [batch, seq, heads, head_dim] with each pair (i, i + head_dim / 2) rotated by RoPE's
/// angle s theta^(-2i / head_dim) at position s, or by its transpose (`transpose`: rope's
/// gradient). The body of cpu::rope and cpu::ropeGrad (runtime/cpu/Attention.cpp); `kernel`,
/// `xName` and `yName` word its errors.
void rotatePairs(const char *kernel, const char *xName, const TensorView &x, double theta,
                 bool transpose, const char *yName, const TensorView &y);

/// Checks that `t` is a float scalar (one element) and returns it.
double loadScalar(const char *kernel, const char *operand, const TensorView &t);
/// Checks that `step` is an i64 scalar holding a non-negative count and returns it.
int64_t loadStep(const char *kernel, const TensorView &step);

} // namespace bonsai::rt::cpu::detail

#endif // BONSAI_RUNTIME_CPU_KERNELUTIL_H
