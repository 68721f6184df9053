// RUN: bonsai-opt %s | bonsai-opt | FileCheck %s
// RUN: bonsai-opt %s --mlir-print-op-generic | bonsai-opt | FileCheck %s

// The optional operands of packed rows (docs/training.md, "Packed sequences") and rope's llama3
// scaling survive print, parse, print in both forms; without them the ops print as before.

// CHECK-LABEL: func.func @packed
func.func @packed(%x: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %pos: tensor<2x8xi32>,
                  %seg: tensor<2x8xi64>, %do: tensor<2x8x4x16xf32>, %lse: tensor<2x4x8xf32>) {
  // CHECK: bonsai.rope %{{.*}}, %{{.*}} : (tensor<2x8x4x16xf32>, tensor<2x8xi32>)
  %q = bonsai.rope %x, %pos {theta = 1.0e+04 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8xi32>) -> tensor<2x8x4x16xf32>
  // CHECK: bonsai.rope %{{.*}}, %{{.*}} {high_freq_factor = 4.000000e+00 : f64, low_freq_factor = 1.000000e+00 : f64, original_max_positions = 8192 : i64, scaling_factor = 8.000000e+00 : f64, theta = 5.000000e+05 : f64}
  %r = bonsai.rope %x, %pos {theta = 5.0e+05 : f64, scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_positions = 8192 : i64} : (tensor<2x8x4x16xf32>, tensor<2x8xi32>) -> tensor<2x8x4x16xf32>
  // CHECK: bonsai.rope_grad %{{.*}}, %{{.*}} {high_freq_factor
  %dr = bonsai.rope_grad %r, %pos {theta = 5.0e+05 : f64, scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_positions = 8192 : i64} : (tensor<2x8x4x16xf32>, tensor<2x8xi32>) -> tensor<2x8x4x16xf32>
  // CHECK: bonsai.rope %{{[a-z0-9]*}} {high_freq_factor
  %s = bonsai.rope %x {theta = 5.0e+05 : f64, scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_positions = 8192 : i64} : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
  // CHECK: bonsai.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8xi64>)
  %o = bonsai.attention %q, %k, %k, %seg {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8xi64>) -> tensor<2x8x4x16xf32>
  // CHECK: bonsai.attention_grad {{.*}} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8xi64>)
  %dq, %dk, %dv = bonsai.attention_grad %do, %q, %k, %k, %o, %seg {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8xi64>) -> (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>)
  // CHECK: bonsai.flash_attention {{.*}} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8xi64>)
  %fo, %flse = bonsai.flash_attention %q, %k, %k, %seg {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8xi64>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  // CHECK: bonsai.flash_attention_grad {{.*}} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4x8xf32>, tensor<2x8xi64>)
  %fdq, %fdk, %fdv = bonsai.flash_attention_grad %do, %q, %k, %k, %fo, %lse, %seg {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4x8xf32>, tensor<2x8xi64>) -> (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>)
  return
}
