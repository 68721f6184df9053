// RUN: bonsai-opt %s --bonsai-generate-elementwise-kernels --verify-diagnostics

// A body op the program has no instruction for is an error of code generation, not of the
// op (the region may hold any scalar arith or math op).
func.func @no_instruction(%x: tensor<64xf32>) -> tensor<64xf32> {
  %0 = bonsai.fused_elementwise ins(%x : tensor<64xf32>) {
  ^bb0(%a: f32):
    // expected-error @+1 {{has no instruction in elementwise programs}}
    %s = math.sqrt %a : f32
    bonsai.yield %s : f32
  } -> tensor<64xf32>
  return %0 : tensor<64xf32>
}
