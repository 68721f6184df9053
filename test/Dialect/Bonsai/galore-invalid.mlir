// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

// Negative tests of the GaLore ops' verifiers (BonsaiGaLoreOps.td): one case per rule.

func.func @refresh_side(%g: tensor<16x8xf32>, %s: tensor<i64>, %p: tensor<16x2xf32>, %st: tensor<1xf32>) {
  // expected-error @+1 {{projects the left side of a 16x8 gradient; GaLore projects the smaller side}}
  %w = bonsai.galore_refresh %g, %s, %p, %st {rank = 2 : i64, update_proj_gap = 4 : i64, offset = 0 : i64, slot = 0 : i64, left = true, projector_kind = "randomized", power_iterations = 1 : i64, seed = 0 : i64} : (tensor<16x8xf32>, tensor<i64>, tensor<16x2xf32>, tensor<1xf32>) -> tensor<144xf32>
  return
}

// -----

func.func @refresh_rank(%g: tensor<8x16xf32>, %s: tensor<i64>, %p: tensor<8x8xf32>, %st: tensor<1xf32>) {
  // expected-error @+1 {{rank 8 must be positive and below min(m, n) = 8}}
  %w = bonsai.galore_refresh %g, %s, %p, %st {rank = 8 : i64, update_proj_gap = 4 : i64, offset = 0 : i64, slot = 0 : i64, left = true, projector_kind = "randomized", power_iterations = 1 : i64, seed = 0 : i64} : (tensor<8x16xf32>, tensor<i64>, tensor<8x8xf32>, tensor<1xf32>) -> tensor<512xf32>
  return
}

// -----

func.func @refresh_gap(%g: tensor<8x16xf32>, %s: tensor<i64>, %p: tensor<8x2xf32>, %st: tensor<1xf32>) {
  // expected-error @+1 {{update_proj_gap must be positive, got 0}}
  %w = bonsai.galore_refresh %g, %s, %p, %st {rank = 2 : i64, update_proj_gap = 0 : i64, offset = 0 : i64, slot = 0 : i64, left = true, projector_kind = "randomized", power_iterations = 1 : i64, seed = 0 : i64} : (tensor<8x16xf32>, tensor<i64>, tensor<8x2xf32>, tensor<1xf32>) -> tensor<128xf32>
  return
}

// -----

func.func @refresh_offset(%g: tensor<8x16xf32>, %s: tensor<i64>, %p: tensor<8x2xf32>, %st: tensor<1xf32>) {
  // expected-error @+1 {{offset 4 must be in [0, update_proj_gap = 4)}}
  %w = bonsai.galore_refresh %g, %s, %p, %st {rank = 2 : i64, update_proj_gap = 4 : i64, offset = 4 : i64, slot = 0 : i64, left = true, projector_kind = "randomized", power_iterations = 1 : i64, seed = 0 : i64} : (tensor<8x16xf32>, tensor<i64>, tensor<8x2xf32>, tensor<1xf32>) -> tensor<128xf32>
  return
}

// -----

func.func @refresh_kind(%g: tensor<8x16xf32>, %s: tensor<i64>, %p: tensor<8x2xf32>, %st: tensor<1xf32>) {
  // expected-error @+1 {{unknown projector_kind 'qr'; expected 'svd' or 'randomized'}}
  %w = bonsai.galore_refresh %g, %s, %p, %st {rank = 2 : i64, update_proj_gap = 4 : i64, offset = 0 : i64, slot = 0 : i64, left = true, projector_kind = "qr", power_iterations = 1 : i64, seed = 0 : i64} : (tensor<8x16xf32>, tensor<i64>, tensor<8x2xf32>, tensor<1xf32>) -> tensor<128xf32>
  return
}

// -----

func.func @refresh_projector(%g: tensor<8x16xf32>, %s: tensor<i64>, %p: tensor<16x2xf32>, %st: tensor<1xf32>) {
  // expected-error @+1 {{projector must be an f32 tensor of shape [8, 2], got 'tensor<16x2xf32>'}}
  %w = bonsai.galore_refresh %g, %s, %p, %st {rank = 2 : i64, update_proj_gap = 4 : i64, offset = 0 : i64, slot = 0 : i64, left = true, projector_kind = "randomized", power_iterations = 1 : i64, seed = 0 : i64} : (tensor<8x16xf32>, tensor<i64>, tensor<16x2xf32>, tensor<1xf32>) -> tensor<128xf32>
  return
}

// -----

func.func @refresh_slot(%g: tensor<8x16xf32>, %s: tensor<i64>, %p: tensor<8x2xf32>, %st: tensor<2xf32>) {
  // expected-error @+1 {{slot 2 is outside the status vector of 2 weights}}
  %w = bonsai.galore_refresh %g, %s, %p, %st {rank = 2 : i64, update_proj_gap = 4 : i64, offset = 0 : i64, slot = 2 : i64, left = true, projector_kind = "randomized", power_iterations = 1 : i64, seed = 0 : i64} : (tensor<8x16xf32>, tensor<i64>, tensor<8x2xf32>, tensor<2xf32>) -> tensor<128xf32>
  return
}

// -----

func.func @refresh_workspace(%g: tensor<8x16xf32>, %s: tensor<i64>, %p: tensor<8x2xf32>, %st: tensor<1xf32>) {
  // expected-error @+1 {{workspace must be an f32 tensor of shape [128], got 'tensor<100xf32>'}}
  %w = bonsai.galore_refresh %g, %s, %p, %st {rank = 2 : i64, update_proj_gap = 4 : i64, offset = 0 : i64, slot = 0 : i64, left = true, projector_kind = "randomized", power_iterations = 1 : i64, seed = 0 : i64} : (tensor<8x16xf32>, tensor<i64>, tensor<8x2xf32>, tensor<1xf32>) -> tensor<100xf32>
  return
}

// -----

func.func @project_shape(%g: tensor<8x16xf32>, %p: tensor<8x2xf32>) {
  // expected-error @+1 {{result must be an f32 tensor of shape [2, 16], got 'tensor<16x2xf32>'}}
  %r = bonsai.galore_project %g, %p {left = true, bf16_operands = false} : (tensor<8x16xf32>, tensor<8x2xf32>) -> tensor<16x2xf32>
  return
}

// -----

func.func @update_moments(%r: tensor<16x2xf32>, %s: tensor<i64>, %lr: tensor<f32>, %n: tensor<f32>, %p: tensor<8x2xf32>, %w: tensor<16x8xf32>, %m: tensor<16x8xf32>) {
  // expected-error @+1 {{exp_avg must be an f32 tensor of shape [16, 2], got 'tensor<16x8xf32>'}}
  bonsai.galore_adamw_update %r, %s, %lr, %n, %p, %w, %m, %m {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64, scale = 0.25 : f64, left = false} : tensor<16x2xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8x2xf32>, tensor<16x8xf32>, tensor<16x8xf32>, tensor<16x8xf32>
  return
}

// -----

func.func @update_scale(%r: tensor<16x2xf32>, %s: tensor<i64>, %lr: tensor<f32>, %n: tensor<f32>, %p: tensor<8x2xf32>, %w: tensor<16x8xf32>, %m: tensor<16x2xf32>) {
  // expected-error @+1 {{scale must be positive, got 0.000000e+00}}
  bonsai.galore_adamw_update %r, %s, %lr, %n, %p, %w, %m, %m {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64, scale = 0.0 : f64, left = false} : tensor<16x2xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8x2xf32>, tensor<16x8xf32>, tensor<16x2xf32>, tensor<16x2xf32>
  return
}

// -----

func.func @update_master(%r: tensor<16x2xf32>, %s: tensor<i64>, %lr: tensor<f32>, %n: tensor<f32>, %p: tensor<8x2xf32>, %w: tensor<16x8xbf16>, %m: tensor<16x2xf32>, %master: tensor<16x8xbf16>) {
  // expected-error @+1 {{master must be an f32 tensor of shape [16, 8], got 'tensor<16x8xbf16>'}}
  bonsai.galore_adamw_update %r, %s, %lr, %n, %p, %w, %m, %m, %master {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64, scale = 0.25 : f64, left = false} : tensor<16x2xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8x2xf32>, tensor<16x8xbf16>, tensor<16x2xf32>, tensor<16x2xf32>, tensor<16x8xbf16>
  return
}
