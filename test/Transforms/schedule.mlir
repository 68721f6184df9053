// RUN: bonsai-opt --bonsai-schedule %s -split-input-file -verify-diagnostics | FileCheck %s
// RUN: bonsai-opt --bonsai-schedule=overlap=false %s -split-input-file | FileCheck %s --check-prefix=INORDER

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

// -----

// Host-offload copies: a launch from a pinned host arena into a device arena goes on stream 1,
// the reverse on stream 2. The copies an update reads (its group) move up to just after the
// previous group's reader, across the work and the copies back between them, but not out of
// their phase; a copy back keeps its place, and its source is retained until the next group's
// reader, or to the end of the phase after the last one. Without overlap, nothing moves.

// CHECK-LABEL: bonsai_plan.step @overlap
// CHECK: bonsai_plan.launch "backward"
// CHECK-NEXT: bonsai_plan.launch "copy_h2d" ins(%[[H0:.*]] : memref<4xf32>) outs(%[[D0:.*]] : memref<4xf32>) {phase = 2 : i32, stream = 1 : i64}
// CHECK-NEXT: bonsai_plan.launch "copy_h2d" ins(%[[H0B:.*]] : memref<4xf32>) outs(%[[D0B:.*]] : memref<4xf32>) {phase = 2 : i32, stream = 1 : i64}
// CHECK-NEXT: bonsai_plan.launch "update" ins() outs(%[[D0]], %[[D0B]] : memref<4xf32>, memref<4xf32>) {phase = 2 : i32}
// CHECK-NEXT: bonsai_plan.launch "copy_h2d" ins(%[[H1:.*]] : memref<4xf32>) outs(%[[D1:.*]] : memref<4xf32>) {phase = 2 : i32, stream = 1 : i64}
// CHECK-NEXT: bonsai_plan.launch "copy_d2h" ins(%[[D0]] : memref<4xf32>) outs(%[[H0]] : memref<4xf32>) {phase = 2 : i32, stream = 2 : i64}
// CHECK-NEXT: bonsai_plan.launch "copy_d2h" ins(%[[D0B]] : memref<4xf32>) outs(%[[H0B]] : memref<4xf32>) {phase = 2 : i32, stream = 2 : i64}
// CHECK-NEXT: bonsai_plan.launch "work"
// CHECK-NEXT: bonsai_plan.retain %[[D0]], %[[D0B]] : memref<4xf32>, memref<4xf32>
// CHECK-NEXT: bonsai_plan.launch "update" ins(%{{.*}} : memref<4xf32>) outs(%[[D1]] : memref<4xf32>) {phase = 2 : i32}
// CHECK-NEXT: bonsai_plan.launch "copy_d2h" ins(%[[D1]] : memref<4xf32>) outs(%[[H1]] : memref<4xf32>) {phase = 2 : i32, stream = 2 : i64}
// CHECK-NEXT: bonsai_plan.launch "tail"
// CHECK-NEXT: bonsai_plan.retain %[[D1]] : memref<4xf32>
// CHECK-NEXT: }

// INORDER-LABEL: bonsai_plan.step @overlap
// INORDER-NOT: stream
// INORDER-NOT: retain
// INORDER: bonsai_plan.launch "work"
// INORDER-NEXT: bonsai_plan.launch "copy_h2d"
// INORDER-NEXT: bonsai_plan.launch "update"
// expected-remark @+1 {{schedule: 6 host-offload copies on the copy streams; the copies into 1 updates issued one update ahead; 3 sources of copies back kept from reuse until the next update}}
bonsai_plan.step @overlap attributes {target = "sm_90"} {
  bonsai_plan.arena @dev step device size 0
  bonsai_plan.arena @host persistent pinned_host size 0
  %h0 = bonsai_plan.buffer @host optimizer_state "p0.exp_avg" : memref<4xf32>
  %h0b = bonsai_plan.buffer @host optimizer_state "p0.exp_avg_sq" : memref<4xf32>
  %h1 = bonsai_plan.buffer @host optimizer_state "p1.exp_avg" : memref<4xf32>
  %d0 = bonsai_plan.buffer @dev activation "copy.0" : memref<4xf32>
  %d0b = bonsai_plan.buffer @dev activation "copy.1" : memref<4xf32>
  %d1 = bonsai_plan.buffer @dev activation "copy.2" : memref<4xf32>
  %x = bonsai_plan.buffer @dev activation "x" : memref<4xf32>
  bonsai_plan.launch "backward" ins() outs(%x : memref<4xf32>) {phase = 1 : i32}
  bonsai_plan.launch "copy_h2d" ins(%h0 : memref<4xf32>) outs(%d0 : memref<4xf32>) {phase = 2 : i32}
  bonsai_plan.launch "copy_h2d" ins(%h0b : memref<4xf32>) outs(%d0b : memref<4xf32>) {phase = 2 : i32}
  bonsai_plan.launch "update" ins() outs(%d0, %d0b : memref<4xf32>, memref<4xf32>) {phase = 2 : i32}
  bonsai_plan.launch "copy_d2h" ins(%d0 : memref<4xf32>) outs(%h0 : memref<4xf32>) {phase = 2 : i32}
  bonsai_plan.launch "copy_d2h" ins(%d0b : memref<4xf32>) outs(%h0b : memref<4xf32>) {phase = 2 : i32}
  bonsai_plan.launch "work" ins() outs(%x : memref<4xf32>) {phase = 2 : i32}
  bonsai_plan.launch "copy_h2d" ins(%h1 : memref<4xf32>) outs(%d1 : memref<4xf32>) {phase = 2 : i32}
  bonsai_plan.launch "update" ins(%x : memref<4xf32>) outs(%d1 : memref<4xf32>) {phase = 2 : i32}
  bonsai_plan.launch "copy_d2h" ins(%d1 : memref<4xf32>) outs(%h1 : memref<4xf32>) {phase = 2 : i32}
  bonsai_plan.launch "tail" ins() outs(%x : memref<4xf32>) {phase = 2 : i32}
}
