// RUN: bonsai-opt --bonsai-fuse="only=gemm-epilogue" -split-input-file %s | FileCheck %s
// RUN: bonsai-opt --bonsai-fuse="only=optimizer" -split-input-file %s | FileCheck %s --check-prefix=OFF

// A weight gradient accumulated into its accumulator becomes one GEMM adding into it, where
// the accumulation was (its phase kept).

// CHECK-LABEL: func.func @accumulate(
// CHECK-SAME: %[[DY:[^:]*]]: tensor<2x8x32xbf16>, %[[X:[^:]*]]: tensor<2x8x16xbf16>
// CHECK: %[[ACC:.*]] = bonsai.state gradient "w"
// CHECK-NEXT: bonsai.linear_grad_weight_accumulate %[[DY]], %[[X]], %[[ACC]] {bonsai.phase = "backward"} : tensor<2x8x32xbf16>, tensor<2x8x16xbf16>, tensor<32x16xf32>
// CHECK-NOT: bonsai.accumulate
// CHECK-NOT: bonsai.linear_grad_weight
// OFF-LABEL: func.func @accumulate
// OFF: bonsai.linear_grad_weight %
// OFF: bonsai.accumulate
func.func @accumulate(%dy: tensor<2x8x32xbf16>, %x: tensor<2x8x16xbf16>) {
  %g = bonsai.linear_grad_weight %dy, %x {bonsai.phase = "backward"} : (tensor<2x8x32xbf16>, tensor<2x8x16xbf16>) -> tensor<32x16xbf16>
  %acc = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<32x16xf32>
  bonsai.accumulate %g, %acc {bonsai.phase = "backward"} : tensor<32x16xbf16>, tensor<32x16xf32>
  return
}

// -----

// GPT-2's Conv1D weights are stored [in, out]: their gradient is the transpose of a weight
// gradient, which is the GEMM with its operands swapped, and that accumulates like any other.

// CHECK-LABEL: func.func @conv1d(
// CHECK-SAME: %[[DY:[^:]*]]: tensor<2x8x32xf32>, %[[X:[^:]*]]: tensor<2x8x16xf32>
// CHECK: bonsai.linear_grad_weight_accumulate %[[X]], %[[DY]], %{{.*}} {bonsai.phase = "backward"} : tensor<2x8x16xf32>, tensor<2x8x32xf32>, tensor<16x32xf32>
// CHECK-NOT: bonsai.transpose
func.func @conv1d(%dy: tensor<2x8x32xf32>, %x: tensor<2x8x16xf32>) {
  %g = bonsai.linear_grad_weight %dy, %x {bonsai.phase = "backward"} : (tensor<2x8x32xf32>, tensor<2x8x16xf32>) -> tensor<32x16xf32>
  %t = bonsai.transpose %g {bonsai.phase = "backward", permutation = array<i64: 1, 0>} : (tensor<32x16xf32>) -> tensor<16x32xf32>
  %acc = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<16x32xf32>
  bonsai.accumulate %t, %acc {bonsai.phase = "backward"} : tensor<16x32xf32>, tensor<16x32xf32>
  return
}

// -----

// Not fused: a gradient with another use must exist; an accumulator used between producer
// and accumulation (here zeroed) must see the producer's value added after that use; a GEMM
// whose operand is written between it and the accumulation cannot move there; a gradient that
// no GEMM produces (a bias's reduce_to) has no epilogue to go to.

// CHECK-LABEL: func.func @not_fused
// CHECK: %[[G0:.*]] = bonsai.linear_grad_weight
// CHECK: bonsai.accumulate %[[G0]]
// CHECK: %[[G1:.*]] = bonsai.linear_grad_weight
// CHECK: bonsai.zero
// CHECK: bonsai.accumulate %[[G1]]
// CHECK: %[[G2:.*]] = bonsai.linear_grad_weight
// CHECK: bonsai.zero
// CHECK: bonsai.accumulate %[[G2]]
// CHECK: %[[DB:.*]] = bonsai.reduce_to
// CHECK: bonsai.accumulate %[[DB]]
// CHECK-NOT: linear_grad_weight_accumulate
func.func @not_fused(%dy: tensor<2x8x32xf32>, %x: tensor<2x8x16xf32>) -> tensor<32x16xf32> {
  %acc0 = bonsai.state gradient "w0" : tensor<32x16xf32>
  %acc1 = bonsai.state gradient "w1" : tensor<32x16xf32>
  %accb = bonsai.state gradient "b" : tensor<32xf32>
  %g0 = bonsai.linear_grad_weight %dy, %x : (tensor<2x8x32xf32>, tensor<2x8x16xf32>) -> tensor<32x16xf32>
  bonsai.accumulate %g0, %acc0 : tensor<32x16xf32>, tensor<32x16xf32>
  %g1 = bonsai.linear_grad_weight %dy, %x : (tensor<2x8x32xf32>, tensor<2x8x16xf32>) -> tensor<32x16xf32>
  bonsai.zero %acc1 : tensor<32x16xf32>
  bonsai.accumulate %g1, %acc1 : tensor<32x16xf32>, tensor<32x16xf32>
  %acc2 = bonsai.state gradient "w2" : tensor<32x16xf32>
  %xs = bonsai.state optimizer "x" : tensor<2x8x16xf32>
  %g2 = bonsai.linear_grad_weight %dy, %xs : (tensor<2x8x32xf32>, tensor<2x8x16xf32>) -> tensor<32x16xf32>
  bonsai.zero %xs : tensor<2x8x16xf32>
  bonsai.accumulate %g2, %acc2 : tensor<32x16xf32>, tensor<32x16xf32>
  %db = bonsai.reduce_to %dy : (tensor<2x8x32xf32>) -> tensor<32xf32>
  bonsai.accumulate %db, %accb : tensor<32xf32>, tensor<32xf32>
  return %g0 : tensor<32x16xf32>
}

// -----

// GPT-2's MLP: linear with bias, then tanh GELU, become one GEMM with a GELU epilogue; its
// pre-activation replaces the linear's result for every other use (gelu_grad).

// CHECK-LABEL: func.func @linear_gelu(
// CHECK-SAME: %[[X:[^:]*]]: tensor<2x8x16xbf16>, %[[W:[^:]*]]: tensor<64x16xbf16>, %[[B:[^:]*]]: tensor<64xbf16>
// CHECK: %[[Y:.*]], %[[PRE:.*]] = bonsai.linear_gelu %[[X]], %[[W]], %[[B]] : (tensor<2x8x16xbf16>, tensor<64x16xbf16>, tensor<64xbf16>) -> (tensor<2x8x64xbf16>, tensor<2x8x64xbf16>)
// CHECK: bonsai.gelu_grad %{{.*}}, %[[PRE]]
// CHECK: return %[[Y]], %{{.*}}
// CHECK-NOT: bonsai.gelu
// OFF-LABEL: func.func @linear_gelu
// OFF: bonsai.linear %
// OFF: bonsai.gelu %
func.func @linear_gelu(%x: tensor<2x8x16xbf16>, %w: tensor<64x16xbf16>, %b: tensor<64xbf16>, %dy: tensor<2x8x64xbf16>) -> (tensor<2x8x64xbf16>, tensor<2x8x64xbf16>) {
  %pre = bonsai.linear %x, %w, %b : (tensor<2x8x16xbf16>, tensor<64x16xbf16>, tensor<64xbf16>) -> tensor<2x8x64xbf16>
  %y = bonsai.gelu %pre {approximation = #bonsai.gelu_approximation<tanh>} : (tensor<2x8x64xbf16>) -> tensor<2x8x64xbf16>
  %dx = bonsai.gelu_grad %dy, %pre {bonsai.phase = "backward", approximation = #bonsai.gelu_approximation<tanh>} : (tensor<2x8x64xbf16>, tensor<2x8x64xbf16>) -> tensor<2x8x64xbf16>
  return %y, %dx : tensor<2x8x64xbf16>, tensor<2x8x64xbf16>
}

// -----

// Not fused: cuBLASLt's GELU epilogue is the tanh approximation, so an exact GELU stays; a
// linear and a gelu of different phases (a recomputed gelu in the backward pass) stay apart.

// CHECK-LABEL: func.func @gelu_not_fused
// CHECK: bonsai.linear %
// CHECK: bonsai.gelu %{{.*}} :
// CHECK: bonsai.linear %
// CHECK: bonsai.gelu %{{.*}} {approximation = #bonsai.gelu_approximation<tanh>, bonsai.phase = "backward"}
// CHECK-NOT: linear_gelu
func.func @gelu_not_fused(%x: tensor<2x8x16xf32>, %w: tensor<64x16xf32>) -> (tensor<2x8x64xf32>, tensor<2x8x64xf32>) {
  %pre = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %y = bonsai.gelu %pre : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  %pre2 = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %y2 = bonsai.gelu %pre2 {bonsai.phase = "backward", approximation = #bonsai.gelu_approximation<tanh>} : (tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
  return %y, %y2 : tensor<2x8x64xf32>, tensor<2x8x64xf32>
}
