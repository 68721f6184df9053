//===- Gemm.cpp - GemmEngine: row-major GEMMs through cuBLASLt --------------===//
//
// Implements GemmEngine and the LtEngine it holds (GemmImpl.h). Every GEMM accumulates in fp32
// (CUBLAS_COMPUTE_32F, never the TF32 mode, so f32 GEMMs are f32 GEMMs) with f32, f16 or bf16
// storage. A plan (matmul descriptor, layouts, and the algorithm cuBLASLt's heuristic ranks
// first under the engine's workspace and the operands' actual pointer alignments) is built on
// the first call of each shape and reused after: the same call always runs the same algorithm,
// which keeps results identical run to run. Matrices whose rows are not 16-byte aligned are
// staged through aligned scratch copies first (GemmImpl.h says why). Every cuBLASLt and CUDA
// call is checked.
//
//===----------------------------------------------------------------------===//

#include "GemmImpl.h"

#include "CudaCheck.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace bonsai::rt::cuda {

namespace detail {

namespace {

void checkCublas(cublasStatus_t status, const char *call, const char *kernel) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(kernel, std::string(call) + " failed: " + cublasLtGetStatusName(status) + ": " +
                     cublasLtGetStatusString(status));
}

cudaDataType_t cudaType(const char *kernel, DType dtype) {
  switch (dtype) {
  case DType::F32:
    return CUDA_R_32F;
  case DType::F16:
    return CUDA_R_16F;
  case DType::BF16:
    return CUDA_R_16BF;
  default:
    fail(kernel, std::string("GEMM storage must be f32, f16 or bf16, not ") + dtypeName(dtype));
  }
}

/// Whether every cuBLASLt output is zeroed before a GEMM that does not read it (beta = 0)
/// writes it: BONSAI_ZERO_GEMM_OUTPUTS=1, which test/gpu/sanitize.sh sets for initcheck only.
/// That tool does not see the TMA stores of cuBLASLt's Hopper kernels, so memory that only
/// cuBLASLt wrote reads as uninitialised (docs/reliability.md has the probe); a memset is an
/// initialisation it does see, and one the GEMM then overwrites. Off, it costs nothing.
bool zeroGemmOutputs() {
  static const bool on = [] {
    const char *value = std::getenv("BONSAI_ZERO_GEMM_OUTPUTS");
    return value && *value && std::string(value) != "0";
  }();
  return on;
}

/// Zeroes `batch` row-major matrices of rows x cols `dtype` elements (leading dimension ld,
/// batch stride `stride`), and nothing between their rows, which may belong to other tensors.
void zeroMatrices(const char *kernel, Stream stream, void *data, int64_t rows, int64_t cols,
                  int64_t ld, int64_t stride, int64_t batch, DType dtype) {
  size_t size = dtypeSize(dtype);
  for (int64_t b = 0; b < (stride == 0 ? 1 : batch); ++b)
    checkCuda(cudaMemset2DAsync(static_cast<char *>(data) + size_t(b * stride) * size,
                                size_t(ld) * size, 0, size_t(cols) * size, size_t(rows), stream),
              "cudaMemset2DAsync(GEMM output)", kernel);
}

/// The alignment cuBLASLt may assume for a matrix: its address's, lowered by the batch
/// stride's when the batch steps through memory; at most 256 (what cuBLASLt asks by default).
int alignmentOf(const void *p, int64_t stride, int64_t batch, DType dtype) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1 && stride != 0)
    bits |= uintptr_t(stride) * dtypeSize(dtype);
  return int(bits & (~bits + 1)); // the lowest set bit
}

void setDesc(const char *kernel, cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
             const void *value, size_t size, const char *name) {
  checkCublas(cublasLtMatmulDescSetAttribute(desc, attr, value, size),
              (std::string("cublasLtMatmulDescSetAttribute(") + name + ")").c_str(), kernel);
}

/// A column-major layout of rows x cols with leading dimension ld, batched.
cublasLtMatrixLayout_t makeLayout(const char *kernel, cudaDataType_t type, int64_t rows,
                                  int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  checkCublas(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld),
              "cublasLtMatrixLayoutCreate", kernel);
  if (batch > 1) {
    int32_t count = int32_t(batch);
    cublasStatus_t status = cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    if (status != CUBLAS_STATUS_SUCCESS) {
      cublasLtMatrixLayoutDestroy(layout); // the error being reported is the one that matters
      checkCublas(status, "cublasLtMatrixLayoutSetAttribute(batch)", kernel);
    }
  }
  return layout;
}

/// The leading dimension of matrix 'a', 'b' or 'c' of a call (its row length when dense).
int64_t leadingDim(const GemmCall &call, char which) {
  switch (which) {
  case 'a':
    return call.lda ? call.lda : call.transA ? call.m : call.k;
  case 'b':
    return call.ldb ? call.ldb : call.transB ? call.k : call.n;
  default:
    return call.ldc ? call.ldc : call.n;
  }
}

/// Matrix 'a', 'b' or 'c' of a call as it lies in memory.
MatrixSpan matrixOf(const GemmCall &call, char which) {
  int64_t ld = leadingDim(call, which);
  switch (which) {
  case 'a':
    return {call.a, call.transA ? call.k : call.m, call.transA ? call.m : call.k, ld,
            call.strideA};
  case 'b':
    return {call.b, call.transB ? call.n : call.k, call.transB ? call.k : call.n, ld,
            call.strideB};
  default:
    return {call.c, call.m, call.n, ld, call.strideC};
  }
}

/// Whether every row of every matrix of `mat` starts on a 16-byte boundary.
bool rowsAligned(const MatrixSpan &mat, int64_t batch, DType dtype) {
  if (alignmentOf(mat.data, mat.stride, batch, dtype) < 16)
    return false;
  return mat.rows <= 1 || (size_t(mat.ld) * dtypeSize(dtype)) % 16 == 0;
}

/// `v` rounded up to a multiple of `unit`.
int64_t roundUp(int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; }

/// A scratch matrix (kept alive by `keep`) of rows x cols elements, each row on a 16-byte
/// boundary, dense over the batch when `mat` steps through memory; `mat` copied in with zero
/// padding when `copyIn`.
MatrixSpan staged(const char *kernel, Stream stream, const MatrixSpan &mat, int64_t rows,
                  int64_t cols, int64_t batch, DType dtype, bool copyIn,
                  std::vector<Scratch> &keep) {
  int64_t ld = roundUp(cols, int64_t(16 / dtypeSize(dtype)));
  int64_t count = batch > 1 && mat.stride != 0 ? batch : 1;
  keep.emplace_back(kernel, stream, size_t(count * rows * ld) * dtypeSize(dtype));
  MatrixSpan copy{keep.back().get(), rows, cols, ld, count > 1 ? rows * ld : 0};
  if (copyIn)
    copyMatrices(kernel, stream, dtype, mat, copy, count);
  return copy;
}

void destroyPlan(LtEngine::Plan &plan) {
  // Destruction paths cannot throw; cuBLASLt's destroy functions only fail on a null handle.
  if (plan.aLayout)
    cublasLtMatrixLayoutDestroy(plan.aLayout);
  if (plan.bLayout)
    cublasLtMatrixLayoutDestroy(plan.bLayout);
  if (plan.cLayout)
    cublasLtMatrixLayoutDestroy(plan.cLayout);
  if (plan.desc)
    cublasLtMatmulDescDestroy(plan.desc);
  plan = {};
}

/// Live engines: GemmEngine's constructor registers its LtEngine, the destructor removes it.
std::mutex registryMutex;
std::unordered_map<const GemmEngine *, LtEngine *> registry;

} // namespace

LtEngine::LtEngine(size_t workspaceBytes) {
  const char *k = "GemmEngine";
  checkCublas(cublasLtCreate(&handle_), "cublasLtCreate", k);
  if (workspaceBytes) {
    cudaError_t status = cudaMalloc(&workspace_, workspaceBytes);
    const char *call = "cudaMalloc(workspace)";
    // Split-K partial sums pass through the workspace, written by TMA stores and read back by
    // cuBLASLt's reduction kernel: zeroed once for initcheck, as the outputs are.
    if (status == cudaSuccess && zeroGemmOutputs()) {
      status = cudaMemset(workspace_, 0, workspaceBytes);
      call = "cudaMemset(workspace)";
    }
    if (status != cudaSuccess) {
      cudaFree(workspace_); // the first failure is the error to report
      cublasLtDestroy(handle_);
      checkCuda(status, call, k);
    }
  }
  workspaceBytes_ = workspaceBytes;
}

LtEngine::~LtEngine() {
  for (auto &entry : plans_)
    destroyPlan(entry.second);
  for (auto &entry : fp8Plans_)
    destroyPlan(entry.second);
  // Destructors cannot throw: failures are reported on stderr.
  if (workspace_) {
    cudaError_t status = cudaFree(workspace_);
    if (status != cudaSuccess)
      std::fprintf(stderr, "bonsai: cuda GemmEngine: cudaFree(workspace) failed: %s\n",
                   cudaGetErrorString(status));
  }
  if (handle_) {
    cublasStatus_t status = cublasLtDestroy(handle_);
    if (status != CUBLAS_STATUS_SUCCESS)
      std::fprintf(stderr, "bonsai: cuda GemmEngine: cublasLtDestroy failed: %s\n",
                   cublasLtGetStatusString(status));
  }
}

LtEngine::Plan &LtEngine::plan(const char *kernel, const GemmCall &call, const Key &key) {
  auto found = plans_.find(key);
  if (found != plans_.end())
    return found->second;

  Plan p;
  try {
    cudaDataType_t ab = cudaType(kernel, call.abType), c = cudaType(kernel, call.cType);
    checkCublas(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                "cublasLtMatmulDescCreate", kernel);
    // cuBLASLt's A is our B and its B our A (see GemmImpl.h); the flags follow the operands.
    cublasOperation_t opA = call.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = call.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA, "TRANSA");
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB, "TRANSB");
    if (call.geluAux) {
      cublasLtEpilogue_t epilogue =
          call.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue,
              "EPILOGUE");
      int64_t ldAux = call.ldAux ? call.ldAux : call.n;
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldAux, sizeof ldAux,
              "EPILOGUE_AUX_LD");
      int32_t auxType = int32_t(c);
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &auxType,
              sizeof auxType, "EPILOGUE_AUX_DATA_TYPE");
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.geluAux,
              sizeof call.geluAux, "EPILOGUE_AUX_POINTER");
      if (call.batch > 1) {
        int64_t auxStride = call.strideC;
        setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &auxStride,
                sizeof auxStride, "EPILOGUE_AUX_BATCH_STRIDE");
      }
    } else if (call.bias) {
      cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue,
              "EPILOGUE");
    }
    if (call.bias) {
      int32_t biasType = int32_t(c);
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType, sizeof biasType,
              "BIAS_DATA_TYPE");
      // The heuristic reads the pointer's alignment.
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof call.bias,
              "BIAS_POINTER");
    }
    int64_t m = call.m, n = call.n, k = call.k;
    int64_t lda = leadingDim(call, 'a'), ldb = leadingDim(call, 'b'), ldc = leadingDim(call, 'c');
    p.aLayout = call.transB ? makeLayout(kernel, ab, k, n, ldb, call.batch, call.strideB)
                            : makeLayout(kernel, ab, n, k, ldb, call.batch, call.strideB);
    p.bLayout = call.transA ? makeLayout(kernel, ab, m, k, lda, call.batch, call.strideA)
                            : makeLayout(kernel, ab, k, m, lda, call.batch, call.strideA);
    p.cLayout = makeLayout(kernel, c, n, m, ldc, call.batch, call.strideC);

    cublasLtMatmulPreference_t pref = nullptr;
    checkCublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", kernel);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    uint64_t wsBytes = workspaceBytes_;
    uint32_t alignA = uint32_t(alignmentOf(call.b, call.strideB, call.batch, call.abType));
    uint32_t alignB = uint32_t(alignmentOf(call.a, call.strideA, call.batch, call.abType));
    uint32_t alignC = uint32_t(alignmentOf(call.c, call.strideC, call.batch, call.cType));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, const void *> prefs[] = {
        {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alignA},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alignB},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alignC},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alignC},
    };
    for (const auto &[attr, value] : prefs) {
      if (status != CUBLAS_STATUS_SUCCESS)
        break;
      size_t size = attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? sizeof(uint64_t)
                                                                     : sizeof(uint32_t);
      status = cublasLtMatmulPreferenceSetAttribute(pref, attr, value, size);
    }
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.aLayout, p.bLayout, p.cLayout,
                                              p.cLayout, pref, 1, &result, &returned);
    cublasStatus_t destroyed = cublasLtMatmulPreferenceDestroy(pref);
    checkCublas(status, "cublasLtMatmulAlgoGetHeuristic", kernel);
    checkCublas(destroyed, "cublasLtMatmulPreferenceDestroy", kernel);
    if (returned == 0)
      fail(kernel, "cuBLASLt has no algorithm for a " + std::string(dtypeName(call.abType)) +
                       " GEMM m=" + std::to_string(m) + " n=" + std::to_string(n) +
                       " k=" + std::to_string(k) + " batch=" + std::to_string(call.batch) +
                       (call.bias ? " with a bias" : "") +
                       (call.geluAux ? " with a GELU epilogue" : ""));
    p.algo = result.algo;
  } catch (...) {
    destroyPlan(p);
    throw;
  }
  return plans_.emplace(key, p).first->second;
}

void LtEngine::run(const char *kernel, Stream stream, const GemmCall &call) {
  if (call.m < 0 || call.n < 0 || call.k < 0 || call.batch < 0)
    fail(kernel, "negative GEMM size m=" + std::to_string(call.m) + " n=" +
                     std::to_string(call.n) + " k=" + std::to_string(call.k) +
                     " batch=" + std::to_string(call.batch));
  if (call.batch > INT32_MAX)
    fail(kernel, "GEMM batch " + std::to_string(call.batch) + " exceeds cuBLASLt's int32 count");
  if (call.m == 0 || call.n == 0 || call.batch == 0)
    return;
  if (call.k == 0) {
    // An empty sum: C = beta C (+ bias). cuBLASLt wants k > 0; the zero case is a memset.
    if (call.beta != 0.0f || call.bias || call.geluAux)
      fail(kernel, "a GEMM with k = 0 is supported only as C = 0 (no beta, bias or epilogue)");
    size_t matrix = size_t(call.m * call.n) * dtypeSize(call.cType);
    if (call.batch == 1 || call.strideC == 0) {
      checkCuda(cudaMemsetAsync(call.c, 0, matrix, stream), "cudaMemsetAsync", kernel);
    } else {
      for (int64_t i = 0; i < call.batch; ++i)
        checkCuda(cudaMemsetAsync(static_cast<char *>(call.c) +
                                      size_t(i * call.strideC) * dtypeSize(call.cType),
                                  0, matrix, stream),
                  "cudaMemsetAsync", kernel);
    }
    return;
  }

  // m, n and k rounded up to 16 bytes, and aligned copies of the matrices that need them
  // (GemmImpl.h says why).
  const int64_t unit = int64_t(16 / dtypeSize(call.abType));
  GemmCall aligned = call;
  aligned.m = roundUp(call.m, unit);
  // The GELU epilogue's auxiliary matrix, laid out like C, wants rows of multiples of 8.
  aligned.n = roundUp(call.n, call.geluAux ? std::max<int64_t>(unit, 8) : unit);
  aligned.k = roundUp(call.k, unit);
  aligned.lda = aligned.ldb = aligned.ldc = aligned.ldAux = 0;
  std::vector<Scratch> keep;
  auto needsCopy = [&](const MatrixSpan &mat, const MatrixSpan &padded, DType dtype) {
    return mat.rows != padded.rows || mat.cols != padded.cols ||
           !rowsAligned(mat, call.batch, dtype);
  };
  MatrixSpan a = matrixOf(call, 'a'), aPad = matrixOf(aligned, 'a');
  if (needsCopy(a, aPad, call.abType)) {
    MatrixSpan s =
        staged(kernel, stream, a, aPad.rows, aPad.cols, call.batch, call.abType, true, keep);
    aligned.a = s.data;
    aligned.lda = s.ld;
    aligned.strideA = s.stride;
  } else {
    aligned.lda = a.ld;
  }
  MatrixSpan b = matrixOf(call, 'b'), bPad = matrixOf(aligned, 'b');
  if (needsCopy(b, bPad, call.abType)) {
    MatrixSpan s =
        staged(kernel, stream, b, bPad.rows, bPad.cols, call.batch, call.abType, true, keep);
    aligned.b = s.data;
    aligned.ldb = s.ld;
    aligned.strideB = s.stride;
  } else {
    aligned.ldb = b.ld;
  }
  MatrixSpan c = matrixOf(call, 'c'), cPad = matrixOf(aligned, 'c'), cs = c;
  // A GELU epilogue's auxiliary matrix shares C's batch stride: both are staged or neither.
  MatrixSpan aux{call.geluAux, call.m, call.n, call.ldAux ? call.ldAux : call.n, call.strideC},
      auxs = aux;
  bool stageC = needsCopy(c, cPad, call.cType) ||
                (call.geluAux && (needsCopy(aux, cPad, call.cType) || aux.ld % 8 != 0));
  bool stageAux = call.geluAux && stageC;
  // An addend of its own (read as C, laid out as c) is copied into the staged C; unstaged, it
  // must be as aligned as c for the plan chosen for c's alignment to read it.
  bool stageAddend = call.addend && call.beta != 0.0f &&
                     alignmentOf(call.addend, call.strideC, call.batch, call.cType) <
                         alignmentOf(call.c, call.strideC, call.batch, call.cType);
  stageC = stageC || stageAddend;
  if (stageC) {
    MatrixSpan in = c;
    if (call.addend)
      in.data = call.addend;
    cs = staged(kernel, stream, in, cPad.rows, cPad.cols, call.batch, call.cType, call.beta != 0.0f,
                keep);
    aligned.c = const_cast<void *>(cs.data);
    aligned.addend = nullptr;
    aligned.ldc = cs.ld;
    aligned.strideC = cs.stride;
  } else {
    aligned.ldc = c.ld;
  }
  if (call.bias && aligned.n != call.n) {
    MatrixSpan bias{call.bias, 1, call.n, call.n, 0};
    aligned.bias = staged(kernel, stream, bias, 1, aligned.n, 1, call.cType, true, keep).data;
  }
  if (stageAux) {
    auxs = staged(kernel, stream, aux, cPad.rows, cPad.cols, call.batch, call.cType, false, keep);
    aligned.geluAux = const_cast<void *>(auxs.data);
    aligned.ldAux = auxs.ld;
  } else if (call.geluAux) {
    aligned.ldAux = aux.ld;
  }
  runAligned(kernel, stream, aligned);
  if (stageC)
    copyMatrices(kernel, stream, call.cType, cs, c, cs.stride != 0 ? call.batch : 1);
  if (stageAux)
    copyMatrices(kernel, stream, call.cType, auxs, aux, auxs.stride != 0 ? call.batch : 1);
}

void LtEngine::runAligned(const char *kernel, Stream stream, const GemmCall &call) {
  int64_t batch = call.batch;
  Key key{int(call.abType),
          int(call.cType),
          call.transA,
          call.transB,
          call.m,
          call.n,
          call.k,
          batch,
          batch > 1 ? call.strideA : 0,
          batch > 1 ? call.strideB : 0,
          batch > 1 ? call.strideC : 0,
          leadingDim(call, 'a'),
          leadingDim(call, 'b'),
          leadingDim(call, 'c'),
          call.bias != nullptr,
          call.beta != 0.0f,
          alignmentOf(call.a, call.strideA, batch, call.abType),
          alignmentOf(call.b, call.strideB, batch, call.abType),
          alignmentOf(call.c, call.strideC, batch, call.cType),
          call.bias ? alignmentOf(call.bias, 0, 1, call.cType) : 0,
          call.geluAux ? (call.ldAux ? call.ldAux : call.n) : 0,
          call.geluAux ? alignmentOf(call.geluAux, call.strideC, batch, call.cType) : 0};
  Plan &p = plan(kernel, call, key);
  if (zeroGemmOutputs() && call.beta == 0.0f) {
    zeroMatrices(kernel, stream, call.c, call.m, call.n, leadingDim(call, 'c'), call.strideC,
                 batch, call.cType);
    if (call.geluAux)
      zeroMatrices(kernel, stream, call.geluAux, call.m, call.n,
                   call.ldAux ? call.ldAux : call.n, call.strideC, batch, call.cType);
  }
  if (call.bias)
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof call.bias,
            "BIAS_POINTER");
  if (call.geluAux)
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.geluAux,
            sizeof call.geluAux, "EPILOGUE_AUX_POINTER");
  const void *cIn = call.addend && call.beta != 0.0f ? call.addend : call.c;
  checkCublas(cublasLtMatmul(handle_, p.desc, &call.alpha, call.b, p.aLayout, call.a, p.bLayout,
                             &call.beta, cIn, p.cLayout, call.c, p.cLayout, &p.algo, workspace_,
                             workspaceBytes_, stream),
              "cublasLtMatmul", kernel);
}

namespace {

cudaDataType_t fp8CudaType(const char *kernel, DType dtype) {
  if (dtype == DType::F8E4M3FN)
    return CUDA_R_8F_E4M3;
  if (dtype == DType::F8E5M2)
    return CUDA_R_8F_E5M2;
  fail(kernel, std::string("FP8 GEMM operands must be f8e4m3fn or f8e5m2, not ") +
                   dtypeName(dtype));
}

} // namespace

LtEngine::Plan &LtEngine::fp8Plan(const char *kernel, const Fp8GemmCall &call,
                                  const Fp8Key &key) {
  auto found = fp8Plans_.find(key);
  if (found != fp8Plans_.end())
    return found->second;
  // cuBLASLt would answer "not supported" on an older GPU; say why instead.
  int device = 0, major = 0, minor = 0;
  checkCuda(cudaGetDevice(&device), "cudaGetDevice", kernel);
  checkCuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
            "cudaDeviceGetAttribute", kernel);
  checkCuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
            "cudaDeviceGetAttribute", kernel);
  if (major * 10 + minor < 89)
    fail(kernel, "FP8 GEMMs need FP8 tensor cores (sm_89 or newer); this GPU is sm_" +
                     std::to_string(major * 10 + minor));
  Plan p;
  try {
    cudaDataType_t a = fp8CudaType(kernel, call.aType), b = fp8CudaType(kernel, call.bType);
    cudaDataType_t d = cudaType(kernel, call.dType);
    checkCublas(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                "cublasLtMatmulDescCreate", kernel);
    // Row-major D = A·Bᵀ is column-major Dᵀ = B·Aᵀ: cuBLASLt's A is our B (k x n column-major,
    // transposed) and its B our A (k x m, as is): the "TN" case.
    cublasOperation_t opA = CUBLAS_OP_T, opB = CUBLAS_OP_N;
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA, "TRANSA");
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB, "TRANSB");
    // The heuristic chooses among kernels that take scale pointers and, with a bias, the bias
    // epilogue; the pointers themselves are set again on every call.
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &call.descaleB,
            sizeof call.descaleB, "A_SCALE_POINTER");
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &call.descaleA,
            sizeof call.descaleA, "B_SCALE_POINTER");
    // The heuristic is asked with the mode set: fast accumulation has kernels of its own.
    int8_t fast = call.fastAccumulation ? 1 : 0;
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast, "FAST_ACCUM");
    if (call.bias) {
      cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue,
              "EPILOGUE");
      int32_t biasType = int32_t(d);
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType, sizeof biasType,
              "BIAS_DATA_TYPE");
      setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof call.bias,
              "BIAS_POINTER");
    }
    p.aLayout = makeLayout(kernel, b, call.k, call.n, call.k, 1, 0);
    p.bLayout = makeLayout(kernel, a, call.k, call.m, call.k, 1, 0);
    p.cLayout = makeLayout(kernel, d, call.n, call.m, call.n, 1, 0);

    cublasLtMatmulPreference_t pref = nullptr;
    checkCublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", kernel);
    uint64_t wsBytes = workspaceBytes_;
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.aLayout, p.bLayout, p.cLayout,
                                              p.cLayout, pref, 1, &result, &returned);
    cublasStatus_t destroyed = cublasLtMatmulPreferenceDestroy(pref);
    checkCublas(status, "cublasLtMatmulAlgoGetHeuristic", kernel);
    checkCublas(destroyed, "cublasLtMatmulPreferenceDestroy", kernel);
    if (returned == 0)
      fail(kernel, "cuBLASLt has no FP8 algorithm for m=" + std::to_string(call.m) +
                       " n=" + std::to_string(call.n) + " k=" + std::to_string(call.k) +
                       " on this GPU (FP8 tensor cores need sm_89 or newer)");
    p.algo = result.algo;
  } catch (...) {
    destroyPlan(p);
    throw;
  }
  return fp8Plans_.emplace(key, p).first->second;
}

void LtEngine::runFp8(const char *kernel, Stream stream, const Fp8GemmCall &call) {
  if (call.m % 16 || call.n % 16 || call.k % 16 || call.m <= 0 || call.n <= 0 || call.k <= 0)
    fail(kernel, "an FP8 GEMM needs m, n and k positive multiples of 16, got m=" +
                     std::to_string(call.m) + " n=" + std::to_string(call.n) +
                     " k=" + std::to_string(call.k));
  if (call.aType == DType::F8E5M2 && call.bType == DType::F8E5M2)
    fail(kernel, "cuBLASLt has no e5m2 x e5m2 GEMM: one operand must be f8e4m3fn");
  for (const void *p : {call.a, call.b, static_cast<const void *>(call.d)})
    if (!p || !aligned16(p))
      fail(kernel, "FP8 GEMM operands and output must be 16-byte aligned device pointers");
  if (!call.descaleA || !call.descaleB || !aligned16(call.descaleA) ||
      !aligned16(call.descaleB))
    fail(kernel, "an FP8 GEMM needs both descales as 16-byte aligned device pointers");
  const Fp8Key key(int(call.aType), int(call.bType), int(call.dType), call.m, call.n, call.k,
                   call.bias != nullptr, call.fastAccumulation);
  Plan &p = fp8Plan(kernel, call, key);
  setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &call.descaleB,
          sizeof call.descaleB, "A_SCALE_POINTER");
  setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &call.descaleA,
          sizeof call.descaleA, "B_SCALE_POINTER");
  if (call.bias)
    setDesc(kernel, p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof call.bias,
            "BIAS_POINTER");
  const float alpha = 1.0f, beta = call.accumulate ? 1.0f : 0.0f;
  if (zeroGemmOutputs() && !call.accumulate)
    zeroMatrices(kernel, stream, call.d, call.m, call.n, call.n, 0, 1, call.dType);
  checkCublas(cublasLtMatmul(handle_, p.desc, &alpha, call.b, p.aLayout, call.a, p.bLayout,
                             &beta, call.d, p.cLayout, call.d, p.cLayout, &p.algo, workspace_,
                             workspaceBytes_, stream),
              "cublasLtMatmul(fp8)", kernel);
}

LtEngine &ltEngineOf(const char *kernel, GemmEngine &engine) {
  std::lock_guard<std::mutex> lock(registryMutex);
  auto found = registry.find(&engine);
  if (found == registry.end())
    fail(kernel, "the context's GemmEngine is not a live engine");
  return *found->second;
}

} // namespace detail

struct GemmEngine::Impl {
  explicit Impl(size_t workspaceBytes) : engine(workspaceBytes) {}
  detail::LtEngine engine;
};

GemmEngine::GemmEngine(size_t workspaceBytes)
    : impl_(std::make_unique<Impl>(workspaceBytes)) {
  std::lock_guard<std::mutex> lock(detail::registryMutex);
  detail::registry[this] = &impl_->engine;
}

GemmEngine::~GemmEngine() {
  std::lock_guard<std::mutex> lock(detail::registryMutex);
  detail::registry.erase(this);
}

void GemmEngine::gemm(Stream stream, DType dtype, bool transA, bool transB, int64_t m, int64_t n,
                      int64_t k, float alpha, const void *a, int64_t strideA, const void *b,
                      int64_t strideB, float beta, void *c, int64_t strideC, int64_t batch) {
  detail::GemmCall call;
  call.abType = call.cType = dtype;
  call.transA = transA;
  call.transB = transB;
  call.m = m;
  call.n = n;
  call.k = k;
  call.alpha = alpha;
  call.beta = beta;
  call.a = a;
  call.b = b;
  call.c = c;
  call.strideA = strideA;
  call.strideB = strideB;
  call.strideC = strideC;
  call.batch = batch;
  impl_->engine.run("gemm", stream, call);
}

} // namespace bonsai::rt::cuda
