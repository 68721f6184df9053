//===- Passes.td - Conversions between Bonsai's dialects ----*- tablegen -*-===//
//
// bonsai (tensors, model ops) -> bonsai_plan (buffers, kernel launches).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_CONVERSION_PASSES_TD
#define BONSAI_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def BonsaiLowerToPlanPass : Pass<"bonsai-lower-to-plan", "::mlir::ModuleOp"> {
  let summary = "Lower each model function to a bonsai_plan.step of buffers and launches";
  let description = [{
    Every model function becomes a `bonsai_plan.step` whose arenas are `@activations` (per
    step: inputs, the loss scale, activations, backward values, the loss, metrics) and, as
    needed, the persistent `@weights` (parameters), `@gradients` (gradient accumulators) and
    `@optimizer` (optimizer state). Parameters, state and op results become buffers (memrefs of
    the same shape and element type); ops implementing `ViewLikeOpInterface` (reshape) become
    views of their source; every op implementing `KernelOpInterface` becomes one
    `bonsai_plan.launch` of the kernel it names, with its parameters, its in-place operands
    as outputs, and the phase (`bonsai.phase`) it belongs to. The value the loss is computed
    from is named `logits`; values passed to `bonsai.metric` are metrics. Buffers get no
    offset yet: that is bonsai-plan-memory's job. The model function is replaced by the step.

    Before:
    ```mlir
    func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
      %w = bonsai.param "lm_head.weight" trainable : tensor<16x8xf32>
      ...
    ```
    After:
    ```mlir
    bonsai_plan.step @forward {target = "cpu", tokens_per_step = 4 : i64} {
      bonsai_plan.arena @weights persistent device size 0
      bonsai_plan.arena @activations step device size 0
      %0 = bonsai_plan.buffer @activations input "ids" {input_index = 0 : i64} : memref<1x4xi32>
      %1 = bonsai_plan.buffer @weights parameter "lm_head.weight" trainable : memref<16x8xf32>
      ...
    ```
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Architecture recorded in the plan (cpu, sm_80, sm_90, ...)">,
    Option<"deviceMemory", "device-memory", "int64_t", /*default=*/"0",
           "Per-device memory budget in bytes (0: none)">,
    Option<"microBatches", "micro-batches", "int64_t", /*default=*/"1",
           "Forward and backward runs per optimizer update (recorded in the plan)">,
  ];
  let dependentDialects = ["::mlir::bonsai::plan::PlanDialect"];
}

#endif // BONSAI_CONVERSION_PASSES_TD
