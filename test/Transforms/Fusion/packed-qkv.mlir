// RUN: bonsai-opt --bonsai-fuse="only=packed-qkv" -split-input-file -verify-diagnostics %s \
// RUN:   | FileCheck %s
// RUN: bonsai-opt --bonsai-autodiff --bonsai-fuse="per-site-remarks=false" %S/Inputs/qkv.mlir \
// RUN:   --mlir-print-op-on-diagnostic=false 2>&1 | FileCheck %s --check-prefix=MODEL

// The packed-qkv family (lib/Transforms/Fusion/PackedQkv.cpp): a flash_attention whose q, k
// and v are reshaped slices of one tensor x [B, S, (H + 2 KV)·D], in that order and covering
// it, becomes flash_attention_qkv of x viewed as [B, S, H + 2 KV, D]; the concat of a
// flash_attention_grad's dq, dk and dv (each read by that concat only) of such slices becomes
// flash_attention_qkv_grad, viewed back as x's shape. The annotations (phase) stay; the slices
// go with their last reader.

// CHECK-LABEL: func.func @packed
// CHECK-SAME: (%[[X:.*]]: tensor<2x8x48xf32>, %[[DO:.*]]: tensor<2x8x2x8xf32>)
// CHECK-NEXT: %[[P:.*]] = bonsai.reshape %[[X]] : (tensor<2x8x48xf32>) -> tensor<2x8x6x8xf32>
// CHECK-NEXT: %[[O:.*]], %[[LSE:.*]] = bonsai.flash_attention_qkv %[[P]] {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x6x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x2x8xf32>)
// CHECK-NEXT: %[[PB:.*]] = bonsai.reshape %[[X]] {bonsai.phase = "backward"} : (tensor<2x8x48xf32>) -> tensor<2x8x6x8xf32>
// CHECK-NEXT: %[[DP:.*]] = bonsai.flash_attention_qkv_grad %[[DO]], %[[PB]], %[[O]], %[[LSE]] {bonsai.phase = "backward", causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x6x8xf32>, tensor<2x8x2x8xf32>, tensor<2x2x8xf32>) -> tensor<2x8x6x8xf32>
// CHECK-NEXT: %[[G:.*]] = bonsai.reshape %[[DP]] {bonsai.phase = "backward"} : (tensor<2x8x6x8xf32>) -> tensor<2x8x48xf32>
// CHECK-NEXT: return %[[O]], %[[G]]
// CHECK-NOT: bonsai.slice
// expected-remark @below {{bonsai-fuse: 1 flash_attention of slices -> flash_attention_qkv; 1 flash_attention_grad + concat of its gradients -> flash_attention_qkv_grad}}
func.func @packed(%x: tensor<2x8x48xf32>, %do: tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x48xf32>) {
  %q = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %k = bonsai.slice %x {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %k4 = bonsai.reshape %k : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %v = bonsai.slice %x {axis = 2 : i64, start = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %v4 = bonsai.reshape %v : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  // expected-remark @below {{fused flash_attention of slices -> flash_attention_qkv}}
  %o, %lse = bonsai.flash_attention %q4, %k4, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x2x8xf32>)
  // expected-remark @below {{fused flash_attention_grad + concat of its gradients -> flash_attention_qkv_grad}}
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q4, %k4, %v4, %o, %lse {bonsai.phase = "backward", causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %dv3 = bonsai.reshape %dv {bonsai.phase = "backward"} : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dk3 = bonsai.reshape %dk {bonsai.phase = "backward"} : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dq3 = bonsai.reshape %dq {bonsai.phase = "backward"} : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %g = bonsai.concat %dq3, %dk3, %dv3 {axis = 2 : i64, bonsai.phase = "backward"} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x48xf32>
  return %o, %g : tensor<2x8x2x8xf32>, tensor<2x8x48xf32>
}

// -----

// Grouped-query attention (4 query heads on 2 key/value heads: q is 32 features, k and v 16
// each), bf16, with segment ids, which both packed ops take as their last operand.

// CHECK-LABEL: func.func @gqa
// CHECK-SAME: (%[[X:.*]]: tensor<2x8x64xbf16>, %[[DO:.*]]: tensor<2x8x4x8xbf16>, %[[SEG:.*]]: tensor<2x8xi32>)
// CHECK-NEXT: %[[P:.*]] = bonsai.reshape %[[X]] : (tensor<2x8x64xbf16>) -> tensor<2x8x8x8xbf16>
// CHECK-NEXT: %[[O:.*]], %[[LSE:.*]] = bonsai.flash_attention_qkv %[[P]], %[[SEG]] {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x8x8xbf16>, tensor<2x8xi32>) -> (tensor<2x8x4x8xbf16>, tensor<2x4x8xf32>)
// CHECK-NEXT: %[[PB:.*]] = bonsai.reshape %[[X]] : (tensor<2x8x64xbf16>) -> tensor<2x8x8x8xbf16>
// CHECK-NEXT: %[[DP:.*]] = bonsai.flash_attention_qkv_grad %[[DO]], %[[PB]], %[[O]], %[[LSE]], %[[SEG]] {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x8xbf16>, tensor<2x8x8x8xbf16>, tensor<2x8x4x8xbf16>, tensor<2x4x8xf32>, tensor<2x8xi32>) -> tensor<2x8x8x8xbf16>
// CHECK-NEXT: %[[G:.*]] = bonsai.reshape %[[DP]] : (tensor<2x8x8x8xbf16>) -> tensor<2x8x64xbf16>
// CHECK-NEXT: return %[[G]]
// expected-remark @below {{bonsai-fuse: 1 flash_attention of slices -> flash_attention_qkv; 1 flash_attention_grad + concat of its gradients -> flash_attention_qkv_grad}}
func.func @gqa(%x: tensor<2x8x64xbf16>, %do: tensor<2x8x4x8xbf16>, %seg: tensor<2x8xi32>) -> tensor<2x8x64xbf16> {
  %q = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x64xbf16>) -> tensor<2x8x32xbf16>
  %q4 = bonsai.reshape %q : (tensor<2x8x32xbf16>) -> tensor<2x8x4x8xbf16>
  %k = bonsai.slice %x {axis = 2 : i64, start = 32 : i64} : (tensor<2x8x64xbf16>) -> tensor<2x8x16xbf16>
  %k4 = bonsai.reshape %k : (tensor<2x8x16xbf16>) -> tensor<2x8x2x8xbf16>
  %v = bonsai.slice %x {axis = 2 : i64, start = 48 : i64} : (tensor<2x8x64xbf16>) -> tensor<2x8x16xbf16>
  %v4 = bonsai.reshape %v : (tensor<2x8x16xbf16>) -> tensor<2x8x2x8xbf16>
  // expected-remark @below {{fused flash_attention of slices -> flash_attention_qkv}}
  %o, %lse = bonsai.flash_attention %q4, %k4, %v4, %seg {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x8xbf16>, tensor<2x8x2x8xbf16>, tensor<2x8x2x8xbf16>, tensor<2x8xi32>) -> (tensor<2x8x4x8xbf16>, tensor<2x4x8xf32>)
  // expected-remark @below {{fused flash_attention_grad + concat of its gradients -> flash_attention_qkv_grad}}
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q4, %k4, %v4, %o, %lse, %seg {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x8xbf16>, tensor<2x8x4x8xbf16>, tensor<2x8x2x8xbf16>, tensor<2x8x2x8xbf16>, tensor<2x8x4x8xbf16>, tensor<2x4x8xf32>, tensor<2x8xi32>) -> (tensor<2x8x4x8xbf16>, tensor<2x8x2x8xbf16>, tensor<2x8x2x8xbf16>)
  %dq3 = bonsai.reshape %dq : (tensor<2x8x4x8xbf16>) -> tensor<2x8x32xbf16>
  %dk3 = bonsai.reshape %dk : (tensor<2x8x2x8xbf16>) -> tensor<2x8x16xbf16>
  %dv3 = bonsai.reshape %dv : (tensor<2x8x2x8xbf16>) -> tensor<2x8x16xbf16>
  %g = bonsai.concat %dq3, %dk3, %dv3 {axis = 2 : i64} : (tensor<2x8x32xbf16>, tensor<2x8x16xbf16>, tensor<2x8x16xbf16>) -> tensor<2x8x64xbf16>
  return %g : tensor<2x8x64xbf16>
}

// -----

// A slice that something else also reads: the forward still reads q, k and v out of x, and
// the slice stays for its other reader.

// CHECK-LABEL: func.func @shared_slice
// CHECK-SAME: (%[[X:.*]]: tensor<2x8x48xf32>)
// CHECK-NEXT: %[[Q:.*]] = bonsai.slice %[[X]] {axis = 2 : i64, start = 0 : i64}
// CHECK-NEXT: %[[P:.*]] = bonsai.reshape %[[X]] : (tensor<2x8x48xf32>) -> tensor<2x8x6x8xf32>
// CHECK-NEXT: %[[O:.*]], %{{.*}} = bonsai.flash_attention_qkv %[[P]]
// CHECK-NEXT: return %[[O]], %[[Q]]
// CHECK-NOT: bonsai.slice
// expected-remark @below {{bonsai-fuse: 1 flash_attention of slices -> flash_attention_qkv}}
func.func @shared_slice(%x: tensor<2x8x48xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x16xf32>) {
  %q = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %k = bonsai.slice %x {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %k4 = bonsai.reshape %k : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %v = bonsai.slice %x {axis = 2 : i64, start = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %v4 = bonsai.reshape %v : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  // expected-remark @below {{fused flash_attention of slices -> flash_attention_qkv}}
  %o, %lse = bonsai.flash_attention %q4, %k4, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x2x8xf32>)
  return %o, %q : tensor<2x8x2x8xf32>, tensor<2x8x16xf32>
}

// -----

// A gradient that something else also reads (dk): the backward keeps flash_attention_grad and
// the concat; the forward, which does not depend on it, is still packed.

// CHECK-LABEL: func.func @grad_other_use
// CHECK: bonsai.flash_attention_qkv %
// CHECK: %[[DQ:.*]], %[[DK:.*]], %[[DV:.*]] = bonsai.flash_attention_grad
// CHECK: bonsai.concat
// CHECK-NOT: flash_attention_qkv_grad
// expected-remark @below {{bonsai-fuse: 1 flash_attention of slices -> flash_attention_qkv}}
func.func @grad_other_use(%x: tensor<2x8x48xf32>, %do: tensor<2x8x2x8xf32>) -> (tensor<2x8x48xf32>, tensor<2x8x2x8xf32>) {
  %q = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %k = bonsai.slice %x {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %k4 = bonsai.reshape %k : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %v = bonsai.slice %x {axis = 2 : i64, start = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %v4 = bonsai.reshape %v : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  // expected-remark @below {{fused flash_attention of slices -> flash_attention_qkv}}
  %o, %lse = bonsai.flash_attention %q4, %k4, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x2x8xf32>)
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q4, %k4, %v4, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %dq3 = bonsai.reshape %dq : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dk3 = bonsai.reshape %dk : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dv3 = bonsai.reshape %dv : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %g = bonsai.concat %dq3, %dk3, %dv3 {axis = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x48xf32>
  return %g, %dk : tensor<2x8x48xf32>, tensor<2x8x2x8xf32>
}

// -----

// Slices that do not cover the tensor (x has 8 more features than q, k and v): neither op
// changes, and the slices stay.

// CHECK-LABEL: func.func @not_covering
// CHECK-COUNT-3: bonsai.slice
// CHECK: bonsai.flash_attention %
// CHECK: bonsai.flash_attention_grad
// CHECK: bonsai.concat
// CHECK-NOT: flash_attention_qkv
func.func @not_covering(%x: tensor<2x8x56xf32>, %do: tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x48xf32>) {
  %q = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x56xf32>) -> tensor<2x8x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %k = bonsai.slice %x {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x56xf32>) -> tensor<2x8x16xf32>
  %k4 = bonsai.reshape %k : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %v = bonsai.slice %x {axis = 2 : i64, start = 32 : i64} : (tensor<2x8x56xf32>) -> tensor<2x8x16xf32>
  %v4 = bonsai.reshape %v : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %o, %lse = bonsai.flash_attention %q4, %k4, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x2x8xf32>)
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q4, %k4, %v4, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %dq3 = bonsai.reshape %dq : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dk3 = bonsai.reshape %dk : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dv3 = bonsai.reshape %dv : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %g = bonsai.concat %dq3, %dk3, %dv3 {axis = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x48xf32>
  return %o, %g : tensor<2x8x2x8xf32>, tensor<2x8x48xf32>
}

// -----

// q and k swapped (q is x's second third): not the packed layout, nothing changes.

// CHECK-LABEL: func.func @wrong_order
// CHECK: bonsai.flash_attention %
// CHECK: bonsai.flash_attention_grad
// CHECK: bonsai.concat
// CHECK-NOT: flash_attention_qkv
func.func @wrong_order(%x: tensor<2x8x48xf32>, %do: tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x48xf32>) {
  %q = bonsai.slice %x {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %k = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %k4 = bonsai.reshape %k : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %v = bonsai.slice %x {axis = 2 : i64, start = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %v4 = bonsai.reshape %v : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %o, %lse = bonsai.flash_attention %q4, %k4, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x2x8xf32>)
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q4, %k4, %v4, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %dq3 = bonsai.reshape %dq : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dk3 = bonsai.reshape %dk : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dv3 = bonsai.reshape %dv : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %g = bonsai.concat %dq3, %dk3, %dv3 {axis = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x48xf32>
  return %o, %g : tensor<2x8x2x8xf32>, tensor<2x8x48xf32>
}

// -----

// The gradients concatenated in another order than their slices (dk first): the concat is
// not the packed gradient, and stays.

// CHECK-LABEL: func.func @concat_order
// CHECK: bonsai.flash_attention_qkv %
// CHECK: bonsai.flash_attention_grad
// CHECK: bonsai.concat
// CHECK-NOT: flash_attention_qkv_grad
// expected-remark @below {{bonsai-fuse: 1 flash_attention of slices -> flash_attention_qkv}}
func.func @concat_order(%x: tensor<2x8x48xf32>, %do: tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x48xf32>) {
  %q = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %k = bonsai.slice %x {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %k4 = bonsai.reshape %k : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %v = bonsai.slice %x {axis = 2 : i64, start = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %v4 = bonsai.reshape %v : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  // expected-remark @below {{fused flash_attention of slices -> flash_attention_qkv}}
  %o, %lse = bonsai.flash_attention %q4, %k4, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x2x8xf32>)
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q4, %k4, %v4, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %dq3 = bonsai.reshape %dq : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dk3 = bonsai.reshape %dk : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dv3 = bonsai.reshape %dv : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %g = bonsai.concat %dk3, %dq3, %dv3 {axis = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x48xf32>
  return %o, %g : tensor<2x8x2x8xf32>, tensor<2x8x48xf32>
}

// -----

// Ring attention (ring_ranks) passes k and v around the ring apart: neither op changes.

// CHECK-LABEL: func.func @ring
// CHECK: bonsai.flash_attention %{{.*}} ring_ranks = 2
// CHECK: bonsai.flash_attention_grad %{{.*}} ring_ranks = 2
// CHECK: bonsai.concat
// CHECK-NOT: flash_attention_qkv
func.func @ring(%x: tensor<2x8x48xf32>, %do: tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x48xf32>) {
  %q = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %k = bonsai.slice %x {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %k4 = bonsai.reshape %k : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %v = bonsai.slice %x {axis = 2 : i64, start = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %v4 = bonsai.reshape %v : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %o, %lse = bonsai.flash_attention %q4, %k4, %v4 {causal, ring_ranks = 2 : i64, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x2x8xf32>)
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q4, %k4, %v4, %o, %lse {causal, ring_ranks = 2 : i64, scale = 2.500000e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x2x8xf32>) -> (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  %dq3 = bonsai.reshape %dq : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dk3 = bonsai.reshape %dk : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %dv3 = bonsai.reshape %dv : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %g = bonsai.concat %dq3, %dk3, %dv3 {axis = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x48xf32>
  return %o, %g : tensor<2x8x2x8xf32>, tensor<2x8x48xf32>
}

// Through autodiff and every family: GPT-2's attention block (Inputs/qkv.mlir) reads q, k and
// v out of the projection and writes its gradient whole, with no slice or concat left.
// MODEL: remark: bonsai-fuse:{{.*}} 1 flash_attention of slices -> flash_attention_qkv; 1 flash_attention_grad + concat of its gradients -> flash_attention_qkv_grad;
// MODEL-LABEL: func.func @qkv
// MODEL: %[[X:.*]] = bonsai.linear
// MODEL-NEXT: %[[P:.*]] = bonsai.reshape %[[X]] : (tensor<2x8x48xf32>) -> tensor<2x8x6x8xf32>
// MODEL-NEXT: %[[O:.*]], %[[LSE:.*]] = bonsai.flash_attention_qkv %[[P]]
// MODEL: %[[PB:.*]] = bonsai.reshape %[[X]] {bonsai.phase = "backward"}
// MODEL-NEXT: %[[DP:.*]] = bonsai.flash_attention_qkv_grad %{{.*}}, %[[PB]], %[[O]], %[[LSE]] {bonsai.phase = "backward", causal
// MODEL-NEXT: %[[G:.*]] = bonsai.reshape %[[DP]] {bonsai.phase = "backward"} : (tensor<2x8x6x8xf32>) -> tensor<2x8x48xf32>
// MODEL-NEXT: bonsai.linear_grad_input %[[G]]
// MODEL-NOT: bonsai.slice
// MODEL-NOT: bonsai.concat
