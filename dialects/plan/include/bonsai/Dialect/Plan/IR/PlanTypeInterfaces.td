//===- PlanTypeInterfaces.td - Type interfaces of bonsai_plan -*- tablegen -*-===//
//
// What the plan dialect asks of element types it does not know: how many bytes a buffer of
// them occupies when that is not a whole number of bytes per element.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_PLAN_IR_PLANTYPEINTERFACES_TD
#define BONSAI_DIALECT_PLAN_IR_PLANTYPEINTERFACES_TD

include "mlir/IR/OpBase.td"

def Plan_PackedElementTypeInterface : TypeInterface<"PackedElementTypeInterface"> {
  let cppNamespace = "::mlir::bonsai::plan";
  let description = [{
    An element type stored in a packed, block-structured layout (a quantized format such as
    `!bonsai.nf4`): the bytes of a buffer of N elements are not N times a per-element size.
    Buffer sizes, views, the memory planner and the plan emitter ask this interface, so the
    plan dialect stays independent of the dialects that define such types.
  }];
  let methods = [
    InterfaceMethod<"Bytes that `numElements` elements occupy, every part of the layout and "
                    "its padding included.",
      "uint64_t", "getStorageBytes", (ins "uint64_t":$numElements)>,
  ];
}

#endif // BONSAI_DIALECT_PLAN_IR_PLANTYPEINTERFACES_TD
