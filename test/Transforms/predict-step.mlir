// bonsai-time-ops and bonsai-predict-step (docs/offload.md, "Predicted step time"): each op's
// time on the target, carried to the launches, and the planned step simulated on its streams;
// the prediction recorded on the step for the plan and the compiler's report. The input of
// offload-auto.mlir: four 4096x4096 bf16 linears over 16k tokens, updated in the backward pass.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-time-ops=target=h200 --bonsai-lower-to-plan --bonsai-schedule --bonsai-plan-memory --bonsai-predict-step=target=h200 %S/offload-auto.mlir | FileCheck %s --check-prefix=DEVICE
// With the state offloaded and the updates split, the prediction is longer, by what the
// offload adds to the kernels (the exposed part):
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200' --bonsai-time-ops=target=h200 --bonsai-lower-to-plan --bonsai-schedule --bonsai-plan-memory --bonsai-predict-step=target=h200 %S/offload-auto.mlir 2>/dev/null | FileCheck %s --check-prefix=AUTO
// Every update on a host four times slower: longer still.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200 update=host' '--bonsai-time-ops=target=h200 host-update-rate=1' --bonsai-lower-to-plan --bonsai-schedule --bonsai-plan-memory --bonsai-predict-step=target=h200 %S/offload-auto.mlir 2>/dev/null | FileCheck %s --check-prefix=HOST
// The same copies run in order on the compute stream (bonsai-schedule without overlap): every
// copy is exposed.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=target=h200' --bonsai-time-ops=target=h200 --bonsai-lower-to-plan '--bonsai-schedule=overlap=false' --bonsai-plan-memory --bonsai-predict-step=target=h200 %S/offload-auto.mlir 2>/dev/null | FileCheck %s --check-prefix=INORDER
// Two micro-batches run the forward and backward twice.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-time-ops=target=h200 '--bonsai-lower-to-plan=micro-batches=2' --bonsai-schedule --bonsai-plan-memory --bonsai-predict-step=target=h200 %S/offload-auto.mlir | FileCheck %s --check-prefix=TWICE
// Fused attention runs at the profile's measured attention rate (docs/targets.md: 317
// TFLOP/s on the H200), not a GEMM's: causal attention over 8192 tokens, 8 heads of 128,
// whose flash kernels do 4.81e11 FLOPs (1.37e11 forward, 3.44e11 backward) in 1.52 ms (0.73
// at the GEMMs' sustained 654 TFLOP/s) of the 2.12 ms step.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-fuse=per-site-remarks=false --bonsai-time-ops=target=h200 --bonsai-lower-to-plan --bonsai-schedule --bonsai-plan-memory --bonsai-predict-step=target=h200 %S/Inputs/predict-step-attention.mlir 2>/dev/null | FileCheck %s --check-prefix=ATTN
// The estimates are on the ops until the lowering takes them to the launches; the plan does
// not keep them.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-time-ops=target=h200 %S/offload-auto.mlir | FileCheck %s --check-prefix=OPS
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-time-ops=target=h200 --bonsai-lower-to-plan --bonsai-schedule --bonsai-plan-memory --bonsai-predict-step=target=h200 %S/offload-auto.mlir | FileCheck %s --check-prefix=PLAN
// The CPU has no rates to predict with; an unknown target is an error.
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-time-ops --bonsai-lower-to-plan --bonsai-schedule --bonsai-plan-memory --bonsai-predict-step %S/offload-auto.mlir | FileCheck %s --check-prefix=CPU
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-time-ops=target=tpu %S/offload-auto.mlir 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-lower-to-plan --bonsai-schedule --bonsai-plan-memory --bonsai-predict-step=target=tpu %S/offload-auto.mlir 2>&1 | FileCheck %s --check-prefix=UNKNOWN

// The four linears' kernels alone: 10.4 ms (10 us of it each kernel's start). The split adds
// 12.6 ms of exposed copies and host steps; every update on a 1 G parameters/s host, 76.4 ms
// (66.7 of it exposed; the host busy 67.5 ms: 67.1 M parameters and 4 x 100 us); the copies in
// order on the compute stream, 36.5 ms; two micro-batches, 20.7 ms.
// DEVICE: bonsai_plan.step @mlp
// DEVICE-SAME: bonsai.predicted_exposed_seconds = 0.000000e+00 : f64
// DEVICE-NOT: bonsai.predicted_host_seconds
// DEVICE-SAME: bonsai.predicted_step_seconds = 0.0103{{[0-9]+}} : f64
// AUTO: bonsai.predicted_exposed_seconds = 0.0125{{[0-9]+}} : f64
// AUTO-SAME: bonsai.predicted_step_seconds = 0.0225{{[0-9]+}} : f64
// HOST: bonsai.predicted_exposed_seconds = 0.0666{{[0-9]+}} : f64
// HOST-SAME: bonsai.predicted_host_seconds = 0.0675{{[0-9]+}} : f64
// HOST-SAME: bonsai.predicted_step_seconds = 0.0763{{[0-9]+}} : f64
// INORDER: bonsai.predicted_exposed_seconds = 0.0264{{[0-9]+}} : f64
// INORDER-SAME: bonsai.predicted_step_seconds = 0.0365{{[0-9]+}} : f64
// TWICE: bonsai.predicted_exposed_seconds = 0.000000e+00 : f64
// TWICE-SAME: bonsai.predicted_step_seconds = 0.0206{{[0-9]+}} : f64
// ATTN: bonsai.predicted_step_seconds = 0.00211{{[0-9]+}} : f64
// OPS: bonsai.linear {{.*}}bonsai.seconds = {{[0-9.eE+-]+}} : f64
// PLAN-NOT: bonsai.seconds
// CPU-NOT: bonsai.predicted
// UNKNOWN: error: unknown target 'tpu'
