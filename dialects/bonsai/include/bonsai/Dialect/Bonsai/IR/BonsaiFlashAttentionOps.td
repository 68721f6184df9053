//===- BonsaiFlashAttentionOps.td - attention that keeps its log-sum-exp -*- tablegen -*-===//
//
// The ops the `flash-attention` fusion family (docs/fusion.md) puts in place of a
// `bonsai.attention` whose result feeds a `bonsai.attention_grad`, and of that grad: the forward
// also returns each query row's log-sum-exp, and the backward takes it, so it never recomputes
// the softmax statistics (nor ever the attention matrix, which neither op stores). The
// `packed-qkv` family then gives the pair of an attention whose q, k and v are slices of one
// projection (GPT-2's c_attn) its packed forms, which read them out of that tensor and write
// their gradients into one tensor of its shape.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIFLASHATTENTIONOPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIFLASHATTENTIONOPS_TD

def Bonsai_FlashAttentionOp : Bonsai_ModelOp<"flash_attention"> {
  let summary = "attention that also returns the log-sum-exp of every query row";
  let description = [{
    `output` is `bonsai.attention` of the same operands and attributes (q [batch, seq, heads,
    head_dim]; k and v [batch, seq, kv_heads, head_dim], heads a multiple of kv_heads).
    `lse` is f32 [batch, heads, seq]: lse[b, h, i] = log Σ_j exp(scale q_i·k_j) over the keys
    query i reads (natural logarithm; -inf for a query that reads no key, whose output is
    zero), the statistic `bonsai.flash_attention_grad` needs to
    recompute the probabilities p_ij = exp(scale q_i·k_j - lse_i) without a softmax pass.
    `segment_ids` (optional) masks and `ring_ranks` splits the sequence as in `bonsai.attention`.

    ```mlir
    %o, %lse = bonsai.flash_attention %q, %k, %v {causal, scale = 2.500000e-01 : f64} : (tensor<2x64x4x16xbf16>, tensor<2x64x2x16xbf16>, tensor<2x64x2x16xbf16>) -> (tensor<2x64x4x16xbf16>, tensor<2x4x64xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$query, Bonsai_ComputeTensor:$key,
                   Bonsai_ComputeTensor:$value, Optional<Bonsai_IndexTensor>:$segment_ids,
                   UnitAttr:$causal, F64Attr:$scale,
                   OptionalAttr<Bonsai_RingRanksAttr>:$ring_ranks);
  let results = (outs Bonsai_ComputeTensor:$output, Bonsai_TensorOf<[F32]>:$lse);
}

def Bonsai_FlashAttentionGradOp : Bonsai_ModelOp<"flash_attention_grad"> {
  let summary = "gradients of attention from the forward's output and log-sum-exp";
  let description = [{
    The gradients of `bonsai.attention_grad` (dq, dk, dv for dO), with the probabilities
    recomputed as exp(scale q_i·k_j - lse_i) from the `lse` that `bonsai.flash_attention`
    returned with `output`: no pass over the keys for the softmax statistics first.
    `segment_ids` (optional) masks and `ring_ranks` splits the sequence as in `bonsai.attention`.
    D_i = dO_i·o_i comes from `output` as in `bonsai.attention_grad`.

    ```mlir
    %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q, %k, %v, %o, %lse {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4x8xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$query,
                   Bonsai_ComputeTensor:$key, Bonsai_ComputeTensor:$value,
                   Bonsai_ComputeTensor:$output, Bonsai_TensorOf<[F32]>:$lse,
                   Optional<Bonsai_IndexTensor>:$segment_ids, UnitAttr:$causal, F64Attr:$scale,
                   OptionalAttr<Bonsai_RingRanksAttr>:$ring_ranks);
  let results = (outs Bonsai_ComputeTensor:$query_grad, Bonsai_ComputeTensor:$key_grad,
                      Bonsai_ComputeTensor:$value_grad);
}

def Bonsai_FlashAttentionQkvOp : Bonsai_ModelOp<"flash_attention_qkv"> {
  let summary = "flash attention of q, k and v packed in one tensor";
  let description = [{
    `bonsai.flash_attention` of q, k and v that are head ranges of one tensor, `qkv` [batch,
    seq, heads + 2·kv_heads, head_dim]: heads 0..heads-1 are q, the next kv_heads are k and
    the last kv_heads are v (a fused q/k/v projection's output, [batch, seq, (heads +
    2·kv_heads)·head_dim], viewed as heads). `heads` is the output's: `output` [batch, seq,
    heads, head_dim] in qkv's element type, `lse` f32 [batch, heads, seq], both as
    `bonsai.flash_attention` returns them; kv_heads must divide heads. The kernel reads each
    head's rows with qkv's row stride, so q, k and v are never copied out of it. `segment_ids`
    (optional) masks as in `bonsai.attention`; there is no `ring_ranks` (ring attention passes
    k and v around the ring apart). The `packed-qkv` fusion family makes it from a
    `bonsai.flash_attention` of three slices of one tensor.

    ```mlir
    %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x64x8x16xbf16>) -> (tensor<2x64x4x16xbf16>, tensor<2x4x64xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$qkv, Optional<Bonsai_IndexTensor>:$segment_ids,
                   UnitAttr:$causal, F64Attr:$scale);
  let results = (outs Bonsai_ComputeTensor:$output, Bonsai_TensorOf<[F32]>:$lse);
}

def Bonsai_FlashAttentionQkvGradOp : Bonsai_ModelOp<"flash_attention_qkv_grad"> {
  let summary = "gradients of packed flash attention, written into one tensor of qkv's shape";
  let description = [{
    The gradients of `bonsai.flash_attention_grad` for the q, k and v that
    `bonsai.flash_attention_qkv` reads out of `qkv`, written into `qkv_grad` (qkv's type) at
    the heads they were read from: dq into heads 0..heads-1, dk into the next kv_heads, dv
    into the last kv_heads. `output` and `lse` are what `bonsai.flash_attention_qkv`
    returned; `result_grad` has the output's type. `segment_ids` (optional) masks as in
    `bonsai.attention`. It takes the place of a `bonsai.flash_attention_grad` whose three
    gradients were only concatenated into the projection's gradient (`packed-qkv`).

    ```mlir
    %dqkv = bonsai.flash_attention_qkv_grad %do, %qkv, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x64x4x16xbf16>, tensor<2x64x8x16xbf16>, tensor<2x64x4x16xbf16>, tensor<2x4x64xf32>) -> tensor<2x64x8x16xbf16>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$qkv,
                   Bonsai_ComputeTensor:$output, Bonsai_TensorOf<[F32]>:$lse,
                   Optional<Bonsai_IndexTensor>:$segment_ids, UnitAttr:$causal, F64Attr:$scale);
  let results = (outs Bonsai_ComputeTensor:$qkv_grad);
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIFLASHATTENTIONOPS_TD
