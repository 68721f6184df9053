// RUN: bonsai-opt %s | bonsai-opt | FileCheck %s

// The fused ops of bonsai-fuse's `optimizer` and `gemm-epilogue` families round-trip.

// CHECK-LABEL: func.func @fused
// CHECK: bonsai.multi_tensor_adamw_update %{{.*}}, %{{.*}}, %{{.*}} gradients(%{{.*}}, %{{.*}} : tensor<8xf32>, tensor<2x2xf32>) params(%{{.*}}, %{{.*}} : tensor<8xbf16>, tensor<2x2xbf16>) exp_avg(%{{.*}}, %{{.*}} : tensor<8xf32>, tensor<2x2xf32>) exp_avg_sq(%{{.*}}, %{{.*}} : tensor<8xf32>, tensor<2x2xf32>) master(%{{.*}}, %{{.*}} : tensor<8xf32>, tensor<2x2xf32>) {beta1 = 9.000000e-01 : f64, beta2 = 5.000000e-01 : f64, eps = 1.000000e-08 : f64, grad_clip = 1.000000e+00 : f64, weight_decay = 1.000000e-01 : f64} : tensor<i64>, tensor<f32>, tensor<f32>
// CHECK: bonsai.multi_tensor_sgd_update %{{.*}}, %{{.*}} gradients(%{{.*}} : tensor<8xf32>) params(%{{.*}} : tensor<8xbf16>) momentum_buffer(%{{.*}} : tensor<8xf32>) {grad_clip = 0.000000e+00 : f64, momentum = 0.000000e+00 : f64, weight_decay = 0.000000e+00 : f64} : tensor<f32>, tensor<f32>
// CHECK: %{{.*}}, %{{.*}} = bonsai.linear_gelu %{{.*}}, %{{.*}} : (tensor<4x16xbf16>, tensor<32x16xbf16>) -> (tensor<4x32xbf16>, tensor<4x32xbf16>)
// CHECK: bonsai.linear_grad_weight_accumulate %{{.*}}, %{{.*}}, %{{.*}} : tensor<4x32xbf16>, tensor<4x16xbf16>, tensor<32x16xf32>
func.func @fused(%step: tensor<i64>, %lr: tensor<f32>, %norm: tensor<f32>, %g0: tensor<8xf32>, %g1: tensor<2x2xf32>, %w0: tensor<8xbf16>, %w1: tensor<2x2xbf16>, %m0: tensor<8xf32>, %m1: tensor<2x2xf32>, %v0: tensor<8xf32>, %v1: tensor<2x2xf32>, %x0: tensor<8xf32>, %x1: tensor<2x2xf32>, %x: tensor<4x16xbf16>, %w: tensor<32x16xbf16>, %acc: tensor<32x16xf32>) -> tensor<4x32xbf16> {
  bonsai.multi_tensor_adamw_update %step, %lr, %norm gradients(%g0, %g1 : tensor<8xf32>, tensor<2x2xf32>) params(%w0, %w1 : tensor<8xbf16>, tensor<2x2xbf16>) exp_avg(%m0, %m1 : tensor<8xf32>, tensor<2x2xf32>) exp_avg_sq(%v0, %v1 : tensor<8xf32>, tensor<2x2xf32>) master(%x0, %x1 : tensor<8xf32>, tensor<2x2xf32>) {beta1 = 0.9 : f64, beta2 = 0.5 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, grad_clip = 1.0 : f64} : tensor<i64>, tensor<f32>, tensor<f32>
  bonsai.multi_tensor_sgd_update %lr, %norm gradients(%g0 : tensor<8xf32>) params(%w0 : tensor<8xbf16>) momentum_buffer(%m0 : tensor<8xf32>) {momentum = 0.0 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<f32>, tensor<f32>
  %y, %pre = bonsai.linear_gelu %x, %w : (tensor<4x16xbf16>, tensor<32x16xbf16>) -> (tensor<4x32xbf16>, tensor<4x32xbf16>)
  bonsai.linear_grad_weight_accumulate %pre, %x, %acc : tensor<4x32xbf16>, tensor<4x16xbf16>, tensor<32x16xf32>
  return %y : tensor<4x32xbf16>
}
