//===- BonsaiFusedOps.td - kernels bonsai-fuse makes of op chains -*- tablegen -*-===//
//
// The ops `bonsai-fuse` puts in place of chains of model and backward ops (docs/fusion.md):
// each is one runtime kernel computing exactly what the chain computed, with every
// intermediate the chain stored rounded to its dtype the same way. They are created after
// autodiff, so they have no gradients of their own.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIFUSEDOPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIFUSEDOPS_TD

//===----------------------------------------------------------------------===//
// linear-cross-entropy
//===----------------------------------------------------------------------===//

def Bonsai_LinearCrossEntropyOp : Bonsai_ModelOp<"linear_cross_entropy", [],
    ["getKernelParams", "getWorkspaceResults"]> {
  let summary = "LM head and mean cross-entropy with their gradients, chunk by chunk";
  let description = [{
    Replaces `logits = linear(x, W)`, `loss = cross_entropy(logits, labels)`,
    `dlogits = cross_entropy_grad(loss_grad, logits, labels)`, `dx =
    linear_grad_input(dlogits, W)` and (unless W is frozen) `dW = linear_grad_weight(dlogits,
    x)`, without ever holding the logits of every position. The number of counted labels
    (not `ignore_index`) is taken over the whole batch first; then, for each chunk of
    `chunk_rows` positions (the last may be shorter): the chunk's logits x_c·Wᵀ are stored in
    the workspace in W's dtype, as the linear would store them; each row's loss is computed
    and its logits overwritten by `loss_grad · (softmax - onehot) / count`, rounded as
    cross_entropy_grad rounds; dx_c = dlogits_c·W; dW += dlogits_cᵀ·x_c (in fp32, rounded
    once into dW after the last chunk). `loss` is the mean over counted positions (NaN when
    none counts, and every gradient is then 0), summed in row order.

    `loss_grad` is the loss's gradient seed (`bonsai.loss_scale`), which the runtime writes
    before the forward pass: the op runs in the forward phase, where the loss is read.

    The `workspace` result is f32 scratch of `getWorkspaceElements` elements (the logits
    chunk, the per-row losses, W padded to a 16-byte multiple of rows when the vocabulary is
    not one, the fp32 dW accumulator, a counter: docs/plan-format.md): the memory planner
    sizes it like any buffer and nothing reads it afterwards.

    ```mlir
    %loss, %dx, %ws, %dw = bonsai.linear_cross_entropy %x, %w, %labels, %seed {chunk_rows = 256 : i64, ignore_index = -100 : i64} : (tensor<4x64x64xf32>, tensor<256x64xf32>, tensor<4x64xi32>, tensor<f32>) -> (tensor<f32>, tensor<4x64x64xf32>, tensor<82048xf32>, tensor<256x64xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input, Bonsai_ComputeTensor:$weight,
                   Bonsai_IndexTensor:$labels, Bonsai_LossTensor:$loss_grad,
                   I64Attr:$ignore_index, I64Attr:$chunk_rows);
  let results = (outs Bonsai_LossTensor:$loss, Bonsai_ComputeTensor:$input_grad,
                      Bonsai_ComputeTensor:$workspace,
                      Optional<Bonsai_ComputeTensor>:$weight_grad);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = [{
    /// Positions (rows of x) and the vocabulary.
    int64_t getNumRows();
    int64_t getVocabSize();
    /// The chunk rows `bonsai-fuse` chooses: every row when the logits of the whole batch
    /// take at most kMaxChunkBytes, else the largest multiple of 64 rows whose logits fit
    /// (at least 64). The runtime does not depend on the rule, only on `chunk_rows`.
    static int64_t chooseChunkRows(int64_t rows, int64_t vocab, int64_t elementBytes);
    static constexpr int64_t kMaxChunkBytes = int64_t(256) << 20;
    /// f32 elements of the workspace (runtime/include/bonsai/runtime/Fusion.h computes the
    /// same layout, and plan validation checks it): the logits chunk in W's dtype with rows
    /// padded to 16 bytes, the rows' losses, W's padded copy (when the vocabulary needs
    /// padding), the fp32 dW accumulator (when dW is computed and W is not f32 or is
    /// padded), and a 64-bit counter, each part 256-byte aligned.
    static int64_t getWorkspaceElements(int64_t rows, int64_t vocab, int64_t hidden,
                                        int64_t chunkRows, int64_t elementBytes,
                                        bool weightGrad);
  }];
}

//===----------------------------------------------------------------------===//
// residual-norm
//===----------------------------------------------------------------------===//

class Bonsai_AddNormOp<string mnemonic, string norm> : Bonsai_ModelOp<mnemonic, [],
    ["getKernelParams"]> {
  let summary = "residual add followed by " # norm # ", one kernel";
  let results = (outs Bonsai_ComputeTensor:$sum, Bonsai_ComputeTensor:$result);
}

def Bonsai_AddRMSNormOp : Bonsai_AddNormOp<"add_rms_norm", "rms_norm"> {
  let description = [{
    `sum = lhs + rhs` (same types, rounded to their dtype as `bonsai.add` rounds) and
    `result = rms_norm(sum, weight)` computed from the rounded sum. The sum is the residual
    stream: later blocks (and the backward pass) read it.

    ```mlir
    %h, %y = bonsai.add_rms_norm %a, %b, %w {epsilon = 1.0e-05 : f64} : (tensor<2x64x64xf32>, tensor<2x64x64xf32>, tensor<64xf32>) -> (tensor<2x64x64xf32>, tensor<2x64x64xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$lhs, Bonsai_ComputeTensor:$rhs,
                   Bonsai_ComputeTensor:$weight, F64Attr:$epsilon);
}

def Bonsai_AddLayerNormOp : Bonsai_AddNormOp<"add_layer_norm", "layer_norm"> {
  let description = [{
    `sum = lhs + rhs` (same types) and `result = layer_norm(sum, weight, bias)`, as
    `add_rms_norm` for GPT-2's layer norms.

    ```mlir
    %h, %y = bonsai.add_layer_norm %a, %b, %w, %bias {epsilon = 1.0e-05 : f64} : (tensor<2x64x64xf32>, tensor<2x64x64xf32>, tensor<64xf32>, tensor<64xf32>) -> (tensor<2x64x64xf32>, tensor<2x64x64xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$lhs, Bonsai_ComputeTensor:$rhs,
                   Bonsai_ComputeTensor:$weight, Bonsai_ComputeTensor:$bias,
                   F64Attr:$epsilon);
}

def Bonsai_RMSNormGradAddOp : Bonsai_ModelOp<"rms_norm_grad_add", [], ["getKernelParams"]> {
  let summary = "rms_norm_grad with a tensor added into the input gradient, one kernel";
  let description = [{
    `rms_norm_grad(result_grad, input, weight)` whose input gradient, rounded to its dtype
    as rms_norm_grad rounds it, has `addend` added (rounded once more, as `bonsai.add`): the
    residual stream's gradient summed with the norm's in the same pass.

    ```mlir
    %dx, %dw = bonsai.rms_norm_grad_add %dy, %x, %w, %acc {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$input,
                   Bonsai_ComputeTensor:$weight, Bonsai_ComputeTensor:$addend,
                   F64Attr:$epsilon);
  let results = (outs Bonsai_ComputeTensor:$input_grad, Bonsai_ComputeTensor:$weight_grad);
}

def Bonsai_LayerNormGradAddOp : Bonsai_ModelOp<"layer_norm_grad_add", [],
    ["getKernelParams"]> {
  let summary = "layer_norm_grad with a tensor added into the input gradient, one kernel";
  let description = [{
    As `rms_norm_grad_add`, for `layer_norm_grad`.

    ```mlir
    %dx, %dw, %db = bonsai.layer_norm_grad_add %dy, %x, %w, %acc {epsilon = 1.0e-05 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>, tensor<2x8x16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$input,
                   Bonsai_ComputeTensor:$weight, Bonsai_ComputeTensor:$addend,
                   F64Attr:$epsilon);
  let results = (outs Bonsai_ComputeTensor:$input_grad, Bonsai_ComputeTensor:$weight_grad,
                      Bonsai_ComputeTensor:$bias_grad);
}

def Bonsai_DoraGradOp : Bonsai_ModelOp<"dora_grad"> {
  let summary = "the gradients of DoRA's rescaled output, from the output itself";
  let description = [{
    For DoRA's `y = x ⊙ scale` with `scale = bonsai.dora_scale(magnitude, w, a, b)` (the norm n
    detached, so `scale = magnitude / n`): `input_grad = result_grad ⊙ scale`, what
    `bonsai.mul`'s gradient gives, and `magnitude_grad[o] = Σ_t result_grad[t, o] · y[t, o] /
    magnitude[o]`, which equals the unfused chain's `dora_scale(reduce_to(result_grad ⊙ x))`
    (Σ_t dy · x / n) without reading the pre-scale x: the backward pass keeps y, which the
    next op often keeps anyway, instead of x. Sums are fp32 or wider; a zero magnitude is a
    runtime error (x cannot be recovered from y there). bonsai-fuse's `dora` family forms it.
    All operands and results share the element type; `output` and `result_grad` have one
    shape [..., out], `scale` and `magnitude` are [out].

    ```mlir
    %dx, %dm = bonsai.dora_grad %dy, %y, %scale, %m : (tensor<2x8x32xbf16>, tensor<2x8x32xbf16>, tensor<32xbf16>, tensor<32xbf16>) -> (tensor<2x8x32xbf16>, tensor<32xbf16>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$output,
                   Bonsai_ComputeTensor:$scale, Bonsai_ComputeTensor:$magnitude);
  let results = (outs Bonsai_ComputeTensor:$input_grad, Bonsai_ComputeTensor:$magnitude_grad);
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIFUSEDOPS_TD
