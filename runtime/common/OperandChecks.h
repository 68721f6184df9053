//===- OperandChecks.h - The operand checks both backends' kernels share --===//
//
// Private to the runtime's kernels. A kernel called directly (the unit tests, the benchmarks)
// checks its operands before it touches them; a kernel called from a plan runs on operands its
// kind's contract already checked (runtime/contract/), so these checks never fire there. They
// are written once, here, for the CPU and the CUDA kernels alike: same conditions, same
// messages, each backend's prefix ("cpu linear: ...", "cuda linear: ..."). A backend binds its
// prefix once with BONSAI_BIND_OPERAND_CHECKS in its private header (cpu/KernelUtil.h,
// cuda/CudaCheck.h), so its kernels call `checkFloat(kernel, "x", x)`.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_COMMON_OPERANDCHECKS_H
#define BONSAI_RUNTIME_COMMON_OPERANDCHECKS_H

#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace bonsai::rt::checks {

/// Throws rt::Error("<backend> <kernel>: <message>").
[[noreturn]] void fail(const char *backend, const char *kernel, const std::string &message);

/// Checks that `t` has non-negative dimensions and, unless empty, data.
void checkView(const char *backend, const char *kernel, const char *operand, const TensorView &t);
/// checkView, plus the dtype is F32, F16 or BF16.
void checkFloat(const char *backend, const char *kernel, const char *operand, const TensorView &t);
/// checkView, plus the dtype is I32 or I64.
void checkIndex(const char *backend, const char *kernel, const char *operand, const TensorView &t);

/// Throws "<operand> shape A should be E <context>" unless `a` has shape `expected`; the
/// context names the operands the expectation comes from and their shapes.
void checkShape(const char *backend, const char *kernel, const char *operand, const TensorView &a,
                const std::vector<int64_t> &expected, const std::string &context);
/// Throws naming both operands and shapes unless they have the same shape.
void checkSameShape(const char *backend, const char *kernel, const char *nameA,
                    const TensorView &a, const char *nameB, const TensorView &b);
/// `axis` in [-rank, rank) made non-negative; throws otherwise.
int64_t normalizeAxis(const char *backend, const char *kernel, int64_t axis, int64_t rank);

/// Checks concat's inputs (one or more, y's rank and dtype, y's shape outside `axis`) against
/// y, whose size along `axis` is theirs summed; returns the axis made non-negative.
int64_t checkConcat(const char *backend, const char *kernel, const std::vector<TensorView> &xs,
                    int64_t axis, const TensorView &y);

/// Whether the byte ranges of two tensors intersect (an empty tensor intersects nothing).
bool overlaps(const TensorView &a, const TensorView &b);

/// The sizes of a linear's GEMMs: rows (the product of the activation's leading dimensions),
/// output and input features.
struct LinearSizes {
  int64_t rows, out, in;
};
/// Checks the operands of y = x · wᵀ (+ bias): float x [..., in], w [out, in], bias [out], and
/// y [..., out] (linear and fp8_linear).
LinearSizes checkLinear(const char *backend, const char *kernel, const TensorView &x,
                        const TensorView &w, const TensorView *bias, const TensorView &y);
/// Checks the operands of dx = dy · w: float dy [..., out], w [out, in], dx [..., in].
LinearSizes checkLinearGradInput(const char *backend, const char *kernel, const TensorView &dy,
                                 const TensorView &w, const TensorView &dx);
/// Checks the operands of dw = dyᵀ · x: float dy [..., out] and x [..., in] with the same
/// leading dimensions, dw [out, in] (named `dwName` in errors: "acc" for the accumulating
/// kernels).
LinearSizes checkLinearGradWeight(const char *backend, const char *kernel, const TensorView &dy,
                                  const TensorView &x, const TensorView &dw,
                                  const char *dwName = "dw");

/// Checks x [..., D], a weight (and bias) [D] and y like x (the norms); returns D.
int64_t checkNorm(const char *backend, const char *kernel, const TensorView &x,
                  const TensorView &w, const TensorView *b, const TensorView &y);
/// Checks dy [..., D], x like dy, a weight [D] and dx like dy (the norms' gradients); returns D.
int64_t checkNormGrad(const char *backend, const char *kernel, const TensorView &dy,
                      const TensorView &x, const TensorView &w, const TensorView &dx);

/// Checks dy [..., D], y like dy, scale and magnitude [D], dx like dy and dmagnitude like
/// magnitude, all of dy's float dtype (dora_grad); returns D.
int64_t checkDoraGrad(const char *backend, const char *kernel, const TensorView &dy,
                      const TensorView &y, const TensorView &scale, const TensorView &magnitude,
                      const TensorView &dx, const TensorView &dmagnitude);

/// Checks the attention output `o` [batch, seq, heads, head_dim] and a packed qkv [batch, seq,
/// heads + 2 kv_heads, head_dim] (float, rank 4) holding o's query heads and then two equal
/// numbers of key/value heads that divide them. Returns kv_heads.
int64_t checkPackedQkv(const char *backend, const char *kernel, const char *operand,
                       const TensorView &qkv, const TensorView &o);

/// Checks that `step` is the i64 scalar step counter.
void checkStep(const char *backend, const char *kernel, const TensorView &step);
/// Checks that `t` is an f32 tensor of `shape` (optimizer state, GaLore's projections).
void checkF32(const char *backend, const char *kernel, const char *operand, const TensorView &t,
              const std::vector<int64_t> &shape);
/// Checks a 2-D gradient-shaped tensor against the side GaLore projects (`left`: its rows,
/// which must then be the smaller side) and returns its (rows, columns).
std::pair<int64_t, int64_t> checkGaloreSide(const char *backend, const char *kernel,
                                            const char *operand, const TensorView &t, bool left);

} // namespace bonsai::rt::checks

/// Declares, in a backend's private namespace, the checks above with its prefix `Backend`
/// ("cpu", "cuda") bound, so that its kernels call them as `checkFloat(kernel, "x", x)`.
#define BONSAI_BIND_OPERAND_CHECKS(Backend)                                                        \
  using ::bonsai::rt::checks::LinearSizes;                                                         \
  using ::bonsai::rt::checks::overlaps;                                                            \
  [[noreturn]] inline void fail(const char *kernel, const std::string &message) {                  \
    ::bonsai::rt::checks::fail(Backend, kernel, message);                                          \
  }                                                                                                \
  inline void checkView(const char *kernel, const char *operand, const TensorView &t) {            \
    ::bonsai::rt::checks::checkView(Backend, kernel, operand, t);                                  \
  }                                                                                                \
  inline void checkFloat(const char *kernel, const char *operand, const TensorView &t) {           \
    ::bonsai::rt::checks::checkFloat(Backend, kernel, operand, t);                                 \
  }                                                                                                \
  inline void checkIndex(const char *kernel, const char *operand, const TensorView &t) {           \
    ::bonsai::rt::checks::checkIndex(Backend, kernel, operand, t);                                 \
  }                                                                                                \
  inline void checkShape(const char *kernel, const char *operand, const TensorView &a,             \
                         const std::vector<int64_t> &expected, const std::string &context) {       \
    ::bonsai::rt::checks::checkShape(Backend, kernel, operand, a, expected, context);              \
  }                                                                                                \
  inline void checkSameShape(const char *kernel, const char *nameA, const TensorView &a,           \
                             const char *nameB, const TensorView &b) {                             \
    ::bonsai::rt::checks::checkSameShape(Backend, kernel, nameA, a, nameB, b);                     \
  }                                                                                                \
  inline int64_t normalizeAxis(const char *kernel, int64_t axis, int64_t rank) {                   \
    return ::bonsai::rt::checks::normalizeAxis(Backend, kernel, axis, rank);                       \
  }                                                                                                \
  inline int64_t checkConcat(const char *kernel, const std::vector<TensorView> &xs, int64_t axis,  \
                             const TensorView &y) {                                                \
    return ::bonsai::rt::checks::checkConcat(Backend, kernel, xs, axis, y);                        \
  }                                                                                                \
  inline LinearSizes checkLinear(const char *kernel, const TensorView &x, const TensorView &w,     \
                                 const TensorView *bias, const TensorView &y) {                    \
    return ::bonsai::rt::checks::checkLinear(Backend, kernel, x, w, bias, y);                      \
  }                                                                                                \
  inline LinearSizes checkLinearGradInput(const char *kernel, const TensorView &dy,                \
                                          const TensorView &w, const TensorView &dx) {             \
    return ::bonsai::rt::checks::checkLinearGradInput(Backend, kernel, dy, w, dx);                 \
  }                                                                                                \
  inline LinearSizes checkLinearGradWeight(const char *kernel, const TensorView &dy,               \
                                           const TensorView &x, const TensorView &dw,              \
                                           const char *dwName = "dw") {                            \
    return ::bonsai::rt::checks::checkLinearGradWeight(Backend, kernel, dy, x, dw, dwName);        \
  }                                                                                                \
  inline int64_t checkNorm(const char *kernel, const TensorView &x, const TensorView &w,           \
                           const TensorView *b, const TensorView &y) {                             \
    return ::bonsai::rt::checks::checkNorm(Backend, kernel, x, w, b, y);                           \
  }                                                                                                \
  inline int64_t checkNormGrad(const char *kernel, const TensorView &dy, const TensorView &x,      \
                               const TensorView &w, const TensorView &dx) {                        \
    return ::bonsai::rt::checks::checkNormGrad(Backend, kernel, dy, x, w, dx);                     \
  }                                                                                                \
  inline int64_t checkDoraGrad(const char *kernel, const TensorView &dy, const TensorView &y,      \
                               const TensorView &scale, const TensorView &magnitude,               \
                               const TensorView &dx, const TensorView &dmagnitude) {               \
    return ::bonsai::rt::checks::checkDoraGrad(Backend, kernel, dy, y, scale, magnitude, dx,       \
                                               dmagnitude);                                        \
  }                                                                                                \
  inline int64_t checkPackedQkv(const char *kernel, const char *operand, const TensorView &qkv,    \
                                const TensorView &o) {                                             \
    return ::bonsai::rt::checks::checkPackedQkv(Backend, kernel, operand, qkv, o);                 \
  }                                                                                                \
  inline void checkStep(const char *kernel, const TensorView &step) {                              \
    ::bonsai::rt::checks::checkStep(Backend, kernel, step);                                        \
  }                                                                                                \
  inline void checkF32(const char *kernel, const char *operand, const TensorView &t,               \
                       const std::vector<int64_t> &shape) {                                        \
    ::bonsai::rt::checks::checkF32(Backend, kernel, operand, t, shape);                            \
  }                                                                                                \
  inline std::pair<int64_t, int64_t> checkSide(const char *kernel, const char *operand,            \
                                               const TensorView &t, bool left) {                   \
    return ::bonsai::rt::checks::checkGaloreSide(Backend, kernel, operand, t, left);               \
  }

#endif // BONSAI_RUNTIME_COMMON_OPERANDCHECKS_H
