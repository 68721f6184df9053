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

// -----

// LoRA's adapted output: the base product plus the adapter's. The base GEMM (the longer sum,
// 16 against the adapter's rank 4) takes the adapter's product as its addend, where the add
// was; the adapter's GEMMs stay as they are.

// CHECK-LABEL: func.func @lora(
// CHECK-SAME: %[[X:[^:]*]]: tensor<2x8x16xbf16>, %[[W:[^:]*]]: tensor<32x16xbf16>, %[[A:[^:]*]]: tensor<4x16xbf16>, %[[B:[^:]*]]: tensor<32x4xbf16>
// CHECK: %[[H:.*]] = bonsai.linear %[[X]], %[[A]]
// CHECK: %[[D:.*]] = bonsai.linear %[[H]], %[[B]]
// CHECK: %[[Y:.*]] = bonsai.linear_add %[[X]], %[[W]], %[[D]] : (tensor<2x8x16xbf16>, tensor<32x16xbf16>, tensor<2x8x32xbf16>) -> tensor<2x8x32xbf16>
// CHECK: return %[[Y]]
// CHECK-NOT: bonsai.add
// OFF-LABEL: func.func @lora
// OFF: bonsai.add %
func.func @lora(%x: tensor<2x8x16xbf16>, %w: tensor<32x16xbf16>, %a: tensor<4x16xbf16>, %b: tensor<32x4xbf16>) -> tensor<2x8x32xbf16> {
  %base = bonsai.linear %x, %w : (tensor<2x8x16xbf16>, tensor<32x16xbf16>) -> tensor<2x8x32xbf16>
  %h = bonsai.linear %x, %a : (tensor<2x8x16xbf16>, tensor<4x16xbf16>) -> tensor<2x8x4xbf16>
  %d = bonsai.linear %h, %b : (tensor<2x8x4xbf16>, tensor<32x4xbf16>) -> tensor<2x8x32xbf16>
  %y = bonsai.add %base, %d : (tensor<2x8x32xbf16>, tensor<2x8x32xbf16>) -> tensor<2x8x32xbf16>
  return %y : tensor<2x8x32xbf16>
}

// -----

// One linear term: it adds the other term, whichever side of the add it is on (phase kept).

// CHECK-LABEL: func.func @one_linear(
// CHECK-SAME: %[[X:[^:]*]]: tensor<8x16xf32>, %[[W:[^:]*]]: tensor<32x16xf32>, %[[R:[^:]*]]: tensor<8x32xf32>
// CHECK: bonsai.linear_add %[[X]], %[[W]], %[[R]] {bonsai.phase = "backward"}
// CHECK-NOT: bonsai.add
func.func @one_linear(%x: tensor<8x16xf32>, %w: tensor<32x16xf32>, %r: tensor<8x32xf32>) -> tensor<8x32xf32> {
  %p = bonsai.linear %x, %w {bonsai.phase = "backward"} : (tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<8x32xf32>
  %y = bonsai.add %r, %p {bonsai.phase = "backward"} : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
  return %y : tensor<8x32xf32>
}

// -----

// Not fused: a linear with a bias (the bias epilogue and C are not combined), a product with
// another reader (it must be stored), an addend that broadcasts (C is laid out as the
// result), a linear of another phase, and one whose operand is written before the add.

// CHECK-LABEL: func.func @add_not_fused
// CHECK-COUNT-5: bonsai.add
// CHECK-NOT: linear_add
func.func @add_not_fused(%x: tensor<8x16xf32>, %w: tensor<32x16xf32>, %b: tensor<32xf32>, %r: tensor<8x32xf32>) -> (tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>) {
  %p0 = bonsai.linear %x, %w, %b : (tensor<8x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<8x32xf32>
  %y0 = bonsai.add %p0, %r : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
  %p1 = bonsai.linear %x, %w : (tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<8x32xf32>
  %y1 = bonsai.add %p1, %r : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
  %p2 = bonsai.linear %x, %w : (tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<8x32xf32>
  %y2 = bonsai.add %p2, %b : (tensor<8x32xf32>, tensor<32xf32>) -> tensor<8x32xf32>
  %p3 = bonsai.linear %x, %w {bonsai.phase = "backward"} : (tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<8x32xf32>
  %y3 = bonsai.add %p3, %r : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
  %xs = bonsai.state optimizer "x" : tensor<8x16xf32>
  %p4 = bonsai.linear %xs, %w : (tensor<8x16xf32>, tensor<32x16xf32>) -> tensor<8x32xf32>
  bonsai.zero %xs : tensor<8x16xf32>
  %y4 = bonsai.add %p4, %r : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>
  return %y0, %y1, %p1, %y2, %y3, %y4 : tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>
}
