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
    Option<"hostMemory", "host-memory", "int64_t", /*default=*/"0",
           "Pinned host memory budget per process in bytes (0: none)">,
    Option<"microBatches", "micro-batches", "int64_t", /*default=*/"1",
           "Forward and backward runs per optimizer update (recorded in the plan)">,
  ];
  let dependentDialects = ["::mlir::bonsai::plan::PlanDialect"];
}

def BonsaiGenerateElementwiseKernelsPass
    : Pass<"bonsai-generate-elementwise-kernels", "::mlir::ModuleOp"> {
  let summary = "Compile every bonsai.fused_elementwise region to a program and PTX";
  let description = [{
    For each `bonsai.fused_elementwise` (bonsai-fuse's `elementwise` family), builds the
    portable program of its region (the CPU backend interprets it; every plan carries it) and,
    when `target` is a GPU (`sm_XX`), a PTX kernel: the region cloned into a grid-stride loop
    of a `gpu.func`, lowered by upstream MLIR (math polynomial approximations, scf -> cf,
    gpu -> nvvm, gpu-module-to-binary with format=isa). The op records `generated_kernel`,
    `program` and, for a GPU, `ptx` and `arch`; lowering to a plan passes them on. Ops with
    the same program over the same shapes share one kernel name (one PTX module in the plan).
    `print-ptx` writes each kernel's PTX to stdout once, for tests and inspection.

    Before:
    ```mlir
    %r = bonsai.fused_elementwise ins(%x : tensor<64xf32>) { ... } -> tensor<64xf32>
    ```
    After:
    ```mlir
    %r = bonsai.fused_elementwise ins(%x : tensor<64xf32>) attributes {arch = "sm_90",
        generated_kernel = "fused_elementwise_0", program = array<i32: ...>, ptx = "..."} { ... }
    ```
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "cpu (programs only) or the GPU architecture the PTX is for (sm_80, sm_90, ...)">,
    Option<"printPtx", "print-ptx", "bool", /*default=*/"false",
           "Print each generated kernel's PTX to stdout">,
  ];
  let statistics = [
    Statistic<"numKernels", "kernels", "Distinct elementwise kernels generated">,
  ];
}

#endif // BONSAI_CONVERSION_PASSES_TD
