// RUN: bonsai-opt --bonsai-fuse %s 2>&1 | FileCheck %s

// A forward-only plan (generation, evaluation) has no attention_grad: nothing reads a
// log-sum-exp, so the attention stays as it is and the pass says nothing.

// CHECK-NOT: remark
// CHECK-LABEL: func.func @generate
// CHECK: bonsai.attention %{{.*}} {causal, scale = 2.500000e-01 : f64}
// CHECK-NOT: flash_attention
func.func @generate(%q: tensor<1x16x4x8xf32>, %k: tensor<1x16x2x8xf32>, %v: tensor<1x16x2x8xf32>) -> tensor<1x16x4x8xf32> {
  %o = bonsai.attention %q, %k, %v {causal, scale = 2.500000e-01 : f64} : (tensor<1x16x4x8xf32>, tensor<1x16x2x8xf32>, tensor<1x16x2x8xf32>) -> tensor<1x16x4x8xf32>
  return %o : tensor<1x16x4x8xf32>
}
