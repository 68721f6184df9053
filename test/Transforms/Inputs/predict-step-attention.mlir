// Causal attention over 8192 tokens with small projections (test/Transforms/predict-step.mlir):
// after fusion the step's time is mostly the flash attention kernels'.
func.func @attention(%ids: tensor<1x8192xi32>, %labels: tensor<1x8192xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<256x1024xbf16>
  %h = bonsai.embedding %embed, %ids : (tensor<256x1024xbf16>, tensor<1x8192xi32>) -> tensor<1x8192x1024xbf16>
  %q_w = bonsai.param "q" trainable : tensor<1024x1024xbf16>
  %q = bonsai.linear %h, %q_w : (tensor<1x8192x1024xbf16>, tensor<1024x1024xbf16>) -> tensor<1x8192x1024xbf16>
  %k_w = bonsai.param "k" trainable : tensor<1024x1024xbf16>
  %k = bonsai.linear %h, %k_w : (tensor<1x8192x1024xbf16>, tensor<1024x1024xbf16>) -> tensor<1x8192x1024xbf16>
  %v_w = bonsai.param "v" trainable : tensor<1024x1024xbf16>
  %v = bonsai.linear %h, %v_w : (tensor<1x8192x1024xbf16>, tensor<1024x1024xbf16>) -> tensor<1x8192x1024xbf16>
  %q4 = bonsai.reshape %q : (tensor<1x8192x1024xbf16>) -> tensor<1x8192x8x128xbf16>
  %k4 = bonsai.reshape %k : (tensor<1x8192x1024xbf16>) -> tensor<1x8192x8x128xbf16>
  %v4 = bonsai.reshape %v : (tensor<1x8192x1024xbf16>) -> tensor<1x8192x8x128xbf16>
  %attn = bonsai.attention %q4, %k4, %v4 {causal, scale = 8.838834764831845e-02 : f64} : (tensor<1x8192x8x128xbf16>, tensor<1x8192x8x128xbf16>, tensor<1x8192x8x128xbf16>) -> tensor<1x8192x8x128xbf16>
  %attn2 = bonsai.reshape %attn : (tensor<1x8192x8x128xbf16>) -> tensor<1x8192x1024xbf16>
  %head_w = bonsai.param "lm_head" trainable : tensor<256x1024xbf16>
  %logits = bonsai.linear %attn2, %head_w : (tensor<1x8192x1024xbf16>, tensor<256x1024xbf16>) -> tensor<1x8192x256xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x8192x256xbf16>, tensor<1x8192xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
}
