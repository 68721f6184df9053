//===- BonsaiTrainingOps.td - backward and optimizer ops -----*- tablegen -*-===//
//
// The ops the autodiff and optimizer passes create. Backward ops are units a later pass can
// see (an attention backward is one op, not a sea of elementwise ops), each a runtime kernel.
// Training state (optimizer moments, the step counter) is declared with bonsai.state; updates
// of parameters and state happen in place, at the end of the step.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAITRAININGOPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAITRAININGOPS_TD

//===----------------------------------------------------------------------===//
// Backward ops
//===----------------------------------------------------------------------===//

def Bonsai_FillOp : Bonsai_ModelOp<"fill"> {
  let summary = "a tensor with every element equal to `value`";
  let description = [{
    The seed of reverse mode (the loss's own gradient, 1 or 1/micro_batches).

    ```mlir
    %one = bonsai.fill {value = 1.000000e+00 : f64} : () -> tensor<f32>
    ```
  }];
  let arguments = (ins F64Attr:$value);
  let results = (outs Bonsai_ComputeTensor:$result);
  let assemblyFormat = "attr-dict `:` functional-type(operands, results)";
}

def Bonsai_EmbeddingGradOp : Bonsai_ModelOp<"embedding_grad"> {
  let summary = "gradient of an embedding table: scatter-add of the rows' gradients";
  let description = [{
    `result[v, :] = sum of dy[p, :] over positions p with ids[p] = v`; the result has the
    table's type.

    ```mlir
    %dt = bonsai.embedding_grad %dy, %ids : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<32x16xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_IndexTensor:$ids);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_LinearGradInputOp : Bonsai_ModelOp<"linear_grad_input"> {
  let summary = "dx = dy · W for y = x · Wᵀ";
  let description = [{
    ```mlir
    %dx = bonsai.linear_grad_input %dy, %w : (tensor<2x8x32xf32>, tensor<32x16xf32>) -> tensor<2x8x16xf32>
    ```
  }];
  let arguments = (ins Bonsai_FloatTensor:$result_grad, Bonsai_FloatTensor:$weight);
  let results = (outs Bonsai_FloatTensor:$result);
}

def Bonsai_LinearGradWeightOp : Bonsai_ModelOp<"linear_grad_weight",
    [DeclareOpInterfaceMethods<Bonsai_AccumulatingProducerOpInterface>]> {
  let summary = "dW = dyᵀ · x over all leading dimensions, for y = x · Wᵀ";
  let description = [{
    ```mlir
    %dw = bonsai.linear_grad_weight %dy, %x : (tensor<2x8x32xf32>, tensor<2x8x16xf32>) -> tensor<32x16xf32>
    ```
  }];
  let arguments = (ins Bonsai_FloatTensor:$result_grad, Bonsai_FloatTensor:$input);
  let results = (outs Bonsai_FloatTensor:$result);
}

def Bonsai_ReduceToOp : Bonsai_ModelOp<"reduce_to"> {
  let summary = "sum over the dimensions a trailing broadcast would add or expand";
  let description = [{
    The adjoint of trailing broadcasting: the result has the shape the input was broadcast
    from (a bias's gradient from the output's, GPT-2's position embeddings' from the residual
    stream's).

    ```mlir
    %db = bonsai.reduce_to %dy : (tensor<2x8x32xf32>) -> tensor<32xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_RMSNormGradOp : Bonsai_ModelOp<"rms_norm_grad",
    [DeclareOpInterfaceMethods<Bonsai_NormalizationGradOpInterface, ["buildWithAddend"]>],
    ["getKernelParams"]> {
  let summary = "gradients of rms_norm with respect to its input and weight";
  let description = [{
    Recomputes the reciprocal root mean square from `input` (it is not saved).

    ```mlir
    %dx, %dw = bonsai.rms_norm_grad %dy, %x, %w {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$input,
                   Bonsai_ComputeTensor:$weight,
                   DefaultValuedAttr<F64Attr, "1.0e-6">:$epsilon);
  let results = (outs Bonsai_ComputeTensor:$input_grad, Bonsai_ComputeTensor:$weight_grad);
}

def Bonsai_LayerNormGradOp : Bonsai_ModelOp<"layer_norm_grad",
    [DeclareOpInterfaceMethods<Bonsai_NormalizationGradOpInterface, ["buildWithAddend"]>],
    ["getKernelParams"]> {
  let summary = "gradients of layer_norm with respect to its input, weight and bias";
  let description = [{
    ```mlir
    %dx, %dw, %db = bonsai.layer_norm_grad %dy, %x, %w {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$input,
                   Bonsai_ComputeTensor:$weight,
                   DefaultValuedAttr<F64Attr, "1.0e-5">:$epsilon);
  let results = (outs Bonsai_ComputeTensor:$input_grad, Bonsai_ComputeTensor:$weight_grad,
                      Bonsai_ComputeTensor:$bias_grad);
}

def Bonsai_RoPEGradOp : Bonsai_ModelOp<"rope_grad", [], ["getKernelParams"]> {
  let summary = "the adjoint of rope: the inverse rotation of the gradient";
  let description = [{
    ```mlir
    %dx = bonsai.rope_grad %dy {theta = 1.0e+04 : f64} : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
    ```

    `positions` and the llama3 scaling attributes are those of the forward `bonsai.rope`.
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Optional<Bonsai_IndexTensor>:$positions,
                   DefaultValuedAttr<F64Attr, "10000.0">:$theta,
                   OptionalAttr<F64Attr>:$scaling_factor, OptionalAttr<F64Attr>:$low_freq_factor,
                   OptionalAttr<F64Attr>:$high_freq_factor,
                   OptionalAttr<I64Attr>:$original_max_positions);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_AttentionGradOp : Bonsai_ModelOp<"attention_grad"> {
  let summary = "gradients of attention with respect to query, key and value";
  let description = [{
    Recomputes the scores from q and k (the attention matrix is never saved); `output` is the
    forward result, used for the softmax backward's row sums (Σ dO·O). `segment_ids` is the
    forward's (bonsai.attention), and so is `ring_ranks`.

    ```mlir
    %dq, %dk, %dv = bonsai.attention_grad %do, %q, %k, %v, %o {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$query,
                   Bonsai_ComputeTensor:$key, Bonsai_ComputeTensor:$value,
                   Bonsai_ComputeTensor:$output, Optional<Bonsai_IndexTensor>:$segment_ids,
                   UnitAttr:$causal, F64Attr:$scale,
                   OptionalAttr<Bonsai_RingRanksAttr>:$ring_ranks);
  let results = (outs Bonsai_ComputeTensor:$query_grad, Bonsai_ComputeTensor:$key_grad,
                      Bonsai_ComputeTensor:$value_grad);
}

def Bonsai_SiLUGradOp : Bonsai_ModelOp<"silu_grad", [DeclareOpInterfaceMethods<Bonsai_ElementwiseOpInterface>]> {
  let summary = "dx = dy · silu'(x)";
  let description = [{
    ```mlir
    %dx = bonsai.silu_grad %dy, %x : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$input);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_GeLUGradOp : Bonsai_ModelOp<"gelu_grad", [DeclareOpInterfaceMethods<Bonsai_ElementwiseOpInterface>],
    ["getKernelParams"]> {
  let summary = "dx = dy · gelu'(x), exact or tanh form";
  let description = [{
    ```mlir
    %dx = bonsai.gelu_grad %dy, %x {approximation = #bonsai.gelu_approximation<tanh>} : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$input,
                   DefaultValuedAttr<Bonsai_GeluApproximationAttr,
                                     "GeluApproximation::None">:$approximation);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_SwiGLUGradOp : Bonsai_ModelOp<"swiglu_grad", [DeclareOpInterfaceMethods<Bonsai_ElementwiseOpInterface>]> {
  let summary = "gradients of silu(gate) · up with respect to gate and up";
  let description = [{
    ```mlir
    %dg, %du = bonsai.swiglu_grad %dy, %g, %u : (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$gate,
                   Bonsai_ComputeTensor:$up);
  let results = (outs Bonsai_ComputeTensor:$gate_grad, Bonsai_ComputeTensor:$up_grad);
}

def Bonsai_SoftmaxGradOp : Bonsai_ModelOp<"softmax_grad"> {
  let summary = "dx = y · (dy - Σ dy·y) along the axis, from the softmax output y";
  let description = [{
    ```mlir
    %dx = bonsai.softmax_grad %dy, %y {axis = 1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$output,
                   I64Attr:$axis);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_CrossEntropyGradOp : Bonsai_ModelOp<"cross_entropy_grad", [], ["getKernelParams"]> {
  let summary = "gradient of the mean cross-entropy with respect to the logits";
  let description = [{
    `dlogits = dloss · (softmax(logits) - onehot(label)) / count` at positions whose label is
    not `ignore_index` (count of them), 0 elsewhere; `dloss` is the scalar gradient of the loss.

    ```mlir
    %dl = bonsai.cross_entropy_grad %dloss, %logits, %labels : (tensor<f32>, tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<2x8x32xf32>
    ```
  }];
  let arguments = (ins Bonsai_LossTensor:$loss_grad, Bonsai_ComputeTensor:$logits,
                   Bonsai_IndexTensor:$labels,
                   DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_SliceGradOp : Bonsai_ModelOp<"slice_grad"> {
  let summary = "the slice's gradient placed in a zero tensor of the input's shape";
  let description = [{
    ```mlir
    %dx = bonsai.slice_grad %dy {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x16xf32>) -> tensor<2x8x48xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, I64Attr:$axis, I64Attr:$start);
  let results = (outs Bonsai_ComputeTensor:$result);
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAITRAININGOPS_TD
