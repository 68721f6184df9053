// RUN: bonsai-opt %s | bonsai-opt | FileCheck %s
// RUN: bonsai-opt %s --mlir-print-op-generic | bonsai-opt | FileCheck %s

// Every model op, type and attribute of the bonsai dialect survives print, parse, print in
// both the custom and the generic form.

// CHECK-LABEL: func.func @params
func.func @params() {
  // CHECK: bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<64x64xbf16>
  %0 = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<64x64xbf16>
  // CHECK: bonsai.param "a" frozen : tensor<64xf16>
  %1 = bonsai.param "a" frozen : tensor<64xf16>
  // CHECK: bonsai.param "b" trainable : tensor<64xf32>
  %2 = bonsai.param "b" trainable : tensor<64xf32>
  // CHECK: bonsai.param "c" frozen : tensor<64x64xf8E4M3FN>
  %3 = bonsai.param "c" frozen : tensor<64x64xf8E4M3FN>
  // CHECK: bonsai.param "d" frozen : tensor<64x64xf8E5M2>
  %4 = bonsai.param "d" frozen : tensor<64x64xf8E5M2>
  // CHECK: bonsai.param "e" frozen : tensor<8xi32>
  %5 = bonsai.param "e" frozen : tensor<8xi32>
  // CHECK: bonsai.param "f" frozen : tensor<8xi64>
  %6 = bonsai.param "f" frozen : tensor<8xi64>
  // CHECK: bonsai.param "g" frozen : tensor<128x64x!bonsai.nf4<64, 256>>
  %7 = bonsai.param "g" frozen : tensor<128x64x!bonsai.nf4<64, 256>>
  // CHECK: bonsai.param "h" trainable placement <pinned_host> sharding <ranks = 4, shape = [64, 64]> : tensor<1024xf32>
  %8 = bonsai.param "h" trainable placement <pinned_host> sharding <ranks = 4, shape = [64, 64]> : tensor<1024xf32>
  // CHECK: bonsai.param "i" frozen placement <device> : tensor<64xf32>
  %9 = bonsai.param "i" frozen placement <device> : tensor<64xf32>
  return
}

// CHECK-LABEL: func.func @compute
func.func @compute(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi64>) -> tensor<f32> {
  %table = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x16xf32>
  // CHECK: %[[H:.*]] = bonsai.embedding %{{.*}}, %{{.*}} : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %h = bonsai.embedding %table, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %nw = bonsai.param "n.weight" trainable : tensor<16xf32>
  %nb = bonsai.param "n.bias" trainable : tensor<16xf32>
  // CHECK: bonsai.rms_norm %[[H]], %{{.*}} {epsilon = 1.000000e-05 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %r = bonsai.rms_norm %h, %nw {epsilon = 1.0e-5 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: bonsai.rms_norm %[[H]], %{{.*}} : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %r2 = bonsai.rms_norm %h, %nw : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: bonsai.layer_norm %[[H]], %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %l = bonsai.layer_norm %h, %nw, %nb : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %w = bonsai.param "q.weight" trainable : tensor<16x16xf32>
  // CHECK: %[[Q:.*]] = bonsai.linear %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %q = bonsai.linear %r, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: bonsai.linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %qb = bonsai.linear %l, %w, %nb : (tensor<2x8x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: %[[Q4:.*]] = bonsai.reshape %[[Q]] : (tensor<2x8x16xf32>) -> tensor<2x8x4x4xf32>
  %q4 = bonsai.reshape %q : (tensor<2x8x16xf32>) -> tensor<2x8x4x4xf32>
  %k4 = bonsai.slice %q4 {axis = 2 : i64, start = 2 : i64} : (tensor<2x8x4x4xf32>) -> tensor<2x8x2x4xf32>
  // CHECK: bonsai.slice %[[Q4]] {axis = 2 : i64, start = 2 : i64} : (tensor<2x8x4x4xf32>) -> tensor<2x8x2x4xf32>
  // CHECK: bonsai.concat %[[Q4]], %{{.*}} {axis = 2 : i64} : (tensor<2x8x4x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x6x4xf32>
  %qk = bonsai.concat %q4, %k4 {axis = 2 : i64} : (tensor<2x8x4x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x6x4xf32>
  // CHECK: bonsai.rope %[[Q4]] : (tensor<2x8x4x4xf32>) -> tensor<2x8x4x4xf32>
  %qr = bonsai.rope %q4 : (tensor<2x8x4x4xf32>) -> tensor<2x8x4x4xf32>
  // CHECK: bonsai.rope %{{.*}} {theta = 5.000000e+05 : f64} : (tensor<2x8x2x4xf32>) -> tensor<2x8x2x4xf32>
  %kr = bonsai.rope %k4 {theta = 500000.0 : f64} : (tensor<2x8x2x4xf32>) -> tensor<2x8x2x4xf32>
  // CHECK: bonsai.attention %{{.*}}, %{{.*}}, %{{.*}} {causal, scale = 5.000000e-01 : f64} : (tensor<2x8x4x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x4x4xf32>
  %a = bonsai.attention %qr, %kr, %k4 {causal, scale = 0.5 : f64} : (tensor<2x8x4x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x4x4xf32>
  // CHECK: bonsai.attention %{{.*}}, %{{.*}}, %{{.*}} {scale = 2.500000e-01 : f64}
  %a2 = bonsai.attention %qr, %qr, %qr {scale = 0.25 : f64} : (tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>) -> tensor<2x8x4x4xf32>
  // CHECK: bonsai.transpose %{{.*}} {permutation = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x4xf32>) -> tensor<2x4x8x4xf32>
  %t = bonsai.transpose %a {permutation = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x4xf32>) -> tensor<2x4x8x4xf32>
  // CHECK: bonsai.matmul %{{.*}}, %{{.*}} : (tensor<2x4x8x4xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x8x8xf32>
  %tt = bonsai.transpose %t {permutation = array<i64: 0, 1, 3, 2>} : (tensor<2x4x8x4xf32>) -> tensor<2x4x4x8xf32>
  %s = bonsai.matmul %t, %tt : (tensor<2x4x8x4xf32>, tensor<2x4x4x8xf32>) -> tensor<2x4x8x8xf32>
  // CHECK: bonsai.softmax %{{.*}} {axis = 3 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %p = bonsai.softmax %s {axis = 3 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  // CHECK: bonsai.silu %{{.*}} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %si = bonsai.silu %q : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: bonsai.gelu %{{.*}} {approximation = #bonsai.gelu_approximation<tanh>} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %g = bonsai.gelu %q {approximation = #bonsai.gelu_approximation<tanh>} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: bonsai.gelu %{{.*}} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %g2 = bonsai.gelu %q : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: bonsai.swiglu %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %sw = bonsai.swiglu %g, %si : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: bonsai.add %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %x = bonsai.add %h, %sw : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: bonsai.mul %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %y = bonsai.mul %x, %nw : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: bonsai.add %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<1x16xf32>) -> tensor<2x8x16xf32>
  %nw2 = bonsai.reshape %nw : (tensor<16xf32>) -> tensor<1x16xf32>
  %z = bonsai.add %y, %nw2 : (tensor<2x8x16xf32>, tensor<1x16xf32>) -> tensor<2x8x16xf32>
  // CHECK: %[[BF:.*]] = bonsai.cast %{{.*}} : (tensor<2x8x16xf32>) -> tensor<2x8x16xbf16>
  %zb = bonsai.cast %z : (tensor<2x8x16xf32>) -> tensor<2x8x16xbf16>
  // CHECK: bonsai.cast %[[BF]] : (tensor<2x8x16xbf16>) -> tensor<2x8x16xf8E4M3FN>
  %z8 = bonsai.cast %zb : (tensor<2x8x16xbf16>) -> tensor<2x8x16xf8E4M3FN>
  %qw = bonsai.param "lm_head.weight" frozen : tensor<32x16x!bonsai.nf4<64, 256>>
  // CHECK: bonsai.dequantize %{{.*}} : (tensor<32x16x!bonsai.nf4<64, 256>>) -> tensor<32x16xf32>
  %dq = bonsai.dequantize %qw : (tensor<32x16x!bonsai.nf4<64, 256>>) -> tensor<32x16xf32>
  %logits = bonsai.linear %z, %dq : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  // CHECK: bonsai.cross_entropy %{{.*}}, %{{.*}} : (tensor<2x8x32xf32>, tensor<2x8xi64>) -> tensor<f32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x32xf32>, tensor<2x8xi64>) -> tensor<f32>
  // CHECK: bonsai.cross_entropy %{{.*}}, %{{.*}} {ignore_index = 0 : i64}
  %loss2 = bonsai.cross_entropy %logits, %labels {ignore_index = 0 : i64} : (tensor<2x8x32xf32>, tensor<2x8xi64>) -> tensor<f32>
  return %loss : tensor<f32>
}

// The collectives bonsai-shard inserts, and state that is one rank's share.
// CHECK-LABEL: func.func @collectives
func.func @collectives(%w: tensor<16x8xbf16>, %g: tensor<16x8xf32>, %n: tensor<f32>) -> tensor<16x8xbf16> {
  // CHECK: bonsai.state optimizer "w.exp_avg" sharding <ranks = 2, shape = [16, 8]> : tensor<64xf32>
  %m = bonsai.state optimizer "w.exp_avg" sharding <ranks = 2, shape = [16, 8]> : tensor<64xf32>
  // CHECK: bonsai.shard_slice %{{.*}} {ranks = 2 : i64} : (tensor<16x8xbf16>) -> tensor<64xbf16>
  %s = bonsai.shard_slice %w {ranks = 2 : i64} : (tensor<16x8xbf16>) -> tensor<64xbf16>
  // CHECK: bonsai.reduce_scatter %{{.*}} {ranks = 2 : i64} : (tensor<16x8xf32>) -> tensor<64xf32>
  %r = bonsai.reduce_scatter %g {ranks = 2 : i64} : (tensor<16x8xf32>) -> tensor<64xf32>
  // CHECK: bonsai.all_gather %{{.*}} {ranks = 2 : i64} : (tensor<64xbf16>) -> tensor<16x8xbf16>
  %full = bonsai.all_gather %s {ranks = 2 : i64} : (tensor<64xbf16>) -> tensor<16x8xbf16>
  // CHECK: bonsai.all_gather_into %{{.*}}, %{{.*}} {ranks = 2 : i64} : (tensor<64xbf16>, tensor<16x8xbf16>) -> ()
  bonsai.all_gather_into %s, %w {ranks = 2 : i64} : (tensor<64xbf16>, tensor<16x8xbf16>) -> ()
  // CHECK: bonsai.all_reduce %{{.*}} {ranks = 2 : i64, reduction = "l2"} : (tensor<f32>) -> tensor<f32>
  %norm = bonsai.all_reduce %n {ranks = 2 : i64, reduction = "l2"} : (tensor<f32>) -> tensor<f32>
  return %full : tensor<16x8xbf16>
}
