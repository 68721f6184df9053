//===- ElementwiseInterpreter.h - Elementwise programs run on the device --===//
//
// Private to runtime/cuda: the device interpreter GeneratedKernels falls back on for a
// generated kernel without PTX (a plan compiled for the CPU). See ElementwiseInterpreter.cu.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CUDA_ELEMENTWISEINTERPRETER_H
#define BONSAI_RUNTIME_CUDA_ELEMENTWISEINTERPRETER_H

#include "bonsai/runtime/CudaKernels.h"

#include <cstdint>

namespace bonsai::rt::cuda::detail {

/// The most inputs, outputs and registers an interpreted program may have: the operands
/// travel by value as a kernel parameter, the registers live in each thread's local memory.
constexpr int kMaxInterpretedInputs = 32;
constexpr int kMaxInterpretedOutputs = 16;
constexpr int kMaxInterpretedRegisters = 256;

/// One instruction as the device reads it (ElementwiseInstruction, packed).
struct DeviceInstruction {
  uint8_t opcode;
  uint8_t type;
  uint16_t a;
  uint16_t b;
  float imm;
};

/// The tensors of one launch and the program's shape, passed by value.
struct InterpreterOperands {
  const void *inputs[kMaxInterpretedInputs];
  int64_t inputNumel[kMaxInterpretedInputs];
  DType inputTypes[kMaxInterpretedInputs];
  void *outputs[kMaxInterpretedOutputs];
  DType outputTypes[kMaxInterpretedOutputs];
  uint16_t outputRegisters[kMaxInterpretedOutputs];
  int numInputs;
  int numOutputs;
  int numInstructions;
};

/// Runs the program `code` (device memory) over `n` elements on `stream`, with at most
/// `maxBlocks` blocks; checks the launch.
void launchInterpreter(const InterpreterOperands &operands, const DeviceInstruction *code,
                       int64_t n, int maxBlocks, Stream stream);

} // namespace bonsai::rt::cuda::detail

#endif // BONSAI_RUNTIME_CUDA_ELEMENTWISEINTERPRETER_H
