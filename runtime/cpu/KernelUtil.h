//===- KernelUtil.h - Checks, sub-views and threading of the CPU kernels --===//
//
// Private to runtime/cpu: the operand checks every kernel runs before it writes anything (dtype,
// shape agreement, null data; shared with the CUDA kernels, OperandChecks.h), sub-views of contiguous element ranges through which kernels
// convert bounded pieces to fp32, and a deterministic parallel loop over independent items.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CPU_KERNELUTIL_H
#define BONSAI_RUNTIME_CPU_KERNELUTIL_H

#include "bonsai/runtime/KernelAttrs.h"
#include "bonsai/runtime/Tensor.h"

#include "OperandChecks.h"

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

namespace bonsai::rt::cpu::detail {

// The operand checks shared with the CUDA kernels (OperandChecks.h), prefixed "cpu".
BONSAI_BIND_OPERAND_CHECKS("cpu")

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

/// "[1, 4]": the multi-index of flat position `flat` in `shape`.
std::string formatIndex(int64_t flat, const std::vector<int64_t> &shape);

/// Multiply-adds per thread below which threading costs more than it saves (the attention
/// kernels' grain).
constexpr int64_t kWorkGrain = 1 << 16;

/// Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items, on
/// up to hostThreads() threads (HostThreads.h). Each item must be independent of the others, so the
/// result does not depend on the split. Exceptions are rethrown after every thread has joined.
void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn);

/// dw [out, in] = aᵀ b (or dw += aᵀ b with `accumulate`) for a [rows, out] and b [rows, in]:
/// each element a dot product of a column of a and a column of b in one fixed order (eight
/// running sums, element r into sum r % 8, combined pairwise, then the tail). Not OpenBLAS,
/// whose kernels sum an element in an order that depends on where it falls in their tiles, so
/// that aᵀb and the transpose of bᵀa differed in the last bits on some CPUs (an AMD EPYC with
/// AVX2): GPT-2's transposed weight gradients, which the gemm-epilogue fusion computes the other
/// way round. Here both are the same on every machine and for any number of threads.
void weightGradient(const float *a, const float *b, int64_t rows, int64_t out, int64_t in,
                    bool accumulate, float *dw);

/// y = x [batch, seq, heads, head_dim] with each pair (i, i + head_dim / 2) rotated by RoPE's
/// angle s theta^(-2i / head_dim) at position s, or by its transpose (`transpose`: rope's
/// gradient). The body of cpu::rope and cpu::ropeGrad (runtime/cpu/Attention.cpp); `kernel`,
/// `xName` and `yName` word its errors.
void rotatePairs(const char *kernel, const char *xName, const TensorView &x, const RoPEAttrs &a,
                 const TensorView *positions, bool transpose, const char *yName,
                 const TensorView &y);

/// The optional per-token operand `name` (positions, segment ids) of a [batch, seq, ...]
/// kernel as int64, row-major [batch, seq]; empty when `t` is null. Fails unless it is an i32
/// or i64 [batch, seq] tensor.
std::vector<int64_t> loadTokenOperand(const char *kernel, const char *name, const TensorView *t,
                                      int64_t batch, int64_t seq);

/// Checks that `t` is a float scalar (one element) and returns it.
double loadScalar(const char *kernel, const char *operand, const TensorView &t);
/// Checks that `step` is an i64 scalar holding a non-negative count and returns it.
int64_t loadStep(const char *kernel, const TensorView &step);

/// Copies heads [fromHead, fromHead + count) of every position of `from` [B, S, heads, D] to
/// heads [toHead, ...) of `to` [B, S, heads', D] (the same B, S, D and dtype).
void copyHeads(const TensorView &from, int64_t fromHead, const TensorView &to, int64_t toHead,
               int64_t count);

/// q, k and v of a packed qkv [B, S, H + 2 KV, D] (checkPackedQkv; H is the attention output
/// o's) as tensors of their own,
/// [B, S, H, D] and [B, S, KV, D] twice, which `storage` holds: copies, or with `copy` false
/// tensors of those shapes to be written.
struct UnpackedQkv {
  TensorView views[3];
  std::vector<char> storage[3];
};
UnpackedQkv unpackQkv(const char *kernel, const TensorView &qkv, const TensorView &o,
                      bool copy = true);

} // namespace bonsai::rt::cpu::detail

#endif // BONSAI_RUNTIME_CPU_KERNELUTIL_H
