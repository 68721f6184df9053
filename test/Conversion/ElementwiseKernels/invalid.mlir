// RUN: bonsai-opt %s --split-input-file --verify-diagnostics

func.func @arg_type(%x: tensor<64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{body argument 0 type: expected 'f32' (the element type of input 0), got 'bf16'}}
  %0 = bonsai.fused_elementwise ins(%x : tensor<64xf32>) {
  ^bb0(%a: bf16):
    %e = arith.extf %a : bf16 to f32
    bonsai.yield %e : f32
  } -> tensor<64xf32>
  return %0 : tensor<64xf32>
}

// -----

func.func @shape(%x: tensor<64xf32>, %y: tensor<4x8xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{input 1 shape [4, 8] is neither the iteration shape [64] nor a trailing part of it}}
  %0 = bonsai.fused_elementwise ins(%x, %y : tensor<64xf32>, tensor<4x8xf32>) {
  ^bb0(%a: f32, %b: f32):
    %s = arith.addf %a, %b : f32
    bonsai.yield %s : f32
  } -> tensor<64xf32>
  return %0 : tensor<64xf32>
}

// -----

func.func @yield_type(%x: tensor<64xf32>) -> tensor<64xbf16> {
  %0 = bonsai.fused_elementwise ins(%x : tensor<64xf32>) {
  ^bb0(%a: f32):
    // expected-error @+1 {{value 0 type: expected 'bf16' (the element type of result 0), got 'f32'}}
    bonsai.yield %a : f32
  } -> tensor<64xbf16>
  return %0 : tensor<64xbf16>
}

// -----

func.func @not_scalar(%x: tensor<64xf32>) -> tensor<64xf32> {
  %0 = bonsai.fused_elementwise ins(%x : tensor<64xf32>) {
  ^bb0(%a: f32):
    // expected-error @+1 {{is not a scalar arith or math op}}
    %s = func.call @f(%a) : (f32) -> f32
    bonsai.yield %s : f32
  } -> tensor<64xf32>
  return %0 : tensor<64xf32>
}
func.func private @f(f32) -> f32
