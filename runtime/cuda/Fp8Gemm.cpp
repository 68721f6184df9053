//===- Fp8Gemm.cpp - FP8 GEMMs through cuBLASLt ---------------------------===//
//
// Row-major D [m, n] = A [m, k] · B [n, k]ᵀ is, to column-major cuBLASLt, Dᵀ [n, m] = Bᵀ·A
// with B seen as a k × n column-major matrix taken transposed and A as k × m taken as is:
// cuBLASLt's "TN" case, the one layout its FP8 kernels support. The scales are the
// A/B_SCALE_POINTER attributes (device pointers: cuBLASLt multiplies the product by them), set
// before the algorithm is chosen (the heuristic picks among kernels that take them) and again
// on every call, as they may change between calls of the same shape. Plans (descriptor,
// layouts, algorithm) are cached by shape and types.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaFp8.h"

#include "CudaCheck.h"

#include <cublasLt.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {

void checkLt(cublasStatus_t status, const char *call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("fp8_gemm", std::string(call) + " failed: " + cublasLtGetStatusString(status));
}

cudaDataType_t fp8Type(DType dtype) {
  return dtype == DType::F8E4M3FN ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

cudaDataType_t outType(DType dtype) {
  switch (dtype) {
  case DType::BF16:
    return CUDA_R_16BF;
  case DType::F16:
    return CUDA_R_16F;
  default:
    return CUDA_R_32F;
  }
}

} // namespace

struct Fp8GemmEngine::Impl {
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    /// The heuristic's candidates, best first; `chosen` is the first that ran (-1 until a call
    /// has found one: a candidate may still answer "not supported" when it runs).
    std::vector<cublasLtMatmulAlgo_t> algos;
    int chosen = -1;
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int>;

  cublasLtHandle_t handle = nullptr;
  void *workspace = nullptr;
  size_t workspaceBytes = 0;
  std::map<Key, Plan> plans;

  static void destroy(Plan &p) {
    if (p.a)
      cublasLtMatrixLayoutDestroy(p.a);
    if (p.b)
      cublasLtMatrixLayoutDestroy(p.b);
    if (p.d)
      cublasLtMatrixLayoutDestroy(p.d);
    if (p.desc)
      cublasLtMatmulDescDestroy(p.desc);
    p = {};
  }

  /// Sets the scale pointers of `desc` (cuBLASLt's A is our b).
  static void setScales(cublasLtMatmulDesc_t desc, const float *descaleA,
                        const float *descaleB) {
    checkLt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                           &descaleB, sizeof descaleB),
            "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
    checkLt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                           &descaleA, sizeof descaleA),
            "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
  }

  Plan &plan(int64_t m, int64_t n, int64_t k, DType aType, DType bType, DType dType,
             const float *descaleA, const float *descaleB) {
    Key key{m, n, k, int(aType), int(bType), int(dType)};
    if (auto found = plans.find(key); found != plans.end())
      return found->second;
    Plan p;
    try {
      checkLt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              "cublasLtMatmulDescCreate");
      // cuBLASLt's A is our B (n × k, k contiguous: column-major k × n, transposed) and its B
      // our A (column-major k × m, as is).
      cublasOperation_t opA = CUBLAS_OP_T, opB = CUBLAS_OP_N;
      checkLt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA,
                                             sizeof opA),
              "cublasLtMatmulDescSetAttribute(TRANSA)");
      checkLt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB,
                                             sizeof opB),
              "cublasLtMatmulDescSetAttribute(TRANSB)");
      checkLt(cublasLtMatrixLayoutCreate(&p.a, fp8Type(bType), k, n, k),
              "cublasLtMatrixLayoutCreate(A)");
      checkLt(cublasLtMatrixLayoutCreate(&p.b, fp8Type(aType), k, m, k),
              "cublasLtMatrixLayoutCreate(B)");
      checkLt(cublasLtMatrixLayoutCreate(&p.d, outType(dType), n, m, n),
              "cublasLtMatrixLayoutCreate(D)");
      setScales(p.desc, descaleA, descaleB);
      cublasLtMatmulPreference_t pref = nullptr;
      checkLt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
      uint64_t ws = workspaceBytes;
      cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      cublasLtMatmulHeuristicResult_t results[8] = {};
      int returned = 0;
      if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, 8,
                                                results, &returned);
      cublasLtMatmulPreferenceDestroy(pref);
      checkLt(status, "cublasLtMatmulAlgoGetHeuristic");
      if (returned == 0)
        fail("fp8_gemm", "cuBLASLt has no FP8 algorithm for m=" + std::to_string(m) +
                             " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                             " on this GPU (FP8 tensor cores need sm_89 or sm_90)");
      for (int i = 0; i < returned; ++i)
        p.algos.push_back(results[i].algo);
    } catch (...) {
      destroy(p);
      throw;
    }
    return plans.emplace(key, p).first->second;
  }
};

Fp8GemmEngine::Fp8GemmEngine(size_t workspaceBytes) : impl_(new Impl) {
  try {
    checkLt(cublasLtCreate(&impl_->handle), "cublasLtCreate");
    if (workspaceBytes)
      checkCuda(cudaMalloc(&impl_->workspace, workspaceBytes), "cudaMalloc(workspace)",
                "fp8_gemm");
    impl_->workspaceBytes = workspaceBytes;
  } catch (...) {
    if (impl_->handle)
      cublasLtDestroy(impl_->handle);
    delete impl_;
    throw;
  }
}

Fp8GemmEngine::~Fp8GemmEngine() {
  for (auto &entry : impl_->plans)
    Impl::destroy(entry.second);
  if (impl_->workspace)
    cudaFree(impl_->workspace);
  if (impl_->handle)
    cublasLtDestroy(impl_->handle);
  delete impl_;
}

void Fp8GemmEngine::gemm(Stream stream, const TensorView &a, const float *descaleA,
                         const TensorView &b, const float *descaleB, const TensorView &d) {
  const char *kn = "fp8_gemm";
  auto isFp8 = [](DType t) { return t == DType::F8E4M3FN || t == DType::F8E5M2; };
  checkView(kn, "a", a);
  checkView(kn, "b", b);
  checkFloat(kn, "d", d);
  if (!isFp8(a.dtype) || !isFp8(b.dtype))
    fail(kn, std::string("a and b must be f8e4m3fn or f8e5m2, got ") + dtypeName(a.dtype) +
                 " and " + dtypeName(b.dtype));
  if (a.dtype == DType::F8E5M2 && b.dtype == DType::F8E5M2)
    fail(kn, "cuBLASLt has no e5m2 x e5m2 GEMM: one operand must be e4m3fn");
  if (a.rank() != 2 || b.rank() != 2 || d.rank() != 2)
    fail(kn, "a [m, k], b [n, k] and d [m, n] must be matrices");
  const int64_t m = a.dim(0), k = a.dim(1), n = b.dim(0);
  if (b.dim(1) != k || d.dim(0) != m || d.dim(1) != n)
    fail(kn, "shapes disagree: a [" + std::to_string(m) + ", " + std::to_string(k) + "], b [" +
                 std::to_string(b.dim(0)) + ", " + std::to_string(b.dim(1)) + "], d [" +
                 std::to_string(d.dim(0)) + ", " + std::to_string(d.dim(1)) + "]");
  if (k % 16 != 0 || (n * int64_t(dtypeSize(d.dtype))) % 16 != 0)
    fail(kn, "FP8 tensor cores need k a multiple of 16 and rows of d of a multiple of 16 "
             "bytes; got k=" + std::to_string(k) + " n=" + std::to_string(n));
  if (!aligned16(a.data) || !aligned16(b.data) || !aligned16(d.data))
    fail(kn, "a, b and d must start on 16-byte boundaries");
  if (!descaleA || !descaleB)
    fail(kn, "the descales of a and b are required (device pointers)");
  if (m == 0 || n == 0)
    return;

  Impl::Plan &p = impl_->plan(m, n, k, a.dtype, b.dtype, d.dtype, descaleA, descaleB);
  Impl::setScales(p.desc, descaleA, descaleB);
  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t &algo) {
    // C is not read (beta = 0): FP8 kernels run out of place, without C.
    return cublasLtMatmul(impl_->handle, p.desc, &alpha, b.data, p.a, a.data, p.b, &beta,
                          nullptr, p.d, d.data, p.d, &algo, impl_->workspace,
                          impl_->workspaceBytes, stream);
  };
  if (p.chosen >= 0)
    return checkLt(run(p.algos[p.chosen]), "cublasLtMatmul");
  // The first call tries the candidates in the heuristic's order: one may be "not supported"
  // at run time for these operands, as cuBLASLt's documentation warns.
  cublasStatus_t status = CUBLAS_STATUS_NOT_SUPPORTED;
  for (int i = 0; i < int(p.algos.size()); ++i) {
    status = run(p.algos[i]);
    if (status == CUBLAS_STATUS_SUCCESS) {
      p.chosen = i;
      return;
    }
    if (status != CUBLAS_STATUS_NOT_SUPPORTED)
      break;
  }
  checkLt(status, ("cublasLtMatmul (" + std::to_string(p.algos.size()) +
                   " candidate algorithms)").c_str());
}

} // namespace bonsai::rt::cuda
