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
  let summary = "a tensor split evenly along one dimension over `ranks` ranks";
  let description = [{
    `#bonsai.sharding<dim = 0, ranks = 4>` says that each of 4 ranks holds a contiguous quarter of
    the tensor along dimension 0 (FSDP / ZeRO-3 style). The dimension must divide evenly.
  }];
  let parameters = (ins "int64_t":$dim, "int64_t":$ranks);
  let assemblyFormat = "`<` `dim` `=` $dim `,` `ranks` `=` $ranks `>`";
  let genVerifyDecl = 1;
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIATTRS_TD
