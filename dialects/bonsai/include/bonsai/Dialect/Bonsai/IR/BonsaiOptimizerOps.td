//===- BonsaiOptimizerOps.td - training state and updates ----*- tablegen -*-===//
//
// Ops of the joint training step that are not model math: the loss scale the runtime feeds,
// persistent training state (gradient accumulators, optimizer moments, master weights, the step
// counter), and the in-place updates that end a step. State values are references to persistent
// storage: the ops marked in place write their state operands, in program order.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIOPTIMIZEROPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIOPTIMIZEROPS_TD

def Bonsai_StateKind : I32EnumAttr<"StateKind", "what a piece of training state holds", [
    I32EnumAttrCase<"Gradient", 0, "gradient">,
    I32EnumAttrCase<"Optimizer", 1, "optimizer">]> {
  let cppNamespace = "::mlir::bonsai";
}

def Bonsai_StateOp : Bonsai_Op<"state"> {
  let summary = "persistent training state: a gradient accumulator or optimizer state";
  let description = [{
    Zero-initialised unless `copy_of` names a parameter, whose converted value it starts from
    (fp32 master weights of bf16 parameters). Optimizer state is saved in checkpoints under
    `name`; gradient accumulators are not. `placement` (set by bonsai-offload) says where the
    state is stored: on the device (the default) or in pinned host memory, which only
    `bonsai.copy_h2d` and `bonsai.copy_d2h` read and write. `sharding` (set by bonsai-shard)
    says that the value is this rank's flat share of a tensor split over ranks.

    ```mlir
    %m = bonsai.state optimizer "lm_head.weight.exp_avg" : tensor<256x64xf32>
    %w32 = bonsai.state optimizer "lm_head.weight.master" copy_of "lm_head.weight" : tensor<256x64xf32>
    %g = bonsai.state gradient "lm_head.weight" : tensor<256x64xf32>
    %v = bonsai.state optimizer "lm_head.weight.exp_avg_sq" placement <pinned_host> : tensor<256x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_StateKind:$kind, StrAttr:$name, OptionalAttr<StrAttr>:$copy_of,
                   OptionalAttr<Bonsai_PlacementAttr>:$placement,
                   OptionalAttr<Bonsai_ShardingAttr>:$sharding);
  let results = (outs Bonsai_Tensor:$result);
  let assemblyFormat = [{
    $kind $name (`copy_of` $copy_of^)? (`placement` $placement^)? (`sharding` $sharding^)?
    attr-dict `:` type($result)
  }];
  let builders = [
    // State is created on the device; bonsai-offload places it afterwards.
    OpBuilder<(ins "::mlir::Type":$type, "::mlir::bonsai::StateKind":$kind,
                   "::llvm::StringRef":$name, "::mlir::StringAttr":$copy_of), [{
      build($_builder, $_state, type, kind, name, copy_of, ::mlir::bonsai::MemorySpaceAttr(),
            ::mlir::bonsai::ShardingAttr());
    }]>
  ];
  let hasVerifier = 1;
}

def Bonsai_LossScaleOp : Bonsai_Op<"loss_scale"> {
  let summary = "the gradient of the step's loss with respect to this micro-batch's loss";
  let description = [{
    Written by the runtime before each micro-batch (1 / micro-batches): the seed of reverse
    mode, so that gradients accumulated over micro-batches are those of the mean loss.

    ```mlir
    %seed = bonsai.loss_scale : tensor<f32>
    ```
  }];
  let results = (outs Bonsai_LossTensor:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
}

def Bonsai_MetricOp : Bonsai_Op<"metric", [MemoryEffects<[MemWrite]>]> {
  let summary = "report a scalar (grad_norm, lr) to the runtime";
  let description = [{
    ```mlir
    bonsai.metric "grad_norm" %norm : tensor<f32>
    ```
  }];
  let arguments = (ins StrAttr:$name, Bonsai_LossTensor:$value);
  let assemblyFormat = "$name $value attr-dict `:` type($value)";
}

class Bonsai_UpdateOp<string mnemonic, list<int> inPlace, list<Trait> traits = []>
    : Bonsai_Op<mnemonic, !listconcat(traits, [MemoryEffects<[MemRead, MemWrite]>,
          DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
          DeclareOpInterfaceMethods<Bonsai_KernelOpInterface, ["getInPlaceOperands"]>])> {
  let hasVerifier = 1;
  let assemblyFormat = "operands attr-dict `:` type(operands)";
  code inPlaceOperands = !interleave(inPlace, ", ");
  let extraClassDefinition = [{
    ::llvm::SmallVector<unsigned> $cppClass::getInPlaceOperands() {
      return {}] # inPlaceOperands # [{};
    }
  }];
}

def Bonsai_GradNormOp : Bonsai_ModelOp<"grad_norm"> {
  let summary = "the global L2 norm of all gradients";
  let description = [{
    ```mlir
    %n = bonsai.grad_norm %g0, %g1 : (tensor<8xf32>, tensor<4x4xf32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Variadic<Bonsai_ComputeTensor>:$gradients);
  let results = (outs Bonsai_LossTensor:$result);
}

def Bonsai_LearningRateOp : Bonsai_ModelOp<"learning_rate"> {
  let summary = "the learning rate of the current step from the step counter and a schedule";
  let description = [{
    `schedule` is `constant` or `cosine`; see LearningRateAttrs in runtime/schema/plan.fbs.

    ```mlir
    %lr = bonsai.learning_rate %step {lr = 1.0e-03 : f64, schedule = "cosine", warmup_steps = 10 : i64, total_steps = 100 : i64, min_lr_ratio = 0.1 : f64} : (tensor<i64>) -> tensor<f32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[I64]>:$step, F64Attr:$lr, StrAttr:$schedule,
                   I64Attr:$warmup_steps, I64Attr:$total_steps, F64Attr:$min_lr_ratio);
  let results = (outs Bonsai_LossTensor:$result);
}

def Bonsai_AdamWUpdateOp : Bonsai_UpdateOp<"adamw_update", [4, 5, 6, 7],
    [DeclareOpInterfaceMethods<Bonsai_MultiTensorUpdateOpInterface>,
     DeclareOpInterfaceMethods<Bonsai_OptimizerStateOpInterface, ["getHostStepParamOperand"]>]> {
  let summary = "one AdamW step, in place on the parameter, its moments and master copy";
  let description = [{
    Operands: gradient, step counter, learning rate, global gradient norm (read, and only
    read when `grad_clip` > 0); parameter, first and second moment, optional fp32 master copy
    (updated in place). PyTorch's AdamW with global-norm clipping (see AdamWAttrs in
    runtime/schema/plan.fbs).

    ```mlir
    bonsai.adamw_update %g, %step, %lr, %norm, %w, %m, %v {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64, grad_clip = 1.0 : f64} : tensor<8xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$gradient, 0DTensorOf<[I64]>:$step,
                   Bonsai_LossTensor:$lr, Bonsai_LossTensor:$grad_norm,
                   Bonsai_ComputeTensor:$param, Bonsai_ComputeTensor:$exp_avg,
                   Bonsai_ComputeTensor:$exp_avg_sq, Optional<Bonsai_ComputeTensor>:$master,
                   F64Attr:$beta1, F64Attr:$beta2, F64Attr:$eps, F64Attr:$weight_decay,
                   F64Attr:$grad_clip);
}

def Bonsai_SGDUpdateOp : Bonsai_UpdateOp<"sgd_update", [3, 4, 5],
    [DeclareOpInterfaceMethods<Bonsai_MultiTensorUpdateOpInterface>,
     DeclareOpInterfaceMethods<Bonsai_OptimizerStateOpInterface, ["getHostStepParamOperand"]>]> {
  let summary = "one SGD (momentum) step, in place on the parameter and momentum buffer";
  let description = [{
    Operands: gradient, learning rate, global gradient norm (read); parameter, momentum
    buffer, optional fp32 master copy (updated in place). See SGDAttrs in plan.fbs.

    ```mlir
    bonsai.sgd_update %g, %lr, %norm, %w, %buf {momentum = 0.9 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$gradient, Bonsai_LossTensor:$lr,
                   Bonsai_LossTensor:$grad_norm, Bonsai_ComputeTensor:$param,
                   Bonsai_ComputeTensor:$momentum_buffer, Optional<Bonsai_ComputeTensor>:$master,
                   F64Attr:$momentum, F64Attr:$weight_decay, F64Attr:$grad_clip);
}

def Bonsai_StepIncrementOp : Bonsai_UpdateOp<"step_increment", [0]> {
  let summary = "the step counter plus one, in place";
  let description = [{
    ```mlir
    bonsai.step_increment %step : tensor<i64>
    ```
  }];
  let arguments = (ins 0DTensorOf<[I64]>:$step);
}

def Bonsai_AccumulateOp : Bonsai_UpdateOp<"accumulate", [1]> {
  let summary = "acc += gradient, in place (accumulation over micro-batches)";
  let description = [{
    ```mlir
    bonsai.accumulate %g, %acc : tensor<8xf32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$gradient, Bonsai_ComputeTensor:$accumulator);
}

def Bonsai_AccumulateMaxOp : Bonsai_UpdateOp<"accumulate_max", [1]> {
  let summary = "acc = max(acc, statistics), in place (FP8 statistics over micro-batches)";
  let description = [{
    Folds one micro-batch's FP8 cast statistics (the f32 [2, 4] `stats` of an FP8 GEMM:
    amax, underflow and saturation fractions, scale) into the step's, which
    `bonsai.fp8_update_scales` reads and `bonsai.zero` clears after it (bonsai-fp8 with
    several micro-batches, docs/fp8.md): the step's amax is the largest of its micro-batches'.

    ```mlir
    bonsai.accumulate_max %stats, %acc : tensor<2x4xf32>, tensor<2x4xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$statistics, Bonsai_ComputeTensor:$accumulator);
}

def Bonsai_ZeroOp : Bonsai_UpdateOp<"zero", [0]> {
  let summary = "set a piece of state to zero, in place";
  let description = [{
    ```mlir
    bonsai.zero %acc : tensor<8xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$target);
}

//===----------------------------------------------------------------------===//
// Host offload
//===----------------------------------------------------------------------===//

def Bonsai_CopyH2DOp : Bonsai_Op<"copy_h2d", [MemoryEffects<[MemRead]>,
    AllTypesMatch<["source", "result"]>,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>, Bonsai_KernelOpInterface]> {
  let summary = "a device copy of state kept in pinned host memory";
  let description = [{
    Reads `source`, a `bonsai.state` placed in pinned host memory, over PCIe into a new
    device tensor that lives until the last op that reads or updates it (bonsai-offload puts
    it right before an optimizer update, which then updates the copy in place). The copy
    reads the state as it is at this point of the step.

    ```mlir
    %m_dev = bonsai.copy_h2d %m : tensor<256x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$source);
  let results = (outs Bonsai_Tensor:$result);
  let assemblyFormat = "$source attr-dict `:` type($result)";
}

def Bonsai_CopyD2HOp : Bonsai_UpdateOp<"copy_d2h", [1]> {
  let summary = "write a device tensor back to state kept in pinned host memory";
  let description = [{
    Operands: the device tensor (read) and the `bonsai.state` placed in pinned host memory
    (overwritten in place, over PCIe). Both have the same type. bonsai-offload puts it right
    after the optimizer update that updated the device copy.

    ```mlir
    bonsai.copy_d2h %m_dev, %m : tensor<256x64xf32>, tensor<256x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$source, Bonsai_Tensor:$target);
}

def Bonsai_CopyToHostOp : Bonsai_Op<"copy_to_host", [MemoryEffects<[MemRead]>,
    AllTypesMatch<["source", "result"]>,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_KernelOpInterface, ["getKernelName", "hasHostResults"]>]> {
  let summary = "a pinned host copy of a device tensor, read by an update on the host";
  let description = [{
    Reads `source`, a device tensor, over PCIe into a new tensor in pinned host memory that
    lives until the last op that reads it. bonsai-offload puts one right before an optimizer
    update that runs on the host (`update "host"`) for each device tensor the update only
    reads: the gradient, the step counter, the learning rate, the gradient norm. The runtime
    kernel is `copy_d2h`.

    ```mlir
    %g_host = bonsai.copy_to_host %g : tensor<256x64xbf16>
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$source);
  let results = (outs Bonsai_Tensor:$result);
  let assemblyFormat = "$source attr-dict `:` type($result)";
}

def Bonsai_CopyToDeviceOp : Bonsai_Op<"copy_to_device", [MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_KernelOpInterface, ["getKernelName",
                                                         "getInPlaceOperands"]>]> {
  let summary = "overwrite a device tensor with a tensor kept in pinned host memory";
  let description = [{
    Operands: the pinned host tensor (read) and the device tensor (overwritten in place, over
    PCIe), of the same type. bonsai-offload puts one right after an optimizer update that runs
    on the host, copying the host copy of the parameter it updated into the parameter. The
    runtime kernel is `copy_h2d`.

    ```mlir
    bonsai.copy_to_device %w_host, %w : tensor<256x64xbf16>, tensor<256x64xbf16>
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$source, Bonsai_Tensor:$target);
  let assemblyFormat = "operands attr-dict `:` type(operands)";
  let hasVerifier = 1;
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIOPTIMIZEROPS_TD
