//===- BonsaiDialect.td - The bonsai training-graph dialect --*- tablegen -*-===//
//
// The `bonsai` dialect describes a model's forward pass, its loss and the training recipe that
// the compiler applies to it. Tensors are ranked and statically shaped: batch and sequence length
// are compile-time constants, so every later pass can plan memory exactly.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIDIALECT_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIDIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Bonsai_Dialect : Dialect {
  let name = "bonsai";
  let cppNamespace = "::mlir::bonsai";
  let summary = "Training graphs and training recipes for large language models";
  let description = [{
    The `bonsai` dialect holds a model written as a function from token ids (and labels) to a
    scalar loss, with its parameters declared by `bonsai.param` under their Hugging Face checkpoint
    names, and a `bonsai.recipe` whose directives say which compiler passes to apply (NF4
    quantization, LoRA/DoRA, GaLore, FP8, sharding, offload, ring attention, rematerialization).
  }];
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  // Fused elementwise regions (bonsai.fused_elementwise) are written in arith and math.
  let dependentDialects = ["::mlir::func::FuncDialect", "::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect"];
  let extraClassDeclaration = [{
    /// `bonsai.phase`: "backward" on the ops of the backward pass (bonsai-autodiff),
    /// "update" on those of the optimizer step (bonsai-optimizer); a pass that replaces such
    /// an op gives its replacement the same phase. Forward ops have none.
    static constexpr ::llvm::StringLiteral getPhaseAttrName() { return "bonsai.phase"; }
    /// `bonsai.recomputed`: on the clones of forward ops that bonsai-remat makes for the
    /// backward pass.
    static constexpr ::llvm::StringLiteral getRecomputedAttrName() {
      return "bonsai.recomputed";
    }
    /// `bonsai.remat_searched`: on a function whose recompute set bonsai-remat's policy
    /// "auto" searches for, and on its trial copies; fusion families whose rewrite a
    /// recompute set would undo leave such a function alone.
    static constexpr ::llvm::StringLiteral getRematSearchedAttrName() {
      return "bonsai.remat_searched";
    }
  }];
}

class Bonsai_Op<string mnemonic, list<Trait> traits = []>
    : Op<Bonsai_Dialect, mnemonic, traits>;

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIDIALECT_TD
