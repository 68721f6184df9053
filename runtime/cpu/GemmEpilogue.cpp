//===- GemmEpilogue.cpp - GEMMs with fused epilogues on the CPU -----------===//
//
// The CPU kernels of the `gemm-epilogue` fusion family (docs/fusion.md). The CPU is the
// reference: each runs the unfused kernels' arithmetic, so that a step compiled with the
// fusion gives the unfused step's losses and gradients bit for bit (for the accumulation, with
// f32 accumulators and gradients, which is what bonsai-optimizer creates for f32 models).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace bonsai::rt::cpu {

using namespace detail;

void linearGelu(const TensorView &x, const TensorView &w, const TensorView *bias,
                const TensorView &y, const TensorView &pre) {
  const char *k = "linear_gelu";
  checkFloat(k, "y", y);
  checkFloat(k, "pre", pre);
  checkSameShape(k, "y", y, "pre", pre);
  // linear checks x, w, bias and pre's shape.
  linear(x, w, bias, pre);
  gelu(pre, /*tanh=*/true, y);
}

void linearAdd(const TensorView &x, const TensorView &w, const TensorView &addend,
               const TensorView &y) {
  const char *k = "linear_add";
  checkFloat(k, "y", y);
  checkFloat(k, "addend", addend);
  checkSameShape(k, "y", y, "addend", addend);
  // linear checks x, w and the product's shape (y's); add checks the dtypes.
  std::vector<uint8_t> bytes(size_t(y.numel()) * dtypeSize(y.dtype));
  TensorView product{bytes.data(), y.dtype, y.shape};
  linear(x, w, nullptr, product);
  add(product, addend, y);
}

void linearGradWeightAccumulate(const TensorView &dy, const TensorView &x,
                                const TensorView &acc) {
  const char *k = "linear_grad_weight_accumulate";
  checkLinearGradWeight(k, dy, x, acc, "acc");
  // The product in fp32, then one fp32 addition per element: linear_grad_weight into an f32
  // tensor followed by accumulate, in the same order.
  std::vector<float> product(size_t(acc.numel()));
  TensorView dw{product.data(), DType::F32, acc.shape};
  linearGradWeight(dy, x, dw);
  accumulate(dw, acc);
}

} // namespace bonsai::rt::cpu
