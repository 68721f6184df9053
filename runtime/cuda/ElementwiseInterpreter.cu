//===- ElementwiseInterpreter.cu - Elementwise programs run on the device -===//
//
// A plan compiled for the CPU carries its generated kernels as programs only (no PTX). So that
// such a plan still runs on a GPU, the CUDA backend interprets the programs there: one thread
// per element over a grid-stride loop, each thread holding the program's registers (f32, in
// local memory) and running the instructions as cpu::fusedElementwise does. It is a fallback:
// a plan compiled for the GPU runs its generated PTX instead, which keeps values in registers.
// exp, tanh and erf are CUDA's expf, tanhf and erff here.
//
//===----------------------------------------------------------------------===//

#include "ElementwiseInterpreter.h"

#include "CudaCheck.h"
#include "DeviceUtil.cuh"

#include <algorithm>

namespace bonsai::rt::cuda::detail {

namespace {

constexpr int kThreads = 256;

/// Bytes of an element of a float dtype (the loader admits no other in a program).
__device__ __forceinline__ int64_t elementBytes(DType t) { return t == DType::F32 ? 4 : 2; }

__global__ void __launch_bounds__(kThreads)
    interpretKernel(InterpreterOperands p, const DeviceInstruction *code, int64_t n) {
  float regs[kMaxInterpretedRegisters];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    for (int k = 0; k < p.numInputs; ++k) {
      int64_t m = p.inputNumel[k];
      const char *base = static_cast<const char *>(p.inputs[k]);
      int64_t at = m == n ? i : i % m;
      regs[k] = loadScalar(base + at * elementBytes(p.inputTypes[k]),
                           p.inputTypes[k]);
    }
    for (int s = 0; s < p.numInstructions; ++s) {
      DeviceInstruction inst = code[s];
      float a = regs[inst.a], b = regs[inst.b], y;
      switch (ElementwiseOpcode(inst.opcode)) {
      case ElementwiseOpcode::Constant:
        y = inst.imm;
        break;
      case ElementwiseOpcode::Extend:
        y = a;
        break;
      case ElementwiseOpcode::Truncate:
        y = DType(inst.type) == DType::BF16 ? __bfloat162float(__float2bfloat16_rn(a))
                                            : __half2float(__float2half_rn(a));
        break;
      case ElementwiseOpcode::Add:
        y = __fadd_rn(a, b);
        break;
      case ElementwiseOpcode::Sub:
        y = __fsub_rn(a, b);
        break;
      case ElementwiseOpcode::Mul:
        y = __fmul_rn(a, b);
        break;
      case ElementwiseOpcode::Div:
        y = __fdiv_rn(a, b);
        break;
      case ElementwiseOpcode::Neg:
        y = -a;
        break;
      case ElementwiseOpcode::Exp:
        y = expf(a);
        break;
      case ElementwiseOpcode::Tanh:
        y = tanhf(a);
        break;
      default: // Erf: the loader admits no other opcode.
        y = erff(a);
        break;
      }
      regs[p.numInputs + s] = y;
    }
    for (int j = 0; j < p.numOutputs; ++j) {
      char *base = static_cast<char *>(p.outputs[j]);
      storeScalar(base + i * elementBytes(p.outputTypes[j]), p.outputTypes[j],
                  regs[p.outputRegisters[j]]);
    }
  }
}

} // namespace

void launchInterpreter(const InterpreterOperands &operands, const DeviceInstruction *code,
                       int64_t n, int maxBlocks, Stream stream) {
  if (n == 0)
    return;
  int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, maxBlocks);
  interpretKernel<<<unsigned(blocks), kThreads, 0, stream>>>(operands, code, n);
  checkLaunch("fused_elementwise", "interpretKernel");
}

} // namespace bonsai::rt::cuda::detail
