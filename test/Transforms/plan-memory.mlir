// RUN: bonsai-opt --bonsai-plan-memory --bonsai-verify-plan %s -split-input-file -verify-diagnostics | FileCheck %s

// A chain in -> b -> c -> d of 1 KiB buffers. The input stays live for the whole step (the
// runtime writes it), b and d are never live together and share a slot, c needs its own:
// three slots; parameters sit one after another in the persistent arena.

// CHECK-LABEL: bonsai_plan.step @chain
// CHECK: bonsai_plan.arena @w persistent device size 2048
// CHECK: bonsai_plan.arena @a step device size 3072
// CHECK: bonsai_plan.buffer @w[0] parameter "p0"
// CHECK: bonsai_plan.buffer @w[1024] parameter "p1"
// CHECK: bonsai_plan.buffer @a[{{[0-9]+}}] input "in"
// CHECK: bonsai_plan.buffer @a[[[B:[0-9]+]]] activation "b"
// CHECK: bonsai_plan.buffer @a[{{[0-9]+}}] activation "c"
// CHECK: bonsai_plan.buffer @a[[[B]]] loss "d"
bonsai_plan.step @chain attributes {target = "cpu"} {
  bonsai_plan.arena @w persistent device size 0
  bonsai_plan.arena @a step device size 0
  %p0 = bonsai_plan.buffer @w parameter "p0" : memref<256xf32>
  %p1 = bonsai_plan.buffer @w parameter "p1" : memref<256xf32>
  %in = bonsai_plan.buffer @a input "in" {input_index = 0 : i64} : memref<256xf32>
  %b = bonsai_plan.buffer @a activation "b" : memref<256xf32>
  %c = bonsai_plan.buffer @a activation "c" : memref<256xf32>
  %d = bonsai_plan.buffer @a loss "d" : memref<256xf32>
  bonsai_plan.launch "f" ins(%in, %p0 : memref<256xf32>, memref<256xf32>) outs(%b : memref<256xf32>)
  bonsai_plan.launch "g" ins(%b, %p1 : memref<256xf32>, memref<256xf32>) outs(%c : memref<256xf32>)
  bonsai_plan.launch "h" ins(%c : memref<256xf32>) outs(%d : memref<256xf32>)
}

// -----

// A view keeps its source alive: %x is read through %v by the last launch, so %y cannot
// reuse %x's bytes (with the input and the loss: four slots).
// CHECK-LABEL: bonsai_plan.step @view_extends_life
// CHECK: bonsai_plan.arena @a step device size 4096
bonsai_plan.step @view_extends_life attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 0
  %in = bonsai_plan.buffer @a input "in" {input_index = 0 : i64} : memref<256xf32>
  %x = bonsai_plan.buffer @a activation "x" : memref<256xf32>
  %v = bonsai_plan.view %x : memref<256xf32> to memref<16x16xf32>
  %y = bonsai_plan.buffer @a activation "y" : memref<256xf32>
  %z = bonsai_plan.buffer @a loss "z" : memref<256xf32>
  bonsai_plan.launch "f" ins(%in : memref<256xf32>) outs(%x : memref<256xf32>)
  bonsai_plan.launch "g" ins(%in : memref<256xf32>) outs(%y : memref<256xf32>)
  bonsai_plan.launch "h" ins(%v, %y : memref<16x16xf32>, memref<256xf32>) outs(%z : memref<256xf32>)
}

// -----

// Over budget: the error says by how much and what dominates.
// expected-error @+1 {{the plan needs 2.00 KiB of device memory but the budget is 1.00 KiB (over by 1.00 KiB); weights take 2.00 KiB: train low-rank adapters on a quantized frozen base (bonsai.lora with bonsai.quantize), or a bf16 model}}
bonsai_plan.step @over attributes {target = "cpu", device_memory = 1024 : i64} {
  bonsai_plan.arena @w persistent device size 0
  %p0 = bonsai_plan.buffer @w parameter "p0" : memref<512xf32>
}

// -----

// Over budget with optimizer state dominant: the error recommends keeping it in pinned host
// memory (bonsai.offload), which the compiler carries out.
// expected-error @+1 {{the plan needs 3.00 KiB of device memory but the budget is 2.00 KiB (over by 1.00 KiB); optimizer state takes 2.00 KiB: keep it in pinned host memory (bonsai.offload ["optimizer_state"]), project the moments (bonsai.galore), or train adapters (bonsai.lora)}}
bonsai_plan.step @over_state attributes {target = "cpu", device_memory = 2048 : i64} {
  bonsai_plan.arena @w persistent device size 0
  bonsai_plan.arena @o persistent device size 0
  %p0 = bonsai_plan.buffer @w parameter "p0" trainable : memref<256xf32>
  %m = bonsai_plan.buffer @o optimizer_state "p0.exp_avg" : memref<256xf32>
  %v = bonsai_plan.buffer @o optimizer_state "p0.exp_avg_sq" : memref<256xf32>
}

// -----

// The same state in a pinned host arena: planned like any persistent arena, and not counted
// against the device budget, which the step now meets (the device copy of one moment lives in
// the step arena while its update runs).
// CHECK-LABEL: bonsai_plan.step @state_on_host
// CHECK: bonsai_plan.arena @w persistent device size 1024
// CHECK: bonsai_plan.arena @o persistent pinned_host size 2048
// CHECK: bonsai_plan.arena @a step device size 1024
// CHECK: bonsai_plan.buffer @o[0] optimizer_state "p0.exp_avg"
// CHECK: bonsai_plan.buffer @o[1024] optimizer_state "p0.exp_avg_sq"
bonsai_plan.step @state_on_host attributes {target = "cpu", device_memory = 2048 : i64} {
  bonsai_plan.arena @w persistent device size 0
  bonsai_plan.arena @o persistent pinned_host size 0
  bonsai_plan.arena @a step device size 0
  %p0 = bonsai_plan.buffer @w parameter "p0" trainable : memref<256xf32>
  %m = bonsai_plan.buffer @o optimizer_state "p0.exp_avg" : memref<256xf32>
  %v = bonsai_plan.buffer @o optimizer_state "p0.exp_avg_sq" : memref<256xf32>
  %dm = bonsai_plan.buffer @a activation "copy_h2d.0" : memref<256xf32>
  %dv = bonsai_plan.buffer @a activation "copy_h2d.1" : memref<256xf32>
  bonsai_plan.launch "copy_h2d" ins(%m : memref<256xf32>) outs(%dm : memref<256xf32>)
  bonsai_plan.launch "scale" ins(%p0 : memref<256xf32>) outs(%dm : memref<256xf32>)
  bonsai_plan.launch "copy_d2h" ins(%dm : memref<256xf32>) outs(%m : memref<256xf32>)
  bonsai_plan.launch "copy_h2d" ins(%v : memref<256xf32>) outs(%dv : memref<256xf32>)
  bonsai_plan.launch "scale" ins(%p0 : memref<256xf32>) outs(%dv : memref<256xf32>)
  bonsai_plan.launch "copy_d2h" ins(%dv : memref<256xf32>) outs(%v : memref<256xf32>)
}
