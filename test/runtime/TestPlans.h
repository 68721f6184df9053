//===- TestPlans.h - Hand-built plans for the runtime's unit tests --------===//
//
// Tests describe a plan as plain structs (arenas, tensors, kernels) and serialize it with
// FlatBufferBuilder exactly as the compiler's emitter would, so they can plant one mistake at a
// time. `smallPlanSpec()` is the reference model of the tests: embedding -> rms_norm -> linear ->
// cross_entropy over views of the logits and labels.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TEST_RUNTIME_TESTPLANS_H
#define BONSAI_TEST_RUNTIME_TESTPLANS_H

#include "bonsai/runtime/Plan.h"
#include "bonsai/runtime/Tensor.h"
#include "bonsai/runtime/plan_generated.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

namespace bonsai::rt::test {

/// An arena of a test plan.
struct ArenaSpec {
  std::string name;
  Lifetime lifetime = Lifetime::Step;
  uint64_t size = 0;
  uint64_t alignment = 256;
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
};

/// A kernel of a test plan; `attrs` builds the union member, of type `attrsType`.
struct KernelSpec {
  KernelKind kind = KernelKind::Copy;
  std::vector<uint32_t> inputs;
  std::vector<uint32_t> outputs;
  bonsai::plan::KernelAttrs attrsType = bonsai::plan::KernelAttrs::NONE;
  std::function<flatbuffers::Offset<void>(flatbuffers::FlatBufferBuilder &)> attrs;
  std::string name;
};

/// A whole test plan.
struct PlanSpec {
  uint32_t version = kPlanVersion;
  std::string model = "test";
  std::string arch = "cpu";
  std::vector<ArenaSpec> arenas;
  std::vector<TensorSpec> tensors;
  std::vector<KernelSpec> kernels;
  std::vector<uint32_t> inputs;
  uint32_t loss = 0;
  uint64_t tokensPerStep = 0;

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
    tensors.push_back({name, dtype, std::move(shape), role, arena, offset, int64_t(bytes),
                       role == TensorRole::Parameter});
    return uint32_t(tensors.size() - 1);
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
    tensors.push_back(t);
    return uint32_t(tensors.size() - 1);
  }

  /// Appends a kernel; returns its index.
  size_t kernel(KernelKind kind, std::vector<uint32_t> in, std::vector<uint32_t> out,
                bonsai::plan::KernelAttrs attrsType = bonsai::plan::KernelAttrs::NONE,
                std::function<flatbuffers::Offset<void>(flatbuffers::FlatBufferBuilder &)> attrs = {}) {
    kernels.push_back({kind, std::move(in), std::move(out), attrsType, std::move(attrs),
                       std::string("k") + std::to_string(kernels.size())});
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
inline auto attentionAttrs(bool causal, double scale) {
  return [causal, scale](flatbuffers::FlatBufferBuilder &b) {
    return bonsai::plan::CreateAttentionAttrs(b, causal, scale).Union();
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

/// Serializes `spec` as the compiler would, with file identifier `identifier`.
inline std::vector<uint8_t> buildPlan(const PlanSpec &spec, const char *identifier = "BNSP") {
  namespace fb = bonsai::plan;
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<fb::Arena>> arenas;
  for (const ArenaSpec &a : spec.arenas)
    arenas.push_back(fb::CreateArenaDirect(b, a.name.c_str(), fb::MemorySpace::Device,
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
        static_cast<fb::TensorRole>(t.role), t.trainable, t.arena, t.offset, bytes));
  }
  std::vector<flatbuffers::Offset<fb::Kernel>> kernels;
  for (const KernelSpec &k : spec.kernels) {
    flatbuffers::Offset<void> attrs = k.attrs ? k.attrs(b) : flatbuffers::Offset<void>();
    kernels.push_back(fb::CreateKernelDirect(b, static_cast<fb::KernelKind>(k.kind), &k.inputs,
                                             &k.outputs, k.attrsType, attrs, 0, k.name.c_str()));
  }
  auto target = fb::CreateTargetDirect(b, spec.arch.c_str(), 0);
  uint64_t weights = 0, activations = 0, inputs = 0;
  for (const ArenaSpec &a : spec.arenas)
    (a.lifetime == Lifetime::Persistent ? weights : activations) += a.size;
  auto memory = fb::CreateMemorySummary(b, weights, 0, 0, activations, 0, inputs, weights + activations, 0);
  auto plan = fb::CreatePlanDirect(b, spec.version, spec.model.c_str(), target, &arenas, &tensors,
                                   &kernels, &spec.inputs, spec.loss, memory, spec.tokensPerStep);
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
  return p;
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
  return p;
}

/// Writes `bytes` to `path`.
inline void writeFile(const std::string &path, const std::vector<uint8_t> &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(bytes.data()), std::streamsize(bytes.size()));
}

/// A fresh path under the test temporary directory.
inline std::string tempPath(const std::string &name) {
  const char *dir = std::getenv("TEST_TMPDIR");
  std::string base = dir && *dir ? dir : "/tmp";
  return base + "/bonsai-rt-" + std::to_string(::getpid()) + "-" + name;
}

} // namespace bonsai::rt::test

#endif // BONSAI_TEST_RUNTIME_TESTPLANS_H
