// bonsai-predict-step (docs/offload.md, "Predicted step time"): the step time on the target
// as the step will run, recorded on the function for the plan and the compiler's report.
// The input of offload-auto.mlir: four 4096x4096 bf16 linears over 16k tokens, updated in the
// backward pass.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-predict-step=target=h200 %S/offload-auto.mlir | FileCheck %s --check-prefix=DEVICE
// With the state offloaded and the updates split, the prediction is longer, by what the
// offload adds to the kernels (the exposed part):
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200' --bonsai-predict-step=target=h200 %S/offload-auto.mlir 2>/dev/null | FileCheck %s --check-prefix=AUTO
// Every update on a host four times slower: longer still.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200 update=host' '--bonsai-predict-step=target=h200 host-update-rate=1' %S/offload-auto.mlir 2>/dev/null | FileCheck %s --check-prefix=HOST
// Two micro-batches run the forward and backward twice.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-predict-step=target=h200 micro-batches=2' %S/offload-auto.mlir | FileCheck %s --check-prefix=TWICE
// Fused attention runs at the profile's measured attention rate (docs/targets.md: 317
// TFLOP/s on the H200), not a GEMM's: causal attention over 8192 tokens, 8 heads of 128,
// whose flash kernels do 4.81e11 FLOPs (1.37e11 forward, 3.44e11 backward) in 1.52 ms of
// the 1.86 ms step (0.74 ms at the GEMMs' sustained 648 TFLOP/s).
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-fuse=per-site-remarks=false --bonsai-predict-step=target=h200 %S/Inputs/predict-step-attention.mlir 2>/dev/null | FileCheck %s --check-prefix=ATTN
// The CPU has no rates to predict with; an unknown target is an error.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-predict-step %S/offload-auto.mlir | FileCheck %s --check-prefix=CPU
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-predict-step=target=tpu %S/offload-auto.mlir 2>&1 | FileCheck %s --check-prefix=UNKNOWN

// The four linears' kernels alone: 10.2 ms; the split adds 12.4 ms of exposed copies and
// host steps; all on a 1 G parameters/s host, 90.5 ms (80.9 of it exposed); two
// micro-batches, 20.4 ms.
// DEVICE: func.func @mlp
// DEVICE-SAME: bonsai.predicted_exposed_seconds = 0.000000e+00 : f64
// DEVICE-SAME: bonsai.predicted_step_seconds = 0.0102{{[0-9]+}} : f64
// AUTO: bonsai.predicted_exposed_seconds = 0.0124{{[0-9]+}} : f64
// AUTO-SAME: bonsai.predicted_step_seconds = 0.0222{{[0-9]+}} : f64
// HOST: bonsai.predicted_exposed_seconds = 0.0809{{[0-9]+}} : f64
// HOST-SAME: bonsai.predicted_step_seconds = 0.0905{{[0-9]+}} : f64
// TWICE: bonsai.predicted_exposed_seconds = 0.000000e+00 : f64
// TWICE-SAME: bonsai.predicted_step_seconds = 0.0204{{[0-9]+}} : f64
// ATTN: bonsai.predicted_step_seconds = 0.00185{{[0-9]+}} : f64
// CPU-NOT: bonsai.predicted
// UNKNOWN: error: unknown target 'tpu'
