//===- Pipelines.h - The standard Bonsai compilation pipeline --*- C++ -*-===//
//
// The pipeline bonsai-compile runs, built from options (normally taken from a recipe), and
// its registration for bonsai-opt as `--bonsai-compile-pipeline`.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_PIPELINES_PIPELINES_H
#define BONSAI_PIPELINES_PIPELINES_H

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir::bonsai {

/// Options of the standard pipeline.
struct PipelineOptions : public PassPipelineOptions<PipelineOptions> {
  PassOptions::Option<std::string> target{*this, "target",
                                          llvm::cl::desc("cpu, sm_80, sm_86, sm_89, sm_90"),
                                          llvm::cl::init("cpu")};
  PassOptions::Option<std::string> profile{
      *this, "profile",
      llvm::cl::desc("The named target profile (h200, rtx4090, ...) whose rates cost-based "
                     "choices weigh (default: target)"),
      llvm::cl::init("")};
  PassOptions::Option<int64_t> deviceMemory{
      *this, "device-memory", llvm::cl::desc("Per-device memory budget in bytes (0: none)"),
      llvm::cl::init(0)};
  PassOptions::Option<int64_t> hostMemory{
      *this, "host-memory",
      llvm::cl::desc("Pinned host memory budget per process in bytes (0: none)"),
      llvm::cl::init(0)};
  PassOptions::Option<bool> train{
      *this, "train",
      llvm::cl::desc("Compile a training step: backward pass and the recipe's optimizer"),
      llvm::cl::init(false)};
  PassOptions::Option<std::string> remat{
      *this, "remat",
      llvm::cl::desc("Activation recomputation when training: none, full, selective or auto "
                     "(default: the recipe's bonsai.remat; without one, auto when there is a "
                     "budget, else none)"),
      llvm::cl::init("")};
  PassOptions::Option<double> rematTimeLimit{
      *this, "remat-time-limit",
      llvm::cl::desc("Seconds remat's auto search may take (0: no limit)"), llvm::cl::init(0)};
  PassOptions::Option<bool> fuse{
      *this, "fuse",
      llvm::cl::desc("Replace chains of ops with fused kernels (bonsai-fuse); false compiles "
                     "every op as its own kernel"),
      llvm::cl::init(true)};
  PassOptions::ListOption<std::string> fuseDisable{
      *this, "fuse-disable",
      llvm::cl::desc("Fusion families to leave out (names as in docs/fusion.md)")};
  PassOptions::Option<bool> overlapCopies{
      *this, "overlap-copies",
      llvm::cl::desc("Issue the host-offload copies on copy streams, one update ahead "
                     "(bonsai-schedule's overlap); false keeps them in order on the compute "
                     "stream"),
      llvm::cl::init(true)};
  PassOptions::Option<unsigned> prefetchDistance{
      *this, "gathers-ahead",
      llvm::cl::desc("How many all-gathers ahead of its reader each is issued (bonsai-schedule's "
                     "prefetch-distance); 0 weighs it on the target profile's step time"),
      llvm::cl::init(0)};
  PassOptions::Option<double> hostUpdateRate{
      *this, "host-update-rate",
      llvm::cl::desc("The host's optimizer rate in G parameters/s for bonsai.offload's update "
                     "\"auto\" (0: the target profile's)"),
      llvm::cl::init(0)};
  PassOptions::Option<int64_t> microBatches{
      *this, "micro-batches", llvm::cl::desc("Forward and backward runs per update"),
      llvm::cl::init(1)};
};

/// Model (bonsai dialect) to a scheduled, memory-planned and verified bonsai_plan.step; with
/// `train`, the step also runs the backward pass and the recipe's optimizer, and recomputes
/// activations as `remat` says (to fit `deviceMemory` under policy auto).
void buildCompilePipeline(OpPassManager &pm, const PipelineOptions &options);

/// The first part of buildCompilePipeline: verification and the recipe's rewrites of the model
/// itself (adapters, NF4 quantization), after which the model is what the step trains and what
/// a cost report describes.
void buildModelPipeline(OpPassManager &pm, const PipelineOptions &options);

/// The rest of buildCompilePipeline: backward pass, optimizer, recomputation, lowering,
/// scheduling, memory planning and the plan's verification.
void buildStepPipeline(OpPassManager &pm, const PipelineOptions &options);

/// Registers `--bonsai-compile-pipeline` with the pass registry.
void registerPipelines();

} // namespace mlir::bonsai

#endif // BONSAI_PIPELINES_PIPELINES_H
