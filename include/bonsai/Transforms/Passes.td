//===- Passes.td - Bonsai compiler passes -------------------*- tablegen -*-===//
//
// The passes of the Bonsai pipeline, each runnable alone with bonsai-opt.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TRANSFORMS_PASSES_TD
#define BONSAI_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def BonsaiPrintCostPass : Pass<"bonsai-print-cost", "::mlir::ModuleOp"> {
  let summary = "Print parameter counts, FLOPs and memory of every model function";
  let description = [{
    For each function that declares `bonsai.param`s, prints to standard output:
    parameters by class (trainable, frozen, NF4-quantized; embedding lookups and GEMM weights),
    tokens per step, FLOPs per step and per token (forward, backward, training) split into
    tensor-core (GEMM) and vector FLOPs, and the bytes of weights and of activations per layer.
    The IR is not changed.

    Backward FLOPs ask each op's `CostOpInterface::getBackwardCost` with the set of values that
    need a gradient (those that depend on a trainable parameter), so frozen weights cost no
    weight-gradient GEMM.

    ```
    $ bonsai-opt --bonsai-print-cost examples/models/gpt2_124m.mlir -o /dev/null
    ```
  }];
  let options = [
    Option<"perLayer", "per-layer", "bool", /*default=*/"true",
           "Print the per-layer table of weight and activation bytes">,
  ];
}

def BonsaiVerifyModelPass : Pass<"bonsai-verify-model", "::mlir::ModuleOp"> {
  let summary = "Check that every model function is a well-formed training graph";
  let description = [{
    The first step of the pipeline. Beyond what each op's verifier checks, a model function must
    declare each parameter name once (the runtime binds weights by name), return exactly one
    scalar f32 loss, and take only statically shaped integer tensors (token ids and labels) as
    arguments. Every violation is reported, not only the first.
  }];
}

def BonsaiRingPass : Pass<"bonsai-ring", "::mlir::ModuleOp"> {
  let summary = "Split the sequence over the ranks of a ring (RingAttention, zigzag layout)";
  let description = [{
    Carries out the recipe's `bonsai.ring ranks N` (docs/ring-attention.md). The sequence of S
    tokens is cut into 2N chunks and rank r keeps chunks r and 2N-1-r (zigzag), so that causal
    attention costs every rank the same. The model's inputs over the tokens ([batch, seq]:
    ids, labels, positions, segment ids) and every value computed from them become the rank's
    share [batch, S/N, ...]; RoPE reads each token's position in the whole sequence from the
    `positions` input (added when the model has none); each `bonsai.attention` gets
    `ring_ranks = N`: its queries are the rank's, and it reads every rank's keys and values,
    which pass around the ring in their grouped-query form. The function gets
    `bonsai.ranks` and `bonsai.ring_ranks`, which the lowering puts on the plan.

    Runs before autodiff, whose backward pass then works on the share too. Errors name the
    cause: a sequence that does not split into 2N chunks, an op that mixes tokens other than
    attention (a learned position table, a softmax over the sequence), a model without
    attention. With `bonsai.shard "..." ranks D` the job is a grid of D x N ranks: consecutive
    groups of N form the rings, and bonsai-shard spreads the shards over all D x N.

    ```mlir
    %q = bonsai.rope %q4 {theta = 1.0e+04 : f64} : (tensor<4x64x4x16xf32>) -> tensor<4x64x4x16xf32>
    %o = bonsai.attention %q, %k, %v {causal, scale = 2.5e-01 : f64} : (...) -> tensor<4x64x4x16xf32>
    // becomes, with ranks 2 (and %positions : tensor<4x32xi32> a new input):
    %q = bonsai.rope %q4, %positions {theta = 1.0e+04 : f64} : (tensor<4x32x4x16xf32>, tensor<4x32xi32>) -> tensor<4x32x4x16xf32>
    %o = bonsai.attention %q, %k, %v {causal, ring_ranks = 2 : i64, scale = 2.5e-01 : f64} : (...) -> tensor<4x32x4x16xf32>
    ```

    The overlap condition (docs/ring-attention.md, "Overlap"): each step's attention of the
    rank's L = S/N queries against one block must take as long as passing the next block on.
    From the target profile's link bandwidth and attention rate the pass predicts the
    smallest L for which it does, forward (the key/value block) and backward (the block and
    its fp32 dk/dv), says it in its remark, and warns with both figures when the recipe's L is
    below it. A target without those rates (the CPU, a generic sm_XX) gets no prediction.
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Target profile whose link bandwidth and attention rate predict the overlap">,
  ];
}

def BonsaiRingGradientsPass : Pass<"bonsai-ring-gradients", "::mlir::ModuleOp"> {
  let summary = "Sum the gradients of a ring's ranks before the update";
  let description = [{
    The ranks of a ring (bonsai-ring) hold the same parameters and each computes the gradients
    of its share of the tokens; the runtime seeds each rank's backward pass with its share of
    the micro-batch's counted tokens. After bonsai-optimizer, each gradient accumulator is
    all-reduced (`bonsai.all_reduce` "sum") at the start of the update phase, and the norm and
    the updates read the sum, so every rank takes the same step. A function without
    `bonsai.ring_ranks`, or without an update, is left as it is, and so is a recipe with
    `bonsai.shard`, whose reduce-scatters over the whole data x ring grid sum the ring's
    gradients with the rest (bonsai-shard spreads the shards over every rank of the grid). FP8's delayed scaling and
    updates in the backward pass are refused with the ring (not built yet).
  }];
  let statistics = [
    Statistic<"numReduced", "reduced", "Gradient accumulators all-reduced">,
  ];
}

def BonsaiTileSequencePass : Pass<"bonsai-tile-sequence", "::mlir::ModuleOp"> {
  let summary = "Run the MLP blocks over chunks of the sequence, one chunk at a time";
  let description = [{
    Carries out `sequence_chunks N` of the recipe's `bonsai.remat` (or the `chunks` option):
    each expanding token-wise region (a linear that reads a value X, and the linears and
    elementwise ops that follow from it, whose widest value inside is wider than X and its
    results: the MLP's gate, up, activation and down projections, with their LoRA adapters) is
    computed over N chunks of the sequence dimension: each chunk slices X, runs the region's
    ops on its rows, and `bonsai.concat` joins the chunks' results. Only one chunk's
    intermediates are alive at a time, in the forward pass and, with the MLP recomputed
    (bonsai.remat), in the backward pass: at 128k tokens Llama-3-8B's MLP holds 3.5 GiB per
    intermediate whole, 0.44 GiB in 8 chunks. The FLOPs are the same; the gradients of the
    weights sum over the chunks (a different summation order from the whole GEMM).

    Runs before autodiff, whose backward pass then follows the chunks (docs/remat.md, "Tiling
    the sequence"). A sequence length the chunks do not divide is an error naming both.

    ```mlir
    %g = bonsai.linear %x, %wg : (tensor<1x64x64xf32>, tensor<176x64xf32>) -> tensor<1x64x176xf32>
    ...
    %d = bonsai.linear %a, %wd : (tensor<1x64x176xf32>, tensor<64x176xf32>) -> tensor<1x64x64xf32>
    // becomes, with chunks = 2:
    %x0 = bonsai.slice %x {axis = 1 : i64, start = 0 : i64} : (tensor<1x64x64xf32>) -> tensor<1x32x64xf32>
    ... the region on %x0 ...
    %x1 = bonsai.slice %x {axis = 1 : i64, start = 32 : i64} : (tensor<1x64x64xf32>) -> tensor<1x32x64xf32>
    ... the region on %x1 ...
    %d = bonsai.concat %d0, %d1 {axis = 1 : i64} : (tensor<1x32x64xf32>, tensor<1x32x64xf32>) -> tensor<1x64x64xf32>
    ```
  }];
  let options = [
    Option<"chunks", "chunks", "int64_t", /*default=*/"0",
           "Chunks of the sequence (0: the recipe's bonsai.remat sequence_chunks, else 1)">,
  ];
  let statistics = [
    Statistic<"numTiled", "tiled-regions", "Token-wise regions computed chunk by chunk">,
  ];
}

def BonsaiInsertLoraPass : Pass<"bonsai-insert-lora", "::mlir::ModuleOp"> {
  let summary = "Add LoRA or DoRA adapters to the targeted linears and freeze the base model";
  let description = [{
    Carries out the recipe's `bonsai.lora` directive (or, when `targets` is given, the pass
    options). For every linear whose weight `M.weight` a target pattern matches (PEFT's
    `target_modules` rule: a plain name matches a module path suffix, `*`/`?` glob the full
    weight name), it adds the trainable parameters `M.lora_A.weight` [r, in] (Kaiming-uniform
    initializer) and `M.lora_B.weight` [out, r] (zero initializer), and rewrites

      y = x·Wᵀ  into  y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ,   s = alpha / r

    (the scale is applied to the rank-r intermediate, where it is cheapest). With `dora`, it
    also adds `M.lora_magnitude_vector` [out] (initialized to the row norms of W) and scales
    the result's rows by `bonsai.dora_scale`: m / ||W + s·B·A||, the norm detached. Every
    other parameter becomes frozen (PEFT trains only the adapters). Because B starts at zero,
    the adapted model computes exactly what the base model did at step 0.

    Initializers are recorded on the new parameters as `bonsai.init` ("kaiming_uniform",
    "zeros", "row_norm") and `bonsai.init_source` (the base weight's name); the adapters are
    recorded on the function as `bonsai.adapters` (one dictionary per adapted linear: module,
    base, lora_a, lora_b, magnitude, rank, alpha) and `bonsai.adapter_targets` (the patterns).
    bonsai-lower-to-plan carries both into the plan (docs/lora.md).

    Errors name the cause: a pattern that matches no linear, a rank not below min(in, out), a
    weight shared by several uses (tied embeddings), DoRA on a linear with a bias or on a
    weight that is not a parameter in [out, in] layout, an adapter name already declared.

    Before (`bonsai.lora rank 8 alpha 16.0 targets ["q_proj"]`):
    ```mlir
    %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<64x64xf32>
    %q = bonsai.linear %h, %w : (tensor<4x64x64xf32>, tensor<64x64xf32>) -> tensor<4x64x64xf32>
    ```
    After:
    ```mlir
    %s = bonsai.fill {value = 2.0 : f64} : () -> tensor<f32>
    %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen : tensor<64x64xf32>
    %a = bonsai.param "model.layers.0.self_attn.q_proj.lora_A.weight" trainable {bonsai.init = "kaiming_uniform"} : tensor<8x64xf32>
    %b = bonsai.param "model.layers.0.self_attn.q_proj.lora_B.weight" trainable {bonsai.init = "zeros"} : tensor<64x8xf32>
    %q = bonsai.linear %h, %w : ...
    %xa = bonsai.linear %h, %a : ... -> tensor<4x64x8xf32>
    %xs = bonsai.mul %xa, %s : (tensor<4x64x8xf32>, tensor<f32>) -> tensor<4x64x8xf32>
    %l = bonsai.linear %xs, %b : ... -> tensor<4x64x64xf32>
    %q2 = bonsai.add %q, %l : ...
    ```
  }];
  let options = [
    Option<"rank", "rank", "int64_t", /*default=*/"0",
           "Adapter rank (with `targets`; otherwise the recipe's bonsai.lora applies)">,
    Option<"alpha", "alpha", "double", /*default=*/"0.0",
           "LoRA alpha; the scale is alpha / rank (default: the rank, a scale of 1)">,
    Option<"dora", "dora", "bool", /*default=*/"false", "Weight-decomposed adapters (DoRA)">,
    ListOption<"targets", "targets", "std::string",
               "Target patterns; when given, the options replace the recipe's bonsai.lora">,
  ];
  let statistics = [
    Statistic<"numAdapters", "adapters", "Linears that got an adapter">,
    Statistic<"numFrozen", "frozen", "Parameters frozen (trainable before the pass)">,
    Statistic<"adapterParams", "adapter-params", "Elements of the adapter parameters">,
  ];
}

def BonsaiQuantizePass : Pass<"bonsai-quantize", "::mlir::ModuleOp"> {
  let summary = "Store the recipe's frozen linear weights as NF4, dequantized where they are used";
  let description = [{
    Carries out the recipe's `bonsai.quantize` directive (QLoRA): every parameter that is the
    weight of a linear a target pattern matches (PEFT's `target_modules` rule, as for
    bonsai.lora) becomes a tensor of `!bonsai.nf4<block, double_quant>` (4-bit NormalFloat
    codes, an 8-bit absmax per block, an fp32 scale per `double_quant` blocks: about 4.127
    bits per element), and a `bonsai.dequantize` back to the weight's compute type is inserted
    before its first use. The runtime quantizes the weights when it binds them (from the
    checkpoint's bf16/f32 values, or after random initialization), deterministically
    (docs/quantization.md).

    Quantized weights are frozen: a targeted weight that is trainable is an error naming it
    (the LoRA pass, which runs first, freezes the base weights it adapts). `bonsai.dequantize`
    implements `RecomputeOpInterface`, so bonsai-remat dequantizes again in the backward pass
    instead of keeping the bf16 weight alive from forward to backward.

    Before (`bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj"]`):
    ```mlir
    %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen : tensor<64x64xbf16>
    %q = bonsai.linear %h, %w : (tensor<4x64x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64x64xbf16>
    ```
    After:
    ```mlir
    %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen : tensor<64x64x!bonsai.nf4<64, 256>>
    %d = bonsai.dequantize %w : (tensor<64x64x!bonsai.nf4<64, 256>>) -> tensor<64x64xbf16>
    %q = bonsai.linear %h, %d : (tensor<4x64x64xbf16>, tensor<64x64xbf16>) -> tensor<4x64x64xbf16>
    ```
  }];
  let statistics = [
    Statistic<"numQuantized", "quantized", "Parameters stored as NF4">,
    Statistic<"bytesSaved", "bytes-saved", "Weight bytes saved by quantization">,
  ];
}

//===----------------------------------------------------------------------===//
// Training passes
//===----------------------------------------------------------------------===//

def BonsaiAutodiffPass : Pass<"bonsai-autodiff", "::mlir::ModuleOp"> {
  let summary = "Append the backward pass: gradients of the loss for every trainable parameter";
  let description = [{
    Reverse mode over each model function. The seed is `bonsai.loss_scale` (which the runtime
    sets to 1 / micro-batches); the pass walks the forward ops backwards and asks each, through
    `GradientOpInterface`, to build its operands' gradients, summing the gradients of values used
    more than once (tied embeddings). Only values that depend on a trainable parameter get a
    gradient: frozen parameters get none, and nothing is computed before the first trainable
    parameter. Each trainable parameter's gradient is added into a persistent fp32 accumulator,
    `bonsai.state gradient "<parameter name>"`. Every op the pass creates is marked
    `bonsai.phase = "backward"`.

    Before:
    ```mlir
    %w = bonsai.param "lm_head.weight" trainable : tensor<16x8xf32>
    %y = bonsai.linear %x, %w : ...
    %loss = bonsai.cross_entropy %y, %labels : ...
    return %loss : tensor<f32>
    ```
    After (abridged):
    ```mlir
    %seed = bonsai.loss_scale : tensor<f32>
    %dy = bonsai.cross_entropy_grad %seed, %y, %labels : ...
    %dw = bonsai.linear_grad_weight %dy, %x : ...
    %acc = bonsai.state gradient "lm_head.weight" : tensor<16x8xf32>
    bonsai.accumulate %dw, %acc : tensor<16x8xf32>, tensor<16x8xf32>
    return %loss : tensor<f32>
    ```
  }];
  let statistics = [
    Statistic<"numGradients", "gradients", "Trainable parameters that got a gradient">,
    Statistic<"numBackwardOps", "backward-ops", "Ops created for the backward pass">,
  ];
}

def BonsaiOptimizerPass : Pass<"bonsai-optimizer", "::mlir::ModuleOp"> {
  let summary = "Expand the recipe's optimizer into per-parameter in-place updates";
  let description = [{
    Reads the `bonsai.optimizer` directive of the module's recipe and, after the backward pass,
    emits the update phase: the learning rate of the step from the step counter and the
    schedule, the global gradient norm (for clipping and for the metrics), one
    `bonsai.adamw_update` or `bonsai.sgd_update` per gradient accumulator with its optimizer
    state (`<name>.exp_avg`, `<name>.exp_avg_sq` or `<name>.momentum_buffer`, and an fp32
    `<name>.master` copy for parameters that are not f32), zeroing of the accumulators, and the
    step counter's increment. `grad_norm` and `lr` are reported as metrics. Every op the pass
    creates is marked `bonsai.phase = "update"`.
  }];
  let statistics = [
    Statistic<"numUpdates", "updates", "Parameters updated">,
    Statistic<"stateBytes", "state-bytes", "Bytes of optimizer state created">,
  ];
}

def BonsaiGaLorePass : Pass<"bonsai-galore", "::mlir::ModuleOp"> {
  let summary = "Keep the AdamW moments of the recipe's 2-D weights in a rank-r subspace";
  let description = [{
    Carries out the recipe's `bonsai.galore` directive after bonsai-optimizer: the
    `bonsai.adamw_update` of every weight the directive's targets match (a 2-D trainable
    parameter of a linear) is replaced by a GaLore update whose moments have the projected
    gradient's shape (r x n when m <= n, else m x r) plus a projector state (m x r, or n x r):
    2 r n + m r floats instead of 2 m n (on the left side). Other parameters (embeddings,
    norms, untargeted linears) keep plain AdamW. Every GaLore weight gets a slot in one f32
    status vector `galore.status`, where its refresh records a skipped refresh.

    Refreshes are staggered: weight i of the n GaLore weights refreshes when
    (step + offset_i) mod T = 0 with offset_i = floor(i T / n), so each step refreshes about
    n / T projectors instead of all of them every T steps; at step 0 every projector is
    computed. The refresh kernel runs every step and returns at once when it is not due.

    Before:
    ```mlir
    %m = bonsai.state optimizer "w.exp_avg" : tensor<16x64xf32>
    %v = bonsai.state optimizer "w.exp_avg_sq" : tensor<16x64xf32>
    bonsai.adamw_update %g, %step, %lr, %norm, %w, %m, %v {...}
    ```
    After (rank 4):
    ```mlir
    %p = bonsai.state optimizer "w.galore_projector" : tensor<16x4xf32>
    %m = bonsai.state optimizer "w.exp_avg" : tensor<4x64xf32>
    %v = bonsai.state optimizer "w.exp_avg_sq" : tensor<4x64xf32>
    %ws = bonsai.galore_refresh %g, %step, %p, %status {...}
    %r = bonsai.galore_project %g, %p {left = true}
    bonsai.galore_adamw_update %r, %step, %lr, %norm, %p, %w, %m, %v {...}
    ```
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Architecture the plan is for: the exact ('svd') projector has a CPU kernel only">,
    Option<"seed", "seed", "int64_t", /*default=*/"0",
           "Seed of the randomized range finder's Gaussian sketches">,
    Option<"powerIterations", "power-iterations", "int64_t", /*default=*/"1",
           "Power iterations of the randomized range finder">,
    Option<"perWeightRemarks", "per-weight-remarks", "bool", /*default=*/"true",
           "A remark per GaLore weight with its state shapes (else only the summary)">,
  ];
  let statistics = [
    Statistic<"numGalore", "galore-weights", "Weights whose moments GaLore projects">,
    Statistic<"numAdamW", "adamw-weights", "Parameters that keep plain AdamW">,
    Statistic<"stateBytesSaved", "state-bytes-saved", "Optimizer state bytes saved">,
  ];
}

def BonsaiOffloadPass : Pass<"bonsai-offload", "::mlir::ModuleOp"> {
  let summary = "Keep the recipe's offloaded state classes in pinned host memory and stream "
                "them through the device around each update";
  let description = [{
    Carries out the recipe's `bonsai.offload` directive (or, when `classes` is given, the pass
    option) after bonsai-optimizer and bonsai-galore, before bonsai-remat (whose budget then
    sees the smaller device state) and bonsai-fuse (docs/offload.md). Two classes are built:

    - `optimizer_state`: the moments and momentum buffers of the optimizer updates;
    - `master_weights`: the fp32 master copies of parameters stored in bf16 or f16.

    The updates say which of their operands hold which class (OptimizerStateOpInterface).
    Every such `bonsai.state` gets `placement <pinned_host>`; the update then reads and
    writes a device copy: a `bonsai.copy_h2d` right before it and a `bonsai.copy_d2h` right
    after it, in the update's phase. Each copy lives from its update's first copy to its
    last, so the device holds the state of one update at a time; the memory planner puts the
    state itself in a pinned host arena. The result is bit for bit the same training.

    Errors name the class and the cause: a class the step does not have (no trainable
    parameter, SGD without momentum, parameters already in f32 so no master copies), a class
    this pass does not build yet (`parameters`, `gradients`, `activations`), a state that
    other ops read besides its update.

    Before (`bonsai.offload ["optimizer_state"]`):
    ```mlir
    %m = bonsai.state optimizer "w.exp_avg" : tensor<16x64xf32>
    %v = bonsai.state optimizer "w.exp_avg_sq" : tensor<16x64xf32>
    bonsai.adamw_update %g, %step, %lr, %norm, %w, %m, %v {...}
    ```
    After:
    ```mlir
    %m = bonsai.state optimizer "w.exp_avg" placement <pinned_host> : tensor<16x64xf32>
    %v = bonsai.state optimizer "w.exp_avg_sq" placement <pinned_host> : tensor<16x64xf32>
    %m_dev = bonsai.copy_h2d %m : tensor<16x64xf32>
    %v_dev = bonsai.copy_h2d %v : tensor<16x64xf32>
    bonsai.adamw_update %g, %step, %lr, %norm, %w, %m_dev, %v_dev {...}
    bonsai.copy_d2h %m_dev, %m : tensor<16x64xf32>, tensor<16x64xf32>
    bonsai.copy_d2h %v_dev, %v : tensor<16x64xf32>, tensor<16x64xf32>
    ```

    With `update "host"` (or the `update=host` option) the update itself runs on the CPU
    instead, over its state where it is kept: every update must have a host implementation
    (AdamW, SGD: OptimizerStateOpInterface::getHostStepParamOperand) and all of its state
    must be offloaded. The parameter is updated through a pinned host copy of it (a
    `bonsai.state` with `copy_of` the parameter), copied into the parameter after the
    update; the tensors the update only reads are copied to the host before it:
    ```mlir
    %w_host = bonsai.state optimizer "w.host_copy" copy_of "w" placement <pinned_host> : tensor<16x64xbf16>
    %g_host = bonsai.copy_to_host %g : tensor<16x64xbf16>
    ... (the step counter, the learning rate, the norm)
    bonsai.adamw_update %g_host, %step_host, %lr_host, %norm_host, %w_host, %m, %v, %w32 {...}
    bonsai.copy_to_device %w_host, %w : tensor<16x64xbf16>, tensor<16x64xbf16>
    ```
    The schedule then runs the update on the runtime's host stream.

    With `update "auto"` (`update=auto`) each update that has a host implementation runs on
    the host or streams its state through the device, whichever a simulation of the step
    (bonsai/Analysis/UpdatePlacement.h) finishes sooner: the compute stream's time from each
    op's cost at the `target` profile's rates, the link at its bandwidth, the host at
    `host-update-rate` (else the profile's). A remark gives the split, the predicted step
    time and those of the two single placements. The target must be a named GPU.
  }];
  let options = [
    ListOption<"classes", "classes", "std::string",
               "State classes to offload (default: the recipe's bonsai.offload)">,
    Option<"update", "update", "std::string", /*default=*/"\"\"",
           "Where the updates of offloaded state run: device, host or auto (default: the "
           "recipe's bonsai.offload, else device)">,
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Target profile whose rates update auto weighs (a named GPU)">,
    Option<"hostUpdateRate", "host-update-rate", "double", /*default=*/"0",
           "The host's optimizer rate in G parameters/s for update auto (0: the target "
           "profile's)">,
    Option<"perTensorRemarks", "per-tensor-remarks", "bool", /*default=*/"true",
           "A remark per offloaded tensor (else only the summary)">,
  ];
  let statistics = [
    Statistic<"numOffloaded", "offloaded-tensors", "State tensors placed in pinned host memory">,
    Statistic<"bytesOffloaded", "offloaded-bytes", "Bytes of state placed in pinned host memory">,
  ];
}

def BonsaiRematPass : Pass<"bonsai-remat", "::mlir::ModuleOp"> {
  let summary = "Choose the activations the backward pass recomputes instead of keeping";
  let description = [{
    Works on the joint forward+backward graph (after bonsai-autodiff and bonsai-optimizer,
    before bonsai-lower-to-plan). A saved activation is the result of a forward op (an op
    without `bonsai.phase`; not a parameter, state or function argument) that a backward op
    reads. Recomputing it clones its defining op right before its first backward use, together
    with any recomputed value the clone reads (in forward order), and makes the backward ops
    read the clone; the original then dies after its last forward use, which the memory
    planner sees. Clones are marked `bonsai.phase = "backward"` and `bonsai.recomputed`.
    Views (reshapes) follow their source: a view is recomputed exactly when its source is.

    Policies (the `policy` option, else the recipe's `bonsai.remat`, else `auto` when there is
    a budget and `none` without one):
    - `none`: keep every saved activation.
    - `full`: keep only block inputs, the values a `NormalizationOpInterface` op normalises
      (the residual stream each sublayer starts from); recompute everything else.
    - `selective`: also keep GEMM outputs (ops whose forward cost has tensor-core FLOPs:
      linear, matmul, attention); recompute the cheap, memory-heavy rest (norms, activations,
      rope, slices, transposes).
    - `auto`: the recompute set with the fewest recomputed FLOPs whose planned device peak
      fits `device-memory` (else the recipe target's `device_memory`). Every candidate set is
      evaluated with the real planner: a copy of the function is lowered through
      bonsai-lower-to-plan, bonsai-schedule and bonsai-plan-memory and its arenas summed.
      The search is greedy by peak bytes freed per recomputed FLOP (moves drop a candidate
      alone or with the values only it would keep alive), with memoisation, and keeps again
      whatever the budget does not need; the fixed policies are fallbacks. `search=exhaustive`
      tries every set instead (small graphs), and `search=compare` reports, for every budget
      on the exhaustive frontier, the optimum next to the greedy search's result (docs/remat.md).
      A budget that no recomputation meets is an error giving the smallest peak found.

    Remarks name each recomputed tensor and its FLOPs, and sum up the policy's cost as a
    share of the step's FLOPs and its effect on the planned peak.

    Before (`full`; `%n` is not a block input, `%h` is):
    ```mlir
    %n = bonsai.rms_norm %h, %w : ...
    %y = bonsai.linear %n, %lm : ...
    ...
    %dw = bonsai.linear_grad_weight %dy, %n {bonsai.phase = "backward"} : ...
    ```
    After:
    ```mlir
    %n = bonsai.rms_norm %h, %w : ...
    %y = bonsai.linear %n, %lm : ...
    ...
    %n2 = bonsai.rms_norm %h, %w {bonsai.phase = "backward", bonsai.recomputed} : ...
    %dw = bonsai.linear_grad_weight %dy, %n2 {bonsai.phase = "backward"} : ...
    ```
  }];
  let options = [
    Option<"policy", "policy", "std::string", /*default=*/"\"\"",
           "none, full, selective or auto (default: the recipe's bonsai.remat; without one, " #
           "auto when there is a budget, else none)">,
    Option<"deviceMemory", "device-memory", "int64_t", /*default=*/"0",
           "Per-device budget in bytes for auto (0: the recipe target's device_memory)">,
    Option<"hostMemory", "host-memory", "int64_t", /*default=*/"0",
           "Pinned host memory budget in bytes: offloaded activations take at most what " #
           "the plan's other pinned arenas leave of it (0: the recipe target's " #
           "host_memory, else none)">,
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Architecture the trial plans of auto are lowered for">,
    Option<"search", "search", "std::string", /*default=*/"\"greedy\"",
           "How auto searches: greedy, or exhaustive (every recompute set; at most 24 " #
           "candidate tensors); compare plans every set and reports, for each budget on the " #
           "exhaustive frontier, the optimum and the greedy's FLOPs (the IR is unchanged)">,
    Option<"timeLimit", "time-limit", "double", /*default=*/"0",
           "Seconds auto's search may take; past them it returns the best set it has " #
           "planned that fits, with a remark (0: no limit)">,
    Option<"perValueRemarks", "per-value-remarks", "bool", /*default=*/"true",
           "A remark at every recomputed tensor, besides the summary">,
    Option<"fuse", "fuse", "bool", /*default=*/"false",
           "Run bonsai-fuse on auto's trial plans before lowering them, as the pipeline will " #
           "(fused kernels keep less: the budget must see what the plan will be)">,
    ListOption<"fuseDisable", "fuse-disable", "std::string",
               "Fusion families the trial plans leave out (bonsai-fuse's disable)">,
    Option<"profile", "profile", "std::string", /*default=*/"\"\"",
           "The named target profile (h200, ...) whose link and compute rates bound the " #
           "bytes of activations offloaded (default: target)">,
    Option<"offloadActivations", "offload-activations", "bool", /*default=*/"false",
           "Keep the saved activations the policy does not recompute in pinned host memory " #
           "between the passes (bonsai-offload-activations places the copies after fusion); " #
           "auto keeps on the device those the budget allows (also on when the recipe's " #
           "bonsai.offload lists activations)">,
  ];
  let statistics = [
    Statistic<"numRecomputed", "recomputed", "Tensors recomputed in the backward pass">,
    Statistic<"recomputedFlops", "recomputed-flops", "FLOPs of the recomputation per step">,
    Statistic<"peakBefore", "peak-before", "Planned device peak (bytes) without recomputation">,
    Statistic<"peakAfter", "peak-after", "Planned device peak (bytes) with the chosen set">,
    Statistic<"numPlans", "plans-evaluated", "Trial plans lowered and planned">,
  ];
  let dependentDialects = ["::mlir::bonsai::plan::PlanDialect"];
}

def BonsaiOffloadActivationsPass : Pass<"bonsai-offload-activations", "::mlir::ModuleOp"> {
  let summary = "Keep the saved activations bonsai-remat offloads in pinned host memory";
  let description = [{
    Carries out the third choice of bonsai-remat (docs/remat.md, "Offloading activations"):
    a function with `bonsai.offload_activations = N` (bytes, set by bonsai-remat when the
    recipe's `bonsai.offload` lists `activations`) keeps saved activations (results of
    forward kernels that the backward pass reads, directly or through views, and nothing but
    forward and backward ops read) in pinned host memory, the longest stays between the
    passes first, as long as their bytes stay within N; the rest stay on the device. Each offloaded
    value gets a `bonsai.copy_to_host` right after its op and a `bonsai.copy_h2d` (phase
    backward) right before its first backward reader; backward readers then read the device
    copy (views of it are remade after the copy). The attribute is removed.

    Runs after bonsai-fuse: a copy between a value and its readers would hide them from the
    fusion patterns (flash attention, residual add + norm, the fused loss), and the fused step
    would then compute differently. The copies only move bytes: training is bit for bit the
    same as without them.

    ```mlir
    %h = bonsai.add %x, %o : ...
    %h_host = bonsai.copy_to_host %h : tensor<4x64x64xf32>
    ...
    %h_dev = bonsai.copy_h2d %h_host {bonsai.phase = "backward"} : tensor<4x64x64xf32>
    %n2 = bonsai.rms_norm %h_dev, %w {bonsai.phase = "backward", bonsai.recomputed} : ...
    ```
  }];
  let statistics = [
    Statistic<"numOffloaded", "offloaded-activations",
              "Saved activations kept in pinned host memory between the passes">,
    Statistic<"bytesOffloaded", "offloaded-activation-bytes",
              "Bytes of the offloaded activations (each way, per micro-batch)">,
  ];
}

def BonsaiFusePass : Pass<"bonsai-fuse", "::mlir::ModuleOp"> {
  let summary = "Replace chains of ops with fused kernels";
  let description = [{
    Runs on the whole step (after bonsai-remat, before bonsai-lower-to-plan), so that every
    fusion sees the forward, backward and update ops it joins, and recomputed clones are
    fused like the originals. Each family of fusions is a set of rewrite patterns (one file per
    family under lib/Transforms/Fusion/) that match through op interfaces and produce ops the
    runtime implements as one kernel; fused and unfused steps compute the same values up to
    floating-point summation order (test/EndToEnd checks losses and gradients of both).

    The families are listed in docs/fusion.md with what each saves; the `disable` option turns
    families off by name (an unknown name is an error that lists the known ones), `only` keeps
    just the families it names. Families apply one after another in the registry's order
    (lib/Transforms/Fuse.cpp), each to what the ones before it left: the LM head's chunked loss
    and the flash attention pair first, the generated elementwise kernels last.

    A remark per function sums up what was fused; `per-site-remarks` adds one at each fusion.
  }];
  let options = [
    ListOption<"disable", "disable", "std::string",
               "Fusion families not to apply (names as in docs/fusion.md)">,
    ListOption<"only", "only", "std::string",
               "Apply only these fusion families (for tests that look at one family)">,
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Architecture the fused kernels are chosen for">,
    Option<"perSiteRemarks", "per-site-remarks", "bool", /*default=*/"true",
           "A remark at every fusion, besides the summary">,
  ];
  let statistics = [
    Statistic<"numFused", "fused", "Fused ops created">,
  ];
}

def BonsaiTimeOpsPass : Pass<"bonsai-time-ops", "::mlir::ModuleOp"> {
  let summary = "Estimate each op's time on the target, for the step-time prediction";
  let description = [{
    Runs after remat and fusion, on the step as it will run: puts on each op that becomes a
    launch its seconds on the resource it runs on (`bonsai.seconds`, StepTime.h's
    estimateLaunchSeconds): a kernel its cost at the rates the `target` profile's kernels
    sustain in a whole step, a copy between pinned host memory and the device its bytes over
    the link, an update on the host its parameters at the host's rate. The lowering carries
    them to the launches, where bonsai-predict-step simulates the scheduled step with them.
    A target without compute and memory rates (the CPU) gets none, and neither does a
    function with copies or host updates on a target without the link's or the host's rate.
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Target profile whose rates the estimates use (a named GPU)">,
    Option<"hostUpdateRate", "host-update-rate", "double", /*default=*/"0",
           "The host's optimizer rate in G parameters/s (0: the target profile's)">,
  ];
}

//===----------------------------------------------------------------------===//
// Plan passes (on bonsai_plan.step)
//===----------------------------------------------------------------------===//

def BonsaiPredictStepPass : Pass<"bonsai-predict-step", "::mlir::ModuleOp"> {
  let summary = "Predict how long a planned step takes on the target, offloaded work included";
  let description = [{
    Runs on each planned `bonsai_plan.step` (after bonsai-schedule and bonsai-plan-memory)
    whose launches carry their seconds (`bonsai.seconds`, from bonsai-time-ops): simulates the
    step as the runtime runs it (bonsai/Analysis/StepSimulation.h, docs/offload.md "Predicted
    step time"): each launch on its stream in plan order, waiting for the launches of other
    streams whose bytes it shares (the runtime's stream order, from the memory plan), the
    copies of one direction sharing the link's bandwidth that way, the streams joined at the
    end of each phase, the forward and backward phases once per micro-batch. It records the
    prediction on the step (`bonsai.predicted_step_seconds`, `bonsai.predicted_exposed_seconds`:
    what the copies and the host add to the compute stream's kernels), which the plan carries
    (bonsai-run compares it with the measured step) and bonsai-compile's report prints, and
    drops the launches' seconds. A step without them (a target without rates) gets none.
    The `target` profile gives how the host's memory is shared between the link and the
    host's optimizer (StepSimulation.h's contention).
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Target profile of the contention figures (the one bonsai-time-ops used)">,
  ];
}

def BonsaiSchedulePass : Pass<"bonsai-schedule", "::mlir::ModuleOp"> {
  let summary = "Fix each step's schedule: declarations first, launches on streams";
  let description = [{
    A step's work ops run in the order they appear: that order is the step's meaning, and the
    lowering emits it in the SSA order of the model, a topological order of its dataflow. This
    pass moves every arena, buffer and view above the first work op (keeping their order, so
    views follow their sources), so that liveness can be computed from work positions alone,
    and puts every launch on a stream: the host-offload copies (launches between a pinned
    host and a device arena) on the host-to-device (1) or device-to-host (2) copy stream, a
    launch over pinned host memory only (an update that runs on the host) on the host stream
    (3), everything else on the compute stream (0). With `overlap`, the exchanges with other
    ranks (bonsai-shard's all-gathers, reduce-scatters and all-reduces) run on the
    collectives stream (5), each forward and backward all-gather moved up to just after the
    first reader of the all-gather `prefetch-distance` gathers before it (the next layers'
    weights arrive while the compute stream works on this one); and the copy back to the
    device of what a host update wrote gets a stream of its own (4): on the copy stream it
    would hold up every copy issued after it (the streamed updates' state) until the CPU is
    done, and on the host stream the next host update.

    With `overlap` (the default), the host-to-device copies an op reads move up, within
    their phase, to just after the op that read the previous such group: one update ahead,
    so that the transfer runs beside that update, the previous state's copies back and the
    compute between them. A `bonsai_plan.retain` of each device-to-host copy's source, before
    the next group's reader (or at the end of the phase), keeps the memory planner from
    giving those bytes to compute launches while the copy may still read them. The runtime
    derives every wait between streams from the bytes the kernels touch (docs/offload.md,
    "Overlap"), so this order is a performance choice, not a correctness one. Without
    `overlap`, every launch but the host updates stays in order on the compute stream.

    The prefetch distance (`prefetch-distance`, 0 by default: from the cost model) is chosen
    per step where the launches carry bonsai-time-ops' seconds and `target` names a profile:
    a copy of the step is scheduled with each distance of 1, 2, 3, 4, 6, 8, 12 and 16 gathers,
    planned and simulated as bonsai-plan-memory and bonsai-predict-step will, and the smallest
    distance whose predicted step is within 0.5% of the fastest that fits the step's device
    budget is taken (a deeper prefetch keeps more gathered weights live). Otherwise one
    gather ahead. The remark lists what was weighed.

    ```mlir
    bonsai_plan.launch "adamw_update" ... {phase = 2 : i32}
    bonsai_plan.launch "copy_h2d" ins(%m1) outs(%m1_dev) {phase = 2 : i32, stream = 1 : i64}
    bonsai_plan.launch "copy_d2h" ins(%m0_dev) outs(%m0) {phase = 2 : i32, stream = 2 : i64}
    bonsai_plan.retain %m0_dev : memref<16x8xf32>
    bonsai_plan.launch "adamw_update" ins(..., %m1_dev, ...) ...
    ```
  }];
  let options = [
    Option<"overlap", "overlap", "bool", /*default=*/"true",
           "issue the host-offload copies on copy streams, one update ahead, and the "
           "collectives on a stream of their own, the all-gathers ahead of their readers">,
    Option<"prefetchDistance", "prefetch-distance", "unsigned", /*default=*/"0",
           "how many all-gathers ahead each is issued (0: the distance whose predicted step "
           "is shortest, weighed on `target`; one ahead where the step is not timed)">,
    Option<"target", "target", "std::string", /*default=*/"\"\"",
           "target profile whose step time weighs the prefetch distance (none: one ahead)">,
  ];
  let statistics = [
    Statistic<"numPrefetched", "num-prefetched",
              "groups of host-to-device copies issued ahead of their reader">,
    Statistic<"numRetained", "num-retained",
              "device-to-host copy sources kept from reuse while the copy may read them">,
    Statistic<"numPrefetchedGathers", "num-prefetched-gathers",
              "all-gathers issued ahead of their reader">,
  ];
  let dependentDialects = ["::mlir::bonsai::plan::PlanDialect"];
}

def BonsaiPlanMemoryPass : Pass<"bonsai-plan-memory", "::mlir::ModuleOp"> {
  let summary = "Assign every buffer an offset in its arena and size the arenas";
  let description = [{
    Liveness over the schedule: a buffer of a per-step arena is live from the first launch
    that touches it (through any view) to the last; inputs are live from the start (the data
    loader writes them before the step) and the loss to the end (the runtime reads it after).
    Per-step arenas are planned by greedy-by-size with best fit (see MemoryPlanner.h);
    persistent arenas hold their buffers one after another. Arena sizes are set to the peaks.
    A step over its `device_memory` budget is an error that says by how much and which class
    of memory dominates.
  }];
  let statistics = [
    Statistic<"numBuffers", "buffers", "Buffers placed">,
    Statistic<"bytesSaved", "bytes-saved",
              "Bytes saved by reusing memory across lifetimes (per-step arenas)">,
  ];
}

def BonsaiVerifyPlanPass : Pass<"bonsai-verify-plan", "::mlir::ModuleOp"> {
  let summary = "Check a planned step independently of the planner";
  let description = [{
    Recomputes liveness from the launches (its own code, not the planner's) and checks that
    every buffer is placed inside its arena, that no two buffers of an arena that are live at
    the same time share a byte (persistent buffers are always live), and that every buffer a
    launch reads is a parameter, an input, or was written by an earlier launch. Each problem is
    an error naming the buffers and launches involved.
  }];
}

def BonsaiShardPass : Pass<"bonsai-shard", "::mlir::ModuleOp"> {
  let summary = "Shard training state over data-parallel ranks (ZeRO-1/2/3) and insert the "
                "collectives that keep the ranks' steps equal to one large-batch step";
  let description = [{
    Carries out the recipe's `bonsai.shard "zero1" | "zero2" | "zero3" ranks N` directive after
    bonsai-optimizer (docs/sharding.md). Every rank runs the step on its own micro-batches;
    the runtime seeds each backward pass with 1 / (micro-batches x N), so that the gradients
    summed over the ranks are those of the mean loss over all of them. Shards are flat: rank r
    holds elements [r n, (r + 1) n) of a tensor's row-major elements, n = numel / N
    (`#bonsai.sharding<ranks = N, shape = [...]>` on the sharded `bonsai.param` or
    `bonsai.state`, whose type becomes `tensor<n x T>`).

    - `zero1`: the optimizer state (moments, momentum, fp32 masters) is sharded. In the
      update phase each gradient accumulator is reduce-scattered (`bonsai.reduce_scatter`),
      the rank's share of the parameter is copied out (`bonsai.shard_slice`), updated, and
      gathered back into the whole parameter on every rank (`bonsai.all_gather_into`).
    - `zero2`: the gradient accumulators are sharded too: each weight gradient is
      reduce-scattered as the backward pass produces it, and the rank accumulates its share.
    - `zero3`: the parameters are sharded too: each is gathered whole (`bonsai.all_gather`)
      before its first use in the forward pass and again before its first use in the backward
      pass; the gathered tensors live until their last use. Frozen parameters are sharded and
      gathered alike, except NF4 storage, which stays whole on every rank (a remark counts it).

    An update that is not elementwise (GaLore's, which projects whole matrices) keeps its
    parameter and state whole on every rank, as plain data parallelism does: its accumulator
    is reduce-scattered in the update phase and gathered back whole for it. The gradient norm
    (for clipping and the metrics) is each rank's norm of its shares combined over the ranks
    (`bonsai.all_reduce` "l2"). Every created op gets the phase of
    where it runs. The function gets `bonsai.ranks` and `bonsai.shard_strategy`, which the
    lowering puts on the plan.

    Errors name the cause: a parameter whose element count N does not divide, an update this
    pass cannot shard, a recipe that combines sharding with what it does not compose with yet
    (FP8, updates in the backward pass).
  }];
  let statistics = [
    Statistic<"numSharded", "sharded", "Tensors sharded">,
  ];
}

def BonsaiFp8Pass : Pass<"bonsai-fp8", "::mlir::ModuleOp"> {
  let summary = "Run the recipe's linears as FP8 GEMMs with delayed scaling, where the target "
                "has FP8 tensor cores";
  let description = [{
    Carries out the recipe's `bonsai.fp8` directive (docs/fp8.md) after bonsai-optimizer, when
    each targeted linear has its backward GEMMs and the step has its update phase. A target
    whose profile has FP8 tensor cores (sm_89, sm_90 and later) gets the rewrite; any other
    (sm_80, sm_86, the CPU) keeps every linear as it is and says so in a remark, so that one
    recipe compiles for every target.

    The directive's patterns name weights as bonsai-insert-lora's do; `targets []` means every
    linear except the LM head (a linear whose result reaches `bonsai.cross_entropy` as its
    logits, through views) and any linear whose weight an embedding also reads (a tied
    embedding). For each targeted linear `y = linear(x, W[, b])` the pass finds its backward:
    the `linear_grad_input(dy, W)` whose result has x's type, and the `linear_grad_weight(dy,
    x)` reading the same dy; without a `linear_grad_input` (x needs no gradient), the only
    `linear_grad_weight` of x with W's type. It creates the state `<weight name>.fp8` (optimizer
    state, f32 [3, 4 + amax_history], saved in checkpoints), replaces the three GEMMs with
    `fp8_linear`, `fp8_linear_grad_input` and `fp8_linear_grad_weight`, and adds an
    `fp8_update_scales` to the update phase, before the step counter's increment.

    A targeted linear that cannot run in FP8 keeps its GEMMs, with a remark naming the reason:
    M (positions), N or K not a multiple of 16, an element type other than f32, bf16 or f16, a
    weight read by another linear, a backward that cannot be told apart. A summary remark
    counts the linears in FP8.

    Before (`bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["up_proj"]`, sm_90):
    ```mlir
    %y = bonsai.linear %x, %w
    %dx = bonsai.linear_grad_input %dy, %w
    %dw = bonsai.linear_grad_weight %dy, %x
    bonsai.step_increment %step {bonsai.phase = "update"}
    ```
    After:
    ```mlir
    %s = bonsai.state optimizer "model.layers.0.mlp.up_proj.weight.fp8" : tensor<3x20xf32>
    %y, %ys, %yw = bonsai.fp8_linear %x, %w, %s {current = false, margin = 0 : i64}
    %dx, %dxs, %dxw = bonsai.fp8_linear_grad_input %dy, %w, %s {...}
    %dw, %dws, %dww = bonsai.fp8_linear_grad_weight %dy, %x, %s {...}
    bonsai.fp8_update_scales %step, %ys, %dxs, %s {...} {bonsai.phase = "update"}
    bonsai.step_increment %step {bonsai.phase = "update"}
    ```
  }];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"cpu\"",
           "Target the plan is for (sm_XX or a named GPU, docs/targets.md): FP8 GEMMs need "
           "FP8 tensor cores (sm_89 and later)">,
    Option<"perLinearRemarks", "per-linear-remarks", "bool", /*default=*/"true",
           "A remark per linear converted to FP8 (linears left in bf16 always get one)">,
  ];
  let statistics = [
    Statistic<"numFp8", "fp8-linears", "Linears converted to FP8 GEMMs">,
    Statistic<"numKept", "kept-linears", "Targeted linears left as they were">,
  ];
}

#endif // BONSAI_TRANSFORMS_PASSES_TD
