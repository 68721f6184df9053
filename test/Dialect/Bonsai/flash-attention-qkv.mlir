// RUN: bonsai-opt %s | bonsai-opt | FileCheck %s
// RUN: bonsai-opt %s --mlir-print-op-generic | bonsai-opt | FileCheck %s

// bonsai.flash_attention_qkv and bonsai.flash_attention_qkv_grad (BonsaiFlashAttentionOps.td)
// round-trip: q, k and v packed as heads of one tensor (here 4 query heads and 2 key/value
// heads, 4 + 2·2 = 8), with and without segment ids.

// CHECK-LABEL: func.func @packed
// CHECK: %[[O:.*]], %[[LSE:.*]] = bonsai.flash_attention_qkv %{{.*}} {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x8x16xbf16>) -> (tensor<2x8x4x16xbf16>, tensor<2x4x8xf32>)
// CHECK: bonsai.flash_attention_qkv_grad %{{.*}}, %{{.*}}, %[[O]], %[[LSE]] {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x8x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x4x8xf32>) -> tensor<2x8x8x16xbf16>
// CHECK: %[[SO:.*]], %[[SLSE:.*]] = bonsai.flash_attention_qkv %{{.*}}, %[[SEG:.*]] {scale = 5.000000e-01 : f64} : (tensor<1x4x3x8xf32>, tensor<1x4xi64>) -> (tensor<1x4x1x8xf32>, tensor<1x1x4xf32>)
// CHECK: bonsai.flash_attention_qkv_grad %{{.*}}, %{{.*}}, %[[SO]], %[[SLSE]], %[[SEG]] {scale = 5.000000e-01 : f64} : (tensor<1x4x1x8xf32>, tensor<1x4x3x8xf32>, tensor<1x4x1x8xf32>, tensor<1x1x4xf32>, tensor<1x4xi64>) -> tensor<1x4x3x8xf32>
func.func @packed(%qkv: tensor<2x8x8x16xbf16>, %do: tensor<2x8x4x16xbf16>, %x: tensor<1x4x3x8xf32>, %dx: tensor<1x4x1x8xf32>, %seg: tensor<1x4xi64>) -> (tensor<2x8x8x16xbf16>, tensor<1x4x3x8xf32>) {
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x8x16xbf16>) -> (tensor<2x8x4x16xbf16>, tensor<2x4x8xf32>)
  %g = bonsai.flash_attention_qkv_grad %do, %qkv, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x8x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x4x8xf32>) -> tensor<2x8x8x16xbf16>
  %so, %slse = bonsai.flash_attention_qkv %x, %seg {scale = 5.000000e-01 : f64} : (tensor<1x4x3x8xf32>, tensor<1x4xi64>) -> (tensor<1x4x1x8xf32>, tensor<1x1x4xf32>)
  %sg = bonsai.flash_attention_qkv_grad %dx, %x, %so, %slse, %seg {scale = 5.000000e-01 : f64} : (tensor<1x4x1x8xf32>, tensor<1x4x3x8xf32>, tensor<1x4x1x8xf32>, tensor<1x1x4xf32>, tensor<1x4xi64>) -> tensor<1x4x3x8xf32>
  return %g, %sg : tensor<2x8x8x16xbf16>, tensor<1x4x3x8xf32>
}
