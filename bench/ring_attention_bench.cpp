//===- ring_attention_bench.cpp - Ring attention's block kernels, timed ----===//
//
// The compute side of ring attention (docs/ring-attention.md) on one GPU: N virtual ranks run
// in turn, each its zigzag share (chunks r and 2N-1-r) of one causal bf16 row of N·L tokens
// against every rank's key/value block (cuda::ringAttentionBlock: the flash kernels on the rows
// the layout pairs, then the fp32 merge; then the cast of the merged output), and the backward
// steps (cuda::ringAttentionBlockGrad and the adds of each block's dk, dv to its travelling
// accumulators). Against it, the unpartitioned flash kernels (cuda::flashAttention and
// flashAttentionGrad) on the whole row: the same total work, so the ratio of times is the ratio
// of TFLOP/s. No bytes move between ranks here: the ring's transfers are the multi-GPU
// measurement's. CUDA events, two warm-up calls, the median of `--reps`. One line per shape,
// which bench/ring_attention_bench.py reads:
//
//   ring N L H KVH D whole_fwd_ms <ms> whole_bwd_ms <ms> ring_fwd_ms <ms> ring_bwd_ms <ms>
//
//   build-sm90a/bin/ring_attention_bench [--reps N] N L H KVH D [N L H KVH D ...]
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

/// Device tensors freed at exit of main's loop body.
struct Pool {
  std::vector<void *> blocks;
  TensorView make(DType dtype, std::vector<int64_t> shape) {
    TensorView t{nullptr, dtype, std::move(shape)};
    check(cudaMalloc(&t.data, std::max<size_t>(t.bytes(), 16)), "cudaMalloc");
    blocks.push_back(t.data);
    return t;
  }
  ~Pool() {
    for (void *p : blocks)
      cudaFree(p);
  }
};

/// Fills `t` (bf16) with N(0, 1) values: one block of 4M draws, repeated along the tensor. The
/// kernels' time does not depend on the values, and drawing a billion normals on one core (a
/// [1, 256k, 32, 128] query) took longer than the attention being timed.
void fillRandom(const TensorView &t, std::mt19937 &rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t numel = size_t(t.numel()), block = std::min<size_t>(numel, size_t(1) << 22);
  std::vector<uint16_t> host(block);
  for (uint16_t &x : host)
    x = f32ToBf16(normal(rng));
  char *dst = static_cast<char *>(t.data);
  for (size_t at = 0; at < numel; at += block)
    check(cudaMemcpy(dst + at * 2, host.data(), std::min(block, numel - at) * 2,
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
}

/// Copies rank r's zigzag rows of `whole` [1, N·L, heads, D] into `share` [1, L, heads, D].
void copyShare(const TensorView &whole, const TensorView &share, int64_t ranks, int64_t rank) {
  const int64_t chunk = share.dim(1) / 2;
  const size_t rowBytes = size_t(share.dim(2) * share.dim(3)) * 2, chunkBytes = chunk * rowBytes;
  const char *src = static_cast<const char *>(whole.data);
  char *dst = static_cast<char *>(share.data);
  check(cudaMemcpy(dst, src + rank * chunkBytes, chunkBytes, cudaMemcpyDeviceToDevice),
        "cudaMemcpy");
  check(cudaMemcpy(dst + chunkBytes, src + (2 * ranks - 1 - rank) * chunkBytes, chunkBytes,
                   cudaMemcpyDeviceToDevice),
        "cudaMemcpy");
}

} // namespace

namespace {

int run(int argc, char **argv) {
  int reps = 5;
  std::vector<int64_t> dims;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else
      dims.push_back(std::atoll(argv[i]));
  }
  if (dims.empty() || dims.size() % 5 != 0) {
    std::fprintf(stderr, "usage: ring_attention_bench [--reps N] N L H KVH D [N L H KVH D ...]\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "ring_attention_bench: no GPU here\n");
    return 1;
  }
  cuda::Context ctx;
  std::mt19937 rng(0);
  for (size_t s = 0; s < dims.size(); s += 5) {
    const int64_t ranks = dims[s], local = dims[s + 1], h = dims[s + 2], kvh = dims[s + 3],
                  d = dims[s + 4], total = ranks * local;
    if (ranks < 2 || local % 2 != 0) {
      std::fprintf(stderr, "ring_attention_bench: %lld ranks of %lld tokens is not a ring\n",
                   (long long)ranks, (long long)local);
      return 2;
    }
    Pool pool;
    const double scale = 1.0 / std::sqrt(double(d));
    // The whole row.
    TensorView q = pool.make(DType::BF16, {1, total, h, d}),
               k = pool.make(DType::BF16, {1, total, kvh, d}),
               v = pool.make(DType::BF16, {1, total, kvh, d}),
               dout = pool.make(DType::BF16, {1, total, h, d}),
               o = pool.make(DType::BF16, {1, total, h, d}),
               lse = pool.make(DType::F32, {1, h, total}),
               dq = pool.make(DType::BF16, {1, total, h, d}),
               dk = pool.make(DType::BF16, {1, total, kvh, d}),
               dv = pool.make(DType::BF16, {1, total, kvh, d});
    for (const TensorView *t : {&q, &k, &v, &dout})
      fillRandom(*t, rng);
    auto wholeForward = [&] { cuda::flashAttention(ctx, q, k, v, true, scale, o, lse); };
    auto wholeBackward = [&] {
      cuda::flashAttentionGrad(ctx, dout, q, k, v, o, lse, true, scale, dq, dk, dv);
    };
    // The ranks' shares and state.
    struct Rank {
      TensorView q, k, v, dout, acc, lse, o, dq, dk, dv;
    };
    std::vector<Rank> rs(static_cast<size_t>(ranks));
    for (int64_t r = 0; r < ranks; ++r) {
      Rank &R = rs[size_t(r)];
      R.q = pool.make(DType::BF16, {1, local, h, d});
      R.k = pool.make(DType::BF16, {1, local, kvh, d});
      R.v = pool.make(DType::BF16, {1, local, kvh, d});
      R.dout = pool.make(DType::BF16, {1, local, h, d});
      R.acc = pool.make(DType::F32, {1, local, h, d});
      R.lse = pool.make(DType::F32, {1, h, local});
      R.o = pool.make(DType::BF16, {1, local, h, d});
      R.dq = pool.make(DType::F32, {1, local, h, d});
      R.dk = pool.make(DType::F32, {1, local, kvh, d});
      R.dv = pool.make(DType::F32, {1, local, kvh, d});
      copyShare(q, R.q, ranks, r);
      copyShare(k, R.k, ranks, r);
      copyShare(v, R.v, ranks, r);
      copyShare(dout, R.dout, ranks, r);
    }
    TensorView dkBlock = pool.make(DType::F32, {1, local, kvh, d}),
               dvBlock = pool.make(DType::F32, {1, local, kvh, d});
    auto ringForward = [&] {
      for (int64_t r = 0; r < ranks; ++r) {
        Rank &R = rs[size_t(r)];
        for (int64_t step = 0; step < ranks; ++step) {
          const Rank &held = rs[size_t((r - step + ranks) % ranks)];
          cuda::ringAttentionBlock(ctx, R.q, held.k, held.v, nullptr, nullptr, true, scale,
                                   {ranks, r, (r - step + ranks) % ranks}, R.acc, R.lse);
        }
        cuda::cast(ctx, R.acc, R.o);
      }
    };
    auto ringBackward = [&] {
      for (int64_t r = 0; r < ranks; ++r) {
        Rank &R = rs[size_t(r)];
        for (int64_t step = 0; step < ranks; ++step) {
          const int64_t holder = (r - step + ranks) % ranks;
          Rank &held = rs[size_t(holder)];
          cuda::ringAttentionBlockGrad(ctx, R.dout, R.q, held.k, held.v, R.o, R.lse, nullptr,
                                       nullptr, true, scale, {ranks, r, holder}, R.dq, dkBlock,
                                       dvBlock);
          cuda::add(ctx, held.dk, dkBlock, held.dk);
          cuda::add(ctx, held.dv, dvBlock, held.dv);
        }
      }
    };
    std::printf("# %lld ranks of %lld tokens: q %s, k and v %s bf16, causal\n", (long long)ranks,
                (long long)local, formatShape(q.shape).c_str(), formatShape(k.shape).c_str());
    std::fflush(stdout);
    const double wholeFwd = medianMs(wholeForward, reps);
    const double wholeBwd = medianMs(wholeBackward, reps);
    const double ringFwd = medianMs(ringForward, reps);
    const double ringBwd = medianMs(ringBackward, reps);
    check(cudaGetLastError(), "the kernels");
    std::printf("ring %lld %lld %lld %lld %lld whole_fwd_ms %.3f whole_bwd_ms %.3f ring_fwd_ms "
                "%.3f ring_bwd_ms %.3f\n",
                (long long)ranks, (long long)local, (long long)h, (long long)kvh, (long long)d,
                wholeFwd, wholeBwd, ringFwd, ringBwd);
    std::fflush(stdout);
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const Error &e) {
    std::fprintf(stderr, "ring_attention_bench: %s\n", e.what());
    return 1;
  }
}
