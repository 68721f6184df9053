// RUN: bonsai-opt %s | bonsai-opt | FileCheck %s
// RUN: bonsai-opt %s --mlir-print-op-generic | bonsai-opt | FileCheck %s

// bonsai.dora_scale (docs/lora.md) survives print, parse, print in both forms.

// CHECK-LABEL: func.func @dora_scale
// CHECK: bonsai.dora_scale %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {scale = 2.000000e+00 : f64} : (tensor<64xbf16>, tensor<64x32xbf16>, tensor<8x32xbf16>, tensor<64x8xbf16>) -> tensor<64xbf16>
func.func @dora_scale(%m: tensor<64xbf16>, %w: tensor<64x32xbf16>, %a: tensor<8x32xbf16>, %b: tensor<64x8xbf16>) -> tensor<64xbf16> {
  %s = bonsai.dora_scale %m, %w, %a, %b {scale = 2.0 : f64} : (tensor<64xbf16>, tensor<64x32xbf16>, tensor<8x32xbf16>, tensor<64x8xbf16>) -> tensor<64xbf16>
  return %s : tensor<64xbf16>
}

// bonsai.dora_grad (docs/fusion.md, "dora") too.

// CHECK-LABEL: func.func @dora_grad
// CHECK: bonsai.dora_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x8x64xbf16>, tensor<2x8x64xbf16>, tensor<64xbf16>, tensor<64xbf16>) -> (tensor<2x8x64xbf16>, tensor<64xbf16>)
func.func @dora_grad(%dy: tensor<2x8x64xbf16>, %y: tensor<2x8x64xbf16>, %s: tensor<64xbf16>, %m: tensor<64xbf16>) -> (tensor<2x8x64xbf16>, tensor<64xbf16>) {
  %dx, %dm = bonsai.dora_grad %dy, %y, %s, %m : (tensor<2x8x64xbf16>, tensor<2x8x64xbf16>, tensor<64xbf16>, tensor<64xbf16>) -> (tensor<2x8x64xbf16>, tensor<64xbf16>)
  return %dx, %dm : tensor<2x8x64xbf16>, tensor<64xbf16>
}
