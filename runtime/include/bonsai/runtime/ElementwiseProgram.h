//===- ElementwiseProgram.h - The programs of generated elementwise kernels -===//
//
// A plan's generated kernels (plan.fbs GeneratedKernel, docs/fusion.md) carry a small
// register program, verified by the plan loader (Plan.cpp) and then run by the CPU kernel
// (cpu::fusedElementwise) or, on a GPU, by the kernel's PTX or the interpreter. These types sit
// apart from Plan.h so that the kernels, which need them, do not depend on the plan loader.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_ELEMENTWISEPROGRAM_H
#define BONSAI_RUNTIME_ELEMENTWISEPROGRAM_H

#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace bonsai::rt {

/// Instructions of an elementwise program; values match bonsai.plan.ElementwiseOpcode.
enum class ElementwiseOpcode : uint8_t {
  Constant = 0, ///< imm (f32).
  Extend = 1,   ///< a (f16 or bf16) as f32.
  Truncate = 2, ///< a (f32) rounded to nearest even into the instruction's type.
  Add = 3,
  Sub = 4,
  Mul = 5,
  Div = 6,
  Neg = 7,
  Exp = 8,
  Tanh = 9,
  Erf = 10,
};

/// One verified instruction: defines the next register from registers `a` (and `b`, for
/// the binary opcodes), both below it.
struct ElementwiseInstruction {
  ElementwiseOpcode opcode = ElementwiseOpcode::Constant;
  DType type = DType::F32; ///< Of the value it defines.
  uint16_t a = 0;
  uint16_t b = 0;
  float imm = 0;
};

/// A verified elementwise program (plan.fbs ElementwiseProgram): registers 0 .. inputs-1 are
/// the input elements, register inputs.size() + k the value of instruction k, output j is
/// register outputs[j]. Every operand is defined before it is read and has the type its
/// opcode takes.
struct ElementwiseProgramInfo {
  std::vector<DType> inputs;
  std::vector<ElementwiseInstruction> instructions;
  std::vector<uint16_t> outputs;

  /// The type of register `r`.
  DType registerType(uint16_t r) const {
    return r < inputs.size() ? inputs[r] : instructions[r - inputs.size()].type;
  }
};

/// A verified generated kernel: its program always, its PTX in a plan for a GPU.
struct GeneratedKernelInfo {
  std::string name;
  ElementwiseProgramInfo program;
  std::string ptx;  ///< Empty in a CPU plan.
  std::string arch; ///< "sm_90": the PTX's target.
};

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_ELEMENTWISEPROGRAM_H
