//===- CudaGaLoreTest.cpp - The CUDA GaLore kernels against the CPU ones --===//
//
// galore_refresh, galore_project and galore_adamw_update on the GPU against the CPU reference
// (GaLore.h) on fresh random data from fixed seeds: the randomized projector of both sides
// (its QR factor is unique, so the two backends must agree to f32 rounding), rank-deficient
// gradients (rank 3 with exact zero rows: the whole completed projector against the CPU's;
// rank 1 from an exact outer product: the first column, orthonormality and the range), a
// refresh that is not due (every byte of the projector and status unchanged), a non-finite
// gradient (projector kept, status 1) and its round-robin retries, the projection in f32 and
// bf16, and the update with an f32 parameter and with a bf16 parameter and its fp32 master.
// Device outputs are poisoned with NaN before each call, so an unwritten element fails. The
// Perf test times one refresh, one of a rank-100 gradient (the completion runs) and the
// not-due chain at TinyLlama-1.1B's MLP shape (printed, not asserted). Every test skips
// without a GPU.
//
//===----------------------------------------------------------------------===//

#ifdef BONSAI_HAVE_CUDA

#include "CudaTestUtil.h"
#include "bonsai/runtime/GaLore.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace bonsai::rt;
using bonsai::test::haveGpu;

namespace {

void cudaOk(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

/// A tensor on both sides: host bytes (what the CPU kernel works on) and a device copy.
struct Pair {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> host;
  void *device = nullptr;

  Pair(DType d, std::vector<int64_t> s) : dtype(d), shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t x : shape)
      n *= x;
    host.assign(size_t(n) * dtypeSize(dtype), 0);
    cudaOk(cudaMalloc(&device, host.size() ? host.size() : 1), "cudaMalloc");
  }
  ~Pair() { cudaFree(device); }
  Pair(const Pair &) = delete;
  Pair &operator=(const Pair &) = delete;

  int64_t numel() const { return int64_t(host.size() / dtypeSize(dtype)); }
  TensorView hostView() { return TensorView{host.data(), dtype, shape}; }
  TensorView deviceView() { return TensorView{device, dtype, shape}; }
  void upload() {
    cudaOk(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(host.size());
    cudaOk(cudaMemcpy(out.data(), device, out.size(), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  /// Fills both sides with N(0, scale) values rounded to the dtype.
  void random(std::mt19937 &rng, double scale) {
    std::normal_distribution<float> dist(0.0f, float(scale));
    std::vector<float> v(static_cast<size_t>(numel()));
    for (float &x : v)
      x = dist(rng);
    storeF32(v.data(), hostView());
    upload();
  }
  void fill(float value) {
    std::vector<float> v(size_t(numel()), value);
    storeF32(v.data(), hostView());
    upload();
  }
  /// The device bytes, decoded to f32.
  std::vector<float> deviceValues() const {
    std::vector<uint8_t> bytes = download();
    std::vector<float> v(static_cast<size_t>(numel()));
    loadF32(TensorView{bytes.data(), dtype, shape}, v.data());
    return v;
  }
  std::vector<float> hostValues() {
    std::vector<float> v(static_cast<size_t>(numel()));
    loadF32(hostView(), v.data());
    return v;
  }
};

/// Every element within atol + rtol·max|want| of the CPU's.
void expectClose(const std::string &what, const std::vector<float> &got,
                 const std::vector<float> &want, double rtol, double atol = 0.0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0.0;
  for (float w : want)
    largest = std::max(largest, double(std::fabs(w)));
  double bound = atol + rtol * largest, worst = 0.0;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(double(got[i]) - double(want[i]));
    if (!(err <= bound))
      ++bad;
    worst = std::max(worst, std::isnan(err) ? INFINITY : err);
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off by more than "
                     << bound << " (worst " << worst << ")";
}

class CudaGaLoreTest : public ::testing::Test {
protected:
  void SetUp() override {
    if (!haveGpu())
      GTEST_SKIP() << "no GPU here";
    cudaOk(cudaStreamCreate(&stream_), "cudaStreamCreate");
    engine_ = std::make_unique<cuda::GemmEngine>();
    cudaOk(cudaMalloc(reinterpret_cast<void **>(&error_), sizeof(cuda::DeviceError)), "cudaMalloc");
    cudaOk(cudaMemset(error_, 0, sizeof(cuda::DeviceError)), "cudaMemset");
    ctx.stream = stream_;
    ctx.gemm = engine_.get();
    ctx.deviceError = error_;
  }
  void TearDown() override {
    if (!stream_)
      return;
    engine_.reset();
    cudaFree(error_);
    cudaStreamDestroy(stream_);
  }
  void sync() { cudaOk(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  /// Refreshes a [m, n] gradient of `dtype` at `step` on both backends and compares.
  void checkRefresh(int64_t m, int64_t n, DType dtype, int64_t rank, int64_t powerIterations) {
    std::mt19937 rng(uint32_t(m * 131 + n));
    bool left = m <= n;
    int64_t small = std::min(m, n), large = std::max(m, n);
    Pair grad(dtype, {m, n}), step(DType::I64, {}),
        ws(DType::F32, {galore::workspaceElements(small, large, rank)});
    Pair projector(DType::F32, {small, rank}), status(DType::F32, {3});
    grad.random(rng, 0.02);
    step.upload();
    projector.fill(NAN);
    status.fill(0.0f);
    galore::RefreshParams p;
    p.rank = rank;
    p.updateProjGap = 4;
    p.offset = 1;
    p.slot = 2;
    p.left = left;
    p.randomized = true;
    p.powerIterations = powerIterations;
    p.seed = 11;
    cuda::galoreRefresh(ctx, grad.deviceView(), step.deviceView(), p, ws.deviceView(),
                        projector.deviceView(), status.deviceView());
    sync();
    cpu::galoreRefresh(grad.hostView(), step.hostView(), p, ws.hostView(), projector.hostView(),
                       status.hostView());
    std::string what = std::to_string(m) + "x" + std::to_string(n) + " " + dtypeName(dtype);
    expectClose(what + " projector", projector.deviceValues(), projector.hostValues(), 2e-4);
    EXPECT_EQ(status.deviceValues(), std::vector<float>(3, 0.0f)) << what;
  }

  cuda::Context ctx;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::GemmEngine> engine_;
  cuda::DeviceError *error_ = nullptr;
};

TEST_F(CudaGaLoreTest, RandomizedRefreshMatchesCpu) {
  checkRefresh(24, 70, DType::F32, 5, 1);   // left
  checkRefresh(70, 24, DType::F32, 5, 2);   // right
  checkRefresh(33, 33, DType::F32, 8, 0);   // square, no power iteration
  checkRefresh(40, 130, DType::BF16, 6, 1); // bf16 gradient
  checkRefresh(96, 200, DType::F32, 70, 1); // rank above a 64 tile
}

/// The s x r projector's largest deviation from orthonormal columns.
double orthonormalityError(const std::vector<float> &p, int64_t s, int64_t r) {
  double worst = 0.0;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j) {
      double dot = 0.0;
      for (int64_t k = 0; k < s; ++k)
        dot += double(p[size_t(k * r + i)]) * p[size_t(k * r + j)];
      worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
    }
  return worst;
}

TEST_F(CudaGaLoreTest, RankDeficientRefreshMatchesCpu) {
  for (bool left : {true, false}) {
    // Rank 3 < 12 with exact zeros: only rows 1, 9 and 30 of A (the gradient, or its
    // transpose) are nonzero, so the f32 sketch is exactly rank-deficient on the GPU too, both
    // backends leave out the same columns and complete them with the same unit vectors.
    int64_t s = 40, l = 90, rank = 12, m = left ? s : l, n = left ? l : s;
    std::mt19937 rng(21);
    Pair grad(DType::F32, {m, n}), step(DType::I64, {}),
        ws(DType::F32, {galore::workspaceElements(s, l, rank)});
    Pair projector(DType::F32, {s, rank}), status(DType::F32, {2});
    grad.random(rng, 0.05);
    std::vector<float> g = grad.hostValues();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < n; ++k) {
        int64_t row = left ? i : k;
        if (row != 1 && row != 9 && row != 30)
          g[size_t(i * n + k)] = 0.0f;
      }
    storeF32(g.data(), grad.hostView());
    grad.upload();
    step.upload();
    projector.fill(NAN);
    status.fill(0.0f);
    galore::RefreshParams p;
    p.rank = rank;
    p.updateProjGap = 4;
    p.slot = 1;
    p.left = left;
    p.seed = 3;
    cuda::galoreRefresh(ctx, grad.deviceView(), step.deviceView(), p, ws.deviceView(),
                        projector.deviceView(), status.deviceView());
    sync();
    cpu::galoreRefresh(grad.hostView(), step.hostView(), p, ws.hostView(), projector.hostView(),
                       status.hostView());
    std::string what = std::string(left ? "left" : "right") + " rank 3";
    EXPECT_EQ(status.deviceValues(), std::vector<float>(2, 0.0f)) << what;
    ASSERT_EQ(status.hostValues(), std::vector<float>(2, 0.0f)) << what;
    expectClose(what + " projector", projector.deviceValues(), projector.hostValues(), 2e-4);
    EXPECT_LT(orthonormalityError(projector.deviceValues(), s, rank), 2e-5) << what;
  }

  // Rank 1, G = u·vᵀ exactly in f32 (products of few-bit values): on the GPU the f32 sketch
  // carries rounding noise in the other directions, which it may keep rather than complete,
  // so only what both must share is compared: the first column (u's direction), orthonormal
  // columns, and the gradient inside P's span.
  int64_t m = 48, n = 100, rank = 6;
  Pair grad(DType::F32, {m, n}), step(DType::I64, {}),
      ws(DType::F32, {galore::workspaceElements(m, n, rank)});
  Pair projector(DType::F32, {m, rank}), status(DType::F32, {1});
  std::vector<float> g(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t k = 0; k < n; ++k)
      g[size_t(i * n + k)] = float(((i * 5 + 3) % 11) - 5) / 8.0f * float(((k * 7 + 2) % 13) - 6);
  storeF32(g.data(), grad.hostView());
  grad.upload();
  step.upload();
  projector.fill(NAN);
  status.fill(0.0f);
  galore::RefreshParams p;
  p.rank = rank;
  p.updateProjGap = 4;
  cuda::galoreRefresh(ctx, grad.deviceView(), step.deviceView(), p, ws.deviceView(),
                      projector.deviceView(), status.deviceView());
  sync();
  cpu::galoreRefresh(grad.hostView(), step.hostView(), p, ws.hostView(), projector.hostView(),
                     status.hostView());
  EXPECT_EQ(status.deviceValues(), std::vector<float>{0.0f});
  std::vector<float> gpu = projector.deviceValues(), cpu = projector.hostValues();
  std::vector<float> gpuFirst, cpuFirst;
  for (int64_t i = 0; i < m; ++i) {
    gpuFirst.push_back(gpu[size_t(i * rank)]);
    cpuFirst.push_back(cpu[size_t(i * rank)]);
  }
  expectClose("rank 1 first column", gpuFirst, cpuFirst, 1e-5);
  EXPECT_LT(orthonormalityError(gpu, m, rank), 2e-5);
  double residual = 0.0, norm = 0.0;
  for (int64_t k = 0; k < n; ++k)
    for (int64_t i = 0; i < m; ++i) {
      double back = 0.0;
      for (int64_t c = 0; c < rank; ++c) {
        double pta = 0.0;
        for (int64_t j = 0; j < m; ++j)
          pta += double(gpu[size_t(j * rank + c)]) * g[size_t(j * n + k)];
        back += gpu[size_t(i * rank + c)] * pta;
      }
      residual = std::max(residual, std::fabs(back - g[size_t(i * n + k)]));
      norm = std::max(norm, double(std::fabs(g[size_t(i * n + k)])));
    }
  EXPECT_LT(residual, 1e-5 * norm) << "G = P·Pᵀ·G";
}

TEST_F(CudaGaLoreTest, NonFiniteRetriesAreRoundRobin) {
  // Slot 2 of 4 weights, T = 100 (offset 10): the staggered refreshes are at steps 0 and 90. A
  // NaN at step 90, then the status after each later step on both backends: retried (positive)
  // only when step % 4 == 2, pending (negative) otherwise; the NaN goes at step 100, and the
  // retry at 102 refreshes.
  std::mt19937 rng(8);
  Pair grad(DType::F32, {16, 40}), step(DType::I64, {}),
      ws(DType::F32, {galore::workspaceElements(16, 40, 4)});
  Pair projector(DType::F32, {16, 4}), status(DType::F32, {4});
  grad.random(rng, 1.0);
  projector.random(rng, 1.0);
  status.fill(0.0f);
  galore::RefreshParams p;
  p.rank = 4;
  p.updateProjGap = 100;
  p.offset = 10;
  p.slot = 2;
  std::vector<float> values = grad.hostValues();
  for (int64_t done = 90; done <= 104; ++done) {
    values[7] = done < 100 ? NAN : 0.25f;
    storeF32(values.data(), grad.hostView());
    grad.upload();
    std::memcpy(step.host.data(), &done, 8);
    step.upload();
    cuda::galoreRefresh(ctx, grad.deviceView(), step.deviceView(), p, ws.deviceView(),
                        projector.deviceView(), status.deviceView());
    sync();
    cpu::galoreRefresh(grad.hostView(), step.hostView(), p, ws.hostView(), projector.hostView(),
                       status.hostView());
    std::vector<float> got = status.deviceValues(), want = status.hostValues();
    EXPECT_EQ(got, want) << "step " << done;
    float expected = done == 90 || (done < 100 && done % 4 == 2) ? 1.0f
                     : done < 102                                ? -1.0f
                                                                 : 0.0f;
    EXPECT_EQ(got[2], expected) << "step " << done;
    expectClose("projector at step " + std::to_string(done), projector.deviceValues(),
                projector.hostValues(), 2e-4);
  }
}

TEST_F(CudaGaLoreTest, RefreshNotDueOrNonFiniteKeepsProjector) {
  std::mt19937 rng(5);
  Pair grad(DType::F32, {16, 40}), step(DType::I64, {}),
      ws(DType::F32, {galore::workspaceElements(16, 40, 4)});
  Pair projector(DType::F32, {16, 4}), status(DType::F32, {1});
  grad.random(rng, 1.0);
  projector.random(rng, 1.0);
  status.fill(0.0f);
  int64_t done = 2; // (2 + 1) % 4 != 0: not due
  std::memcpy(step.host.data(), &done, 8);
  step.upload();
  galore::RefreshParams p;
  p.rank = 4;
  p.updateProjGap = 4;
  p.offset = 1;
  cuda::galoreRefresh(ctx, grad.deviceView(), step.deviceView(), p, ws.deviceView(),
                      projector.deviceView(), status.deviceView());
  sync();
  EXPECT_EQ(projector.download(), projector.host) << "a refresh that is not due wrote P";
  EXPECT_EQ(status.deviceValues(), std::vector<float>{0.0f});

  done = 3; // due, but the gradient holds a NaN
  std::memcpy(step.host.data(), &done, 8);
  step.upload();
  float nan = NAN;
  cudaOk(cudaMemcpy(static_cast<float *>(grad.device) + 77, &nan, 4, cudaMemcpyHostToDevice),
         "poke");
  cuda::galoreRefresh(ctx, grad.deviceView(), step.deviceView(), p, ws.deviceView(),
                      projector.deviceView(), status.deviceView());
  sync();
  EXPECT_EQ(projector.download(), projector.host) << "a non-finite gradient replaced P";
  EXPECT_EQ(status.deviceValues(), std::vector<float>{float(galore::kNonFinite)});
}

TEST_F(CudaGaLoreTest, ProjectMatchesCpu) {
  std::mt19937 rng(9);
  // (m, n, gradient dtype, bf16 operands): f32 both ways, a bf16 gradient, and the f32
  // gradient of a bf16 weight, rounded to bf16 for the tensor cores on both backends.
  for (auto [m, n, dtype, bf16] : {std::tuple<int64_t, int64_t, DType, bool>{48, 100, DType::F32, false},
                                   {100, 48, DType::F32, false},
                                   {64, 176, DType::BF16, true},
                                   {176, 64, DType::BF16, true},
                                   {96, 160, DType::F32, true}}) {
    bool left = m <= n;
    int64_t rank = 8;
    Pair grad(dtype, {m, n}), projector(DType::F32, {std::min(m, n), rank});
    Pair r(DType::F32, left ? std::vector<int64_t>{rank, n} : std::vector<int64_t>{m, rank});
    grad.random(rng, 0.5);
    projector.random(rng, 0.3);
    r.fill(NAN);
    cuda::galoreProject(ctx, grad.deviceView(), projector.deviceView(), left, bf16,
                        r.deviceView());
    sync();
    cpu::galoreProject(grad.hostView(), projector.hostView(), left, bf16, r.hostView());
    // The same bf16 operands on both sides: only the order of the fp32 sums differs.
    expectClose(std::to_string(m) + "x" + std::to_string(n) + " " + dtypeName(dtype) +
                    (bf16 ? " bf16 operands" : ""),
                r.deviceValues(), r.hostValues(), 1e-5);
  }
}

TEST_F(CudaGaLoreTest, AdamWUpdateMatchesCpu) {
  std::mt19937 rng(13);
  // A bf16 weight with its fp32 master, or without one (master_weights = false: the update
  // accumulates into the bf16 weight itself).
  for (auto [m, n, dtype, withMaster] :
       {std::tuple<int64_t, int64_t, DType, bool>{40, 72, DType::F32, false},
        {72, 40, DType::F32, false},
        {64, 176, DType::BF16, true},
        {176, 64, DType::BF16, true},
        {64, 176, DType::BF16, false},
        {176, 64, DType::BF16, false}}) {
    bool left = m <= n;
    int64_t rank = 6;
    std::vector<int64_t> reduced =
        left ? std::vector<int64_t>{rank, n} : std::vector<int64_t>{m, rank};
    Pair step(DType::I64, {}), lr(DType::F32, {}), norm(DType::F32, {});
    Pair projector(DType::F32, {std::min(m, n), rank}), r(DType::F32, reduced);
    Pair param(dtype, {m, n}), mom(DType::F32, reduced), var(DType::F32, reduced);
    Pair master(DType::F32, {m, n});
    int64_t done = 4;
    std::memcpy(step.host.data(), &done, 8);
    step.upload();
    lr.fill(3e-3f);
    norm.fill(2.5f);
    projector.random(rng, 0.3);
    r.random(rng, 0.1);
    param.random(rng, 0.05);
    mom.random(rng, 0.01);
    std::vector<float> v = var.hostValues();
    std::normal_distribution<float> dist(0.0f, 0.01f);
    for (float &x : v)
      x = std::fabs(dist(rng)) * 0.01f; // second moments are non-negative
    storeF32(v.data(), var.hostView());
    var.upload();
    std::vector<float> w = param.hostValues();
    storeF32(w.data(), master.hostView());
    master.upload();
    cpu::AdamWHyper hyper;
    hyper.beta1 = 0.9;
    hyper.beta2 = 0.95;
    hyper.eps = 1e-8;
    hyper.weightDecay = 0.1;
    hyper.gradClip = 1.0;
    TensorView dm = master.deviceView(), hm = master.hostView();
    cuda::galoreAdamwUpdate(ctx, step.deviceView(), lr.deviceView(), norm.deviceView(),
                            projector.deviceView(), hyper, 0.25, left, r.deviceView(),
                            param.deviceView(), mom.deviceView(), var.deviceView(),
                            withMaster ? &dm : nullptr);
    sync();
    cpu::galoreAdamwUpdate(step.hostView(), lr.hostView(), norm.hostView(), projector.hostView(),
                           hyper, 0.25, left, r.hostView(), param.hostView(), mom.hostView(),
                           var.hostView(), withMaster ? &hm : nullptr);
    std::string what = std::to_string(m) + "x" + std::to_string(n) + " " + dtypeName(dtype) +
                       (withMaster ? " with master" : "");
    expectClose(what + " m", mom.deviceValues(), mom.hostValues(), 1e-5);
    expectClose(what + " v", var.deviceValues(), var.hostValues(), 1e-5);
    expectClose(what + " r", r.deviceValues(), r.hostValues(), 1e-5);
    // The weights (~0.2) move by ~1e-3: a few ulps of the weight (2e-7) apart, as both
    // backends round P and the step to bf16 for a bf16 weight (an element of the step that
    // rounds the other way on one side is 2^-8 of ~1e-4: 4e-7). A bf16 weight rounds its
    // result: one bf16 ulp (2^-8 relative) apart where the sums straddle a rounding boundary.
    bool bf16 = dtype == DType::BF16;
    double stepTol = bf16 ? 1e-6 : 2e-7;
    if (withMaster)
      expectClose(what + " master", master.deviceValues(), master.hostValues(), 0.0, stepTol);
    expectClose(what + " param", param.deviceValues(), param.hostValues(), bf16 ? 1e-2 : 0.0,
                stepTol);
  }
}

TEST_F(CudaGaLoreTest, PerfRefreshTinyLlamaMlp) {
  // gate_proj of TinyLlama-1.1B: 5632 x 2048 (projected on the right), rank 512, with a bf16
  // gradient (mixed precision) and an f32 one (an f32 model).
  int64_t m = 5632, n = 2048, rank = 512;
  for (DType dtype : {DType::BF16, DType::F32}) {
    std::mt19937 rng(1);
    Pair grad(dtype, {m, n}), step(DType::I64, {}),
        ws(DType::F32, {galore::workspaceElements(n, m, rank)});
    Pair projector(DType::F32, {n, rank}), status(DType::F32, {1});
    grad.random(rng, 0.01);
    step.upload();
    status.fill(0.0f);
    galore::RefreshParams p;
    p.rank = rank;
    p.updateProjGap = 200;
    p.left = false;
    auto time = [&](int64_t done) {
      std::memcpy(step.host.data(), &done, 8);
      step.upload();
      sync();
      auto start = std::chrono::steady_clock::now();
      cuda::galoreRefresh(ctx, grad.deviceView(), step.deviceView(), p, ws.deviceView(),
                          projector.deviceView(), status.deviceView());
      sync();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
          .count();
    };
    time(0); // warm up
    double due = time(0), idle = time(1);
    EXPECT_EQ(status.deviceValues(), std::vector<float>{0.0f});
    // Rank 100: only the first 100 columns of G (rows of A = Gᵀ) are nonzero, so 412 columns
    // of each sketch are completed.
    std::vector<float> g = grad.hostValues();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 100; k < n; ++k)
        g[size_t(i * n + k)] = 0.0f;
    storeF32(g.data(), grad.hostView());
    grad.upload();
    double deficient = time(0);
    EXPECT_EQ(status.deviceValues(), std::vector<float>{0.0f});
    std::printf("galore_refresh 5632x2048 %s rank 512 (1 power iteration): due %.2f ms, due at "
                "gradient rank 100 %.2f ms, not due %.3f ms\n",
                dtypeName(dtype), due, deficient, idle);
  }
}

} // namespace

#endif // BONSAI_HAVE_CUDA
