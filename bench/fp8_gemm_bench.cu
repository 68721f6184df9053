//===- fp8_gemm_bench.cu - Bonsai's FP8 linear kernels against its bf16 GEMMs -===//
//
// A linear y = x · Wᵀ at 8192³ and at the linear shapes of TinyLlama-1.1B and Llama-3-8B with
// M = 8192 tokens, on the same data, as a plan runs it:
//   bf16:      the backend's cuBLASLt GEMM (bf16 operands and output);
//   fp8:       cuda::fp8Linear, the kernel of plan kind 90: x and W cast to E4M3FN with the
//              state's delayed scales (their statistics counted), the FP8 GEMM, the stats;
//              once with the GEMM's partial sums promoted to fp32 (the default), once with
//              fast accumulation (the recipe's `forward_accumulation "fast"`);
//   fwd+bwd:   the three GEMMs of a training step (y, dx = dy·W, dW = dyᵀ·x) in bf16, against
//              kinds 90..92 (the backward's casts transposing, dy in E5M2), and against kinds
//              90 and 95 (the backward fused as a plan runs it: dy cast once into both
//              layouts, dW added into an f32 accumulator);
//   casts:     the cast of x alone (cuda::castToFp8) and its transposing cast alone
//              (cuda::castToFp8Transposed, as the backward's), in µs and GB/s moved.
// Prints one line per shape with microseconds and TFLOP/s; bench/fp8_gemm_bench.py runs it next
// to torch.matmul and torch._scaled_mm and prints the table. The FP8 output's relative RMS error
// against bf16's is printed too (E4M3's 3 mantissa bits: a few percent).
//
//   build/bin/fp8_gemm_bench [--reps N]
//
// Built with the runtime when CUDA is on; not run in CI (it needs a GPU).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaFp8.h"
#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/Tensor.h"
#include "CudaBenchTiming.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

using namespace bonsai::rt;
using bonsai::bench::check;

namespace {

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

void *deviceAlloc(size_t bytes) {
  void *p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

} // namespace

int main(int argc, char **argv) {
  int reps = 50;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::atoi(argv[++i]);
  const Shape shapes[] = {{"8192^3", 8192, 8192, 8192},
                          {"tinyllama.q/o_proj", 8192, 2048, 2048},
                          {"tinyllama.k/v_proj", 8192, 256, 2048},
                          {"tinyllama.gate/up_proj", 8192, 5632, 2048},
                          {"tinyllama.down_proj", 8192, 2048, 5632},
                          {"llama3_8b.q/o_proj", 8192, 4096, 4096},
                          {"llama3_8b.k/v_proj", 8192, 1024, 4096},
                          {"llama3_8b.gate/up_proj", 8192, 14336, 4096},
                          {"llama3_8b.down_proj", 8192, 4096, 14336}};
  cuda::GemmEngine engine(size_t(32) << 20);
  cuda::Context ctx;
  ctx.gemm = &engine;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::printf("shape m n k bf16_us bf16_tflops fp8_us fp8_tflops bf16_step_us fp8_step_us "
              "rel_err cast_x_us cast_x_gbps cast_xt_us cast_xt_gbps fp8_fused_step_us "
              "fp8_fast_us\n");
  for (const Shape &s : shapes) {
    const int64_t xs = s.m * s.k, ws = s.n * s.k, ys = s.m * s.n;
    std::vector<__nv_bfloat16> hx(xs), hw(ws), hdy(ys);
    for (auto &v : hx)
      v = __float2bfloat16(normal(rng));
    for (auto &v : hw)
      v = __float2bfloat16(normal(rng) * 0.02f);
    for (auto &v : hdy)
      v = __float2bfloat16(normal(rng) * 1e-3f);
    void *x = deviceAlloc(xs * 2), *w = deviceAlloc(ws * 2), *dy = deviceAlloc(ys * 2);
    void *y = deviceAlloc(ys * 2), *y8 = deviceAlloc(ys * 2), *dx = deviceAlloc(xs * 2);
    void *dw = deviceAlloc(ws * 2);
    check(cudaMemcpy(x, hx.data(), xs * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(w, hw.data(), ws * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    check(cudaMemcpy(dy, hdy.data(), ys * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    // The state as delayed scaling leaves it after a few steps: 448 / amax (|x| < ~5,
    // |W| < ~0.1), 57344 / amax for dy (|dy| < ~5e-3); history 16.
    const int64_t cols = fp8::kStateColumns + 16;
    std::vector<float> state(3 * cols, 0.0f);
    state[fp8::InputRow * cols] = 448.0f / 5.0f;
    state[fp8::WeightRow * cols] = 448.0f / 0.1f;
    state[fp8::OutputGradRow * cols] = 57344.0f / 5e-3f;
    void *st = deviceAlloc(state.size() * 4), *stats = deviceAlloc(32);
    check(cudaMemcpy(st, state.data(), state.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    const int64_t wsBytes = fp8::gemmWorkspaceBytes(std::max(xs, ys), std::max(xs, ws));
    void *work = deviceAlloc(size_t(wsBytes));
    TensorView vx{x, DType::BF16, {s.m, s.k}}, vw{w, DType::BF16, {s.n, s.k}},
        vdy{dy, DType::BF16, {s.m, s.n}}, vy8{y8, DType::BF16, {s.m, s.n}},
        vdx{dx, DType::BF16, {s.m, s.k}}, vdw{dw, DType::BF16, {s.n, s.k}},
        vst{st, DType::F32, {3, cols}}, vstats{stats, DType::F32, {2, 4}},
        vwork{work, DType::F32, {wsBytes / 4}};

    const double flops = 2.0 * s.m * s.n * s.k;
    auto bf16Forward = [&] {
      engine.gemm(nullptr, DType::BF16, false, true, s.m, s.n, s.k, 1.0f, x, 0, w, 0, 0.0f, y,
                  0);
    };
    auto fp8Forward = [&] {
      cuda::fp8Linear(ctx, vx, vw, vst, nullptr, false, 0, vy8, vstats, vwork);
    };
    double bf16 = timeUs(reps, bf16Forward);
    double f8 = timeUs(reps, fp8Forward);
    double f8Fast = timeUs(reps, [&] {
      cuda::fp8Linear(ctx, vx, vw, vst, nullptr, false, 0, vy8, vstats, vwork,
                      /*fastAccumulation=*/true);
    });
    double bf16Step = timeUs(reps, [&] {
      bf16Forward();
      engine.gemm(nullptr, DType::BF16, false, false, s.m, s.k, s.n, 1.0f, dy, 0, w, 0, 0.0f,
                  dx, 0);
      engine.gemm(nullptr, DType::BF16, true, false, s.n, s.k, s.m, 1.0f, dy, 0, x, 0, 0.0f,
                  dw, 0);
    });
    double f8Step = timeUs(reps, [&] {
      fp8Forward();
      cuda::fp8LinearGradInput(ctx, vdy, vw, vst, false, 0, vdx, vstats, vwork);
      cuda::fp8LinearGradWeight(ctx, vdy, vx, vst, false, 0, vdw, vstats, vwork);
    });
    // The fused backward: its workspace holds both GEMMs', the weight gradient goes into f32.
    const int64_t fusedBytes = fp8::gemmWorkspaceBytes(ys, ws) + fp8::gemmWorkspaceBytes(ys, xs);
    void *fusedWork = deviceAlloc(size_t(fusedBytes)), *acc = deviceAlloc(size_t(ws) * 4);
    void *stats2 = deviceAlloc(32);
    check(cudaMemset(acc, 0, size_t(ws) * 4), "cudaMemset");
    TensorView vfused{fusedWork, DType::F32, {fusedBytes / 4}}, vacc{acc, DType::F32, {s.n, s.k}},
        vstats2{stats2, DType::F32, {2, 4}};
    double f8FusedStep = timeUs(reps, [&] {
      fp8Forward();
      cuda::fp8LinearBackward(ctx, vdy, vw, vx, vst, false, 0, vdx, vstats, vstats2, vfused, vacc);
    });
    for (void *p : {fusedWork, acc, stats2})
      cudaFree(p);
    // The cast of x alone (what each FP8 linear pays per operand): bytes moved per second.
    void *codes = deviceAlloc(size_t(xs));
    TensorView vcodes{codes, DType::F8E4M3FN, {s.m, s.k}};
    const float *xScale = static_cast<const float *>(st);
    double castUs = timeUs(reps, [&] { cuda::castToFp8(ctx, vx, xScale, vcodes, nullptr); });
    // The transposing cast of x alone (what the backward GEMMs pay per operand).
    TensorView vcodesT{codes, DType::F8E4M3FN, {s.k, s.m}};
    double castTUs =
        timeUs(reps, [&] { cuda::castToFp8Transposed(ctx, vx, xScale, vcodesT, nullptr); });
    cudaFree(codes);
    bf16Forward();
    fp8Forward();
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
    std::printf("%s %lld %lld %lld %.1f %.1f %.1f %.1f %.1f %.1f %.4f %.1f %.0f %.1f %.0f %.1f "
                "%.1f\n",
                s.name, (long long)s.m, (long long)s.n, (long long)s.k, bf16, flops / bf16 / 1e6,
                f8, flops / f8 / 1e6, bf16Step, f8Step, std::sqrt(num / den), castUs,
                3.0 * double(xs) / castUs / 1e3, castTUs, 3.0 * double(xs) / castTUs / 1e3,
                f8FusedStep, f8Fast);
    std::fflush(stdout);
    for (void *p : {x, w, dy, y, y8, dx, dw, st, stats, work})
      cudaFree(p);
  }
  return 0;
}
