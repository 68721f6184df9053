//===- Fp8.cpp - E4M3FN and E5M2 conversions on the CPU -------------------===//
//
// See Fp8.h. The conversion works in double, where every step is exact: the scaling by a power
// of two, and the one rounding, std::nearbyint in the default round-to-nearest-even mode, of
// the input to a multiple of the quantum (the spacing of the format's values in the input's
// binade, or the subnormal spacing below the smallest normal value).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace bonsai::rt::fp8 {

namespace {

/// The magnitude code of the largest finite value: 0x7E (E4M3FN's 0x7F is NaN) or 0x7B
/// (E5M2's exponent field 31 holds the infinities and NaNs).
uint8_t maxCode(Format format) { return format == Format::E4M3FN ? 0x7E : 0x7B; }

} // namespace

const char *formatName(Format format) { return format == Format::E4M3FN ? "e4m3fn" : "e5m2"; }

int mantissaBits(Format format) { return format == Format::E4M3FN ? 3 : 2; }

int exponentBias(Format format) { return format == Format::E4M3FN ? 7 : 15; }

float minSubnormal(Format format) {
  return std::ldexp(1.0f, 1 - exponentBias(format) - mantissaBits(format));
}

float decode(uint8_t code, Format format) {
  const int m = mantissaBits(format), bias = exponentBias(format);
  const bool negative = code & 0x80;
  const int magnitude = code & 0x7F, field = magnitude >> m, mantissa = magnitude & ((1 << m) - 1);
  double value;
  if (format == Format::E4M3FN && magnitude == 0x7F)
    value = std::numeric_limits<double>::quiet_NaN();
  else if (format == Format::E5M2 && field == 31)
    value = mantissa == 0 ? std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::quiet_NaN();
  else if (field == 0) // subnormal: mantissa · 2^(1 - bias - m)
    value = std::ldexp(double(mantissa), 1 - bias - m);
  else
    value = std::ldexp(double((1 << m) + mantissa), field - bias - m);
  return float(negative ? -value : value);
}

uint8_t encode(float x, Format format) {
  // NaN: the one code 0x7F, whatever the sign, as the hardware conversion writes it (a NaN's
  // sign survives arithmetic differently on CPUs and GPUs, so it cannot be part of the result).
  if (std::isnan(x))
    return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(double(x));
  if (a >= double(maxFinite(format)))
    return sign | maxCode(format); // saturate, infinities included
  if (a == 0.0)
    return sign;
  const int m = mantissaBits(format), bias = exponentBias(format);
  int e = 0;
  std::frexp(a, &e);
  const int exponent = e - 1;        // a in [2^exponent, 2^(exponent + 1))
  const int minExponent = 1 - bias;  // of the smallest normal value
  const int quantumExponent = std::max(exponent, minExponent) - m;
  // The one rounding: to a multiple of 2^quantumExponent, ties to even.
  auto steps = int64_t(std::nearbyint(std::ldexp(a, -quantumExponent)));
  int code;
  if (exponent < minExponent) {
    // Subnormal: steps in [0, 2^m]; 2^m is the smallest normal, whose code is the same number.
    code = int(steps);
  } else {
    int field = exponent + bias;
    if (steps == (int64_t(1) << (m + 1))) { // rounded up into the next binade
      ++field;
      steps = int64_t(1) << m;
    }
    code = (field << m) | int(steps - (int64_t(1) << m));
  }
  // Rounding up from just below the largest finite value cannot pass it (a < maxFinite, and
  // maxFinite is a representable value), but keep the invariant explicit.
  return sign | uint8_t(std::min(code, int(maxCode(format))));
}

CastStats castScaled(const float *x, int64_t count, float scale, Format format, uint8_t *codes) {
  CastStats stats;
  stats.count = count;
  const float limit = maxFinite(format);
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isnan(x[i]))
      stats.amax = std::max(stats.amax, std::fabs(x[i]));
    float y = x[i] * scale;
    codes[i] = encode(y, format);
    if (std::isnan(y))
      continue;
    if (std::fabs(y) > limit)
      ++stats.saturations;
    else if (y != 0.0f && (codes[i] & 0x7F) == 0)
      ++stats.underflows;
  }
  return stats;
}

float delayedScale(const float *history, int64_t length, float previousScale, Format format,
                   int margin) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < length; ++i) {
    finite = finite && std::isfinite(history[i]);
    amax = std::max(amax, history[i]);
  }
  if (!finite || !(amax > 0.0f))
    return previousScale;
  return float(double(maxFinite(format)) / double(amax) / std::ldexp(1.0, margin));
}

float currentScale(float amax, Format format, int margin) {
  return delayedScale(&amax, 1, 1.0f, format, margin);
}

void recordAmax(float *history, int64_t length, int64_t step, float amax) {
  history[step % length] = amax;
}

void gemm(const uint8_t *a, Format formatA, float scaleA, const uint8_t *b, Format formatB,
          float scaleB, int64_t m, int64_t n, int64_t k, float *c) {
  // Decode once: 256-entry tables.
  float tableA[256], tableB[256];
  for (int code = 0; code < 256; ++code) {
    tableA[code] = decode(uint8_t(code), formatA);
    tableB[code] = decode(uint8_t(code), formatB);
  }
  const float descale = float(1.0 / (double(scaleA) * double(scaleB)));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < k; ++p)
        sum += tableA[a[i * k + p]] * tableB[b[p * n + j]];
      c[i * n + j] = sum * descale;
    }
}

} // namespace bonsai::rt::fp8
