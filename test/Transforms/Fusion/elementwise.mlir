// RUN: bonsai-opt %s --split-input-file --bonsai-fuse="only=elementwise per-site-remarks=false" | FileCheck %s

// A LoRA-style chain: the scale mul and the residual add become one kernel with the
// broadcast scale read at its index modulo 1 and the bias modulo 16.
// CHECK-LABEL: func.func @chain
// CHECK-SAME: (%[[X:.*]]: tensor<2x8x16xbf16>, %[[Y:.*]]: tensor<2x8x16xbf16>, %[[S:.*]]: tensor<1xbf16>, %[[B:.*]]: tensor<16xbf16>)
// CHECK: %[[F:.*]] = bonsai.fused_elementwise ins(%[[X]], %[[S]], %[[Y]], %[[B]] : tensor<2x8x16xbf16>, tensor<1xbf16>, tensor<2x8x16xbf16>, tensor<16xbf16>) {
// CHECK-NEXT: ^bb0(%[[A0:.*]]: bf16, %[[A1:.*]]: bf16, %[[A2:.*]]: bf16, %[[A3:.*]]: bf16):
// CHECK: arith.extf %[[A0]] : bf16 to f32
// CHECK: arith.mulf
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: arith.addf
// CHECK: arith.truncf
// CHECK: arith.addf
// CHECK: %[[R:.*]] = arith.truncf {{.*}} : f32 to bf16
// CHECK-NEXT: bonsai.yield %[[R]] : bf16
// CHECK-NEXT: } -> tensor<2x8x16xbf16>
// CHECK-NOT: bonsai.mul
// CHECK-NOT: bonsai.add
// CHECK: return %[[F]]
func.func @chain(%x: tensor<2x8x16xbf16>, %y: tensor<2x8x16xbf16>, %s: tensor<1xbf16>, %b: tensor<16xbf16>) -> tensor<2x8x16xbf16> {
  %0 = bonsai.mul %x, %s : (tensor<2x8x16xbf16>, tensor<1xbf16>) -> tensor<2x8x16xbf16>
  %1 = bonsai.add %0, %y : (tensor<2x8x16xbf16>, tensor<2x8x16xbf16>) -> tensor<2x8x16xbf16>
  %2 = bonsai.add %1, %b : (tensor<2x8x16xbf16>, tensor<16xbf16>) -> tensor<2x8x16xbf16>
  return %2 : tensor<2x8x16xbf16>
}

// -----

// An intermediate used outside the chain becomes a second result; swiglu_grad's two results
// are both used; the phase is kept.
// CHECK-LABEL: func.func @outputs
// CHECK: %[[F:.*]]:3 = bonsai.fused_elementwise ins({{.*}}) attributes {bonsai.phase = "backward"} {
// CHECK: bonsai.yield {{.*}} : f32, f32, f32
// CHECK: } -> tensor<64xf32>, tensor<64xf32>, tensor<64xf32>
// CHECK: bonsai.linear %[[F]]#0
// CHECK: return %[[F]]#1, %[[F]]#2
func.func @outputs(%dy: tensor<64xf32>, %g: tensor<64xf32>, %u: tensor<64xf32>, %w: tensor<64x64xf32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>) {
  %s = bonsai.silu %g {bonsai.phase = "backward"} : (tensor<64xf32>) -> tensor<64xf32>
  %dg, %du = bonsai.swiglu_grad %dy, %s, %u {bonsai.phase = "backward"} : (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>) -> (tensor<64xf32>, tensor<64xf32>)
  %r = bonsai.linear %s, %w {bonsai.phase = "backward"} : (tensor<64xf32>, tensor<64x64xf32>) -> tensor<64xf32>
  return %dg, %du, %r : tensor<64xf32>, tensor<64xf32>, tensor<64xf32>
}

// -----

// Ops of different phases are never merged.
// CHECK-LABEL: func.func @phases
// CHECK-NOT: bonsai.fused_elementwise
// CHECK: bonsai.silu
// CHECK: bonsai.gelu
func.func @phases(%x: tensor<64xf32>) -> tensor<64xf32> {
  %0 = bonsai.silu %x {bonsai.phase = "forward"} : (tensor<64xf32>) -> tensor<64xf32>
  %1 = bonsai.gelu %0 {bonsai.phase = "backward"} : (tensor<64xf32>) -> tensor<64xf32>
  return %1 : tensor<64xf32>
}

// -----

// Different iteration shapes: the add iterates over [4, 64], the silu over [64].
// CHECK-LABEL: func.func @shapes
// CHECK-NOT: bonsai.fused_elementwise
// CHECK: bonsai.silu
// CHECK: bonsai.add
func.func @shapes(%x: tensor<64xf32>, %y: tensor<4x64xf32>) -> tensor<4x64xf32> {
  %0 = bonsai.silu %x : (tensor<64xf32>) -> tensor<64xf32>
  %1 = bonsai.add %y, %0 : (tensor<4x64xf32>, tensor<64xf32>) -> tensor<4x64xf32>
  return %1 : tensor<4x64xf32>
}

// -----

// A single elementwise op saves nothing and stays as it is.
// CHECK-LABEL: func.func @single
// CHECK-NOT: bonsai.fused_elementwise
// CHECK: bonsai.gelu
func.func @single(%x: tensor<64xf32>) -> tensor<64xf32> {
  %0 = bonsai.gelu %x {approximation = #bonsai.gelu_approximation<tanh>} : (tensor<64xf32>) -> tensor<64xf32>
  return %0 : tensor<64xf32>
}

// -----

// silu -> reshape -> reshape -> add: the reshape consumes the silu and feeds the add, so the
// two cannot be one kernel (the fused op would be its own producer).
// CHECK-LABEL: func.func @cycle
// CHECK-NOT: bonsai.fused_elementwise
// CHECK: bonsai.silu
// CHECK: bonsai.reshape
// CHECK: bonsai.add
func.func @cycle(%x: tensor<64xf32>) -> tensor<64xf32> {
  %0 = bonsai.silu %x : (tensor<64xf32>) -> tensor<64xf32>
  %1 = bonsai.reshape %0 : (tensor<64xf32>) -> tensor<8x8xf32>
  %2 = bonsai.reshape %1 : (tensor<8x8xf32>) -> tensor<64xf32>
  %3 = bonsai.add %0, %2 : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %3 : tensor<64xf32>
}

// -----

// FP8 casts have no scalar form (they saturate): the cast stays, the rest fuses.
// CHECK-LABEL: func.func @fp8
// CHECK: bonsai.fused_elementwise
// CHECK: bonsai.cast {{.*}} -> tensor<64xf8E4M3FN>
func.func @fp8(%x: tensor<64xbf16>) -> tensor<64xf8E4M3FN> {
  %0 = bonsai.silu %x : (tensor<64xbf16>) -> tensor<64xbf16>
  %1 = bonsai.cast %0 : (tensor<64xbf16>) -> tensor<64xf32>
  %2 = bonsai.cast %1 : (tensor<64xf32>) -> tensor<64xf8E4M3FN>
  return %2 : tensor<64xf8E4M3FN>
}

// -----

// An outside op between two members that consumes the first moves after the fused op.
// CHECK-LABEL: func.func @move
// CHECK: %[[F:.*]]:2 = bonsai.fused_elementwise
// CHECK: bonsai.linear %[[F]]#0
// CHECK: return
func.func @move(%x: tensor<4x64xf32>, %w: tensor<64x64xf32>) -> (tensor<4x64xf32>, tensor<4x64xf32>) {
  %0 = bonsai.silu %x : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %1 = bonsai.linear %0, %w : (tensor<4x64xf32>, tensor<64x64xf32>) -> tensor<4x64xf32>
  %2 = bonsai.mul %0, %x : (tensor<4x64xf32>, tensor<4x64xf32>) -> tensor<4x64xf32>
  return %1, %2 : tensor<4x64xf32>, tensor<4x64xf32>
}

// -----

// Each group is convex in the unfused graph, but once {a1, a2, a3} is one op the group
// {b1, b2} would feed it (through %r1) and be fed by it (through %r2): it stays unfused.
// CHECK-LABEL: func.func @convex_after_fusion
// CHECK: %[[B1:.*]] = bonsai.silu %{{.*}} : (tensor<64xf32>)
// CHECK: %[[R1:.*]] = bonsai.reshape %[[B1]]
// CHECK: %[[A:[0-9]+]]:2 = bonsai.fused_elementwise ins(%[[R1]], %{{.*}} : tensor<8x8xf32>, tensor<8x8xf32>)
// CHECK: bonsai.yield
// CHECK-NEXT: } -> tensor<8x8xf32>, tensor<8x8xf32>
// CHECK: %[[R2:.*]] = bonsai.reshape %[[A]]#0
// CHECK: %[[B2:.*]] = bonsai.add %[[B1]], %[[R2]]
// CHECK-NOT: bonsai.fused_elementwise
// CHECK: return %[[A]]#1, %[[B2]]
func.func @convex_after_fusion(%x: tensor<64xf32>, %y: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<64xf32>) {
  %b1 = bonsai.silu %x : (tensor<64xf32>) -> tensor<64xf32>
  %r1 = bonsai.reshape %b1 : (tensor<64xf32>) -> tensor<8x8xf32>
  %a1 = bonsai.silu %r1 : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %a2 = bonsai.silu %y : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %a3 = bonsai.add %a1, %a2 : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %r2 = bonsai.reshape %a2 : (tensor<8x8xf32>) -> tensor<64xf32>
  %b2 = bonsai.add %b1, %r2 : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %a3, %b2 : tensor<8x8xf32>, tensor<64xf32>
}
