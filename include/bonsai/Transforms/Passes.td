//===- Passes.td - Bonsai compiler passes -------------------*- tablegen -*-===//
//
// The passes of the Bonsai pipeline, each runnable alone with bonsai-opt.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TRANSFORMS_PASSES_TD
#define BONSAI_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def BonsaiPrintCostPass : Pass<"bonsai-print-cost", "::mlir::ModuleOp"> {
  let summary = "Print parameter counts, FLOPs and memory of every model function";
  let description = [{
    For each function that declares `bonsai.param`s, prints to standard output:
    parameters by class (trainable, frozen, NF4-quantized; embedding lookups and GEMM weights),
    tokens per step, FLOPs per step and per token (forward, backward, training) split into
    tensor-core (GEMM) and vector FLOPs, and the bytes of weights and of activations per layer.
    The IR is not changed.

    Backward FLOPs ask each op's `CostOpInterface::getBackwardCost` with the set of values that
    need a gradient (those that depend on a trainable parameter), so frozen weights cost no
    weight-gradient GEMM.

    ```
    $ bonsai-opt --bonsai-print-cost examples/models/gpt2_124m.mlir -o /dev/null
    ```
  }];
  let options = [
    Option<"perLayer", "per-layer", "bool", /*default=*/"true",
           "Print the per-layer table of weight and activation bytes">,
  ];
}

def BonsaiVerifyModelPass : Pass<"bonsai-verify-model", "::mlir::ModuleOp"> {
  let summary = "Check that every model function is a well-formed training graph";
  let description = [{
    The first step of the pipeline. Beyond what each op's verifier checks, a model function must
    declare each parameter name once (the runtime binds weights by name), return exactly one
    scalar f32 loss, and take only statically shaped integer tensors (token ids and labels) as
    arguments. Every violation is reported, not only the first.
  }];
}

#endif // BONSAI_TRANSFORMS_PASSES_TD
