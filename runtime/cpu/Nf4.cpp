//===- Nf4.cpp - NF4 quantization, dequantization and the Dequantize kernel ===//
//
// The reference implementation of the NF4 format of Nf4.h. Every rounding step is spelled out
// in fp32 (or exactly in double) so that the NumPy reference (test/reference/nf4.py) gives the
// same bytes: nearest levels are found by comparing fl32(x / a) with the exact midpoints of
// consecutive levels, which is "nearest level, ties to the lower index" without the rounding
// of a computed distance. Blocks are independent, so both directions run on several threads
// with results that do not depend on the split.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Nf4.h"

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Tensor.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace bonsai::rt {

namespace {

/// Midpoints of consecutive levels, exact in double (two floats' sum and half are exact).
struct Midpoints {
  double m[15];
  constexpr Midpoints() : m() {
    for (int i = 0; i < 15; ++i)
      m[i] = (double(kNf4Levels[i]) + double(kNf4Levels[i + 1])) / 2;
  }
};
constexpr Midpoints kMidpoints;

/// The code of the level nearest to `v`: the number of midpoints strictly below it.
inline uint8_t nearestCode(float v) {
  double d = v;
  uint8_t code = 0;
  while (code < 15 && kMidpoints.m[code] < d)
    ++code;
  return code;
}

/// Blocks per parallel work item: enough to amortise a thread, and whole bytes of codes
/// (block sizes are even, so blocks start on byte boundaries).
constexpr int64_t kBlockGrain = 256;

} // namespace

void quantizeNf4(const float *x, uint64_t numel, uint64_t blockSize, uint64_t doubleBlockSize,
                 uint8_t *out) {
  Nf4Layout l = nf4Layout(numel, blockSize, doubleBlockSize);
  if (blockSize % 2 != 0)
    throw Error("NF4 block size must be even (blocks start on whole bytes of codes), got " +
                std::to_string(blockSize));
  std::memset(out, 0, size_t(l.bytes));
  std::vector<float> absmax(size_t(l.numBlocks));
  // Level codes and each block's absmax.
  cpu::detail::parallelFor(int64_t(l.numBlocks), kBlockGrain, [&](int64_t b0, int64_t b1) {
    for (int64_t k = b0; k < b1; ++k) {
      uint64_t begin = uint64_t(k) * blockSize, end = std::min(begin + blockSize, numel);
      float a = 0;
      for (uint64_t i = begin; i < end; ++i) {
        if (!std::isfinite(x[i]))
          throw Error("NF4 quantization: element " + std::to_string(i) + " is not finite (" +
                      std::to_string(x[i]) + ")");
        a = std::max(a, std::fabs(x[i]));
      }
      absmax[size_t(k)] = a;
      for (uint64_t i = begin; i < end; ++i) {
        uint8_t code = a == 0 ? kNf4ZeroCode : nearestCode(x[i] / a);
        out[i / 2] |= uint8_t(i % 2 == 0 ? code << 4 : code);
      }
    }
  });

  // Double quantization of the absmax values around their mean.
  double sum = 0;
  for (float a : absmax)
    sum += double(a);
  float offset = l.numBlocks ? float(sum / double(l.numBlocks)) : 0.0f;
  uint8_t *q = out + l.absmaxOffset;
  for (uint64_t j = 0; j < l.numGroups; ++j) {
    uint64_t begin = j * doubleBlockSize, end = std::min(begin + doubleBlockSize, l.numBlocks);
    float s = 0;
    for (uint64_t k = begin; k < end; ++k)
      s = std::max(s, std::fabs(absmax[k] - offset));
    if (s == 0)
      s = 1;
    for (uint64_t k = begin; k < end; ++k) {
      float centered = absmax[k] - offset;
      float ratio = centered / s;
      float scaled = ratio * 127.0f;
      auto code = int8_t(std::nearbyint(scaled));
      std::memcpy(&q[k], &code, 1);
    }
    std::memcpy(out + l.scalesOffset + 4 * j, &s, 4);
  }
  std::memcpy(out + l.offsetOffset, &offset, 4);
}

float nf4BlockScale(const uint8_t *storage, const Nf4Layout &l, uint64_t block) {
  int8_t q;
  std::memcpy(&q, storage + l.absmaxOffset + block, 1);
  float s, offset;
  std::memcpy(&s, storage + l.scalesOffset + 4 * (block / l.doubleBlockSize), 4);
  std::memcpy(&offset, storage + l.offsetOffset, 4);
  float unit = float(q) / 127.0f;
  float scaled = unit * s;
  return scaled + offset;
}

namespace {

/// Dequantizes blocks in parallel; `store(i, value)` writes element i.
template <typename Store>
void dequantizeBlocks(const uint8_t *storage, uint64_t numel, uint64_t blockSize,
                      uint64_t doubleBlockSize, Store store) {
  Nf4Layout l = nf4Layout(numel, blockSize, doubleBlockSize);
  cpu::detail::parallelFor(int64_t(l.numBlocks), kBlockGrain, [&](int64_t b0, int64_t b1) {
    for (int64_t k = b0; k < b1; ++k) {
      float a = nf4BlockScale(storage, l, uint64_t(k));
      uint64_t begin = uint64_t(k) * blockSize, end = std::min(begin + blockSize, numel);
      for (uint64_t i = begin; i < end; ++i) {
        uint8_t byte = storage[i / 2];
        uint8_t code = i % 2 == 0 ? byte >> 4 : byte & 0xf;
        store(i, kNf4Levels[code] * a);
      }
    }
  });
}

} // namespace

void dequantizeNf4(const uint8_t *storage, uint64_t numel, uint64_t blockSize,
                   uint64_t doubleBlockSize, float *out) {
  dequantizeBlocks(storage, numel, blockSize, doubleBlockSize,
                   [&](uint64_t i, float v) { out[i] = v; });
}

void dequantizeNf4Bf16(const uint8_t *storage, uint64_t numel, uint64_t blockSize,
                       uint64_t doubleBlockSize, uint16_t *out) {
  dequantizeBlocks(storage, numel, blockSize, doubleBlockSize,
                   [&](uint64_t i, float v) { out[i] = f32ToBf16(v); });
}

namespace cpu {

void dequantize(const TensorView &q, const TensorView &y) {
  using namespace detail;
  checkView("dequantize", "q", q);
  checkFloat("dequantize", "y", y);
  if (q.dtype != DType::NF4)
    fail("dequantize", std::string("q must be nf4, got ") + dtypeName(q.dtype));
  checkSameShape("dequantize", "y", y, "q", q);
  uint64_t n = uint64_t(y.numel());
  const auto *storage = static_cast<const uint8_t *>(q.data);
  if (y.dtype == DType::F32) {
    dequantizeNf4(storage, n, q.quantBlock, q.quantDoubleBlock, static_cast<float *>(y.data));
  } else if (y.dtype == DType::BF16) {
    dequantizeNf4Bf16(storage, n, q.quantBlock, q.quantDoubleBlock,
                      static_cast<uint16_t *>(y.data));
  } else {
    std::vector<float> values(static_cast<size_t>(n));
    dequantizeNf4(storage, n, q.quantBlock, q.quantDoubleBlock, values.data());
    storeF32(values.data(), y);
  }
}

} // namespace cpu

} // namespace bonsai::rt
