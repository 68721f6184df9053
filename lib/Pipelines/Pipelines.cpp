//===- Pipelines.cpp - The standard Bonsai compilation pipeline -----------===//
//
// Each pass is added with the reason it is where it is.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Pipelines/Pipelines.h"

#include "bonsai/Conversion/Passes.h"
#include "bonsai/Transforms/Passes.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace mlir::bonsai;

void mlir::bonsai::buildModelPipeline(OpPassManager &pm, const PipelineOptions &options) {
  // Whole-function rules first, so that every later pass can assume one named parameter per
  // checkpoint tensor, integer inputs and a scalar loss.
  pm.addPass(createBonsaiVerifyModelPass());
  // Adapters are model ops and parameters like any other: inserted before quantization (which
  // then finds their frozen base weights) and before autodiff (which differentiates them).
  // Without a bonsai.lora directive in the module the pass changes nothing.
  pm.addPass(createBonsaiInsertLoraPass());
  // NF4 storage of the recipe's frozen linear weights: after LoRA has frozen the base weights
  // it adapts, before autodiff (whose backward then reads the dequantized weights, which
  // bonsai-remat recomputes) and before lowering (NF4 buffers are sized by their layout).
  // Without a bonsai.quantize directive the pass changes nothing.
  pm.addPass(createBonsaiQuantizePass());
  // The recipe's bonsai.ring: each rank's share of the sequence, before autodiff (whose
  // backward pass then works on the share) and before the sequence is tiled (the chunks are
  // the share's). Without a bonsai.ring directive the pass changes nothing.
  BonsaiRingPassOptions ring;
  ring.target = options.profile.empty() ? options.target : options.profile;
  pm.addPass(createBonsaiRingPass(ring));
  // The recipe's bonsai.remat sequence_chunks: the MLPs become chunks of model ops (their
  // adapters and dequantized weights included) before autodiff, whose backward pass then
  // runs chunk by chunk too, and before remat, which recomputes each chunk on its own.
  // Without the option the pass changes nothing.
  pm.addPass(createBonsaiTileSequencePass());
}

/// bonsai-offload as the pipeline runs it: the recipe's classes, the summary remark only.
static BonsaiOffloadPassOptions offloadOptions(const PipelineOptions &pipeline) {
  BonsaiOffloadPassOptions options;
  options.perTensorRemarks = false;
  options.target = pipeline.profile.empty() ? pipeline.target : pipeline.profile;
  options.hostUpdateRate = pipeline.hostUpdateRate;
  return options;
}

void mlir::bonsai::buildStepPipeline(OpPassManager &pm, const PipelineOptions &options) {
  if (options.train) {
    // The backward pass is built on the verified forward graph, before any lowering, so that
    // every gradient rule sees model ops.
    pm.addPass(createBonsaiAutodiffPass());
    // The update needs the gradient accumulators the backward pass created.
    pm.addPass(createBonsaiOptimizerPass());
    // GaLore rewrites the AdamW updates the optimizer pass expanded (a no-op without a
    // bonsai.galore directive), before remat so that the budget sees the smaller moments.
    // Only the summary remark: a remark per weight is for bonsai-opt.
    BonsaiGaLorePassOptions galore;
    galore.target = options.target;
    galore.perWeightRemarks = false;
    pm.addPass(createBonsaiGaLorePass(galore));
    // FP8 GEMMs replace a linear together with its two backward GEMMs, and add a scale update
    // to the update phase: after autodiff (which creates the backward GEMMs) and the
    // optimizer (which creates the update phase and the step counter whose value indexes the
    // amax histories); before remat, so that recomputation sizes and clones the FP8 GEMMs
    // (and sees their workspaces), and before fusion, whose families then see FP8 GEMMs
    // rather than linears they would otherwise fuse. It asks the target profile: without FP8
    // tensor cores it changes nothing (a remark says so). Only the summary remark and those
    // of linears left as they were: a remark per converted linear is for bonsai-opt.
    BonsaiFp8PassOptions fp8;
    fp8.target = options.target;
    fp8.perLinearRemarks = false;
    pm.addPass(createBonsaiFp8Pass(fp8));
    // The ring's ranks sum their gradients once the update phase exists, before the passes
    // that move or recompute state (a no-op without bonsai.ring).
    pm.addPass(createBonsaiRingGradientsPass());
    // ZeRO sharding over data-parallel ranks (a no-op without a bonsai.shard directive) once
    // the update phase is complete, so that it shards every update's state; before offload,
    // which then streams the rank's shares, and before remat, whose budget is the rank's.
    pm.addPass(createBonsaiShardPass());
    // Offloaded state moves to pinned host memory once every update that keeps state exists
    // (after the optimizer, GaLore and FP8 passes), before remat, whose budget then counts
    // only the device copies, and before fusion, whose optimizer family then leaves each
    // streamed update on its own (a multi-tensor update would need every copy at once).
    // Without a bonsai.offload directive the pass changes nothing. Only the summary remark.
    pm.addPass(createBonsaiOffloadPass(offloadOptions(options)));
    // What to recompute is decided on the whole step: after the update is expanded (its state
    // is part of the peak that must fit the budget) and before lowering, so that the clones
    // are ordinary ops whose lifetimes the memory planner sees. Only the summary remark: a
    // remark per recomputed tensor is for bonsai-opt.
    BonsaiRematPassOptions remat;
    remat.policy = options.remat;
    remat.deviceMemory = options.deviceMemory;
    remat.hostMemory = options.hostMemory;
    remat.target = options.target;
    remat.profile = options.profile.empty() ? options.target : options.profile;
    remat.perValueRemarks = false;
    remat.timeLimit = options.rematTimeLimit;
    // Policy auto plans trials as the pipeline will plan the step: fused.
    remat.fuse = options.fuse;
    remat.fuseDisable.assign(options.fuseDisable.begin(), options.fuseDisable.end());
    pm.addPass(createBonsaiRematPass(remat));
  } else {
    // A step without an optimizer keeps no training state: the passes say so when the recipe
    // asks to shard or offload some, rather than the directive being dropped.
    pm.addPass(createBonsaiShardPass());
    pm.addPass(createBonsaiOffloadPass(offloadOptions(options)));
  }
  // Fusion sees the whole step (forward, backward, update and the recomputed clones) and runs
  // before lowering, so that the memory planner sizes what the fused kernels keep, not what
  // they avoid materialising. Only the summary remark: a remark per site is for bonsai-opt.
  if (options.fuse) {
    BonsaiFusePassOptions fuse;
    fuse.target = options.target;
    fuse.perSiteRemarks = false;
    fuse.disable.assign(options.fuseDisable.begin(), options.fuseDisable.end());
    pm.addPass(createBonsaiFusePass(fuse));
    // The fused elementwise regions are compiled while they are still regions (lowering
    // keeps only the launch): a program for every target, PTX for a GPU.
    BonsaiGenerateElementwiseKernelsPassOptions kernels;
    kernels.target = options.target;
    pm.addPass(createBonsaiGenerateElementwiseKernelsPass(kernels));
  }
  // The saved activations bonsai-remat chose to offload get their copies once fusion has
  // matched the graph without them, so that the fused step computes what it would without
  // offload (a no-op unless the recipe offloads activations). Only the summary remark.
  if (options.train)
    pm.addPass(createBonsaiOffloadActivationsPass());
  // Each op's time on the target, estimated on the step as it will run (recomputed clones and
  // fused kernels included), for the prediction of the scheduled step below.
  if (options.train) {
    BonsaiTimeOpsPassOptions timing;
    timing.target = options.profile.empty() ? options.target : options.profile;
    timing.hostUpdateRate = options.hostUpdateRate;
    pm.addPass(createBonsaiTimeOpsPass(timing));
  }
  // Tensors become buffers and ops become launches; the recipe's target is recorded so that
  // the memory planner can hold the step to its budget.
  BonsaiLowerToPlanPassOptions lower;
  lower.target = options.target;
  lower.deviceMemory = options.deviceMemory;
  lower.hostMemory = options.hostMemory;
  lower.microBatches = options.microBatches;
  pm.addPass(createBonsaiLowerToPlanPass(lower));
  // Liveness is defined over the schedule, so the order is fixed before memory is planned
  // (and the prefetched copies' buffers live from where they are issued).
  // The all-gathers' prefetch distance is weighed on the step time, where the ops are timed.
  BonsaiSchedulePassOptions schedule;
  schedule.overlap = options.overlapCopies;
  schedule.target = options.profile.empty() ? options.target : options.profile;
  schedule.prefetchDistance = options.prefetchDistance;
  pm.addPass(createBonsaiSchedulePass(schedule));
  pm.addPass(createBonsaiPlanMemoryPass());
  // The step time on the target: the scheduled step on its streams, with the waits the memory
  // plan makes (docs/offload.md, "Predicted step time").
  if (options.train) {
    BonsaiPredictStepPassOptions predict;
    predict.target = options.profile.empty() ? options.target : options.profile;
    pm.addPass(createBonsaiPredictStepPass(predict));
  }
  // An independent check of the planner's result: a plan that overlaps live buffers would
  // corrupt training silently, so it must never reach a file.
  pm.addPass(createBonsaiVerifyPlanPass());
}

void mlir::bonsai::buildCompilePipeline(OpPassManager &pm, const PipelineOptions &options) {
  buildModelPipeline(pm, options);
  buildStepPipeline(pm, options);
}

void mlir::bonsai::registerPipelines() {
  PassPipelineRegistration<PipelineOptions>(
      "bonsai-compile-pipeline",
      "Lower a model to a scheduled, memory-planned and verified bonsai_plan.step",
      buildCompilePipeline);
}
