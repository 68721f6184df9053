//===- nf4_gemm_bench.cu - Fused NF4 GEMM against dequantize + cuBLASLt ----===//
//
// The QLoRA forward GEMM y = x · Wᵀ with an NF4 weight, two ways, at TinyLlama's shapes with
// M = 8192 tokens (hidden 2048, MLP 5632, 4 key/value heads of 64):
//   baseline: the Dequantize kernel (runtime/cuda/Nf4.cu) writes W in bf16 to a buffer, then
//             cuBLASLt multiplies (what a plan runs today);
//   fused:    cuda::nf4Linear (runtime/cuda/Nf4Gemm.cu) dequantizes tiles in shared memory.
// Prints one row per shape: microseconds and TFLOP/s of each, the speedup, and the largest
// difference between the two results relative to the largest output (both round bf16
// products of the same bf16 weights, so only the accumulation order differs).
//
//   build-cuda/bin/nf4_gemm_bench [--reps N]
//
// Built with the runtime when CUDA is on; not run in CI (it needs a GPU).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/Nf4.h"
#include "bonsai/runtime/Tensor.h"
#include "CudaBenchTiming.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace bonsai::rt;
using bonsai::bench::check;

namespace {

struct Shape {
  const char *name;
  int64_t n, k;
};

/// Milliseconds per call of `fn`, over `reps` calls after two warm-up calls.
template <typename F> double timeMs(F fn, int reps) {
  fn();
  fn();
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start), "cudaEventRecord");
  for (int r = 0; r < reps; ++r)
    fn();
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / reps;
}

std::vector<uint16_t> download(const void *p, size_t count) {
  std::vector<uint16_t> out(count);
  check(cudaMemcpy(out.data(), p, count * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return out;
}

} // namespace

int main(int argc, char **argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: nf4_gemm_bench [--reps N]\n");
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "nf4_gemm_bench: no GPU here\n");
    return 1;
  }
  cudaDeviceProp props;
  check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");

  const int64_t m = 8192;
  const Shape shapes[] = {{"q_proj/o_proj", 2048, 2048},
                          {"k_proj/v_proj", 256, 2048},
                          {"gate_proj/up_proj", 5632, 2048},
                          {"down_proj", 2048, 5632}};
  cuda::GemmEngine engine;
  cuda::Context ctx;
  ctx.gemm = &engine;

  std::printf("NF4 GEMM, M = %lld tokens, bf16 x and y, NF4 W (block 64, double 256) on %s\n",
              (long long)m, props.name);
  std::printf("%-18s %6s %6s | %10s %10s %10s %8s | %10s %8s | %7s %9s\n", "weight", "N", "K",
              "dequant us", "gemm us", "total us", "TFLOP/s", "fused us", "TFLOP/s", "speedup",
              "max diff");
  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape &s : shapes) {
    int64_t n = s.n, k = s.k;
    std::vector<uint16_t> x(size_t(m * k));
    for (uint16_t &v : x)
      v = f32ToBf16(normal(rng));
    std::vector<float> w(size_t(n * k));
    for (float &v : w)
      v = 0.02f * normal(rng);
    std::vector<uint8_t> q(nf4StorageBytes(uint64_t(n * k), 64, 256));
    quantizeNf4(w.data(), uint64_t(n * k), 64, 256, q.data());

    void *dx, *dq, *dw, *dyRef, *dyFused;
    check(cudaMalloc(&dx, x.size() * 2), "cudaMalloc");
    check(cudaMalloc(&dq, q.size()), "cudaMalloc");
    check(cudaMalloc(&dw, size_t(n * k) * 2), "cudaMalloc");
    check(cudaMalloc(&dyRef, size_t(m * n) * 2), "cudaMalloc");
    check(cudaMalloc(&dyFused, size_t(m * n) * 2), "cudaMalloc");
    check(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(dq, q.data(), q.size(), cudaMemcpyHostToDevice), "cudaMemcpy");

    TensorView xv{dx, DType::BF16, {m, k}};
    TensorView qv{dq, DType::NF4, {n, k}, 64, 256};
    TensorView wv{dw, DType::BF16, {n, k}};
    TensorView yRef{dyRef, DType::BF16, {m, n}}, yFused{dyFused, DType::BF16, {m, n}};
    std::string problem = cuda::nf4LinearProblem(xv, qv, yFused);
    if (!problem.empty()) {
      std::fprintf(stderr, "nf4_gemm_bench: %s: %s\n", s.name, problem.c_str());
      return 1;
    }
    auto dequantize = [&] { cuda::dequantize(ctx, qv, wv); };
    auto gemm = [&] {
      engine.gemm(ctx.stream, DType::BF16, false, true, m, n, k, 1.0f, dx, 0, dw, 0, 0.0f,
                  dyRef, 0);
    };
    auto fused = [&] { cuda::nf4Linear(ctx, xv, qv, yFused); };
    double tDequant = timeMs(dequantize, reps), tGemm = timeMs(gemm, reps);
    double tBoth = timeMs(
        [&] {
          dequantize();
          gemm();
        },
        reps);
    double tFused = timeMs(fused, reps);

    std::vector<uint16_t> ref = download(dyRef, size_t(m * n)), got = download(dyFused, size_t(m * n));
    double maxRef = 0, maxDiff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      double r = bf16ToF32(ref[i]), g = bf16ToF32(got[i]);
      maxRef = std::max(maxRef, std::fabs(r));
      maxDiff = std::max(maxDiff, std::isfinite(g) ? std::fabs(g - r) : INFINITY);
    }
    double flops = 2.0 * double(m) * double(n) * double(k);
    std::printf("%-18s %6lld %6lld | %10.1f %10.1f %10.1f %8.1f | %10.1f %8.1f | %6.2fx %9.2e\n",
                s.name, (long long)n, (long long)k, tDequant * 1e3, tGemm * 1e3, tBoth * 1e3,
                flops / (tBoth * 1e-3) / 1e12, tFused * 1e3, flops / (tFused * 1e-3) / 1e12,
                tBoth / tFused, maxDiff / std::max(maxRef, 1e-30));
    cudaFree(dx);
    cudaFree(dq);
    cudaFree(dw);
    cudaFree(dyRef);
    cudaFree(dyFused);
  }
  return 0;
}
