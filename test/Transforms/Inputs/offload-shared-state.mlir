// Input of offload-invalid.mlir: a moment that another op reads besides its update. Its
// device copy would be the only part of it on the device, so it cannot move to the host.
func.func @shared(%g: tensor<8xf32>, %step: tensor<i64>, %lr: tensor<f32>,
                  %norm: tensor<f32>) -> tensor<f32> {
  %w = bonsai.param "w" trainable : tensor<8xf32>
  // expected-error @+1 {{cannot offload 'w.exp_avg': 'bonsai.grad_norm' reads it besides its optimizer update}}
  %m = bonsai.state optimizer "w.exp_avg" : tensor<8xf32>
  %v = bonsai.state optimizer "w.exp_avg_sq" : tensor<8xf32>
  // expected-note @+1 {{the update}}
  bonsai.adamw_update %g, %step, %lr, %norm, %w, %m, %v {beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  %n = bonsai.grad_norm %m : (tensor<8xf32>) -> tensor<f32>
  return %n : tensor<f32>
}
bonsai.recipe @r {
  bonsai.offload ["optimizer_state"]
}
