// RUN: bonsai-opt --bonsai-fuse -split-input-file -verify-diagnostics %s | FileCheck %s

// The flash-attention family (lib/Transforms/Fusion/FlashAttention.cpp): an attention whose
// result an attention_grad of the same operands reads becomes flash_attention, which also
// returns the log-sum-exp (f32 [batch, heads, seq]), and the grad becomes
// flash_attention_grad, which reads it. The annotations (phase) stay on the new ops; every
// other reader of the output reads the flash op's output.

// CHECK-LABEL: func.func @step
// CHECK-SAME: (%[[Q:.*]]: tensor<2x8x4x16xbf16>, %[[K:.*]]: tensor<2x8x2x16xbf16>, %[[V:.*]]: tensor<2x8x2x16xbf16>, %[[DO:.*]]: tensor<2x8x4x16xbf16>)
// CHECK-NEXT: %[[O:.*]], %[[LSE:.*]] = bonsai.flash_attention %[[Q]], %[[K]], %[[V]] {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>) -> (tensor<2x8x4x16xbf16>, tensor<2x4x8xf32>)
// CHECK-NEXT: %[[Y:.*]] = bonsai.add %[[O]], %[[O]]
// CHECK-NEXT: %[[DQ:.*]], %[[DK:.*]], %[[DV:.*]] = bonsai.flash_attention_grad %[[DO]], %[[Q]], %[[K]], %[[V]], %[[O]], %[[LSE]] {bonsai.phase = "backward", causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x4x8xf32>) -> (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>)
// CHECK-NEXT: return %[[Y]], %[[DQ]], %[[DK]], %[[DV]]
// CHECK-NOT: bonsai.attention
// expected-remark @below {{bonsai-fuse: 1 attention -> flash_attention; 1 attention_grad -> flash_attention_grad}}
func.func @step(%q: tensor<2x8x4x16xbf16>, %k: tensor<2x8x2x16xbf16>, %v: tensor<2x8x2x16xbf16>, %do: tensor<2x8x4x16xbf16>) -> (tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>) {
  // expected-remark @below {{fused attention -> flash_attention}}
  %o = bonsai.attention %q, %k, %v {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>) -> tensor<2x8x4x16xbf16>
  %y = bonsai.add %o, %o : (tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>) -> tensor<2x8x4x16xbf16>
  // expected-remark @below {{fused attention_grad -> flash_attention_grad}}
  %dq, %dk, %dv = bonsai.attention_grad %do, %q, %k, %v, %o {bonsai.phase = "backward", causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x4x16xbf16>) -> (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>)
  return %y, %dq, %dk, %dv : tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>
}

// -----

// Not the gradient of this attention: the grad reads the output with another scale (and,
// below, without the causal mask). Nothing would read a log-sum-exp that matches, so both
// ops stay.

// CHECK-LABEL: func.func @other_scale
// CHECK: bonsai.attention %{{.*}} {causal, scale = 2.500000e-01 : f64}
// CHECK: bonsai.attention_grad %{{.*}} {causal, scale = 5.000000e-01 : f64}
// CHECK: bonsai.attention_grad %{{.*}} {scale = 2.500000e-01 : f64}
// CHECK-NOT: flash_attention
func.func @other_scale(%q: tensor<1x8x2x8xf32>, %do: tensor<1x8x2x8xf32>) -> (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) {
  %o = bonsai.attention %q, %q, %q {causal, scale = 2.500000e-01 : f64} : (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x8x2x8xf32>
  %dq, %dk, %dv = bonsai.attention_grad %do, %q, %q, %q, %o {causal, scale = 5.000000e-01 : f64} : (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>)
  %dq2, %dk2, %dv2 = bonsai.attention_grad %do, %q, %q, %q, %o {scale = 2.500000e-01 : f64} : (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>)
  return %dq, %dq2 : tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>
}

// -----

// The grad reads this attention's output but other keys: it is another attention's gradient.

// CHECK-LABEL: func.func @other_keys
// CHECK: bonsai.attention %
// CHECK: bonsai.attention_grad %
// CHECK-NOT: flash_attention
func.func @other_keys(%q: tensor<1x8x2x8xf32>, %k: tensor<1x8x2x8xf32>, %do: tensor<1x8x2x8xf32>) -> tensor<1x8x2x8xf32> {
  %o = bonsai.attention %q, %q, %q {causal, scale = 2.500000e-01 : f64} : (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x8x2x8xf32>
  %dq, %dk, %dv = bonsai.attention_grad %do, %q, %k, %q, %o {causal, scale = 2.500000e-01 : f64} : (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>)
  return %dq : tensor<1x8x2x8xf32>
}

