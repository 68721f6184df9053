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

} // namespace

#endif // BONSAI_HAVE_CUDA
