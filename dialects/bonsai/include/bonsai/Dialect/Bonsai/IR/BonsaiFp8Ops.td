//===- BonsaiFp8Ops.td - FP8 GEMMs and their scaling state -----*- tablegen -*-===//
//
// The ops `bonsai-fp8` puts in place of a linear and its backward GEMMs (docs/fp8.md, "FP8
// training: ops, state and kernels"): each GEMM casts its two operands to FP8 (E4M3FN for
// activations and weights, E5M2 for output gradients) with the scales of a piece of training
// state, multiplies on FP8 tensor cores with f32 accumulation, and reports what the casts did;
// one update per step turns those reports into the next step's scales. They are created after
// autodiff, so they have no gradients of their own. Plan kinds Fp8Linear ..
// Fp8LinearBackwardFromInputCast (runtime/schema/plan.fbs); bonsai-fuse forms the accumulating
// weight gradient (Fp8LinearGradWeightAccumulate), the fused backward (Fp8LinearBackward), the
// GEMMs that reuse a sibling's cast of their input (Fp8LinearSharedInput,
// Fp8LinearBackwardSharedInput) and the forward that keeps its input's cast for the backward
// (Fp8LinearWithInputCast, Fp8LinearBackwardFromInputCast).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIFP8OPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIFP8OPS_TD

/// The layout facts the three GEMMs, their update and bonsai-fp8 share. The runtime has the
/// same numbers in runtime/include/bonsai/runtime/Fp8.h (fp8::StateColumn, fp8::StatsColumn,
/// fp8::gemmWorkspaceBytes), which plan validation checks plans against.
defvar Bonsai_Fp8LayoutDecls = [{
    /// Rows of the scaling state: the input x, the weight W, the output gradient dy.
    static constexpr int64_t kStateRows = 3;
    /// Columns of the state before the amax history: the scale, then the last update's
    /// amax, underflow fraction and saturation fraction (fp8::kStateColumns).
    static constexpr int64_t kStateColumns = 4;
    /// The longest amax history (the recipe's `amax_history` is 1 to this).
    static constexpr int64_t kMaxAmaxHistory = 1024;
    /// A GEMM's statistics: a row per cast operand of (amax, underflow fraction, saturation
    /// fraction, scale used) (fp8::kStatsColumns).
    static constexpr int64_t kStatsRows = 2;
    static constexpr int64_t kStatsColumns = 4;
    /// FP8 tensor-core GEMMs (cuBLASLt) need M, N and K to be multiples of this.
    static constexpr int64_t kDimensionMultiple = 16;
    /// f32 elements of the workspace of a GEMM whose cast operands have `aElements` and
    /// `bElements` elements: each operand's one-byte codes rounded up to 256 bytes, then 256
    /// bytes for the scales and counters the device computes. The runtime computes the same
    /// size in fp8::gemmWorkspaceBytes (runtime/cpu/Fp8.cpp), in bytes.
    static int64_t getWorkspaceElements(int64_t aElements, int64_t bElements) {
      auto roundUp = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
      return (roundUp(aElements) + roundUp(bElements) + 256) / 4;
    }
}];

/// An FP8 GEMM: operands, then the state; results: the product, the casts' statistics, the
/// workspace. `current` scales every cast from its own tensor's amax instead of the state's
/// delayed scale; `margin` is the power of two of head-room below the format's largest value.
class Bonsai_Fp8GemmOp<string mnemonic, list<Trait> traits = []>
    : Bonsai_ModelOp<mnemonic, traits, ["getWorkspaceResults"]> {
  let results = (outs Bonsai_ComputeTensor:$result, Bonsai_ComputeTensor:$stats,
                      Bonsai_ComputeTensor:$workspace);
  let extraClassDeclaration = Bonsai_Fp8LayoutDecls;
}

def Bonsai_Fp8LinearOp : Bonsai_Fp8GemmOp<"fp8_linear"> {
  let summary = "y = x · Wᵀ (+ b) from E4M3FN casts of x and W, accumulated in f32";
  let description = [{
    `bonsai.linear` on FP8 tensor cores. x [..., K] and W [N, K] are cast to E4M3FN with the
    scales of rows 0 and 1 of `state` (f32 [3, 4 + H], docs/fp8.md), or from their own amax
    when that scale is still 0 or under `current` scaling; the product is divided by both
    scales, the bias added, and y [..., N] stored in x's element type. `stats` (f32 [2, 4])
    holds, for x then W, the amax, underflow and saturation fractions of the cast and the
    scale used; `bonsai.fp8_update_scales` reads it. `workspace` is scratch (the casts'
    codes). M (x's elements / K), N and K are multiples of 16. With `fast_accumulation` the
    GEMM keeps its sum in the tensor cores' accumulator instead of adding partial sums into
    fp32 registers (faster, less precise over long K; the recipe's `forward_accumulation
    "fast"`).

    ```mlir
    %y, %stats, %ws = bonsai.fp8_linear %x, %w, %state {current = false, margin = 0 : i64} : (tensor<4x64x64xbf16>, tensor<128x64xbf16>, tensor<3x20xf32>) -> (tensor<4x64x128xbf16>, tensor<2x4xf32>, tensor<6208xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input, Bonsai_ComputeTensor:$weight,
                   Bonsai_ComputeTensor:$state, Optional<Bonsai_ComputeTensor>:$bias,
                   BoolAttr:$current, I64Attr:$margin,
                   DefaultValuedAttr<BoolAttr, "false">:$fast_accumulation);
}

def Bonsai_Fp8LinearGradInputOp : Bonsai_Fp8GemmOp<"fp8_linear_grad_input"> {
  let summary = "dx = dy · W from an E5M2 cast of dy and an E4M3FN cast of W";
  let description = [{
    `bonsai.linear_grad_input` on FP8 tensor cores: dy [..., N] is cast to E5M2 with row 2 of
    `state`, W [N, K] to E4M3FN with row 1 (transposed: FP8 tensor cores take only the "TN"
    layout); dx [..., K] is stored in dy's element type. `stats` rows: dy, then W.

    ```mlir
    %dx, %stats, %ws = bonsai.fp8_linear_grad_input %dy, %w, %state {current = false, margin = 0 : i64} : (tensor<4x64x128xbf16>, tensor<128x64xbf16>, tensor<3x20xf32>) -> (tensor<4x64x64xbf16>, tensor<2x4xf32>, tensor<10304xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$weight,
                   Bonsai_ComputeTensor:$state, BoolAttr:$current, I64Attr:$margin);
}

def Bonsai_Fp8LinearGradWeightOp : Bonsai_Fp8GemmOp<"fp8_linear_grad_weight",
    [DeclareOpInterfaceMethods<Bonsai_AccumulatingProducerOpInterface>]> {
  let summary = "dW = dyᵀ · x from an E5M2 cast of dy and an E4M3FN cast of x";
  let description = [{
    `bonsai.linear_grad_weight` on FP8 tensor cores, over all leading dimensions: dy [..., N]
    is cast to E5M2 with row 2 of `state`, x [..., K] to E4M3FN with row 0 (both transposed);
    dW [N, K] is stored in the element type of the linear_grad_weight it replaces (f32, bf16
    or f16). `stats` rows: dy, then x.

    ```mlir
    %dw, %stats, %ws = bonsai.fp8_linear_grad_weight %dy, %x, %state {current = false, margin = 0 : i64} : (tensor<4x64x128xbf16>, tensor<4x64x64xbf16>, tensor<3x20xf32>) -> (tensor<128x64xbf16>, tensor<2x4xf32>, tensor<12352xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$input,
                   Bonsai_ComputeTensor:$state, BoolAttr:$current, I64Attr:$margin);
}

def Bonsai_Fp8LinearGradWeightAccumulateOp : Bonsai_Op<"fp8_linear_grad_weight_accumulate", [
    MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_KernelOpInterface,
                              ["getInPlaceOperands", "getWorkspaceResults"]>]> {
  let summary = "acc += dyᵀ · x from E5M2 and E4M3FN casts, in place";
  let description = [{
    `bonsai.fp8_linear_grad_weight` followed by `bonsai.accumulate` of its result, as one FP8
    GEMM with beta = 1 into the accumulator (bonsai-fuse, family `gemm-epilogue`): the
    weight-sized gradient is never materialised. The casts, `stats` and `workspace` are those
    of fp8_linear_grad_weight; the product, divided by both scales in f32, is added to the
    accumulator (f32 [N, K]) once.

    ```mlir
    %stats, %ws = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %state, %acc {current = false, margin = 0 : i64} : (tensor<4x64x128xbf16>, tensor<4x64x64xbf16>, tensor<3x20xf32>, tensor<128x64xf32>) -> (tensor<2x4xf32>, tensor<12352xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$input,
                   Bonsai_ComputeTensor:$state, Bonsai_ComputeTensor:$accumulator,
                   BoolAttr:$current, I64Attr:$margin);
  let results = (outs Bonsai_ComputeTensor:$stats, Bonsai_ComputeTensor:$workspace);
  let hasVerifier = 1;
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = Bonsai_Fp8LayoutDecls;
}

def Bonsai_Fp8LinearBackwardOp : Bonsai_Op<"fp8_linear_backward", [
    MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_KernelOpInterface,
                              ["getInPlaceOperands", "getWorkspaceResults"]>]> {
  let summary = "dx = dy · W and acc += dyᵀ · x from one E5M2 cast of dy, in place";
  let description = [{
    `bonsai.fp8_linear_grad_input` and `bonsai.fp8_linear_grad_weight_accumulate` of one
    linear (the same dy and state) as one kernel (bonsai-fuse, family `fp8-backward`): dy is
    read once and cast to E5M2 into both layouts the two GEMMs take, in the same pass as the
    transposed E4M3FN casts of W and x. `input_grad_stats` and `weight_grad_stats` are the two
    ops' statistics (rows dy, W and dy, x), `workspace` the two ops' workspaces together; dx
    is stored in dy's element type and the weight gradient added into the f32 accumulator.
    dy, W and x have one element type.

    ```mlir
    %dx, %dxs, %dws, %ws = bonsai.fp8_linear_backward %dy, %w, %x, %state, %acc {current = false, margin = 0 : i64} : (tensor<4x64x128xbf16>, tensor<128x64xbf16>, tensor<4x64x64xbf16>, tensor<3x20xf32>, tensor<128x64xf32>) -> (tensor<4x64x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<22656xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$weight,
                   Bonsai_ComputeTensor:$input, Bonsai_ComputeTensor:$state,
                   Bonsai_ComputeTensor:$accumulator, BoolAttr:$current, I64Attr:$margin);
  let results = (outs Bonsai_ComputeTensor:$input_grad, Bonsai_ComputeTensor:$input_grad_stats,
                      Bonsai_ComputeTensor:$weight_grad_stats, Bonsai_ComputeTensor:$workspace);
  let hasVerifier = 1;
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = Bonsai_Fp8LayoutDecls;
}

def Bonsai_Fp8LinearSharedInputOp : Bonsai_Fp8GemmOp<"fp8_linear_shared_input"> {
  let summary = "fp8_linear of an input another fp8_linear has already cast";
  let description = [{
    `bonsai.fp8_linear` of an input that a sibling `fp8_linear` (the same input, `current`
    and `margin`: q, k and v of one block, or its gate and up projections) has cast already
    (bonsai-fuse, family `fp8-shared-input`): the input's E4M3FN codes are read from the
    sibling's workspace `input_cast` and its scale from the sibling's `input_stats` (row 0),
    so only W is cast. Row 0 of `stats` is the sibling's, so the delayed-scale update records
    the same input amax in both states, as it would with two casts: the two states' input
    rows, equal from their first step, stay equal, and the result is the unfused op's bit for
    bit. The input is [..., K] with the result's leading dimensions and the weight's K.

    ```mlir
    %y2, %stats2, %ws2 = bonsai.fp8_linear_shared_input %ws, %stats, %w2, %state2 {current = false, margin = 0 : i64} : (tensor<6208xf32>, tensor<2x4xf32>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<4x64x32xbf16>, tensor<2x4xf32>, tensor<576xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input_cast, Bonsai_ComputeTensor:$input_stats,
                   Bonsai_ComputeTensor:$weight, Bonsai_ComputeTensor:$state,
                   Optional<Bonsai_ComputeTensor>:$bias, BoolAttr:$current, I64Attr:$margin,
                   DefaultValuedAttr<BoolAttr, "false">:$fast_accumulation);
}

def Bonsai_Fp8LinearBackwardSharedInputOp : Bonsai_Op<"fp8_linear_backward_shared_input", [
    MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_KernelOpInterface,
                              ["getInPlaceOperands", "getWorkspaceResults"]>]> {
  let summary = "fp8_linear_backward of an input another fp8_linear_backward has already cast";
  let description = [{
    `bonsai.fp8_linear_backward` of an input whose transposed E4M3FN cast a sibling
    `fp8_linear_backward` (the same input, `current` and `margin`) has made already
    (bonsai-fuse, family `fp8-shared-input`): the codes are read from the sibling's workspace
    `input_cast`, the scale from its `input_stats` (its `weight_grad_stats`, row 1), so only dy
    and W are cast. Row 1 of `weight_grad_stats` is the sibling's. The input is [..., K] with
    result_grad's leading dimensions and the weight's K; the workspace holds dy's two layouts,
    W's codes and the scales (the fused backward's without x's codes).

    ```mlir
    %dx2, %dxs2, %dws2, %ws2 = bonsai.fp8_linear_backward_shared_input %dy2, %w2, %ws, %dws, %s2, %acc2 {current = false, margin = 0 : i64} : (tensor<4x64x32xbf16>, tensor<32x64xbf16>, tensor<22656xf32>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<4x64x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<4736xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$weight,
                   Bonsai_ComputeTensor:$input_cast, Bonsai_ComputeTensor:$input_stats,
                   Bonsai_ComputeTensor:$state, Bonsai_ComputeTensor:$accumulator,
                   BoolAttr:$current, I64Attr:$margin);
  let results = (outs Bonsai_ComputeTensor:$input_grad, Bonsai_ComputeTensor:$input_grad_stats,
                      Bonsai_ComputeTensor:$weight_grad_stats, Bonsai_ComputeTensor:$workspace);
  let hasVerifier = 1;
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = Bonsai_Fp8LayoutDecls;
}

/// A tensor of E4M3FN codes a GEMM leaves for another.
def Bonsai_Fp8CodesTensor : Bonsai_TensorOf<[F8E4M3FN]>;

def Bonsai_Fp8LinearWithInputCastOp : Bonsai_Op<"fp8_linear_with_input_cast", [Pure,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_KernelOpInterface, ["getWorkspaceResults"]>]> {
  let summary = "fp8_linear that also returns its input's transposed cast, for the backward";
  let description = [{
    `bonsai.fp8_linear` whose cast of x also writes xᵀ's E4M3FN codes, [K, M] (M = x's
    elements / K), as `input_cast` (bonsai-fuse, family `fp8-saved-input`): the fused
    backward of the same x reads them (`bonsai.fp8_linear_backward_from_input_cast`) instead of
    reading x and casting it again with the same scale. y, `stats` and the workspace are
    fp8_linear's (x's plain codes first, so that `bonsai.fp8_linear_shared_input` reads them as
    it reads fp8_linear's).

    ```mlir
    %y, %stats, %xt, %ws = bonsai.fp8_linear_with_input_cast %x, %w, %state {current = false, margin = 0 : i64} : (tensor<4x64x64xbf16>, tensor<128x64xbf16>, tensor<3x20xf32>) -> (tensor<4x64x128xbf16>, tensor<2x4xf32>, tensor<64x256xf8E4M3FN>, tensor<6208xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$input, Bonsai_ComputeTensor:$weight,
                   Bonsai_ComputeTensor:$state, Optional<Bonsai_ComputeTensor>:$bias,
                   BoolAttr:$current, I64Attr:$margin,
                   DefaultValuedAttr<BoolAttr, "false">:$fast_accumulation);
  let results = (outs Bonsai_ComputeTensor:$result, Bonsai_ComputeTensor:$stats,
                      Bonsai_Fp8CodesTensor:$input_cast, Bonsai_ComputeTensor:$workspace);
  let hasVerifier = 1;
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = Bonsai_Fp8LayoutDecls;
}

def Bonsai_Fp8LinearBackwardFromInputCastOp : Bonsai_Op<
    "fp8_linear_backward_from_input_cast", [
    MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_KernelOpInterface,
                              ["getInPlaceOperands", "getWorkspaceResults"]>]> {
  let summary = "fp8_linear_backward from the forward's transposed cast of its input";
  let description = [{
    `bonsai.fp8_linear_backward` whose weight gradient takes xᵀ's codes from the forward
    (`input_cast` [K, M] of a `bonsai.fp8_linear_with_input_cast` of the same x and scaling,
    and its `stats` as `input_stats`, whose row 0 gives x's scale and becomes row 1 of
    `weight_grad_stats`) instead of reading x (bonsai-fuse, family `fp8-saved-input`): the
    state's input scale does not change between the forward and the backward, so the codes are
    those the backward would make. Only dy and W are cast; the workspace is
    `fp8_linear_backward_shared_input`'s.

    ```mlir
    %dx, %dxs, %dws, %ws = bonsai.fp8_linear_backward_from_input_cast %dy, %w, %xt, %stats, %s, %acc {current = false, margin = 0 : i64} : (tensor<4x64x128xbf16>, tensor<128x64xbf16>, tensor<64x256xf8E4M3FN>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<128x64xf32>) -> (tensor<4x64x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<18560xf32>)
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$result_grad, Bonsai_ComputeTensor:$weight,
                   Bonsai_Fp8CodesTensor:$input_cast, Bonsai_ComputeTensor:$input_stats,
                   Bonsai_ComputeTensor:$state, Bonsai_ComputeTensor:$accumulator,
                   BoolAttr:$current, I64Attr:$margin);
  let results = (outs Bonsai_ComputeTensor:$input_grad, Bonsai_ComputeTensor:$input_grad_stats,
                      Bonsai_ComputeTensor:$weight_grad_stats, Bonsai_ComputeTensor:$workspace);
  let hasVerifier = 1;
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = Bonsai_Fp8LayoutDecls;
}

def Bonsai_Fp8UpdateScalesOp : Bonsai_Op<"fp8_update_scales", [
    MemoryEffects<[MemRead, MemWrite]>,
    DeclareOpInterfaceMethods<Bonsai_CostOpInterface>,
    DeclareOpInterfaceMethods<Bonsai_KernelOpInterface, ["getInPlaceOperands"]>]> {
  let summary = "the once-per-step delayed-scale update of an FP8 linear's state, in place";
  let description = [{
    Runs in the update phase, before the step counter is incremented. For each row of `state`
    (f32 [3, 4 + H]): records the amax the GEMMs reported in the history at `step % H`, sets
    the scale to (the format's largest finite value / the history's maximum) / 2^margin
    (keeping the previous scale while the history holds no finite nonzero amax), and stores
    the reported amax, underflow and saturation fractions in columns 1..3. `forward_stats`
    (fp8_linear's) gives rows 0 and 1; `backward_stats` (fp8_linear_grad_input's, or
    fp8_linear_grad_weight's when the input needs no gradient) row 2, which keeps its values
    without them.

    ```mlir
    bonsai.fp8_update_scales %step, %fwd, %bwd, %state {current = false, margin = 0 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x20xf32>
    ```
  }];
  let arguments = (ins 0DTensorOf<[I64]>:$step, Bonsai_ComputeTensor:$forward_stats,
                   Optional<Bonsai_ComputeTensor>:$backward_stats,
                   Bonsai_ComputeTensor:$state, BoolAttr:$current, I64Attr:$margin);
  let hasVerifier = 1;
  let assemblyFormat = "operands attr-dict `:` type(operands)";
  let extraClassDeclaration = Bonsai_Fp8LayoutDecls;
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIFP8OPS_TD
