//===- BonsaiGaLoreOps.td - GaLore projector and update ------*- tablegen -*-===//
//
// The ops `bonsai-galore` puts in place of the AdamW update of a targeted 2-D weight W (m x n)
// with gradient G: the projector P (s x r, s = min(m, n)) is refreshed from G every
// `update_proj_gap` steps, the gradient is projected onto it (R = Pᵀ G, r x n, when m <= n: the
// `left` side; otherwise R = G P, m x r), Adam runs on R with moments of R's shape, and the
// direction is projected back onto W. See docs/galore.md.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_DIALECT_BONSAI_IR_BONSAIGALOREOPS_TD
#define BONSAI_DIALECT_BONSAI_IR_BONSAIGALOREOPS_TD

def Bonsai_GaloreRefreshOp : Bonsai_UpdateOp<"galore_refresh", [2, 3]> {
  let summary = "refresh a GaLore projector from the gradient, on its own steps";
  let description = [{
    Operands: gradient G (m x n), step counter (read); projector P (s x r, f32) and the f32
    status vector of all GaLore weights (updated in place). Result: f32 scratch the device
    implementation works in (`getGaloreWorkspaceElements`); nothing reads it afterwards.

    With t the step counter (updates done) and n the length of `status` (the GaLore
    weights), the refresh is due when t = 0 (every projector is computed before the first
    update) or (t + offset) mod update_proj_gap = 0, or when this weight's last refresh met a
    non-finite gradient (|status[slot]| = 1) and t mod n = slot: retries are round robin, at
    most one per step over all weights. When due, P becomes the top-r left singular vectors
    of A = G (left side) or Gᵀ (right side): exactly (`svd`, the eigenvectors of the s x s
    Gram matrix A·Aᵀ, largest first, each signed so that its largest-magnitude entry is
    positive) or from a randomized range finder (`randomized`: Y = A·Ω with Ω an l x r
    Gaussian matrix drawn from (seed, slot, t), then `power_iterations` times
    Y = A·(Aᵀ·Q), Q the orthonormal factor of the previous Y; P = the Q of the last Y: the
    unique thin QR factor with a positive diagonal when Y has full column rank, computed by
    shifted CholeskyQR followed by a rank-revealing CholeskyQR; columns of a rank-deficient
    Y are completed by projected unit vectors, so P always spans Y). A gradient with a
    non-finite element, or a zero one, leaves P as it was and sets `status[slot]` to 1
    (non-finite) or 2 (nothing to span; waits for the next scheduled refresh); a successful
    refresh sets it to 0, and a refresh that is not due turns a failure into its negative
    (pending, not reported again).

    ```mlir
    %ws = bonsai.galore_refresh %g, %step, %p, %status {rank = 4 : i64, update_proj_gap = 200 : i64, offset = 0 : i64, slot = 0 : i64, left = true, projector_kind = "randomized", power_iterations = 1 : i64, seed = 0 : i64} : (tensor<16x64xf32>, tensor<i64>, tensor<16x4xf32>, tensor<2xf32>) -> tensor<448xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$gradient, 0DTensorOf<[I64]>:$step,
                   Bonsai_ComputeTensor:$projector, Bonsai_ComputeTensor:$status,
                   I64Attr:$rank, I64Attr:$update_proj_gap, I64Attr:$offset, I64Attr:$slot,
                   BoolAttr:$left, StrAttr:$projector_kind, I64Attr:$power_iterations,
                   I64Attr:$seed);
  let results = (outs Bonsai_ComputeTensor:$workspace);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = [{
    /// The smaller and the larger side of the gradient.
    int64_t getSmallSide();
    int64_t getLargeSide();
    /// f32 elements of the workspace of a refresh at rank `rank` of a gradient whose sides
    /// are `small` <= `large` (the runtime checks the same formula).
    static int64_t getWorkspaceElements(int64_t small, int64_t large, int64_t rank);
  }];
}

def Bonsai_GaloreProjectOp : Bonsai_ModelOp<"galore_project"> {
  let summary = "project a gradient onto its GaLore subspace";
  let description = [{
    R = Pᵀ·G (r x n) when `left`, else R = G·P (m x r); R is f32. With `bf16_operands` (set
    for a weight stored in bf16 or f16) G and P are rounded to bf16 before the product, which
    then runs on tensor cores; the sum is exact in fp32 on the CPU, fp32-accumulated on the GPU.

    ```mlir
    %r = bonsai.galore_project %g, %p {left = true, bf16_operands = false} : (tensor<16x64xf32>, tensor<16x4xf32>) -> tensor<4x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$gradient, Bonsai_ComputeTensor:$projector,
                   BoolAttr:$left, BoolAttr:$bf16_operands);
  let results = (outs Bonsai_ComputeTensor:$result);
}

def Bonsai_GaloreAdamWUpdateOp
    : Bonsai_UpdateOp<"galore_adamw_update", [0, 5, 6, 7, 8],
                      [DeclareOpInterfaceMethods<Bonsai_OptimizerStateOpInterface>]> {
  let summary = "AdamW on a projected gradient, projected back onto the weight";
  let description = [{
    Operands: the projected gradient R (f32, read and then overwritten with the back-projected
    direction's low-rank factor), the step counter, the learning rate, the global gradient
    norm and the projector P (read); the parameter W, the moments of R's shape and the
    optional fp32 master copy (updated in place). With c the clipping factor (AdamWAttrs):
    m = b1 m + (1 - b1) c R, v = b2 v + (1 - b2) (c R)², N = (m / (1 - b1^t)) /
    (sqrt(v / (1 - b2^t)) + eps); W = W (1 - lr wd) - lr · scale · (P·N when `left`, else
    N·Pᵀ). For a weight stored in bf16 or f16, P and -lr·scale·N are rounded to bf16 before
    the back-projection (a tensor-core GEMM on the GPU), which adds into the fp32 master.

    ```mlir
    bonsai.galore_adamw_update %r, %step, %lr, %norm, %p, %w, %m, %v {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64, grad_clip = 1.0 : f64, scale = 0.25 : f64, left = true} : tensor<4x64xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<16x4xf32>, tensor<16x64xf32>, tensor<4x64xf32>, tensor<4x64xf32>
    ```
  }];
  let arguments = (ins Bonsai_ComputeTensor:$projected, 0DTensorOf<[I64]>:$step,
                   Bonsai_LossTensor:$lr, Bonsai_LossTensor:$grad_norm,
                   Bonsai_ComputeTensor:$projector, Bonsai_ComputeTensor:$param,
                   Bonsai_ComputeTensor:$exp_avg, Bonsai_ComputeTensor:$exp_avg_sq,
                   Optional<Bonsai_ComputeTensor>:$master,
                   F64Attr:$beta1, F64Attr:$beta2, F64Attr:$eps, F64Attr:$weight_decay,
                   F64Attr:$grad_clip, F64Attr:$scale, BoolAttr:$left);
}

#endif // BONSAI_DIALECT_BONSAI_IR_BONSAIGALOREOPS_TD
