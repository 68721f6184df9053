//===- fp8_gemm_bench.cu - Bonsai's FP8 GEMM against its bf16 GEMM ---------===//
//
// y = x · Wᵀ at 8192³ and at TinyLlama-1.1B's linear shapes with M = 8192 tokens (hidden
// 2048, MLP 5632, 4 key/value heads of 64), three ways on the same data:
//   bf16:     GemmEngine (cuBLASLt, bf16 operands and output), what a plan runs today;
//   fp8:      Fp8GemmEngine, x and W as E4M3FN codes with per-tensor scales, bf16 output;
//   fp8+cast: the FP8 GEMM plus casting x (bf16 -> E4M3FN with its statistics), what an FP8
//             linear costs when its input comes in bf16 (W's cast is once per step).
// Prints one line per shape with microseconds and TFLOP/s; bench/fp8_gemm_bench.py runs it
// next to torch._scaled_mm and prints the table. The FP8 result's relative error against the
// bf16 one is printed too (FP8's 3 mantissa bits: about 2-4% of the output's scale).
//
//   build-cuda/bin/fp8_gemm_bench [--reps N]
//
// Built with the runtime when CUDA is on; not run in CI (it needs a GPU).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaFp8.h"
#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/Tensor.h"

#include <cuda_bf16.h>
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

namespace {

void check(cudaError_t status, const char *call) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "fp8_gemm_bench: %s failed: %s\n", call, cudaGetErrorString(status));
    std::exit(1);
  }
}

/// Median time in microseconds of `reps` runs of f, after warm-up.
template <typename F> double timeUs(int reps, F &&f) {
  for (int i = 0; i < 3; ++i)
    f();
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    f();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms * 1000.0f);
  }
  std::sort(times.begin(), times.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times[times.size() / 2];
}

struct Shape {
  const char *name;
  int64_t m, n, k;
};

} // namespace

int main(int argc, char **argv) {
  int reps = 50;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::atoi(argv[++i]);
  const Shape shapes[] = {{"8192^3", 8192, 8192, 8192},   {"q/o_proj", 8192, 2048, 2048},
                          {"k/v_proj", 8192, 256, 2048},  {"gate/up_proj", 8192, 5632, 2048},
                          {"down_proj", 8192, 2048, 5632}};
  cuda::GemmEngine bf16Engine(size_t(32) << 20);
  cuda::Fp8GemmEngine fp8Engine;
  cuda::Context ctx;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::printf("shape m n k bf16_us bf16_tflops fp8_us fp8_tflops fp8cast_us fp8cast_tflops "
              "rel_err\n");
  for (const Shape &s : shapes) {
    const int64_t xs = s.m * s.k, ws = s.n * s.k, ys = s.m * s.n;
    std::vector<__nv_bfloat16> hx(xs), hw(ws);
    for (auto &v : hx)
      v = __float2bfloat16(normal(rng));
    for (auto &v : hw)
      v = __float2bfloat16(normal(rng) * 0.02f);
    void *x, *w, *y, *y8, *x8, *w8, *scales;
    check(cudaMalloc(&x, xs * 2), "cudaMalloc");
    check(cudaMalloc(&w, ws * 2), "cudaMalloc");
    check(cudaMalloc(&y, ys * 2), "cudaMalloc");
    check(cudaMalloc(&y8, ys * 2), "cudaMalloc");
    check(cudaMalloc(&x8, xs), "cudaMalloc");
    check(cudaMalloc(&w8, ws), "cudaMalloc");
    check(cudaMalloc(&scales, 64), "cudaMalloc");
    check(cudaMemcpy(x, hx.data(), xs * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(w, hw.data(), ws * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    // Scales as delayed scaling would give them: 448 / amax (|x| < ~5, |W| < ~0.1).
    const float host[4] = {448.0f / 5.0f, 448.0f / 0.1f, 5.0f / 448.0f, 0.1f / 448.0f};
    check(cudaMemcpy(scales, host, 16, cudaMemcpyHostToDevice), "cudaMemcpy");
    float *scale = static_cast<float *>(scales);
    auto *stats = reinterpret_cast<cuda::Fp8CastStats *>(scale + 8);
    check(cudaMemset(stats, 0, sizeof(cuda::Fp8CastStats)), "cudaMemset");
    TensorView vx{x, DType::BF16, {s.m, s.k}}, vw{w, DType::BF16, {s.n, s.k}},
        vx8{x8, DType::F8E4M3FN, {s.m, s.k}}, vw8{w8, DType::F8E4M3FN, {s.n, s.k}},
        vy8{y8, DType::BF16, {s.m, s.n}};
    cuda::castToFp8(ctx, vw, scale + 1, vw8, nullptr);
    cuda::castToFp8(ctx, vx, scale, vx8, stats);

    double flops = 2.0 * s.m * s.n * s.k;
    double bf16 = timeUs(reps, [&] {
      bf16Engine.gemm(nullptr, DType::BF16, false, true, s.m, s.n, s.k, 1.0f, x, 0, w, 0, 0.0f,
                      y, 0);
    });
    double f8 = timeUs(reps, [&] { fp8Engine.gemm(nullptr, vx8, scale + 2, vw8, scale + 3, vy8); });
    double f8cast = timeUs(reps, [&] {
      cuda::castToFp8(ctx, vx, scale, vx8, stats);
      fp8Engine.gemm(nullptr, vx8, scale + 2, vw8, scale + 3, vy8);
    });
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<__nv_bfloat16> a(ys), b(ys);
    check(cudaMemcpy(a.data(), y, ys * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemcpy(b.data(), y8, ys * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
    double num = 0, den = 0;
    for (int64_t i = 0; i < ys; ++i) {
      double d = double(__bfloat162float(a[i])) - __bfloat162float(b[i]);
      num += d * d;
      den += double(__bfloat162float(a[i])) * __bfloat162float(a[i]);
    }
    std::printf("%s %lld %lld %lld %.1f %.1f %.1f %.1f %.1f %.1f %.4f\n", s.name,
                (long long)s.m, (long long)s.n, (long long)s.k, bf16, flops / bf16 / 1e6, f8,
                flops / f8 / 1e6, f8cast, flops / f8cast / 1e6, std::sqrt(num / den));
    for (void *p : {x, w, y, y8, x8, w8, scales})
      cudaFree(p);
  }
  return 0;
}
