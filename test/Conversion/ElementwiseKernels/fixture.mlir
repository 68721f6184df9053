// The PTX fixture of the CUDA test is what the compiler generates today, and the program the
// test writes by hand is this kernel's.
// RUN: bonsai-opt %bonsai_src/test/runtime/Inputs/fused_elementwise.mlir --bonsai-generate-elementwise-kernels="target=sm_90 print-ptx" -o /dev/null > %t.ptx
// RUN: diff %bonsai_src/test/runtime/Inputs/fused_elementwise_sm90.ptx %t.ptx
// RUN: bonsai-opt %bonsai_src/test/runtime/Inputs/fused_elementwise.mlir --bonsai-generate-elementwise-kernels | FileCheck %s

// CHECK: generated_kernel = "fused_elementwise_0"
// CHECK-SAME: program = array<i32: 3, 2, 2, 0, 15, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 3, 0, 3, 4, 0, 9, 0, 5, 0, 0, 0, 0, 0, 0, 1056964608, 5, 0, 6, 7, 0, 2, 2, 8, 0, 0, 7, 0, 2, 0, 0, 8, 0, 10, 0, 0, 0, 0, 0, 0, 1065353216, 3, 0, 12, 11, 0, 6, 0, 2, 13, 0, 10, 0, 2, 0, 0, 4, 0, 14, 15, 0, 2, 1, 16, 0, 0, 2, 9, 17>
// CHECK-NOT: ptx =
