//===- BonsaiGemmEpilogueOps.td - GEMMs with fused epilogues -*- tablegen -*-===//
//
// GEMMs that do the work of their neighbour in the GEMM's epilogue, where cuBLASLt has an
// epilogue for it: bonsai-fuse (family `gemm-epilogue`) forms them. Each computes what the
// unfused pair computes (see docs/fusion.md for where the rounding differs on the GPU).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIGEMMEPILOGUEOPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIGEMMEPILOGUEOPS_TD

def Bonsai_LinearGeLUOp : Bonsai_ModelOp<"linear_gelu"> {
  let summary = "y = gelu_tanh(x · Wᵀ (+ b)), keeping the pre-activation";
  let description = [{
    `bonsai.linear` followed by `bonsai.gelu` with the tanh approximation (GPT-2's MLP), as one
    GEMM with cuBLASLt's GELU_AUX_BIAS epilogue. The first result is the activation, the second
    the pre-activation x · Wᵀ + b, which the backward pass's `bonsai.gelu_grad` reads.
    Operands and both results share the element type.

    ```mlir
    %y, %pre = bonsai.linear_gelu %x, %w, %b : (tensor<2x8x16xbf16>, tensor<64x16xbf16>, tensor<64xbf16>) -> (tensor<2x8x64xbf16>, tensor<2x8x64xbf16>)
    ```
  }];
  let arguments = (ins Bonsai_FloatTensor:$input, Bonsai_FloatTensor:$weight,
                   Optional<Bonsai_FloatTensor>:$bias);
  let results = (outs Bonsai_FloatTensor:$result, Bonsai_FloatTensor:$pre_activation);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
}

def Bonsai_LinearAddOp : Bonsai_ModelOp<"linear_add"> {
  let summary = "y = addend + x · Wᵀ";
  let description = [{
    `bonsai.linear` (without a bias) whose only reader is a `bonsai.add` of another value of
    the result's shape, as one GEMM with beta = 1 and the addend as cuBLASLt's C: a LoRA
    adapter's output added to its base linear's (x · Wᵀ + s · (x · Aᵀ) · Bᵀ), or two linears
    summed. The linear's result is never stored on its own. Operands and result share the
    element type.

    ```mlir
    %y = bonsai.linear_add %x, %w, %addend : (tensor<2x8x16xbf16>, tensor<32x16xbf16>, tensor<2x8x32xbf16>) -> tensor<2x8x32xbf16>
    ```
  }];
  let arguments = (ins Bonsai_FloatTensor:$input, Bonsai_FloatTensor:$weight,
                   Bonsai_FloatTensor:$addend);
  let results = (outs Bonsai_FloatTensor:$result);
}

def Bonsai_LinearGradWeightAccumulateOp
    : Bonsai_UpdateOp<"linear_grad_weight_accumulate", [2]> {
  let summary = "acc += dyᵀ · x over all leading dimensions, in place";
  let description = [{
    `bonsai.linear_grad_weight` followed by `bonsai.accumulate` of its result, as one GEMM with
    beta = 1 into the accumulator: the weight-sized gradient is never materialised. The sum
    dyᵀ · x is formed in fp32 and added to the accumulator once.

    ```mlir
    bonsai.linear_grad_weight_accumulate %dy, %x, %acc : tensor<2x8x32xbf16>, tensor<2x8x16xbf16>, tensor<32x16xf32>
    ```
  }];
  let arguments = (ins Bonsai_FloatTensor:$result_grad, Bonsai_FloatTensor:$input,
                   Bonsai_FloatTensor:$accumulator);
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIGEMMEPILOGUEOPS_TD
