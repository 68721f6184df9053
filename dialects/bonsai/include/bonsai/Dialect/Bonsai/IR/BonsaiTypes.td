//===- BonsaiTypes.td - bonsai types and type constraints ----*- tablegen -*-===//
//
// The NF4 element type and the tensor constraints every bonsai op is written against.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAITYPES_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAITYPES_TD

include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.td"
include "bonsai/Dialect/Plan/IR/PlanTypeInterfaces.td"
include "mlir/IR/BuiltinTypeInterfaces.td"
include "mlir/IR/BuiltinTypes.td"
include "mlir/IR/CommonTypeConstraints.td"

class Bonsai_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<Bonsai_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def Bonsai_NF4Type : Bonsai_Type<"NF4", "nf4", [MemRefElementTypeInterface,
    Plan_PackedElementTypeInterface]> {
  let summary = "4-bit NormalFloat element with double-quantized block scales";
  let description = [{
    The element type of a QLoRA-quantized tensor. Each element is one of the 16 NormalFloat
    levels; every `block_size` consecutive elements share an absmax scale. With double
    quantization the absmax scales are themselves stored as 8-bit values, with one fp32 scale per
    `double_quant_block` absmax values and one fp32 offset per tensor. With the defaults (64, 256)
    a tensor costs 4 + 8/64 + 32/(64*256) = 4.127 bits per element. The byte layout (codes,
    absmax codes, padding to 4 bytes, scales, offset) is the runtime's (runtime/include/bonsai/
    runtime/Nf4.h, docs/quantization.md); buffers of NF4 memrefs take getStorageBytes bytes.

    ```mlir
    tensor<4096x4096x!bonsai.nf4<64, 256>>
    ```
  }];
  let parameters = (ins "unsigned":$blockSize, "unsigned":$doubleQuantBlockSize);
  let assemblyFormat = "`<` $blockSize `,` $doubleQuantBlockSize `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Bytes needed to store `numElements` elements: packed 4-bit codes, 8-bit absmax per block,
    /// zero padding to a multiple of 4 bytes, an fp32 scale per double-quantization block and
    /// one fp32 offset (the runtime's NF4 layout).
    uint64_t getStorageBytes(uint64_t numElements) const;
  }];
}

/// Element types a bonsai tensor may hold.
def Bonsai_FloatElement : AnyTypeOf<[BF16, F16, F32, F8E4M3FN, F8E5M2]>;
def Bonsai_ComputeFloatElement : AnyTypeOf<[BF16, F16, F32]>;
def Bonsai_IndexElement : AnyTypeOf<[I32, I64]>;
def Bonsai_NF4Element : Type<CPred<"::llvm::isa<::mlir::bonsai::NF4Type>($_self)">,
                              "NF4 element">;
/// Raw bytes: one rank's share of a packed (NF4) tensor's storage (bonsai-shard).
def Bonsai_ByteElement : UI<8>;

/// A statically shaped tensor with no zero-sized dimension: an empty tensor in a training graph
/// is always a bug, and kernels and cost formulas divide by dimensions.
class Bonsai_TensorOf<list<Type> allowed>
    : ConfinedType<StaticShapeTensorOf<allowed>,
                   [CPred<"::mlir::bonsai::hasNoZeroSizedDims($_self)">],
                   "non-empty " # StaticShapeTensorOf<allowed>.summary>;

def Bonsai_Tensor : Bonsai_TensorOf<[BF16, F16, F32, F8E4M3FN, F8E5M2, I32, I64,
                                     Bonsai_NF4Element, Bonsai_ByteElement]>;
def Bonsai_FloatTensor : Bonsai_TensorOf<[BF16, F16, F32, F8E4M3FN, F8E5M2]>;
def Bonsai_ComputeTensor : Bonsai_TensorOf<[BF16, F16, F32]>;
def Bonsai_IndexTensor : Bonsai_TensorOf<[I32, I64]>;
def Bonsai_NF4Tensor : Bonsai_TensorOf<[Bonsai_NF4Element]>;
def Bonsai_LossTensor : 0DTensorOf<[F32]>;

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAITYPES_TD
