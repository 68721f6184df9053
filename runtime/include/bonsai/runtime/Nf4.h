//===- Nf4.h - NF4 quantization with double-quantized block scales --------===//
//
// QLoRA's 4-bit NormalFloat format as Bonsai stores it: the reference quantizer (run when
// frozen weights are bound) and dequantizer (the CPU Dequantize kernel, and what the CUDA
// kernel is tested against). The byte layout and the algorithm are a contract shared with the
// compiler (NF4Type::getStorageBytes), the NumPy reference (test/reference/nf4.py) and the
// CUDA kernels; docs/quantization.md describes them. No MLIR, no LLVM.
//
// N elements in row-major order, block size b, double-quantization block d;
// nb = ceil(N / b) blocks, nd = ceil(nb / d) groups of blocks. Bytes, in order:
//   codes[ceil(N / 2)]   element 2i in the high nibble, 2i + 1 in the low nibble
//   absmax[nb]           uint8: each block's absmax, 8-bit quantized (int8 two's complement)
//   zero padding         to a multiple of 4 bytes
//   scales[nd]           f32: each group's scale of the absmax codes
//   offset               f32: the mean of the absmax values, subtracted before quantizing them
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_NF4_H
#define BONSAI_RUNTIME_NF4_H

#include <cstddef>
#include <cstdint>

namespace bonsai::rt {

/// The 16 NormalFloat levels of QLoRA (bitsandbytes' NF4 table), ascending, 0 exact at 7.
inline constexpr float kNf4Levels[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f};

/// The code of 0.0, which an all-zero block gets.
inline constexpr uint8_t kNf4ZeroCode = 7;

/// Where each part of an NF4 tensor's storage starts, and its total size.
struct Nf4Layout {
  uint64_t numel = 0;
  uint64_t blockSize = 0;
  uint64_t doubleBlockSize = 0;
  uint64_t numBlocks = 0;     ///< nb = ceil(numel / blockSize)
  uint64_t numGroups = 0;     ///< nd = ceil(nb / doubleBlockSize)
  uint64_t absmaxOffset = 0;  ///< = ceil(numel / 2): the codes come first
  uint64_t scalesOffset = 0;  ///< absmaxOffset + nb, rounded up to a multiple of 4
  uint64_t offsetOffset = 0;  ///< scalesOffset + 4 nd: the f32 offset
  uint64_t bytes = 0;         ///< offsetOffset + 4
};

/// The layout of `numel` elements with blocks of `blockSize` and groups of `doubleBlockSize`
/// blocks. Throws rt::Error when either block size is 0.
Nf4Layout nf4Layout(uint64_t numel, uint64_t blockSize, uint64_t doubleBlockSize);

/// Bytes of the NF4 storage of `numel` elements (nf4Layout(...).bytes).
uint64_t nf4StorageBytes(uint64_t numel, uint64_t blockSize, uint64_t doubleBlockSize);

/// Quantizes `numel` floats into `out` (nf4StorageBytes bytes), deterministically:
/// block k's absmax a_k = max |x|; an element's code is the index of the level nearest to
/// fl32(x / a_k) (ties to the lower index; a_k = 0 gives the code of 0.0). Then
/// offset = fl32(sum_k a_k / nb) (the sum in double, left to right); for each group j,
/// s_j = max_k |fl32(a_k - offset)| (1 when 0) and q_k = rint(fl32(fl32(fl32(a_k - offset) /
/// s_j) * 127)) stored as int8. Non-finite inputs are an error (rt::Error naming the index).
void quantizeNf4(const float *x, uint64_t numel, uint64_t blockSize, uint64_t doubleBlockSize,
                 uint8_t *out);

/// Block k's absmax as the dequantizer sees it: fl32(fl32(fl32(q_k / 127) * s_j) + offset).
float nf4BlockScale(const uint8_t *storage, const Nf4Layout &layout, uint64_t block);

/// Dequantizes `numel` elements: x'_i = fl32(level[code_i] * a'_k), a'_k = nf4BlockScale.
void dequantizeNf4(const uint8_t *storage, uint64_t numel, uint64_t blockSize,
                   uint64_t doubleBlockSize, float *out);
/// The same, rounded to bf16 bits (round to nearest even).
void dequantizeNf4Bf16(const uint8_t *storage, uint64_t numel, uint64_t blockSize,
                       uint64_t doubleBlockSize, uint16_t *out);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_NF4_H
