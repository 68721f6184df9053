//===- BonsaiOps.td - bonsai model and recipe operations -----*- tablegen -*-===//
//
// Model ops (parameters, GEMMs, norms, attention, activations, loss, shape ops) and recipe ops
// (the recipe and its directives). Every model op verifies shapes and element types and reports
// its cost through CostOpInterface.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIOPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIOPS_TD

include "bonsai/Dialect/Bonsai/IR/BonsaiDialect.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiTypes.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiAttrs.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ViewLikeInterface.td"

//===----------------------------------------------------------------------===//
// Model ops
//===----------------------------------------------------------------------===//

/// A model op: pure, costed, and one runtime kernel. `kernelOverrides` lists the
/// KernelOpInterface methods the op implements itself (ops with defaulted attributes).
class Bonsai_ModelOp<string mnemonic, list<Trait> traits = [],
                     list<string> kernelOverrides = []>
    : Bonsai_Op<mnemonic, !listconcat(traits,
          [Pure, DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
           DeclareOpInterfaceMethods<Bonsai_KernelOpInterface, kernelOverrides>])> {
  let hasVerifier = 1;
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def Bonsai_ParamOp : Bonsai_Op<"param", [Pure,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>]> {
  let summary = "a model parameter, named as in the Hugging Face checkpoint";
  let description = [{
    Declares a parameter tensor of the model. `name` is the tensor's key in the Hugging Face
    safetensors checkpoint; the runtime binds weights by it. A parameter is `trainable` (it gets a
    gradient and optimizer state) or `frozen`. `placement` and `sharding` are set by the offload
    and shard passes. A parameter used in two places (tied embeddings) is one `bonsai.param`
    whose value has two uses, so its gradient accumulates both.

    ```mlir
    %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<64x64xbf16>
    %n = bonsai.param "model.norm.weight" frozen : tensor<64xbf16>
    ```
  }];
  let arguments = (ins StrAttr:$name, UnitAttr:$trainable,
                   OptionalAttr<Bonsai_PlacementAttr>:$placement,
                   OptionalAttr<Bonsai_ShardingAttr>:$sharding);
  let results = (outs Bonsai_Tensor:$result);
  let assemblyFormat = [{
    $name (`trainable` $trainable^):(`frozen`)? (`placement` $placement^)?
    (`sharding` $sharding^)? attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

def Bonsai_EmbeddingOp : Bonsai_ModelOp<"embedding",
    [DeclareOpInterfaceMethods<Bonsai_CostOpInterface, ["getBackwardCost"]>, DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
     Bonsai_TokenwiseOpInterface]> {
  let summary = "row gather from an embedding table";
  let description = [{
    `result[..., :] = table[ids[...], :]`. The table is [vocab, hidden]; the result has the ids'
    shape with `hidden` appended and the table's element type.

    ```mlir
    %h = bonsai.embedding %table, %ids : (tensor<256x64xf32>, tensor<2x64xi32>) -> tensor<2x64x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$table, Bonsai_IndexTensor:$ids);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_LinearOp : Bonsai_ModelOp<"linear", [
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface, ["getBackwardCost"]>, DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_TokenwiseOpInterface, ["whyNotTokenwise"]>]> {
  let summary = "y = x · Wᵀ (+ b), with W in Hugging Face's [out, in] layout";
  let description = [{
    The input is [..., in], the weight [out, in] (as `torch.nn.Linear` stores it), the optional
    bias [out]; the result is [..., out]. Input, weight, bias and result share the element type.

    ```mlir
    %y = bonsai.linear %x, %w : (tensor<2x64x64xbf16>, tensor<128x64xbf16>) -> tensor<2x64x128xbf16>
    %z = bonsai.linear %x, %w, %b : (tensor<2x64x64xbf16>, tensor<128x64xbf16>, tensor<128xbf16>) -> tensor<2x64x128xbf16>
    ```
  }];
  let arguments = (ins Bonsai_FloatTensor:$input, Bonsai_FloatTensor:$weight,
                   Optional<Bonsai_FloatTensor>:$bias);
  let results = (outs Bonsai_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
}

def Bonsai_MatmulOp : Bonsai_ModelOp<"matmul",
    [DeclareOpInterfaceMethods<Bonsai_CostOpInterface, ["getBackwardCost"]>, DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>]> {
  let summary = "batched matrix product [..., m, k] · [..., k, n] -> [..., m, n]";
  let description = [{
    Both operands have the same rank (at least 2) and the same leading (batch) dimensions.

    ```mlir
    %c = bonsai.matmul %a, %b : (tensor<4x8x16xf32>, tensor<4x16x32xf32>) -> tensor<4x8x32xf32>
    ```
  }];
  let arguments = (ins Bonsai_FloatTensor:$lhs, Bonsai_FloatTensor:$rhs);
  let results = (outs Bonsai_FloatTensor:$result);
}

class Bonsai_BroadcastBinaryOp<string mnemonic>
    : Bonsai_ModelOp<mnemonic, [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
                                DeclareOpInterfaceMethods<Bonsai_ElementwiseOpInterface>]> {
  let description = [{
    Elementwise with trailing-dimension broadcasting of `rhs`: `rhs` has rank at most that of
    `lhs`, and each of its dimensions equals the matching trailing dimension of `lhs` or is 1.
    The result has the type of `lhs` (for example GPT-2's token embeddings [B, T, D] plus its
    position embeddings [T, D]).

    ```mlir
    %s = bonsai.}] # mnemonic # [{ %a, %b : (tensor<2x64x64xf32>, tensor<64x64xf32>) -> tensor<2x64x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$lhs, Bonsai_ComputeTensor:$rhs);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_AddOp : Bonsai_BroadcastBinaryOp<"add"> {
  let summary = "elementwise sum with trailing broadcast";
}

def Bonsai_MulOp : Bonsai_BroadcastBinaryOp<"mul"> {
  let summary = "elementwise product with trailing broadcast";
}

def Bonsai_DoraScaleOp : Bonsai_ModelOp<"dora_scale", [
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface, ["getBackwardCost"]>,
    DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>]> {
  let summary = "DoRA's per-row scale m / ||W + s·B·A||, the norm detached";
  let description = [{
    `result[o] = magnitude[o] / ||weight[o, :] + scale · (lora_b · lora_a)[o, :]||_2` for a
    weight [out, in], lora_a [r, in], lora_b [out, r] and magnitude [out]: the factor DoRA
    multiplies a linear's output rows by (`bonsai-insert-lora`, docs/lora.md). The norm is
    treated as a constant in the backward pass, as the DoRA paper (section 4.3) and PEFT do
    (`weight_norm.detach()`), so that no [out, in] gradient is ever formed: the op is linear
    in `magnitude` and its only gradient is `d magnitude = dora_scale(d result, weight,
    lora_a, lora_b)`, the same op applied to the incoming gradient. The kernel never
    materializes B·A: each row's norm is accumulated from W's row and r dot products.

    ```mlir
    %s = bonsai.dora_scale %m, %w, %a, %b {scale = 2.000000e+00 : f64} : (tensor<64xf32>, tensor<64x32xf32>, tensor<8x32xf32>, tensor<64x8xf32>) -> tensor<64xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$magnitude, Bonsai_ComputeTensor:$weight,
                   Bonsai_ComputeTensor:$lora_a, Bonsai_ComputeTensor:$lora_b, F64Attr:$scale);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_RMSNormOp : Bonsai_ModelOp<"rms_norm", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_NormalizationOpInterface, ["buildWithResidualAdd"]>,
    Bonsai_TokenwiseOpInterface],
    ["getKernelParams"]> {
  let summary = "root-mean-square normalisation over the last dimension, times a weight";
  let description = [{
    `y = x / sqrt(mean(x², -1) + epsilon) * weight` (Llama's `LlamaRMSNorm`). The weight has the
    size of the last dimension.

    ```mlir
    %y = bonsai.rms_norm %x, %w {epsilon = 1.0e-05 : f64} : (tensor<2x64x64xf32>, tensor<64xf32>) -> tensor<2x64x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input, Bonsai_ComputeTensor:$weight,
                   DefaultValuedAttr<F64Attr, "1.0e-6">:$epsilon);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_LayerNormOp : Bonsai_ModelOp<"layer_norm", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_NormalizationOpInterface, ["buildWithResidualAdd"]>,
    Bonsai_TokenwiseOpInterface],
    ["getKernelParams"]> {
  let summary = "layer normalisation over the last dimension with weight and bias";
  let description = [{
    `y = (x - mean) / sqrt(var + epsilon) * weight + bias` over the last dimension (GPT-2).

    ```mlir
    %y = bonsai.layer_norm %x, %w, %b {epsilon = 1.0e-05 : f64} : (tensor<2x64x64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<2x64x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input, Bonsai_ComputeTensor:$weight,
                   Bonsai_ComputeTensor:$bias,
                   DefaultValuedAttr<F64Attr, "1.0e-5">:$epsilon);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_RoPEOp : Bonsai_ModelOp<"rope", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_TokenwiseOpInterface, ["whyNotTokenwise"]>],
    ["getKernelParams"]> {
  let summary = "rotary position embedding (Hugging Face's rotate-half convention)";
  let description = [{
    The input is [batch, seq, heads, head_dim] with an even head_dim; position `p` of the
    sequence is rotated by angles `p * inv_freq[i]`, `inv_freq[i] = theta^(-2i/head_dim)`,
    pairing element `i` with `i + head_dim/2` as `LlamaRotaryEmbedding` does.

    `positions` (optional, integer [batch, seq]) gives each token's position; without it the
    position is the sequence index. Packed rows (docs/training.md) restart it at each document.

    `scaling_factor`, `low_freq_factor`, `high_freq_factor` and `original_max_positions` (all
    or none) apply Llama 3.1's `rope_scaling` of type "llama3" to inv_freq, as transformers'
    `_compute_llama3_parameters` does: wavelengths 2π/inv_freq above
    original_max_positions / low_freq_factor are divided by scaling_factor, those below
    original_max_positions / high_freq_factor are kept, and those between are interpolated with
    smooth = (original_max_positions / wavelength - low_freq_factor) /
    (high_freq_factor - low_freq_factor).

    ```mlir
    %q = bonsai.rope %x {theta = 1.0e+04 : f64} : (tensor<2x64x4x16xf32>) -> tensor<2x64x4x16xf32>
    %p = bonsai.rope %x, %positions {theta = 5.0e+05 : f64, scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_positions = 8192 : i64} : (tensor<2x64x4x16xf32>, tensor<2x64xi32>) -> tensor<2x64x4x16xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input, Optional<Bonsai_IndexTensor>:$positions,
                   DefaultValuedAttr<F64Attr, "10000.0">:$theta,
                   OptionalAttr<F64Attr>:$scaling_factor, OptionalAttr<F64Attr>:$low_freq_factor,
                   OptionalAttr<F64Attr>:$high_freq_factor,
                   OptionalAttr<I64Attr>:$original_max_positions);
  let results = (outs Bonsai_ComputeTensor:$result);
  let builders = [
    // Sequence-index positions, no scaling: what every unpacked model builds.
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$input, "::llvm::APFloat":$theta), [{
      build($_builder, $_state, result, input, ::mlir::Value(), $_builder.getF64FloatAttr(
            theta.convertToDouble()), nullptr, nullptr, nullptr, nullptr);
    }]>
  ];
}

def Bonsai_AttentionOp : Bonsai_ModelOp<"attention", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>]> {
  let summary = "scaled dot-product attention, optionally causal, with grouped-query heads";
  let description = [{
    `q` is [batch, seq, heads, head_dim]; `k` and `v` are [batch, seq, kv_heads, head_dim] with
    `heads` a multiple of `kv_heads` (query head h reads kv head h / (heads / kv_heads)). The
    result has the shape of `q`. `scale` multiplies the scores (usually 1/sqrt(head_dim)).

    `segment_ids` (optional, integer [batch, seq]) makes attention block-diagonal for packed
    rows: query i reads key j only if segment_ids[b, i] == segment_ids[b, j] (and j <= i when
    causal). A query that reads no key gets a zero output.

    `ring_ranks` N (set by bonsai-ring, docs/ring-attention.md): the sequence is split over N
    ranks in the zigzag layout and q, k, v (and `segment_ids`) are this rank's share of it
    (chunks r and 2N-1-r of 2N); the op computes the attention of the local queries against
    every rank's keys, the key/value blocks passed around the ring.

    ```mlir
    %o = bonsai.attention %q, %k, %v {causal, scale = 2.500000e-01 : f64} : (tensor<2x64x4x16xf32>, tensor<2x64x2x16xf32>, tensor<2x64x2x16xf32>) -> tensor<2x64x4x16xf32>
    %p = bonsai.attention %q, %k, %v, %segments {causal, scale = 2.500000e-01 : f64} : (tensor<2x64x4x16xf32>, tensor<2x64x2x16xf32>, tensor<2x64x2x16xf32>, tensor<2x64xi32>) -> tensor<2x64x4x16xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$query, Bonsai_ComputeTensor:$key,
                   Bonsai_ComputeTensor:$value, Optional<Bonsai_IndexTensor>:$segment_ids,
                   UnitAttr:$causal, F64Attr:$scale,
                   OptionalAttr<Bonsai_RingRanksAttr>:$ring_ranks);
  let results = (outs Bonsai_ComputeTensor:$result);
  let builders = [
    // No segments: what every unpacked model builds.
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$query, "::mlir::Value":$key,
                   "::mlir::Value":$value, "bool":$causal, "::llvm::APFloat":$scale), [{
      build($_builder, $_state, result, query, key, value, ::mlir::Value(), causal, scale,
            ::mlir::IntegerAttr());
    }]>
  ];
  let extraClassDeclaration = [{
    /// Number of (query, key) pairs scored per batch and head: S² or S(S+1)/2 when causal.
    int64_t getScoredPairs();
  }];
}

/// A one-operand elementwise op.
class Bonsai_UnaryOp<string mnemonic> : Bonsai_ModelOp<mnemonic, [
    DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>, DeclareOpInterfaceMethods<Bonsai_ElementwiseOpInterface>]> {
  let arguments = (ins Bonsai_ComputeTensor:$input);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_SiLUOp : Bonsai_UnaryOp<"silu"> {
  let summary = "x · sigmoid(x)";
  let description = [{
    ```mlir
    %y = bonsai.silu %x : (tensor<2x64x128xf32>) -> tensor<2x64x128xf32>
    ```
  }];
}

def Bonsai_GeLUOp : Bonsai_ModelOp<"gelu", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_ElementwiseOpInterface>], ["getKernelParams"]> {
  let summary = "Gaussian error linear unit, exact or with the tanh approximation (GPT-2)";
  let description = [{
    ```mlir
    %y = bonsai.gelu %x {approximation = #bonsai.gelu_approximation<tanh>} : (tensor<2x64x256xf32>) -> tensor<2x64x256xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input,
                   DefaultValuedAttr<Bonsai_GeluApproximationAttr,
                                     "GeluApproximation::None">:$approximation);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_SwiGLUOp : Bonsai_ModelOp<"swiglu", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_ElementwiseOpInterface>]> {
  let summary = "silu(gate) · up, the gated MLP activation of Llama";
  let description = [{
    ```mlir
    %h = bonsai.swiglu %gate, %up : (tensor<2x64x128xf32>, tensor<2x64x128xf32>) -> tensor<2x64x128xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$gate, Bonsai_ComputeTensor:$up);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_SoftmaxOp : Bonsai_ModelOp<"softmax", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_TokenwiseOpInterface, ["whyNotTokenwise"]>]> {
  let summary = "softmax along one axis";
  let description = [{
    ```mlir
    %p = bonsai.softmax %x {axis = 1 : i64} : (tensor<8x256xf32>) -> tensor<8x256xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input, I64Attr:$axis);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_CrossEntropyOp : Bonsai_ModelOp<"cross_entropy", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>],
    ["getKernelParams"]> {
  let summary = "mean token cross-entropy over labels that are not ignore_index";
  let description = [{
    `logits` is [..., vocab], `labels` the same shape without the last dimension. The result is
    the fp32 mean of `-log softmax(logits)[label]` over positions whose label differs from
    `ignore_index` (PyTorch's `cross_entropy(reduction="mean")`).

    ```mlir
    %loss = bonsai.cross_entropy %logits, %labels {ignore_index = -100 : i64} : (tensor<2x64x256xf32>, tensor<2x64xi32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$logits, Bonsai_IndexTensor:$labels,
                   DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs Bonsai_LossTensor:$result);
}

def Bonsai_ReshapeOp : Bonsai_ModelOp<"reshape",
    [DeclareOpInterfaceMethods<ViewLikeOpInterface>, DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
     DeclareOpInterfaceMethods<Bonsai_TokenwiseOpInterface, ["whyNotTokenwise"]>]> {
  let summary = "same elements, new static shape";
  let description = [{
    ```mlir
    %y = bonsai.reshape %x : (tensor<2x64x64xf32>) -> tensor<2x64x4x16xf32>
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$input);
  let results = (outs Bonsai_Tensor:$result);
}

def Bonsai_TransposeOp : Bonsai_ModelOp<"transpose", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_TokenwiseOpInterface, ["whyNotTokenwise"]>]> {
  let summary = "permutation of dimensions";
  let description = [{
    `result.shape[i] = input.shape[permutation[i]]`.

    ```mlir
    %y = bonsai.transpose %x {permutation = array<i64: 1, 0>} : (tensor<768x2304xf32>) -> tensor<2304x768xf32>
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$input, DenseI64ArrayAttr:$permutation);
  let results = (outs Bonsai_Tensor:$result);
}

def Bonsai_SliceOp : Bonsai_ModelOp<"slice", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_TokenwiseOpInterface, ["whyNotTokenwise"]>]> {
  let summary = "a contiguous range along one dimension";
  let description = [{
    Takes `size` entries starting at `start` along dimension `axis` (splitting GPT-2's fused
    c_attn projection, taking the first T learned positions).

    ```mlir
    %q = bonsai.slice %qkv {axis = 2 : i64, start = 0 : i64} : (tensor<2x64x192xf32>) -> tensor<2x64x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_Tensor:$input, I64Attr:$axis, I64Attr:$start);
  let results = (outs Bonsai_Tensor:$result);
}

def Bonsai_ConcatOp : Bonsai_ModelOp<"concat", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>]> {
  let summary = "tensors joined along one dimension";
  let description = [{
    The inputs in order along dimension `axis`; every other dimension equal. bonsai-tile-sequence
    joins the chunks of a tiled MLP with it (docs/remat.md, "Tiling the sequence"); its gradient
    is a slice per input.

    ```mlir
    %y = bonsai.concat %a, %b {axis = 1 : i64} : (tensor<1x32x64xf32>, tensor<1x32x64xf32>) -> tensor<1x64x64xf32>
    ```
  }];
  let arguments = (ins Variadic<Bonsai_Tensor>:$inputs, I64Attr:$axis);
  let results = (outs Bonsai_Tensor:$result);
}

def Bonsai_CastOp : Bonsai_ModelOp<"cast", [DeclareOpInterfaceMethods<Bonsai_GradientOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_ElementwiseOpInterface>]> {
  let summary = "element type conversion (round to nearest even; saturating for FP8)";
  let description = [{
    ```mlir
    %y = bonsai.cast %x : (tensor<2x64x256xbf16>) -> tensor<2x64x256xf32>
    ```
  }];
  let arguments = (ins Bonsai_FloatTensor:$input);
  let results = (outs Bonsai_FloatTensor:$result);
}

def Bonsai_DequantizeOp : Bonsai_ModelOp<"dequantize", [Bonsai_RecomputeOpInterface]> {
  let summary = "NF4 (double-quantized) tensor to a compute type";
  let description = [{
    Each element is its NormalFloat level times its block's absmax, itself dequantized from 8
    bits with its group's fp32 scale and the tensor's offset (docs/quantization.md). Inserted
    by bonsai-quantize before the uses of a quantized weight; the backward pass dequantizes
    again rather than keeping the result (RecomputeOpInterface).

    ```mlir
    %w = bonsai.dequantize %q : (tensor<128x64x!bonsai.nf4<64, 256>>) -> tensor<128x64xbf16>
    ```
  }];
  let arguments = (ins Bonsai_NF4Tensor:$input);
  let results = (outs Bonsai_ComputeTensor:$result);
}

include "bonsai/Dialect/Bonsai/IR/BonsaiTrainingOps.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiOptimizerOps.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiGaLoreOps.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiFusedOps.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiFusedOptimizerOps.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiGemmEpilogueOps.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiElementwiseOps.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiFlashAttentionOps.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiFp8Ops.td"
include "bonsai/Dialect/Bonsai/IR/BonsaiCollectiveOps.td"

//===----------------------------------------------------------------------===//
// Recipe ops
//===----------------------------------------------------------------------===//

def Bonsai_RecipeOp : Bonsai_Op<"recipe", [Symbol, IsolatedFromAbove, NoTerminator,
    SingleBlock, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a training recipe: directives that configure the compiler pipeline";
  let description = [{
    Holds at most one directive of each kind. `for @model` names the function the recipe applies
    to; without it, the recipe applies to the only model function of the enclosing module, if
    there is exactly one (a recipe file parsed alone is checked on its own). Each directive
    checks itself against the model through `RecipeDirectiveOpInterface`; the recipe checks that
    directives do not contradict each other.

    ```mlir
    bonsai.recipe @qlora for @forward {
      bonsai.target "sm_89" device_memory 24576 MiB
      bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj", "v_proj"]
      bonsai.lora rank 16 alpha 3.200000e+01 targets ["q_proj", "v_proj"]
      bonsai.optimizer "adamw" lr 2.000000e-04
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, OptionalAttr<FlatSymbolRefAttr>:$model);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name (`for` $model^)? attr-dict-with-keyword $body";
  let hasRegionVerifier = 1;
}

class Bonsai_DirectiveOp<string mnemonic, list<Trait> traits = []>
    : Bonsai_Op<mnemonic, !listconcat(traits, [HasParent<"RecipeOp">,
          DeclareOpInterfaceMethods<Bonsai_RecipeDirectiveOpInterface>])> {
  let hasVerifier = 1;
}

class Bonsai_TargetedDirectiveOp<string mnemonic>
    : Bonsai_Op<mnemonic, [HasParent<"RecipeOp">,
          DeclareOpInterfaceMethods<Bonsai_RecipeDirectiveOpInterface,
                                    ["getTargetPatterns"]>]> {
  let hasVerifier = 1;
}

def Bonsai_TargetDirectiveOp : Bonsai_DirectiveOp<"target"> {
  let summary = "the GPU the recipe compiles for, and its memory budgets";
  let description = [{
    `arch` is `sm_XX` (sm_80 Ampere, sm_86 A10G, sm_89 Ada, sm_90 Hopper, or another generic
    compute capability); `device_memory` is the per-GPU budget in MiB; `host_memory` the
    pinned host memory each process (each GPU's rank) may hold, in MiB: what offloaded state
    and activations take (docs/offload.md).

    ```mlir
    bonsai.target "sm_90" device_memory 24576 MiB host_memory 65536 MiB
    ```
  }];
  let arguments = (ins StrAttr:$arch, OptionalAttr<I64Attr>:$device_memory_mib,
                   OptionalAttr<I64Attr>:$host_memory_mib);
  let assemblyFormat = [{
    $arch (`device_memory` $device_memory_mib^ `MiB`)? (`host_memory` $host_memory_mib^ `MiB`)?
    attr-dict
  }];
}

def Bonsai_QuantizeDirectiveOp : Bonsai_TargetedDirectiveOp<"quantize"> {
  let summary = "quantize frozen base weights to NF4 with double quantization (QLoRA)";
  let description = [{
    ```mlir
    bonsai.quantize "nf4" block 64 double_quant 256 targets ["*_proj"]
    ```
  }];
  let arguments = (ins StrAttr:$format, I64Attr:$block_size, I64Attr:$double_quant_block,
                   StrArrayAttr:$targets);
  let assemblyFormat = [{
    $format `block` $block_size `double_quant` $double_quant_block `targets` $targets attr-dict
  }];
}

def Bonsai_LoraDirectiveOp : Bonsai_TargetedDirectiveOp<"lora"> {
  let summary = "LoRA (or, with `dora`, DoRA) adapters on the targeted linears";
  let description = [{
    Patterns name linears by their weight's module path as PEFT's `target_modules` does: a plain
    name matches a module whose dotted path ends with it (`q_proj`), a pattern with `*` or `?` is
    a glob over the full weight name. The scale is alpha / rank. There is no adapter dropout
    (PEFT's `lora_dropout = 0`).

    ```mlir
    bonsai.lora dora rank 16 alpha 3.200000e+01 targets ["q_proj", "k_proj", "v_proj"]
    ```
  }];
  let arguments = (ins UnitAttr:$dora, I64Attr:$rank, F64Attr:$alpha,
                   StrArrayAttr:$targets);
  let assemblyFormat = [{
    (`dora` $dora^)? `rank` $rank `alpha` $alpha `targets` $targets attr-dict
  }];
}

def Bonsai_OptimizerDirectiveOp : Bonsai_DirectiveOp<"optimizer"> {
  let summary = "the optimizer, its hyper-parameters and learning-rate schedule";
  let description = [{
    `kind` is `adamw` or `sgd`. `schedule` is `constant` or `cosine` (linear warmup over
    `warmup_steps`, then cosine decay to `min_lr_ratio * lr` at `total_steps`).
    `grad_clip` (global norm) is off when 0.

    `update_in_backward` applies each parameter's update in the backward pass, as soon as its
    gradient is complete, instead of accumulating every gradient for an update phase: the step
    then keeps no gradient accumulators (4 bytes per trainable parameter less). It needs one
    micro-batch per step and no clipping (both need every gradient before any update).

    `master_weights` (default true) keeps an fp32 master copy of every bf16 or f16 parameter,
    which the update accumulates into before rounding the parameter. Without it a
    half-precision parameter is updated in place (4 bytes per parameter less) and each update
    rounds to the parameter's dtype, to nearest: an update below half a unit in the last place
    of a weight is lost, so this suits pre-training learning rates (GaLore's 1e-2), not the
    1e-5 of a fine-tune.

    ```mlir
    bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-01 : f64, schedule = "cosine", warmup_steps = 100 : i64, total_steps = 1000 : i64}
    bonsai.optimizer "adamw" lr 3.000000e-04 {update_in_backward = true}
    ```
  }];
  let arguments = (ins StrAttr:$kind, F64Attr:$lr,
                   DefaultValuedAttr<F64Attr, "0.9">:$beta1,
                   DefaultValuedAttr<F64Attr, "0.999">:$beta2,
                   DefaultValuedAttr<F64Attr, "1.0e-8">:$eps,
                   DefaultValuedAttr<F64Attr, "0.0">:$weight_decay,
                   DefaultValuedAttr<F64Attr, "0.0">:$momentum,
                   DefaultValuedAttr<F64Attr, "0.0">:$grad_clip,
                   DefaultValuedAttr<StrAttr, "\"constant\"">:$schedule,
                   DefaultValuedAttr<I64Attr, "0">:$warmup_steps,
                   DefaultValuedAttr<I64Attr, "0">:$total_steps,
                   DefaultValuedAttr<F64Attr, "0.0">:$min_lr_ratio,
                   DefaultValuedAttr<I64Attr, "1">:$micro_batches,
                   DefaultValuedAttr<BoolAttr, "false">:$update_in_backward,
                   DefaultValuedAttr<BoolAttr, "true">:$master_weights);
  let assemblyFormat = "$kind `lr` $lr attr-dict";
}

def Bonsai_GaloreDirectiveOp : Bonsai_TargetedDirectiveOp<"galore"> {
  let summary = "GaLore: optimizer moments of the targeted 2-D weights in a rank-r subspace";
  let description = [{
    `projector` is `svd` (top-r singular vectors) or `randomized` (range finder with power
    iterations). Adam's moments are kept across refreshes, as in the GaLore paper
    (docs/galore.md says why rotating them into the new basis is not offered).

    ```mlir
    bonsai.galore rank 128 update_proj_gap 200 scale 2.500000e-01 projector "svd" targets ["*_proj"]
    ```
  }];
  let arguments = (ins I64Attr:$rank, I64Attr:$update_proj_gap, F64Attr:$scale,
                   StrAttr:$projector, StrArrayAttr:$targets);
  let assemblyFormat = [{
    `rank` $rank `update_proj_gap` $update_proj_gap `scale` $scale `projector` $projector
    `targets` $targets attr-dict
  }];
}

def Bonsai_FP8DirectiveOp : Bonsai_TargetedDirectiveOp<"fp8"> {
  let summary = "FP8 GEMMs on the targeted linears: E4M3 forward, E5M2 gradients";
  let description = [{
    `scaling` is `delayed` (per-tensor amax history of `amax_history` steps, 1 to 1024) or
    `current`; `margin` is the power of two kept as head-room. `forward_accumulation` is
    `promoted` (the default: the forward GEMM adds its partial sums into fp32 registers as it
    goes, as the backward GEMMs always do) or `fast` (it keeps its sum in the tensor cores'
    accumulator, as Transformer Engine's and torchao's recipes run it: faster, and outside
    the 500-step loss check's 1% on TinyLlama's shape, docs/fp8.md). `targets []`
    means every linear except the LM head and a linear whose weight an embedding also reads
    (tied). The `bonsai-fp8` pass carries it out on targets with FP8 tensor cores
    (docs/fp8.md).

    ```mlir
    bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["layers.*"]
    bonsai.fp8 "current" amax_history 1 margin 0 forward_accumulation "fast" targets []
    ```
  }];
  let arguments = (ins StrAttr:$scaling, I64Attr:$amax_history, I64Attr:$margin,
                   DefaultValuedStrAttr<StrAttr, "promoted">:$forward_accumulation,
                   StrArrayAttr:$targets);
  let assemblyFormat = [{
    $scaling `amax_history` $amax_history `margin` $margin
    (`forward_accumulation` $forward_accumulation^)? `targets` $targets attr-dict
  }];
}

def Bonsai_ShardDirectiveOp : Bonsai_DirectiveOp<"shard"> {
  let summary = "FSDP / ZeRO-3: parameters, gradients and optimizer state over ranks";
  let description = [{
    `strategy` is `zero1` (optimizer state and master weights sharded), `zero2` (and the
    gradient accumulators) or `zero3` (and the parameters); the `bonsai-shard` pass carries it
    out (docs/sharding.md). `reshard_after_forward` (zero3 only; PyTorch FSDP2's knob of the
    same name) says whether a parameter gathered for the forward pass is freed after its
    forward uses and gathered again for the backward pass (`true`, the default: the least
    memory) or kept from its forward to its backward uses (`false`: one all-gather per
    micro-batch instead of two, for the memory of the gathered weights between them), or
    `"auto"`: bonsai-compile compiles the step both ways and keeps the gathered weights where
    that fits the device budget and the predicted step is shorter, saying which and why.

    ```mlir
    bonsai.shard "zero3" ranks 2
    bonsai.shard "zero3" ranks 4 reshard_after_forward false
    bonsai.shard "zero3" ranks 8 reshard_after_forward "auto"
    ```
  }];
  let arguments = (ins StrAttr:$strategy, I64Attr:$ranks,
                   OptionalAttr<AnyAttrOf<[BoolAttr, StrAttr]>>:$reshard_after_forward);
  let assemblyFormat = [{
    $strategy `ranks` $ranks (`reshard_after_forward` $reshard_after_forward^)? attr-dict
  }];
  let extraClassDeclaration = [{
    /// Whether zero3 keeps each gathered parameter from its forward to its backward uses
    /// (`reshard_after_forward false`); "auto" keeps none until bonsai-compile chooses.
    bool keepsGathered() {
      auto flag = ::llvm::dyn_cast_or_null<::mlir::BoolAttr>(getReshardAfterForwardAttr());
      return flag && !flag.getValue();
    }
    /// Whether the recipe leaves reshard_after_forward to the compiler (`"auto"`).
    bool choosesReshard() {
      return ::llvm::isa_and_nonnull<::mlir::StringAttr>(getReshardAfterForwardAttr());
    }
  }];
}

def Bonsai_OffloadDirectiveOp : Bonsai_DirectiveOp<"offload"> {
  let summary = "state classes kept in pinned host memory, copied over PCIe as needed";
  let description = [{
    Classes: `optimizer_state` (the moments and momentum buffers of the optimizer updates),
    `master_weights` (the fp32 master copies of bf16 or f16 parameters), `parameters`,
    `gradients`, `activations`. The `bonsai-offload` pass carries out `optimizer_state` and
    `master_weights`: the state is placed in pinned host memory and each update streams it
    through the device (docs/offload.md). `activations` is bonsai-remat's third choice for a
    saved activation, placed by `bonsai-offload-activations` (docs/remat.md). `parameters`
    and `gradients` are refused for now.

    `update` says where the optimizer updates of offloaded state run: `"device"` (the
    default: each update's state is copied to the device and back around it), `"host"`
    (the update runs on the CPU over the state in pinned host memory; its gradient and
    scalars are copied to the host before it and the parameter back to the device after it)
    or `"auto"` (each update where a simulation of the step on the recipe's target finishes
    it sooner: the host's cores and the link then work at once; a remark gives the split).

    ```mlir
    bonsai.offload ["optimizer_state"]
    bonsai.offload ["optimizer_state", "master_weights"]
    bonsai.offload ["optimizer_state", "master_weights"] update "host"
    ```
  }];
  let arguments = (ins StrArrayAttr:$classes, OptionalAttr<StrAttr>:$update);
  let assemblyFormat = "$classes (`update` $update^)? attr-dict";
}

def Bonsai_RingDirectiveOp : Bonsai_DirectiveOp<"ring"> {
  let summary = "RingAttention: the sequence split over ranks";
  let description = [{
    ```mlir
    bonsai.ring ranks 4
    ```
  }];
  let arguments = (ins I64Attr:$ranks);
  let assemblyFormat = "`ranks` $ranks attr-dict";
}

def Bonsai_RematDirectiveOp : Bonsai_DirectiveOp<"remat"> {
  let summary = "activation rematerialization policy";
  let description = [{
    `none`, `full` (keep only block inputs), `selective` (keep block inputs and GEMM outputs,
    recompute cheap memory-heavy ops) or `auto` (fit the target's device memory with the fewest
    recomputed FLOPs; needs `device_memory` on the target). The `bonsai-remat` pass carries it
    out (docs/remat.md); a training step under a budget gets `auto` without the directive.
    `sequence_chunks N` also runs each MLP block over N chunks of the sequence, one at a time
    (bonsai-tile-sequence; docs/remat.md, "Tiling the sequence").

    ```mlir
    bonsai.remat "selective"
    bonsai.remat "full" sequence_chunks 8
    ```
  }];
  let arguments = (ins StrAttr:$policy, OptionalAttr<I64Attr>:$sequence_chunks);
  let assemblyFormat = "$policy (`sequence_chunks` $sequence_chunks^)? attr-dict";
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIOPS_TD
