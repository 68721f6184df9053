//===- CudaKernelsTest.cpp - The CUDA kernels against the CPU reference ----===//
//
// Every kernel of CudaKernels.h (but attention and attention_grad, tested with their own file)
// against the CPU kernel of the same name on the same data: fresh random inputs from fixed
// seeds (never zeros), device outputs poisoned with NaN bytes before each call so that an
// element left unwritten fails, every output element compared with a tolerance that fits the
// output dtype (relative 1e-5 for f32, 2e-3 for f16, 1e-2 for bf16, plus the same fraction of
// the output's largest magnitude as an absolute floor for results that cancel). Shapes are
// ragged (odd sizes, unaligned row starts, vocabularies of 32000 and 50257); the reductions are
// run twice and must agree bit for bit; data-dependent errors must land in the DeviceError
// record. f32 GEMMs are held to the f32 tolerance, which TF32 would fail.
//
// The Perf tests measure one elementwise kernel's bandwidth and an 8192^3 bf16 GEMM's
// throughput, and time the norm gradients, a bias-gradient reduce_to and the GPT-2 lm_head GEMMs
// at training shapes (printed, not asserted). Built only with the CUDA backend; every test skips
// without a GPU.
//
//===----------------------------------------------------------------------===//

#ifdef BONSAI_HAVE_CUDA

#include "bonsai/runtime/CudaKernels.h"
#include "CudaTestUtil.h"
#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Fusion.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace bonsai::rt;
namespace cpu = bonsai::rt::cpu;
namespace cuda = bonsai::rt::cuda;
using bonsai::test::haveGpu;
using bonsai::test::numelOf;

namespace {

using Shape = std::vector<int64_t>;

void cudaOk(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

/// A host tensor: storage, dtype and shape, with exact encode and decode.
struct Host {
  Host(DType dtype, Shape shape)
      : dtype(dtype), shape(std::move(shape)),
        bytes(size_t(numelOf(this->shape)) * dtypeSize(dtype)) {}

  TensorView view() const { return TensorView{const_cast<uint8_t *>(bytes.data()), dtype, shape}; }
  int64_t numel() const { return numelOf(shape); }

  void set(const std::vector<double> &values) {
    for (size_t i = 0; i < values.size(); ++i) {
      uint8_t *p = &bytes[i * dtypeSize(dtype)];
      switch (dtype) {
      case DType::F32: {
        float f = float(values[i]);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::F16: {
        uint16_t h = f32ToF16(float(values[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::BF16: {
        uint16_t h = f32ToBf16(float(values[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::I32: {
        int32_t v = int32_t(values[i]);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::I64: {
        int64_t v = int64_t(values[i]);
        std::memcpy(p, &v, 8);
        break;
      }
      default:
        throw std::runtime_error("Host::set: unsupported dtype");
      }
    }
  }

  std::vector<double> get() const {
    std::vector<double> values(static_cast<size_t>(numel()));
    for (size_t i = 0; i < values.size(); ++i) {
      const uint8_t *p = &bytes[i * dtypeSize(dtype)];
      switch (dtype) {
      case DType::F32: {
        float f;
        std::memcpy(&f, p, 4);
        values[i] = f;
        break;
      }
      case DType::F16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        values[i] = f16ToF32(h);
        break;
      }
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        values[i] = bf16ToF32(h);
        break;
      }
      case DType::I32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        values[i] = v;
        break;
      }
      case DType::I64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        values[i] = double(v);
        break;
      }
      default:
        throw std::runtime_error("Host::get: unsupported dtype");
      }
    }
    return values;
  }

  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

/// Uniform values in [lo, hi), none near zero, rounded to the dtype.
Host randomHost(std::mt19937 &rng, DType dtype, Shape shape, double lo = -1.0, double hi = 1.0) {
  Host h(dtype, std::move(shape));
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> values(size_t(h.numel()));
  for (double &v : values) {
    do
      v = dist(rng);
    while (std::fabs(v) < 1e-3 * (hi - lo));
  }
  h.set(values);
  return h;
}

/// Integers uniform in [lo, hi).
Host randomInts(std::mt19937 &rng, DType dtype, Shape shape, int64_t lo, int64_t hi) {
  Host h(dtype, std::move(shape));
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<double> values(size_t(h.numel()));
  for (double &v : values)
    v = double(dist(rng));
  h.set(values);
  return h;
}

/// A NaN-filled host tensor (the CPU kernel's output before it runs).
Host poisonedHost(DType dtype, Shape shape) {
  Host h(dtype, std::move(shape));
  std::fill(h.bytes.begin(), h.bytes.end(), uint8_t(0xff));
  return h;
}

/// A device tensor, optionally `offset` bytes past a 256-byte boundary (unaligned paths).
class Dev {
public:
  Dev(DType dtype, Shape shape, size_t offset = 0)
      : dtype_(dtype), shape_(std::move(shape)), offset_(offset) {
    size_t bytes = size_t(numelOf(shape_)) * dtypeSize(dtype_) + offset_;
    cudaOk(cudaMalloc(&base_, std::max<size_t>(bytes, 1)), "cudaMalloc");
  }
  explicit Dev(const Host &h, size_t offset = 0) : Dev(h.dtype, h.shape, offset) { upload(h); }
  ~Dev() {
    if (base_)
      cudaFree(base_);
  }
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
  Dev(Dev &&o) noexcept
      : dtype_(o.dtype_), shape_(std::move(o.shape_)), offset_(o.offset_), base_(o.base_) {
    o.base_ = nullptr;
  }

  void *data() const { return static_cast<char *>(base_) + offset_; }
  size_t bytes() const { return size_t(numelOf(shape_)) * dtypeSize(dtype_); }
  TensorView view() const { return TensorView{data(), dtype_, shape_}; }

  void upload(const Host &h) {
    cudaOk(cudaMemcpy(data(), h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice),
           "cudaMemcpy(upload)");
  }
  Host download() const {
    cudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    Host h(dtype_, shape_);
    cudaOk(cudaMemcpy(h.bytes.data(), data(), h.bytes.size(), cudaMemcpyDeviceToHost),
           "cudaMemcpy(download)");
    return h;
  }
  /// All bytes 0xff: NaN in f32, f16 and bf16.
  void poison() { cudaOk(cudaMemset(data(), 0xff, bytes()), "cudaMemset(poison)"); }

private:
  DType dtype_;
  Shape shape_;
  size_t offset_;
  void *base_ = nullptr;
};

/// A poisoned device output.
Dev poisonedDev(DType dtype, Shape shape, size_t offset = 0) {
  Dev d(dtype, std::move(shape), offset);
  d.poison();
  return d;
}

double relTol(DType dtype) {
  switch (dtype) {
  case DType::F16:
    return 2e-3;
  case DType::BF16:
    return 1e-2;
  default:
    return 1e-5;
  }
}

/// Every element of `got` within rel * |want| + rel * scale * max|want| of `want`; NaN only
/// where want is NaN.
void expectClose(const std::string &what, const Host &got, const Host &want, double rel,
                 double scale = 1.0) {
  ASSERT_EQ(got.shape, want.shape) << what;
  std::vector<double> g = got.get(), w = want.get();
  double maxAbs = 0.0;
  for (double v : w)
    if (std::isfinite(v))
      maxAbs = std::max(maxAbs, std::fabs(v));
  double abs = rel * scale * std::max(maxAbs, 1e-30);
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < g.size(); ++i) {
    bool ok;
    if (std::isnan(w[i]))
      ok = std::isnan(g[i]);
    else if (std::isinf(w[i]))
      ok = g[i] == w[i];
    else
      ok = !std::isnan(g[i]) && std::fabs(g[i] - w[i]) <= abs + rel * std::fabs(w[i]);
    if (!ok && bad++ < 5)
      first += "\n  [" + std::to_string(i) + "] got " + std::to_string(g[i]) + " want " +
               std::to_string(w[i]);
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size()
                    << " elements differ (rel " << rel << ", abs " << abs << ")" << first;
}

void expectClose(const std::string &what, const Host &got, const Host &want) {
  expectClose(what, got, want, relTol(want.dtype));
}

void expectSameBytes(const std::string &what, const Host &a, const Host &b) {
  ASSERT_EQ(a.bytes.size(), b.bytes.size()) << what;
  size_t diff = 0;
  for (size_t i = 0; i < a.bytes.size(); ++i)
    diff += a.bytes[i] != b.bytes[i];
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " bytes differ";
}

const char *name(DType d) { return dtypeName(d); }

class CudaKernelsTest : public ::testing::Test {
protected:
  void SetUp() override {
    if (!haveGpu())
      GTEST_SKIP() << "no GPU here";
    cudaOk(cudaStreamCreate(&stream_), "cudaStreamCreate");
    engine_ = std::make_unique<cuda::GemmEngine>();
    cudaOk(cudaMalloc(reinterpret_cast<void **>(&error_), sizeof(cuda::DeviceError)),
           "cudaMalloc(error)");
    cudaOk(cudaMemset(error_, 0, sizeof(cuda::DeviceError)), "cudaMemset(error)");
    ctx.stream = stream_;
    ctx.gemm = engine_.get();
    ctx.deviceError = error_;
    ctx.kernelIndex = 7;
  }

  void TearDown() override {
    if (!stream_)
      return;
    cuda::DeviceError e = deviceError();
    EXPECT_EQ(e.code, 0) << "unexpected device error at index " << e.index << " value "
                         << e.value;
    engine_.reset();
    cudaFree(error_);
    cudaStreamDestroy(stream_);
  }

  cuda::DeviceError deviceError() {
    cudaOk(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    cuda::DeviceError e{};
    cudaOk(cudaMemcpy(&e, error_, sizeof e, cudaMemcpyDeviceToHost), "cudaMemcpy(error)");
    return e;
  }
  void clearDeviceError() {
    cudaOk(cudaMemset(error_, 0, sizeof(cuda::DeviceError)), "cudaMemset(error)");
  }
  void sync() { cudaOk(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  cuda::Context ctx;
  std::mt19937 rng{20240917};

private:
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::GemmEngine> engine_;
  cuda::DeviceError *error_ = nullptr;
};

const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

TEST_F(CudaKernelsTest, AddMulBroadcastMatchCpu) {
  struct Case {
    Shape lhs, rhs;
  };
  const Case cases[] = {{{37, 129}, {37, 129}},
                        {{4, 33, 64}, {64}},
                        {{4, 33, 64}, {1}},
                        {{6, 5, 7}, {5, 1}},
                        {{3, 1, 8, 16}, {1, 8, 1}},
                        {{1000003}, {1000003}},
                        {{2, 9, 5, 3}, {9, 1, 3}},
                        {{5, 128}, {1, 128}},
                        // One value per row, as DoRA scales a weight: rows of whole vectors
                        // and rows that are not.
                        {{64, 256}, {64, 1}},
                        {{37, 24}, {37, 1}},
                        {{9, 7}, {9, 1}},
                        {{2, 3, 40}, {2, 3, 1}}};
  for (DType dt : kFloatTypes)
    for (const Case &c : cases)
      for (size_t offset : {size_t(0), dtypeSize(dt)}) {
        for (int op = 0; op < 2; ++op) {
          SCOPED_TRACE(std::string(op ? "mul " : "add ") + name(dt) + " " + formatShape(c.lhs) +
                       " x " + formatShape(c.rhs) + " offset " + std::to_string(offset));
          Host a = randomHost(rng, dt, c.lhs), b = randomHost(rng, dt, c.rhs);
          Dev da(a, offset), db(b), dout = poisonedDev(dt, c.lhs);
          Host want = poisonedHost(dt, c.lhs);
          if (op) {
            cuda::mul(ctx, da.view(), db.view(), dout.view());
            cpu::mul(a.view(), b.view(), want.view());
          } else {
            cuda::add(ctx, da.view(), db.view(), dout.view());
            cpu::add(a.view(), b.view(), want.view());
          }
          expectClose("out", dout.download(), want);
        }
      }
}

TEST_F(CudaKernelsTest, AddInPlaceAndMixedDTypes) {
  Host a = randomHost(rng, DType::BF16, {17, 96}), b = randomHost(rng, DType::BF16, {96});
  Host want = poisonedHost(DType::BF16, {17, 96});
  cpu::add(a.view(), b.view(), want.view());
  Dev da(a), db(b);
  cuda::add(ctx, da.view(), db.view(), da.view()); // out = lhs
  expectClose("in place", da.download(), want);

  // bf16 lhs, f32 rhs, f16 out: computed in fp32, rounded once.
  Host l = randomHost(rng, DType::BF16, {5, 33}), r = randomHost(rng, DType::F32, {33});
  Host w2 = poisonedHost(DType::F16, {5, 33});
  cpu::add(l.view(), r.view(), w2.view());
  Dev dl(l), dr(r), dout = poisonedDev(DType::F16, {5, 33});
  cuda::add(ctx, dl.view(), dr.view(), dout.view());
  expectClose("mixed", dout.download(), w2);
}

TEST_F(CudaKernelsTest, ActivationsAndTheirGradientsMatchCpu) {
  const Shape shapes[] = {{1000003}, {3, 17}, {64, 256}};
  for (DType dt : kFloatTypes)
    for (const Shape &s : shapes)
      for (size_t offset : {size_t(0), dtypeSize(dt)}) {
        SCOPED_TRACE(std::string(name(dt)) + " " + formatShape(s) + " offset " +
                     std::to_string(offset));
        Host x = randomHost(rng, dt, s, -4, 4), up = randomHost(rng, dt, s, -2, 2);
        Host dy = randomHost(rng, dt, s);
        Dev dx(x, offset), dup(up), ddy(dy);
        auto check = [&](const char *what, auto gpu, auto ref) {
          Dev out = poisonedDev(dt, s);
          Host want = poisonedHost(dt, s);
          gpu(out.view());
          ref(want.view());
          expectClose(what, out.download(), want);
        };
        check("silu", [&](TensorView o) { cuda::silu(ctx, dx.view(), o); },
              [&](TensorView o) { cpu::silu(x.view(), o); });
        for (bool tanh : {false, true})
          check(tanh ? "gelu tanh" : "gelu erf",
                [&](TensorView o) { cuda::gelu(ctx, dx.view(), tanh, o); },
                [&](TensorView o) { cpu::gelu(x.view(), tanh, o); });
        check("swiglu", [&](TensorView o) { cuda::swiglu(ctx, dx.view(), dup.view(), o); },
              [&](TensorView o) { cpu::swiglu(x.view(), up.view(), o); });
        check("silu_grad", [&](TensorView o) { cuda::siluGrad(ctx, ddy.view(), dx.view(), o); },
              [&](TensorView o) { cpu::siluGrad(dy.view(), x.view(), o); });
        for (bool tanh : {false, true})
          check(tanh ? "gelu_grad tanh" : "gelu_grad erf",
                [&](TensorView o) { cuda::geluGrad(ctx, ddy.view(), dx.view(), tanh, o); },
                [&](TensorView o) { cpu::geluGrad(dy.view(), x.view(), tanh, o); });
        Dev dg = poisonedDev(dt, s), du = poisonedDev(dt, s);
        Host wg = poisonedHost(dt, s), wu = poisonedHost(dt, s);
        cuda::swigluGrad(ctx, ddy.view(), dx.view(), dup.view(), dg.view(), du.view());
        cpu::swigluGrad(dy.view(), x.view(), up.view(), wg.view(), wu.view());
        expectClose("swiglu_grad dgate", dg.download(), wg);
        expectClose("swiglu_grad dup", du.download(), wu);
      }
}

TEST_F(CudaKernelsTest, FillCastAccumulateCopyZero) {
  const Shape s = {7, 1001};
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(name(dt));
    for (double value : {0.0, -1.7, 3.14159}) {
      Dev out = poisonedDev(dt, s);
      Host want = poisonedHost(dt, s);
      cuda::fill(ctx, value, out.view());
      cpu::fill(value, want.view());
      expectSameBytes("fill", out.download(), want);
    }
    for (DType to : kFloatTypes) {
      for (size_t offset : {size_t(0), size_t(4)}) {
        Host x = randomHost(rng, dt, s, -70000, 70000); // overflows f16 on purpose
        Dev dx(x, offset), out = poisonedDev(to, s);
        Host want = poisonedHost(to, s);
        cuda::cast(ctx, dx.view(), out.view());
        cpu::cast(x.view(), want.view());
        expectSameBytes(std::string("cast to ") + name(to), out.download(), want);
      }
      Host g = randomHost(rng, dt, s), acc = randomHost(rng, to, s);
      Dev dg(g), dacc(acc);
      cuda::accumulate(ctx, dg.view(), dacc.view());
      cpu::accumulate(g.view(), acc.view());
      expectClose(std::string("accumulate into ") + name(to), dacc.download(), acc);
    }
    Host x = randomHost(rng, dt, s);
    Dev dx(x), out = poisonedDev(dt, s);
    cuda::copy(ctx, dx.view(), out.view());
    expectSameBytes("copy", out.download(), x);
    cuda::zero(ctx, out.view());
    Host zeros(dt, s);
    expectSameBytes("zero", out.download(), zeros);
  }
}

//===----------------------------------------------------------------------===//
// Norms and softmax
//===----------------------------------------------------------------------===//

TEST_F(CudaKernelsTest, RmsAndLayerNormMatchCpu) {
  const Shape shapes[] = {{64, 4096}, {33, 100}, {5, 5001}, {2, 3, 768}, {7, 1}};
  for (DType dt : kFloatTypes)
    for (DType wt : {dt, DType::F32})
      for (const Shape &s : shapes) {
        SCOPED_TRACE(std::string(name(dt)) + " weight " + name(wt) + " " + formatShape(s));
        int64_t d = s.back();
        Host x = randomHost(rng, dt, s, -2, 3), w = randomHost(rng, wt, {d}, 0.5, 1.5);
        Host b = randomHost(rng, wt, {d});
        Dev dx(x, dtypeSize(dt)), dw(w), db(b);
        Dev y1 = poisonedDev(dt, s), y2 = poisonedDev(dt, s);
        Host w1 = poisonedHost(dt, s), w2 = poisonedHost(dt, s);
        cuda::rmsNorm(ctx, dx.view(), dw.view(), 1e-5, y1.view());
        cpu::rmsNorm(x.view(), w.view(), 1e-5, w1.view());
        cuda::layerNorm(ctx, dx.view(), dw.view(), db.view(), 1e-5, y2.view());
        cpu::layerNorm(x.view(), w.view(), b.view(), 1e-5, w2.view());
        expectClose("rms_norm", y1.download(), w1);
        expectClose("layer_norm", y2.download(), w2);
      }
}

TEST_F(CudaKernelsTest, NormGradientsMatchCpuAndRepeat) {
  // Row groups of one warp with two vectors a thread (64) and with three (768 bf16: 96
  // vectors; 90 unaligned), of several warps (768 f32, 100 unaligned), one row group per block
  // (4096 bf16), the wide kernel (4096 f32, 5001 unaligned), partial last blocks (2050 rows), and
  // the training shape.
  const Shape shapes[] = {{256, 4096}, {33, 100}, {5, 5001},   {3, 7, 768},
                          {1000, 64},  {7, 90},   {2050, 768}, {16, 1024, 768}};
  for (DType dt : {DType::F32, DType::BF16})
    for (DType wt : {dt, DType::F32})
      for (const Shape &s : shapes) {
        SCOPED_TRACE(std::string(name(dt)) + " weight " + name(wt) + " " + formatShape(s));
        int64_t d = s.back();
        Host x = randomHost(rng, dt, s, -2, 3), dy = randomHost(rng, dt, s);
        Host w = randomHost(rng, wt, {d}, 0.5, 1.5);
        Dev dx(x), ddy(dy), dw(w);
        // rms_norm_grad
        {
          Dev gx = poisonedDev(dt, s), gw = poisonedDev(wt, {d}), gw2 = poisonedDev(wt, {d});
          Host wx = poisonedHost(dt, s), ww = poisonedHost(wt, {d});
          cuda::rmsNormGrad(ctx, ddy.view(), dx.view(), dw.view(), 1e-5, gx.view(), gw.view());
          cpu::rmsNormGrad(dy.view(), x.view(), w.view(), 1e-5, wx.view(), ww.view());
          expectClose("rms dx", gx.download(), wx);
          // dw sums over every row: fp32 sums of many rows against fp64 ones.
          expectClose("rms dw", gw.download(), ww, relTol(wt), 10.0);
          Dev gx2 = poisonedDev(dt, s);
          cuda::rmsNormGrad(ctx, ddy.view(), dx.view(), dw.view(), 1e-5, gx2.view(), gw2.view());
          expectSameBytes("rms dw repeat", gw2.download(), gw.download());
        }
        // layer_norm_grad
        {
          Dev gx = poisonedDev(dt, s), gw = poisonedDev(wt, {d}), gb = poisonedDev(wt, {d});
          Host wx = poisonedHost(dt, s), ww = poisonedHost(wt, {d}), wb = poisonedHost(wt, {d});
          cuda::layerNormGrad(ctx, ddy.view(), dx.view(), dw.view(), 1e-5, gx.view(), gw.view(),
                              gb.view());
          cpu::layerNormGrad(dy.view(), x.view(), w.view(), 1e-5, wx.view(), ww.view(),
                             wb.view());
          expectClose("layer dx", gx.download(), wx, relTol(dt), 10.0);
          expectClose("layer dw", gw.download(), ww, relTol(wt), 10.0);
          expectClose("layer db", gb.download(), wb, relTol(wt), 10.0);
          Dev gx2 = poisonedDev(dt, s), gw2 = poisonedDev(wt, {d}), gb2 = poisonedDev(wt, {d});
          cuda::layerNormGrad(ctx, ddy.view(), dx.view(), dw.view(), 1e-5, gx2.view(),
                              gw2.view(), gb2.view());
          expectSameBytes("layer dx repeat", gx2.download(), gx.download());
          expectSameBytes("layer dw repeat", gw2.download(), gw.download());
          expectSameBytes("layer db repeat", gb2.download(), gb.download());
        }
      }
}

TEST_F(CudaKernelsTest, SoftmaxAndGradientMatchCpu) {
  struct Case {
    Shape shape;
    int axis;
  };
  const Case cases[] = {{{17, 1000}, -1}, {{8, 50257}, 1}, {{3, 50, 7}, 1},
                        {{4, 5, 6}, 0},   {{64, 128}, -1}, {{2, 3, 4, 33}, 3}};
  for (DType dt : kFloatTypes)
    for (const Case &c : cases) {
      SCOPED_TRACE(std::string(name(dt)) + " " + formatShape(c.shape) + " axis " +
                   std::to_string(c.axis));
      Host x = randomHost(rng, dt, c.shape, -5, 5), dy = randomHost(rng, dt, c.shape);
      Dev dx(x, dtypeSize(dt)), ddy(dy), y = poisonedDev(dt, c.shape);
      Host wy = poisonedHost(dt, c.shape);
      cuda::softmax(ctx, dx.view(), c.axis, y.view());
      cpu::softmax(x.view(), c.axis, wy.view());
      expectClose("softmax", y.download(), wy);
      // The gradient from the CPU's y, so both sides see the same probabilities.
      Dev py(wy), g = poisonedDev(dt, c.shape);
      Host wg = poisonedHost(dt, c.shape);
      cuda::softmaxGrad(ctx, ddy.view(), py.view(), c.axis, g.view());
      cpu::softmaxGrad(dy.view(), wy.view(), c.axis, wg.view());
      expectClose("softmax_grad", g.download(), wg, relTol(dt), 10.0);
    }
}

//===----------------------------------------------------------------------===//
// Cross-entropy
//===----------------------------------------------------------------------===//

TEST_F(CudaKernelsTest, CrossEntropyMatchesCpuAndRepeats) {
  struct Case {
    int64_t rows, vocab;
  };
  const Case cases[] = {{64, 32000}, {33, 50257}, {100, 17}, {5, 1000}};
  for (DType dt : kFloatTypes)
    for (DType lt : {DType::I32, DType::I64})
      for (const Case &c : cases) {
        SCOPED_TRACE(std::string(name(dt)) + " labels " + name(lt) + " " +
                     std::to_string(c.rows) + " x " + std::to_string(c.vocab));
        Host logits = randomHost(rng, dt, {c.rows, c.vocab}, -6, 6);
        Host labels = randomInts(rng, lt, {c.rows}, 0, c.vocab);
        std::vector<double> lv = labels.get();
        for (size_t i = 0; i < lv.size(); i += 5)
          lv[i] = -100; // ignored
        labels.set(lv);
        Dev dlogits(logits, dtypeSize(dt)), dlabels(labels);
        Dev loss = poisonedDev(DType::F32, {}), loss2 = poisonedDev(DType::F32, {});
        Host wloss = poisonedHost(DType::F32, {});
        cuda::crossEntropy(ctx, dlogits.view(), dlabels.view(), -100, loss.view());
        cpu::crossEntropy(logits.view(), labels.view(), -100, wloss.view());
        expectClose("loss", loss.download(), wloss, 1e-5);
        cuda::crossEntropy(ctx, dlogits.view(), dlabels.view(), -100, loss2.view());
        expectSameBytes("loss repeat", loss2.download(), loss.download());

        Host dloss(DType::F32, {});
        dloss.set({1.75});
        Dev ddloss(dloss), g = poisonedDev(dt, {c.rows, c.vocab});
        Host wg = poisonedHost(dt, {c.rows, c.vocab});
        cuda::crossEntropyGrad(ctx, ddloss.view(), dlogits.view(), dlabels.view(), -100,
                               g.view());
        cpu::crossEntropyGrad(dloss.view(), logits.view(), labels.view(), -100, wg.view());
        expectClose("dlogits", g.download(), wg, relTol(dt), 1e-2);
      }
}

TEST_F(CudaKernelsTest, CrossEntropyAllIgnoredAndBadLabels) {
  Host logits = randomHost(rng, DType::BF16, {6, 301}, -3, 3);
  Host labels(DType::I64, {6});
  labels.set({-100, -100, -100, -100, -100, -100});
  Dev dlogits(logits), dlabels(labels), loss = poisonedDev(DType::F32, {});
  cuda::crossEntropy(ctx, dlogits.view(), dlabels.view(), -100, loss.view());
  EXPECT_TRUE(std::isnan(loss.download().get()[0]));
  Host dloss(DType::F32, {});
  dloss.set({1.0});
  Dev ddloss(dloss), g = poisonedDev(DType::BF16, {6, 301});
  cuda::crossEntropyGrad(ctx, ddloss.view(), dlogits.view(), dlabels.view(), -100, g.view());
  expectSameBytes("all ignored dlogits", g.download(), Host(DType::BF16, {6, 301}));

  labels.set({3, 5, 301, 7, -1, 2}); // 301 and -1 are out of range
  dlabels.upload(labels);
  cuda::crossEntropy(ctx, dlogits.view(), dlabels.view(), -100, loss.view());
  cuda::DeviceError e = deviceError();
  EXPECT_EQ(e.code, cuda::kLabelOutOfRange);
  EXPECT_EQ(e.kernel, 7);
  EXPECT_TRUE((e.index == 2 && e.value == 301) || (e.index == 4 && e.value == -1))
      << e.index << " " << e.value;
  clearDeviceError();
  cuda::crossEntropyGrad(ctx, ddloss.view(), dlogits.view(), dlabels.view(), -100, g.view());
  EXPECT_EQ(deviceError().code, cuda::kLabelOutOfRange);
  clearDeviceError();
}

//===----------------------------------------------------------------------===//
// Fused kernels (the LM head and residual norms, docs/fusion.md)
//===----------------------------------------------------------------------===//

TEST_F(CudaKernelsTest, LinearCrossEntropyMatchesCpuAndRepeats) {
  // One chunk, several with a ragged last one, GPT-2's vocabulary (not a multiple of 8), a
  // frozen weight (no dw), and bf16 (dw through the workspace's fp32 accumulator).
  struct Case {
    int64_t rows, vocab, hidden, chunk;
    bool weightGrad;
  };
  const Case cases[] = {{37, 1000, 64, 37, true},
                        {37, 1000, 64, 16, true},
                        {45, 50257, 96, 16, true},
                        {40, 32000, 128, 24, false}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case &c : cases) {
      SCOPED_TRACE(std::string(name(dt)) + " " + std::to_string(c.rows) + " x " +
                   std::to_string(c.vocab) + " x " + std::to_string(c.hidden) + " chunk " +
                   std::to_string(c.chunk) + (c.weightGrad ? "" : " frozen"));
      Host x = randomHost(rng, dt, {c.rows, c.hidden});
      Host w = randomHost(rng, dt, {c.vocab, c.hidden}, -0.2, 0.2);
      Host labels = randomInts(rng, DType::I64, {c.rows}, 0, c.vocab);
      std::vector<double> lv = labels.get();
      for (size_t i = 1; i < lv.size(); i += 6)
        lv[i] = -100;
      labels.set(lv);
      Host dloss(DType::F32, {});
      dloss.set({0.5});
      int64_t elements = linearCrossEntropyWorkspaceElements(
          c.rows, c.vocab, c.hidden, c.chunk, int64_t(dtypeSize(dt)), c.weightGrad);
      Host wloss = poisonedHost(DType::F32, {}), wdx = poisonedHost(dt, {c.rows, c.hidden});
      Host wdw = poisonedHost(dt, {c.vocab, c.hidden});
      Host wws(DType::F32, {elements});
      TensorView wdwv = wdw.view();
      cpu::linearCrossEntropy(x.view(), w.view(), labels.view(), dloss.view(), -100, c.chunk,
                              wloss.view(), wdx.view(), wws.view(),
                              c.weightGrad ? &wdwv : nullptr);
      Dev dx(x), dw(w), dlabels(labels), ddloss(dloss);
      Host first[3] = {Host(DType::F32, {}), Host(dt, {c.rows, c.hidden}),
                       Host(dt, {c.vocab, c.hidden})};
      for (int run = 0; run < 2; ++run) {
        Dev loss = poisonedDev(DType::F32, {}), gx = poisonedDev(dt, {c.rows, c.hidden});
        Dev gw = poisonedDev(dt, {c.vocab, c.hidden}), ws = poisonedDev(DType::F32, {elements});
        TensorView gwv = gw.view();
        cuda::linearCrossEntropy(ctx, dx.view(), dw.view(), dlabels.view(), ddloss.view(), -100,
                                 c.chunk, loss.view(), gx.view(), ws.view(),
                                 c.weightGrad ? &gwv : nullptr);
        Host got[3] = {loss.download(), gx.download(), gw.download()};
        if (run == 0) {
          expectClose("loss", got[0], wloss, dt == DType::F32 ? 1e-5 : 1e-3);
          expectClose("dx", got[1], wdx, relTol(dt), 1e-2);
          if (c.weightGrad)
            expectClose("dw", got[2], wdw, relTol(dt), 1e-2);
          for (int i = 0; i < 3; ++i)
            first[i] = got[i];
        } else {
          expectSameBytes("loss repeat", got[0], first[0]);
          expectSameBytes("dx repeat", got[1], first[1]);
          if (c.weightGrad)
            expectSameBytes("dw repeat", got[2], first[2]);
        }
      }
    }
}

TEST_F(CudaKernelsTest, LinearCrossEntropyAllIgnoredAndBadLabels) {
  Host x = randomHost(rng, DType::BF16, {6, 32}), w = randomHost(rng, DType::BF16, {301, 32});
  Host labels(DType::I32, {6});
  labels.set({-100, -100, -100, -100, -100, -100});
  Host dloss(DType::F32, {});
  dloss.set({1.0});
  int64_t elements = linearCrossEntropyWorkspaceElements(6, 301, 32, 4, 2, true);
  Dev dx(x), dw(w), dlabels(labels), ddloss(dloss), ws(DType::F32, {elements});
  Dev loss = poisonedDev(DType::F32, {}), gx = poisonedDev(DType::BF16, {6, 32});
  Dev gw = poisonedDev(DType::BF16, {301, 32});
  TensorView gwv = gw.view();
  cuda::linearCrossEntropy(ctx, dx.view(), dw.view(), dlabels.view(), ddloss.view(), -100, 4,
                           loss.view(), gx.view(), ws.view(), &gwv);
  EXPECT_TRUE(std::isnan(loss.download().get()[0]));
  expectSameBytes("all ignored dx", gx.download(), Host(DType::BF16, {6, 32}));
  expectSameBytes("all ignored dw", gw.download(), Host(DType::BF16, {301, 32}));

  labels.set({3, 5, 301, 7, -100, 2}); // 301 is out of range
  dlabels.upload(labels);
  cuda::linearCrossEntropy(ctx, dx.view(), dw.view(), dlabels.view(), ddloss.view(), -100, 4,
                           loss.view(), gx.view(), ws.view(), &gwv);
  cuda::DeviceError e = deviceError();
  EXPECT_EQ(e.code, cuda::kLabelOutOfRange);
  EXPECT_EQ(e.index, 2);
  EXPECT_EQ(e.value, 301);
  clearDeviceError();
}

TEST_F(CudaKernelsTest, ResidualNormsMatchCpuAndRepeat) {
  // Warp rows (768), block rows (4096), unaligned rows (100, 5001) and the wide gradient kernel.
  const Shape shapes[] = {{3, 7, 768}, {64, 4096}, {33, 100}, {5, 5001}, {2050, 768}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape &s : shapes) {
      SCOPED_TRACE(std::string(name(dt)) + " " + formatShape(s));
      int64_t d = s.back();
      Host a = randomHost(rng, dt, s, -2, 3), b = randomHost(rng, dt, s);
      Host w = randomHost(rng, dt, {d}, 0.5, 1.5), bias = randomHost(rng, dt, {d});
      Dev da(a, dtypeSize(dt)), db(b, dtypeSize(dt)), dw(w), dbias(bias);
      for (bool layer : {false, true}) {
        SCOPED_TRACE(layer ? "layer_norm" : "rms_norm");
        Dev sum = poisonedDev(dt, s, dtypeSize(dt)), y = poisonedDev(dt, s, dtypeSize(dt));
        Host wsum = poisonedHost(dt, s), wy = poisonedHost(dt, s);
        if (layer) {
          cuda::addLayerNorm(ctx, da.view(), db.view(), dw.view(), dbias.view(), 1e-5,
                             sum.view(), y.view());
          cpu::addLayerNorm(a.view(), b.view(), w.view(), bias.view(), 1e-5, wsum.view(),
                            wy.view());
        } else {
          cuda::addRmsNorm(ctx, da.view(), db.view(), dw.view(), 1e-5, sum.view(), y.view());
          cpu::addRmsNorm(a.view(), b.view(), w.view(), 1e-5, wsum.view(), wy.view());
        }
        // The sum is one rounding of an fp32 add on both: the same bits.
        expectSameBytes("sum", sum.download(), wsum);
        expectClose("y", y.download(), wy);

        Host dy = randomHost(rng, dt, s), addend = randomHost(rng, dt, s);
        Dev ddy(dy), dadd(addend);
        Host wdx = poisonedHost(dt, s), wdw = poisonedHost(dt, {d}), wdb = poisonedHost(dt, {d});
        Host first[3] = {Host(dt, s), Host(dt, {d}), Host(dt, {d})};
        for (int run = 0; run < 2; ++run) {
          Dev gx = poisonedDev(dt, s), gw = poisonedDev(dt, {d}), gb = poisonedDev(dt, {d});
          if (layer)
            cuda::layerNormGradAdd(ctx, ddy.view(), sum.view(), dw.view(), dadd.view(), 1e-5,
                                   gx.view(), gw.view(), gb.view());
          else
            cuda::rmsNormGradAdd(ctx, ddy.view(), sum.view(), dw.view(), dadd.view(), 1e-5,
                                 gx.view(), gw.view());
          Host got[3] = {gx.download(), gw.download(), gb.download()};
          if (run == 0) {
            Host s0 = sum.download();
            if (layer)
              cpu::layerNormGradAdd(dy.view(), s0.view(), w.view(), addend.view(), 1e-5,
                                    wdx.view(), wdw.view(), wdb.view());
            else
              cpu::rmsNormGradAdd(dy.view(), s0.view(), w.view(), addend.view(), 1e-5,
                                  wdx.view(), wdw.view());
            expectClose("dx", got[0], wdx, relTol(dt), 10.0);
            expectClose("dw", got[1], wdw, relTol(dt), 10.0);
            if (layer)
              expectClose("db", got[2], wdb, relTol(dt), 10.0);
            for (int i = 0; i < 3; ++i)
              first[i] = got[i];
          } else {
            expectSameBytes("dx repeat", got[0], first[0]);
            expectSameBytes("dw repeat", got[1], first[1]);
            if (layer)
              expectSameBytes("db repeat", got[2], first[2]);
          }
        }
      }
    }
}

//===----------------------------------------------------------------------===//
// Embedding
//===----------------------------------------------------------------------===//

TEST_F(CudaKernelsTest, EmbeddingMatchesCpu) {
  for (DType tt : kFloatTypes)
    for (DType ot : {tt, DType::F32, DType::BF16})
      for (DType it : {DType::I32, DType::I64})
        for (int64_t hidden : {int64_t(72), int64_t(33)}) {
          SCOPED_TRACE(std::string(name(tt)) + " -> " + name(ot) + " ids " + name(it) +
                       " hidden " + std::to_string(hidden));
          Host table = randomHost(rng, tt, {1000, hidden});
          Host ids = randomInts(rng, it, {4, 33}, 0, 1000);
          Dev dt(table), di(ids), out = poisonedDev(ot, {4, 33, hidden});
          Host want = poisonedHost(ot, {4, 33, hidden});
          cuda::embedding(ctx, dt.view(), di.view(), out.view());
          cpu::embedding(table.view(), ids.view(), want.view());
          expectSameBytes("embedding", out.download(), want);
        }
  Host table = randomHost(rng, DType::BF16, {10, 8});
  Host ids(DType::I32, {3});
  ids.set({1, 10, 2});
  Dev dt(table), di(ids), out = poisonedDev(DType::BF16, {3, 8});
  cuda::embedding(ctx, dt.view(), di.view(), out.view());
  cuda::DeviceError e = deviceError();
  EXPECT_EQ(e.code, cuda::kIdOutOfRange);
  EXPECT_EQ(e.kernel, 7);
  EXPECT_EQ(e.index, 1);
  EXPECT_EQ(e.value, 10);
  clearDeviceError();
}

TEST_F(CudaKernelsTest, EmbeddingGradMatchesCpuAndRepeats) {
  struct Case {
    int64_t vocab, hidden, positions;
  };
  const Case cases[] = {{50257, 64, 4096}, {1000, 33, 517}, {32000, 768, 2048}, {7, 8, 0}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case &c : cases) {
      SCOPED_TRACE(std::string(name(dt)) + " vocab " + std::to_string(c.vocab) + " hidden " +
                   std::to_string(c.hidden) + " positions " + std::to_string(c.positions));
      // Half the positions draw from 16 hot ids, so rows sum many positions.
      Host ids = randomInts(rng, DType::I64, {c.positions}, 0, c.vocab);
      std::vector<double> iv = ids.get();
      std::uniform_int_distribution<int> hot(0, 15);
      for (size_t i = 0; i < iv.size(); i += 2)
        iv[i] = double(hot(rng) * (c.vocab / 16));
      ids.set(iv);
      Host dy = randomHost(rng, dt, {c.positions, c.hidden});
      Dev di(ids), ddy(dy), g = poisonedDev(dt, {c.vocab, c.hidden});
      Dev g2 = poisonedDev(dt, {c.vocab, c.hidden});
      Host want = poisonedHost(dt, {c.vocab, c.hidden});
      cuda::embeddingGrad(ctx, ddy.view(), di.view(), g.view());
      cpu::embeddingGrad(dy.view(), ids.view(), want.view());
      Host got = g.download();
      expectClose("dtable", got, want, relTol(dt), 10.0);
      cuda::embeddingGrad(ctx, ddy.view(), di.view(), g2.view());
      expectSameBytes("dtable repeat", g2.download(), got);
    }
  Host ids(DType::I64, {4});
  ids.set({0, 3, -2, 1});
  Host dy = randomHost(rng, DType::F32, {4, 5});
  Dev di(ids), ddy(dy), g = poisonedDev(DType::F32, {3, 5});
  cuda::embeddingGrad(ctx, ddy.view(), di.view(), g.view());
  cuda::DeviceError e = deviceError();
  EXPECT_EQ(e.code, cuda::kIdOutOfRange);
  EXPECT_TRUE((e.index == 1 && e.value == 3) || (e.index == 2 && e.value == -2));
  clearDeviceError();
}

//===----------------------------------------------------------------------===//
// GEMMs
//===----------------------------------------------------------------------===//

TEST_F(CudaKernelsTest, LinearMatchesCpu) {
  for (DType dt : kFloatTypes)
    for (int withBias = 0; withBias < 2; ++withBias)
      for (size_t offset : {size_t(0), dtypeSize(dt)}) {
        SCOPED_TRACE(std::string(name(dt)) + (withBias ? " bias" : "") + " offset " +
                     std::to_string(offset));
        Host x = randomHost(rng, dt, {3, 37, 65}), w = randomHost(rng, dt, {129, 65});
        Host b = randomHost(rng, dt, {129});
        Dev dx(x, offset), dw(w), db(b), y = poisonedDev(dt, {3, 37, 129});
        Host want = poisonedHost(dt, {3, 37, 129});
        const TensorView bv = b.view(), dbv = db.view();
        cuda::linear(ctx, dx.view(), dw.view(), withBias ? &dbv : nullptr, y.view());
        cpu::linear(x.view(), w.view(), withBias ? &bv : nullptr, want.view());
        expectClose("y", y.download(), want);
      }
  // A bias in another dtype than y (no cuBLASLt epilogue), and x, w of different dtypes.
  Host x = randomHost(rng, DType::BF16, {19, 40}), w = randomHost(rng, DType::BF16, {24, 40});
  Host b = randomHost(rng, DType::F32, {24}), w32 = randomHost(rng, DType::F32, {24, 40});
  Dev dx(x), dw(w), db(b), dw32(w32), y = poisonedDev(DType::BF16, {19, 24});
  Host want = poisonedHost(DType::BF16, {19, 24});
  const TensorView bv = b.view(), dbv = db.view();
  cuda::linear(ctx, dx.view(), dw.view(), &dbv, y.view());
  cpu::linear(x.view(), w.view(), &bv, want.view());
  expectClose("f32 bias", y.download(), want);
  Dev y32 = poisonedDev(DType::F32, {19, 24});
  Host want32 = poisonedHost(DType::F32, {19, 24});
  cuda::linear(ctx, dx.view(), dw32.view(), &dbv, y32.view());
  cpu::linear(x.view(), w32.view(), &bv, want32.view());
  expectClose("mixed x, w", y32.download(), want32);
  // k = 0: y is the bias.
  Host x0(DType::F32, {3, 0}), w0(DType::F32, {4, 0});
  Host b0 = randomHost(rng, DType::F32, {4});
  Dev dx0(x0), dw0(w0), db0(b0), y0 = poisonedDev(DType::F32, {3, 4});
  Host want0 = poisonedHost(DType::F32, {3, 4});
  const TensorView b0v = b0.view(), db0v = db0.view();
  cuda::linear(ctx, dx0.view(), dw0.view(), &db0v, y0.view());
  cpu::linear(x0.view(), w0.view(), &b0v, want0.view());
  expectClose("k = 0", y0.download(), want0);
}

TEST_F(CudaKernelsTest, MatmulAndLinearGradientsMatchCpu) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(name(dt));
    Host a = randomHost(rng, dt, {2, 3, 33, 47}), b = randomHost(rng, dt, {2, 3, 47, 29});
    Dev da(a), db(b), c = poisonedDev(dt, {2, 3, 33, 29});
    Host wc = poisonedHost(dt, {2, 3, 33, 29});
    cuda::matmul(ctx, da.view(), db.view(), c.view());
    cpu::matmul(a.view(), b.view(), wc.view());
    expectClose("matmul", c.download(), wc);

    Host dy = randomHost(rng, dt, {4, 111, 96}), w = randomHost(rng, dt, {96, 81});
    Host x = randomHost(rng, dt, {4, 111, 81});
    Dev ddy(dy), dw(w), dx(x), gx = poisonedDev(dt, {4, 111, 81});
    Dev gw = poisonedDev(dt, {96, 81}), gw2 = poisonedDev(dt, {96, 81});
    Host wgx = poisonedHost(dt, {4, 111, 81}), wgw = poisonedHost(dt, {96, 81});
    cuda::linearGradInput(ctx, ddy.view(), dw.view(), gx.view());
    cpu::linearGradInput(dy.view(), w.view(), wgx.view());
    expectClose("linear_grad_input", gx.download(), wgx);
    cuda::linearGradWeight(ctx, ddy.view(), dx.view(), gw.view());
    cpu::linearGradWeight(dy.view(), x.view(), wgw.view());
    Host got = gw.download();
    expectClose("linear_grad_weight", got, wgw);
    cuda::linearGradWeight(ctx, ddy.view(), dx.view(), gw2.view());
    expectSameBytes("linear_grad_weight repeat", gw2.download(), got);
  }
  // A long reduction (many positions) for the weight gradient, as in training.
  Host dy = randomHost(rng, DType::BF16, {8192, 256}), x = randomHost(rng, DType::BF16, {8192, 192});
  Dev ddy(dy), dx(x), gw = poisonedDev(DType::BF16, {256, 192}), gw2 = poisonedDev(DType::BF16, {256, 192});
  Host want = poisonedHost(DType::BF16, {256, 192});
  cuda::linearGradWeight(ctx, ddy.view(), dx.view(), gw.view());
  cpu::linearGradWeight(dy.view(), x.view(), want.view());
  Host got = gw.download();
  expectClose("long linear_grad_weight", got, want);
  cuda::linearGradWeight(ctx, ddy.view(), dx.view(), gw2.view());
  expectSameBytes("long linear_grad_weight repeat", gw2.download(), got);
}

TEST_F(CudaKernelsTest, VocabularyGemmsWithUnalignedRowsMatchCpu) {
  // GPT-2's lm_head: 50257 columns are not a multiple of 16 bytes, so y (linear), dy
  // (linear_grad_input, linear_grad_weight) go through aligned copies.
  const int64_t rows = 96, in = 768, vocab = 50257;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(name(dt));
    Host x = randomHost(rng, dt, {rows, in}), w = randomHost(rng, dt, {vocab, in});
    Host dy = randomHost(rng, dt, {rows, vocab});
    Dev dx(x), dw(w), ddy(dy);
    Dev y = poisonedDev(dt, {rows, vocab}), gx = poisonedDev(dt, {rows, in});
    Dev gw = poisonedDev(dt, {vocab, in}), gw2 = poisonedDev(dt, {vocab, in});
    Host wy = poisonedHost(dt, {rows, vocab}), wgx = poisonedHost(dt, {rows, in});
    Host wgw = poisonedHost(dt, {vocab, in});
    cuda::linear(ctx, dx.view(), dw.view(), nullptr, y.view());
    cpu::linear(x.view(), w.view(), nullptr, wy.view());
    expectClose("linear", y.download(), wy);
    cuda::linearGradInput(ctx, ddy.view(), dw.view(), gx.view());
    cpu::linearGradInput(dy.view(), w.view(), wgx.view());
    expectClose("linear_grad_input", gx.download(), wgx);
    cuda::linearGradWeight(ctx, ddy.view(), dx.view(), gw.view());
    cpu::linearGradWeight(dy.view(), x.view(), wgw.view());
    Host got = gw.download();
    expectClose("linear_grad_weight", got, wgw);
    cuda::linearGradWeight(ctx, ddy.view(), dx.view(), gw2.view());
    expectSameBytes("linear_grad_weight repeat", gw2.download(), got);
  }
}

// The scratch arena of conditional graph bodies (CudaKernels.h): scratch comes from it only
// inside a BodyScope while it is lent, each scope gives back what was taken in it, a request
// that does not fit throws and is remembered, and growToNeeded makes room for it.
TEST_F(CudaKernelsTest, ScratchArenaServesConditionalBodies) {
  cuda::ScratchArena arena;
  EXPECT_EQ(cuda::ScratchArena::takeInBody("test", 64), nullptr); // nothing lent
  cuda::ScratchArena::Lend lend(arena);
  EXPECT_EQ(cuda::ScratchArena::takeInBody("test", 64), nullptr); // lent, not in a body
  {
    cuda::ScratchArena::BodyScope body;
    try {
      cuda::ScratchArena::takeInBody("test", 1000);
      ADD_FAILURE() << "an empty arena served 1000 bytes";
    } catch (const Error &e) {
      EXPECT_NE(std::string(e.what()).find("does not fit the scratch arena's 0 bytes"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(arena.needed(), 1000u);
  arena.growToNeeded();
  ASSERT_EQ(arena.capacity(), 1000u);
  cuda::ScratchArena::BodyScope body;
  void *first = cuda::ScratchArena::takeInBody("test", 100);
  ASSERT_NE(first, nullptr);
  void *nested = nullptr;
  {
    cuda::ScratchArena::BodyScope kernel;
    nested = cuda::ScratchArena::takeInBody("test", 600);
    // After the first request, at the next 256-byte boundary.
    EXPECT_EQ(static_cast<char *>(nested) - static_cast<char *>(first), 256);
    // At 1024, the boundary after 856: 1224 bytes, more than the 1000 held.
    EXPECT_THROW(cuda::ScratchArena::takeInBody("test", 200), Error);
    EXPECT_EQ(arena.needed(), 1224u);
  }
  // The nested scope gave its bytes back: the next kernel reuses them.
  EXPECT_EQ(cuda::ScratchArena::takeInBody("test", 600), nested);
  // The memory is the device's: a kernel-sized memset into it works.
  ASSERT_EQ(cudaMemset(nested, 0, 600), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST_F(CudaKernelsTest, GemmEngineTransposesAlphaBetaBatch) {
  const int64_t m = 23, n = 31, k = 19, batch = 3;
  for (DType dt : {DType::F32, DType::BF16})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int64_t sharedB : {int64_t(0), int64_t(1)}) {
          SCOPED_TRACE(std::string(name(dt)) + " transA " + std::to_string(ta) + " transB " +
                       std::to_string(tb) + " shared B " + std::to_string(sharedB));
          Host a = randomHost(rng, dt, {batch, ta ? k : m, ta ? m : k});
          Host b = randomHost(rng, dt, {sharedB ? 1 : batch, tb ? n : k, tb ? k : n});
          Host c = randomHost(rng, dt, {batch, m, n});
          Dev da(a), db(b), dc(c);
          const float alpha = 0.75f, beta = -0.5f;
          cuda::GemmEngine &engine = *ctx.gemm;
          engine.gemm(ctx.stream, dt, ta, tb, m, n, k, alpha, da.data(), m * k, db.data(),
                      sharedB ? 0 : k * n, beta, dc.data(), m * n, batch);
          std::vector<double> av = a.get(), bv = b.get(), cv = c.get(), want(cv.size());
          for (int64_t i = 0; i < batch; ++i)
            for (int64_t r = 0; r < m; ++r)
              for (int64_t j = 0; j < n; ++j) {
                double s = 0.0;
                for (int64_t l = 0; l < k; ++l) {
                  double x = ta ? av[size_t(i * m * k + l * m + r)] : av[size_t(i * m * k + r * k + l)];
                  int64_t bb = sharedB ? 0 : i * k * n;
                  double y = tb ? bv[size_t(bb + j * k + l)] : bv[size_t(bb + l * n + j)];
                  s += x * y;
                }
                size_t e = size_t(i * m * n + r * n + j);
                want[e] = alpha * s + beta * cv[e];
              }
          Host w(dt, {batch, m, n});
          w.set(want);
          expectClose("C", dc.download(), w, relTol(dt), 1.0);
        }
}

//===----------------------------------------------------------------------===//
// Shape kernels
//===----------------------------------------------------------------------===//

TEST_F(CudaKernelsTest, TransposeMatchesCpu) {
  // Every permutation of a small ragged 4-d shape, in several element sizes.
  const Shape small = {2, 3, 5, 7};
  std::vector<int64_t> perm = {0, 1, 2, 3};
  do {
    for (DType dt : {DType::F32, DType::BF16, DType::I64}) {
      SCOPED_TRACE(std::string(name(dt)) + " perm " + formatShape(perm));
      Host x = dt == DType::I64 ? randomInts(rng, dt, small, -1000000, 1000000)
                                : randomHost(rng, dt, small);
      Shape ys(4);
      for (size_t i = 0; i < 4; ++i)
        ys[i] = small[size_t(perm[i])];
      Dev dx(x), y = poisonedDev(dt, ys);
      Host want = poisonedHost(dt, ys);
      cuda::transpose(ctx, dx.view(), perm, y.view());
      cpu::transpose(x.view(), perm, want.view());
      expectSameBytes("transpose", y.download(), want);
    }
  } while (std::next_permutation(perm.begin(), perm.end()));

  struct Case {
    Shape shape;
    std::vector<int64_t> perm;
  };
  const Case cases[] = {{{8, 64, 12, 64}, {0, 2, 1, 3}},
                        {{513, 257}, {1, 0}},
                        {{4, 1, 33, 1, 65}, {4, 3, 2, 1, 0}},
                        {{3, 128, 96}, {0, 2, 1}},
                        {{2, 16, 8, 64}, {0, 2, 3, 1}},
                        // GPT-2's c_attn weight, and even sizes in partial 64 x 64 tiles (bf16:
                        // the kernel that moves element pairs).
                        {{768, 2304}, {1, 0}},
                        {{2, 130, 70}, {0, 2, 1}}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case &c : cases) {
      SCOPED_TRACE(std::string(name(dt)) + " " + formatShape(c.shape) + " perm " +
                   formatShape(c.perm));
      Host x = randomHost(rng, dt, c.shape);
      Shape ys(c.shape.size());
      for (size_t i = 0; i < ys.size(); ++i)
        ys[i] = c.shape[size_t(c.perm[i])];
      Dev dx(x), y = poisonedDev(dt, ys);
      Host want = poisonedHost(dt, ys);
      cuda::transpose(ctx, dx.view(), c.perm, y.view());
      cpu::transpose(x.view(), c.perm, want.view());
      expectSameBytes("transpose", y.download(), want);
    }
}

TEST_F(CudaKernelsTest, SliceAndSliceGradMatchCpu) {
  struct Case {
    Shape x;
    int axis;
    int64_t start, len;
  };
  const Case cases[] = {{{4, 10, 6}, 1, 3, 5},   {{4, 10, 6}, 0, 1, 2},  {{5, 7, 9}, -1, 2, 5},
                        {{2, 64, 128}, 2, 64, 64}, {{3, 17}, 1, 0, 17},   {{6, 8, 16}, 1, 4, 0},
                        // GPT-2's q, k and v slices of the fused projection (rows of a few
                        // 16-byte units, many rows), and more rows than a grid's y dimension.
                        {{4, 256, 2304}, 2, 768, 768}, {{70000, 12}, 1, 4, 6}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case &c : cases) {
      SCOPED_TRACE(std::string(name(dt)) + " " + formatShape(c.x) + " axis " +
                   std::to_string(c.axis) + " [" + std::to_string(c.start) + ", +" +
                   std::to_string(c.len) + ")");
      int64_t a = c.axis < 0 ? c.axis + int64_t(c.x.size()) : c.axis;
      Shape ys = c.x;
      ys[size_t(a)] = c.len;
      Host x = randomHost(rng, dt, c.x), dy = randomHost(rng, dt, ys);
      Dev dx(x), y = poisonedDev(dt, ys), ddy(dy), g = poisonedDev(dt, c.x);
      Host wy = poisonedHost(dt, ys), wg = poisonedHost(dt, c.x);
      cuda::slice(ctx, dx.view(), c.axis, c.start, y.view());
      cpu::slice(x.view(), c.axis, c.start, wy.view());
      expectSameBytes("slice", y.download(), wy);
      cuda::sliceGrad(ctx, ddy.view(), c.axis, c.start, g.view());
      cpu::sliceGrad(dy.view(), c.axis, c.start, wg.view());
      expectSameBytes("slice_grad", g.download(), wg);
    }
}

TEST_F(CudaKernelsTest, ConcatMatchesCpu) {
  struct Case {
    Shape y;
    int axis;
    std::vector<int64_t> sizes;
  };
  const Case cases[] = {{{1, 64, 96}, 1, {16, 16, 32}},
                        {{2, 10, 6}, 1, {3, 0, 7}},
                        {{4, 5, 7}, 2, {1, 6}},
                        {{6, 8}, 0, {2, 2, 2}},
                        {{1, 4096, 128}, 1, {1024, 1024, 1024, 1024}},
                        {{4, 256, 2304}, 2, {768, 768, 768}},
                        {{70000, 12}, 1, {4, 8}}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case &c : cases) {
      SCOPED_TRACE(std::string(name(dt)) + " " + formatShape(c.y) + " axis " +
                   std::to_string(c.axis));
      std::vector<Host> hosts;
      std::vector<std::unique_ptr<Dev>> devs;
      for (int64_t len : c.sizes) {
        Shape s = c.y;
        s[size_t(c.axis)] = len;
        hosts.push_back(randomHost(rng, dt, s));
      }
      for (const Host &h : hosts)
        devs.push_back(std::make_unique<Dev>(h));
      std::vector<TensorView> hv, dv;
      for (Host &h : hosts)
        hv.push_back(h.view());
      for (auto &d : devs)
        dv.push_back(d->view());
      Dev y = poisonedDev(dt, c.y);
      Host want = poisonedHost(dt, c.y);
      cuda::concat(ctx, dv, c.axis, y.view());
      cpu::concat(hv, c.axis, want.view());
      expectSameBytes("concat", y.download(), want);
    }
}

TEST_F(CudaKernelsTest, RopeAndGradientMatchCpu) {
  const Shape shapes[] = {{2, 33, 4, 64}, {1, 5, 3, 6}, {2, 700, 2, 128}};
  for (DType dt : kFloatTypes)
    for (const Shape &s : shapes) {
      SCOPED_TRACE(std::string(name(dt)) + " " + formatShape(s));
      Host x = randomHost(rng, dt, s);
      Dev dx(x), y = poisonedDev(dt, s), g = poisonedDev(dt, s);
      Host wy = poisonedHost(dt, s), wg = poisonedHost(dt, s);
      cuda::rope(ctx, dx.view(), 10000.0, y.view());
      cpu::rope(x.view(), 10000.0, wy.view());
      expectClose("rope", y.download(), wy, relTol(dt), 1.0);
      cuda::ropeGrad(ctx, dx.view(), 500000.0, g.view());
      cpu::ropeGrad(x.view(), 500000.0, wg.view());
      expectClose("rope_grad", g.download(), wg, relTol(dt), 1.0);
      cuda::rope(ctx, dx.view(), 10000.0, dx.view()); // in place
      expectClose("rope in place", dx.download(), wy, relTol(dt), 1.0);
    }
}

TEST_F(CudaKernelsTest, ReduceToMatchesCpuAndRepeats) {
  struct Case {
    Shape x, y;
  };
  const Case cases[] = {{{4, 33, 64}, {64}},      {{4, 33, 64}, {1}},      {{4, 33, 64}, {4, 1, 64}},
                        {{4, 33, 64}, {4, 33, 1}}, {{4, 33, 64}, {33, 1}}, {{1000003}, {1}},
                        {{4096, 768}, {768}},      {{6, 7}, {6, 7}},       {{2, 3, 4, 5}, {3, 1, 5}},
                        {{65, 1, 3}, {1, 3}},      {{3000, 3072}, {3072}},
                        {{100000, 40}, {40}}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case &c : cases)
      for (size_t offset : {size_t(0), dtypeSize(dt)}) {
        SCOPED_TRACE(std::string(name(dt)) + " " + formatShape(c.x) + " -> " + formatShape(c.y) +
                     " offset " + std::to_string(offset));
        Host x = randomHost(rng, dt, c.x);
        Dev dx(x, offset), y = poisonedDev(dt, c.y), y2 = poisonedDev(dt, c.y);
        Host want = poisonedHost(dt, c.y);
        cuda::reduceTo(ctx, dx.view(), y.view());
        cpu::reduceTo(x.view(), want.view());
        Host got = y.download();
        expectClose("reduce_to", got, want, relTol(dt), 10.0);
        cuda::reduceTo(ctx, dx.view(), y2.view());
        expectSameBytes("reduce_to repeat", y2.download(), got);
      }
}

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

TEST_F(CudaKernelsTest, GradNormMatchesCpuAndRepeats) {
  // 130 tensors (more than one launch's set), of mixed dtypes and ragged sizes, one empty.
  std::vector<Host> hosts;
  std::vector<Dev> devs;
  std::uniform_int_distribution<int64_t> size(1, 40000);
  for (int i = 0; i < 130; ++i) {
    DType dt = kFloatTypes[i % 3];
    int64_t n = i == 5 ? 0 : (i == 9 ? 3000017 : size(rng));
    hosts.push_back(randomHost(rng, dt, {n}));
    devs.emplace_back(hosts.back(), i % 2 ? 0 : dtypeSize(dt));
  }
  std::vector<TensorView> hv, dv;
  for (size_t i = 0; i < hosts.size(); ++i) {
    hv.push_back(hosts[i].view());
    dv.push_back(devs[i].view());
  }
  Dev norm = poisonedDev(DType::F32, {}), norm2 = poisonedDev(DType::F32, {});
  Host want = poisonedHost(DType::F32, {});
  cuda::gradNorm(ctx, dv, norm.view());
  cpu::gradNorm(hv, want.view());
  Host got = norm.download();
  expectClose("grad_norm", got, want, 1e-5);
  cuda::gradNorm(ctx, dv, norm2.view());
  expectSameBytes("grad_norm repeat", norm2.download(), got);
  Dev empty = poisonedDev(DType::BF16, {});
  cuda::gradNorm(ctx, {}, empty.view());
  EXPECT_EQ(empty.download().get()[0], 0.0);
}

TEST_F(CudaKernelsTest, LearningRateAndStepIncrementMatchCpu) {
  cpu::LearningRateSchedule cosine{3e-4, true, 10, 100, 0.1};
  cpu::LearningRateSchedule constant{1e-3, false, 5, 0, 0.0};
  for (const auto &sched : {cosine, constant})
    for (int64_t done : {int64_t(0), int64_t(4), int64_t(9), int64_t(10), int64_t(55),
                         int64_t(99), int64_t(150)}) {
      SCOPED_TRACE("cosine " + std::to_string(sched.cosine) + " step " + std::to_string(done));
      Host step(DType::I64, {});
      step.set({double(done)});
      Dev dstep(step), lr = poisonedDev(DType::F32, {});
      Host want = poisonedHost(DType::F32, {});
      cuda::learningRate(ctx, dstep.view(), sched, lr.view());
      cpu::learningRate(step.view(), sched, want.view());
      expectClose("lr", lr.download(), want, 1e-6);
      cuda::stepIncrement(ctx, dstep.view());
      cpu::stepIncrement(step.view());
      expectSameBytes("step", dstep.download(), step);
    }
}

TEST_F(CudaKernelsTest, AdamWAndSgdMatchCpu) {
  const Shape s = {1000, 37};
  for (DType gt : {DType::F32, DType::BF16})
    for (DType pt : {DType::F32, DType::BF16})
      for (int withMaster = 0; withMaster < 2; ++withMaster) {
        SCOPED_TRACE(std::string("grad ") + name(gt) + " param " + name(pt) +
                     (withMaster ? " master" : ""));
        Host grad = randomHost(rng, gt, s), param = randomHost(rng, pt, s);
        Host m = randomHost(rng, DType::F32, s, -0.1, 0.1);
        Host v = randomHost(rng, DType::F32, s, 0.0, 0.01);
        Host master = randomHost(rng, DType::F32, s);
        Host step(DType::I64, {}), lr(DType::F32, {}), norm(DType::BF16, {});
        step.set({6});
        lr.set({1e-3});
        norm.set({3.5});
        Dev dgrad(grad), dparam(param), dm(m), dv(v), dmaster(master), dstep(step), dlr(lr),
            dnorm(norm);
        cpu::AdamWHyper hyper{0.9, 0.95, 1e-8, 0.1, 1.0};
        const TensorView mv = master.view();
        const TensorView dmv = dmaster.view();
        cuda::adamwUpdate(ctx, dgrad.view(), dstep.view(), dlr.view(), dnorm.view(), hyper,
                          dparam.view(), dm.view(), dv.view(), withMaster ? &dmv : nullptr);
        cpu::adamwUpdate(grad.view(), step.view(), lr.view(), norm.view(), hyper, param.view(),
                         m.view(), v.view(), withMaster ? &mv : nullptr);
        expectClose("adamw param", dparam.download(), param, relTol(pt), 1.0);
        expectClose("adamw m", dm.download(), m, 1e-5, 1.0);
        expectClose("adamw v", dv.download(), v, 1e-5, 1.0);
        if (withMaster)
          expectClose("adamw master", dmaster.download(), master, 1e-5, 1.0);

        for (double momentum : {0.0, 0.9}) {
          Host p2 = randomHost(rng, pt, s), buf = randomHost(rng, DType::F32, s);
          Dev dp2(p2), dbuf(buf);
          cpu::SGDHyper sh{momentum, 0.01, 2.0};
          cuda::sgdUpdate(ctx, dgrad.view(), dlr.view(), dnorm.view(), sh, dp2.view(),
                          dbuf.view(), withMaster ? &dmv : nullptr);
          cpu::sgdUpdate(grad.view(), lr.view(), norm.view(), sh, p2.view(), buf.view(),
                         withMaster ? &mv : nullptr);
          expectClose("sgd param", dp2.download(), p2, relTol(pt), 1.0);
          expectClose("sgd momentum", dbuf.download(), buf, 1e-5, 1.0);
          if (withMaster)
            expectClose("sgd master", dmaster.download(), master, 1e-5, 1.0);
        }
      }
}

TEST_F(CudaKernelsTest, ShapeErrorsThrowBeforeAnythingRuns) {
  Dev a(DType::F32, {3, 4}), b(DType::F32, {5}), c(DType::F32, {3, 4});
  EXPECT_THROW(cuda::add(ctx, a.view(), b.view(), c.view()), Error);
  Dev w(DType::F32, {7, 5});
  EXPECT_THROW(cuda::linear(ctx, a.view(), w.view(), nullptr, c.view()), Error);
  cuda::Context noGemm = ctx;
  noGemm.gemm = nullptr;
  Dev w2(DType::F32, {4, 4});
  EXPECT_THROW(cuda::linear(noGemm, a.view(), w2.view(), nullptr, c.view()), Error);
}

//===----------------------------------------------------------------------===//
// Performance (printed, not asserted)
//===----------------------------------------------------------------------===//

/// Median milliseconds of `reps` timed runs of fn after `warm` untimed ones.
double medianMs(cudaStream_t stream, int warm, int reps, const std::function<void()> &fn) {
  for (int i = 0; i < warm; ++i)
    fn();
  cudaEvent_t start, stop;
  cudaOk(cudaEventCreate(&start), "cudaEventCreate");
  cudaOk(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    cudaOk(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    cudaOk(cudaEventRecord(stop, stream), "cudaEventRecord");
    cudaOk(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cudaOk(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return double(times[times.size() / 2]);
}

/// A device tensor of random bf16 (a 1 Mi-element random block tiled), never zeros.
Dev randomDeviceBf16(std::mt19937 &rng, Shape shape) {
  Dev d(DType::BF16, shape);
  const int64_t block = int64_t(1) << 20;
  Host h = randomHost(rng, DType::BF16, {block});
  int64_t n = numelOf(shape);
  for (int64_t off = 0; off < n; off += block) {
    int64_t count = std::min(block, n - off);
    cudaOk(cudaMemcpy(static_cast<char *>(d.data()) + off * 2, h.bytes.data(), size_t(count) * 2,
                      cudaMemcpyHostToDevice),
           "cudaMemcpy");
  }
  return d;
}

TEST_F(CudaKernelsTest, PerfElementwiseBandwidthAndGemmThroughput) {
  cudaStream_t stream = ctx.stream;
  // Elementwise: out = lhs + rhs on 2^28 bf16 elements (1.5 GiB moved per call).
  const int64_t n = int64_t(1) << 28;
  Dev lhs = randomDeviceBf16(rng, {n}), rhs = randomDeviceBf16(rng, {n});
  Dev out(DType::BF16, {n});
  double addMs = medianMs(stream, 3, 20, [&] { cuda::add(ctx, lhs.view(), rhs.view(), out.view()); });
  double addGBs = 3.0 * double(n) * 2.0 / (addMs * 1e-3) / 1e9;
  double copyMs = medianMs(stream, 3, 20, [&] {
    cudaOk(cudaMemcpyAsync(out.data(), lhs.data(), size_t(n) * 2, cudaMemcpyDeviceToDevice, stream),
           "cudaMemcpyAsync");
  });
  double copyGBs = 2.0 * double(n) * 2.0 / (copyMs * 1e-3) / 1e9;
  Dev accF32(DType::F32, {n});
  double castMs = medianMs(stream, 3, 20, [&] { cuda::cast(ctx, lhs.view(), accF32.view()); });
  double castGBs = double(n) * 6.0 / (castMs * 1e-3) / 1e9;

  // GEMM: 8192^3 bf16 through GemmEngine (linear: y = x wᵀ).
  const int64_t s = 8192;
  Dev x = randomDeviceBf16(rng, {s, s}), w = randomDeviceBf16(rng, {s, s});
  Dev y(DType::BF16, {s, s});
  double gemmMs =
      medianMs(stream, 3, 20, [&] { cuda::linear(ctx, x.view(), w.view(), nullptr, y.view()); });
  double tflops = 2.0 * double(s) * double(s) * double(s) / (gemmMs * 1e-3) / 1e12;
  double mmMs = medianMs(stream, 3, 20, [&] {
    ctx.gemm->gemm(stream, DType::BF16, false, false, s, s, s, 1.0f, x.data(), 0, w.data(), 0,
                   0.0f, y.data(), 0, 1);
  });
  double mmTflops = 2.0 * double(s) * double(s) * double(s) / (mmMs * 1e-3) / 1e12;

  std::printf("[perf] add bf16 n=2^28: %.3f ms, %.0f GB/s (read 2 + write 1)\n", addMs, addGBs);
  std::printf("[perf] cast bf16->f32 n=2^28: %.3f ms, %.0f GB/s\n", castMs, castGBs);
  std::printf("[perf] cudaMemcpy D2D 512 MiB: %.3f ms, %.0f GB/s (read + write)\n", copyMs,
              copyGBs);
  std::printf("[perf] linear bf16 8192^3 (NT): %.3f ms, %.1f TFLOP/s\n", gemmMs, tflops);
  std::printf("[perf] GemmEngine::gemm bf16 8192^3 (NN): %.3f ms, %.1f TFLOP/s\n", mmMs, mmTflops);
  RecordProperty("add_bf16_GBps", std::to_string(addGBs));
  RecordProperty("gemm_bf16_8192_TFLOPs", std::to_string(tflops));
}

/// Median milliseconds of `reps` replays of fn captured once as a CUDA graph (how the training
/// step runs its kernels: scratch comes from the graph's own memory), or -1 if capture fails.
double medianGraphMs(cudaStream_t stream, int reps, const std::function<void()> &fn) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaOk(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
         "cudaStreamBeginCapture");
  try {
    fn();
  } catch (const std::exception &e) {
    std::printf("[perf] capture failed: %s\n", e.what());
  }
  cudaError_t status = cudaStreamEndCapture(stream, &graph);
  if (status == cudaSuccess && graph)
    status = cudaGraphInstantiate(&exec, graph, 0);
  if (graph)
    cudaGraphDestroy(graph);
  if (status != cudaSuccess || !exec) {
    std::printf("[perf] graph capture failed: %s\n", cudaGetErrorString(status));
    cudaGetLastError();
    return -1.0;
  }
  double ms = medianMs(stream, 3, reps,
                       [&] { cudaOk(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); });
  cudaGraphExecDestroy(exec);
  return ms;
}

TEST_F(CudaKernelsTest, PerfNormGradReduceAndVocabularyGemms) {
  // The slow spots of a GPT-2 / Llama-124M training step (batch 16 x 1024, hidden 768, bf16),
  // each timed as a plain stream call and as a graph replay (median of 20, CUDA events).
  cudaStream_t stream = ctx.stream;
  const int64_t rows = 16 * 1024, hidden = 768, vocab = 50257;
  struct Row {
    std::string what;
    double ms, graphMs, bytes, flops;
  };
  std::vector<Row> table;
  auto measure = [&](const std::string &what, double bytes, double flops,
                  const std::function<void()> &fn) {
    double ms = medianMs(stream, 3, 20, fn);
    double graphMs = medianGraphMs(stream, 20, fn);
    table.push_back({what, ms, graphMs, bytes, flops});
  };

  Dev x = randomDeviceBf16(rng, {16, 1024, hidden}), dy = randomDeviceBf16(rng, {16, 1024, hidden});
  Dev dx(DType::BF16, {16, 1024, hidden});
  Host wh = randomHost(rng, DType::BF16, {hidden}, 0.5, 1.5);
  Dev w(wh), dw(DType::BF16, {hidden}), db(DType::BF16, {hidden});
  double normBytes = 3.0 * double(rows * hidden) * 2.0; // dy, x read; dx written
  measure("rms_norm_grad bf16 [16,1024,768]", normBytes, 0, [&] {
    cuda::rmsNormGrad(ctx, dy.view(), x.view(), w.view(), 1e-5, dx.view(), dw.view());
  });
  measure("layer_norm_grad bf16 [16,1024,768]", normBytes, 0, [&] {
    cuda::layerNormGrad(ctx, dy.view(), x.view(), w.view(), 1e-5, dx.view(), dw.view(),
                        db.view());
  });

  Dev big = randomDeviceBf16(rng, {rows, 3072});
  Dev col(DType::BF16, {3072});
  measure("reduce_to bf16 [16384,3072]->[3072]", double(rows * 3072) * 2.0, 0,
       [&] { cuda::reduceTo(ctx, big.view(), col.view()); });

  Dev xs = randomDeviceBf16(rng, {rows, hidden}), wv = randomDeviceBf16(rng, {vocab, hidden});
  Dev logits(DType::BF16, {rows, vocab});
  Dev dlogits = randomDeviceBf16(rng, {rows, vocab});
  Dev gx(DType::BF16, {rows, hidden}), gw(DType::BF16, {vocab, hidden});
  double flops = 2.0 * double(rows) * double(vocab) * double(hidden);
  double gemmBytes = double(rows * vocab) * 2.0;
  measure("linear bf16 [16384,768] x [50257,768]^T", gemmBytes, flops,
       [&] { cuda::linear(ctx, xs.view(), wv.view(), nullptr, logits.view()); });
  measure("linear_grad_input bf16 dy [16384,50257]", gemmBytes, flops,
       [&] { cuda::linearGradInput(ctx, dlogits.view(), wv.view(), gx.view()); });
  measure("linear_grad_weight bf16 dy [16384,50257]", gemmBytes, flops,
       [&] { cuda::linearGradWeight(ctx, dlogits.view(), xs.view(), gw.view()); });
  {
    // The floors: the same GEMMs on an aligned vocabulary (50264 = 50257 rounded up to 8), and
    // the pitched copy that staging needs.
    const int64_t padded = 50264;
    Dev wp = randomDeviceBf16(rng, {padded, hidden});
    Dev yp = randomDeviceBf16(rng, {rows, padded});
    Dev gwp(DType::BF16, {padded, hidden});
    measure("linear bf16 aligned [16384,768] x [50264,768]^T", 0, flops,
            [&] { cuda::linear(ctx, xs.view(), wp.view(), nullptr, yp.view()); });
    measure("gemm bf16 aligned grad_input (k = 50264)", 0, flops, [&] {
      ctx.gemm->gemm(stream, DType::BF16, false, false, rows, hidden, padded, 1.0f, yp.data(), 0,
                     wp.data(), 0, 0.0f, gx.data(), 0, 1);
    });
    measure("gemm bf16 aligned grad_weight (m = 50264)", 0, flops, [&] {
      ctx.gemm->gemm(stream, DType::BF16, true, false, padded, hidden, rows, 1.0f, yp.data(), 0,
                     xs.data(), 0, 0.0f, gwp.data(), 0, 1);
    });
    measure("cudaMemcpy2DAsync [16384,50257] -> ld 50264", 2.0 * gemmBytes, 0, [&] {
      cudaOk(cudaMemcpy2DAsync(yp.data(), size_t(padded) * 2, dlogits.data(), size_t(vocab) * 2,
                               size_t(vocab) * 2, size_t(rows), cudaMemcpyDeviceToDevice, stream),
             "cudaMemcpy2DAsync");
    });
  }

  for (const Row &r : table) {
    std::printf("[perf] %-48s %9.4f ms  graph %9.4f ms", r.what.c_str(), r.ms, r.graphMs);
    if (r.flops > 0)
      std::printf("  %6.1f TFLOP/s", r.flops / (r.ms * 1e-3) / 1e12);
    else if (r.bytes > 0)
      std::printf("  %6.0f GB/s", r.bytes / (r.ms * 1e-3) / 1e9);
    std::printf("\n");
  }
}

//===----------------------------------------------------------------------===//
// Fused kernels (docs/fusion.md)
//===----------------------------------------------------------------------===//

/// Per-parameter operands of the multi-tensor tests.
struct UpdateSet {
  std::vector<Host> grad, param, m, v, master;
  std::vector<Dev> dgrad, dparam, dm, dv, dmaster;

  std::vector<TensorView> views(const std::vector<Dev> &d) const {
    std::vector<TensorView> out;
    for (const Dev &t : d)
      out.push_back(t.view());
    return out;
  }
};

/// Tensors of sizes around the kernels' chunks (8192 on CUDA), every third one at an offset
/// that breaks 16-byte alignment (the scalar path), with device copies.
UpdateSet makeUpdateSet(std::mt19937 &rng, const std::vector<Shape> &shapes, DType gt, DType pt,
                        bool masters) {
  UpdateSet u;
  for (size_t i = 0; i < shapes.size(); ++i) {
    u.grad.push_back(randomHost(rng, gt, shapes[i]));
    u.param.push_back(randomHost(rng, pt, shapes[i]));
    u.m.push_back(randomHost(rng, DType::F32, shapes[i], -0.1, 0.1));
    u.v.push_back(randomHost(rng, DType::F32, shapes[i], 0.0, 0.01));
    if (masters)
      u.master.push_back(randomHost(rng, DType::F32, shapes[i]));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    size_t offset = i % 3 == 2 ? 4 : 0;
    u.dgrad.emplace_back(u.grad[i], offset);
    u.dparam.emplace_back(u.param[i], offset);
    u.dm.emplace_back(u.m[i], offset);
    u.dv.emplace_back(u.v[i], offset);
    if (masters)
      u.dmaster.emplace_back(u.master[i], offset);
  }
  return u;
}

const std::vector<Shape> kMultiShapes = {{3}, {8192}, {129, 130}, {1}, {40000}, {8193}, {64, 64}};

// The multi-tensor AdamW and SGD apply the per-tensor kernels' element formula: bitwise the
// per-tensor CUDA kernels' results (and within the usual tolerance of the CPU's), for every
// storage pair, with and without masters, aligned and not; also replayed from a CUDA Graph
// (the pointer table travels with the captured launch).
TEST_F(CudaKernelsTest, MultiTensorUpdatesAreBitwiseThePerTensorKernels) {
  Host step(DType::I64, {}), lr(DType::F32, {}), norm(DType::F32, {});
  step.set({4});
  lr.set({2e-3});
  norm.set({3.5});
  Dev dstep(step), dlr(lr), dnorm(norm);
  for (DType gt : {DType::F32, DType::BF16})
    for (DType pt : {DType::F32, DType::BF16})
      for (bool masters : {false, true}) {
        SCOPED_TRACE(std::string("grad ") + name(gt) + " param " + name(pt) +
                     (masters ? " master" : ""));
        UpdateSet a = makeUpdateSet(rng, kMultiShapes, gt, pt, masters);
        UpdateSet b = makeUpdateSet(rng, kMultiShapes, gt, pt, masters);
        for (size_t i = 0; i < kMultiShapes.size(); ++i) { // the same values in both
          b.dgrad[i].upload(a.grad[i]);
          b.dparam[i].upload(a.param[i]);
          b.dm[i].upload(a.m[i]);
          b.dv[i].upload(a.v[i]);
          if (masters)
            b.dmaster[i].upload(a.master[i]);
        }
        cpu::AdamWHyper hyper{0.9, 0.95, 1e-8, 0.1, 1.0};
        for (size_t i = 0; i < kMultiShapes.size(); ++i) {
          TensorView mv = masters ? a.dmaster[i].view() : TensorView{};
          cuda::adamwUpdate(ctx, a.dgrad[i].view(), dstep.view(), dlr.view(), dnorm.view(),
                            hyper, a.dparam[i].view(), a.dm[i].view(), a.dv[i].view(),
                            masters ? &mv : nullptr);
          TensorView hv = masters ? a.master[i].view() : TensorView{};
          cpu::adamwUpdate(a.grad[i].view(), step.view(), lr.view(), norm.view(), hyper,
                           a.param[i].view(), a.m[i].view(), a.v[i].view(),
                           masters ? &hv : nullptr);
        }
        cuda::multiTensorAdamwUpdate(ctx, b.views(b.dgrad), dstep.view(), dlr.view(),
                                     dnorm.view(), hyper, b.views(b.dparam), b.views(b.dm),
                                     b.views(b.dv), b.views(b.dmaster));
        for (size_t i = 0; i < kMultiShapes.size(); ++i) {
          std::string t = " " + std::to_string(i);
          expectSameBytes("adamw param" + t, b.dparam[i].download(), a.dparam[i].download());
          expectSameBytes("adamw m" + t, b.dm[i].download(), a.dm[i].download());
          expectSameBytes("adamw v" + t, b.dv[i].download(), a.dv[i].download());
          if (masters)
            expectSameBytes("adamw master" + t, b.dmaster[i].download(),
                            a.dmaster[i].download());
          expectClose("adamw param vs cpu" + t, b.dparam[i].download(), a.param[i], relTol(pt),
                      1.0);
        }

        // SGD with momentum: the moments serve as momentum buffers. Captured in a graph and
        // replayed twice, against the per-tensor kernel run twice.
        cpu::SGDHyper sh{0.9, 0.01, 2.0};
        for (int rep = 0; rep < 2; ++rep)
          for (size_t i = 0; i < kMultiShapes.size(); ++i) {
            TensorView mv = masters ? a.dmaster[i].view() : TensorView{};
            cuda::sgdUpdate(ctx, a.dgrad[i].view(), dlr.view(), dnorm.view(), sh,
                            a.dparam[i].view(), a.dm[i].view(), masters ? &mv : nullptr);
          }
        sync();
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        cudaOk(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal),
               "cudaStreamBeginCapture");
        cuda::multiTensorSgdUpdate(ctx, b.views(b.dgrad), dlr.view(), dnorm.view(), sh,
                                   b.views(b.dparam), b.views(b.dm), b.views(b.dmaster));
        cudaOk(cudaStreamEndCapture(ctx.stream, &graph), "cudaStreamEndCapture");
        cudaOk(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
        for (int rep = 0; rep < 2; ++rep)
          cudaOk(cudaGraphLaunch(exec, ctx.stream), "cudaGraphLaunch");
        sync();
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        for (size_t i = 0; i < kMultiShapes.size(); ++i) {
          std::string t = " " + std::to_string(i);
          expectSameBytes("sgd param" + t, b.dparam[i].download(), a.dparam[i].download());
          expectSameBytes("sgd momentum" + t, b.dm[i].download(), a.dm[i].download());
        }
      }
}

// More tensors than one launch's table holds (512): the kernel runs in several launches.
TEST_F(CudaKernelsTest, MultiTensorUpdateOfManyTensors) {
  std::vector<Shape> shapes(700, Shape{5});
  shapes[300] = {20000};
  UpdateSet a = makeUpdateSet(rng, shapes, DType::F32, DType::F32, false);
  Host lr(DType::F32, {}), norm(DType::F32, {});
  lr.set({0.1});
  norm.set({1.0});
  Dev dlr(lr), dnorm(norm);
  cpu::SGDHyper sh{0.0, 0.0, 0.0};
  cuda::multiTensorSgdUpdate(ctx, a.views(a.dgrad), dlr.view(), dnorm.view(), sh,
                             a.views(a.dparam), a.views(a.dm), {});
  for (size_t i = 0; i < shapes.size(); ++i) {
    cpu::sgdUpdate(a.grad[i].view(), lr.view(), norm.view(), sh, a.param[i].view(),
                   a.m[i].view(), nullptr);
    expectClose("param " + std::to_string(i), a.dparam[i].download(), a.param[i], 1e-6, 1.0);
  }
}

TEST_F(CudaKernelsTest, MultiTensorRejectsBadOperands) {
  Host g = randomHost(rng, DType::F32, {4}), p = randomHost(rng, DType::BF16, {4});
  Host lr(DType::F32, {}), norm(DType::F32, {});
  // Two parameters may read one gradient (read-only operands may share bytes).
  Dev dg(g), dp(p), dp2(p), dm(g), dm2(g), dlr(lr), dnorm(norm);
  cpu::SGDHyper sh;
  Host p32 = randomHost(rng, DType::F32, {4});
  Dev dp32(p32);
  try {
    cuda::multiTensorSgdUpdate(ctx, {dg.view(), dg.view()}, dlr.view(), dnorm.view(), sh,
                               {dp.view(), dp32.view()}, {dm.view(), dm2.view()}, {});
    ADD_FAILURE() << "mixed parameter dtypes were accepted";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("one launch has one of each"), std::string::npos)
        << e.what();
  }
  try {
    cuda::multiTensorSgdUpdate(ctx, {dg.view(), dg.view()}, dlr.view(), dnorm.view(), sh,
                               {dp.view(), dp2.view()}, {dm.view(), dm.view()}, {});
    ADD_FAILURE() << "a momentum buffer shared by two parameters was accepted";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
  }
}

// linear + tanh GELU through cuBLASLt's GELU_AUX(_BIAS) epilogue against the CPU reference
// (linear, then gelu of the rounded pre-activation): the pre-activation within the GEMM
// tolerance, the activation within it too (cuBLASLt applies GELU to the fp32 value before
// rounding: one rounding of the dtype apart for bf16/f16). Output widths that are and are not
// multiples of 8 (the auxiliary matrix's staging), with and without bias, and a bias of
// another dtype (the unfused fallback).
TEST_F(CudaKernelsTest, LinearGeluMatchesCpu) {
  for (DType dt : kFloatTypes)
    for (int64_t out : {int64_t(256), int64_t(129)})
      for (int withBias = 0; withBias < 2; ++withBias) {
        SCOPED_TRACE(std::string(name(dt)) + " out " + std::to_string(out) +
                     (withBias ? " bias" : ""));
        Host x = randomHost(rng, dt, {3, 37, 64}), w = randomHost(rng, dt, {out, 64});
        Host b = randomHost(rng, dt, {out});
        Dev dx(x), dw(w), db(b), y = poisonedDev(dt, {3, 37, out}),
            pre = poisonedDev(dt, {3, 37, out});
        Host wantY = poisonedHost(dt, {3, 37, out}), wantPre = poisonedHost(dt, {3, 37, out});
        const TensorView bv = b.view(), dbv = db.view();
        cuda::linearGelu(ctx, dx.view(), dw.view(), withBias ? &dbv : nullptr, y.view(),
                         pre.view());
        cpu::linearGelu(x.view(), w.view(), withBias ? &bv : nullptr, wantY.view(),
                        wantPre.view());
        expectClose("pre", pre.download(), wantPre);
        expectClose("y", y.download(), wantY, std::max(relTol(dt), 1e-4));
      }
  Host x = randomHost(rng, DType::BF16, {19, 40}), w = randomHost(rng, DType::BF16, {24, 40});
  Host b = randomHost(rng, DType::F32, {24});
  Dev dx(x), dw(w), db(b), y = poisonedDev(DType::BF16, {19, 24}),
      pre = poisonedDev(DType::BF16, {19, 24});
  Host wantY = poisonedHost(DType::BF16, {19, 24}), wantPre = poisonedHost(DType::BF16, {19, 24});
  const TensorView bv = b.view(), dbv = db.view();
  cuda::linearGelu(ctx, dx.view(), dw.view(), &dbv, y.view(), pre.view());
  cpu::linearGelu(x.view(), w.view(), &bv, wantY.view(), wantPre.view());
  expectClose("fallback pre", pre.download(), wantPre);
  expectClose("fallback y", y.download(), wantY);
}

// y = addend + x wᵀ as one GEMM with the addend as cuBLASLt's C, against the CPU (the product
// rounded first, then the sum: one rounding of the dtype apart for bf16/f16): into another
// tensor and into the addend itself, output widths that are and are not multiples of 8 (C
// staged), an addend off the 16-byte alignment of y (staged from the addend), and mixed
// dtypes (the unfused fallback).
TEST_F(CudaKernelsTest, LinearAddMatchesCpu) {
  for (DType dt : kFloatTypes)
    for (int64_t out : {int64_t(256), int64_t(129)}) {
      SCOPED_TRACE(std::string(name(dt)) + " out " + std::to_string(out));
      Host x = randomHost(rng, dt, {3, 37, 64}), w = randomHost(rng, dt, {out, 64});
      Host addend = randomHost(rng, dt, {3, 37, out});
      Dev dx(x), dw(w), dadd(addend), inPlace(addend), y = poisonedDev(dt, {3, 37, out});
      Host want = poisonedHost(dt, {3, 37, out});
      cuda::linearAdd(ctx, dx.view(), dw.view(), dadd.view(), y.view());
      cuda::linearAdd(ctx, dx.view(), dw.view(), inPlace.view(), inPlace.view());
      cpu::linearAdd(x.view(), w.view(), addend.view(), want.view());
      Host got = y.download();
      expectClose("y", got, want, std::max(relTol(dt), 1e-4));
      expectSameBytes("in place", inPlace.download(), got);
      expectSameBytes("addend kept", dadd.download(), addend);
    }
  // An addend starting 2 elements into its buffer: rows 4 bytes off y's alignment.
  Host x = randomHost(rng, DType::F32, {16, 32}), w = randomHost(rng, DType::F32, {64, 32});
  Host addend = randomHost(rng, DType::F32, {16 * 64 + 2});
  Dev dx(x), dw(w), dadd(addend), y = poisonedDev(DType::F32, {16, 64});
  TensorView shifted{static_cast<char *>(dadd.view().data) + 8, DType::F32, {16, 64}};
  TensorView hostShifted{static_cast<char *>(addend.view().data) + 8, DType::F32, {16, 64}};
  Host want = poisonedHost(DType::F32, {16, 64});
  cuda::linearAdd(ctx, dx.view(), dw.view(), shifted, y.view());
  cpu::linearAdd(x.view(), w.view(), hostShifted, want.view());
  expectClose("unaligned addend", y.download(), want, 1e-5);
  Host xb = randomHost(rng, DType::BF16, {19, 40}), wb = randomHost(rng, DType::BF16, {24, 40});
  Host af = randomHost(rng, DType::F32, {19, 24});
  Dev dxb(xb), dwb(wb), daf(af), yb = poisonedDev(DType::BF16, {19, 24});
  Host wantB = poisonedHost(DType::BF16, {19, 24});
  cuda::linearAdd(ctx, dxb.view(), dwb.view(), daf.view(), yb.view());
  cpu::linearAdd(xb.view(), wb.view(), af.view(), wantB.view());
  expectClose("fallback", yb.download(), wantB);
}

// acc += dyᵀ x as one GEMM with beta = 1, against the CPU (which forms the product in fp32
// and adds it once, as the GEMM does): f32 accumulators with every operand dtype, a bf16
// accumulator (direct for bf16 operands, through a scratch product for f32 ones), and
// deterministic: the same call twice from the same accumulator gives the same bytes.
TEST_F(CudaKernelsTest, LinearGradWeightAccumulateMatchesCpu) {
  for (DType dt : kFloatTypes)
    for (DType at : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(name(dt)) + " into " + name(at));
      Host dy = randomHost(rng, dt, {4, 50, 72}), x = randomHost(rng, dt, {4, 50, 33});
      Host acc = randomHost(rng, at, {72, 33});
      Dev ddy(dy), dxx(x), dacc(acc), dacc2(acc);
      cuda::linearGradWeightAccumulate(ctx, ddy.view(), dxx.view(), dacc.view());
      cuda::linearGradWeightAccumulate(ctx, ddy.view(), dxx.view(), dacc2.view());
      cpu::linearGradWeightAccumulate(dy.view(), x.view(), acc.view());
      Host got = dacc.download();
      expectClose("acc", got, acc, at == DType::F32 ? 1e-5 : relTol(at));
      expectSameBytes("repeat", dacc2.download(), got);
    }
}

} // namespace

#endif // BONSAI_HAVE_CUDA
