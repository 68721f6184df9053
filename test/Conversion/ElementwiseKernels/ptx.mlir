// RUN: bonsai-opt %s --bonsai-generate-elementwise-kernels="target=sm_90 print-ptx" -o /dev/null | FileCheck %s --check-prefix=PTX
// RUN: bonsai-opt %s --bonsai-generate-elementwise-kernels="target=sm_80 print-ptx" -o /dev/null | FileCheck %s --check-prefix=SM80
// RUN: bonsai-opt %s --bonsai-generate-elementwise-kernels="target=sm_90" | FileCheck %s

// One kernel for both ops (same program, same shapes): LLVM's NVPTX backend, PTX for the
// recipe's target; one pointer per buffer and the element count; the math functions are
// polynomials, not libdevice calls.
// PTX: // PTX of fused_elementwise_0
// PTX: .version
// PTX-NEXT: .target sm_90
// PTX: .visible .entry fused_elementwise_0(
// PTX-NEXT: .param .u64 .ptr .align 1 fused_elementwise_0_param_0,
// PTX-NEXT: .param .u64 .ptr .align 1 fused_elementwise_0_param_1,
// PTX-NEXT: .param .u64 .ptr .align 1 fused_elementwise_0_param_2,
// PTX-NEXT: .param .u64 fused_elementwise_0_param_3
// PTX: mov.u32 {{.*}}%ctaid.x
// PTX: ld.global.b16
// PTX: cvt.f32.bf16
// PTX: fma.rn.f32
// PTX: cvt.rn.bf16.f32
// PTX: st.global.b16
// The vector loop (aligned buffers): 8 bf16 per load and per store.
// PTX: ld.global.v4.b32
// PTX: st.global.v4.b32
// PTX-NOT: call
// PTX-NOT: __nv_
// PTX-NOT: // PTX of fused_elementwise_1

// SM80: .target sm_80

// CHECK-LABEL: func.func @two
// CHECK: bonsai.fused_elementwise {{.*}}arch = "sm_90", generated_kernel = "fused_elementwise_0", program = array<i32: 2, 2, 2,
// CHECK-SAME: ptx = "//
// CHECK: bonsai.fused_elementwise {{.*}}generated_kernel = "fused_elementwise_0"
func.func @two(%x: tensor<8x64xbf16>, %b: tensor<64xbf16>) -> tensor<8x64xbf16> {
  %0 = bonsai.fused_elementwise ins(%x, %b : tensor<8x64xbf16>, tensor<64xbf16>) {
  ^bb0(%a: bf16, %c: bf16):
    %e = arith.extf %a : bf16 to f32
    %f = arith.extf %c : bf16 to f32
    %s = math.exp %e : f32
    %t = arith.addf %s, %f : f32
    %r = arith.truncf %t : f32 to bf16
    bonsai.yield %r : bf16
  } -> tensor<8x64xbf16>
  %1 = bonsai.fused_elementwise ins(%0, %b : tensor<8x64xbf16>, tensor<64xbf16>) {
  ^bb0(%a: bf16, %c: bf16):
    %e = arith.extf %a : bf16 to f32
    %f = arith.extf %c : bf16 to f32
    %s = math.exp %e : f32
    %t = arith.addf %s, %f : f32
    %r = arith.truncf %t : f32 to bf16
    bonsai.yield %r : bf16
  } -> tensor<8x64xbf16>
  return %1 : tensor<8x64xbf16>
}
