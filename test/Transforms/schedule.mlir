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

// -----

// The exchanges with other ranks (the kernel kinds with the kCollective trait) go on the
// collectives stream (5). An all-gather of the forward or backward pass moves up to just after
// the first reader of the all-gather before it, within its phase (one gather ahead, without a
// target to weigh a deeper prefetch on: schedule-prefetch.mlir); the reader
// of a reduce-scatter's share moves down to just before the next reduce-scatter of its phase.
// Without overlap, nothing moves and every launch stays on the compute stream.

// CHECK-LABEL: bonsai_plan.step @collectives
// CHECK: bonsai_plan.launch "all_gather" ins(%[[S0:.*]] : memref<4xf32>) outs(%[[W0:.*]] : memref<8xf32>) {stream = 5 : i64}
// CHECK-NEXT: bonsai_plan.launch "layer" ins(%[[W0]] : memref<8xf32>)
// CHECK-NEXT: bonsai_plan.launch "all_gather" ins(%[[S1:.*]] : memref<4xf32>) outs(%[[W1:.*]] : memref<8xf32>) {stream = 5 : i64}
// CHECK-NEXT: bonsai_plan.launch "work"
// CHECK-NEXT: bonsai_plan.launch "layer" ins(%[[W1]], %{{.*}} : memref<8xf32>, memref<8xf32>)
// CHECK-NEXT: bonsai_plan.launch "reduce_scatter" ins(%{{.*}} : memref<8xf32>) outs(%[[R0:.*]] : memref<4xf32>) {phase = 1 : i32, stream = 5 : i64}
// CHECK-NEXT: bonsai_plan.launch "grad"
// CHECK-NEXT: bonsai_plan.launch "accumulate" ins(%[[R0]] : memref<4xf32>)
// CHECK-NEXT: bonsai_plan.launch "reduce_scatter" {{.*}} {phase = 1 : i32, stream = 5 : i64}
// CHECK-NEXT: bonsai_plan.launch "accumulate"
// CHECK-NEXT: bonsai_plan.launch "all_reduce" {{.*}} {phase = 2 : i32, stream = 5 : i64}

// INORDER-LABEL: bonsai_plan.step @collectives
// INORDER-NOT: stream
// INORDER: bonsai_plan.launch "work"
// INORDER-NEXT: bonsai_plan.launch "all_gather"
// INORDER: bonsai_plan.launch "reduce_scatter"
// INORDER-NEXT: bonsai_plan.launch "accumulate"
// expected-remark @+1 {{schedule: 5 collectives on the collectives stream; all-gathers issued 1 ahead, 1 of them moved (no step time to weigh a deeper prefetch on); 1 reduce-scatters read one reduce-scatter later}}
bonsai_plan.step @collectives attributes {target = "sm_90"} {
  bonsai_plan.arena @w persistent device size 0
  bonsai_plan.arena @a step device size 0
  %s0 = bonsai_plan.buffer @w parameter "w0" : memref<4xf32>
  %s1 = bonsai_plan.buffer @w parameter "w1" : memref<4xf32>
  %acc0 = bonsai_plan.buffer @w gradient "w0" : memref<4xf32>
  %acc1 = bonsai_plan.buffer @w gradient "w1" : memref<4xf32>
  %w0 = bonsai_plan.buffer @a activation "w0.full" : memref<8xf32>
  %w1 = bonsai_plan.buffer @a activation "w1.full" : memref<8xf32>
  %x = bonsai_plan.buffer @a activation "x" : memref<8xf32>
  %y = bonsai_plan.buffer @a activation "y" : memref<8xf32>
  %z = bonsai_plan.buffer @a activation "z" : memref<8xf32>
  %g0 = bonsai_plan.buffer @a activation "g0" : memref<8xf32>
  %g1 = bonsai_plan.buffer @a activation "g1" : memref<8xf32>
  %r0 = bonsai_plan.buffer @a activation "r0" : memref<4xf32>
  %r1 = bonsai_plan.buffer @a activation "r1" : memref<4xf32>
  %n = bonsai_plan.buffer @a activation "norm" : memref<f32>
  bonsai_plan.launch "all_gather" ins(%s0 : memref<4xf32>) outs(%w0 : memref<8xf32>)
  bonsai_plan.launch "layer" ins(%w0 : memref<8xf32>) outs(%x : memref<8xf32>)
  bonsai_plan.launch "work" ins(%x : memref<8xf32>) outs(%y : memref<8xf32>)
  bonsai_plan.launch "all_gather" ins(%s1 : memref<4xf32>) outs(%w1 : memref<8xf32>)
  bonsai_plan.launch "layer" ins(%w1, %y : memref<8xf32>, memref<8xf32>) outs(%z : memref<8xf32>)
  bonsai_plan.launch "reduce_scatter" ins(%g0 : memref<8xf32>) outs(%r0 : memref<4xf32>) {phase = 1 : i32}
  bonsai_plan.launch "accumulate" ins(%r0 : memref<4xf32>) outs(%acc0 : memref<4xf32>) {phase = 1 : i32}
  bonsai_plan.launch "grad" ins(%z : memref<8xf32>) outs(%g1 : memref<8xf32>) {phase = 1 : i32}
  bonsai_plan.launch "reduce_scatter" ins(%g1 : memref<8xf32>) outs(%r1 : memref<4xf32>) {phase = 1 : i32}
  bonsai_plan.launch "accumulate" ins(%r1 : memref<4xf32>) outs(%acc1 : memref<4xf32>) {phase = 1 : i32}
  bonsai_plan.launch "all_reduce" ins(%n : memref<f32>) outs(%n : memref<f32>) {phase = 2 : i32}
}
