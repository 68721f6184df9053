//===- Nf4Layout.cpp - Where the parts of an NF4 tensor lie in its bytes ---===//
//
// The byte layout of an NF4 tensor (Nf4.h): codes, absmax codes, group scales and the offset.
// Shared by the plan loader (tensor sizes), the CPU kernels and the CUDA kernels, so it lives
// in bonsai_common with the tensor helpers rather than with either backend.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Nf4.h"

#include "bonsai/runtime/Tensor.h"

#include <string>

namespace bonsai::rt {

Nf4Layout nf4Layout(uint64_t numel, uint64_t blockSize, uint64_t doubleBlockSize) {
  if (blockSize == 0 || doubleBlockSize == 0)
    throw Error("NF4 layout: block size " + std::to_string(blockSize) +
                " and double-quantization block " + std::to_string(doubleBlockSize) +
                " must both be positive");
  Nf4Layout l;
  l.numel = numel;
  l.blockSize = blockSize;
  l.doubleBlockSize = doubleBlockSize;
  l.numBlocks = (numel + blockSize - 1) / blockSize;
  l.numGroups = (l.numBlocks + doubleBlockSize - 1) / doubleBlockSize;
  l.absmaxOffset = (numel + 1) / 2;
  l.scalesOffset = (l.absmaxOffset + l.numBlocks + 3) / 4 * 4;
  l.offsetOffset = l.scalesOffset + 4 * l.numGroups;
  l.bytes = l.offsetOffset + 4;
  return l;
}

uint64_t nf4StorageBytes(uint64_t numel, uint64_t blockSize, uint64_t doubleBlockSize) {
  return nf4Layout(numel, blockSize, doubleBlockSize).bytes;
}

} // namespace bonsai::rt
