// RUN: bonsai-opt --bonsai-schedule %s -split-input-file -verify-diagnostics | FileCheck %s

// Declarations are hoisted above the first launch in their order (views after their
// sources); launches keep their order, which is the step's meaning.

// CHECK-LABEL: bonsai_plan.step @hoist
// CHECK-NEXT: bonsai_plan.arena @a
// CHECK-NEXT: bonsai_plan.buffer @a activation "x"
// CHECK-NEXT: bonsai_plan.buffer @a activation "y"
// CHECK-NEXT: bonsai_plan.buffer @a activation "z"
// CHECK-NEXT: bonsai_plan.view
// CHECK-NEXT: bonsai_plan.launch "produce_x"
// CHECK-NEXT: bonsai_plan.launch "x_to_y"
// CHECK-NEXT: bonsai_plan.launch "y_to_z"
// CHECK-NEXT: bonsai_plan.launch "independent" ins(%{{.*}} : memref<2x2xf32>) outs(%{{.*}} : memref<2x2xf32>){{$}}
bonsai_plan.step @hoist attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 0
  %x = bonsai_plan.buffer @a activation "x" : memref<4xf32>
  bonsai_plan.launch "produce_x" ins() outs(%x : memref<4xf32>)
  %y = bonsai_plan.buffer @a activation "y" : memref<4xf32>
  bonsai_plan.launch "x_to_y" ins(%x : memref<4xf32>) outs(%y : memref<4xf32>)
  %z = bonsai_plan.buffer @a activation "z" : memref<4xf32>
  bonsai_plan.launch "y_to_z" ins(%y : memref<4xf32>) outs(%z : memref<4xf32>)
  %zv = bonsai_plan.view %z : memref<4xf32> to memref<2x2xf32>
  bonsai_plan.launch "independent" ins(%zv : memref<2x2xf32>) outs(%zv : memref<2x2xf32>) {stream = 3 : i64}
}

// -----

// Every launch goes on the compute stream; a write after a read stays after it.
// CHECK-LABEL: bonsai_plan.step @war
// CHECK: bonsai_plan.launch "read_x" ins(%{{.*}} : memref<4xf32>) outs(%{{.*}} : memref<4xf32>){{$}}
// CHECK-NEXT: bonsai_plan.launch "overwrite_x"
bonsai_plan.step @war attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 0
  %x = bonsai_plan.buffer @a input "x" {input_index = 0 : i64} : memref<4xf32>
  %y = bonsai_plan.buffer @a activation "y" : memref<4xf32>
  bonsai_plan.launch "read_x" ins(%x : memref<4xf32>) outs(%y : memref<4xf32>) {stream = 5 : i64}
  bonsai_plan.launch "overwrite_x" ins(%y : memref<4xf32>) outs(%x : memref<4xf32>)
}
