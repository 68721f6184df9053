//===- BonsaiFusedOptimizerOps.td - multi-tensor updates -----*- tablegen -*-===//
//
// The optimizer as one multi-tensor kernel: bonsai-fuse (family `optimizer`) replaces the
// per-parameter updates of the update phase that share their hyper-parameters, their scalar
// operands and their storage types by one of these ops. Each applies, to every parameter it
// lists, exactly the per-element formula of the per-parameter op it replaces (see
// docs/fusion.md); the runtime runs it as one kernel launch over all of them.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIFUSEDOPTIMIZEROPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIFUSEDOPTIMIZEROPS_TD

/// A multi-tensor update: variadic per-parameter operands in equal numbers (masters: none or
/// one per parameter), every listed state operand updated in place.
class Bonsai_MultiTensorUpdateOp<string mnemonic, list<string> inPlaceGroups>
    : Bonsai_Op<mnemonic, [AttrSizedOperandSegments, MemoryEffects<[MemRead, MemWrite]>,
          DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
          DeclareOpInterfaceMethods<Bonsai_KernelOpInterface,
                                    ["getKernelParams", "getInPlaceOperands"]>,
          DeclareOpInterfaceMethods<Bonsai_OptimizerStateOpInterface>]> {
  let hasVerifier = 1;
  code inPlaceGroupList = !interleave(inPlaceGroups, ", ");
  let extraClassDeclaration = [{
    /// The number of parameters updated.
    unsigned getNumTensors() { return getGradients().size(); }
  }];
  let extraClassDefinition = [{
    ::llvm::SmallVector<unsigned> $cppClass::getInPlaceOperands() {
      ::llvm::SmallVector<unsigned> indices;
      for (unsigned group : {}] # inPlaceGroupList # [{}) {
        auto [start, length] = getODSOperandIndexAndLength(group);
        for (unsigned i = 0; i < length; ++i)
          indices.push_back(start + i);
      }
      return indices;
    }
  }];
}

def Bonsai_MultiTensorAdamWUpdateOp
    : Bonsai_MultiTensorUpdateOp<"multi_tensor_adamw_update", ["4", "5", "6", "7"]> {
  let summary = "AdamW steps of many parameters at once, in place";
  let description = [{
    `bonsai.adamw_update` of every parameter listed, as one kernel: the step counter, the
    learning rate and the global gradient norm are shared; gradient i, parameter i, its
    moments and its optional fp32 master copy (all parameters have one, or none does) are the
    i-th of each list. All gradients share one element type, as do all parameters. The
    per-element formula is adamw_update's (AdamWAttrs in runtime/schema/plan.fbs).

    ```mlir
    bonsai.multi_tensor_adamw_update %step, %lr, %norm
        gradients(%g0, %g1 : tensor<8xf32>, tensor<4x4xf32>)
        params(%w0, %w1 : tensor<8xf32>, tensor<4x4xf32>)
        exp_avg(%m0, %m1 : tensor<8xf32>, tensor<4x4xf32>)
        exp_avg_sq(%v0, %v1 : tensor<8xf32>, tensor<4x4xf32>)
        {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64, grad_clip = 1.0 : f64}
        : tensor<i64>, tensor<f32>, tensor<f32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[I64]>:$step, Bonsai_LossTensor:$lr,
                   Bonsai_LossTensor:$grad_norm, Variadic<Bonsai_ComputeTensor>:$gradients,
                   Variadic<Bonsai_ComputeTensor>:$params,
                   Variadic<Bonsai_ComputeTensor>:$exp_avgs,
                   Variadic<Bonsai_ComputeTensor>:$exp_avg_sqs,
                   Variadic<Bonsai_ComputeTensor>:$masters,
                   F64Attr:$beta1, F64Attr:$beta2, F64Attr:$eps, F64Attr:$weight_decay,
                   F64Attr:$grad_clip);
  let assemblyFormat = [{
    $step `,` $lr `,` $grad_norm
    `gradients` `(` $gradients `:` type($gradients) `)`
    `params` `(` $params `:` type($params) `)`
    `exp_avg` `(` $exp_avgs `:` type($exp_avgs) `)`
    `exp_avg_sq` `(` $exp_avg_sqs `:` type($exp_avg_sqs) `)`
    (`master` `(` $masters^ `:` type($masters) `)`)?
    attr-dict `:` type($step) `,` type($lr) `,` type($grad_norm)
  }];
}

def Bonsai_MultiTensorSGDUpdateOp
    : Bonsai_MultiTensorUpdateOp<"multi_tensor_sgd_update", ["3", "4", "5"]> {
  let summary = "SGD (momentum) steps of many parameters at once, in place";
  let description = [{
    `bonsai.sgd_update` of every parameter listed, as one kernel: the learning rate and the
    global gradient norm are shared; gradient i, parameter i, its momentum buffer and its
    optional fp32 master copy (all or none) are the i-th of each list. All gradients share one
    element type, as do all parameters. The per-element formula is sgd_update's (SGDAttrs in
    runtime/schema/plan.fbs).

    ```mlir
    bonsai.multi_tensor_sgd_update %lr, %norm
        gradients(%g0, %g1 : tensor<8xf32>, tensor<4x4xf32>)
        params(%w0, %w1 : tensor<8xf32>, tensor<4x4xf32>)
        momentum_buffer(%b0, %b1 : tensor<8xf32>, tensor<4x4xf32>)
        {momentum = 0.9 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64}
        : tensor<f32>, tensor<f32>
    ```
  }];
  let arguments = (ins Bonsai_LossTensor:$lr, Bonsai_LossTensor:$grad_norm,
                   Variadic<Bonsai_ComputeTensor>:$gradients,
                   Variadic<Bonsai_ComputeTensor>:$params,
                   Variadic<Bonsai_ComputeTensor>:$momentum_buffers,
                   Variadic<Bonsai_ComputeTensor>:$masters,
                   F64Attr:$momentum, F64Attr:$weight_decay, F64Attr:$grad_clip);
  let assemblyFormat = [{
    $lr `,` $grad_norm
    `gradients` `(` $gradients `:` type($gradients) `)`
    `params` `(` $params `:` type($params) `)`
    `momentum_buffer` `(` $momentum_buffers `:` type($momentum_buffers) `)`
    (`master` `(` $masters^ `:` type($masters) `)`)?
    attr-dict `:` type($lr) `,` type($grad_norm)
  }];
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIFUSEDOPTIMIZEROPS_TD
