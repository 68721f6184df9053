//===- PlanPrinter.cpp - A compiled plan as readable text -----------------===//
//
// Attribute tables print through one overload per struct of KernelAttrs.h; a table without an
// overload (a new one) prints its kind's name only, so adding a table never breaks the
// printer. The checkpoint line is checkpointSize's: the bytes a checkpoint of the plan writes,
// and for an adapter plan the frozen base it leaves out.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/PlanPrinter.h"

#include "bonsai/runtime/Checkpoint.h"

#include <cinttypes>
#include <cstdio>
#include <type_traits>

namespace bonsai::rt {

namespace {

std::string number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", value);
  return buf;
}

std::string flag(bool value) { return value ? "true" : "false"; }

std::string mib(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / (1024.0 * 1024.0));
  return buf;
}

/// "name = value" pairs of one attribute table.
std::string fields(const KernelAttrsInfo &attrs) {
  return std::visit(
      [](const auto &a) -> std::string {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, NoAttrs>)
          return "";
        else if constexpr (std::is_same_v<T, NormAttrs>)
          return "epsilon = " + number(a.epsilon);
        else if constexpr (std::is_same_v<T, RoPEAttrs>)
          return "theta = " + number(a.theta);
        else if constexpr (std::is_same_v<T, AttentionAttrs>)
          return "causal = " + flag(a.causal) + ", scale = " + number(a.scale);
        else if constexpr (std::is_same_v<T, GeLUAttrs>)
          return std::string("approximation = ") + (a.tanh ? "tanh" : "none");
        else if constexpr (std::is_same_v<T, AxisAttrs>)
          return "axis = " + std::to_string(a.axis);
        else if constexpr (std::is_same_v<T, CrossEntropyAttrs>)
          return "ignore_index = " + std::to_string(a.ignoreIndex);
        else if constexpr (std::is_same_v<T, LinearCrossEntropyAttrs>)
          return "ignore_index = " + std::to_string(a.ignoreIndex) +
                 ", chunk_rows = " + std::to_string(a.chunkRows);
        else if constexpr (std::is_same_v<T, TransposeAttrs>)
          return "permutation = " + formatShape(a.permutation);
        else if constexpr (std::is_same_v<T, SliceAttrs>)
          return "axis = " + std::to_string(a.axis) + ", start = " + std::to_string(a.start);
        else if constexpr (std::is_same_v<T, FillAttrs>)
          return "value = " + number(a.value);
        else if constexpr (std::is_same_v<T, DoraScaleAttrs>)
          return "scale = " + number(a.scale);
        else if constexpr (std::is_same_v<T, LearningRateAttrs>)
          return "lr = " + number(a.lr) + ", schedule = " + (a.cosine ? "cosine" : "constant") +
                 ", warmup_steps = " + std::to_string(a.warmupSteps) +
                 ", total_steps = " + std::to_string(a.totalSteps) +
                 ", min_lr_ratio = " + number(a.minLrRatio);
        else if constexpr (std::is_same_v<T, GaloreAdamWAttrs>)
          return "beta1 = " + number(a.beta1) + ", beta2 = " + number(a.beta2) +
                 ", eps = " + number(a.eps) + ", weight_decay = " + number(a.weightDecay) +
                 ", grad_clip = " + number(a.gradClip) + ", scale = " + number(a.scale) +
                 ", left = " + flag(a.left);
        else if constexpr (std::is_same_v<T, AdamWAttrs>)
          return "beta1 = " + number(a.beta1) + ", beta2 = " + number(a.beta2) +
                 ", eps = " + number(a.eps) + ", weight_decay = " + number(a.weightDecay) +
                 ", grad_clip = " + number(a.gradClip);
        else if constexpr (std::is_same_v<T, SGDAttrs>)
          return "momentum = " + number(a.momentum) + ", weight_decay = " +
                 number(a.weightDecay) + ", grad_clip = " + number(a.gradClip);
        else if constexpr (std::is_same_v<T, GaloreRefreshAttrs>)
          return "rank = " + std::to_string(a.rank) +
                 ", update_proj_gap = " + std::to_string(a.updateProjGap) +
                 ", left = " + flag(a.left) + ", randomized = " + flag(a.randomized);
        else if constexpr (std::is_same_v<T, GaloreProjectAttrs>)
          return "left = " + flag(a.left) + ", bf16_operands = " + flag(a.bf16Operands);
        else if constexpr (std::is_same_v<T, GeneratedKernelAttrs>)
          return "generated_kernel = " + std::to_string(a.kernel);
        else if constexpr (std::is_same_v<T, Fp8Attrs>)
          return "current = " + flag(a.current) + ", margin = " + std::to_string(a.margin) +
                 ", fast_accumulation = " + flag(a.fastAccumulation);
        else
          return "...";
      },
      attrs);
}

std::string operands(const std::vector<uint32_t> &indices) {
  std::string s;
  for (size_t i = 0; i < indices.size(); ++i)
    s += (i ? ", %" : "%") + std::to_string(indices[i]);
  return "(" + s + ")";
}

/// " after #3, #9": the kernels of other streams a kernel waits for.
std::string waitsText(const std::vector<uint32_t> &waits) {
  std::string s;
  for (size_t i = 0; i < waits.size(); ++i)
    s += (i ? ", #" : " after #") + std::to_string(waits[i]);
  return s;
}

} // namespace

std::string formatKernelAttrs(const KernelInfo &kernel) {
  std::string f = fields(kernel.attrs);
  return f.empty() ? f : "{" + f + "}";
}

std::string printPlan(const LoadedPlan &plan) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line,
                "plan %s: version %u, model %s, target %s, %zu arenas, %zu tensors, %zu kernels\n",
                plan.path.c_str(), plan.version, plan.model.empty() ? "(unnamed)" : plan.model.c_str(),
                plan.targetArch.empty() ? "(none)" : plan.targetArch.c_str(), plan.arenas.size(),
                plan.tensors.size(), plan.kernels.size());
  s += line;
  s += "inputs:";
  for (uint32_t i : plan.inputs)
    s += " %" + std::to_string(i) + " '" + plan.tensors[i].name + "'";
  s += "; loss %" + std::to_string(plan.loss) + "; vocabulary " + std::to_string(plan.vocabSize) +
       "; " + std::to_string(plan.tokensPerStep) + " tokens per micro-batch, " +
       std::to_string(plan.microBatches) + " micro-batch" + (plan.microBatches == 1 ? "" : "es") +
       " per step\n";
  for (size_t a = 0; a < plan.arenas.size(); ++a) {
    const ArenaInfo &arena = plan.arenas[a];
    std::snprintf(line, sizeof line,
                  "arena %zu '%s': %s, %s, %" PRIu64 " bytes (%s), alignment %" PRIu64 "\n", a,
                  arena.name.c_str(), arena.lifetime == Lifetime::Persistent ? "persistent" : "step",
                  arena.space == MemorySpace::Device ? "device" : "pinned host", arena.size,
                  mib(arena.size).c_str(), arena.alignment);
    s += line;
  }
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    std::string extra;
    if (t.trainable)
      extra += " trainable";
    if (t.init == TensorInit::Zeros)
      extra += " init zeros";
    else if (t.init == TensorInit::CopyOf)
      extra += " init copy of %" + std::to_string(t.initSource);
    else if (t.init == TensorInit::KaimingUniform)
      extra += " init kaiming-uniform";
    else if (t.init == TensorInit::RowNorm)
      extra += " init row-norm of %" + std::to_string(t.initSource);
    if (t.dtype == DType::NF4 || t.nf4Share())
      extra += std::string(t.nf4Share() ? " share of nf4 storage" : "") + " block " +
               std::to_string(t.quantBlock) + " double-block " + std::to_string(t.quantDoubleBlock);
    std::snprintf(line, sizeof line,
                  "tensor %%%zu '%s': %s %s %s%s, arena %u [%" PRIu64 ", %" PRIu64 ") %" PRIu64
                  " bytes\n",
                  i, t.name.c_str(), dtypeName(t.dtype), formatShape(t.shape).c_str(),
                  tensorRoleName(t.role), extra.c_str(), t.arena, t.offset, t.offset + t.bytes,
                  t.bytes);
    s += line;
  }
  for (size_t k = 0; k < plan.kernels.size(); ++k) {
    const KernelInfo &kernel = plan.kernels[k];
    std::string attrs = formatKernelAttrs(kernel);
    s += "kernel #" + std::to_string(k) + " " + phaseName(kernel.phase) + " " +
         kernelKindName(kernel.kind) + " " + operands(kernel.inputs) + " -> " +
         operands(kernel.outputs) + (attrs.empty() ? "" : " " + attrs) +
         (kernel.stream != StreamId::Compute
              ? std::string(" on the ") + streamName(kernel.stream) + " stream"
              : std::string()) +
         waitsText(kernel.waits) + (kernel.name.empty() ? "" : "  // " + kernel.name) + "\n";
  }
  for (const AdapterInfo &a : plan.adapters)
    s += std::string("adapter ") + (a.magnitude ? "DoRA" : "LoRA") + " r" +
         std::to_string(a.rank) + " alpha " + number(a.alpha) + " on '" + a.module + "': base %" +
         std::to_string(a.base) + ", A %" + std::to_string(a.loraA) + ", B %" +
         std::to_string(a.loraB) +
         (a.magnitude ? ", magnitude %" + std::to_string(*a.magnitude) : std::string()) + "\n";
  const MemorySummaryInfo &m = plan.memory;
  s += "memory: weights " + mib(m.weights) + ", gradients " + mib(m.gradients) +
       ", optimizer state " + mib(m.optimizerState) + ", activations " + mib(m.activations) +
       ", workspace " + mib(m.workspace) + ", inputs " + mib(m.inputs) + "; peak device " +
       mib(m.peakDevice) + ", peak host " + mib(m.peakHost) + "\n";
  CheckpointSize c = checkpointSize(plan);
  uint64_t total = c.modelBytes + c.optimizerBytes;
  std::snprintf(line, sizeof line,
                "checkpoint: %" PRIu64 " bytes (%s): model %" PRIu64 " bytes (%" PRIu64
                " tensors), optimizer %" PRIu64 " bytes (%" PRIu64 " tensors)",
                total, mib(total).c_str(), c.modelBytes, c.modelTensors, c.optimizerBytes,
                c.optimizerTensors);
  s += line;
  if (c.frozenTensors > 0) {
    std::snprintf(line, sizeof line,
                  "; adapter checkpoint: the frozen base, %" PRIu64 " bytes (%s, %" PRIu64
                  " tensors), is left out; the checkpoint is %.2f%% of it",
                  c.frozenBytes, mib(c.frozenBytes).c_str(), c.frozenTensors,
                  100.0 * double(total) / double(c.frozenBytes));
    s += line;
  }
  s += "\n";
  return s;
}

} // namespace bonsai::rt
