// RUN: bonsai-opt --bonsai-fuse="disable=flash-attention" %s 2>&1 | FileCheck %s

// disable=flash-attention leaves an attention and its grad as they are, and the pass says
// nothing.

// CHECK-NOT: remark
// CHECK-LABEL: func.func @step
// CHECK: %[[O:.*]] = bonsai.attention
// CHECK: bonsai.attention_grad %{{.*}}, %[[O]] {causal, scale = 2.500000e-01 : f64}
// CHECK-NOT: flash_attention
func.func @step(%q: tensor<1x8x2x8xf32>, %do: tensor<1x8x2x8xf32>) -> tensor<1x8x2x8xf32> {
  %o = bonsai.attention %q, %q, %q {causal, scale = 2.500000e-01 : f64} : (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x8x2x8xf32>
  %dq, %dk, %dv = bonsai.attention_grad %do, %q, %q, %q, %o {causal, scale = 2.500000e-01 : f64} : (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> (tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>)
  return %dq : tensor<1x8x2x8xf32>
}
