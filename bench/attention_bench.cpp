//===- attention_bench.cpp - Bonsai's causal attention kernels, timed ------===//
//
// Times cuda::attention (the forward) and cuda::attention + cuda::attentionGrad (forward and
// backward, as a training step runs them) on fresh random bf16 q, k, v and dO in Bonsai's
// [batch, seq, heads, head_dim] layout, with CUDA events: two warm-up calls, then the median of
// `--reps` timed calls. Prints one line per shape that bench/attention_bench.py reads:
//
//   shape B S H KVH D causal fwd_ms <median> fwdbwd_ms <median> flash_fwd_ms <median>
//     flash_fwdbwd_ms <median> flash_nd_fwdbwd_ms <median>
//
// (one line): fwd/fwdbwd time attention and attentionGrad (the plan without the flash-attention
// fusion), flash_fwd/flash_fwdbwd time flashAttention and flashAttentionGrad (with it: the
// forward writes the log-sum-exp, the backward reads it), flash_nd_fwdbwd the same with
// Context::deterministic off (`bonsai-run --nondeterministic`: on Hopper the backward forms dq
// in its dk/dv pass, summed in the order the blocks run).
//
// FLOPs are left to the Python side, which uses FlashAttention's convention for all three
// implementations alike: forward 4 B H S^2 D (halved when causal), backward 2.5 times that.
//
//   build-attn/bin/attention_bench [--reps N] [--causal 0|1] [--document L]
//                                  B S H KVH D [B S H KVH D ...]
//
// --document L packs each row with documents of L tokens (the last one shorter when L does not
// divide S): i32 segment ids t / L, given to every call (bench/packed_attention_bench.py), and
// the shape line ends with "document L".
//
// Built with the runtime when CUDA is on; not run in CI (it needs a GPU).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"
#include "bonsai/runtime/Tensor.h"

#include "CudaBenchTiming.h"

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
using bonsai::bench::medianMs;

namespace {

/// A device buffer of `count` random bf16 values from N(0, 1).
void *randomBf16(size_t count, std::mt19937 &rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> host(count);
  for (uint16_t &x : host)
    x = f32ToBf16(normal(rng));
  void *p = nullptr;
  check(cudaMalloc(&p, count * 2), "cudaMalloc");
  check(cudaMemcpy(p, host.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}

} // namespace

int main(int argc, char **argv) {
  int reps = 20;
  bool causal = true;
  int64_t document = 0;
  std::vector<int64_t> dims;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--causal") == 0 && i + 1 < argc)
      causal = std::atoi(argv[++i]) != 0;
    else if (std::strcmp(argv[i], "--document") == 0 && i + 1 < argc)
      document = std::max<int64_t>(0, std::atoll(argv[++i]));
    else
      dims.push_back(std::atoll(argv[i]));
  }
  if (dims.empty() || dims.size() % 5 != 0) {
    std::fprintf(stderr, "usage: attention_bench [--reps N] [--causal 0|1] [--document L] "
                         "B S H KVH D [B S H KVH D ...]\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "attention_bench: no GPU here\n");
    return 1;
  }
  // Memory freed to the stream-ordered pool stays there between calls, as it does for a
  // training step's CUDA Graph (the backward's scratch would otherwise be mapped anew each call).
  cudaMemPool_t pool;
  check(cudaDeviceGetDefaultMemPool(&pool, 0), "cudaDeviceGetDefaultMemPool");
  uint64_t keep = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
        "cudaMemPoolSetAttribute");
  cuda::Context ctx;
  std::mt19937 rng(0);
  for (size_t s = 0; s < dims.size(); s += 5) {
    const int64_t b = dims[s], seq = dims[s + 1], h = dims[s + 2], kvh = dims[s + 3],
                  d = dims[s + 4];
    const size_t qCount = size_t(b * seq * h * d), kvCount = size_t(b * seq * kvh * d);
    void *q = randomBf16(qCount, rng), *k = randomBf16(kvCount, rng),
         *v = randomBf16(kvCount, rng), *dout = randomBf16(qCount, rng);
    void *o, *dq, *dk, *dv, *lse;
    check(cudaMalloc(&o, qCount * 2), "cudaMalloc");
    check(cudaMalloc(&lse, size_t(b * h * seq) * 4), "cudaMalloc");
    check(cudaMalloc(&dq, qCount * 2), "cudaMalloc");
    check(cudaMalloc(&dk, kvCount * 2), "cudaMalloc");
    check(cudaMalloc(&dv, kvCount * 2), "cudaMalloc");
    const std::vector<int64_t> qShape{b, seq, h, d}, kvShape{b, seq, kvh, d};
    TensorView qv{q, DType::BF16, qShape}, kv{k, DType::BF16, kvShape},
        vv{v, DType::BF16, kvShape}, ov{o, DType::BF16, qShape}, dov{dout, DType::BF16, qShape},
        dqv{dq, DType::BF16, qShape}, dkv{dk, DType::BF16, kvShape}, dvv{dv, DType::BF16, kvShape},
        lsev{lse, DType::F32, {b, h, seq}};
    // (Also what pulls Tensor.cpp's helpers, which the CUDA library needs, into the link.)
    std::printf("# q %s, k and v %s, %s, %.1f MiB each\n", formatShape(qShape).c_str(),
                formatShape(kvShape).c_str(), dtypeName(qv.dtype), double(qv.bytes()) / (1 << 20));
    // Packed rows: documents of `document` tokens, segment id t / document.
    void *ids = nullptr;
    if (document > 0) {
      std::vector<int32_t> host(size_t(b * seq));
      for (size_t t = 0; t < host.size(); ++t)
        host[t] = int32_t(int64_t(t) % seq / document);
      check(cudaMalloc(&ids, host.size() * 4), "cudaMalloc");
      check(cudaMemcpy(ids, host.data(), host.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    TensorView idsView{ids, DType::I32, {b, seq}};
    const TensorView *segments = ids ? &idsView : nullptr;
    const double scale = 1.0 / std::sqrt(double(d));
    auto forward = [&] { cuda::attention(ctx, qv, kv, vv, causal, scale, ov, segments); };
    auto step = [&] {
      forward();
      cuda::attentionGrad(ctx, dov, qv, kv, vv, ov, causal, scale, dqv, dkv, dvv, segments);
    };
    auto flashForward = [&] {
      cuda::flashAttention(ctx, qv, kv, vv, causal, scale, ov, lsev, segments);
    };
    auto flashStep = [&] {
      flashForward();
      cuda::flashAttentionGrad(ctx, dov, qv, kv, vv, ov, lsev, causal, scale, dqv, dkv, dvv,
                               segments);
    };
    const double fwdMs = medianMs(forward, reps);
    const double stepMs = medianMs(step, reps);
    const double flashFwdMs = medianMs(flashForward, reps);
    const double flashStepMs = medianMs(flashStep, reps);
    ctx.deterministic = false;
    const double flashNdStepMs = medianMs(flashStep, reps);
    ctx.deterministic = true;
    check(cudaGetLastError(), "the kernels");
    std::printf("shape %lld %lld %lld %lld %lld causal %d fwd_ms %.4f fwdbwd_ms %.4f "
                "flash_fwd_ms %.4f flash_fwdbwd_ms %.4f flash_nd_fwdbwd_ms %.4f",
                (long long)b, (long long)seq, (long long)h, (long long)kvh, (long long)d,
                causal ? 1 : 0, fwdMs, stepMs, flashFwdMs, flashStepMs, flashNdStepMs);
    if (document > 0)
      std::printf(" document %lld", (long long)document);
    std::printf("\n");
    std::fflush(stdout);
    for (void *p : {q, k, v, dout, o, dq, dk, dv, lse, ids})
      check(cudaFree(p), "cudaFree");
  }
  return 0;
}
