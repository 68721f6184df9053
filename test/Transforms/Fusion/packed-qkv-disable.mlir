// RUN: bonsai-opt --bonsai-autodiff --bonsai-fuse="disable=packed-qkv" %S/Inputs/qkv.mlir \
// RUN:   | FileCheck %s

// disable=packed-qkv leaves GPT-2's q, k and v slices of the projection (Inputs/qkv.mlir) to
// the flash attention pair, and the concat of their gradients (slice-gradients') as it is.

// CHECK-LABEL: func.func @qkv
// CHECK-COUNT-3: bonsai.slice %{{.*}} {axis = 2 : i64
// CHECK: bonsai.flash_attention %
// CHECK: bonsai.flash_attention_grad
// CHECK: bonsai.concat %{{.*}}, %{{.*}}, %{{.*}} {axis = 2 : i64, bonsai.phase = "backward"}
// CHECK-NOT: flash_attention_qkv
