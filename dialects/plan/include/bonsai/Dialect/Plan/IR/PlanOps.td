//===- PlanOps.td - The scheduled plan dialect ---------------*- tablegen -*-===//
//
// `bonsai_plan` is what the runtime executes, written as IR: arenas, buffers placed in them,
// kernel launches in schedule order (collectives among them: kernel kinds like any other,
// docs/sharding.md), copies, streams and events. Buffers are
// memrefs; a buffer's arena and offset are attributes the memory planner fills in, so the
// peak memory of a step is known before anything runs.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_PLAN_IR_PLANOPS_TD
#define BONSAI_DIALECT_PLAN_IR_PLANOPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ViewLikeInterface.td"

def Plan_Dialect : Dialect {
  let name = "bonsai_plan";
  let cppNamespace = "::mlir::bonsai::plan";
  let summary = "Scheduled training steps with a static memory plan";
  let description = [{
    A `bonsai_plan.step` holds the arenas of a compiled step and, in schedule order, the buffers
    and the kernel launches (collectives included) and copies that read and write them. It maps one to
    one onto the flatbuffer plan the runtime loads (runtime/schema/plan.fbs).
  }];
}

class Plan_Op<string mnemonic, list<Trait> traits = []> : Op<Plan_Dialect, mnemonic, traits>;

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def Plan_MemorySpace : I32EnumAttr<"MemorySpace", "where an arena lives", [
    I32EnumAttrCase<"Device", 0, "device">,
    I32EnumAttrCase<"PinnedHost", 1, "pinned_host">]> {
  let cppNamespace = "::mlir::bonsai::plan";
}

def Plan_Lifetime : I32EnumAttr<"Lifetime", "how long an arena's contents live", [
    I32EnumAttrCase<"Persistent", 0, "persistent">,
    I32EnumAttrCase<"Step", 1, "step">]> {
  let cppNamespace = "::mlir::bonsai::plan";
}

def Plan_BufferRole : I32EnumAttr<"BufferRole", "why a buffer exists", [
    I32EnumAttrCase<"Parameter", 0, "parameter">,
    I32EnumAttrCase<"Input", 1, "input">,
    I32EnumAttrCase<"Activation", 2, "activation">,
    I32EnumAttrCase<"Gradient", 3, "gradient">,
    I32EnumAttrCase<"OptimizerState", 4, "optimizer_state">,
    I32EnumAttrCase<"Workspace", 5, "workspace">,
    I32EnumAttrCase<"Loss", 6, "loss">,
    I32EnumAttrCase<"Metric", 7, "metric">,
    I32EnumAttrCase<"LossScale", 8, "loss_scale">]> {
  let cppNamespace = "::mlir::bonsai::plan";
}

def Plan_Phase : I32EnumAttr<"Phase", "when a kernel runs in a training step", [
    I32EnumAttrCase<"Forward", 0, "forward">,
    I32EnumAttrCase<"Backward", 1, "backward">,
    I32EnumAttrCase<"Update", 2, "update">]> {
  let cppNamespace = "::mlir::bonsai::plan";
}

//===----------------------------------------------------------------------===//
// Step and arenas
//===----------------------------------------------------------------------===//

def Plan_StepOp : Plan_Op<"step", [Symbol, SymbolTable, IsolatedFromAbove, NoTerminator,
                                   SingleBlock]> {
  let summary = "one compiled training (or forward) step";
  let description = [{
    Arenas first, then buffers and launches in schedule order. `target` is the architecture the
    step was compiled for, `device_memory` the budget in bytes (0 = none), `tokens_per_step`
    the batch times sequence length of one micro-batch, `micro_batches` the forward and backward
    runs per update, `vocab_size` the rows of the token embedding, `host_memory` the budget of
    pinned host memory in bytes (0 = none).

    ```mlir
    bonsai_plan.step @forward {target = "cpu", tokens_per_step = 256 : i64} {
      bonsai_plan.arena @weights persistent device size 1024
      bonsai_plan.arena @activations step device size 4096
      %w = bonsai_plan.buffer @weights[0] parameter "lm_head.weight" trainable : memref<16x16xf32>
      ...
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrAttr:$target,
                   DefaultValuedAttr<I64Attr, "0">:$device_memory,
                   DefaultValuedAttr<I64Attr, "0">:$tokens_per_step,
                   DefaultValuedAttr<I64Attr, "1">:$micro_batches,
                   DefaultValuedAttr<I64Attr, "0">:$vocab_size,
                   DefaultValuedAttr<I64Attr, "0">:$host_memory);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasRegionVerifier = 1;
}

def Plan_ArenaOp : Plan_Op<"arena", [Symbol, HasParent<"StepOp">]> {
  let summary = "a contiguous region of memory allocated once";
  let description = [{
    `size` is in bytes and is set by the memory planner (0 before planning).

    ```mlir
    bonsai_plan.arena @activations step device size 4096
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, Plan_Lifetime:$lifetime,
                   Plan_MemorySpace:$space, DefaultValuedAttr<I64Attr, "0">:$size,
                   DefaultValuedAttr<I64Attr, "256">:$alignment);
  let assemblyFormat = "$sym_name $lifetime $space `size` $size attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Buffers
//===----------------------------------------------------------------------===//

def Plan_BufferOp : Plan_Op<"buffer", [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a buffer at an offset of an arena";
  let description = [{
    `offset` (bytes) is absent until the memory planner places the buffer. `name` is the
    checkpoint key of a parameter, "ids"/"labels" for inputs, and a debug name otherwise.
    `input_index` orders the inputs the data loader fills. Buffers of persistent arenas other
    than parameters start at zero, or, with `copy_of`, as a converted copy of the parameter of
    that name (fp32 master weights).

    ```mlir
    %w = bonsai_plan.buffer @weights[0] parameter "lm_head.weight" trainable : memref<16x16xf32>
    %h = bonsai_plan.buffer @activations activation "h" : memref<4x16xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$arena, OptionalAttr<I64Attr>:$offset,
                   Plan_BufferRole:$role, StrAttr:$name, UnitAttr:$trainable,
                   OptionalAttr<I64Attr>:$input_index, OptionalAttr<StrAttr>:$copy_of);
  let results = (outs AnyStaticShapeMemRef:$result);
  let assemblyFormat = [{
    $arena (`[` $offset^ `]`)? $role $name (`trainable` $trainable^)? attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Bytes the buffer occupies.
    int64_t getSizeInBytes();
  }];
}

def Plan_ViewOp : Plan_Op<"view", [Pure,
    DeclareOpInterfaceMethods<ViewLikeOpInterface>]> {
  let summary = "the same bytes with another shape (a reshape that needs no copy)";
  let description = [{
    ```mlir
    %v = bonsai_plan.view %h : memref<4x16xf32> to memref<4x4x4xf32>
    ```
  }];
  let arguments = (ins AnyStaticShapeMemRef:$source);
  let results = (outs AnyStaticShapeMemRef:$result);
  let assemblyFormat = "$source attr-dict `:` type($source) `to` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Work
//===----------------------------------------------------------------------===//

def Plan_LaunchOp : Plan_Op<"launch", [AttrSizedOperandSegments]> {
  let summary = "one kernel invocation: reads `ins`, writes `outs`";
  let description = [{
    `kernel` names a runtime kernel (the bonsai op it implements: "linear", "rms_norm", ...);
    `params` carries its attributes (epsilon, scale, causal, ...). `stream` is the stream it is
    issued on (0 = compute); `phase` when it runs (forward and backward once per micro-batch,
    update once per step).

    ```mlir
    bonsai_plan.launch "linear" ins(%x, %w : memref<4x16xf32>, memref<8x16xf32>) outs(%y : memref<4x8xf32>) {params = {}}
    ```
  }];
  let arguments = (ins StrAttr:$kernel, Variadic<AnyStaticShapeMemRef>:$ins,
                   Variadic<AnyStaticShapeMemRef>:$outs,
                   DefaultValuedAttr<DictionaryAttr, "{}">:$params,
                   DefaultValuedAttr<I64Attr, "0">:$stream,
                   DefaultValuedAttr<Plan_Phase, "::mlir::bonsai::plan::Phase::Forward">:$phase);
  let assemblyFormat = [{
    $kernel `ins` `(` ($ins^ `:` type($ins))? `)` `outs` `(` ($outs^ `:` type($outs))? `)`
    attr-dict
  }];
  let hasVerifier = 1;
}

def Plan_RetainOp : Plan_Op<"retain"> {
  let summary = "keeps buffers' bytes from reuse up to this point";
  let description = [{
    A launch on a copy stream runs beside the compute stream's later launches. The runtime
    orders any launch that reuses its bytes after it (docs/offload.md, "Overlap"), but that
    launch would then wait for the copy. `bonsai-schedule` puts a `retain` of a copy's source
    where the copy is expected to be done: the memory planner counts it as a use, so those
    bytes are not reused before it. It launches nothing.

    ```mlir
    bonsai_plan.retain %m_dev, %v_dev : memref<16x8xf32>, memref<16x8xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyStaticShapeMemRef>:$buffers);
  let assemblyFormat = "$buffers attr-dict `:` type($buffers)";
}

def Plan_CopyOp : Plan_Op<"copy"> {
  let summary = "a copy between buffers, possibly across memory spaces (PCIe)";
  let description = [{
    ```mlir
    bonsai_plan.copy %host to %dev stream 1 : memref<1024xf32>, memref<1024xf32>
    ```
  }];
  let arguments = (ins AnyStaticShapeMemRef:$source, AnyStaticShapeMemRef:$target,
                   DefaultValuedAttr<I64Attr, "0">:$stream);
  let assemblyFormat = [{
    $source `to` $target `stream` $stream attr-dict `:` type($source) `,` type($target)
  }];
  let hasVerifier = 1;
}

def Plan_RecordEventOp : Plan_Op<"record_event"> {
  let summary = "mark a point of a stream that another stream can wait for";
  let description = [{
    ```mlir
    bonsai_plan.record_event 0 on stream 1
    ```
  }];
  let arguments = (ins I64Attr:$event, I64Attr:$stream);
  let assemblyFormat = "$event `on` `stream` $stream attr-dict";
}

def Plan_WaitEventOp : Plan_Op<"wait_event"> {
  let summary = "make a stream wait for an event recorded on another";
  let description = [{
    ```mlir
    bonsai_plan.wait_event 0 on stream 0
    ```
  }];
  let arguments = (ins I64Attr:$event, I64Attr:$stream);
  let assemblyFormat = "$event `on` `stream` $stream attr-dict";
}

#endif // BONSAI_DIALECT_PLAN_IR_PLANOPS_TD
