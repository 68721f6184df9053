// The generated kernel the CUDA test runs (test/runtime/GeneratedKernelsTest.cpp): every
// opcode, bf16/f16/f32 values and a broadcast input. fused_elementwise_sm90.ptx beside it is
// this file's PTX; test/Conversion/ElementwiseKernels/fixture.mlir regenerates and compares
// it, and checks the program the test writes by hand.
func.func @kernel(%x: tensor<64x1000xbf16>, %b: tensor<1000xbf16>, %g: tensor<64x1000xf32>) -> (tensor<64x1000xbf16>, tensor<64x1000xf16>) {
  %r:2 = bonsai.fused_elementwise ins(%x, %b, %g : tensor<64x1000xbf16>, tensor<1000xbf16>, tensor<64x1000xf32>) {
  ^bb0(%a: bf16, %c: bf16, %d: f32):
    %0 = arith.extf %a : bf16 to f32
    %1 = arith.extf %c : bf16 to f32
    %2 = arith.addf %0, %1 : f32
    %3 = math.tanh %2 : f32
    %4 = arith.constant 5.000000e-01 : f32
    %5 = arith.mulf %3, %4 : f32
    %6 = arith.truncf %5 : f32 to bf16
    %7 = arith.negf %d : f32
    %8 = math.exp %7 : f32
    %9 = arith.constant 1.000000e+00 : f32
    %10 = arith.addf %9, %8 : f32
    %11 = arith.divf %d, %10 : f32
    %12 = math.erf %d : f32
    %13 = arith.subf %11, %12 : f32
    %14 = arith.truncf %13 : f32 to f16
    bonsai.yield %6, %14 : bf16, f16
  } -> tensor<64x1000xbf16>, tensor<64x1000xf16>
  return %r#0, %r#1 : tensor<64x1000xbf16>, tensor<64x1000xf16>
}
