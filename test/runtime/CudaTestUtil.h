//===- CudaTestUtil.h - What the CUDA runtime tests share -------*- C++ -*-===//
//
// Whether a GPU is here (the CUDA tests skip with "no GPU here" when not: CI's
// machines have none) and the element count of a shape. Header-only, for the
// test files of bonsai-runtime-tests that call CUDA.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TEST_RUNTIME_CUDATESTUTIL_H
#define BONSAI_TEST_RUNTIME_CUDATESTUTIL_H

#include <cuda_runtime.h>
#include <cstdint>
#include <vector>

namespace bonsai::test {

/// True when a CUDA device is usable; asked once per process. On a machine
/// without a driver cudaGetDeviceCount fails, and its error is cleared so that
/// the next CUDA call does not report it as its own.
inline bool haveGpu() {
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

/// The number of elements of a tensor of this shape (1 for a scalar).
inline int64_t numelOf(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

} // namespace bonsai::test

/// Skips the current test when no GPU is here: the only reason a CUDA test skips.
#define BONSAI_SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                             \
    if (!::bonsai::test::haveGpu())                                                                \
      GTEST_SKIP() << "no GPU here";                                                               \
  } while (0)

#endif // BONSAI_TEST_RUNTIME_CUDATESTUTIL_H
