// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200' %s 2>&1 | FileCheck %s
// A slower host takes fewer updates; a much faster one takes them all.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200 host-update-rate=1' %s 2>&1 | FileCheck %s --check-prefix=SLOW
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200 host-update-rate=1000' %s 2>&1 | FileCheck %s --check-prefix=FAST
// The split needs a GPU's rates:
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-offload %s 2>&1 | FileCheck %s --check-prefix=CPU
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=sm_90' %s 2>&1 | FileCheck %s --check-prefix=CPU
// It runs updates on the host, so the state and the masters must be offloaded:
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200 classes=optimizer_state update=auto' %s 2>&1 | FileCheck %s --check-prefix=MASTERS

// update "auto" (docs/offload.md, "Choosing per update"): four 4096x4096 bf16 linears over
// 16k tokens, updated in the backward pass with fp32 moments and masters in pinned host
// memory. On the H200's rates the simulation alternates: the host takes every other update,
// the link the others, and the remark says what it predicts for the split and for each
// single placement (17.4 ms against 20.6 ms all on the host and 19.1 ms all streamed).

// CHECK: remark: offload: update "auto" puts 2 of 4 updates on the host (33554432 parameters) and streams the rest (33554432 parameters with a host implementation): predicted step 17.358 ms (compute 8.928 ms with 0.617 ms waiting for streamed state, host until 16.756 ms, copies until 17.358 ms), against 17.358 ms split update by update, 20.578 ms with every update on the host and 19.054 ms with every update streamed, at 55.7 GB/s each way and 4.50 G parameters/s on the host; the compute is estimated from each op's cost, before recomputation
// CHECK: remark: offload: 2 updates of 'mlp' run on the host and 2 stream their state through the device over 14 state tensors (832.00 MiB) in pinned host memory: 448.00 MiB over PCIe to the host and 448.00 MiB to the device per step
// SLOW: puts 0 of 4 updates on the host (0 parameters) and streams the rest (67108864 parameters with a host implementation)
// SLOW-SAME: at 55.7 GB/s each way and 1.00 G parameters/s on the host
// FAST: puts 4 of 4 updates on the host (67108864 parameters) and streams the rest: predicted step [[STEP:[0-9.]+ ms]]
// FAST-SAME: [[STEP]] with every update on the host
// FAST: remark: offload: 4 updates of 'mlp' run on the host and 0 stream their state through the device
// CPU: error: update "auto" weighs the host against the link from the target's compute, memory and link rates, and target '{{cpu|sm_90}}' has none: compile for a named GPU (docs/targets.md), or choose update "host" or "device"
// MASTERS: error: update "auto" may run each update over its state in pinned host memory, and 'mlp' keeps fp32 master weights: offload 'master_weights' too

// The host updates (w2, w0) have their parameter copied back after them; the streamed ones
// (w3, whose gradient comes first, and w1) their three states copied in and out around them.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200' %s 2>/dev/null | FileCheck %s --check-prefix=IR
// IR-LABEL: func.func @mlp
// IR-COUNT-3: bonsai.copy_d2h
// IR-NOT: bonsai.copy_d2h
// IR: bonsai.copy_to_device %{{.*}}, %[[W2:.*]] {bonsai.phase = "backward"}
// IR-NOT: bonsai.copy_to_device
// IR-COUNT-3: bonsai.copy_d2h
// IR-NOT: bonsai.copy_d2h
// IR: bonsai.copy_to_device
// IR-NOT: bonsai.copy_d2h
// IR: return
func.func @mlp(%ids: tensor<8x2048xi32>, %labels: tensor<8x2048xi32>) -> tensor<f32> {
  %emb = bonsai.param "emb" frozen : tensor<4096x4096xbf16>
  %x = bonsai.embedding %emb, %ids : (tensor<4096x4096xbf16>, tensor<8x2048xi32>) -> tensor<8x2048x4096xbf16>
  %w0 = bonsai.param "w0" trainable : tensor<4096x4096xbf16>
  %h0 = bonsai.linear %x, %w0 : (tensor<8x2048x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<8x2048x4096xbf16>
  %w1 = bonsai.param "w1" trainable : tensor<4096x4096xbf16>
  %h1 = bonsai.linear %h0, %w1 : (tensor<8x2048x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<8x2048x4096xbf16>
  %w2 = bonsai.param "w2" trainable : tensor<4096x4096xbf16>
  %h2 = bonsai.linear %h1, %w2 : (tensor<8x2048x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<8x2048x4096xbf16>
  %w3 = bonsai.param "w3" trainable : tensor<4096x4096xbf16>
  %logits = bonsai.linear %h2, %w3 : (tensor<8x2048x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<8x2048x4096xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<8x2048x4096xbf16>, tensor<8x2048xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3 {update_in_backward = true}
  bonsai.offload ["optimizer_state", "master_weights"] update "auto"
}
