//===- Fp8Test.cpp - E4M3FN and E5M2 conversions against an exhaustive search ---===//
//
// The reference here does not share the converter's arithmetic: it decodes all 256 codes from
// the bit fields by the formats' definitions and, for an input, searches them for the nearest
// finite value (a tie going to the even code, whose last mantissa bit is 0), saturating beyond
// the largest. Inputs: every code's value, every midpoint between neighbouring values and the
// f32 numbers on either side of it, the specials, and random f32 numbers over the whole range.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace bonsai::rt::fp8;

namespace {

/// The value of `code` from its fields (sign, exponent, mantissa), written independently of
/// fp8::decode: E4M3FN has bias 7 and no infinity (S.1111.111 is NaN); E5M2 has bias 15 and
/// IEEE infinities and NaNs in exponent field 31.
double fieldValue(uint8_t code, Format format) {
  bool e4m3 = format == Format::E4M3FN;
  int exponentBits = e4m3 ? 4 : 5, mantissaBits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  int mantissa = code & ((1 << mantissaBits) - 1);
  int exponent = (code >> mantissaBits) & ((1 << exponentBits) - 1);
  double sign = (code & 0x80) ? -1.0 : 1.0;
  if (e4m3 && exponent == 15 && mantissa == 7)
    return std::numeric_limits<double>::quiet_NaN();
  if (!e4m3 && exponent == 31)
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  double fraction = double(mantissa) / double(1 << mantissaBits);
  if (exponent == 0)
    return sign * fraction * std::pow(2.0, 1 - bias);
  return sign * (1.0 + fraction) * std::pow(2.0, exponent - bias);
}

/// The correctly rounded, saturating code of `x` by search over every finite code.
uint8_t searchEncode(float x, Format format) {
  uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x))
    return sign | 0x7F;
  double a = std::fabs(double(x)), largest = 0.0;
  int largestCode = 0;
  for (int c = 0; c < 128; ++c) {
    double v = fieldValue(uint8_t(c), format);
    if (std::isfinite(v) && v > largest) {
      largest = v;
      largestCode = c;
    }
  }
  if (a > largest)
    return sign | uint8_t(largestCode);
  int best = -1;
  double bestDistance = 0.0;
  for (int c = 0; c < 128; ++c) {
    double v = fieldValue(uint8_t(c), format);
    if (!std::isfinite(v))
      continue;
    double d = std::fabs(v - a);
    if (best < 0 || d < bestDistance || (d == bestDistance && (c & 1) == 0)) {
      best = c;
      bestDistance = d;
    }
  }
  return sign | uint8_t(best);
}

std::string hex(uint8_t code) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02x", unsigned(code));
  return text;
}

void expectEncodesLikeSearch(float x, Format format) {
  uint8_t got = encode(x, format), want = searchEncode(x, format);
  // Every NaN becomes the code 0x7F (a NaN in both formats).
  if (std::isnan(x)) {
    EXPECT_EQ(got, 0x7F) << formatName(format) << " NaN";
    EXPECT_TRUE(std::isnan(decode(got, format))) << formatName(format) << " NaN";
    return;
  }
  EXPECT_EQ(got, want) << formatName(format) << " " << std::hexfloat << x << " -> " << hex(got)
                       << ", correctly rounded " << hex(want);
}

class Fp8Test : public ::testing::TestWithParam<Format> {};

TEST_P(Fp8Test, DecodeMatchesTheFieldDefinition) {
  Format format = GetParam();
  for (int c = 0; c < 256; ++c) {
    double want = fieldValue(uint8_t(c), format);
    float got = decode(uint8_t(c), format);
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got)) << hex(uint8_t(c));
    else
      EXPECT_EQ(double(got), want) << hex(uint8_t(c));
  }
}

TEST_P(Fp8Test, Constants) {
  Format format = GetParam();
  bool e4m3 = format == Format::E4M3FN;
  EXPECT_EQ(maxFinite(format), e4m3 ? 448.0f : 57344.0f);
  EXPECT_EQ(minSubnormal(format), e4m3 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, -16));
  EXPECT_EQ(decode(e4m3 ? 0x7E : 0x7B, format), maxFinite(format));
  EXPECT_EQ(decode(0x01, format), minSubnormal(format));
  EXPECT_EQ(decode(0x80, format), 0.0f);
  EXPECT_TRUE(std::signbit(decode(0x80, format)));
}

TEST_P(Fp8Test, EveryValueRoundTrips) {
  Format format = GetParam();
  for (int c = 0; c < 256; ++c) {
    float v = decode(uint8_t(c), format);
    if (!std::isfinite(v))
      continue;
    EXPECT_EQ(encode(v, format), uint8_t(c)) << hex(uint8_t(c)) << " = " << v;
  }
}

TEST_P(Fp8Test, MidpointsAndNeighboursRoundCorrectly) {
  Format format = GetParam();
  std::vector<float> values;
  for (int c = 0; c < 128; ++c) {
    float v = decode(uint8_t(c), format);
    if (std::isfinite(v))
      values.push_back(v);
  }
  std::sort(values.begin(), values.end());
  // Past the largest value: the midpoint to where the next value would be, and beyond.
  float largest = values.back(), step = largest - values[values.size() - 2];
  values.push_back(largest + step);
  int checked = 0;
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    float mid = (values[i] + values[i + 1]) / 2.0f; // exact: 8-bit values have room in f32
    for (float x : {values[i], mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      expectEncodesLikeSearch(x, format);
      expectEncodesLikeSearch(-x, format);
      checked += 2;
    }
  }
  EXPECT_GT(checked, 400);
}

TEST_P(Fp8Test, SpecialsSaturateOrStay) {
  Format format = GetParam();
  float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(), maxFinite(format) * 1.0001f,
                  minSubnormal(format) / 2.0f, minSubnormal(format) * 0.5001f,
                  std::numeric_limits<float>::quiet_NaN()})
    expectEncodesLikeSearch(x, format);
  EXPECT_EQ(roundTrip(inf, format), maxFinite(format));
  EXPECT_EQ(roundTrip(-1e30f, format), -maxFinite(format));
  EXPECT_TRUE(std::isnan(roundTrip(NAN, format)));
  // Half the smallest subnormal is a tie with zero: to the even code, zero.
  EXPECT_EQ(roundTrip(minSubnormal(format) / 2.0f, format), 0.0f);
}

TEST_P(Fp8Test, RandomInputsRoundCorrectly) {
  Format format = GetParam();
  std::mt19937 rng(format == Format::E4M3FN ? 7 : 8);
  // Log-uniform magnitudes from well below the smallest subnormal to well above the largest.
  std::uniform_real_distribution<float> exponent(-24.0f, 20.0f);
  std::bernoulli_distribution negative(0.5);
  for (int i = 0; i < 100000; ++i) {
    float x = std::exp2(exponent(rng));
    expectEncodesLikeSearch(negative(rng) ? -x : x, format);
    if (HasFailure())
      return;
  }
}

TEST_P(Fp8Test, ScaledCastCountsUnderflowsAndSaturations) {
  Format format = GetParam();
  float tiny = minSubnormal(format) / 4.0f; // rounds to zero
  std::vector<float> x = {1.0f, -2.0f, tiny, -tiny, 0.0f, 1e9f, -1e9f, NAN, 0.5f};
  std::vector<uint8_t> codes(x.size());
  CastStats stats = castScaled(x.data(), int64_t(x.size()), 1.0f, format, codes.data());
  EXPECT_EQ(stats.count, 9);
  EXPECT_EQ(stats.underflows, 2);   // ±tiny; an exact zero is not an underflow
  EXPECT_EQ(stats.saturations, 2);  // ±1e9
  EXPECT_EQ(stats.amax, 1e9f);      // NaN ignored
  EXPECT_EQ(decode(codes[0], format), 1.0f);
  EXPECT_EQ(decode(codes[5], format), maxFinite(format));
  EXPECT_TRUE(std::isnan(decode(codes[7], format)));
  // The scale applies before the cast: 0.5 · 2^-12 underflows in E4M3FN, not in E5M2.
  CastStats scaled = castScaled(&x[8], 1, std::ldexp(1.0f, -12), format, codes.data());
  EXPECT_EQ(scaled.underflows, format == Format::E4M3FN ? 1 : 0);
  EXPECT_EQ(scaled.amax, 0.5f);
}

TEST_P(Fp8Test, DelayedScaleFromTheHistory) {
  Format format = GetParam();
  float top = maxFinite(format);
  std::vector<float> history(4, 0.0f);
  // Nothing recorded yet: the previous scale stays.
  EXPECT_EQ(delayedScale(history.data(), 4, 1.0f, format, 0), 1.0f);
  recordAmax(history.data(), 4, 0, 3.0f);
  recordAmax(history.data(), 4, 1, 12.0f);
  recordAmax(history.data(), 4, 2, 6.0f);
  EXPECT_FLOAT_EQ(delayedScale(history.data(), 4, 1.0f, format, 0), top / 12.0f);
  EXPECT_FLOAT_EQ(delayedScale(history.data(), 4, 1.0f, format, 2), top / 12.0f / 4.0f);
  // Step 5 overwrites entry 1 (the ring): the 12 is forgotten.
  recordAmax(history.data(), 4, 5, 2.0f);
  EXPECT_EQ(history, (std::vector<float>{3.0f, 2.0f, 6.0f, 0.0f}));
  EXPECT_FLOAT_EQ(delayedScale(history.data(), 4, 1.0f, format, 0), top / 6.0f);
  // An overflowed step keeps the previous scale rather than casting everything to zero.
  recordAmax(history.data(), 4, 6, INFINITY);
  EXPECT_EQ(delayedScale(history.data(), 4, 0.5f, format, 0), 0.5f);
}

TEST_P(Fp8Test, GemmOfScaledCastsApproximatesTheProduct) {
  Format format = GetParam();
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  const int64_t m = 7, n = 9, k = 48;
  std::vector<float> a(m * k), b(k * n);
  for (float &x : a)
    x = dist(rng);
  for (float &x : b)
    x = 30.0f * dist(rng);
  // Scales that map each tensor's amax to the top of the format, as delayed scaling aims for.
  std::vector<uint8_t> qa(a.size()), qb(b.size());
  float amaxA = castScaled(a.data(), m * k, 1.0f, format, qa.data()).amax;
  float amaxB = castScaled(b.data(), k * n, 1.0f, format, qb.data()).amax;
  float scaleA = maxFinite(format) / amaxA, scaleB = maxFinite(format) / amaxB;
  CastStats sa = castScaled(a.data(), m * k, scaleA, format, qa.data());
  CastStats sb = castScaled(b.data(), k * n, scaleB, format, qb.data());
  EXPECT_EQ(sa.saturations + sb.saturations, 0);
  std::vector<float> c(m * n);
  gemm(qa.data(), format, scaleA, qb.data(), format, scaleB, m, n, k, c.data());
  // Against the exact product of the decoded values (each FP8 product is exact in f32, so
  // only the f32 sum rounds), and against the unquantised product within FP8's relative
  // precision (2^-4 for E4M3FN, 2^-3 for E5M2, per operand) summed over k terms.
  double unit = format == Format::E4M3FN ? 0x1p-4 : 0x1p-3;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0.0, full = 0.0, bound = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        double x = double(decode(qa[i * k + p], format)) / scaleA;
        double y = double(decode(qb[p * n + j], format)) / scaleB;
        exact += x * y;
        full += double(a[i * k + p]) * double(b[p * n + j]);
        bound += std::fabs(double(a[i * k + p]) * double(b[p * n + j])) * 2.0 * unit +
                 std::ldexp(1.0, -20); // subnormal spacing after descaling
      }
      EXPECT_NEAR(c[i * n + j], exact, 1e-6 * (std::fabs(exact) + 1e-3)) << i << "," << j;
      EXPECT_NEAR(c[i * n + j], full, bound) << i << "," << j;
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test, ::testing::Values(Format::E4M3FN, Format::E5M2),
                         [](const ::testing::TestParamInfo<Format> &info) {
                           return std::string(formatName(info.param));
                         });

} // namespace
