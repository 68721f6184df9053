// RUN: bonsai-opt %s | bonsai-opt | FileCheck %s
// RUN: bonsai-opt %s --mlir-print-op-generic | bonsai-opt | FileCheck %s

// Every bonsai_plan op survives print, parse, print.

// CHECK-LABEL: bonsai_plan.step @forward attributes {device_memory = 1048576 : i64, target = "sm_90", tokens_per_step = 4 : i64} {
bonsai_plan.step @forward attributes {target = "sm_90", device_memory = 1048576 : i64, tokens_per_step = 4 : i64} {
  // CHECK: bonsai_plan.arena @weights persistent device size 1024
  bonsai_plan.arena @weights persistent device size 1024
  // CHECK: bonsai_plan.arena @acts step device size 2048 {alignment = 64 : i64}
  bonsai_plan.arena @acts step device size 2048 {alignment = 64 : i64}
  // CHECK: bonsai_plan.arena @host persistent pinned_host size 4096
  bonsai_plan.arena @host persistent pinned_host size 4096
  // CHECK: %[[IDS:.*]] = bonsai_plan.buffer @acts[0] input "ids" {input_index = 0 : i64} : memref<1x4xi32>
  %ids = bonsai_plan.buffer @acts[0] input "ids" {input_index = 0 : i64} : memref<1x4xi32>
  // CHECK: %[[W:.*]] = bonsai_plan.buffer @weights[0] parameter "w" trainable : memref<8x16xf32>
  %w = bonsai_plan.buffer @weights[0] parameter "w" trainable : memref<8x16xf32>
  // CHECK: bonsai_plan.buffer @acts activation "h" : memref<1x4x16xf32>
  %h = bonsai_plan.buffer @acts activation "h" : memref<1x4x16xf32>
  // CHECK: bonsai_plan.buffer @host[0] optimizer_state "m" : memref<8x16xf32>
  %m = bonsai_plan.buffer @host[0] optimizer_state "m" : memref<8x16xf32>
  %g = bonsai_plan.buffer @acts gradient "g" : memref<8x16xf32>
  %s = bonsai_plan.buffer @acts workspace "s" : memref<64xf32>
  %l = bonsai_plan.buffer @acts loss "loss" : memref<f32>
  // CHECK: bonsai_plan.view %{{.*}} : memref<1x4x16xf32> to memref<4x16xf32>
  %v = bonsai_plan.view %h : memref<1x4x16xf32> to memref<4x16xf32>
  // CHECK: bonsai_plan.launch "embedding" ins(%[[W]], %[[IDS]] : memref<8x16xf32>, memref<1x4xi32>) outs(%{{.*}} : memref<1x4x16xf32>)
  bonsai_plan.launch "embedding" ins(%w, %ids : memref<8x16xf32>, memref<1x4xi32>) outs(%h : memref<1x4x16xf32>)
  // CHECK: bonsai_plan.launch "rms_norm" {{.*}} {params = {epsilon = 1.000000e-05 : f64}, stream = 1 : i64}
  bonsai_plan.launch "rms_norm" ins(%v : memref<4x16xf32>) outs(%v : memref<4x16xf32>) {params = {epsilon = 1.0e-5 : f64}, stream = 1 : i64}
  // CHECK: bonsai_plan.copy %{{.*}} to %{{.*}} stream 1 : memref<8x16xf32>, memref<8x16xf32>
  bonsai_plan.copy %m to %g stream 1 : memref<8x16xf32>, memref<8x16xf32>
  // CHECK: bonsai_plan.record_event 3 on stream 1
  bonsai_plan.record_event 3 on stream 1
  // CHECK: bonsai_plan.wait_event 3 on stream 0
  bonsai_plan.wait_event 3 on stream 0
  bonsai_plan.launch "cross_entropy" ins(%h, %ids : memref<1x4x16xf32>, memref<1x4xi32>) outs(%l : memref<f32>) {params = {ignore_index = -100 : i64}}
}
