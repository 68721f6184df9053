//===- ElementwiseKernels.h - Code generation for fused elementwise ops -*- C++ -*-===//
//
// A bonsai.fused_elementwise region becomes two things: a portable program (a register
// machine over f32 values that the CPU backend interprets and the plan carries for every
// target) and, for a GPU target, a PTX kernel generated through upstream MLIR (gpu -> nvvm ->
// LLVM's NVPTX backend). Both compute the same scalar ops; docs/fusion.md ("Generated
// elementwise kernels") describes the program and the kernels' numerics.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_CONVERSION_ELEMENTWISEKERNELS_H
#define BONSAI_CONVERSION_ELEMENTWISEKERNELS_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <optional>
#include <string>

namespace mlir {
class DialectRegistry;
namespace bonsai {
class FusedElementwiseOp;

/// Instructions of an elementwise program; the values are those of the plan schema's
/// ElementwiseOpcode (runtime/schema/plan.fbs).
enum class ElementwiseOpcode : uint8_t {
  Constant = 0, ///< `imm`, f32.
  Extend = 1,   ///< a (bf16 or f16) as f32: exact.
  Truncate = 2, ///< a (f32) rounded to nearest even into `type` (bf16 or f16).
  Add = 3,      ///< a + b, f32.
  Sub = 4,      ///< a - b, f32.
  Mul = 5,      ///< a * b, f32.
  Div = 6,      ///< a / b, f32.
  Neg = 7,      ///< -a, f32.
  Exp = 8,      ///< e^a, f32.
  Tanh = 9,     ///< tanh(a), f32.
  Erf = 10,     ///< erf(a), f32.
};
/// The largest opcode.
constexpr unsigned kMaxElementwiseOpcode = unsigned(ElementwiseOpcode::Erf);

/// Element types of program values; the values are those of the plan schema's DType.
enum class ElementwiseType : uint8_t { F32 = 0, F16 = 1, BF16 = 2 };

/// One instruction: defines the next register from registers `a` and `b` (those it reads).
struct ElementwiseInstruction {
  ElementwiseOpcode opcode = ElementwiseOpcode::Constant;
  ElementwiseType type = ElementwiseType::F32; ///< The type of the value it defines.
  uint16_t a = 0;
  uint16_t b = 0;
  float imm = 0; ///< Constant only.
};

/// A straight-line program computing one element of every output. Registers 0 .. inputs-1
/// hold the inputs' elements (of `inputs[i]`), register inputs+k the value instruction k
/// defines; output j is register `outputs[j]`.
struct ElementwiseProgram {
  SmallVector<ElementwiseType> inputs;
  SmallVector<ElementwiseInstruction> instructions;
  SmallVector<uint16_t> outputs;

  /// The program as the fused op records it (its `program` attribute): input count, input
  /// types, instruction count, (opcode, type, a, b, bits of imm) per instruction, output
  /// count, output registers.
  DenseI32ArrayAttr encode(MLIRContext *context) const;
  /// The program `encode` produced, or none (with `error` saying why) when `attr` is not one.
  static std::optional<ElementwiseProgram> decode(DenseI32ArrayAttr attr, std::string &error);
};

/// Builds the program of `op`'s region; emits an error on `op` and fails for an op the
/// program cannot express.
FailureOr<ElementwiseProgram> buildElementwiseProgram(FusedElementwiseOp op);

/// Generates the PTX of one kernel named `name` for `arch` ("sm_90") computing `op`: one
/// thread per element in a grid-stride loop, parameters (in order) a pointer per input, a
/// pointer per output, and the element count (i64). Emits an error on `op` and fails when a
/// step of the upstream pipeline fails.
FailureOr<std::string> generateElementwisePTX(FusedElementwiseOp op, StringRef name,
                                              StringRef arch);

/// Registers what generateElementwisePTX needs in a context: the gpu, nvvm and llvm
/// dialects, their conversions to LLVM and the NVVM target.
void registerElementwiseCodegenDialects(DialectRegistry &registry);

} // namespace bonsai
} // namespace mlir

#endif // BONSAI_CONVERSION_ELEMENTWISEKERNELS_H
