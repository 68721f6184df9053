//===- CudaLoraTest.cpp - The CUDA dora_scale kernel against the CPU -------===//
//
// cuda::doraScale against cpu::doraScale (runtime/cpu/Lora.cpp) on fresh random data for each
// float dtype and ragged shapes (odd sizes, rank 1 to 64, a 4096 x 4096 weight): every output
// element within a tolerance of the dtype (the kernels sum in a different order, then round the
// norm to the dtype, so bf16 results may differ by one bf16 ulp of the norm); two runs agree bit
// for bit; a row of norm 0 lands in the DeviceError record as kZeroNorm. cuda::doraGrad against
// cpu::doraGrad: dx bit for bit, dm within the sums' order; vector and scalar paths, dx in place
// of dy; a zero magnitude lands as kZeroMagnitude. Built only with the
// CUDA backend; every test skips without a GPU.
//
//===----------------------------------------------------------------------===//

#ifdef BONSAI_HAVE_CUDA

#include "CudaTestUtil.h"
#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/CudaKernels.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace bonsai::rt;
namespace cpu = bonsai::rt::cpu;
namespace cuda = bonsai::rt::cuda;
using bonsai::test::haveGpu;

namespace {

void cudaOk(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

/// A host tensor of random values in [lo, hi), as stored in `dtype`.
struct Host {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  Host(DType dtype, std::vector<int64_t> shape) : dtype(dtype), shape(std::move(shape)) {
    int64_t n = 1;
    for (int64_t d : this->shape)
      n *= d;
    bytes.assign(size_t(n) * dtypeSize(dtype), 0xFF); // NaN in every float dtype
  }
  TensorView view() { return TensorView{bytes.data(), dtype, shape}; }
  std::vector<float> values() {
    std::vector<float> out(size_t(view().numel()));
    loadF32(view(), out.data());
    return out;
  }
};

Host randomHost(std::mt19937 &rng, DType dtype, std::vector<int64_t> shape, float lo, float hi) {
  Host h(dtype, std::move(shape));
  std::vector<float> v(size_t(h.view().numel()));
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float &x : v)
    x = dist(rng);
  storeF32(v.data(), h.view());
  return h;
}

/// A device copy of a host tensor.
struct Dev {
  Host &host;
  void *data = nullptr;
  explicit Dev(Host &host) : host(host) {
    cudaOk(cudaMalloc(&data, host.bytes.size()), "cudaMalloc");
    cudaOk(cudaMemcpy(data, host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice),
           "cudaMemcpy");
  }
  ~Dev() { cudaFree(data); }
  TensorView view() const { return TensorView{data, host.dtype, host.shape}; }
  Host download() const {
    Host out(host.dtype, host.shape);
    cudaOk(cudaMemcpy(out.bytes.data(), data, out.bytes.size(), cudaMemcpyDeviceToHost),
           "cudaMemcpy");
    return out;
  }
};

class CudaLoraTest : public ::testing::Test {
protected:
  void SetUp() override {
    if (!haveGpu())
      GTEST_SKIP() << "no GPU here";
    cudaOk(cudaStreamCreate(&stream), "cudaStreamCreate");
    cudaOk(cudaMalloc(reinterpret_cast<void **>(&error), sizeof(cuda::DeviceError)), "cudaMalloc");
    cudaOk(cudaMemset(error, 0, sizeof(cuda::DeviceError)), "cudaMemset");
    ctx.stream = stream;
    ctx.deviceError = error;
    ctx.kernelIndex = 3;
  }
  void TearDown() override {
    if (!stream)
      return;
    cudaFree(error);
    cudaStreamDestroy(stream);
  }
  cuda::DeviceError deviceError() {
    cudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cuda::DeviceError e{};
    cudaOk(cudaMemcpy(&e, error, sizeof e, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return e;
  }

  cudaStream_t stream = nullptr;
  cuda::DeviceError *error = nullptr;
  cuda::Context ctx;
  std::mt19937 rng{20261129};
};

TEST_F(CudaLoraTest, DoraScaleMatchesCpu) {
  struct Case {
    int64_t out, in, rank;
  };
  // 16-bit types take the tensor-core kernel when `in` is a multiple of 8 and the rank at
  // most 128: partial chunks of columns (176, 1000), rows past a block (37, 300, 70), ranks
  // that are not multiples of 16 (5, 8, 40) and the largest (128); the rest, and f32, the
  // CUDA-core kernel.
  const Case cases[] = {{1, 1, 1},       {37, 53, 5},      {64, 176, 8},
                        {300, 1001, 64}, {4096, 4096, 16}, {300, 1000, 40},
                        {70, 256, 128},  {37, 136, 5},     {33, 64, 130}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const Case &c : cases) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " out " + std::to_string(c.out) + " in " +
                   std::to_string(c.in) + " rank " + std::to_string(c.rank));
      Host m = randomHost(rng, dt, {c.out}, 0.5f, 2.0f);
      Host w = randomHost(rng, dt, {c.out, c.in}, -0.1f, 0.1f);
      Host a = randomHost(rng, dt, {c.rank, c.in}, -0.1f, 0.1f);
      Host b = randomHost(rng, dt, {c.out, c.rank}, -0.1f, 0.1f);
      Host want(dt, {c.out}), y(dt, {c.out});
      cpu::doraScale(m.view(), w.view(), a.view(), b.view(), 2.0, want.view());
      Dev dm(m), dw(w), da(a), db(b), dy(y);
      cuda::doraScale(ctx, dm.view(), dw.view(), da.view(), db.view(), 2.0, dy.view());
      Host got = dy.download();
      std::vector<float> g = got.values(), r = want.values();
      // The norm is rounded to the dtype: one ulp of it (2^-8 relative in bf16, 2^-11 in f16).
      double tol = dt == DType::F32 ? 2e-6 : dt == DType::F16 ? 2e-3 : 1.6e-2;
      for (size_t o = 0; o < g.size(); ++o)
        ASSERT_NEAR(g[o], r[o], tol * std::fabs(r[o])) << "row " << o;
      // Run to run, the same bits.
      Dev dy2(y);
      cuda::doraScale(ctx, dm.view(), dw.view(), da.view(), db.view(), 2.0, dy2.view());
      Host again = dy2.download();
      EXPECT_EQ(std::memcmp(again.bytes.data(), got.bytes.data(), got.bytes.size()), 0);
    }
  EXPECT_EQ(deviceError().code, 0);
}

TEST_F(CudaLoraTest, ZeroRowIsADeviceError) {
  Host m = randomHost(rng, DType::F32, {4}, 1, 2);
  Host w = randomHost(rng, DType::F32, {4, 8}, -1, 1);
  Host a = randomHost(rng, DType::F32, {2, 8}, -1, 1);
  Host b = randomHost(rng, DType::F32, {4, 2}, -1, 1);
  std::vector<float> wv = w.values(), bv = b.values();
  std::fill(wv.begin() + 16, wv.begin() + 24, 0.0f); // row 2 of w
  std::fill(bv.begin() + 4, bv.begin() + 6, 0.0f);   // and of b
  storeF32(wv.data(), w.view());
  storeF32(bv.data(), b.view());
  Host y(DType::F32, {4});
  Dev dm(m), dw(w), da(a), db(b), dy(y);
  cuda::doraScale(ctx, dm.view(), dw.view(), da.view(), db.view(), 1.0, dy.view());
  cuda::DeviceError e = deviceError();
  EXPECT_EQ(e.code, cuda::kZeroNorm);
  EXPECT_EQ(e.kernel, 3);
  EXPECT_EQ(e.index, 2);
}

TEST_F(CudaLoraTest, DoraGradMatchesCpu) {
  // Rows x columns: one element; odd columns (the scalar path); the vector path with a partial
  // tile; TinyLlama's k/v and q/o/down shapes of a 8192-token step.
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1}, {3, 29, 37}, {2, 700, 264}, {8192, 256}, {4, 2048, 2048}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (const std::vector<int64_t> &shape : shapes) {
      int64_t cols = shape.back();
      SCOPED_TRACE(std::string(dtypeName(dt)) + " dy " + std::to_string(shape.size()) + "-D, " +
                   std::to_string(cols) + " columns");
      Host dy = randomHost(rng, dt, shape, -1.0f, 1.0f);
      Host y = randomHost(rng, dt, shape, -2.0f, 2.0f);
      Host scale = randomHost(rng, dt, {cols}, 0.5f, 2.0f);
      Host m = randomHost(rng, dt, {cols}, 0.5f, 2.0f);
      Host wantDx(dt, shape), wantDm(dt, {cols}), dx(dt, shape), dmag(dt, {cols});
      cpu::doraGrad(dy.view(), y.view(), scale.view(), m.view(), wantDx.view(), wantDm.view());
      Dev ddy(dy), dyy(y), dscale(scale), dmm(m), ddx(dx), ddm(dmag);
      cuda::doraGrad(ctx, ddy.view(), dyy.view(), dscale.view(), dmm.view(), ddx.view(),
                     ddm.view());
      Host gotDx = ddx.download(), gotDm = ddm.download();
      EXPECT_EQ(std::memcmp(gotDx.bytes.data(), wantDx.bytes.data(), gotDx.bytes.size()), 0);
      // fp32 partial sums against the CPU's fp64: the terms' magnitudes bound the difference.
      std::vector<float> g = gotDm.values(), r = wantDm.values(), dys = dy.values(),
                         ys = y.values(), ms = m.values();
      int64_t rows = dy.view().numel() / cols;
      double ulp = dt == DType::F32 ? 0.0 : dt == DType::F16 ? 1e-3 : 8e-3;
      for (int64_t c = 0; c < cols; ++c) {
        double magnitude = 0;
        for (int64_t t = 0; t < rows; ++t)
          magnitude += std::fabs(double(dys[size_t(t * cols + c)]) * ys[size_t(t * cols + c)]);
        magnitude /= std::fabs(ms[size_t(c)]);
        ASSERT_NEAR(g[size_t(c)], r[size_t(c)], 1e-5 * magnitude + ulp * std::fabs(r[size_t(c)]))
            << "column " << c;
      }
      // Run to run, the same bits; and dx written over dy gives the same dx.
      Dev ddx2(dx), ddm2(dmag);
      cuda::doraGrad(ctx, ddy.view(), dyy.view(), dscale.view(), dmm.view(), ddx2.view(),
                     ddm2.view());
      Host againDm = ddm2.download();
      EXPECT_EQ(std::memcmp(againDm.bytes.data(), gotDm.bytes.data(), gotDm.bytes.size()), 0);
      cuda::doraGrad(ctx, ddy.view(), dyy.view(), dscale.view(), dmm.view(), ddy.view(),
                     ddm2.view());
      Host inPlace = ddy.download();
      EXPECT_EQ(std::memcmp(inPlace.bytes.data(), wantDx.bytes.data(), inPlace.bytes.size()), 0);
    }
  EXPECT_EQ(deviceError().code, 0);
}

TEST_F(CudaLoraTest, ZeroMagnitudeIsADeviceError) {
  Host dy = randomHost(rng, DType::BF16, {16, 64}, -1, 1);
  Host y = randomHost(rng, DType::BF16, {16, 64}, -1, 1);
  Host scale = randomHost(rng, DType::BF16, {64}, 1, 2);
  Host m = randomHost(rng, DType::BF16, {64}, 1, 2);
  std::vector<float> mv = m.values();
  mv[41] = 0.0f;
  storeF32(mv.data(), m.view());
  Host dx(DType::BF16, {16, 64}), dmag(DType::BF16, {64});
  Dev ddy(dy), dyy(y), dscale(scale), dmm(m), ddx(dx), ddm(dmag);
  cuda::doraGrad(ctx, ddy.view(), dyy.view(), dscale.view(), dmm.view(), ddx.view(), ddm.view());
  cuda::DeviceError e = deviceError();
  EXPECT_EQ(e.code, cuda::kZeroMagnitude);
  EXPECT_EQ(e.kernel, 3);
  EXPECT_EQ(e.index, 41);
}

} // namespace

#endif // BONSAI_HAVE_CUDA
