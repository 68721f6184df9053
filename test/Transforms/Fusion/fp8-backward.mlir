// RUN: bonsai-opt --bonsai-fuse="only=fp8-backward" -split-input-file %s | FileCheck %s
// RUN: bonsai-opt --bonsai-fuse="only=gemm-epilogue" -split-input-file %s | FileCheck %s --check-prefix=OFF

// An FP8 linear's input gradient and accumulating weight gradient (same dy, same state, same
// scaling) become one fp8_linear_backward where the input gradient was: the accumulator's
// declaration moves up to it, the results' readers (here the return, an add between the
// two) read the fused op's results. Its workspace holds both GEMMs' (448 + 448 elements).

// CHECK-LABEL: func.func @fuse(
// CHECK-SAME: %[[DY:[^:]*]]: tensor<2x16x32xbf16>, %[[W:[^:]*]]: tensor<32x16xbf16>, %[[X:[^:]*]]: tensor<2x16x16xbf16>, %[[S:[^:]*]]: tensor<3x20xf32>
// CHECK: %[[ACC:.*]] = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<32x16xf32>
// CHECK-NEXT: %[[DX:[a-z0-9_]+]], %[[DXS:[a-z0-9_]+]], %[[DWS:[a-z0-9_]+]], %{{.*}} = bonsai.fp8_linear_backward %[[DY]], %[[W]], %[[X]], %[[S]], %[[ACC]] {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
// CHECK-NEXT: %[[SUM:.*]] = bonsai.add %[[DX]], %[[DX]]
// CHECK-NOT: fp8_linear_grad
// CHECK: return %[[SUM]], %[[DXS]], %[[DWS]]
// OFF-LABEL: func.func @fuse(
// OFF: bonsai.fp8_linear_grad_input
// OFF: bonsai.fp8_linear_grad_weight_accumulate
// OFF-NOT: fp8_linear_backward
func.func @fuse(%dy: tensor<2x16x32xbf16>, %w: tensor<32x16xbf16>, %x: tensor<2x16x16xbf16>, %s: tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>) {
  %dx, %dxs, %ws = bonsai.fp8_linear_grad_input %dy, %w, %s {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<448xf32>)
  %sum = bonsai.add %dx, %dx {bonsai.phase = "backward"} : (tensor<2x16x16xbf16>, tensor<2x16x16xbf16>) -> tensor<2x16x16xbf16>
  %acc = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<32x16xf32>
  %dws, %ws2 = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %s, %acc {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x4xf32>, tensor<448xf32>)
  return %sum, %dxs, %dws : tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<2x4xf32>
}

// -----

// Two linears' GEMMs (different states) stay apart, as do GEMMs of one state that scale
// differently (margin).

// CHECK-LABEL: func.func @other_state
// CHECK-NOT: fp8_linear_backward
// CHECK: bonsai.fp8_linear_grad_input
// CHECK: bonsai.fp8_linear_grad_weight_accumulate
func.func @other_state(%dy: tensor<2x16x32xbf16>, %w: tensor<32x16xbf16>, %x: tensor<2x16x16xbf16>, %s: tensor<3x20xf32>, %t: tensor<3x20xf32>) -> tensor<2x16x16xbf16> {
  %dx, %dxs, %ws = bonsai.fp8_linear_grad_input %dy, %w, %s {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<448xf32>)
  %acc = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<32x16xf32>
  %dws, %ws2 = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %t, %acc {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x4xf32>, tensor<448xf32>)
  return %dx : tensor<2x16x16xbf16>
}

// CHECK-LABEL: func.func @other_margin
// CHECK-NOT: fp8_linear_backward
// CHECK: bonsai.fp8_linear_grad_input
// CHECK: bonsai.fp8_linear_grad_weight_accumulate
func.func @other_margin(%dy: tensor<2x16x32xbf16>, %w: tensor<32x16xbf16>, %x: tensor<2x16x16xbf16>, %s: tensor<3x20xf32>) -> tensor<2x16x16xbf16> {
  %dx, %dxs, %ws = bonsai.fp8_linear_grad_input %dy, %w, %s {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<448xf32>)
  %acc = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<32x16xf32>
  %dws, %ws2 = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %s, %acc {bonsai.phase = "backward", current = false, margin = 1 : i64} : (tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x4xf32>, tensor<448xf32>)
  return %dx : tensor<2x16x16xbf16>
}

// -----

// The weight gradient cannot move up to the input gradient when x is computed between them,
// or when something between reads the accumulator (it would see the sum too early) or writes
// an operand of the GEMMs (here the accumulation into x).

// CHECK-LABEL: func.func @x_after
// CHECK-NOT: fp8_linear_backward
func.func @x_after(%dy: tensor<2x16x32xbf16>, %w: tensor<32x16xbf16>, %x0: tensor<2x16x16xbf16>, %s: tensor<3x20xf32>) -> tensor<2x16x16xbf16> {
  %dx, %dxs, %ws = bonsai.fp8_linear_grad_input %dy, %w, %s {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<448xf32>)
  %x = bonsai.add %x0, %x0 {bonsai.phase = "backward"} : (tensor<2x16x16xbf16>, tensor<2x16x16xbf16>) -> tensor<2x16x16xbf16>
  %acc = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<32x16xf32>
  %dws, %ws2 = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %s, %acc {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x4xf32>, tensor<448xf32>)
  return %dx : tensor<2x16x16xbf16>
}

// CHECK-LABEL: func.func @acc_read_between
// CHECK-NOT: fp8_linear_backward
func.func @acc_read_between(%dy: tensor<2x16x32xbf16>, %w: tensor<32x16xbf16>, %x: tensor<2x16x16xbf16>, %s: tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<32x16xf32>) {
  %acc = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<32x16xf32>
  %dx, %dxs, %ws = bonsai.fp8_linear_grad_input %dy, %w, %s {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<448xf32>)
  %twice = bonsai.add %acc, %acc {bonsai.phase = "backward"} : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
  %dws, %ws2 = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %s, %acc {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x4xf32>, tensor<448xf32>)
  return %dx, %twice : tensor<2x16x16xbf16>, tensor<32x16xf32>
}

// CHECK-LABEL: func.func @operand_written_between
// CHECK-NOT: fp8_linear_backward
func.func @operand_written_between(%dy: tensor<2x16x32xbf16>, %w: tensor<32x16xbf16>, %x: tensor<2x16x16xbf16>, %s: tensor<3x20xf32>, %g: tensor<2x16x16xbf16>) -> tensor<2x16x16xbf16> {
  %dx, %dxs, %ws = bonsai.fp8_linear_grad_input %dy, %w, %s {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<32x16xbf16>, tensor<3x20xf32>) -> (tensor<2x16x16xbf16>, tensor<2x4xf32>, tensor<448xf32>)
  bonsai.accumulate %g, %x {bonsai.phase = "backward"} : tensor<2x16x16xbf16>, tensor<2x16x16xbf16>
  %acc = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<32x16xf32>
  %dws, %ws2 = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %s, %acc {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<2x16x32xbf16>, tensor<2x16x16xbf16>, tensor<3x20xf32>, tensor<32x16xf32>) -> (tensor<2x4xf32>, tensor<448xf32>)
  return %dx : tensor<2x16x16xbf16>
}
