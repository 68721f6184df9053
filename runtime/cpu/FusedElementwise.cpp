//===- FusedElementwise.cpp - The interpreter of elementwise programs -----===//
//
// The CPU backend's FusedElementwise kernel: the plan's program (schema ElementwiseProgram,
// verified at load) runs instruction by instruction over chunks of elements, each register a
// chunk of f32 values, so that the interpretation costs one dispatch per instruction and
// chunk rather than per element. Chunks are independent and run on several threads; the
// result does not depend on the split. The arithmetic is the PTX kernels' (f32, rounding at
// Truncate and at stores), except exp, tanh and erf: the C library's here, polynomial
// approximations of a few ulp on the GPU (docs/fusion.md).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include "KernelUtil.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace bonsai::rt::cpu {

using namespace detail;

namespace {

/// Elements per chunk: every register of the program holds one chunk.
constexpr int64_t kChunk = 2048;

/// `v` rounded to `type` and widened back: the value a store to `type` keeps.
float roundTo(float v, DType type) {
  switch (type) {
  case DType::BF16:
    return bf16ToF32(f32ToBf16(v));
  case DType::F16:
    return f16ToF32(f32ToF16(v));
  default:
    return v;
  }
}

} // namespace

void fusedElementwise(const ElementwiseProgramInfo &program,
                      const std::vector<const TensorView *> &inputs,
                      const std::vector<const TensorView *> &outputs) {
  const char *k = "fused_elementwise";
  if (inputs.size() != program.inputs.size() || outputs.size() != program.outputs.size())
    fail(k, "the program has " + std::to_string(program.inputs.size()) + " inputs and " +
                std::to_string(program.outputs.size()) + " outputs, the kernel " +
                std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  if (outputs.empty())
    fail(k, "no outputs");
  int64_t n = outputs[0]->numel();
  for (size_t j = 0; j < outputs.size(); ++j) {
    checkFloat(k, "output", *outputs[j]);
    if (outputs[j]->numel() != n)
      fail(k, "output " + std::to_string(j) + " has " + std::to_string(outputs[j]->numel()) +
                  " elements, output 0 has " + std::to_string(n));
  }
  // Inputs smaller than the outputs (broadcast) are converted whole, once; the others chunk
  // by chunk.
  std::vector<std::vector<float>> whole(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkFloat(k, "input", *inputs[i]);
    int64_t m = inputs[i]->numel();
    if (m < 1 || n % m != 0)
      fail(k, "input " + std::to_string(i) + " has " + std::to_string(m) +
                  " elements, which do not divide the outputs' " + std::to_string(n));
    if (m != n) {
      whole[i].resize(size_t(m));
      loadF32(*inputs[i], whole[i].data());
    }
  }

  size_t numInputs = inputs.size();
  size_t numRegisters = numInputs + program.instructions.size();
  int64_t chunks = (n + kChunk - 1) / kChunk;
  parallelFor(chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> registers(numRegisters * size_t(kChunk));
    auto reg = [&](size_t r) { return registers.data() + r * size_t(kChunk); };
    for (int64_t c = c0; c < c1; ++c) {
      int64_t offset = c * kChunk, count = std::min(kChunk, n - offset);
      // Every input chunk is read before any output chunk is written (in-place outputs).
      for (size_t i = 0; i < numInputs; ++i) {
        float *dst = reg(i);
        if (whole[i].empty()) {
          loadF32(subView(*inputs[i], offset, count), dst);
          continue;
        }
        int64_t m = int64_t(whole[i].size());
        for (int64_t e = 0; e < count; ++e)
          dst[e] = whole[i][size_t((offset + e) % m)];
      }
      for (size_t s = 0; s < program.instructions.size(); ++s) {
        const ElementwiseInstruction &inst = program.instructions[s];
        float *y = reg(numInputs + s);
        const float *a = reg(inst.a), *b = reg(inst.b);
        switch (inst.opcode) {
        case ElementwiseOpcode::Constant:
          std::fill(y, y + count, inst.imm);
          break;
        case ElementwiseOpcode::Extend:
          std::copy(a, a + count, y);
          break;
        case ElementwiseOpcode::Truncate:
          for (int64_t e = 0; e < count; ++e)
            y[e] = roundTo(a[e], inst.type);
          break;
        case ElementwiseOpcode::Add:
          for (int64_t e = 0; e < count; ++e)
            y[e] = a[e] + b[e];
          break;
        case ElementwiseOpcode::Sub:
          for (int64_t e = 0; e < count; ++e)
            y[e] = a[e] - b[e];
          break;
        case ElementwiseOpcode::Mul:
          for (int64_t e = 0; e < count; ++e)
            y[e] = a[e] * b[e];
          break;
        case ElementwiseOpcode::Div:
          for (int64_t e = 0; e < count; ++e)
            y[e] = a[e] / b[e];
          break;
        case ElementwiseOpcode::Neg:
          for (int64_t e = 0; e < count; ++e)
            y[e] = -a[e];
          break;
        case ElementwiseOpcode::Exp:
          for (int64_t e = 0; e < count; ++e)
            y[e] = std::exp(a[e]);
          break;
        case ElementwiseOpcode::Tanh:
          for (int64_t e = 0; e < count; ++e)
            y[e] = std::tanh(a[e]);
          break;
        case ElementwiseOpcode::Erf:
          for (int64_t e = 0; e < count; ++e)
            y[e] = std::erf(a[e]);
          break;
        }
      }
      for (size_t j = 0; j < outputs.size(); ++j)
        storeF32(reg(program.outputs[j]), subView(*outputs[j], offset, count));
    }
  });
}

} // namespace bonsai::rt::cpu
