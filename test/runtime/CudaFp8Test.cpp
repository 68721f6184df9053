//===- CudaFp8Test.cpp - CUDA FP8 casts and delayed scaling against the CPU ===//
//
// cuda::castToFp8 against fp8::encode / fp8::castScaled, code for code and counter for counter:
// every bf16 bit pattern (normals, subnormals, zeros, infinities, NaNs) under scales that put
// values in E4M3FN's and E5M2's normal, subnormal, underflow and saturation ranges; random f32
// and f16 tensors; vector and unaligned (scalar) paths; statistics accumulated over two casts.
// cuda::updateDelayedScale against fp8::recordAmax + fp8::delayedScale over steps that wrap the
// history, including a first step whose amax is zero (the scale is kept). Outputs are poisoned
// before each call. Without a GPU every test skips.
//
//===----------------------------------------------------------------------===//

#ifdef BONSAI_HAVE_CUDA

#include "bonsai/runtime/CudaFp8.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace bonsai::rt;
namespace fp8 = bonsai::rt::fp8;
namespace cuda = bonsai::rt::cuda;

namespace {

void cudaOk(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

bool haveGpu() {
  static const bool have = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return count > 0;
  }();
  return have;
}

/// Device memory freed at scope exit.
struct DeviceBuffer {
  void *ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { cudaOk(cudaMalloc(&ptr, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  template <typename T> T *as() const { return static_cast<T *>(ptr); }
};

float bf16ToFloat(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float halfToFloat(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  float value;
  if (exponent == 0)
    value = std::ldexp(float(mantissa), -24);
  else if (exponent == 31)
    value = mantissa ? NAN : INFINITY;
  else
    value = std::ldexp(float(1024 + mantissa), exponent - 25);
  return sign ? -value : value;
}

/// Casts `count` elements of storage `dtype` (raw bits in `host`, their f32 values in
/// `values`) on the GPU at element offset `offset` (an unaligned offset takes the scalar path)
/// and compares codes and statistics with the CPU reference; the statistics are accumulated
/// over two identical casts to check that they add.
void expectCastMatches(DType dtype, const std::vector<uint8_t> &host,
                       const std::vector<float> &values, int64_t offset, float scale,
                       fp8::Format format, const std::string &what) {
  const int64_t count = int64_t(values.size());
  const size_t elem = dtypeSize(dtype);
  DeviceBuffer in((count + offset) * elem), out(count + offset), scaleBuf(sizeof(float)),
      stats(sizeof(cuda::Fp8CastStats));
  cudaOk(cudaMemcpy(in.as<uint8_t>() + offset * elem, host.data(), count * elem,
                    cudaMemcpyHostToDevice),
         "cudaMemcpy");
  cudaOk(cudaMemcpy(scaleBuf.ptr, &scale, sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  cudaOk(cudaMemset(out.ptr, 0xA5, count + offset), "cudaMemset");
  cudaOk(cudaMemset(stats.ptr, 0, sizeof(cuda::Fp8CastStats)), "cudaMemset");

  TensorView x{in.as<uint8_t>() + offset * elem, dtype, {count}};
  DType outType = format == fp8::Format::E4M3FN ? DType::F8E4M3FN : DType::F8E5M2;
  TensorView y{out.as<uint8_t>() + offset, outType, {count}};
  cuda::Context ctx;
  auto *devStats = stats.as<cuda::Fp8CastStats>();
  cuda::castToFp8(ctx, x, scaleBuf.as<float>(), y, devStats);
  cuda::castToFp8(ctx, x, scaleBuf.as<float>(), y, devStats);
  cudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  std::vector<uint8_t> codes(count), expected(count);
  cuda::Fp8CastStats got;
  cudaOk(cudaMemcpy(codes.data(), y.data, count, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaOk(cudaMemcpy(&got, devStats, sizeof(got), cudaMemcpyDeviceToHost), "cudaMemcpy");
  fp8::CastStats want = fp8::castScaled(values.data(), count, scale, format, expected.data());

  int64_t mismatches = 0;
  for (int64_t i = 0; i < count; ++i)
    if (codes[i] != expected[i] && mismatches++ < 5)
      ADD_FAILURE() << what << ": element " << i << " = " << values[i] << " * " << scale
                    << " gave code 0x" << std::hex << int(codes[i]) << ", expected 0x"
                    << int(expected[i]) << std::dec;
  EXPECT_EQ(mismatches, 0) << what;
  EXPECT_EQ(got.count, 2ull * uint64_t(want.count)) << what;
  EXPECT_EQ(got.underflows, 2ull * uint64_t(want.underflows)) << what;
  EXPECT_EQ(got.saturations, 2ull * uint64_t(want.saturations)) << what;
  float amax;
  std::memcpy(&amax, &got.amaxBits, 4);
  EXPECT_EQ(amax, want.amax) << what;
}

const fp8::Format kFormats[] = {fp8::Format::E4M3FN, fp8::Format::E5M2};

TEST(CudaFp8Test, EveryBf16PatternMatchesTheCpu) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  std::vector<uint8_t> host(65536 * 2);
  std::vector<float> values(65536);
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    uint16_t b = uint16_t(bits);
    std::memcpy(&host[bits * 2], &b, 2);
    values[bits] = bf16ToFloat(b);
  }
  // 1: as is; 2^-20 and 2^20: most values underflow or saturate; 0.37: inexact scaling.
  for (fp8::Format format : kFormats)
    for (float scale : {1.0f, 0.37f, std::ldexp(1.0f, -20), std::ldexp(1.0f, 20)})
      for (int64_t offset : {0, 1})
        expectCastMatches(DType::BF16, host, values, offset, scale, format,
                          std::string("bf16 ") + fp8::formatName(format) + " scale " +
                              std::to_string(scale) + " offset " + std::to_string(offset));
}

TEST(CudaFp8Test, RandomF32AndF16MatchTheCpu) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  std::mt19937 rng(20261130);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t count = 100003; // not a multiple of any vector width
  std::vector<float> f32(count);
  for (float &v : f32)
    v = normal(rng) * std::exp2(float(int(rng() % 40) - 20));
  f32[7] = NAN;
  f32[8] = -INFINITY;
  f32[9] = -0.0f;
  std::vector<uint8_t> f32Raw(count * 4);
  std::memcpy(f32Raw.data(), f32.data(), count * 4);

  std::vector<uint8_t> f16Raw(count * 2);
  std::vector<float> f16(count);
  for (int64_t i = 0; i < count; ++i) {
    uint16_t h = uint16_t(rng());
    std::memcpy(&f16Raw[i * 2], &h, 2);
    f16[i] = halfToFloat(h);
  }
  for (fp8::Format format : kFormats)
    for (int64_t offset : {0, 3}) {
      std::string tail = std::string(" ") + fp8::formatName(format) + " offset " +
                         std::to_string(offset);
      expectCastMatches(DType::F32, f32Raw, f32, offset, 3.0f, format, "f32" + tail);
      expectCastMatches(DType::F16, f16Raw, f16, offset, 0.25f, format, "f16" + tail);
    }
}

TEST(CudaFp8Test, BadOperandsThrow) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  DeviceBuffer a(64), b(64);
  cuda::Context ctx;
  TensorView x{a.ptr, DType::F32, {4}};
  TensorView wrongType{b.ptr, DType::BF16, {4}};
  TensorView wrongShape{b.ptr, DType::F8E4M3FN, {5}};
  EXPECT_THROW(cuda::castToFp8(ctx, x, nullptr, wrongType, nullptr), Error);
  EXPECT_THROW(cuda::castToFp8(ctx, x, nullptr, wrongShape, nullptr), Error);
  EXPECT_THROW(cuda::updateDelayedScale(ctx, nullptr, nullptr, 4, nullptr, nullptr, nullptr,
                                        fp8::Format::E4M3FN, 0),
               Error);
}

TEST(CudaFp8Test, DelayedScaleMatchesTheCpu) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  const int64_t length = 4;
  const float amaxes[] = {0.0f, 3.5f, 0.02f, 700.0f, 1.0f, 0.5f, 0.25f, 1e-3f};
  for (fp8::Format format : kFormats)
    for (int margin : {0, 2}) {
      std::vector<float> history(length, 0.0f);
      float scale = 1.0f;
      DeviceBuffer dHistory(length * 4), dStats(sizeof(cuda::Fp8CastStats)), dStep(8),
          dScale(4), dDescale(4);
      cudaOk(cudaMemcpy(dHistory.ptr, history.data(), length * 4, cudaMemcpyHostToDevice),
             "cudaMemcpy");
      cudaOk(cudaMemcpy(dScale.ptr, &scale, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
      cuda::Context ctx;
      for (int64_t step = 0; step < int64_t(std::size(amaxes)); ++step) {
        cuda::Fp8CastStats stats;
        std::memcpy(&stats.amaxBits, &amaxes[step], 4);
        cudaOk(cudaMemcpy(dStats.ptr, &stats, sizeof(stats), cudaMemcpyHostToDevice),
               "cudaMemcpy");
        cudaOk(cudaMemcpy(dStep.ptr, &step, 8, cudaMemcpyHostToDevice), "cudaMemcpy");
        cuda::updateDelayedScale(ctx, dStats.as<cuda::Fp8CastStats>(), dHistory.as<float>(),
                                 length, dStep.as<int64_t>(), dScale.as<float>(),
                                 dDescale.as<float>(), format, margin);
        fp8::recordAmax(history.data(), length, step, amaxes[step]);
        scale = fp8::delayedScale(history.data(), length, scale, format, margin);
        float got, gotDescale;
        cudaOk(cudaMemcpy(&got, dScale.ptr, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
        cudaOk(cudaMemcpy(&gotDescale, dDescale.ptr, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
        EXPECT_EQ(got, scale) << fp8::formatName(format) << " margin " << margin << " step "
                              << step;
        EXPECT_EQ(gotDescale, 1.0f / scale) << "step " << step;
      }
    }
}

/// Random finite FP8 codes (NaN codes and E5M2's infinities redrawn).
std::vector<uint8_t> randomCodes(int64_t count, fp8::Format format, std::mt19937 &rng) {
  std::vector<uint8_t> codes(count);
  for (uint8_t &c : codes)
    do
      c = uint8_t(rng());
    while (!std::isfinite(fp8::decode(c, format)));
  return codes;
}

TEST(CudaFp8Test, GemmMatchesTheCpuEmulation) {
  if (!haveGpu())
    GTEST_SKIP() << "no GPU here";
  int device = 0, major = 0, minor = 0;
  cudaOk(cudaGetDevice(&device), "cudaGetDevice");
  cudaOk(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "attr");
  cudaOk(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "attr");
  if (major * 10 + minor < 89)
    GTEST_SKIP() << "no FP8 tensor cores on sm_" << major << minor;
  std::mt19937 rng(7);
  cuda::Fp8GemmEngine engine;
  struct Case {
    int64_t m, n, k;
    fp8::Format fa, fb;
    DType out;
  };
  const Case cases[] = {
      {64, 48, 96, fp8::Format::E4M3FN, fp8::Format::E4M3FN, DType::F32},
      {80, 64, 256, fp8::Format::E4M3FN, fp8::Format::E5M2, DType::BF16},
      {33, 40, 64, fp8::Format::E5M2, fp8::Format::E4M3FN, DType::F32},
  };
  for (const Case &c : cases) {
    std::vector<uint8_t> a = randomCodes(c.m * c.k, c.fa, rng),
                         b = randomCodes(c.n * c.k, c.fb, rng);
    const float scaleA = 8.0f, scaleB = 0.5f;
    const float descale[2] = {1.0f / scaleA, 1.0f / scaleB};
    DeviceBuffer dA(a.size()), dB(b.size()), dD(c.m * c.n * 4), dDescale(8);
    cudaOk(cudaMemcpy(dA.ptr, a.data(), a.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    cudaOk(cudaMemcpy(dB.ptr, b.data(), b.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    cudaOk(cudaMemcpy(dDescale.ptr, descale, 8, cudaMemcpyHostToDevice), "cudaMemcpy");
    cudaOk(cudaMemset(dD.ptr, 0xFF, c.m * c.n * 4), "cudaMemset");
    auto type = [](fp8::Format f) {
      return f == fp8::Format::E4M3FN ? DType::F8E4M3FN : DType::F8E5M2;
    };
    TensorView va{dA.ptr, type(c.fa), {c.m, c.k}}, vb{dB.ptr, type(c.fb), {c.n, c.k}},
        vd{dD.ptr, c.out, {c.m, c.n}};
    engine.gemm(nullptr, va, dDescale.as<float>(), vb, dDescale.as<float>() + 1, vd);
    cudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

    // The CPU emulation takes B as [k, n].
    std::vector<uint8_t> bt(b.size());
    for (int64_t j = 0; j < c.n; ++j)
      for (int64_t p = 0; p < c.k; ++p)
        bt[p * c.n + j] = b[j * c.k + p];
    std::vector<float> want(c.m * c.n);
    fp8::gemm(a.data(), c.fa, scaleA, bt.data(), c.fb, scaleB, c.m, c.n, c.k, want.data());
    std::vector<float> got(c.m * c.n);
    if (c.out == DType::F32) {
      cudaOk(cudaMemcpy(got.data(), dD.ptr, c.m * c.n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    } else {
      std::vector<uint16_t> raw(c.m * c.n);
      cudaOk(cudaMemcpy(raw.data(), dD.ptr, c.m * c.n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (size_t i = 0; i < raw.size(); ++i)
        got[i] = bf16ToFloat(raw[i]);
    }
    // Each product is exact in fp32; only the summation order differs (fp32 relative 1e-5 of
    // the sum of |terms|), plus one bf16 rounding (2^-8 relative) for a bf16 output.
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double magnitude = 0.0;
        for (int64_t p = 0; p < c.k; ++p)
          magnitude += std::fabs(double(fp8::decode(a[i * c.k + p], c.fa)) *
                                 fp8::decode(b[j * c.k + p], c.fb));
        magnitude /= double(scaleA) * scaleB;
        const float w = want[i * c.n + j];
        const double tolerance = 1e-5 * magnitude +
                                 (c.out == DType::BF16 ? std::ldexp(std::fabs(w), -8) : 0.0);
        ASSERT_NEAR(got[i * c.n + j], w, tolerance + 1e-30)
            << "m=" << c.m << " n=" << c.n << " k=" << c.k << " at (" << i << ", " << j << ")";
      }
  }
  // Shapes FP8 tensor cores cannot take are errors that say why.
  DeviceBuffer small(64 * 64 * 4), descale(8);
  TensorView a{small.ptr, DType::F8E4M3FN, {8, 24}}, b{small.ptr, DType::F8E4M3FN, {8, 24}},
      d{small.ptr, DType::F32, {8, 8}};
  EXPECT_THROW(engine.gemm(nullptr, a, descale.as<float>(), b, descale.as<float>(), d), Error);
}

} // namespace

#endif // BONSAI_HAVE_CUDA
