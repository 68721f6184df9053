// RUN: bonsai-opt --bonsai-fuse="only=slice-gradients" -split-input-file %s 2> %t.remarks \
// RUN:   | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK < %t.remarks
// RUN: bonsai-opt --bonsai-autodiff --bonsai-fuse="only=slice-gradients" %S/Inputs/qkv.mlir \
// RUN:   | FileCheck %s --check-prefix=MODEL
// RUN: bonsai-opt --bonsai-autodiff --bonsai-fuse="disable=slice-gradients" %S/Inputs/qkv.mlir \
// RUN:   | FileCheck %s --check-prefix=DISABLED

// The slice-gradients family (lib/Transforms/Fusion/SliceGradients.cpp): an add of two
// slice_grads whose pieces are adjacent along one axis becomes the slice_grad of their concat,
// or the concat itself when the pieces cover the axis; concats of concats are flattened.

// The q, k, v split in the order autodiff sums it (v's gradient first): one concat.
// REMARK: remark: bonsai-fuse: 2 adjacent slice gradients + their sum
// CHECK-LABEL: func.func @qkv
// CHECK-SAME: (%[[DQ:.*]]: tensor<2x4x8xf32>, %[[DK:.*]]: tensor<2x4x8xf32>, %[[DV:.*]]: tensor<2x4x8xf32>)
// CHECK-NEXT: %[[G:.*]] = bonsai.concat %[[DQ]], %[[DK]], %[[DV]] {axis = 2 : i64, bonsai.phase = "backward"} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x24xf32>
// CHECK-NEXT: return %[[G]]
func.func @qkv(%dq: tensor<2x4x8xf32>, %dk: tensor<2x4x8xf32>, %dv: tensor<2x4x8xf32>) -> tensor<2x4x24xf32> {
  %gv = bonsai.slice_grad %dv {axis = 2 : i64, start = 16 : i64, bonsai.phase = "backward"} : (tensor<2x4x8xf32>) -> tensor<2x4x24xf32>
  %gk = bonsai.slice_grad %dk {axis = 2 : i64, start = 8 : i64, bonsai.phase = "backward"} : (tensor<2x4x8xf32>) -> tensor<2x4x24xf32>
  %s = bonsai.add %gv, %gk {bonsai.phase = "backward"} : (tensor<2x4x24xf32>, tensor<2x4x24xf32>) -> tensor<2x4x24xf32>
  %gq = bonsai.slice_grad %dq {axis = 2 : i64, start = 0 : i64, bonsai.phase = "backward"} : (tensor<2x4x8xf32>) -> tensor<2x4x24xf32>
  %g = bonsai.add %s, %gq {bonsai.phase = "backward"} : (tensor<2x4x24xf32>, tensor<2x4x24xf32>) -> tensor<2x4x24xf32>
  return %g : tensor<2x4x24xf32>
}

// -----

// Two adjacent pieces that leave the rest of the axis: the slice_grad of their concat. A
// piece of another length is joined the same way.
// CHECK-LABEL: func.func @partial
// CHECK-SAME: (%[[A:.*]]: tensor<3x2xf32>, %[[B:.*]]: tensor<5x2xf32>)
// CHECK-NEXT: %[[C:.*]] = bonsai.concat %[[A]], %[[B]] {axis = 0 : i64} : (tensor<3x2xf32>, tensor<5x2xf32>) -> tensor<8x2xf32>
// CHECK-NEXT: %[[G:.*]] = bonsai.slice_grad %[[C]] {axis = 0 : i64, start = 1 : i64} : (tensor<8x2xf32>) -> tensor<12x2xf32>
// CHECK-NEXT: return %[[G]]
func.func @partial(%a: tensor<3x2xf32>, %b: tensor<5x2xf32>) -> tensor<12x2xf32> {
  %ga = bonsai.slice_grad %a {axis = 0 : i64, start = 1 : i64} : (tensor<3x2xf32>) -> tensor<12x2xf32>
  %gb = bonsai.slice_grad %b {axis = 0 : i64, start = 4 : i64} : (tensor<5x2xf32>) -> tensor<12x2xf32>
  %g = bonsai.add %gb, %ga : (tensor<12x2xf32>, tensor<12x2xf32>) -> tensor<12x2xf32>
  return %g : tensor<12x2xf32>
}

// -----

// Left as they are: pieces with a gap between them, pieces along different axes, a
// slice_grad read by something else too, and a slice_grad of another phase than the add.
// CHECK-LABEL: func.func @unchanged
// CHECK-NOT: bonsai.concat
// CHECK: %[[G0:.*]] = bonsai.slice_grad
// CHECK-NEXT: %[[G1:.*]] = bonsai.slice_grad
// CHECK-NEXT: bonsai.add %[[G0]], %[[G1]]
// CHECK-NEXT: %[[R:.*]] = bonsai.slice_grad
// CHECK-NEXT: %[[C:.*]] = bonsai.slice_grad
// CHECK-NEXT: bonsai.add %[[R]], %[[C]]
// CHECK-NEXT: %[[U0:.*]] = bonsai.slice_grad
// CHECK-NEXT: %[[U1:.*]] = bonsai.slice_grad
// CHECK-NEXT: bonsai.add %[[U0]], %[[U1]]
// CHECK-NEXT: %[[P0:.*]] = bonsai.slice_grad
// CHECK-NEXT: %[[P1:.*]] = bonsai.slice_grad
// CHECK-NEXT: bonsai.add %[[P0]], %[[P1]]
// CHECK-NOT: bonsai.concat
func.func @unchanged(%a: tensor<2x2xf32>, %b: tensor<2x2xf32>, %ra: tensor<2x4xf32>, %cb: tensor<4x2xf32>) -> (tensor<2x6xf32>, tensor<4x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) {
  %g0 = bonsai.slice_grad %a {axis = 1 : i64, start = 0 : i64} : (tensor<2x2xf32>) -> tensor<2x6xf32>
  %g1 = bonsai.slice_grad %b {axis = 1 : i64, start = 4 : i64} : (tensor<2x2xf32>) -> tensor<2x6xf32>
  %gap = bonsai.add %g0, %g1 : (tensor<2x6xf32>, tensor<2x6xf32>) -> tensor<2x6xf32>
  %r = bonsai.slice_grad %ra {axis = 0 : i64, start = 0 : i64} : (tensor<2x4xf32>) -> tensor<4x4xf32>
  %c = bonsai.slice_grad %cb {axis = 1 : i64, start = 2 : i64} : (tensor<4x2xf32>) -> tensor<4x4xf32>
  %axes = bonsai.add %r, %c : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %u0 = bonsai.slice_grad %a {axis = 1 : i64, start = 0 : i64} : (tensor<2x2xf32>) -> tensor<2x4xf32>
  %u1 = bonsai.slice_grad %b {axis = 1 : i64, start = 2 : i64} : (tensor<2x2xf32>) -> tensor<2x4xf32>
  %used = bonsai.add %u0, %u1 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %p0 = bonsai.slice_grad %a {axis = 1 : i64, start = 0 : i64} : (tensor<2x2xf32>) -> tensor<2x4xf32>
  %p1 = bonsai.slice_grad %b {axis = 1 : i64, start = 2 : i64, bonsai.phase = "backward"} : (tensor<2x2xf32>) -> tensor<2x4xf32>
  %phases = bonsai.add %p0, %p1 {bonsai.phase = "backward"} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  return %gap, %axes, %used, %u1, %phases : tensor<2x6xf32>, tensor<4x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
}

// Through autodiff: a linear whose output is split into q, k and v (GPT-2's c_attn). The
// gradient of the projection's output is one concat of the three pieces' gradients.
// MODEL-LABEL: func.func @qkv
// MODEL: bonsai.attention_grad
// MODEL-NOT: bonsai.slice_grad
// MODEL: %[[G:.*]] = bonsai.concat %{{.*}}, %{{.*}}, %{{.*}} {axis = 2 : i64, bonsai.phase = "backward"} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x48xf32>
// MODEL-NOT: bonsai.slice_grad
// MODEL: bonsai.linear_grad_input %[[G]]
// DISABLED-COUNT-3: bonsai.slice_grad
// DISABLED-NOT: bonsai.concat
