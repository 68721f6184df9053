// RUN: bonsai-opt --bonsai-schedule=target=h200 %s -split-input-file 2>&1 | FileCheck %s
// RUN: bonsai-opt --bonsai-schedule=prefetch-distance=2 %s -split-input-file 2>&1 | FileCheck %s --check-prefix=ASKED
// RUN: bonsai-opt --bonsai-schedule %s -split-input-file 2>&1 | FileCheck %s --check-prefix=UNTIMED

// The prefetch distance of the all-gathers, weighed on the step time (docs/sharding.md,
// "Overlap"). Four layers, each gather (1 ms on the link) twice as long as the layer that reads
// it (0.5 ms): one gather ahead, each gather waits for the layer before it to free the
// bytes the planner gives it (6 ms); two ahead hides half of each gather behind the layer
// before (5 ms) for one more gathered weight live (2 MiB instead of 1.5). Three ahead is
// slower than two here: the planner's reuse of the first weight's bytes makes the fourth
// gather wait for the first layer. The copy of the step under each distance is planned and
// simulated, and the shallowest within 0.5% of the fastest is taken.

// CHECK: remark: schedule: 4 collectives on the collectives stream; all-gathers issued 2 ahead, 2 of them moved (predicted step 1 ahead 6.00 ms at a 1.50 MiB peak, 2 ahead 5.00 ms at 2.00 MiB, 3 ahead 5.50 ms at 2.00 MiB: the shallowest within 0.5% of the fastest); 0 reduce-scatters read one reduce-scatter later
// CHECK-LABEL: bonsai_plan.step @prefetch
// CHECK: bonsai_plan.launch "all_gather" ins(%[[S0:.*]] : memref<65536xf32>) outs(%[[W0:[0-9]+]]
// CHECK-NEXT: bonsai_plan.launch "layer" ins(%[[W0]] : memref<131072xf32>)
// CHECK-NEXT: bonsai_plan.launch "all_gather" {{.*}} outs(%[[W1:[0-9]+]]
// CHECK-NEXT: bonsai_plan.launch "all_gather" {{.*}} outs(%[[W2:[0-9]+]]
// CHECK-NEXT: bonsai_plan.launch "layer" ins(%[[W1]],
// CHECK-NEXT: bonsai_plan.launch "all_gather" {{.*}} outs(%[[W3:[0-9]+]]
// CHECK-NEXT: bonsai_plan.launch "layer" ins(%[[W2]],
// CHECK-NEXT: bonsai_plan.launch "layer" ins(%[[W3]],

// Asked for, the distance is not weighed: the same order.
// ASKED: remark: schedule: 4 collectives on the collectives stream; all-gathers issued 2 ahead, 2 of them moved (asked for); 0 reduce-scatters read one reduce-scatter later
// ASKED: bonsai_plan.launch "all_gather"
// ASKED-NEXT: bonsai_plan.launch "layer"
// ASKED-NEXT: bonsai_plan.launch "all_gather"
// ASKED-NEXT: bonsai_plan.launch "all_gather"
// ASKED-NEXT: bonsai_plan.launch "layer"
// ASKED-NEXT: bonsai_plan.launch "all_gather"
// ASKED-NEXT: bonsai_plan.launch "layer"
// ASKED-NEXT: bonsai_plan.launch "layer"

// Without a target profile there is no step time: one gather ahead (here, where the gathers
// already follow the reader before them, nothing moves).
// UNTIMED: remark: schedule: 4 collectives on the collectives stream; all-gathers issued 1 ahead, 0 of them moved (no step time to weigh a deeper prefetch on); 0 reduce-scatters read one reduce-scatter later
bonsai_plan.step @prefetch attributes {target = "sm_90"} {
  bonsai_plan.arena @w persistent device size 0
  bonsai_plan.arena @a step device size 0
  %s0 = bonsai_plan.buffer @w parameter "w0" : memref<65536xf32>
  %s1 = bonsai_plan.buffer @w parameter "w1" : memref<65536xf32>
  %s2 = bonsai_plan.buffer @w parameter "w2" : memref<65536xf32>
  %s3 = bonsai_plan.buffer @w parameter "w3" : memref<65536xf32>
  %w0 = bonsai_plan.buffer @a activation "w0.full" : memref<131072xf32>
  %w1 = bonsai_plan.buffer @a activation "w1.full" : memref<131072xf32>
  %w2 = bonsai_plan.buffer @a activation "w2.full" : memref<131072xf32>
  %w3 = bonsai_plan.buffer @a activation "w3.full" : memref<131072xf32>
  %x0 = bonsai_plan.buffer @a activation "x0" : memref<8xf32>
  %x1 = bonsai_plan.buffer @a activation "x1" : memref<8xf32>
  %x2 = bonsai_plan.buffer @a activation "x2" : memref<8xf32>
  %x3 = bonsai_plan.buffer @a activation "x3" : memref<8xf32>
  bonsai_plan.launch "all_gather" ins(%s0 : memref<65536xf32>) outs(%w0 : memref<131072xf32>) {bonsai.seconds = 1.0e-3 : f64}
  bonsai_plan.launch "layer" ins(%w0 : memref<131072xf32>) outs(%x0 : memref<8xf32>) {bonsai.seconds = 0.5e-3 : f64}
  bonsai_plan.launch "all_gather" ins(%s1 : memref<65536xf32>) outs(%w1 : memref<131072xf32>) {bonsai.seconds = 1.0e-3 : f64}
  bonsai_plan.launch "layer" ins(%w1, %x0 : memref<131072xf32>, memref<8xf32>) outs(%x1 : memref<8xf32>) {bonsai.seconds = 0.5e-3 : f64}
  bonsai_plan.launch "all_gather" ins(%s2 : memref<65536xf32>) outs(%w2 : memref<131072xf32>) {bonsai.seconds = 1.0e-3 : f64}
  bonsai_plan.launch "layer" ins(%w2, %x1 : memref<131072xf32>, memref<8xf32>) outs(%x2 : memref<8xf32>) {bonsai.seconds = 0.5e-3 : f64}
  bonsai_plan.launch "all_gather" ins(%s3 : memref<65536xf32>) outs(%w3 : memref<131072xf32>) {bonsai.seconds = 1.0e-3 : f64}
  bonsai_plan.launch "layer" ins(%w3, %x2 : memref<131072xf32>, memref<8xf32>) outs(%x3 : memref<8xf32>) {bonsai.seconds = 0.5e-3 : f64}
}

// -----

// Within a device budget of 1.75 MiB only one gather ahead fits: the faster distances are
// listed as over the budget, and the shallow one is kept.

// CHECK: remark: schedule: 4 collectives on the collectives stream; all-gathers issued 1 ahead, 0 of them moved (predicted step 1 ahead 6.00 ms at a 1.50 MiB peak, 2 ahead 5.00 ms at 2.00 MiB over the 1.75 MiB budget, 3 ahead 5.50 ms at 2.00 MiB over the 1.75 MiB budget: the shallowest within 0.5% of the fastest); 0 reduce-scatters read one reduce-scatter later
// CHECK-LABEL: bonsai_plan.step @budget
// CHECK: bonsai_plan.launch "all_gather"
// CHECK-NEXT: bonsai_plan.launch "layer"
// CHECK-NEXT: bonsai_plan.launch "all_gather"
// CHECK-NEXT: bonsai_plan.launch "layer"
bonsai_plan.step @budget attributes {target = "sm_90", device_memory = 1835008 : i64} {
  bonsai_plan.arena @w persistent device size 0
  bonsai_plan.arena @a step device size 0
  %s0 = bonsai_plan.buffer @w parameter "w0" : memref<65536xf32>
  %s1 = bonsai_plan.buffer @w parameter "w1" : memref<65536xf32>
  %s2 = bonsai_plan.buffer @w parameter "w2" : memref<65536xf32>
  %s3 = bonsai_plan.buffer @w parameter "w3" : memref<65536xf32>
  %w0 = bonsai_plan.buffer @a activation "w0.full" : memref<131072xf32>
  %w1 = bonsai_plan.buffer @a activation "w1.full" : memref<131072xf32>
  %w2 = bonsai_plan.buffer @a activation "w2.full" : memref<131072xf32>
  %w3 = bonsai_plan.buffer @a activation "w3.full" : memref<131072xf32>
  %x0 = bonsai_plan.buffer @a activation "x0" : memref<8xf32>
  %x1 = bonsai_plan.buffer @a activation "x1" : memref<8xf32>
  %x2 = bonsai_plan.buffer @a activation "x2" : memref<8xf32>
  %x3 = bonsai_plan.buffer @a activation "x3" : memref<8xf32>
  bonsai_plan.launch "all_gather" ins(%s0 : memref<65536xf32>) outs(%w0 : memref<131072xf32>) {bonsai.seconds = 1.0e-3 : f64}
  bonsai_plan.launch "layer" ins(%w0 : memref<131072xf32>) outs(%x0 : memref<8xf32>) {bonsai.seconds = 0.5e-3 : f64}
  bonsai_plan.launch "all_gather" ins(%s1 : memref<65536xf32>) outs(%w1 : memref<131072xf32>) {bonsai.seconds = 1.0e-3 : f64}
  bonsai_plan.launch "layer" ins(%w1, %x0 : memref<131072xf32>, memref<8xf32>) outs(%x1 : memref<8xf32>) {bonsai.seconds = 0.5e-3 : f64}
  bonsai_plan.launch "all_gather" ins(%s2 : memref<65536xf32>) outs(%w2 : memref<131072xf32>) {bonsai.seconds = 1.0e-3 : f64}
  bonsai_plan.launch "layer" ins(%w2, %x1 : memref<131072xf32>, memref<8xf32>) outs(%x2 : memref<8xf32>) {bonsai.seconds = 0.5e-3 : f64}
  bonsai_plan.launch "all_gather" ins(%s3 : memref<65536xf32>) outs(%w3 : memref<131072xf32>) {bonsai.seconds = 1.0e-3 : f64}
  bonsai_plan.launch "layer" ins(%w3, %x2 : memref<131072xf32>, memref<8xf32>) outs(%x3 : memref<8xf32>) {bonsai.seconds = 0.5e-3 : f64}
}
