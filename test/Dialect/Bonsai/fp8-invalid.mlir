// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

// Negative tests of the FP8 ops (BonsaiFp8Ops.cpp): one case per verifier rule.

func.func @linear_weight_k(%x: tensor<1x16x64xbf16>, %w: tensor<32x48xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{weight shape: expected [N, 64] ([out, in] for input features 64), got [32, 48]}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x48xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @linear_dtype(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xf32>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{weight element type: expected 'bf16', got 'f32'}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xf32>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @linear_bias(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>, %b: tensor<64xbf16>) {
  // expected-error @+1 {{bias shape: expected [32], got [64]}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s, %b {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>, tensor<64xbf16>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @linear_result(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<1x16x32xbf16>', got 'tensor<1x16x32xf32>'}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xf32>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

// M = 8 positions: cuBLASLt's FP8 kernels need multiples of 16.
func.func @linear_m(%x: tensor<1x8x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{M (rows of the input) is 8; FP8 GEMMs need M, N and K to be multiples of 16}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x8x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x8x32xbf16>, tensor<2x4xf32>, tensor<768xf32>)
  return
}

// -----

func.func @linear_n(%x: tensor<1x16x64xbf16>, %w: tensor<24x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{N (output features) is 24; FP8 GEMMs need M, N and K to be multiples of 16}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<24x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x24xbf16>, tensor<2x4xf32>, tensor<704xf32>)
  return
}

// -----

func.func @linear_k(%x: tensor<1x16x40xbf16>, %w: tensor<32x40xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{K (input features) is 40; FP8 GEMMs need M, N and K to be multiples of 16}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x40xbf16>, tensor<32x40xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<576xf32>)
  return
}

// -----

// The state is f32 [3, 4 + H] with H >= 1.
func.func @state_no_history(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x4xf32>) {
  // expected-error @+1 {{state must be f32 [3, 4 + H] with an amax history H of 1 to 1024 steps, got 'tensor<3x4xf32>'}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x4xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @state_history_too_long(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x1029xf32>) {
  // expected-error @+1 {{state must be f32 [3, 4 + H] with an amax history H of 1 to 1024 steps, got 'tensor<3x1029xf32>'}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x1029xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @state_rows(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<2x20xf32>) {
  // expected-error @+1 {{state must be f32 [3, 4 + H]}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<2x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @state_dtype(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xbf16>) {
  // expected-error @+1 {{state must be f32 [3, 4 + H] with an amax history H of 1 to 1024 steps, got 'tensor<3x20xbf16>'}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xbf16>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @stats_shape(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{stats must be f32 [2, 4] (amax, underflow, saturation, scale of each cast operand), got 'tensor<4x2xf32>'}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<4x2xf32>, tensor<832xf32>)
  return
}

// -----

// The workspace must be exactly what fp8::gemmWorkspaceBytes gives (the runtime checks it).
func.func @workspace_size(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{workspace must be tensor<832xf32> (the FP8 codes of 1024 and 2048 elements, and the device's scales), got 'tensor<768xf32>'}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<768xf32>)
  return
}

// -----

func.func @margin(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{margin must be in [0, 16], got 17}}
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 17 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @grad_input_weight(%dy: tensor<1x16x32xbf16>, %w: tensor<48x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{weight shape: expected [32, K] ([out, in] for output features 32), got [48, 64]}}
  %dx, %ds, %dw = bonsai.fp8_linear_grad_input %dy, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<48x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<704xf32>)
  return
}

// -----

func.func @grad_input_result(%dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<1x16x64xbf16>', got 'tensor<1x16x32xbf16>'}}
  %dx, %ds, %dw = bonsai.fp8_linear_grad_input %dy, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<704xf32>)
  return
}

// -----

func.func @grad_input_workspace(%dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{workspace must be tensor<704xf32> (the FP8 codes of 512 and 2048 elements, and the device's scales), got 'tensor<832xf32>'}}
  %dx, %ds, %dw = bonsai.fp8_linear_grad_input %dy, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @grad_weight_positions(%dy: tensor<1x16x32xbf16>, %x: tensor<1x32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{input [1, 32, 64] and result_grad [1, 16, 32] must have the same leading dimensions (the positions)}}
  %dw, %ws, %ww = bonsai.fp8_linear_grad_weight %dy, %x, %s {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<1x32x64xbf16>, tensor<3x20xf32>) -> (tensor<32x64xf32>, tensor<2x4xf32>, tensor<448xf32>)
  return
}

// -----

func.func @grad_weight_dtype(%dy: tensor<1x16x32xbf16>, %x: tensor<1x16x64xf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{input element type: expected 'bf16', got 'f16'}}
  %dw, %ws, %ww = bonsai.fp8_linear_grad_weight %dy, %x, %s {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<1x16x64xf16>, tensor<3x20xf32>) -> (tensor<32x64xf32>, tensor<2x4xf32>, tensor<448xf32>)
  return
}

// -----

func.func @grad_weight_result(%dy: tensor<1x16x32xbf16>, %x: tensor<1x16x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{result shape: expected [32, 64] ([N, K]), got [64, 32]}}
  %dw, %ws, %ww = bonsai.fp8_linear_grad_weight %dy, %x, %s {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>) -> (tensor<64x32xf32>, tensor<2x4xf32>, tensor<448xf32>)
  return
}

// -----

func.func @grad_weight_n(%dy: tensor<1x16x24xbf16>, %x: tensor<1x16x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{N (output features) is 24; FP8 GEMMs need M, N and K to be multiples of 16}}
  %dw, %ws, %ww = bonsai.fp8_linear_grad_weight %dy, %x, %s {current = false, margin = 0 : i64} : (tensor<1x16x24xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>) -> (tensor<24x64xf32>, tensor<2x4xf32>, tensor<448xf32>)
  return
}

// -----

func.func @accumulate_shape(%dy: tensor<1x16x32xbf16>, %x: tensor<1x16x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<64x32xf32>) {
  // expected-error @+1 {{accumulator shape: expected [32, 64] ([N, K]), got [64, 32]}}
  %as, %aw = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<64x32xf32>) -> (tensor<2x4xf32>, tensor<448xf32>)
  return
}

// -----

func.func @accumulate_type(%dy: tensor<1x16x32xbf16>, %x: tensor<1x16x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xbf16>) {
  // expected-error @+1 {{accumulator element type must be f32 (FP8 GEMMs add into f32 accumulators only), got 'bf16'}}
  %as, %aw = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xbf16>) -> (tensor<2x4xf32>, tensor<448xf32>)
  return
}

// -----

func.func @accumulate_workspace(%dy: tensor<1x16x32xbf16>, %x: tensor<1x16x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  // expected-error @+1 {{workspace must be tensor<448xf32>}}
  %as, %aw = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<2x4xf32>, tensor<440xf32>)
  return
}

// -----

func.func @update_stats(%step: tensor<i64>, %fs: tensor<2x4xf32>, %bs: tensor<2x5xf32>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{backward_stats must be f32 [2, 4] (amax, underflow, saturation, scale of each cast operand), got 'tensor<2x5xf32>'}}
  bonsai.fp8_update_scales %step, %fs, %bs, %s {current = false, margin = 0 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<2x5xf32>, tensor<3x20xf32>
  return
}

// -----

func.func @update_state(%step: tensor<i64>, %fs: tensor<2x4xf32>, %s: tensor<3x20xf16>) {
  // expected-error @+1 {{state must be f32 [3, 4 + H] with an amax history H of 1 to 1024 steps, got 'tensor<3x20xf16>'}}
  bonsai.fp8_update_scales %step, %fs, %s {current = false, margin = 0 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<3x20xf16>
  return
}

// -----

func.func @update_margin(%step: tensor<i64>, %fs: tensor<2x4xf32>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{margin must be in [0, 16], got -1}}
  bonsai.fp8_update_scales %step, %fs, %s {current = false, margin = -1 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<3x20xf32>
  return
}

// -----

func.func @backward_input_shape(%dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %x: tensor<1x16x48xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  // expected-error @+1 {{input shape: expected [1, 16, 64] (result_grad's positions, the weight's K), got [1, 16, 48]}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward %dy, %w, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x48xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
  return
}

// -----

func.func @backward_input_type(%dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %x: tensor<1x16x64xf32>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  // expected-error @+1 {{input element type}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward %dy, %w, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x64xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
  return
}

// -----

func.func @backward_accumulator_type(%dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %x: tensor<1x16x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xbf16>) {
  // expected-error @+1 {{accumulator element type must be f32 (FP8 GEMMs add into f32 accumulators only), got 'bf16'}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward %dy, %w, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xbf16>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
  return
}

// -----

func.func @backward_accumulator_shape(%dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %x: tensor<1x16x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<64x32xf32>) {
  // expected-error @+1 {{accumulator shape: expected [32, 64] ([N, K]), got [64, 32]}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward %dy, %w, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<64x32xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
  return
}

// -----

func.func @backward_workspace(%dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %x: tensor<1x16x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  // expected-error @+1 {{workspace must be tensor<1152xf32> (the workspaces of the input and the weight gradient's FP8 GEMMs), got 'tensor<704xf32>'}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward %dy, %w, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<704xf32>)
  return
}

// -----

func.func @backward_margin(%dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %x: tensor<1x16x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  // expected-error @+1 {{margin must be in [0, 16], got 17}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward %dy, %w, %x, %s, %acc {current = false, margin = 17 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
  return
}

// -----

func.func @shared_input_not_a_workspace(%c: tensor<832xf32>, %cs: tensor<2x4xf32>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{input_cast must be the workspace of a 'bonsai.fp8_linear'}}
  %y, %ys, %yw = bonsai.fp8_linear_shared_input %c, %cs, %w, %s {current = false, margin = 0 : i64} : (tensor<832xf32>, tensor<2x4xf32>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<576xf32>)
  return
}

// -----

func.func @shared_input_other_stats(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>, %cs: tensor<2x4xf32>) {
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  // expected-error @+1 {{input_stats must be the stats of the op whose workspace is input_cast}}
  %y2, %ys2, %yw2 = bonsai.fp8_linear_shared_input %yw, %cs, %w, %s {current = false, margin = 0 : i64} : (tensor<832xf32>, tensor<2x4xf32>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<576xf32>)
  return
}

// -----

func.func @shared_input_other_input(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %w2: tensor<32x32xbf16>, %s: tensor<3x20xf32>) {
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  // expected-error @+1 {{the input of input_cast's op type: expected 'tensor<1x16x32xbf16>', got 'tensor<1x16x64xbf16>'}}
  %y2, %ys2, %yw2 = bonsai.fp8_linear_shared_input %yw, %ys, %w2, %s {current = false, margin = 0 : i64} : (tensor<832xf32>, tensor<2x4xf32>, tensor<32x32xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<320xf32>)
  return
}

// -----

func.func @shared_input_other_margin(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  // expected-error @+1 {{input_cast's op scales differently (current, margin): the input's scale must be the one this GEMM would use}}
  %y2, %ys2, %yw2 = bonsai.fp8_linear_shared_input %yw, %ys, %w, %s {current = false, margin = 1 : i64} : (tensor<832xf32>, tensor<2x4xf32>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<576xf32>)
  return
}

// -----

func.func @shared_input_workspace(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  // expected-error @+1 {{workspace must be tensor<576xf32> (the FP8 codes of 2048 weight elements and the device's scales), got 'tensor<832xf32>'}}
  %y2, %ys2, %yw2 = bonsai.fp8_linear_shared_input %yw, %ys, %w, %s {current = false, margin = 0 : i64} : (tensor<832xf32>, tensor<2x4xf32>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  return
}

// -----

func.func @backward_shared_input_from_forward(%x: tensor<1x16x64xbf16>, %dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  // expected-error @+1 {{input_cast must be the workspace of a 'bonsai.fp8_linear_backward'}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward_shared_input %dy, %w, %yw, %ys, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<832xf32>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
  return
}

// -----

func.func @backward_shared_input_stats(%x: tensor<1x16x64xbf16>, %dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  %bdx, %bds, %bws, %bw = bonsai.fp8_linear_backward %dy, %w, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
  // expected-error @+1 {{input_stats must be the weight_grad_stats of the op whose workspace is input_cast}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward_shared_input %dy, %w, %bw, %bds, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1152xf32>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
  return
}

// -----

func.func @backward_shared_input_workspace(%x: tensor<1x16x64xbf16>, %dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  %bdx, %bds, %bws, %bw = bonsai.fp8_linear_backward %dy, %w, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
  // expected-error @+1 {{workspace must be tensor<896xf32> (the codes of dy in two layouts and of the weight, and the device's scales), got 'tensor<1152xf32>'}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward_shared_input %dy, %w, %bw, %bws, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1152xf32>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
  return
}

// -----

func.func @with_input_cast_type(%x: tensor<1x16x64xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>) {
  // expected-error @+1 {{input_cast type: expected 'tensor<64x16xf8E4M3FN>', got 'tensor<16x64xf8E4M3FN>'}}
  %y, %ys, %xt, %yw = bonsai.fp8_linear_with_input_cast %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<16x64xf8E4M3FN>, tensor<832xf32>)
  return
}

// -----

func.func @from_input_cast_not_a_forward(%xt: tensor<64x16xf8E4M3FN>, %xs: tensor<2x4xf32>, %dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  // expected-error @+1 {{input_cast must be the input_cast of a 'bonsai.fp8_linear_with_input_cast'}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward_from_input_cast %dy, %w, %xt, %xs, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<64x16xf8E4M3FN>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
  return
}

// -----

func.func @from_input_cast_other_margin(%x: tensor<1x16x64xbf16>, %dy: tensor<1x16x32xbf16>, %w: tensor<32x64xbf16>, %s: tensor<3x20xf32>, %acc: tensor<32x64xf32>) {
  %y, %ys, %xt, %yw = bonsai.fp8_linear_with_input_cast %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<64x16xf8E4M3FN>, tensor<832xf32>)
  // expected-error @+1 {{input_cast's op scales differently (current, margin)}}
  %dx, %ds, %dws, %ws = bonsai.fp8_linear_backward_from_input_cast %dy, %w, %xt, %ys, %s, %acc {current = false, margin = 2 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<64x16xf8E4M3FN>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
  return
}
