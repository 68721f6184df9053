// RUN: bonsai-opt %s | FileCheck %s
// RUN: bonsai-opt %s | bonsai-opt | FileCheck %s

// The FP8 ops (BonsaiFp8Ops.td) parse, verify and print back: the workspace is
// fp8::gemmWorkspaceBytes of the two cast operands / 4, e.g. (16·64 + 32·64 + 256) / 4 = 832
// for x 1x16x64 and W 32x64; the fused backward's is its two GEMMs' (704 + 448). The forward's
// `fast_accumulation` is printed only when set (its default is false). The GEMMs that share
// their input's cast read the first GEMM's workspace and stats, and have workspaces without
// the input's codes: (2048 + 256) / 4 = 576, and 704 + (512 + 256) / 4 = 896. The forward that
// keeps its input's transposed codes for the backward returns them as [K, M] E4M3FN codes.

// CHECK-LABEL: func.func @fp8_gemms
// CHECK: %{{.*}}, %[[YS:.*]], %[[YW:.*]] = bonsai.fp8_linear %{{.*}}, %{{.*}}, %[[S:.*]], %{{.*}} {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>, tensor<32xbf16>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
// CHECK: bonsai.fp8_linear %{{.*}}, %{{.*}}, %[[S]] {current = false, fast_accumulation = true, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
// CHECK: %{{.*}}, %[[DS:.*]], %{{.*}} = bonsai.fp8_linear_grad_input {{.*}} {current = true, margin = 2 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<704xf32>)
// CHECK: bonsai.fp8_linear_grad_weight {{.*}} : (tensor<1x16x32xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>) -> (tensor<32x64xf32>, tensor<2x4xf32>, tensor<448xf32>)
// CHECK: %[[AS:.*]], %{{.*}} = bonsai.fp8_linear_grad_weight_accumulate %{{.*}}, %{{.*}}, %[[S]], %[[ACC:.*]] {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<2x4xf32>, tensor<448xf32>)
// CHECK: %{{.*}}, %{{.*}}, %[[BWS:.*]], %[[BW:.*]] = bonsai.fp8_linear_backward %{{.*}}, %{{.*}}, %{{.*}}, %[[S]], %[[ACC]] {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
// CHECK: bonsai.fp8_linear_shared_input %[[YW]], %[[YS]], %{{.*}}, %[[S]] {current = false, margin = 0 : i64} : (tensor<832xf32>, tensor<2x4xf32>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<576xf32>)
// CHECK: bonsai.fp8_linear_backward_shared_input %{{.*}}, %{{.*}}, %[[BW]], %[[BWS]], %[[S]], %[[ACC]] {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1152xf32>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
// CHECK: %{{.*}}, %[[CS:.*]], %[[XT:.*]], %{{.*}} = bonsai.fp8_linear_with_input_cast %{{.*}}, %{{.*}}, %[[S]] {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<64x16xf8E4M3FN>, tensor<832xf32>)
// CHECK: bonsai.fp8_linear_backward_from_input_cast %{{.*}}, %{{.*}}, %[[XT]], %[[CS]], %[[S]], %[[ACC]] {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<64x16xf8E4M3FN>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
// CHECK: bonsai.fp8_update_scales %{{.*}}, %[[YS]], %[[DS]], %[[S]] {current = false, margin = 0 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x20xf32>
// CHECK: bonsai.fp8_update_scales %{{.*}}, %[[YS]], %[[S]] {current = false, margin = 0 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<3x20xf32>
func.func @fp8_gemms(%x: tensor<1x16x64xbf16>, %dy: tensor<1x16x32xbf16>, %step: tensor<i64>) {
  %w = bonsai.param "w" trainable : tensor<32x64xbf16>
  %b = bonsai.param "b" trainable : tensor<32xbf16>
  %s = bonsai.state optimizer "w.fp8" : tensor<3x20xf32>
  %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s, %b {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>, tensor<32xbf16>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  %yf, %yfs, %yfw = bonsai.fp8_linear %x, %w, %s {current = false, fast_accumulation = true, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<832xf32>)
  %dx, %ds, %dw_ws = bonsai.fp8_linear_grad_input %dy, %w, %s {current = true, margin = 2 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<704xf32>)
  %dw, %ws, %ww = bonsai.fp8_linear_grad_weight %dy, %x, %s {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>) -> (tensor<32x64xf32>, tensor<2x4xf32>, tensor<448xf32>)
  %acc = bonsai.state gradient "w" : tensor<32x64xf32>
  %as, %aw = bonsai.fp8_linear_grad_weight_accumulate %dy, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<2x4xf32>, tensor<448xf32>)
  %bdx, %bds, %bws, %bw = bonsai.fp8_linear_backward %dy, %w, %x, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1x16x64xbf16>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<1152xf32>)
  %sy, %sys, %syw = bonsai.fp8_linear_shared_input %yw, %ys, %w, %s {current = false, margin = 0 : i64} : (tensor<832xf32>, tensor<2x4xf32>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<576xf32>)
  %sdx, %sds, %sws, %sw = bonsai.fp8_linear_backward_shared_input %dy, %w, %bw, %bws, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<1152xf32>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
  %cy, %cys, %cxt, %cyw = bonsai.fp8_linear_with_input_cast %x, %w, %s {current = false, margin = 0 : i64} : (tensor<1x16x64xbf16>, tensor<32x64xbf16>, tensor<3x20xf32>) -> (tensor<1x16x32xbf16>, tensor<2x4xf32>, tensor<64x16xf8E4M3FN>, tensor<832xf32>)
  %cdx, %cds, %cws, %cw = bonsai.fp8_linear_backward_from_input_cast %dy, %w, %cxt, %cys, %s, %acc {current = false, margin = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x64xbf16>, tensor<64x16xf8E4M3FN>, tensor<2x4xf32>, tensor<3x20xf32>, tensor<32x64xf32>) -> (tensor<1x16x64xbf16>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<896xf32>)
  bonsai.fp8_update_scales %step, %ys, %ds, %s {current = false, margin = 0 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x20xf32>
  bonsai.fp8_update_scales %step, %ys, %s {current = false, margin = 0 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<3x20xf32>
  return
}
