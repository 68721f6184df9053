//===- BonsaiAttrs.td - bonsai attributes and enums ----------*- tablegen -*-===//
//
// Placement (where a tensor lives) and sharding (how it is split over ranks), plus the enums
// used by op and recipe attributes.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIATTRS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIATTRS_TD

include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.td"
include "mlir/IR/EnumAttr.td"

def Bonsai_MemorySpace : I32EnumAttr<"MemorySpace", "where a tensor is stored", [
    I32EnumAttrCase<"Device", 0, "device">,
    I32EnumAttrCase<"PinnedHost", 1, "pinned_host">]> {
  let cppNamespace = "::mlir::bonsai";
  let genSpecializedAttr = 0;
}

def Bonsai_PlacementAttr : EnumAttr<Bonsai_Dialect, Bonsai_MemorySpace, "placement"> {
  let summary = "memory space of a tensor: `device` or `pinned_host`";
  let assemblyFormat = "`<` $value `>`";
}

def Bonsai_GeluApproximation : I32EnumAttr<"GeluApproximation",
    "how gelu is evaluated", [
    I32EnumAttrCase<"None", 0, "none">,
    I32EnumAttrCase<"Tanh", 1, "tanh">]> {
  let cppNamespace = "::mlir::bonsai";
  let genSpecializedAttr = 0;
}

def Bonsai_GeluApproximationAttr
    : EnumAttr<Bonsai_Dialect, Bonsai_GeluApproximation, "gelu_approximation"> {
  let assemblyFormat = "`<` $value `>`";
}

class Bonsai_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Bonsai_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

def Bonsai_ShardingAttr : Bonsai_Attr<"Sharding", "sharding"> {
  let summary = "one rank's flat share of a tensor split over `ranks` ranks";
  let description = [{
    `#bonsai.sharding<ranks = 4, shape = [256, 64]>` on a value of type `tensor<4096xf32>` says
    that the value is one rank's contiguous quarter of the row-major flattened 256x64 tensor
    (ZeRO's flat partition, docs/sharding.md): rank r holds elements [r * 4096, (r + 1) * 4096).
    The whole tensor's element count must divide evenly by `ranks`. bonsai-shard sets it on
    the parameters and training state it shards.

    A tensor of a packed element type (`!bonsai.nf4`) is shared out by its storage bytes, the
    codes and the block constants alike: `storage` names the whole tensor's element type and
    the share is `tensor<B/ranks x ui8>`, B the storage bytes of the whole tensor, which must
    divide evenly by `ranks`:

    ```mlir
    #bonsai.sharding<ranks = 2, shape = [64, 64], storage = !bonsai.nf4<64, 256>>  // tensor<1046xui8>
    ```
  }];
  let parameters = (ins "int64_t":$ranks, ArrayRefParameter<"int64_t">:$shape,
                        OptionalParameter<"::mlir::Type">:$storage);
  let assemblyFormat =
      "`<` `ranks` `=` $ranks `,` `shape` `=` `[` $shape `]` (`,` `storage` `=` $storage^)? `>`";
  let builders = [
    AttrBuilder<(ins "int64_t":$ranks, "::llvm::ArrayRef<int64_t>":$shape), [{
      return $_get($_ctxt, ranks, shape, ::mlir::Type());
    }]>,
    AttrBuilder<(ins "int64_t":$ranks, "::llvm::ArrayRef<int64_t>":$shape,
                     "::mlir::Type":$storage), [{
      return $_get($_ctxt, ranks, shape, storage);
    }]>
  ];
  let skipDefaultBuilders = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The element count of the whole tensor.
    int64_t getNumElements() const;
    /// The type of one rank's share of a whole tensor of element type `element`: 1-D, of
    /// `element` itself, or bytes (ui8) of the storage of a packed `storage` type.
    ::mlir::RankedTensorType getShardType(::mlir::Type element) const;
  }];
}

/// The ranks a ring attention's sequence is split over (bonsai-ring, docs/ring-attention.md):
/// the op's tensors are one rank's zigzag share of the sequence, and the key/value blocks pass
/// around the ring. At least 2.
def Bonsai_RingRanksAttr : ConfinedAttr<I64Attr, [IntMinValue<2>]>;

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIATTRS_TD
