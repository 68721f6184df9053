// RUN: bonsai-opt %s --bonsai-generate-elementwise-kernels="target=sm_90 print-ptx" -o /dev/null | FileCheck %s

// A broadcast input of 100 elements: eight consecutive elements of the iteration space do not
// read eight consecutive elements of it, so the kernel has the scalar loop only (no alignment
// test, no vector loads or stores).
// CHECK: .visible .entry fused_elementwise_0(
// CHECK: ld.global.b16
// CHECK: st.global.b16
// CHECK-NOT: ld.global.v
// CHECK-NOT: st.global.v
func.func @odd_broadcast(%x: tensor<8x100xbf16>, %b: tensor<100xbf16>) -> tensor<8x100xbf16> {
  %0 = bonsai.fused_elementwise ins(%x, %b : tensor<8x100xbf16>, tensor<100xbf16>) {
  ^bb0(%a: bf16, %c: bf16):
    %e = arith.extf %a : bf16 to f32
    %f = arith.extf %c : bf16 to f32
    %t = arith.addf %e, %f : f32
    %r = arith.truncf %t : f32 to bf16
    bonsai.yield %r : bf16
  } -> tensor<8x100xbf16>
  return %0 : tensor<8x100xbf16>
}
