//===- TestPlans.h - Hand-built plans for the runtime's unit tests --------===//
//
// Tests describe a plan as plain structs (arenas, tensors, kernels) and serialize it with
// FlatBufferBuilder exactly as the compiler's emitter would, so they can plant one mistake at a
// time. `smallPlanSpec()` is the reference model of the tests: embedding -> rms_norm -> linear ->
// cross_entropy over views of the logits and labels. `trainingPlanSpec()` is the same model
// trained: its backward kernels, gradient accumulators, and an AdamW update (optionally bf16
// parameters with fp32 master weights).
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TEST_RUNTIME_TESTPLANS_H
#define BONSAI_TEST_RUNTIME_TESTPLANS_H

#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Tensor.h"
#include "bonsai/runtime/plan_generated.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

namespace bonsai::rt::test {

/// An arena of a test plan.
struct ArenaSpec {
  std::string name;
  Lifetime lifetime = Lifetime::Step;
  uint64_t size = 0;
  uint64_t alignment = 256;
  MemorySpace space = MemorySpace::Device;
};

/// A tensor of a test plan; `bytes` is computed from shape and dtype unless set.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::Activation;
  uint32_t arena = 0;
  uint64_t offset = 0;
  int64_t bytes = -1;
  bool trainable = false;
  TensorInit init = TensorInit::None;
  uint32_t initSource = 0;
  uint32_t quantBlock = 0;       ///< NF4: elements per block
  uint32_t quantDoubleBlock = 0; ///< NF4: blocks per double-quantization group
  uint32_t shardRanks = 0;       ///< Sharded over ranks (docs/sharding.md); 0: whole.
  std::vector<int64_t> fullShape; ///< The whole tensor's shape, for a sharded one.
};

/// A kernel of a test plan; `attrs` builds the union member, of type `attrsType`.
struct KernelSpec {
  KernelKind kind = KernelKind::Copy;
  std::vector<uint32_t> inputs;
  std::vector<uint32_t> outputs;
  bonsai::plan::KernelAttrs attrsType = bonsai::plan::KernelAttrs::NONE;
  std::function<flatbuffers::Offset<void>(flatbuffers::FlatBufferBuilder &)> attrs;
  std::string name;
  Phase phase = Phase::Forward;
  /// StreamId: 0 compute, 1 and 2 the copy streams, 3 the host, 5 the collectives.
  uint8_t stream = 0;
};

/// An adapter of a test plan (plan.fbs's Adapter: tensor indices, magnitude -1 for LoRA).
struct AdapterSpec {
  int64_t base = 0, loraA = 0, loraB = 0;
  int32_t magnitude = -1;
  uint32_t rank = 0;
  double alpha = 0;
  std::string module;
};

/// A generated kernel of a test plan (plan.fbs's GeneratedKernel), written field by field so
/// that tests can plant malformed programs.
struct GeneratedKernelSpec {
  std::string name = "fused_elementwise_0";
  std::vector<DType> inputs;
  std::vector<ElementwiseInstruction> instructions;
  std::vector<uint16_t> outputs;
  std::string ptx;
  std::string arch;
};

/// A whole test plan.
struct PlanSpec {
  uint32_t version = kPlanVersion;
  std::string model = "test";
  std::string arch = "cpu";
  /// Target.link_gb_per_s, predicted_step_s, predicted_exposed_s.
  double linkGBs = 0, predictedStepSeconds = 0, predictedExposedSeconds = 0;
  std::vector<ArenaSpec> arenas;
  std::vector<TensorSpec> tensors;
  std::vector<KernelSpec> kernels;
  std::vector<uint32_t> inputs;
  uint32_t loss = 0;
  uint64_t tokensPerStep = 0;
  uint32_t microBatches = 1;
  uint64_t vocabSize = 0;
  std::vector<AdapterSpec> adapters;
  std::vector<std::string> adapterTargets;
  std::vector<GeneratedKernelSpec> generatedKernels;
  /// Plan.ranks and Plan.shard_strategy (docs/sharding.md).
  uint32_t ranks = 0;
  std::string shardStrategy;
  /// Plan.ring_ranks (docs/ring-attention.md).
  uint32_t ringRanks = 0;
  /// The phase of the kernels `kernel` appends.
  Phase phase = Phase::Forward;

  /// Appends a tensor at the next 64-byte boundary of `arena`, growing the arena; returns its
  /// index.
  uint32_t add(const std::string &name, DType dtype, std::vector<int64_t> shape,
               TensorRole role, uint32_t arena) {
    uint64_t numel = 1;
    for (int64_t d : shape)
      numel *= uint64_t(d);
    uint64_t offset = (arenas[arena].size + 63) / 64 * 64;
    uint64_t bytes = numel * dtypeSize(dtype);
    arenas[arena].size = offset + bytes;
    TensorSpec t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.role = role;
    t.arena = arena;
    t.offset = offset;
    t.bytes = int64_t(bytes);
    t.trainable = role == TensorRole::Parameter;
    tensors.push_back(std::move(t));
    return uint32_t(tensors.size() - 1);
  }

  /// add(), with an initializer.
  uint32_t addInit(const std::string &name, DType dtype, std::vector<int64_t> shape,
                   TensorRole role, uint32_t arena, TensorInit init, uint32_t source = 0) {
    uint32_t t = add(name, dtype, std::move(shape), role, arena);
    tensors[t].init = init;
    tensors[t].initSource = source;
    return t;
  }

  /// Appends a view of tensor `of`: same arena and offset, another shape (and dtype).
  uint32_t view(const std::string &name, uint32_t of, std::vector<int64_t> shape,
                TensorRole role = TensorRole::Activation) {
    TensorSpec t = tensors[of];
    t.name = name;
    t.shape = std::move(shape);
    t.role = role;
    t.bytes = -1;
    t.trainable = false;
    t.init = TensorInit::None;
    tensors.push_back(t);
    return uint32_t(tensors.size() - 1);
  }

  /// Appends a kernel; returns its index.
  size_t kernel(KernelKind kind, std::vector<uint32_t> in, std::vector<uint32_t> out,
                bonsai::plan::KernelAttrs attrsType = bonsai::plan::KernelAttrs::NONE,
                std::function<flatbuffers::Offset<void>(flatbuffers::FlatBufferBuilder &)> attrs = {}) {
    kernels.push_back({kind, std::move(in), std::move(out), attrsType, std::move(attrs),
                       std::string("k") + std::to_string(kernels.size()), phase});
    return kernels.size() - 1;
  }
};

inline auto normAttrs(double eps) {
  return [eps](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateNormAttrs(b, eps).Union();
  };
}
inline auto ropeAttrs(double theta) {
  return [theta](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateRoPEAttrs(b, theta).Union();
  };
}
inline auto attentionAttrs(bool causal, double scale, uint32_t ringRanks = 0) {
  return [causal, scale, ringRanks](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateAttentionAttrs(b, causal, scale, ringRanks).Union();
  };
}
inline auto geluAttrs(bool tanh) {
  return [tanh](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateGeLUAttrs(b, tanh).Union();
  };
}
inline auto axisAttrs(int axis) {
  return [axis](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateAxisAttrs(b, axis).Union();
  };
}
inline auto crossEntropyAttrs(int64_t ignoreIndex) {
  return [ignoreIndex](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateCrossEntropyAttrs(b, ignoreIndex).Union();
  };
}
inline auto transposeAttrs(std::vector<int64_t> perm) {
  return [perm](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateTransposeAttrsDirect(b, &perm).Union();
  };
}
inline auto sliceAttrs(int axis, int64_t start) {
  return [axis, start](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateSliceAttrs(b, axis, start).Union();
  };
}

inline auto fillAttrs(double value) {
  return [value](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateFillAttrs(b, value).Union();
  };
}
inline auto learningRateAttrs(double lr, bool cosine = false, int64_t warmup = 0, int64_t total = 0,
                              double minRatio = 0) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateLearningRateAttrs(b, lr, cosine, warmup, total, minRatio).Union();
  };
}
inline auto adamwAttrs(double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
                       double weightDecay = 0.0, double gradClip = 0.0) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateAdamWAttrs(b, beta1, beta2, eps, weightDecay, gradClip).Union();
  };
}
inline auto generatedKernelAttrs(uint32_t kernel) {
  return [kernel](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateGeneratedKernelAttrs(b, kernel).Union();
  };
}
inline auto collectiveAttrs(uint32_t ranks,
                            CollectiveReduction reduction = CollectiveReduction::Sum) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateCollectiveAttrs(
               b, ranks, static_cast<bonsai::plan::CollectiveReduction>(reduction))
        .Union();
  };
}
inline auto sgdAttrs(double momentum = 0.0, double weightDecay = 0.0, double gradClip = 0.0) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateSGDAttrs(b, momentum, weightDecay, gradClip).Union();
  };
}

/// Serializes `spec` as the compiler would, with file identifier `identifier`.
inline std::vector<uint8_t> buildPlan(const PlanSpec &spec, const char *identifier = "BNSP") {
  namespace fb = bonsai::plan;
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::Arena>> arenas;
  for (const ArenaSpec &a : spec.arenas)
    arenas.push_back(fb::CreateArenaDirect(b, a.name.c_str(), static_cast<fb::MemorySpace>(a.space),
                                           static_cast<fb::Lifetime>(a.lifetime), a.size,
                                           a.alignment));
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  for (const TensorSpec &t : spec.tensors) {
    uint64_t bytes = t.bytes >= 0 ? uint64_t(t.bytes) : 1;
    if (t.bytes < 0) {
      for (int64_t d : t.shape)
        bytes *= uint64_t(d);
      bytes *= dtypeSize(t.dtype);
    }
    tensors.push_back(fb::CreateTensorDirect(
        b, t.name.c_str(), static_cast<fb::DType>(t.dtype), &t.shape,
        static_cast<fb::TensorRole>(t.role), t.trainable, t.arena, t.offset, bytes,
        static_cast<fb::TensorInit>(t.init), t.initSource, t.quantBlock, t.quantDoubleBlock,
        t.shardRanks, t.fullShape.empty() ? nullptr : &t.fullShape));
  }
  std::vector<flatbuffers::Offset<fb::Kernel>> kernels;
  for (const KernelSpec &k : spec.kernels) {
    flatbuffers::Offset<void> attrs = k.attrs ? k.attrs(b) : flatbuffers::Offset<void>();
    kernels.push_back(fb::CreateKernelDirect(b, static_cast<fb::KernelKind>(k.kind), &k.inputs,
                                             &k.outputs, k.attrsType, attrs, k.stream,
                                             k.name.c_str(), static_cast<fb::Phase>(k.phase)));
  }
  auto target = fb::CreateTargetDirect(b, spec.arch.c_str(), 0, spec.linkGBs,
                                       spec.predictedStepSeconds, spec.predictedExposedSeconds);
  uint64_t weights = 0, activations = 0, inputs = 0;
  for (const ArenaSpec &a : spec.arenas)
    (a.lifetime == Lifetime::Persistent ? weights : activations) += a.size;
  auto memory = fb::CreateMemorySummary(b, weights, 0, 0, activations, 0, inputs, weights + activations, 0);
  std::vector<flatbuffers::Offset<fb::Adapter>> adapters;
  for (const AdapterSpec &a : spec.adapters)
    adapters.push_back(fb::CreateAdapterDirect(b, uint32_t(a.base), uint32_t(a.loraA),
                                               uint32_t(a.loraB), a.magnitude, a.rank, a.alpha,
                                               a.module.c_str()));
  std::vector<flatbuffers::Offset<flatbuffers::String>> targets;
  for (const std::string &t : spec.adapterTargets)
    targets.push_back(b.CreateString(t));
  std::vector<flatbuffers::Offset<fb::GeneratedKernel>> generated;
  for (const GeneratedKernelSpec &g : spec.generatedKernels) {
    std::vector<fb::DType> inputs;
    for (DType t : g.inputs)
      inputs.push_back(static_cast<fb::DType>(t));
    std::vector<fb::ElementwiseInstruction> instructions;
    for (const ElementwiseInstruction &i : g.instructions)
      instructions.emplace_back(static_cast<fb::ElementwiseOpcode>(i.opcode),
                                static_cast<fb::DType>(i.type), i.a, i.b, i.imm);
    auto program = fb::CreateElementwiseProgramDirect(b, &inputs, &instructions, &g.outputs);
    generated.push_back(fb::CreateGeneratedKernelDirect(
        b, g.name.c_str(), program, g.ptx.empty() ? nullptr : g.ptx.c_str(),
        g.arch.empty() ? nullptr : g.arch.c_str()));
  }
  auto plan = fb::CreatePlanDirect(
      b, spec.version, spec.model.c_str(), target, &arenas, &tensors, &kernels, &spec.inputs,
      spec.loss, memory, spec.tokensPerStep, spec.microBatches, spec.vocabSize,
      adapters.empty() ? nullptr : &adapters, targets.empty() ? nullptr : &targets,
      generated.empty() ? nullptr : &generated, spec.ranks,
      spec.shardStrategy.empty() ? nullptr : spec.shardStrategy.c_str(), spec.ringRanks);
  b.Finish(plan, identifier);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

/// Sizes of the small reference model.
struct SmallDims {
  int64_t batch = 2, seq = 4, vocab = 16, hidden = 8;
};

/// embedding -> rms_norm -> linear (lm_head) -> cross_entropy, with the cross-entropy reading
/// [B*T, V] and [B*T] views of the logits and the labels. Arena 0 holds the weights, arena 1
/// the step.
inline PlanSpec smallPlanSpec(SmallDims d = {}) {
  PlanSpec p;
  p.model = "small";
  p.arenas = {{"weights", Lifetime::Persistent, 0, 256}, {"step", Lifetime::Step, 0, 256}};
  uint32_t table = p.add("model.embed_tokens.weight", DType::F32, {d.vocab, d.hidden},
                         TensorRole::Parameter, 0);
  uint32_t norm = p.add("model.norm.weight", DType::F32, {d.hidden}, TensorRole::Parameter, 0);
  uint32_t head = p.add("lm_head.weight", DType::F32, {d.vocab, d.hidden}, TensorRole::Parameter, 0);
  uint32_t ids = p.add("ids", DType::I32, {d.batch, d.seq}, TensorRole::Input, 1);
  uint32_t labels = p.add("labels", DType::I32, {d.batch, d.seq}, TensorRole::Input, 1);
  uint32_t h = p.add("h", DType::F32, {d.batch, d.seq, d.hidden}, TensorRole::Activation, 1);
  uint32_t n = p.add("n", DType::F32, {d.batch, d.seq, d.hidden}, TensorRole::Activation, 1);
  uint32_t logits = p.add("logits", DType::F32, {d.batch, d.seq, d.vocab}, TensorRole::Activation, 1);
  uint32_t loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);
  uint32_t logits2d = p.view("logits.flat", logits, {d.batch * d.seq, d.vocab});
  uint32_t labels1d = p.view("labels.flat", labels, {d.batch * d.seq});
  p.arenas[1].size += 60; // slack: planned above what is touched
  p.kernel(KernelKind::Embedding, {table, ids}, {h});
  p.kernel(KernelKind::RMSNorm, {h, norm}, {n}, bonsai::plan::KernelAttrs::NormAttrs, normAttrs(1e-5));
  p.kernel(KernelKind::Linear, {n, head}, {logits});
  p.kernel(KernelKind::CrossEntropy, {logits2d, labels1d}, {loss},
           bonsai::plan::KernelAttrs::CrossEntropyAttrs, crossEntropyAttrs(-100));
  p.inputs = {ids, labels};
  p.loss = loss;
  p.tokensPerStep = uint64_t(d.batch * d.seq);
  p.vocabSize = uint64_t(d.vocab);
  return p;
}

/// A forward as bonsai-ring makes it over a ring of 2 ranks (docs/ring-attention.md): each
/// rank's [1, 4] share of 8-token rows, RoPE at the "positions" input, an attention of
/// ring_ranks 2 over two heads of 4, the LM head and the loss. Loads as rank r of 2.
inline PlanSpec ringPlanSpec() {
  PlanSpec p;
  p.model = "ring";
  p.ranks = 2;
  p.ringRanks = 2;
  p.arenas = {{"weights", Lifetime::Persistent, 0, 256}, {"step", Lifetime::Step, 0, 256}};
  uint32_t table = p.add("model.embed_tokens.weight", DType::F32, {16, 8}, TensorRole::Parameter, 0);
  uint32_t head = p.add("lm_head.weight", DType::F32, {16, 8}, TensorRole::Parameter, 0);
  uint32_t ids = p.add("ids", DType::I32, {1, 4}, TensorRole::Input, 1);
  uint32_t labels = p.add("labels", DType::I32, {1, 4}, TensorRole::Input, 1);
  uint32_t positions = p.add("positions", DType::I32, {1, 4}, TensorRole::Input, 1);
  uint32_t h = p.add("h", DType::F32, {1, 4, 8}, TensorRole::Activation, 1);
  uint32_t h4 = p.view("h.heads", h, {1, 4, 2, 4});
  uint32_t q = p.add("q", DType::F32, {1, 4, 2, 4}, TensorRole::Activation, 1);
  uint32_t o = p.add("o", DType::F32, {1, 4, 2, 4}, TensorRole::Activation, 1);
  uint32_t o2 = p.view("o.flat", o, {1, 4, 8});
  uint32_t logits = p.add("logits", DType::F32, {1, 4, 16}, TensorRole::Activation, 1);
  uint32_t loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);
  p.kernel(KernelKind::Embedding, {table, ids}, {h});
  p.kernel(KernelKind::RoPE, {h4, positions}, {q}, bonsai::plan::KernelAttrs::RoPEAttrs,
           ropeAttrs(10000.0));
  p.kernel(KernelKind::Attention, {q, q, h4}, {o}, bonsai::plan::KernelAttrs::AttentionAttrs,
           attentionAttrs(true, 0.5, 2));
  p.kernel(KernelKind::Linear, {o2, head}, {logits});
  p.kernel(KernelKind::CrossEntropy, {logits, labels}, {loss},
           bonsai::plan::KernelAttrs::CrossEntropyAttrs, crossEntropyAttrs(-100));
  p.inputs = {ids, labels, positions};
  p.loss = loss;
  p.tokensPerStep = 4;
  p.vocabSize = 16;
  return p;
}

/// smallPlanSpec's forward as ZeRO-3 makes it over 2 ranks (docs/sharding.md): the embedding
/// table a flat f32 shard, gathered before the lookup; the LM head an NF4 weight shared out by
/// its storage bytes (a u8 share of its 76 bytes, blocks 64 and 256), gathered into the NF4
/// tensor that Dequantize reads; the loss summed over the ranks. The collectives on the
/// collectives stream, as bonsai-schedule issues them. Loads as rank r of 2.
inline PlanSpec shardedPlanSpec(SmallDims d = {}) {
  PlanSpec p;
  p.model = "sharded";
  p.ranks = 2;
  p.shardStrategy = "zero3";
  p.arenas = {{"weights", Lifetime::Persistent, 0, 256}, {"step", Lifetime::Step, 0, 256}};
  auto shardOf = [&](uint32_t t, std::vector<int64_t> full) {
    p.tensors[t].shardRanks = 2;
    p.tensors[t].fullShape = std::move(full);
    p.tensors[t].trainable = false;
  };
  auto nf4Blocks = [&](uint32_t t, uint64_t bytes) {
    p.tensors[t].bytes = int64_t(bytes);
    p.tensors[t].quantBlock = 64;
    p.tensors[t].quantDoubleBlock = 256;
    p.tensors[t].trainable = false;
    p.arenas[p.tensors[t].arena].size = p.tensors[t].offset + bytes;
  };
  const int64_t weights = d.vocab * d.hidden;
  const uint64_t headBytes = ((uint64_t(weights) / 2 + uint64_t(weights) / 64 + 3) / 4) * 4 + 8;
  uint32_t table =
      p.add("model.embed_tokens.weight", DType::F32, {weights / 2}, TensorRole::Parameter, 0);
  shardOf(table, {d.vocab, d.hidden});
  uint32_t norm = p.add("model.norm.weight", DType::F32, {d.hidden}, TensorRole::Parameter, 0);
  uint32_t head =
      p.add("lm_head.weight", DType::U8, {int64_t(headBytes / 2)}, TensorRole::Parameter, 0);
  nf4Blocks(head, headBytes / 2);
  shardOf(head, {d.vocab, d.hidden});
  uint32_t ids = p.add("ids", DType::I32, {d.batch, d.seq}, TensorRole::Input, 1);
  uint32_t labels = p.add("labels", DType::I32, {d.batch, d.seq}, TensorRole::Input, 1);
  uint32_t wholeTable =
      p.add("embed.gathered", DType::F32, {d.vocab, d.hidden}, TensorRole::Activation, 1);
  uint32_t wholeHead =
      p.add("head.gathered", DType::NF4, {d.vocab, d.hidden}, TensorRole::Activation, 1);
  nf4Blocks(wholeHead, headBytes);
  uint32_t headF32 =
      p.add("head.dequantized", DType::F32, {d.vocab, d.hidden}, TensorRole::Activation, 1);
  uint32_t h = p.add("h", DType::F32, {d.batch, d.seq, d.hidden}, TensorRole::Activation, 1);
  uint32_t n = p.add("n", DType::F32, {d.batch, d.seq, d.hidden}, TensorRole::Activation, 1);
  uint32_t logits =
      p.add("logits", DType::F32, {d.batch, d.seq, d.vocab}, TensorRole::Activation, 1);
  uint32_t loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);
  uint32_t summed = p.add("loss.ranks", DType::F32, {}, TensorRole::Activation, 1);
  uint32_t logits2d = p.view("logits.flat", logits, {d.batch * d.seq, d.vocab});
  uint32_t labels1d = p.view("labels.flat", labels, {d.batch * d.seq});
  auto collective = [&](KernelKind kind, uint32_t in, uint32_t out) {
    size_t k = p.kernel(kind, {in}, {out}, bonsai::plan::KernelAttrs::CollectiveAttrs,
                        collectiveAttrs(2, CollectiveReduction::Sum));
    p.kernels[k].stream = uint8_t(StreamId::Collectives);
  };
  collective(KernelKind::AllGather, table, wholeTable);
  p.kernel(KernelKind::Embedding, {wholeTable, ids}, {h});
  p.kernel(KernelKind::RMSNorm, {h, norm}, {n}, bonsai::plan::KernelAttrs::NormAttrs,
           normAttrs(1e-5));
  collective(KernelKind::AllGather, head, wholeHead);
  p.kernel(KernelKind::Dequantize, {wholeHead}, {headF32});
  p.kernel(KernelKind::Linear, {n, headF32}, {logits});
  p.kernel(KernelKind::CrossEntropy, {logits2d, labels1d}, {loss},
           bonsai::plan::KernelAttrs::CrossEntropyAttrs, crossEntropyAttrs(-100));
  collective(KernelKind::AllReduce, loss, summed);
  p.inputs = {ids, labels};
  p.loss = loss;
  p.tokensPerStep = uint64_t(d.batch * d.seq);
  p.vocabSize = uint64_t(d.vocab);
  return p;
}

/// Sizes and options of the training plan.
struct TrainingDims {
  int64_t batch = 2, seq = 4, vocab = 16, hidden = 8;
  /// bf16 parameters, updated through fp32 master weights (TensorInit::CopyOf).
  bool bf16Master = false;
  uint32_t microBatches = 1;
  double lr = 1e-2;
};

/// The indices of the training plan's notable tensors.
struct TrainingTensors {
  uint32_t table, head, ids, labels, lossScale, logits, loss;
  uint32_t gradTable, gradHead, stepGradTable, stepGradHead; // accumulators, per micro-batch
  uint32_t step, gradNorm, lr;
};

/// embedding -> linear -> cross_entropy, trained: Forward as smallPlanSpec without the norm;
/// Backward: cross_entropy_grad (scaled by the LossScale tensor), linear grads, embedding
/// grad, each parameter's gradient accumulated into a persistent zero-initialized tensor
/// named like the parameter; Update: grad_norm, learning_rate, one AdamW per parameter, the
/// step counter, and zeroing the accumulators. Arena 0 holds the weights, 1 the step, 2 the
/// gradient accumulators and the optimizer state.
inline PlanSpec trainingPlanSpec(TrainingDims d = {}, TrainingTensors *out = nullptr) {
  namespace fb = bonsai::plan;
  const int64_t B = d.batch, T = d.seq, V = d.vocab, D = d.hidden;
  const DType P = d.bf16Master ? DType::BF16 : DType::F32;
  PlanSpec p;
  p.model = "train";
  p.arenas = {{"weights", Lifetime::Persistent, 0, 256},
              {"step", Lifetime::Step, 0, 256},
              {"state", Lifetime::Persistent, 0, 256}};
  TrainingTensors t{};
  t.table = p.add("model.embed_tokens.weight", P, {V, D}, TensorRole::Parameter, 0);
  t.head = p.add("lm_head.weight", P, {V, D}, TensorRole::Parameter, 0);
  t.ids = p.add("ids", DType::I32, {B, T}, TensorRole::Input, 1);
  t.labels = p.add("labels", DType::I32, {B, T}, TensorRole::Input, 1);
  t.lossScale = p.add("loss_scale", DType::F32, {}, TensorRole::LossScale, 1);
  uint32_t h = p.add("h", P, {B, T, D}, TensorRole::Activation, 1);
  t.logits = p.add("logits", P, {B, T, V}, TensorRole::Activation, 1);
  t.loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);
  uint32_t logits2d = p.view("logits.flat", t.logits, {B * T, V});
  uint32_t labels1d = p.view("labels.flat", t.labels, {B * T});
  uint32_t dlogits = p.add("logits.grad", DType::F32, {B * T, V}, TensorRole::Gradient, 1);
  uint32_t dlogits3 = p.view("logits.grad.3d", dlogits, {B, T, V}, TensorRole::Gradient);
  uint32_t dh = p.add("h.grad", DType::F32, {B, T, D}, TensorRole::Gradient, 1);
  t.stepGradHead = p.add("lm_head.weight", DType::F32, {V, D}, TensorRole::Gradient, 1);
  t.stepGradTable = p.add("model.embed_tokens.weight", DType::F32, {V, D}, TensorRole::Gradient, 1);
  auto Z = TensorInit::Zeros;
  auto S = TensorRole::OptimizerState;
  t.gradTable =
      p.addInit("model.embed_tokens.weight", DType::F32, {V, D}, TensorRole::Gradient, 2, Z);
  t.gradHead = p.addInit("lm_head.weight", DType::F32, {V, D}, TensorRole::Gradient, 2, Z);
  t.step = p.addInit("optimizer.step", DType::I64, {}, S, 2, Z);
  uint32_t mTable =
      p.addInit("optimizer.exp_avg.model.embed_tokens.weight", DType::F32, {V, D}, S, 2, Z);
  uint32_t vTable =
      p.addInit("optimizer.exp_avg_sq.model.embed_tokens.weight", DType::F32, {V, D}, S, 2, Z);
  uint32_t mHead = p.addInit("optimizer.exp_avg.lm_head.weight", DType::F32, {V, D}, S, 2, Z);
  uint32_t vHead = p.addInit("optimizer.exp_avg_sq.lm_head.weight", DType::F32, {V, D}, S, 2, Z);
  uint32_t masterTable = 0, masterHead = 0;
  if (d.bf16Master) {
    masterTable = p.addInit("optimizer.master.model.embed_tokens.weight", DType::F32, {V, D}, S, 2,
                            TensorInit::CopyOf, t.table);
    masterHead = p.addInit("optimizer.master.lm_head.weight", DType::F32, {V, D}, S, 2,
                           TensorInit::CopyOf, t.head);
  }
  t.gradNorm = p.add("grad_norm", DType::F32, {}, TensorRole::Metric, 2);
  t.lr = p.add("lr", DType::F32, {}, TensorRole::Metric, 2);
  p.arenas[1].size += 32; // slack: planned above what is touched

  p.kernel(KernelKind::Embedding, {t.table, t.ids}, {h});
  p.kernel(KernelKind::Linear, {h, t.head}, {t.logits});
  p.kernel(KernelKind::CrossEntropy, {logits2d, labels1d}, {t.loss},
           fb::KernelAttrs::CrossEntropyAttrs, crossEntropyAttrs(-100));

  p.phase = Phase::Backward;
  p.kernel(KernelKind::CrossEntropyGrad, {t.lossScale, logits2d, labels1d}, {dlogits},
           fb::KernelAttrs::CrossEntropyAttrs, crossEntropyAttrs(-100));
  p.kernel(KernelKind::LinearGradWeight, {dlogits3, h}, {t.stepGradHead});
  p.kernel(KernelKind::LinearGradInput, {dlogits3, t.head}, {dh});
  p.kernel(KernelKind::EmbeddingGrad, {dh, t.ids}, {t.stepGradTable});
  p.kernel(KernelKind::Accumulate, {t.stepGradTable}, {t.gradTable});
  p.kernel(KernelKind::Accumulate, {t.stepGradHead}, {t.gradHead});

  p.phase = Phase::Update;
  p.kernel(KernelKind::GradNorm, {t.gradTable, t.gradHead}, {t.gradNorm});
  p.kernel(KernelKind::LearningRate, {t.step}, {t.lr}, fb::KernelAttrs::LearningRateAttrs,
           learningRateAttrs(d.lr, true, 2, 40, 0.1));
  std::vector<uint32_t> tableOut = {t.table, mTable, vTable}, headOut = {t.head, mHead, vHead};
  if (d.bf16Master) {
    tableOut.push_back(masterTable);
    headOut.push_back(masterHead);
  }
  p.kernel(KernelKind::AdamWUpdate, {t.gradTable, t.step, t.lr, t.gradNorm}, tableOut,
           fb::KernelAttrs::AdamWAttrs, adamwAttrs(0.9, 0.95, 1e-8, 0.01, 1.0));
  p.kernel(KernelKind::AdamWUpdate, {t.gradHead, t.step, t.lr, t.gradNorm}, headOut,
           fb::KernelAttrs::AdamWAttrs, adamwAttrs(0.9, 0.95, 1e-8, 0.01, 1.0));
  p.kernel(KernelKind::StepIncrement, {}, {t.step});
  p.kernel(KernelKind::Zero, {}, {t.gradTable});
  p.kernel(KernelKind::Zero, {}, {t.gradHead});
  p.phase = Phase::Forward;

  p.inputs = {t.ids, t.labels};
  p.loss = t.loss;
  p.tokensPerStep = uint64_t(B * T);
  p.microBatches = d.microBatches;
  p.vocabSize = uint64_t(V);
  if (out)
    *out = t;
  return p;
}

/// The training plan with lm_head's moments and fp32 master kept in a pinned host arena (3) and
/// streamed through the step arena around its AdamW update, as bonsai-offload compiles it
/// (docs/offload.md): copies in, the update on the copies, copies back. `copies` receives the
/// indices of the device copies (m, v, master). With `onCopyStreams`, the copies run on the copy
/// streams, as bonsai-schedule issues them (docs/offload.md, "Overlap").
inline PlanSpec offloadedPlanSpec(TrainingTensors &t, std::vector<uint32_t> *copies = nullptr,
                                  bool onCopyStreams = false) {
  namespace fb = bonsai::plan;
  const uint8_t toDevice = onCopyStreams ? 1 : 0, toHost = onCopyStreams ? 2 : 0;
  PlanSpec spec = trainingPlanSpec({2, 4, 16, 8, true}, &t);
  spec.arenas.push_back({"optimizer_host", Lifetime::Persistent, 0, 256, MemorySpace::PinnedHost});
  size_t adam = 0;
  for (size_t i = 0; i < spec.kernels.size(); ++i)
    if (spec.kernels[i].kind == KernelKind::AdamWUpdate && spec.kernels[i].outputs[0] == t.head)
      adam = i;
  std::vector<KernelSpec> in, out;
  std::vector<uint32_t> staged;
  for (size_t j = 1; j < spec.kernels[adam].outputs.size(); ++j) {
    uint32_t host = spec.kernels[adam].outputs[j];
    test::TensorSpec &state = spec.tensors[host];
    state.arena = 3;
    state.offset = spec.arenas[3].size;
    spec.arenas[3].size += 1024;
    uint32_t device = spec.add("copy_h2d." + std::to_string(j), DType::F32, state.shape,
                               TensorRole::Activation, 1);
    in.push_back({KernelKind::CopyHostToDevice,
                  {host},
                  {device},
                  fb::KernelAttrs::NONE,
                  {},
                  "",
                  Phase::Update,
                  toDevice});
    out.push_back({KernelKind::CopyDeviceToHost,
                   {device},
                   {host},
                   fb::KernelAttrs::NONE,
                   {},
                   "",
                   Phase::Update,
                   toHost});
    spec.kernels[adam].outputs[j] = device;
    staged.push_back(device);
  }
  spec.kernels.insert(spec.kernels.begin() + adam + 1, out.begin(), out.end());
  spec.kernels.insert(spec.kernels.begin() + adam, in.begin(), in.end());
  if (copies)
    *copies = staged;
  return spec;
}

/// The training plan (bf16 parameters with fp32 masters) with lm_head's AdamW update on the
/// host, as bonsai-offload compiles a host step (docs/offload.md, "The host step"): its moments
/// and master, and a mirror of the weight (a copy of it), in a pinned host arena (3); the
/// gradient, step counter, learning rate and norm copied into a pinned step arena (4) before
/// the update (device-to-host stream), the update on the host stream over pinned memory only,
/// and the mirror copied into the weight after it (host-to-device stream). `mirror` receives
/// the mirror's index, `update` the update kernel's.
inline PlanSpec hostStepPlanSpec(TrainingTensors &t, uint32_t *mirror = nullptr,
                                 size_t *update = nullptr) {
  namespace fb = bonsai::plan;
  PlanSpec spec = trainingPlanSpec({2, 4, 16, 8, true}, &t);
  spec.arenas.push_back({"optimizer_host", Lifetime::Persistent, 0, 256, MemorySpace::PinnedHost});
  spec.arenas.push_back({"staging_host", Lifetime::Step, 0, 256, MemorySpace::PinnedHost});
  size_t adam = 0;
  for (size_t i = 0; i < spec.kernels.size(); ++i)
    if (spec.kernels[i].kind == KernelKind::AdamWUpdate && spec.kernels[i].outputs[0] == t.head)
      adam = i;
  // The update's state moves to the pinned arena.
  for (size_t j = 1; j < spec.kernels[adam].outputs.size(); ++j) {
    test::TensorSpec &state = spec.tensors[spec.kernels[adam].outputs[j]];
    state.arena = 3;
    state.offset = (spec.arenas[3].size + 63) / 64 * 64;
    spec.arenas[3].size = state.offset + uint64_t(state.bytes);
  }
  const test::TensorSpec &head = spec.tensors[t.head];
  uint32_t copy = spec.addInit("optimizer.host_copy.lm_head.weight", head.dtype, head.shape,
                               TensorRole::OptimizerState, 3, TensorInit::CopyOf, t.head);
  spec.kernels[adam].outputs[0] = copy;
  std::vector<KernelSpec> in;
  for (uint32_t &operand : spec.kernels[adam].inputs) {
    const test::TensorSpec &from = spec.tensors[operand];
    uint32_t staged =
        spec.add(from.name + ".host", from.dtype, from.shape, TensorRole::Activation, 4);
    in.push_back({KernelKind::CopyDeviceToHost,
                  {operand},
                  {staged},
                  fb::KernelAttrs::NONE,
                  {},
                  "",
                  Phase::Update,
                  2});
    operand = staged;
  }
  spec.kernels[adam].stream = 3;
  KernelSpec back{KernelKind::CopyHostToDevice,
                  {copy},
                  {t.head},
                  fb::KernelAttrs::NONE,
                  {},
                  "",
                  Phase::Update,
                  1};
  spec.kernels.insert(spec.kernels.begin() + adam + 1, back);
  spec.kernels.insert(spec.kernels.begin() + adam, in.begin(), in.end());
  if (mirror)
    *mirror = copy;
  if (update)
    *update = adam + in.size();
  return spec;
}

/// A plan that uses every kernel kind once or more: a GPT-2-like block with rotary attention
/// (grouped-query, 2 heads over 1 kv head), a SwiGLU MLP, casts, a copy, a transpose, two
/// matmuls and a softmax, then the lm_head and the loss. Ids and labels are i64.
inline PlanSpec everyKindPlanSpec() {
  namespace fb = bonsai::plan;
  const int64_t B = 2, S = 4, H = 2, Hkv = 1, Dh = 4, D = 8, V = 16, F = 12;
  const int64_t Q = H * Dh + 2 * Hkv * Dh;
  PlanSpec p;
  p.model = "every_kind";
  p.arenas = {{"weights", Lifetime::Persistent, 0, 256}, {"step", Lifetime::Step, 0, 256}};
  auto P = TensorRole::Parameter;
  auto A = TensorRole::Activation;
  uint32_t embed = p.add("wte.weight", DType::F32, {V, D}, P, 0);
  uint32_t pos = p.add("wpe.weight", DType::F32, {S, D}, P, 0);
  uint32_t lnW = p.add("h.0.ln_1.weight", DType::F32, {D}, P, 0);
  uint32_t lnB = p.add("h.0.ln_1.bias", DType::F32, {D}, P, 0);
  uint32_t wqkv = p.add("h.0.attn.qkv.weight", DType::F32, {Q, D}, P, 0);
  uint32_t wo = p.add("h.0.attn.o.weight", DType::F32, {D, D}, P, 0);
  uint32_t bo = p.add("h.0.attn.o.bias", DType::F32, {D}, P, 0);
  uint32_t rmsW = p.add("h.0.post_attention_layernorm.weight", DType::F32, {D}, P, 0);
  uint32_t wGate = p.add("h.0.mlp.gate_proj.weight", DType::F32, {F, D}, P, 0);
  uint32_t wUp = p.add("h.0.mlp.up_proj.weight", DType::F32, {F, D}, P, 0);
  uint32_t wDown = p.add("h.0.mlp.down_proj.weight", DType::F32, {D, F}, P, 0);
  uint32_t head = p.add("lm_head.weight", DType::F32, {V, D}, P, 0);
  uint32_t ids = p.add("ids", DType::I64, {B, S}, TensorRole::Input, 1);
  uint32_t labels = p.add("labels", DType::I64, {B, S}, TensorRole::Input, 1);
  auto act = [&](const char *name, std::vector<int64_t> shape, DType t = DType::F32) {
    return p.add(name, t, std::move(shape), A, 1);
  };
  uint32_t x0 = act("x0", {B, S, D}), x1 = act("x1", {B, S, D}), x2 = act("x2", {B, S, D});
  uint32_t qkv = act("qkv", {B, S, Q});
  uint32_t q = act("q", {B, S, H * Dh}), k = act("k", {B, S, Hkv * Dh}), v = act("v", {B, S, Hkv * Dh});
  uint32_t q4 = p.view("q4", q, {B, S, H, Dh}), k4 = p.view("k4", k, {B, S, Hkv, Dh});
  uint32_t v4 = p.view("v4", v, {B, S, Hkv, Dh});
  uint32_t qr = act("qr", {B, S, H, Dh}), kr = act("kr", {B, S, Hkv, Dh});
  uint32_t o4 = act("o4", {B, S, H, Dh});
  uint32_t o = p.view("o", o4, {B, S, H * Dh});
  uint32_t ao = act("ao", {B, S, D}), x3 = act("x3", {B, S, D}), x4 = act("x4", {B, S, D});
  uint32_t g = act("g", {B, S, F}), u = act("u", {B, S, F}), s1 = act("s1", {B, S, F});
  uint32_t s2 = act("s2", {B, S, F}), s3 = act("s3", {B, S, F}), s4 = act("s4", {B, S, F});
  uint32_t m = act("m", {B, S, D}), mb = act("mb", {B, S, D}, DType::BF16), mf = act("mf", {B, S, D});
  uint32_t mc = act("mc", {B, S, D}), mt = act("mt", {B, D, S}), sc = act("sc", {B, S, S});
  uint32_t sp = act("sp", {B, S, S}), y = act("y", {B, S, D}), x5 = act("x5", {B, S, D});
  uint32_t logits = act("logits", {B, S, V});
  uint32_t loss = p.add("loss", DType::F32, {}, TensorRole::Loss, 1);

  p.kernel(KernelKind::Embedding, {embed, ids}, {x0});
  p.kernel(KernelKind::Add, {x0, pos}, {x1});
  p.kernel(KernelKind::LayerNorm, {x1, lnW, lnB}, {x2}, fb::KernelAttrs::NormAttrs, normAttrs(1e-5));
  p.kernel(KernelKind::Linear, {x2, wqkv}, {qkv});
  p.kernel(KernelKind::Slice, {qkv}, {q}, fb::KernelAttrs::SliceAttrs, sliceAttrs(2, 0));
  p.kernel(KernelKind::Slice, {qkv}, {k}, fb::KernelAttrs::SliceAttrs, sliceAttrs(2, H * Dh));
  p.kernel(KernelKind::Slice, {qkv}, {v}, fb::KernelAttrs::SliceAttrs,
           sliceAttrs(2, H * Dh + Hkv * Dh));
  p.kernel(KernelKind::RoPE, {q4}, {qr}, fb::KernelAttrs::RoPEAttrs, ropeAttrs(10000.0));
  p.kernel(KernelKind::RoPE, {k4}, {kr}, fb::KernelAttrs::RoPEAttrs, ropeAttrs(10000.0));
  p.kernel(KernelKind::Attention, {qr, kr, v4}, {o4}, fb::KernelAttrs::AttentionAttrs,
           attentionAttrs(true, 0.5));
  p.kernel(KernelKind::Linear, {o, wo, bo}, {ao});
  p.kernel(KernelKind::Add, {x1, ao}, {x3});
  p.kernel(KernelKind::RMSNorm, {x3, rmsW}, {x4}, fb::KernelAttrs::NormAttrs, normAttrs(1e-6));
  p.kernel(KernelKind::Linear, {x4, wGate}, {g});
  p.kernel(KernelKind::Linear, {x4, wUp}, {u});
  p.kernel(KernelKind::SwiGLU, {g, u}, {s1});
  p.kernel(KernelKind::SiLU, {s1}, {s2});
  p.kernel(KernelKind::GeLU, {s2}, {s3}, fb::KernelAttrs::GeLUAttrs, geluAttrs(true));
  p.kernel(KernelKind::Mul, {s3, u}, {s4});
  p.kernel(KernelKind::Linear, {s4, wDown}, {m});
  p.kernel(KernelKind::Cast, {m}, {mb});
  p.kernel(KernelKind::Cast, {mb}, {mf});
  p.kernel(KernelKind::Copy, {mf}, {mc});
  p.kernel(KernelKind::Transpose, {mc}, {mt}, fb::KernelAttrs::TransposeAttrs,
           transposeAttrs({0, 2, 1}));
  p.kernel(KernelKind::Matmul, {mc, mt}, {sc});
  p.kernel(KernelKind::Softmax, {sc}, {sp}, fb::KernelAttrs::AxisAttrs, axisAttrs(2));
  p.kernel(KernelKind::Matmul, {sp, mc}, {y});
  p.kernel(KernelKind::Add, {x3, y}, {x5});
  p.kernel(KernelKind::Linear, {x5, head}, {logits});
  p.kernel(KernelKind::CrossEntropy, {logits, labels}, {loss}, fb::KernelAttrs::CrossEntropyAttrs,
           crossEntropyAttrs(-100));
  p.inputs = {ids, labels};
  p.loss = loss;
  p.tokensPerStep = uint64_t(B * S);
  p.vocabSize = uint64_t(V);
  return p;
}

/// everyKindPlanSpec() trained: a backward phase that uses every gradient kind once or more
/// (on fills and forward tensors of matching shapes; it is a dispatch and verification test,
/// not a consistent backward pass), the lm_head and embedding gradients accumulated into
/// persistent tensors, and an update phase with AdamW (lm_head), SGD with momentum and fp32
/// master weights (the embedding), the norm, the schedule, the step counter and the zeroing.
inline PlanSpec everyTrainingKindPlanSpec() {
  namespace fb = bonsai::plan;
  const int64_t B = 2, S = 4, H = 2, Hkv = 1, Dh = 4, D = 8, V = 16, F = 12;
  const int64_t Q = H * Dh + 2 * Hkv * Dh;
  PlanSpec p = everyKindPlanSpec();
  p.model = "every_training_kind";
  p.arenas.push_back({"state", Lifetime::Persistent, 0, 256});
  auto find = [&](const char *name) {
    for (uint32_t i = 0; i < p.tensors.size(); ++i)
      if (p.tensors[i].name == name)
        return i;
    std::abort();
  };
  uint32_t embed = find("wte.weight"), lnW = find("h.0.ln_1.weight");
  uint32_t rmsW = find("h.0.post_attention_layernorm.weight"), head = find("lm_head.weight");
  uint32_t ids = find("ids"), labels = find("labels"), logits = find("logits");
  uint32_t x1 = find("x1"), x3 = find("x3"), x5 = find("x5"), qr = find("qr"), kr = find("kr");
  uint32_t v4 = find("v4"), o4 = find("o4"), g = find("g"), u = find("u"), s1 = find("s1");
  uint32_t s2 = find("s2"), sp = find("sp");
  auto G = TensorRole::Gradient;
  auto grad = [&](const char *name, std::vector<int64_t> shape) {
    return p.add(name, DType::F32, std::move(shape), G, 1);
  };
  uint32_t scale = p.add("loss_scale", DType::F32, {}, TensorRole::LossScale, 1);
  uint32_t dlogits = grad("logits.grad", {B, S, V});
  uint32_t dx5 = grad("x5.grad", {B, S, D}), dhead = grad("lm_head.weight", {V, D});
  uint32_t dyD = grad("dy.d", {B, S, D}), dyF = grad("dy.f", {B, S, F});
  uint32_t dyS = grad("dy.s", {B, S, S}), dyQ = grad("dy.q", {B, S, H, Dh});
  uint32_t dyK = grad("dy.k", {B, S, Hkv * Dh});
  uint32_t dx3 = grad("x3.grad", {B, S, D}), drms = grad("rms.grad", {D});
  uint32_t dx1 = grad("x1.grad", {B, S, D}), dlnW = grad("ln.w.grad", {D});
  uint32_t dlnB = grad("ln.b.grad", {D}), dq = grad("q.grad", {B, S, H, Dh});
  uint32_t dqa = grad("qa.grad", {B, S, H, Dh}), dka = grad("ka.grad", {B, S, Hkv, Dh});
  uint32_t dva = grad("va.grad", {B, S, Hkv, Dh}), ds1 = grad("s1.grad", {B, S, F});
  uint32_t ds2 = grad("s2.grad", {B, S, F}), dg = grad("g.grad", {B, S, F});
  uint32_t du = grad("u.grad", {B, S, F}), dsc = grad("sc.grad", {B, S, S});
  uint32_t dqkv = grad("qkv.grad", {B, S, Q}), dpos = grad("wpe.weight", {S, D});
  uint32_t dembed = grad("wte.weight", {V, D});
  auto Z = TensorInit::Zeros;
  auto St = TensorRole::OptimizerState;
  uint32_t gHead = p.addInit("lm_head.weight", DType::F32, {V, D}, G, 2, Z);
  uint32_t gEmbed = p.addInit("wte.weight", DType::F32, {V, D}, G, 2, Z);
  uint32_t step = p.addInit("optimizer.step", DType::I64, {}, St, 2, Z);
  uint32_t m = p.addInit("optimizer.exp_avg.lm_head.weight", DType::F32, {V, D}, St, 2, Z);
  uint32_t v = p.addInit("optimizer.exp_avg_sq.lm_head.weight", DType::F32, {V, D}, St, 2, Z);
  uint32_t mom = p.addInit("optimizer.momentum.wte.weight", DType::F32, {V, D}, St, 2, Z);
  uint32_t master = p.addInit("optimizer.master.wte.weight", DType::F32, {V, D}, St, 2,
                              TensorInit::CopyOf, embed);
  uint32_t norm = p.add("grad_norm", DType::F32, {}, TensorRole::Metric, 2);
  uint32_t lr = p.add("lr", DType::F32, {}, TensorRole::Metric, 2);

  p.phase = Phase::Backward;
  p.kernel(KernelKind::CrossEntropyGrad, {scale, logits, labels}, {dlogits},
           fb::KernelAttrs::CrossEntropyAttrs, crossEntropyAttrs(-100));
  p.kernel(KernelKind::LinearGradInput, {dlogits, head}, {dx5});
  p.kernel(KernelKind::LinearGradWeight, {dlogits, x5}, {dhead});
  for (uint32_t dy : {dyD, dyF, dyS, dyQ, dyK})
    p.kernel(KernelKind::Fill, {}, {dy}, fb::KernelAttrs::FillAttrs, fillAttrs(0.01));
  p.kernel(KernelKind::RMSNormGrad, {dyD, x3, rmsW}, {dx3, drms}, fb::KernelAttrs::NormAttrs,
           normAttrs(1e-6));
  p.kernel(KernelKind::LayerNormGrad, {dx5, x1, lnW}, {dx1, dlnW, dlnB}, fb::KernelAttrs::NormAttrs,
           normAttrs(1e-5));
  p.kernel(KernelKind::RoPEGrad, {dyQ}, {dq}, fb::KernelAttrs::RoPEAttrs, ropeAttrs(10000.0));
  p.kernel(KernelKind::AttentionGrad, {dq, qr, kr, v4, o4}, {dqa, dka, dva},
           fb::KernelAttrs::AttentionAttrs, attentionAttrs(true, 0.5));
  p.kernel(KernelKind::SiLUGrad, {dyF, s1}, {ds1});
  p.kernel(KernelKind::GeLUGrad, {ds1, s2}, {ds2}, fb::KernelAttrs::GeLUAttrs, geluAttrs(true));
  p.kernel(KernelKind::SwiGLUGrad, {ds2, g, u}, {dg, du});
  p.kernel(KernelKind::SoftmaxGrad, {dyS, sp}, {dsc}, fb::KernelAttrs::AxisAttrs, axisAttrs(2));
  p.kernel(KernelKind::SliceGrad, {dyK}, {dqkv}, fb::KernelAttrs::SliceAttrs,
           sliceAttrs(2, H * Dh));
  p.kernel(KernelKind::ReduceTo, {dx1}, {dpos});
  p.kernel(KernelKind::EmbeddingGrad, {dx1, ids}, {dembed});
  p.kernel(KernelKind::Accumulate, {dhead}, {gHead});
  p.kernel(KernelKind::Accumulate, {dembed}, {gEmbed});

  p.phase = Phase::Update;
  p.kernel(KernelKind::GradNorm, {gHead, gEmbed}, {norm});
  p.kernel(KernelKind::LearningRate, {step}, {lr}, fb::KernelAttrs::LearningRateAttrs,
           learningRateAttrs(1e-2, false, 3));
  p.kernel(KernelKind::AdamWUpdate, {gHead, step, lr, norm}, {head, m, v},
           fb::KernelAttrs::AdamWAttrs, adamwAttrs(0.9, 0.999, 1e-8, 0.1, 1.0));
  p.kernel(KernelKind::SGDUpdate, {gEmbed, lr, norm}, {embed, mom, master},
           fb::KernelAttrs::SGDAttrs, sgdAttrs(0.9, 0.01, 0.0));
  p.kernel(KernelKind::StepIncrement, {}, {step});
  p.kernel(KernelKind::Zero, {}, {gHead});
  p.kernel(KernelKind::Zero, {}, {gEmbed});
  p.phase = Phase::Forward;
  return p;
}

/// Writes `bytes` to `path`.
inline void writeFile(const std::string &path, const std::vector<uint8_t> &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(bytes.data()), std::streamsize(bytes.size()));
}

/// The whole content of the file at `path` ("" if it cannot be read).
inline std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Standard base64 (line breaks ignored): the SentencePiece test model is kept as text.
inline std::vector<uint8_t> decodeBase64(const std::string &text) {
  std::vector<uint8_t> out;
  uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    int v = c >= 'A' && c <= 'Z'   ? c - 'A'
            : c >= 'a' && c <= 'z' ? c - 'a' + 26
            : c >= '0' && c <= '9' ? c - '0' + 52
            : c == '+'             ? 62
            : c == '/'             ? 63
                                   : -1;
    if (v < 0)
      continue; // Line breaks and the '=' padding.
    bits = (bits << 6) | uint32_t(v);
    if ((count += 6) >= 8) {
      count -= 8;
      out.push_back(uint8_t(bits >> count));
    }
  }
  return out;
}

/// The bytes of every parameter ("param:<name>") and optimizer-state tensor ("state:<name>")
/// of `e`: what a checkpoint holds, for comparing runs bit for bit.
inline std::map<std::string, std::vector<uint8_t>> stateOf(const Executor &e) {
  std::map<std::string, std::vector<uint8_t>> state;
  const LoadedPlan &plan = e.plan();
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    if (t.role != TensorRole::Parameter && t.role != TensorRole::OptimizerState)
      continue;
    const auto *p = static_cast<const uint8_t *>(e.view(i).data);
    state[(t.role == TensorRole::Parameter ? "param:" : "state:") + t.name] =
        std::vector<uint8_t>(p, p + t.bytes);
  }
  return state;
}

/// The elements of float tensor `tensor` of `e`, as f32.
inline std::vector<float> floatsOf(const Executor &e, uint32_t tensor) {
  std::vector<float> v(size_t(e.plan().tensors[tensor].numel));
  loadF32(e.view(tensor), v.data());
  return v;
}

/// A fresh path under the test temporary directory.
inline std::string tempPath(const std::string &name) {
  const char *dir = std::getenv("TEST_TMPDIR");
  std::string base = dir && *dir ? dir : "/tmp";
  return base + "/bonsai-rt-" + std::to_string(::getpid()) + "-" + name;
}

namespace detail {
inline int removeEntry(const char *path, const struct stat *, int, struct FTW *) {
  return ::remove(path);
}
} // namespace detail

/// Removes `path` and everything under it (nothing if it does not exist).
inline void removeTree(const std::string &path) {
  ::nftw(path.c_str(), detail::removeEntry, 16, FTW_DEPTH | FTW_PHYS);
}

/// A fresh, empty directory under the test temporary directory.
inline std::string makeTempDir(const std::string &name) {
  std::string path = tempPath(name);
  removeTree(path);
  ::mkdir(path.c_str(), 0755);
  return path;
}

/// trainingPlanSpec with bonsai-fuse's optimizer and gemm-epilogue kernels: lm_head's weight
/// gradient accumulated by its GEMM (LinearGradWeightAccumulate instead of LinearGradWeight
/// into a step tensor and Accumulate), and both parameters' AdamW as one
/// MultiTensorAdamWUpdate (inputs step, lr, norm, g1, g2; outputs params, m, v [, masters]).
inline PlanSpec fusedTrainingPlanSpec(TrainingDims d = {}, TrainingTensors *out = nullptr) {
  namespace fb = bonsai::plan;
  TrainingTensors t;
  PlanSpec p = trainingPlanSpec(d, &t);
  std::vector<KernelSpec> kernels;
  std::vector<const KernelSpec *> adams;
  for (const KernelSpec &k : p.kernels) {
    if (k.kind == KernelKind::LinearGradWeight) {
      KernelSpec fused = k;
      fused.kind = KernelKind::LinearGradWeightAccumulate;
      fused.outputs = {t.gradHead};
      kernels.push_back(fused);
    } else if (k.kind == KernelKind::Accumulate && k.outputs[0] == t.gradHead) {
      continue;
    } else if (k.kind == KernelKind::AdamWUpdate) {
      adams.push_back(&k);
      if (adams.size() < 2)
        continue;
      KernelSpec fused = k;
      fused.kind = KernelKind::MultiTensorAdamWUpdate;
      fused.inputs = {t.step, t.lr, t.gradNorm, adams[0]->inputs[0], adams[1]->inputs[0]};
      fused.outputs.clear();
      for (size_t list = 0; list < k.outputs.size(); ++list)
        for (const KernelSpec *adam : adams)
          fused.outputs.push_back(adam->outputs[list]);
      kernels.push_back(fused);
    } else {
      kernels.push_back(k);
    }
  }
  p.kernels = kernels;
  if (out)
    *out = t;
  return p;
}

inline auto fp8Attrs(bool current = false, int margin = 0, bool fastAccumulation = false) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateFp8Attrs(b, current, margin, fastAccumulation).Union();
  };
}

/// The FP8 tensors of fp8TrainingPlanSpec.
struct Fp8Tensors {
  uint32_t state;                    ///< "lm_head.weight.fp8", f32 [3, 4 + H]
  uint32_t forwardStats, gradInputStats, gradWeightStats;
  uint32_t forwardWorkspace, gradInputWorkspace, gradWeightWorkspace;
  size_t forward, gradInput, gradWeight, update; ///< kernel indices
};

/// trainingPlanSpec (dims default to batch 2, seq 8, vocab 16, hidden 16: M = 16, N = 16,
/// K = 16, as FP8 GEMMs need) with bonsai-fp8's rewrite of the lm_head linear: Fp8Linear,
/// Fp8LinearGradInput and Fp8LinearGradWeight with their stats and workspaces, the state
/// "lm_head.weight.fp8" (optimizer state, zeros, an amax history of `history` entries), and
/// Fp8UpdateScales from the forward and grad_input stats before the step counter's increment.
inline PlanSpec fp8TrainingPlanSpec(TrainingDims d = {2, 8, 16, 16}, int64_t history = 4,
                                    bool current = false, int margin = 0,
                                    TrainingTensors *outTensors = nullptr,
                                    Fp8Tensors *outFp8 = nullptr) {
  namespace fb = bonsai::plan;
  TrainingTensors t;
  PlanSpec p = trainingPlanSpec(d, &t);
  Fp8Tensors f{};
  f.state = p.addInit("lm_head.weight.fp8", DType::F32, {3, 4 + history},
                      TensorRole::OptimizerState, 2, TensorInit::Zeros);
  auto stats = [&](const char *name) {
    return p.add(name, DType::F32, {2, 4}, TensorRole::Workspace, 1);
  };
  f.forwardStats = stats("lm_head.fp8.stats");
  f.gradInputStats = stats("lm_head.fp8.grad_input.stats");
  f.gradWeightStats = stats("lm_head.fp8.grad_weight.stats");
  auto workspace = [&](const char *name, int64_t a, int64_t b) {
    return p.add(name, DType::F32, {(((a + 255) / 256 + (b + 255) / 256) * 256 + 256) / 4},
                 TensorRole::Workspace, 1);
  };
  int64_t M = d.batch * d.seq, V = d.vocab, D = d.hidden;
  f.forwardWorkspace = workspace("lm_head.fp8.workspace", M * D, V * D);
  f.gradInputWorkspace = workspace("lm_head.fp8.grad_input.workspace", M * V, V * D);
  f.gradWeightWorkspace = workspace("lm_head.fp8.grad_weight.workspace", M * V, M * D);
  std::vector<KernelSpec> kernels;
  for (KernelSpec k : p.kernels) {
    if (k.kind == KernelKind::StepIncrement) {
      f.update = kernels.size();
      kernels.push_back({KernelKind::Fp8UpdateScales, {t.step, f.forwardStats, f.gradInputStats},
                         {f.state}, fb::KernelAttrs::Fp8Attrs, fp8Attrs(current, margin),
                         "fp8_update", Phase::Update});
    }
    KernelKind kind = k.kind;
    if (kind == KernelKind::Linear || kind == KernelKind::LinearGradInput ||
        kind == KernelKind::LinearGradWeight) {
      k.inputs.push_back(f.state);
      k.attrsType = fb::KernelAttrs::Fp8Attrs;
      k.attrs = fp8Attrs(current, margin);
    }
    if (kind == KernelKind::Linear) {
      f.forward = kernels.size();
      k.kind = KernelKind::Fp8Linear;
      k.outputs.insert(k.outputs.end(), {f.forwardStats, f.forwardWorkspace});
    } else if (kind == KernelKind::LinearGradInput) {
      f.gradInput = kernels.size();
      k.kind = KernelKind::Fp8LinearGradInput;
      k.outputs.insert(k.outputs.end(), {f.gradInputStats, f.gradInputWorkspace});
    } else if (kind == KernelKind::LinearGradWeight) {
      f.gradWeight = kernels.size();
      k.kind = KernelKind::Fp8LinearGradWeight;
      k.outputs.insert(k.outputs.end(), {f.gradWeightStats, f.gradWeightWorkspace});
    }
    kernels.push_back(k);
  }
  p.kernels = kernels;
  p.model = "train_fp8";
  if (outTensors)
    *outTensors = t;
  if (outFp8)
    *outFp8 = f;
  return p;
}

/// fp8TrainingPlanSpec with the lm_head's backward fused as bonsai-fuse's fp8-backward family
/// fuses it: Fp8LinearBackward (dy, w, x, state) -> (dx, the grad-input and
/// grad-weight stats, one workspace holding both GEMMs', the gradient accumulator) where the
/// input gradient was, without the weight gradient's kernel and its Accumulate. `outFp8`'s
/// gradInput is the fused kernel's index (gradWeight too), gradInputWorkspace its workspace.
inline PlanSpec fp8FusedBackwardPlanSpec(TrainingDims d = {2, 8, 16, 16},
                                         TrainingTensors *outTensors = nullptr,
                                         Fp8Tensors *outFp8 = nullptr) {
  TrainingTensors t;
  Fp8Tensors f;
  PlanSpec p = fp8TrainingPlanSpec(d, 4, false, 0, &t, &f);
  const int64_t M = d.batch * d.seq, V = d.vocab, D = d.hidden;
  auto bytes = [](int64_t a, int64_t b) { return ((a + 255) / 256 + (b + 255) / 256) * 256 + 256; };
  uint32_t workspace =
      p.add("lm_head.fp8.backward.workspace", DType::F32,
            {(bytes(M * V, V * D) + bytes(M * V, M * D)) / 4}, TensorRole::Workspace, 1);
  const KernelSpec gradInput = p.kernels[f.gradInput], gradWeight = p.kernels[f.gradWeight];
  KernelSpec fused = gradInput;
  fused.kind = KernelKind::Fp8LinearBackward;
  fused.inputs = {gradInput.inputs[0], gradInput.inputs[1], gradWeight.inputs[1],
                  gradInput.inputs[2]};
  fused.outputs = {gradInput.outputs[0], f.gradInputStats, f.gradWeightStats, workspace,
                   t.gradHead};
  const size_t gradInputAt = f.gradInput, gradWeightAt = f.gradWeight, updateAt = f.update;
  std::vector<KernelSpec> kernels;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const KernelSpec &k = p.kernels[i];
    if (i == gradWeightAt ||
        (k.kind == KernelKind::Accumulate && k.outputs == std::vector<uint32_t>{t.gradHead}))
      continue;
    if (i == gradInputAt)
      f.gradInput = f.gradWeight = kernels.size();
    if (i == updateAt)
      f.update = kernels.size();
    kernels.push_back(i == gradInputAt ? fused : k);
  }
  p.kernels = kernels;
  f.gradInputWorkspace = workspace;
  if (outTensors)
    *outTensors = t;
  if (outFp8)
    *outFp8 = f;
  return p;
}

} // namespace bonsai::rt::test

#endif // BONSAI_TEST_RUNTIME_TESTPLANS_H
