//===- TensorTest.cpp - Tests of dtypes, f16/bf16 conversion and loads ----===//
//
// Unit tests of runtime/src/Tensor.cpp: dtype sizes and names, the f16 <-> f32 conversions over
// every 16-bit pattern and every rounding tie, the header's bf16 conversions likewise, and
// loadF32/storeF32/loadIndex/formatShape, including the errors they throw for other dtypes.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace bonsai::rt;

namespace {

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool isF16NaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
bool isBf16NaN(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

/// The value of IEEE half bits by the textbook formula, independent of the implementation.
double f16Value(uint16_t h) {
  int sign = h & 0x8000 ? -1 : 1;
  int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  if (exponent == 0x1f)
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0)
    return sign * std::ldexp(double(mantissa), -24);
  return sign * std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
}

std::string messageOf(const std::function<void()> &fn) {
  try {
    fn();
  } catch (const Error &e) {
    return e.what();
  }
  return "<no rt::Error thrown>";
}

} // namespace

TEST(TensorTest, DTypeSizesNamesAndComputeFloats) {
  EXPECT_EQ(dtypeSize(DType::F32), 4u);
  EXPECT_EQ(dtypeSize(DType::F16), 2u);
  EXPECT_EQ(dtypeSize(DType::BF16), 2u);
  EXPECT_EQ(dtypeSize(DType::F8E4M3FN), 1u);
  EXPECT_EQ(dtypeSize(DType::F8E5M2), 1u);
  EXPECT_EQ(dtypeSize(DType::I32), 4u);
  EXPECT_EQ(dtypeSize(DType::I64), 8u);
  EXPECT_THROW(dtypeSize(DType(42)), Error);
  EXPECT_STREQ(dtypeName(DType::F32), "f32");
  EXPECT_STREQ(dtypeName(DType::F16), "f16");
  EXPECT_STREQ(dtypeName(DType::BF16), "bf16");
  EXPECT_STREQ(dtypeName(DType::F8E4M3FN), "f8_e4m3");
  EXPECT_STREQ(dtypeName(DType::F8E5M2), "f8_e5m2");
  EXPECT_STREQ(dtypeName(DType::I32), "i32");
  EXPECT_STREQ(dtypeName(DType::I64), "i64");
  EXPECT_TRUE(isComputeFloat(DType::F32));
  EXPECT_TRUE(isComputeFloat(DType::F16));
  EXPECT_TRUE(isComputeFloat(DType::BF16));
  EXPECT_FALSE(isComputeFloat(DType::F8E4M3FN));
  EXPECT_FALSE(isComputeFloat(DType::F8E5M2));
  EXPECT_FALSE(isComputeFloat(DType::I32));
  EXPECT_FALSE(isComputeFloat(DType::I64));
}

TEST(TensorTest, F16ToF32IsExactForEveryBitPattern) {
  int failures = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = uint16_t(b);
    float got = f16ToF32(h);
    double want = f16Value(h);
    bool ok = std::isnan(want) ? std::isnan(got) && std::signbit(got) == bool(h & 0x8000)
                               : double(got) == want && std::signbit(got) == bool(h & 0x8000);
#ifdef __FLT16_MAX__
    // The compiler's own conversion is a second, independent oracle.
    _Float16 native;
    std::memcpy(&native, &h, 2);
    if (!std::isnan(want))
      ok = ok && bitsOf(got) == bitsOf(float(native));
#endif
    if (!ok && ++failures <= 10)
      ADD_FAILURE() << "f16ToF32(0x" << std::hex << b << ") = " << got << ", expected " << want;
  }
  EXPECT_EQ(failures, 0);
}

TEST(TensorTest, F16RoundTripsEveryBitPattern) {
  int failures = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = uint16_t(b);
    uint16_t back = f32ToF16(f16ToF32(h));
    bool ok = isF16NaN(h) ? isF16NaN(back) && (back & 0x8000) == (h & 0x8000) : back == h;
    if (!ok && ++failures <= 10)
      ADD_FAILURE() << "f16 0x" << std::hex << b << " came back as 0x" << back;
  }
  EXPECT_EQ(failures, 0);
}

TEST(TensorTest, F32ToF16RoundsEveryTieToEven) {
  // Between every pair of adjacent finite halves (subnormals included) the midpoint, exact in f32,
  // goes to the even one and its f32 neighbours to the nearer one.
  int failures = 0;
  for (uint16_t sign : {uint16_t(0), uint16_t(0x8000)}) {
    for (uint32_t lo = 0; lo < 0x7bff; ++lo) {
      uint16_t a = uint16_t(sign | lo), b = uint16_t(sign | (lo + 1));
      float mid = float((f16Value(a) + f16Value(b)) / 2);
      ASSERT_EQ(double(mid), (f16Value(a) + f16Value(b)) / 2);
      uint16_t even = (lo & 1) ? b : a;
      float towardA = std::nextafter(mid, float(f16Value(a)));
      float towardB = std::nextafter(mid, float(f16Value(b)));
      if (f32ToF16(mid) != even || f32ToF16(towardA) != a || f32ToF16(towardB) != b) {
        if (++failures <= 10)
          ADD_FAILURE() << "between 0x" << std::hex << a << " and 0x" << b << ": mid -> 0x"
                        << f32ToF16(mid) << ", below -> 0x" << f32ToF16(towardA) << ", above -> 0x"
                        << f32ToF16(towardB);
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(TensorTest, F32ToF16EdgesOverflowUnderflowInfNaN) {
  EXPECT_EQ(f32ToF16(65504.0f), 0x7bff);
  // 65520 is the tie between 65504 (odd mantissa) and 65536, which is infinity.
  EXPECT_EQ(f32ToF16(65520.0f), 0x7c00);
  EXPECT_EQ(f32ToF16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f32ToF16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32ToF16(1e30f), 0x7c00);
  EXPECT_EQ(f32ToF16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(f32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32ToF16(-std::numeric_limits<float>::infinity()), 0xfc00);
  // 2^-25 is the tie between 0 and the smallest subnormal 2^-24: zero is even.
  EXPECT_EQ(f32ToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32ToF16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(f32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32ToF16(std::ldexp(1.0f, -14)), 0x0400);
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(f32ToF16(std::nextafter(std::ldexp(1.0f, -14), 0.0f)), 0x0400);
  EXPECT_EQ(f32ToF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(f32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(f32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(f32ToF16(0.1f), 0x2e66);
  uint16_t nan = f32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(isF16NaN(nan)) << std::hex << nan;
  // A signalling NaN whose payload lives only in the low bits must not become infinity.
  uint16_t snan = f32ToF16(floatOf(0xff800001u));
  EXPECT_TRUE(isF16NaN(snan)) << std::hex << snan;
  EXPECT_EQ(snan & 0x8000, 0x8000);
}

#ifdef __FLT16_MAX__
TEST(TensorTest, F32ToF16MatchesTheCompilerOnRandomFloats) {
  std::mt19937 rng(1234);
  int failures = 0;
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns cover every exponent; clearing a few high exponent bits concentrates
    // half of them in and near the half range.
    uint32_t u = rng();
    if (i & 1)
      u = (u & 0x87ffffffu) | 0x30000000u;
    float f = floatOf(u);
    if (std::isnan(f))
      continue;
    _Float16 native = _Float16(f);
    uint16_t want;
    std::memcpy(&want, &native, 2);
    if (f32ToF16(f) != want && ++failures <= 10)
      ADD_FAILURE() << "f32ToF16(0x" << std::hex << u << ") = 0x" << f32ToF16(f)
                    << ", the compiler says 0x" << want;
  }
  EXPECT_EQ(failures, 0);
}
#endif

TEST(TensorTest, Bf16RoundTripsAndRoundsEveryTieToEven) {
  int failures = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    uint16_t h = uint16_t(b);
    uint16_t back = f32ToBf16(bf16ToF32(h));
    bool ok = isBf16NaN(h) ? isBf16NaN(back) : back == h;
    EXPECT_EQ(bitsOf(bf16ToF32(h)), uint32_t(h) << 16);
    // The midpoint to the next pattern (exact in f32) and its neighbours; stop below infinity.
    if ((h & 0x7fff) < 0x7f7f) {
      uint32_t mid = (uint32_t(h) << 16) | 0x8000u;
      uint16_t up = uint16_t(h + 1), even = (h & 1) ? up : h;
      ok = ok && f32ToBf16(floatOf(mid)) == even && f32ToBf16(floatOf(mid - 1)) == h &&
           f32ToBf16(floatOf(mid + 1)) == up;
    }
    if (!ok && ++failures <= 10)
      ADD_FAILURE() << "bf16 0x" << std::hex << b;
  }
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(f32ToBf16(floatOf(0x7f7f8000u)), 0x7f80); // the tie above the largest: infinity
  EXPECT_TRUE(isBf16NaN(f32ToBf16(floatOf(0x7f800001u))));
}

TEST(TensorTest, LoadAndStoreConvertEachFloatDType) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-300.0f, 300.0f);
  std::vector<float> values(37);
  for (float &v : values)
    v = dist(rng);
  values[3] = 1e-6f;    // a half subnormal
  values[4] = 70000.0f; // beyond the half range: infinity

  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtypeName(dtype));
    std::vector<uint8_t> storage(values.size() * dtypeSize(dtype), 0xcd);
    TensorView view{storage.data(), dtype, {int64_t(values.size())}};
    storeF32(values.data(), view);
    std::vector<float> back(values.size(), std::numeric_limits<float>::quiet_NaN());
    loadF32(view, back.data());
    for (size_t i = 0; i < values.size(); ++i) {
      float want;
      if (dtype == DType::F32) {
        want = values[i];
        EXPECT_EQ(std::memcmp(&storage[i * 4], &values[i], 4), 0) << i;
      } else if (dtype == DType::F16) {
        uint16_t bits;
        std::memcpy(&bits, &storage[i * 2], 2);
        EXPECT_EQ(bits, f32ToF16(values[i])) << i;
        want = float(f16Value(f32ToF16(values[i])));
      } else {
        uint16_t bits;
        std::memcpy(&bits, &storage[i * 2], 2);
        EXPECT_EQ(bits, f32ToBf16(values[i])) << i;
        want = bf16ToF32(f32ToBf16(values[i]));
      }
      EXPECT_EQ(bitsOf(back[i]), bitsOf(want)) << i;
    }
  }
}

TEST(TensorTest, LoadAndStoreRejectNonComputeDTypesByName) {
  std::vector<uint8_t> storage(64);
  float buffer[4] = {1, 2, 3, 4};
  for (DType dtype : {DType::I32, DType::I64, DType::F8E4M3FN, DType::F8E5M2}) {
    TensorView view{storage.data(), dtype, {2, 2}};
    std::string name = dtypeName(dtype);
    EXPECT_NE(messageOf([&] { loadF32(view, buffer); }).find(name), std::string::npos) << name;
    EXPECT_NE(messageOf([&] { storeF32(buffer, view); }).find(name), std::string::npos) << name;
  }
}

TEST(TensorTest, LoadIndexReadsI32AndI64) {
  std::vector<int32_t> i32 = {7, -100, 2147483647, -2147483647 - 1};
  std::vector<int64_t> i64 = {5, -100, int64_t(1) << 40, -(int64_t(1) << 50)};
  TensorView v32{i32.data(), DType::I32, {4}};
  TensorView v64{i64.data(), DType::I64, {2, 2}};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(loadIndex(v32, i), i32[size_t(i)]);
    EXPECT_EQ(loadIndex(v64, i), i64[size_t(i)]);
  }
  float f[1] = {1.0f};
  TensorView vf{f, DType::F32, {1}};
  EXPECT_NE(messageOf([&] { loadIndex(vf, 0); }).find("f32"), std::string::npos);
}

TEST(TensorTest, FormatShape) {
  EXPECT_EQ(formatShape({2, 64, 64}), "[2, 64, 64]");
  EXPECT_EQ(formatShape({7}), "[7]");
  EXPECT_EQ(formatShape({}), "[]");
  EXPECT_EQ(formatShape({0, -1}), "[0, -1]");
}

TEST(TensorTest, ViewNumelRankDimAndBytes) {
  TensorView v{nullptr, DType::BF16, {3, 5, 7}};
  EXPECT_EQ(v.numel(), 105);
  EXPECT_EQ(v.rank(), 3);
  EXPECT_EQ(v.dim(-1), 7);
  EXPECT_EQ(v.dim(0), 3);
  EXPECT_EQ(v.bytes(), 210u);
  TensorView scalar{nullptr, DType::F32, {}};
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.bytes(), 4u);
}
