// The generated PTX is valid PTX for the architectures it names: CUDA's assembler (the same
// compiler the driver's JIT runs) accepts the test kernel's PTX for sm_80 and sm_90, with no
// symbol left unresolved.
// REQUIRES: ptxas
// RUN: bonsai-opt %bonsai_src/test/runtime/Inputs/fused_elementwise.mlir --bonsai-generate-elementwise-kernels="target=sm_90 print-ptx" -o /dev/null > %t.sm90.ptx
// RUN: %ptxas -arch=sm_90 %t.sm90.ptx -o %t.sm90.cubin
// RUN: bonsai-opt %bonsai_src/test/runtime/Inputs/fused_elementwise.mlir --bonsai-generate-elementwise-kernels="target=sm_80 print-ptx" -o /dev/null > %t.sm80.ptx
// RUN: %ptxas -arch=sm_80 %t.sm80.ptx -o %t.sm80.cubin
// RUN: FileCheck %s < %t.sm80.ptx

// CHECK: .target sm_80
// CHECK: .visible .entry fused_elementwise_0(
