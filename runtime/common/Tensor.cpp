//===- Tensor.cpp - Element types, exact f16 conversion and tensor loads --===//
//
// Sizes and names of the storage dtypes, the bit-exact IEEE half <-> f32 conversions (round to
// nearest even, subnormals, infinities and NaN), and the loads and stores through which every CPU
// kernel reads its operands as fp32 and writes its result. No MLIR, no LLVM.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Tensor.h"

#include "bonsai/runtime/Nf4.h"

#include <cstring>
#include <string>

namespace bonsai::rt {

namespace {

std::string unknownDType(DType dtype) { return "unknown dtype " + std::to_string(unsigned(dtype)); }

} // namespace

size_t dtypeSize(DType dtype) {
  switch (dtype) {
  case DType::F32:
  case DType::I32:
    return 4;
  case DType::F16:
  case DType::BF16:
    return 2;
  case DType::F8E4M3FN:
  case DType::F8E5M2:
  case DType::NF4:
  case DType::U8:
    return 1;
  case DType::I64:
    return 8;
  }
  // A dtype byte read from a plan or a checkpoint may hold anything.
  throw Error(unknownDType(dtype));
}

const char *dtypeName(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "f32";
  case DType::F16:
    return "f16";
  case DType::BF16:
    return "bf16";
  case DType::F8E4M3FN:
    return "f8_e4m3";
  case DType::F8E5M2:
    return "f8_e5m2";
  case DType::I32:
    return "i32";
  case DType::I64:
    return "i64";
  case DType::NF4:
    return "nf4";
  case DType::U8:
    return "u8";
  }
  return "unknown";
}

size_t TensorView::bytes() const {
  if (dtype == DType::NF4)
    return size_t(nf4StorageBytes(uint64_t(numel()), quantBlock, quantDoubleBlock));
  return size_t(numel()) * dtypeSize(dtype);
}

bool isComputeFloat(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16;
}

float f16ToF32(uint16_t bits) {
  uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t u;
  if (exponent == 0x1f) {
    // Infinity or NaN; the payload moves to the top of the f32 mantissa, so NaN stays NaN.
    u = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    u = sign;
  } else {
    // Subnormal: mantissa * 2^-24. Normalise so the leading one becomes the implicit bit.
    int shift = 0;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      ++shift;
    }
    // The value is 1.m * 2^(-14 - shift); f32 biased exponent 127 - 14 - shift.
    u = sign | (uint32_t(113 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    // NaN: keep the top payload bits and force the quiet bit so it cannot become infinity.
    return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  // 65520 is halfway between the largest half (65504, odd mantissa) and 65536: ties go up.
  if (a >= 0x477ff000u)
    return uint16_t(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    // Normal half: rebias the exponent (127 -> 15) and round the 13 dropped bits; a carry out
    // of the mantissa correctly bumps the exponent.
    uint32_t h = (a - 0x38000000u) >> 13;
    uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
      ++h;
    return uint16_t(sign | h);
  }
  // At most 2^-25 (halfway to the smallest subnormal, even side): zero.
  if (a <= 0x33000000u)
    return sign;
  // Subnormal half: the result is round(value * 2^24) = round(m * 2^(e - 126)) with m the
  // 24-bit significand; e is in [102, 112] here, so the shift is in [14, 24].
  uint32_t exponent = a >> 23;
  uint32_t significand = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - exponent;
  uint32_t h = significand >> shift;
  uint32_t rest = significand & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u)))
    ++h; // 0x3ff + 1 = 0x400 is the smallest normal, as it should be.
  return uint16_t(sign | h);
}

void loadF32(const TensorView &src, float *dst) {
  size_t n = size_t(src.numel());
  switch (src.dtype) {
  case DType::F32:
    if (n)
      std::memcpy(dst, src.data, n * 4);
    return;
  case DType::F16: {
    const auto *p = static_cast<const uint16_t *>(src.data);
    for (size_t i = 0; i < n; ++i)
      dst[i] = f16ToF32(p[i]);
    return;
  }
  case DType::BF16: {
    const auto *p = static_cast<const uint16_t *>(src.data);
    for (size_t i = 0; i < n; ++i)
      dst[i] = bf16ToF32(p[i]);
    return;
  }
  default:
    throw Error(std::string("loadF32: cannot load a ") + dtypeName(src.dtype) +
                " tensor of shape " + formatShape(src.shape) + " as f32");
  }
}

void storeF32(const float *src, const TensorView &dst) {
  size_t n = size_t(dst.numel());
  switch (dst.dtype) {
  case DType::F32:
    if (n)
      std::memcpy(dst.data, src, n * 4);
    return;
  case DType::F16: {
    auto *p = static_cast<uint16_t *>(dst.data);
    for (size_t i = 0; i < n; ++i)
      p[i] = f32ToF16(src[i]);
    return;
  }
  case DType::BF16: {
    auto *p = static_cast<uint16_t *>(dst.data);
    for (size_t i = 0; i < n; ++i)
      p[i] = f32ToBf16(src[i]);
    return;
  }
  default:
    throw Error(std::string("storeF32: cannot store f32 values into a ") + dtypeName(dst.dtype) +
                " tensor of shape " + formatShape(dst.shape));
  }
}

int64_t loadIndex(const TensorView &src, int64_t i) {
  switch (src.dtype) {
  case DType::I32: {
    int32_t v;
    std::memcpy(&v, static_cast<const char *>(src.data) + size_t(i) * 4, 4);
    return v;
  }
  case DType::I64: {
    int64_t v;
    std::memcpy(&v, static_cast<const char *>(src.data) + size_t(i) * 8, 8);
    return v;
  }
  default:
    throw Error(std::string("loadIndex: indices must be i32 or i64, not ") + dtypeName(src.dtype) +
                " (tensor of shape " + formatShape(src.shape) + ")");
  }
}

std::string formatShape(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

} // namespace bonsai::rt
