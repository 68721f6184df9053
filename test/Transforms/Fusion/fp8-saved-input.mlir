// RUN: bonsai-opt --bonsai-fuse="only=fp8-saved-input" -split-input-file %s | FileCheck %s
// RUN: bonsai-opt --bonsai-fuse="only=fp8-shared-input" -split-input-file %s | FileCheck %s --check-prefix=OFF

// The forward GEMM that casts x (the first of a group sharing its cast) also writes xᵀ's
// codes ([K, M] = 16 x 32); the fused backward of x and the one sharing its cast read them
// with the forward's stats instead of casting x. Their workspaces hold dy twice and W:
// 448 + 320 elements for dy 2x16x32 and W 32x16, 256 + 192 for dy 2x16x16 and W 16x16. The
// forward sibling reads the new op's workspace.

// CHECK-LABEL: func.func @saved(
// CHECK-SAME: %[[X:[^:]*]]: tensor<2x16x16xbf16>, %[[W1:[^:]*]]: tensor<32x16xbf16>, %[[W2:[^:]*]]: tensor<16x16xbf16>, %[[S1:[^:]*]]: tensor<3x20xf32>, %[[S2:[^:]*]]: tensor<3x20xf32>, %[[DY1:[^:]*]]: tensor<2x16x32xbf16>, %[[DY2:[^:]*]]: tensor<2x16x16xbf16>, %[[A1:[^:]*]]: tensor<32x16xf32>, %[[A2:[^:]*]]: tensor<16x16xf32>
// CHECK: %[[Y1:[a-z0-9_]+]], %[[ST1:[a-z0-9_]+]], %[[XT:[a-z0-9_]+]], %[[WS1:[a-z0-9_]+]] = bonsai.fp8_linear_with_input_cast %[[X]], %[[W1]], %[[S1]] {current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x32xbf16>, tensor<2x4xf32>, tensor<16x32xf8E4M3FN>, tensor<320xf32>)
// CHECK-NEXT: %[[Y2:[a-z0-9_]+]], {{.*}} = bonsai.fp8_linear_shared_input %[[WS1]], %[[ST1]], %[[W2]], %[[S2]]
// CHECK-NEXT: %[[DX1:[a-z0-9_]+]], %{{.*}}, %[[DWS1:[a-z0-9_]+]], %{{.*}} = bonsai.fp8_linear_backward_from_input_cast %[[DY1]], %[[W1]], %[[XT]], %[[ST1]], %[[S1]], %[[A1]] {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<16x32xf8E4M3FN>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<768xf32>)
// CHECK-NEXT: %[[DX2:[a-z0-9_]+]], %{{.*}}, %[[DWS2:[a-z0-9_]+]], %{{.*}} = bonsai.fp8_linear_backward_from_input_cast %[[DY2]], %[[W2]], %[[XT]], %[[ST1]], %[[S2]], %[[A2]] {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<16x32xf8E4M3FN>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<16x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<448xf32>)
// CHECK-NEXT: return %[[Y1]], %[[Y2]], %[[DX1]], %[[DX2]], %[[DWS1]], %[[DWS2]]
// OFF-LABEL: func.func @saved(
// OFF-NOT: input_cast
// OFF: return
func.func @saved(%x: tensor<2x16x16xbf16>, %w1: tensor<32x16xbf16>, %w2: tensor<16x16xbf16>, %s1: tensor<3x20xf32>, %s2: tensor<3x20xf32>, %dy1: tensor<2x16x32xbf16>, %dy2: tensor<2x16x16xbf16>, %a1: tensor<32x16xf32>, %a2: tensor<16x16xf32>) -> (tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<2x16x16xbf16>, tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>) {
  %y1, %st1, %ws1 = bonsai.fp8_linear %x, %w1, %s1 {current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x32xbf16>, tensor<2x4xf32>, tensor<320xf32>)
  %y2, %st2, %ws2 = bonsai.fp8_linear_shared_input %ws1, %st1, %w2, %s2 {current = false, margin = 0 : i64} : (tensor<320xf32>, tensor<2x4xf32>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<128xf32>)
  %dx1, %dxs1, %dws1, %bws1 = bonsai.fp8_linear_backward %dy1, %w1, %x, %s1, %a1 {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
  %dx2, %dxs2, %dws2, %bws2 = bonsai.fp8_linear_backward_shared_input %dy2, %w2, %bws1, %dws1, %s2, %a2 {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<896xf32>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<16x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<448xf32>)
  return %y1, %y2, %dx1, %dx2, %dws1, %dws2 : tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<2x16x16xbf16>, tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>
}

// -----

// No saved cast where x is written between the forward and the backward (here an
// accumulation into it), or where they scale differently (margin).

// CHECK-LABEL: func.func @written_between
// CHECK-NOT: input_cast
// CHECK: return
func.func @written_between(%x: tensor<2x16x16xbf16>, %g: tensor<2x16x16xbf16>, %w: tensor<16x16xbf16>, %s: tensor<3x20xf32>, %dy: tensor<2x16x16xbf16>, %a: tensor<16x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x16x16xbf16>) {
  %y, %st, %ws = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<256xf32>)
  bonsai.accumulate %g, %x : tensor<2x16x16xbf16>, tensor<2x16x16xbf16>
  %dx, %dxs, %dws, %bws = bonsai.fp8_linear_backward %dy, %w, %x, %s, %a {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<16x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<576xf32>)
  return %y, %dx : tensor<2x16x16xbf16>, tensor<2x16x16xbf16>
}

// CHECK-LABEL: func.func @other_margin
// CHECK-NOT: input_cast
// CHECK: return
func.func @other_margin(%x: tensor<2x16x16xbf16>, %w: tensor<16x16xbf16>, %s: tensor<3x20xf32>, %dy: tensor<2x16x16xbf16>, %a: tensor<16x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x16x16xbf16>) {
  %y, %st, %ws = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<256xf32>)
  %dx, %dxs, %dws, %bws = bonsai.fp8_linear_backward %dy, %w, %x, %s, %a {bonsai.phase = "backward", current = false, margin = 1 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<16x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<576xf32>)
  return %y, %dx : tensor<2x16x16xbf16>, tensor<2x16x16xbf16>
}
