//===- Tensor.h - Element types, tensor views and errors of the runtime ----===//
//
// The runtime's vocabulary: storage dtypes (numbered as in plan.fbs), exact bf16/f16 <-> f32
// conversion, a non-owning view of a tensor in an arena, and the error type every runtime
// failure is reported with. No MLIR, no LLVM.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_TENSOR_H
#define BONSAI_RUNTIME_TENSOR_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace bonsai::rt {

/// A runtime failure with a message that names the cause (file, tensor, kernel, offset).
class Error : public std::runtime_error {
public:
  explicit Error(const std::string &message) : std::runtime_error(message) {}
};

/// Storage element types; the values match bonsai.plan.DType in plan.fbs. NF4 is QLoRA's
/// 4-bit NormalFloat with double-quantized block scales (Nf4.h): its storage is a byte layout
/// whose size nf4StorageBytes gives, not a number of bytes per element.
enum class DType : uint8_t {
  F32 = 0,
  F16 = 1,
  BF16 = 2,
  F8E4M3FN = 3,
  F8E5M2 = 4,
  I32 = 5,
  I64 = 6,
  NF4 = 7,
  /// Raw bytes: one rank's share of a sharded NF4 tensor's storage (TensorInfo::nf4Share).
  U8 = 8
};

/// Bytes per element; 1 for NF4, whose storage is counted (and checkpointed) in bytes.
size_t dtypeSize(DType dtype);
/// "f32", "bf16", ... as in safetensors headers (F32, BF16, ...) lower-cased.
const char *dtypeName(DType dtype);
/// True for F32, F16, BF16 (the types kernels compute with in fp32).
bool isComputeFloat(DType dtype);

/// bf16 bits -> f32 (exact).
inline float bf16ToF32(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// f32 -> bf16 bits, round to nearest even; NaN stays NaN.
inline uint16_t f32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

/// IEEE half bits -> f32 (exact, subnormals included).
float f16ToF32(uint16_t bits);
/// f32 -> IEEE half bits, round to nearest even, overflow to infinity.
uint16_t f32ToF16(float f);

/// A non-owning view of a dense row-major tensor.
struct TensorView {
  void *data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  /// NF4 only: elements per block and blocks per double-quantization group.
  uint32_t quantBlock = 0;
  uint32_t quantDoubleBlock = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  int64_t rank() const { return int64_t(shape.size()); }
  /// Dimension `i`; negative counts from the back (-1 is the last).
  int64_t dim(int64_t i) const { return shape[i < 0 ? shape.size() + i : i]; }
  /// Bytes of storage: numel * dtypeSize, or the NF4 layout's size.
  size_t bytes() const;
};

/// Converts a F32/F16/BF16 tensor to `numel()` floats at `dst`.
void loadF32(const TensorView &src, float *dst);
/// Stores `numel()` floats into a F32/F16/BF16 tensor (rounding to nearest even).
void storeF32(const float *src, const TensorView &dst);
/// Reads index `i` of an I32/I64 tensor.
int64_t loadIndex(const TensorView &src, int64_t i);

/// "[2, 64, 64]".
std::string formatShape(const std::vector<int64_t> &shape);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_TENSOR_H
