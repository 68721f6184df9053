// RUN: bonsai-opt --bonsai-fuse="only=residual-norm" -split-input-file %s | FileCheck %s

// Where the residual-norm fusions may and may not go, on hand-written steps.

// The sum is read before the norm, and the norm's weight is declared before the add: the fused
// op goes at the add, so that the earlier reader sees its sum.

// CHECK-LABEL: func.func @reader_before_norm
// CHECK: %[[W:.*]] = bonsai.param "w"
// CHECK-NEXT: %[[S:.*]], %[[N:.*]] = bonsai.add_rms_norm %arg0, %arg1, %[[W]]
// CHECK-NEXT: %[[M:.*]] = bonsai.mul %[[S]], %[[S]]
// CHECK-NEXT: bonsai.add %[[M]], %[[N]]
func.func @reader_before_norm(%a: tensor<2x8xf32>, %b: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %w = bonsai.param "w" trainable : tensor<8xf32>
  %s = bonsai.add %a, %b : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %m = bonsai.mul %s, %s : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %n = bonsai.rms_norm %s, %w : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  %r = bonsai.add %m, %n : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %r : tensor<2x8xf32>
}

// -----

// Not fused: the sum is read before the norm and the weight is declared between them, so no
// place has both the weight and the sum before its readers.

// CHECK-LABEL: func.func @weight_after_reader
// CHECK-NOT: add_rms_norm
// CHECK: bonsai.rms_norm
func.func @weight_after_reader(%a: tensor<2x8xf32>, %b: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %s = bonsai.add %a, %b : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %m = bonsai.mul %s, %s : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %w = bonsai.param "w" trainable : tensor<8xf32>
  %n = bonsai.rms_norm %s, %w : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  %r = bonsai.add %m, %n : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %r : tensor<2x8xf32>
}

// -----

// Not fused: the norm gradient's input gradient has a second reader besides the add.

// CHECK-LABEL: func.func @input_grad_read_twice
// CHECK-NOT: rms_norm_grad_add
// CHECK: bonsai.rms_norm_grad
func.func @input_grad_read_twice(%dy: tensor<2x8xf32>, %x: tensor<2x8xf32>, %acc: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>) {
  %w = bonsai.param "w" trainable : tensor<8xf32>
  %dx, %dw = bonsai.rms_norm_grad %dy, %x, %w {bonsai.phase = "backward"} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>)
  %s = bonsai.add %acc, %dx {bonsai.phase = "backward"} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %s, %dx : tensor<2x8xf32>, tensor<2x8xf32>
}

// -----

// The weight gradient is read before the add, and the addend is computed after the norm
// gradient: no place has the addend and precedes the weight gradient's reader. Not fused.
// With the addend computed first, the fused op goes at the norm gradient.

// CHECK-LABEL: func.func @weight_grad_read_early
// CHECK-NOT: rms_norm_grad_add
// CHECK: bonsai.rms_norm_grad
// CHECK-LABEL: func.func @addend_first
// CHECK: %[[ACC:.*]] = bonsai.mul
// CHECK-NEXT: %[[DX:.*]], %[[DW:.*]] = bonsai.rms_norm_grad_add %arg0, %arg1, %{{.*}}, %[[ACC]] {bonsai.phase = "backward", epsilon = 9.9999999999999995E-7 : f64}
// CHECK-NEXT: bonsai.mul %[[DW]], %[[DW]]
// CHECK-NEXT: return %[[DX]]
func.func @weight_grad_read_early(%dy: tensor<2x8xf32>, %x: tensor<2x8xf32>, %a: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>) {
  %w = bonsai.param "w" trainable : tensor<8xf32>
  %dx, %dw = bonsai.rms_norm_grad %dy, %x, %w {bonsai.phase = "backward"} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>)
  %dw2 = bonsai.mul %dw, %dw {bonsai.phase = "backward"} : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %acc = bonsai.mul %a, %a {bonsai.phase = "backward"} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %s = bonsai.add %acc, %dx {bonsai.phase = "backward"} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %s, %dw2 : tensor<2x8xf32>, tensor<8xf32>
}
func.func @addend_first(%dy: tensor<2x8xf32>, %x: tensor<2x8xf32>, %a: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>) {
  %w = bonsai.param "w" trainable : tensor<8xf32>
  %acc = bonsai.mul %a, %a {bonsai.phase = "backward"} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %dx, %dw = bonsai.rms_norm_grad %dy, %x, %w {bonsai.phase = "backward"} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>)
  %dw2 = bonsai.mul %dw, %dw {bonsai.phase = "backward"} : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %s = bonsai.add %acc, %dx {bonsai.phase = "backward"} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %s, %dw2 : tensor<2x8xf32>, tensor<8xf32>
}

// -----

// Not fused: the add and the norm gradient run in different phases.

// CHECK-LABEL: func.func @phases
// CHECK-NOT: rms_norm_grad_add
func.func @phases(%dy: tensor<2x8xf32>, %x: tensor<2x8xf32>, %acc: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %w = bonsai.param "w" trainable : tensor<8xf32>
  %dx, %dw = bonsai.rms_norm_grad %dy, %x, %w : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<8xf32>) -> (tensor<2x8xf32>, tensor<8xf32>)
  %s = bonsai.add %acc, %dx {bonsai.phase = "backward"} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %s : tensor<2x8xf32>
}
