// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-offload --bonsai-remat=per-value-remarks=false --bonsai-fuse=per-site-remarks=false --bonsai-offload-activations %s 2>&1 | FileCheck %s
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-offload --bonsai-remat="per-value-remarks=false policy=auto device-memory=120000" --bonsai-fuse=per-site-remarks=false --bonsai-offload-activations %s 2>&1 | FileCheck %s --check-prefix=AUTO
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-offload --bonsai-remat="per-value-remarks=false policy=auto device-memory=1000000" %s 2>&1 | FileCheck %s --check-prefix=FITS

// Activation offload, the third choice of bonsai-remat (docs/remat.md, "Offloading
// activations"), on one Llama decoder layer with the recipe's `bonsai.offload
// ["activations"]` and policy `full`: the block inputs remat keeps (the embedding %h, and
// %res1 and %res2, which bonsai-fuse turns into the sums of add_rms_norm) go to pinned host
// memory right after they are computed and come back right before the backward pass first
// reads them, once fusion has matched the graph without the copies (flash attention,
// residual add + norm and the fused loss all still match). The fused loss's gradients, the
// forward pass's last kernel, stay: nothing would hide their copies. On the CPU target there
// are no link rates, so nothing bounds the bytes.

// CHECK: remark: bonsai-remat (policy 'full'): recomputes 13 tensors {{.*}}; offloads saved activations to pinned host memory between the passes, the longest stays first; planned device peak
// CHECK: remark: bonsai-fuse: 1 attention -> flash_attention; 1 attention_grad -> flash_attention_grad; {{.*}}1 linear + cross-entropy + gradients; {{.*}}2 residual add + norm
// CHECK: remark: bonsai-offload-activations: 3 of 3 saved activations in pinned host memory between the passes (12.00 KiB each way per micro-batch), 0 on the device (0 B)
// CHECK: %[[H:.*]] = bonsai.embedding
// CHECK-NEXT: %[[HHOST:.*]] = bonsai.copy_to_host %[[H]] : tensor<2x32x16xf32>
// CHECK: %[[RES1:.*]], %{{.*}} = bonsai.add_rms_norm %[[H]],
// CHECK-NEXT: %[[RES1HOST:.*]] = bonsai.copy_to_host %[[RES1]]
// CHECK: %[[RES2:.*]], %{{.*}} = bonsai.add_rms_norm %[[RES1]],
// CHECK-NEXT: %[[RES2HOST:.*]] = bonsai.copy_to_host %[[RES2]]
// CHECK: bonsai.linear_cross_entropy
// CHECK-NOT: bonsai.copy_to_host
// CHECK: %[[RES2DEV:.*]] = bonsai.copy_h2d %[[RES2HOST]] {bonsai.phase = "backward"}
// CHECK-NEXT: bonsai.rms_norm_grad %{{.*}}, %[[RES2DEV]],
// CHECK: %[[RES1DEV:.*]] = bonsai.copy_h2d %[[RES1HOST]] {bonsai.phase = "backward"}
// CHECK-NEXT: bonsai.rms_norm %[[RES1DEV]], {{.*}}bonsai.recomputed
// CHECK: bonsai.rms_norm_grad_add %{{.*}}, %[[RES1DEV]],
// CHECK: %[[HDEV:.*]] = bonsai.copy_h2d %[[HHOST]] {bonsai.phase = "backward"}
// CHECK-NEXT: bonsai.rms_norm %[[HDEV]], {{.*}}bonsai.recomputed
// CHECK: bonsai.flash_attention_grad
// CHECK: bonsai.rms_norm_grad_add %{{.*}}, %[[HDEV]],

// Policy auto under a budget that the plan without recomputation misses: offloading
// suffices, nothing is recomputed, and the saved values with the shortest stays (the
// last ones the forward pass computes, the first the backward pass reads) stay on the device
// as far as the budget allows.
// AUTO: remark: bonsai-remat (policy 'auto'): recomputes nothing; offloads saved activations to pinned host memory between the passes, the longest stays first, up to 48.00 KiB (the rest fits on the device); planned device peak 140.25 KiB -> 108.25 KiB
// AUTO: remark: bonsai-offload-activations: 11 of 13 saved activations in pinned host memory between the passes (44.50 KiB each way per micro-batch), 2 on the device (16.00 KiB)

// A budget the plan meets as it is: nothing is recomputed or offloaded.
// FITS: remark: bonsai-remat (policy 'auto'): the plan fits the budget of 976.56 KiB without recomputation (planned device peak 140.25 KiB); every saved activation stays on the device, none is offloaded
// FITS-NOT: bonsai.offload_activations

func.func @block(%ids: tensor<2x32xi32>, %labels: tensor<2x32xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<2x32xi32>) -> tensor<2x32x16xf32>
  %ln1_w = bonsai.param "ln1" trainable : tensor<16xf32>
  %ln1 = bonsai.rms_norm %h, %ln1_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %q_w = bonsai.param "q" trainable : tensor<16x16xf32>
  %q = bonsai.linear %ln1, %q_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %k_w = bonsai.param "k" trainable : tensor<16x16xf32>
  %k = bonsai.linear %ln1, %k_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %v_w = bonsai.param "v" trainable : tensor<16x16xf32>
  %v = bonsai.linear %ln1, %v_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x32x16xf32>) -> tensor<2x32x2x8xf32>
  %k4 = bonsai.reshape %k : (tensor<2x32x16xf32>) -> tensor<2x32x2x8xf32>
  %v4 = bonsai.reshape %v : (tensor<2x32x16xf32>) -> tensor<2x32x2x8xf32>
  %qr = bonsai.rope %q4 : (tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  %kr = bonsai.rope %k4 : (tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  %attn = bonsai.attention %qr, %kr, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  %attn2 = bonsai.reshape %attn : (tensor<2x32x2x8xf32>) -> tensor<2x32x16xf32>
  %o_w = bonsai.param "o" trainable : tensor<16x16xf32>
  %o = bonsai.linear %attn2, %o_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %res1 = bonsai.add %h, %o : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %ln2_w = bonsai.param "ln2" trainable : tensor<16xf32>
  %ln2 = bonsai.rms_norm %res1, %ln2_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %gate_w = bonsai.param "gate" trainable : tensor<32x16xf32>
  %gate = bonsai.linear %ln2, %gate_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %up_w = bonsai.param "up" trainable : tensor<32x16xf32>
  %up = bonsai.linear %ln2, %up_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %act = bonsai.swiglu %gate, %up : (tensor<2x32x32xf32>, tensor<2x32x32xf32>) -> tensor<2x32x32xf32>
  %down_w = bonsai.param "down" trainable : tensor<16x32xf32>
  %down = bonsai.linear %act, %down_w : (tensor<2x32x32xf32>, tensor<16x32xf32>) -> tensor<2x32x16xf32>
  %res2 = bonsai.add %res1, %down : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %norm_w = bonsai.param "norm" trainable : tensor<16xf32>
  %norm = bonsai.rms_norm %res2, %norm_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<32x16xf32>
  %logits = bonsai.linear %norm, %head_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x32x32xf32>, tensor<2x32xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
  bonsai.remat "full"
  bonsai.offload ["activations"]
}
