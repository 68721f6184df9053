// RUN: bonsai-opt --bonsai-fuse="only=fp8-shared-input" -split-input-file %s | FileCheck %s
// RUN: bonsai-opt --bonsai-fuse="only=fp8-backward" -split-input-file %s | FileCheck %s --check-prefix=OFF

// FP8 linears of one input (q, k and v of a block): the first casts it, the later ones read
// its codes from the first's workspace and its scale from the first's stats. Their own
// workspaces shrink to the weight's cast (128 elements for a 16 x 16 weight, 192 for 32 x 16).
// A linear that scales differently (margin 1) casts for itself.

// CHECK-LABEL: func.func @forward(
// CHECK-SAME: %[[X:[^:]*]]: tensor<2x16x16xbf16>, %[[W1:[^:]*]]: tensor<32x16xbf16>, %[[W2:[^:]*]]: tensor<16x16xbf16>, %[[S1:[^:]*]]: tensor<3x20xf32>, %[[S2:[^:]*]]: tensor<3x20xf32>, %[[S3:[^:]*]]: tensor<3x20xf32>
// CHECK: %[[Y1:[a-z0-9_]+]], %[[ST1:[a-z0-9_]+]], %[[WS1:[a-z0-9_]+]] = bonsai.fp8_linear %[[X]], %[[W1]], %[[S1]]
// CHECK-NEXT: %[[Y2:[a-z0-9_]+]], %{{.*}}, %{{.*}} = bonsai.fp8_linear_shared_input %[[WS1]], %[[ST1]], %[[W2]], %[[S2]] {current = false, fast_accumulation = true, margin = 0 : i64} : (tensor<320xf32>, tensor<2x4xf32>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<128xf32>)
// CHECK-NEXT: bonsai.fp8_linear %[[X]], %[[W2]], %[[S3]] {current = false, margin = 1 : i64}
// CHECK-NEXT: %{{.*}}, %{{.*}}, %{{.*}} = bonsai.fp8_linear_shared_input %[[WS1]], %[[ST1]], %[[W1]], %[[S3]] {current = false, margin = 0 : i64} : (tensor<320xf32>, tensor<2x4xf32>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x32xbf16>, tensor<2x4xf32>, tensor<192xf32>)
// CHECK: return %[[Y1]], %[[Y2]]
// OFF-LABEL: func.func @forward(
// OFF-COUNT-4: bonsai.fp8_linear %
// OFF-NOT: shared_input
func.func @forward(%x: tensor<2x16x16xbf16>, %w1: tensor<32x16xbf16>, %w2: tensor<16x16xbf16>, %s1: tensor<3x20xf32>, %s2: tensor<3x20xf32>, %s3: tensor<3x20xf32>) -> (tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<2x16x16xbf16>, tensor<2x16x32xbf16>, tensor<2x4xf32>) {
  %y1, %st1, %ws1 = bonsai.fp8_linear %x, %w1, %s1 {current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x32xbf16>, tensor<2x4xf32>, tensor<320xf32>)
  %y2, %st2, %ws2 = bonsai.fp8_linear %x, %w2, %s2 {current = false, margin = 0 : i64, fast_accumulation = true} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<256xf32>)
  %y3, %st3, %ws3 = bonsai.fp8_linear %x, %w2, %s3 {current = false, margin = 1 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<256xf32>)
  %y4, %st4, %ws4 = bonsai.fp8_linear %x, %w1, %s3 {current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x32xbf16>, tensor<2x4xf32>, tensor<320xf32>)
  return %y1, %y2, %y3, %y4, %st2 : tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<2x16x16xbf16>, tensor<2x16x32xbf16>, tensor<2x4xf32>
}

// -----

// The fused backwards of two linears of one input: the second reads x's transposed codes from
// the first's workspace and its scale from the first's weight-gradient stats (row 1). Its
// workspace holds dy twice and W: 256 + 192 elements.

// CHECK-LABEL: func.func @backward(
// CHECK-SAME: %[[DY1:[^:]*]]: tensor<2x16x32xbf16>, %[[DY2:[^:]*]]: tensor<2x16x16xbf16>, %[[W1:[^:]*]]: tensor<32x16xbf16>, %[[W2:[^:]*]]: tensor<16x16xbf16>, %[[X:[^:]*]]: tensor<2x16x16xbf16>, %[[S1:[^:]*]]: tensor<3x20xf32>, %[[S2:[^:]*]]: tensor<3x20xf32>, %[[A1:[^:]*]]: tensor<32x16xf32>, %[[A2:[^:]*]]: tensor<16x16xf32>
// CHECK: %[[DX1:[a-z0-9_]+]], %{{.*}}, %[[DWS1:[a-z0-9_]+]], %[[WS1:[a-z0-9_]+]] = bonsai.fp8_linear_backward %[[DY1]], %[[W1]], %[[X]], %[[S1]], %[[A1]]
// CHECK-NEXT: %[[DX2:[a-z0-9_]+]], %{{.*}}, %[[DWS2:[a-z0-9_]+]], %{{.*}} = bonsai.fp8_linear_backward_shared_input %[[DY2]], %[[W2]], %[[WS1]], %[[DWS1]], %[[S2]], %[[A2]] {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<896xf32>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<16x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<448xf32>)
// CHECK: return %[[DX1]], %[[DX2]], %[[DWS2]]
// OFF-LABEL: func.func @backward(
// OFF-COUNT-2: bonsai.fp8_linear_backward %
func.func @backward(%dy1: tensor<2x16x32xbf16>, %dy2: tensor<2x16x16xbf16>, %w1: tensor<32x16xbf16>, %w2: tensor<16x16xbf16>, %x: tensor<2x16x16xbf16>, %s1: tensor<3x20xf32>, %s2: tensor<3x20xf32>, %a1: tensor<32x16xf32>, %a2: tensor<16x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x16x16xbf16>, tensor<2x4xf32>) {
  %dx1, %dxs1, %dws1, %ws1 = bonsai.fp8_linear_backward %dy1, %w1, %x, %s1, %a1 {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
  %dx2, %dxs2, %dws2, %ws2 = bonsai.fp8_linear_backward %dy2, %w2, %x, %s2, %a2 {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<16x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<576xf32>)
  return %dx1, %dx2, %dws2 : tensor<2x16x16xbf16>, tensor<2x16x16xbf16>, tensor<2x4xf32>
}

// -----

// No sharing where x is written between the two casts (here an accumulation into it), nor
// between GEMMs of different phases (a recomputed forward in the backward pass casts its own).

// CHECK-LABEL: func.func @written_between
// CHECK-NOT: shared_input
// CHECK: return
func.func @written_between(%x: tensor<2x16x16xbf16>, %g: tensor<2x16x16xbf16>, %w: tensor<16x16xbf16>, %s1: tensor<3x20xf32>, %s2: tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x16x16xbf16>) {
  %y1, %st1, %ws1 = bonsai.fp8_linear %x, %w, %s1 {current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<256xf32>)
  bonsai.accumulate %g, %x : tensor<2x16x16xbf16>, tensor<2x16x16xbf16>
  %y2, %st2, %ws2 = bonsai.fp8_linear %x, %w, %s2 {current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<256xf32>)
  return %y1, %y2 : tensor<2x16x16xbf16>, tensor<2x16x16xbf16>
}

// CHECK-LABEL: func.func @other_phase
// CHECK-NOT: shared_input
// CHECK: return
func.func @other_phase(%x: tensor<2x16x16xbf16>, %w: tensor<16x16xbf16>, %s1: tensor<3x20xf32>, %s2: tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x16x16xbf16>) {
  %y1, %st1, %ws1 = bonsai.fp8_linear %x, %w, %s1 {current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<256xf32>)
  %y2, %st2, %ws2 = bonsai.fp8_linear %x, %w, %s2 {bonsai.phase = "backward", bonsai.recomputed, current = false, margin = 0 : i64} : (tensor<2x16x16xbf16>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<256xf32>)
  return %y1, %y2 : tensor<2x16x16xbf16>, tensor<2x16x16xbf16>
}
