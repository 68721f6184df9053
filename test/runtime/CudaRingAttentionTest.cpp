//===- CudaRingAttentionTest.cpp - Ring attention's CUDA block steps --------===//
//
// N virtual ranks run in turn on one GPU: each takes its zigzag share of a sequence of N·S
// tokens (chunks r and 2N-1-r of 2N), runs cuda::ringAttentionBlock over every rank's
// key/value block in ring order (its own first, then ranks r-1, r-2, ...), and the backward
// steps (cuda::ringAttentionBlockGrad) add each block's dk and dv to that block's accumulator,
// as the ring would carry it. The results, gathered back into sequence order, are compared
// with the CPU's unpartitioned flashAttention and flashAttentionGrad (fp64 inside) on the same
// stored inputs: o, lse, dq, dk, dv, every element. Cases: 2 and 4 ranks, causal and full
// masks, MHA and GQA, bf16 at head dim 128 (the warpgroup kernels on an H200), bf16 at 64 (the
// mma.sync kernels), f32 (the generic kernels), two batch rows (the strided row copies), and
// packed rows with segment ids.
//
// Tolerances are CudaAttentionTest's: bf16 rounds p and ds for the tensor cores and the block
// outputs before the fp32 merge, errors of a few 1e-3 of the output's scale: 2e-2 relative plus
// 1e-2 of the largest magnitude per element; f32 1e-4 relative plus 1e-5 of the largest. A
// wrong pairing (a block's chunk against the wrong queries, a mask on the wrong side) moves
// whole rows by far more. Without a GPU every test skips.
//
//===----------------------------------------------------------------------===//

#ifdef BONSAI_HAVE_CUDA

#include "CudaTestUtil.h"
#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/CudaKernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace bonsai::rt;
namespace cpu = bonsai::rt::cpu;
namespace cuda = bonsai::rt::cuda;
using bonsai::test::haveGpu;
using bonsai::test::numelOf;

namespace {

using Shape = std::vector<int64_t>;

/// Device memory of one tensor, freed on scope exit.
struct Device {
  TensorView view;
  Device(DType dtype, Shape shape) : view{nullptr, dtype, std::move(shape)} {
    EXPECT_EQ(cudaMalloc(&view.data, std::max<size_t>(view.bytes(), 16)), cudaSuccess);
  }
  ~Device() { cudaFree(view.data); }
  Device(const Device &) = delete;
  Device &operator=(const Device &) = delete;

  /// Stores `values` rounded to the dtype.
  void upload(const std::vector<float> &values) {
    std::vector<uint8_t> bytes(view.bytes());
    TensorView host{bytes.data(), view.dtype, view.shape};
    storeF32(values.data(), host);
    EXPECT_EQ(cudaMemcpy(view.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  void uploadRaw(const void *data) {
    EXPECT_EQ(cudaMemcpy(view.data, data, view.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  /// NaN everywhere, so that an element no step writes shows.
  void poison() {
    std::vector<float> nan(size_t(view.numel()), std::numeric_limits<float>::quiet_NaN());
    upload(nan);
  }
  std::vector<float> download() const {
    std::vector<uint8_t> bytes(view.bytes());
    EXPECT_EQ(cudaMemcpy(bytes.data(), view.data, bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::vector<float> values(size_t(view.numel()));
    TensorView host{bytes.data(), view.dtype, view.shape};
    loadF32(host, values.data());
    return values;
  }
};

struct Case {
  int64_t ranks, batch, seq, heads, kvHeads, d; ///< seq: tokens per rank (two chunks)
  DType dtype;
  bool causal, segments;
  std::string name() const {
    return std::to_string(ranks) + " ranks B" + std::to_string(batch) + " S" + std::to_string(seq) +
           " H" + std::to_string(heads) + "/" + std::to_string(kvHeads) + " D" + std::to_string(d) +
           " " + dtypeName(dtype) + (causal ? " causal" : " full") + (segments ? " packed" : "");
  }
};

/// Each local row's index in the whole sequence: chunks rank and 2·ranks-1-rank.
std::vector<int64_t> zigzag(int64_t seq, int64_t ranks, int64_t rank) {
  const int64_t chunk = seq / 2;
  std::vector<int64_t> index(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i)
    index[size_t(i)] = i < chunk ? rank * chunk + i : (2 * ranks - 1 - rank) * chunk + (i - chunk);
  return index;
}

/// Rows `index` of axis 1 of x [B, T, rest] (rows of `width` elements).
std::vector<float> gatherRows(const std::vector<float> &x, int64_t batch, int64_t total,
                              int64_t width, const std::vector<int64_t> &index) {
  std::vector<float> out(size_t(batch) * index.size() * size_t(width));
  for (int64_t b = 0; b < batch; ++b)
    for (size_t i = 0; i < index.size(); ++i)
      std::copy_n(&x[size_t((b * total + index[i]) * width)], width,
                  &out[(size_t(b) * index.size() + i) * size_t(width)]);
  return out;
}

/// Rows `index` of the last axis of lse [B, H, T].
std::vector<float> gatherLse(const std::vector<float> &lse, int64_t outer, int64_t total,
                             const std::vector<int64_t> &index) {
  std::vector<float> out(size_t(outer) * index.size());
  for (int64_t o = 0; o < outer; ++o)
    for (size_t i = 0; i < index.size(); ++i)
      out[size_t(o) * index.size() + i] = lse[size_t(o * total + index[i])];
  return out;
}

/// Every element of `got` within the case's tolerance of `want`.
void expectClose(const std::vector<float> &got, const std::vector<float> &want, DType dtype,
                 const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double rel = dtype == DType::F32 ? 1e-4 : 2e-2, abs = dtype == DType::F32 ? 1e-5 : 1e-2;
  double scale = 0;
  for (float w : want)
    if (std::isfinite(w))
      scale = std::max(scale, double(std::fabs(w)));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isinf(w) ? g == w : std::fabs(g - w) <= rel * std::fabs(w) + abs * scale;
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "] = " << g << ", expected " << w;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements off";
}

/// A case's inputs, the CPU's unpartitioned results, and each virtual rank's share on the
/// device with room for its results.
struct Problem {
  Case c;
  int64_t T;
  double scale;
  std::vector<float> q, k, v, dout, o, lse, dq, dk, dv;
  std::vector<int64_t> seg;
  struct Rank {
    std::vector<int64_t> index;
    std::unique_ptr<Device> q, k, v, dout, seg, lse, o, dq, dk, dv;
  };
  std::vector<Rank> ranks;

  explicit Problem(const Case &c) : c(c), T(c.ranks * c.seq), scale(1.0 / std::sqrt(double(c.d))) {
    const int64_t N = c.ranks, B = c.batch, S = c.seq, H = c.heads, G = c.kvHeads, D = c.d;
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    auto random = [&](int64_t n) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float &e : x)
        e = dist(rng);
      // Round to the storage dtype, so the CPU reference reads the values the GPU reads.
      std::vector<uint8_t> bytes(size_t(n) * dtypeSize(c.dtype));
      TensorView t{bytes.data(), c.dtype, {n}};
      storeF32(x.data(), t);
      loadF32(t, x.data());
      return x;
    };
    q = random(B * T * H * D);
    k = random(B * T * G * D);
    v = random(B * T * G * D);
    dout = random(B * T * H * D);
    // Packed rows: segments of 5, 40 (41) and the rest tokens, some across chunk borders.
    seg.resize(size_t(B * T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        seg[size_t(b * T + t)] = t < 5 ? 0 : t < 45 + b ? 1 : 2;
    TensorView segAll{seg.data(), DType::I64, {B, T}};
    o.resize(q.size());
    lse.resize(size_t(B * H * T));
    dq.resize(q.size());
    dk.resize(k.size());
    dv.resize(v.size());
    TensorView qv{q.data(), DType::F32, {B, T, H, D}}, kv{k.data(), DType::F32, {B, T, G, D}},
        vv{v.data(), DType::F32, {B, T, G, D}}, ov{o.data(), DType::F32, {B, T, H, D}},
        lv{lse.data(), DType::F32, {B, H, T}}, dov{dout.data(), DType::F32, {B, T, H, D}},
        dqv{dq.data(), DType::F32, {B, T, H, D}}, dkv{dk.data(), DType::F32, {B, T, G, D}},
        dvv{dv.data(), DType::F32, {B, T, G, D}};
    cpu::flashAttention(qv, kv, vv, c.causal, scale, ov, lv, c.segments ? &segAll : nullptr);
    cpu::flashAttentionGrad(dov, qv, kv, vv, ov, lv, c.causal, scale, dqv, dkv, dvv,
                            c.segments ? &segAll : nullptr);

    ranks.resize(size_t(N));
    for (int64_t r = 0; r < N; ++r) {
      Rank &R = ranks[size_t(r)];
      R.index = zigzag(S, N, r);
      auto make = [](DType dtype, Shape shape) { return std::make_unique<Device>(dtype, shape); };
      R.q = make(c.dtype, {B, S, H, D});
      R.k = make(c.dtype, {B, S, G, D});
      R.v = make(c.dtype, {B, S, G, D});
      R.dout = make(c.dtype, {B, S, H, D});
      R.q->upload(gatherRows(q, B, T, H * D, R.index));
      R.k->upload(gatherRows(k, B, T, G * D, R.index));
      R.v->upload(gatherRows(v, B, T, G * D, R.index));
      R.dout->upload(gatherRows(dout, B, T, H * D, R.index));
      if (c.segments) {
        R.seg = make(DType::I64, {B, S});
        std::vector<int64_t> local(size_t(B * S));
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < S; ++i)
            local[size_t(b * S + i)] = seg[size_t(b * T + R.index[size_t(i)])];
        R.seg->uploadRaw(local.data());
      }
      R.lse = make(DType::F32, {B, H, S});
      R.o = make(c.dtype, {B, S, H, D});
      // f32 accumulators for the block steps; the driver writes the dtype (resized below).
      R.dq = make(DType::F32, {B, S, H, D});
      R.dk = make(DType::F32, {B, S, G, D});
      R.dv = make(DType::F32, {B, S, G, D});
    }
  }

  const TensorView *segmentsOf(int64_t r) const {
    return c.segments ? &ranks[size_t(r)].seg->view : nullptr;
  }

  /// Every rank's o, lse, dq, dk, dv against the unpartitioned results.
  void check(const std::string &how) const {
    const int64_t B = c.batch, H = c.heads, G = c.kvHeads, D = c.d;
    for (int64_t r = 0; r < c.ranks; ++r) {
      const Rank &R = ranks[size_t(r)];
      const std::string at = how + ", " + c.name() + ", rank " + std::to_string(r) + ": ";
      expectClose(R.o->download(), gatherRows(o, B, T, H * D, R.index), c.dtype, at + "o");
      expectClose(R.lse->download(), gatherLse(lse, B * H, T, R.index), DType::F32, at + "lse");
      expectClose(R.dq->download(), gatherRows(dq, B, T, H * D, R.index), c.dtype, at + "dq");
      expectClose(R.dk->download(), gatherRows(dk, B, T, G * D, R.index), c.dtype, at + "dk");
      expectClose(R.dv->download(), gatherRows(dv, B, T, G * D, R.index), c.dtype, at + "dv");
    }
  }
};

/// The block steps of every virtual rank in turn, each block's dk and dv added to its
/// accumulator as the ring would carry it.
void runBlockSteps(Problem &p) {
  const int64_t N = p.c.ranks;
  cuda::Context ctx;
  for (auto &R : p.ranks) {
    R.lse->poison();
    R.dq->poison();
    ASSERT_EQ(cudaMemset(R.dk->view.data, 0, R.dk->view.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(R.dv->view.data, 0, R.dv->view.bytes()), cudaSuccess);
  }
  Device acc(DType::F32, p.ranks[0].q->view.shape);
  for (int64_t r = 0; r < N; ++r) {
    auto &R = p.ranks[size_t(r)];
    acc.poison();
    for (int64_t s = 0; s < N; ++s) {
      const int64_t h = (r - s + N) % N;
      auto &held = p.ranks[size_t(h)];
      cuda::ringAttentionBlock(ctx, R.q->view, held.k->view, held.v->view, p.segmentsOf(r),
                               p.segmentsOf(h), p.c.causal, p.scale, {N, r, h}, acc.view,
                               R.lse->view);
    }
    cuda::cast(ctx, acc.view, R.o->view);
  }
  Device dkBlock(DType::F32, p.ranks[0].k->view.shape), dvBlock(DType::F32, dkBlock.view.shape);
  for (int64_t r = 0; r < N; ++r) {
    auto &R = p.ranks[size_t(r)];
    for (int64_t s = 0; s < N; ++s) {
      const int64_t h = (r - s + N) % N;
      auto &held = p.ranks[size_t(h)];
      dkBlock.poison();
      dvBlock.poison();
      cuda::ringAttentionBlockGrad(ctx, R.dout->view, R.q->view, held.k->view, held.v->view,
                                   R.o->view, R.lse->view, p.segmentsOf(r), p.segmentsOf(h),
                                   p.c.causal, p.scale, {N, r, h}, R.dq->view, dkBlock.view,
                                   dvBlock.view);
      cuda::add(ctx, held.dk->view, dkBlock.view, held.dk->view);
      cuda::add(ctx, held.dv->view, dvBlock.view, held.dv->view);
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  p.check("block steps in turn");
}

/// N virtual ranks on N threads of this process, each with its own compute and transfer
/// streams: a shift copies the previous rank's send buffer into this rank's receive buffer on
/// this rank's transfer stream once the previous rank's stream has it ready, and this rank's
/// stream then waits until the next rank has copied its send buffer, as NCCL's send/recv
/// pair completes. Every rank must call shift in the same order (a barrier between phases,
/// which fails after 60 s rather than hang).
class ThreadRing {
public:
  explicit ThreadRing(int64_t ranks)
      : sends_(size_t(ranks)), ready_(size_t(ranks)), copied_(size_t(ranks)) {
    for (size_t r = 0; r < size_t(ranks); ++r) {
      EXPECT_EQ(cudaEventCreateWithFlags(&ready_[r], cudaEventDisableTiming), cudaSuccess);
      EXPECT_EQ(cudaEventCreateWithFlags(&copied_[r], cudaEventDisableTiming), cudaSuccess);
    }
  }
  ~ThreadRing() {
    for (size_t r = 0; r < ready_.size(); ++r) {
      cudaEventDestroy(ready_[r]);
      cudaEventDestroy(copied_[r]);
    }
  }

  cuda::RingTransport transport(int64_t rank, cudaStream_t stream) {
    cuda::RingTransport t;
    t.ranks = int64_t(sends_.size());
    t.rank = rank;
    t.stream = stream;
    t.shift = [this, rank, stream](const void *send, void *recv, size_t count, DType dtype,
                                   const std::string &what) {
      shift(size_t(rank), stream, send, recv, count * dtypeSize(dtype), what);
    };
    return t;
  }

private:
  void shift(size_t r, cudaStream_t stream, const void *send, void *recv, size_t bytes,
             const std::string &what) {
    const size_t n = sends_.size(), prev = (r + n - 1) % n, next = (r + 1) % n;
    check(cudaEventRecord(ready_[r], stream), what);
    sends_[r] = send;
    barrier(what);
    check(cudaStreamWaitEvent(stream, ready_[prev], 0), what);
    check(cudaMemcpyAsync(recv, sends_[prev], bytes, cudaMemcpyDeviceToDevice, stream), what);
    check(cudaEventRecord(copied_[r], stream), what);
    barrier(what);
    check(cudaStreamWaitEvent(stream, copied_[next], 0), what);
  }
  static void check(cudaError_t status, const std::string &what) {
    if (status != cudaSuccess)
      throw Error(what + ": " + cudaGetErrorString(status));
  }
  void barrier(const std::string &what) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t round = round_;
    if (++arrived_ == sends_.size()) {
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return round_ != round; }))
      throw Error(what + ": the other virtual ranks did not arrive within 60 s");
  }

  std::vector<const void *> sends_;
  std::vector<cudaEvent_t> ready_, copied_;
  std::mutex mutex_;
  std::condition_variable cv_;
  size_t arrived_ = 0;
  uint64_t round_ = 0;
};

/// cuda::ringAttention and ringAttentionGrad (with the saved lse, or recomputing it) on N
/// threads, one virtual rank each.
void runThreadedRing(Problem &p, bool savedLse) {
  const int64_t N = p.c.ranks;
  ThreadRing ring(N);
  // The driver writes dq, dk, dv in the inputs' dtype.
  for (auto &R : p.ranks) {
    R.dq = std::make_unique<Device>(p.c.dtype, R.q->view.shape);
    R.dk = std::make_unique<Device>(p.c.dtype, R.k->view.shape);
    R.dv = std::make_unique<Device>(p.c.dtype, R.v->view.shape);
    for (Device *d : {R.o.get(), R.lse.get(), R.dq.get(), R.dk.get(), R.dv.get()})
      d->poison();
  }
  std::vector<std::string> errors(static_cast<size_t>(N));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < N; ++r)
    threads.emplace_back([&, r] {
      auto &R = p.ranks[size_t(r)];
      cudaStream_t compute = nullptr, transfers = nullptr;
      cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
      cudaStreamCreateWithFlags(&transfers, cudaStreamNonBlocking);
      try {
        cuda::Context ctx;
        ctx.stream = compute;
        cuda::RingTransport t = ring.transport(r, transfers);
        cuda::ringAttention(ctx, t, R.q->view, R.k->view, R.v->view, p.segmentsOf(r), p.c.causal,
                            p.scale, R.o->view, &R.lse->view);
        cuda::ringAttentionGrad(ctx, t, R.dout->view, R.q->view, R.k->view, R.v->view, R.o->view,
                                savedLse ? &R.lse->view : nullptr, p.segmentsOf(r), p.c.causal,
                                p.scale, R.dq->view, R.dk->view, R.dv->view);
        if (cudaStreamSynchronize(compute) != cudaSuccess)
          errors[size_t(r)] = "the stream failed";
      } catch (const Error &e) {
        errors[size_t(r)] = e.what();
      }
      cudaStreamDestroy(compute);
      cudaStreamDestroy(transfers);
    });
  for (std::thread &t : threads)
    t.join();
  for (int64_t r = 0; r < N; ++r)
    ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
  p.check(savedLse ? "threaded ring" : "threaded ring, lse recomputed");
}

TEST(CudaRingAttention, BlockStepsMatchTheWholeSequence) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  const Case cases[] = {
      {2, 1, 256, 4, 1, 128, DType::BF16, true, false},  // warpgroup kernels on an H200, GQA 4
      {4, 1, 192, 4, 4, 128, DType::BF16, true, false},  // MHA, chunks of 96 (ragged tiles)
      {2, 2, 128, 4, 2, 128, DType::BF16, true, false},  // two batch rows: strided row copies
      {2, 1, 256, 4, 2, 128, DType::BF16, false, false}, // full mask
      {4, 1, 128, 4, 1, 64, DType::BF16, true, false},   // mma.sync kernels
      {2, 1, 96, 2, 1, 32, DType::F32, true, false},     // generic kernels
      {4, 2, 64, 2, 2, 16, DType::F32, false, false},
      {2, 1, 128, 4, 2, 128, DType::BF16, true, true}, // packed rows (generic kernels)
      {4, 2, 64, 2, 1, 32, DType::F32, true, true},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name());
    Problem p(c);
    runBlockSteps(p);
  }
}

TEST(CudaRingAttention, ThreadedRingMatchesTheWholeSequence) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  const Case cases[] = {
      {2, 1, 256, 4, 1, 128, DType::BF16, true, false},
      {4, 2, 128, 4, 2, 128, DType::BF16, true, false},
      {3, 1, 128, 4, 4, 64, DType::BF16, false, false},
      {4, 1, 64, 2, 1, 32, DType::F32, true, true},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name());
    Problem p(c);
    runThreadedRing(p, true);
    runThreadedRing(p, false);
  }
}

TEST(CudaRingAttention, RefusesWhatIsNotAStep) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  Device q(DType::BF16, {1, 6, 2, 64}), k(DType::BF16, {1, 6, 1, 64}),
      acc(DType::F32, {1, 6, 2, 64}), lse(DType::F32, {1, 2, 6}), odd(DType::BF16, {1, 5, 2, 64}),
      oddK(DType::BF16, {1, 5, 1, 64}), oddAcc(DType::F32, {1, 5, 2, 64}),
      oddLse(DType::F32, {1, 2, 5});
  cuda::Context ctx;
  auto message = [](const auto &fn) {
    try {
      fn();
    } catch (const Error &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              cuda::ringAttentionBlock(ctx, q.view, k.view, k.view, nullptr, nullptr, true, 0.125,
                                       {2, 0, 2}, acc.view, lse.view);
            }).find("is not a step of a ring of 2 ranks"),
            std::string::npos);
  EXPECT_NE(message([&] {
              cuda::ringAttentionBlock(ctx, odd.view, oddK.view, oddK.view, nullptr, nullptr, true,
                                       0.125, {2, 0, 1}, oddAcc.view, oddLse.view);
            }).find("is not two equal zigzag chunks"),
            std::string::npos);
  EXPECT_NE(message([&] {
              cuda::ringAttentionBlock(ctx, q.view, k.view, k.view, nullptr, nullptr, true, 0.125,
                                       {2, 0, 1}, lse.view, lse.view);
            }).find("acc is f32 [1, 2, 6], not f32 [1, 6, 2, 64]"),
            std::string::npos);
}

} // namespace

#endif // BONSAI_HAVE_CUDA
