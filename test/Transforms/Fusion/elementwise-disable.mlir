// RUN: bonsai-opt %s --bonsai-fuse="disable=elementwise" | FileCheck %s
// RUN: bonsai-opt %s --bonsai-fuse -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK

// With the family disabled the chain stays as it is.
// CHECK-LABEL: func.func @chain
// CHECK-NOT: bonsai.fused_elementwise
// CHECK: bonsai.silu
// CHECK: bonsai.mul

// Enabled, it says what it fused, at the site and for the function.
// REMARK: remark: fused elementwise regions
// REMARK: remark: bonsai-fuse: 1 elementwise regions
func.func @chain(%x: tensor<64xf32>, %y: tensor<64xf32>) -> tensor<64xf32> {
  %0 = bonsai.silu %x : (tensor<64xf32>) -> tensor<64xf32>
  %1 = bonsai.mul %0, %y : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %1 : tensor<64xf32>
}
