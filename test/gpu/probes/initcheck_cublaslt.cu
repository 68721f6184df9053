//===- initcheck_cublaslt.cu - Does initcheck see what cuBLASLt writes? -----------------===//
//
// A probe for docs/reliability.md, not part of the runtime. It writes C (f32 [m, n], fresh
// stream-ordered memory) with one cuBLASLt bf16 GEMM, beta = 0, checks on the host that every
// element is the product, then reads C in a kernel of its own. Run under
//   compute-sanitizer --tool initcheck initcheck-cublaslt [m n k] [zero]
// on a Hopper GPU, initcheck reports each read of C as uninitialised although the host check
// shows that cuBLASLt wrote all of it: the tool does not see the TMA stores of cuBLASLt's
// Hopper kernels. With `zero`, C is memset first, and the reports go. That is what
// BONSAI_ZERO_GEMM_OUTPUTS does for the runtime's GEMMs under test/gpu/sanitize.sh.
//
//===----------------------------------------------------------------------===//

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    if (auto status = (call); int(status) != 0) {                                                \
      std::fprintf(stderr, "%s failed: %d\n", #call, int(status));                               \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

__global__ void sumKernel(const float *c, size_t n, float *sum) {
  float s = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    s += c[i];
  atomicAdd(sum, s);
}

int main(int argc, char **argv) {
  int m = argc > 3 ? std::atoi(argv[1]) : 1000, n = argc > 3 ? std::atoi(argv[2]) : 1000,
      k = argc > 3 ? std::atoi(argv[3]) : 1000;
  bool zero = std::strcmp(argv[argc - 1], "zero") == 0;
  // Column-major for cuBLASLt: C (m x n) = A (m x k) B (k x n); small integers, exact in bf16
  // and in fp32 sums.
  std::vector<__nv_bfloat16> a(size_t(m) * k), b(size_t(k) * n);
  std::vector<float> af(a.size()), bf(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = __float2bfloat16(af[i] = float(int(i % 7) - 3));
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = __float2bfloat16(bf[i] = float(int(i % 5) - 2));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  void *da, *db, *workspace;
  float *dc, *sum;
  size_t workspaceBytes = 32 << 20;
  CHECK(cudaMalloc(&da, a.size() * 2));
  CHECK(cudaMalloc(&db, b.size() * 2));
  CHECK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&workspace, workspaceBytes));
  CHECK(cudaMalloc(&sum, sizeof(float)));
  CHECK(cudaMemset(sum, 0, sizeof(float)));
  CHECK(cudaMallocAsync(reinterpret_cast<void **>(&dc), size_t(m) * n * 4, stream));
  if (zero)
    CHECK(cudaMemsetAsync(dc, 0, size_t(m) * n * 4, stream));
  cublasLtHandle_t handle;
  CHECK(cublasLtCreate(&handle));
  cublasLtMatmulDesc_t desc;
  CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtMatrixLayout_t la, lb, lc;
  CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m));
  CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k));
  CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m));
  cublasLtMatmulPreference_t pref;
  CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspaceBytes, sizeof workspaceBytes));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, 1, &result, &found));
  float alpha = 1.0f, beta = 0.0f;
  CHECK(cublasLtMatmul(handle, desc, &alpha, da, la, db, lb, &beta, dc, lc, dc, lc, &result.algo,
                       workspace, workspaceBytes, stream));
  std::vector<float> c(size_t(m) * n);
  CHECK(cudaMemcpyAsync(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  size_t wrong = 0;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float ref = 0.0f;
      for (int p = 0; p < k; ++p)
        ref += af[size_t(p) * m + i] * bf[size_t(j) * k + p];
      wrong += c[size_t(j) * m + i] != ref;
    }
  sumKernel<<<64, 256, 0, stream>>>(dc, c.size(), sum);
  CHECK(cudaStreamSynchronize(stream));
  std::printf("cuBLASLt bf16 GEMM m=%d n=%d k=%d%s: %zu of %zu elements of C differ from the "
              "host product\n",
              m, n, k, zero ? " (C zeroed first)" : "", wrong, c.size());
  return wrong != 0;
}
