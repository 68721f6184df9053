//===- GemmImpl.h - The cuBLASLt engine behind GemmEngine ------------------===//
//
// Private to runtime/cuda. LtEngine owns the cuBLASLt handle, the workspace and a cache of
// matmul plans (descriptor, three layouts and the algorithm the heuristic chose) keyed by
// everything that decides them: dtypes, transposes, sizes, batch and strides, epilogue and the
// operands' pointer alignments. GemmEngine (whose Impl holds one LtEngine) forwards its public
// gemm to `run`; the backend's linear kernel reaches the engine through ltEngineOf for what the
// public signature cannot say: an output dtype other than the operands' (an fp32 result to add
// a bias of another dtype into) and the fused bias epilogue. (GemmEngine::Impl is private to
// GemmEngine, so the engine is registered by the constructor rather than reached through it.)
//
// cuBLASLt's fast kernels want every row of every matrix on a 16-byte boundary and m, n and k
// multiples of 16 bytes of elements: GPT-2's vocabulary of 50257 as n (the lm_head) or k (its
// input gradient) makes it fall back to kernels six to eight times slower, even with aligned
// leading dimensions. LtEngine::run therefore rounds m, n and k up to multiples of 16 bytes and
// runs the GEMM on copies in stream-ordered scratch of every matrix whose extent grows or whose
// rows are not aligned: the operands copied in with zero padding (so the padded k adds exact
// zeros), the output copied out (and in first when beta reads it), the bias padded with zeros.
// The GEMM on the copies computes the same fp32 sums, rounded once into C. A GELU epilogue's
// auxiliary output (the pre-activation) is staged like C, its rows padded to 8 elements.
//
// Row-major matrices are handed to cuBLASLt (column-major) transposed: row-major C[m, n] is
// column-major Cᵀ[n, m], and C = op(A) op(B) is computed as Cᵀ = op(B)ᵀ op(A)ᵀ, that is with
// cuBLASLt's A = our B and its B = our A, the transpose flags unchanged.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CUDA_GEMMIMPL_H
#define BONSAI_RUNTIME_CUDA_GEMMIMPL_H

#include "bonsai/runtime/CudaKernels.h"

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace bonsai::rt::cuda::detail {

/// One GEMM as the backend asks for it (row-major, see GemmEngine::gemm).
struct GemmCall {
  DType abType = DType::F32; ///< storage of A and B
  DType cType = DType::F32;  ///< storage of C (and of the bias when there is one)
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void *a = nullptr, *b = nullptr;
  void *c = nullptr;
  /// With beta != 0: the matrix beta scales, laid out as c (cuBLASLt's C, read only), when it
  /// is not c itself (cuBLASLt's D); null means c.
  const void *addend = nullptr;
  int64_t strideA = 0, strideB = 0, strideC = 0, batch = 1;
  /// Leading dimensions (elements between rows of the row-major matrices); 0 means dense: A's
  /// is k (m when transA), B's n (k when transB), C's n.
  int64_t lda = 0, ldb = 0, ldc = 0;
  /// With a bias, C[i, j] = alpha op(A) op(B) + beta C + bias[j] in fp32, rounded once; bias
  /// has n elements of cType.
  const void *bias = nullptr;
  /// With `geluAux` (cuBLASLt's GELU_AUX / GELU_AUX_BIAS epilogue, tanh GELU): the fp32 value z
  /// above is stored, rounded once, into geluAux (m x n of cType, leading dimension ldAux, 0
  /// meaning n) and C = gelu(z), rounded once. cuBLASLt wants ldAux a multiple of 8: run()
  /// stages the matrix when it is not.
  void *geluAux = nullptr;
  int64_t ldAux = 0;
};

/// One FP8 GEMM (docs/fp8.md): row-major D[m, n] = (A[m, k] · B[n, k]ᵀ) · descaleA · descaleB
/// (+ bias[j]) from FP8 codes, accumulated in fp32 and rounded once into D (f32, f16 or bf16).
/// B is taken transposed because cuBLASLt's FP8 kernels take only its "TN" layout; m, n and k
/// are multiples of 16 and every pointer 16-byte aligned.
struct Fp8GemmCall {
  DType aType = DType::F8E4M3FN, bType = DType::F8E4M3FN; ///< F8E4M3FN or F8E5M2, not both E5M2
  DType dType = DType::BF16;
  int64_t m = 0, n = 0, k = 0;
  const void *a = nullptr, *b = nullptr;
  void *d = nullptr;
  const float *descaleA = nullptr, *descaleB = nullptr; ///< device memory
  const void *bias = nullptr;                           ///< n elements of dType, or null
  bool accumulate = false; ///< d += the product (beta = 1: d is also cuBLASLt's C)
  /// Keep the sum in the tensor cores' accumulator (CUBLASLT_MATMUL_DESC_FAST_ACCUM) instead of
  /// promoting partial sums to fp32 registers: faster, less precise over long K.
  bool fastAccumulation = false;
};

/// cuBLASLt handle, workspace and plan cache (not thread-safe: one per device and stream).
class LtEngine {
public:
  /// Creates the handle and the workspace. Throws rt::Error on failure.
  explicit LtEngine(size_t workspaceBytes);
  ~LtEngine();
  LtEngine(const LtEngine &) = delete;
  LtEngine &operator=(const LtEngine &) = delete;

  /// Enqueues one GEMM on `stream`; `kernel` names the backend kernel in errors.
  void run(const char *kernel, Stream stream, const GemmCall &call);
  /// Enqueues one FP8 GEMM on `stream`.
  void runFp8(const char *kernel, Stream stream, const Fp8GemmCall &call);

  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t aLayout = nullptr, bLayout = nullptr, cLayout = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

private:
  using Key = std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, int, int, int,
                         int, int64_t, int>;
  Plan &plan(const char *kernel, const GemmCall &call, const Key &key);
  using Fp8Key = std::tuple<int, int, int, int64_t, int64_t, int64_t, bool, bool>;
  Plan &fp8Plan(const char *kernel, const Fp8GemmCall &call, const Fp8Key &key);
  /// Runs a call whose matrices all have 16-byte aligned rows (or any call, slowly).
  void runAligned(const char *kernel, Stream stream, const GemmCall &call);

  cublasLtHandle_t handle_ = nullptr;
  void *workspace_ = nullptr;
  size_t workspaceBytes_ = 0;
  std::map<Key, Plan> plans_;
  std::map<Fp8Key, Plan> fp8Plans_;
};

/// One of `count` row-major matrices of `rows` x `cols` elements, `ld` elements from one row to
/// the next and `stride` from one matrix to the next.
struct MatrixSpan {
  const void *data;
  int64_t rows, cols, ld, stride;
};

/// Copies `count` matrices of `dtype` (f32, f16 or bf16) from src into dst on `stream`, bit for
/// bit, over dst's extent: elements of dst outside src's extent are set to zero (padding);
/// implemented in Linear.cu.
void copyMatrices(const char *kernel, Stream stream, DType dtype, const MatrixSpan &src,
                  const MatrixSpan &dst, int64_t count);

/// The engine of a live GemmEngine. Throws rt::Error naming `kernel` for an unknown one.
LtEngine &ltEngineOf(const char *kernel, GemmEngine &engine);

} // namespace bonsai::rt::cuda::detail

#endif // BONSAI_RUNTIME_CUDA_GEMMIMPL_H
