//===- ExportTest.cpp - PEFT adapter config and adapter merges -------------===//
//
// docs/import-export.md: mergeAdapter against a direct fp64 evaluation on random data (LoRA and
// DoRA; f32, bf16 and NF4 bases), PEFT's target_modules (the recipe's patterns when PEFT's rule
// reproduces the adapted modules, the module paths otherwise), the adapter_config.json keys,
// and the refusals (no adapters, mixed ranks, bad destinations).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Export.h"
#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Nf4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace bonsai::rt;

namespace {

std::vector<float> randomFloats(std::mt19937 &rng, size_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng);
  return v;
}

/// W + s·B·A (and DoRA's row scaling) in fp64 from the float values of W, A, B, m.
std::vector<double> referenceMerge(const std::vector<float> &w, const std::vector<float> &a,
                                   const std::vector<float> &b, const std::vector<float> *m,
                                   int64_t out, int64_t in, int64_t r, double s) {
  std::vector<double> ref(size_t(out * in));
  for (int64_t o = 0; o < out; ++o) {
    double norm = 0;
    for (int64_t i = 0; i < in; ++i) {
      double d = 0;
      for (int64_t k = 0; k < r; ++k)
        d += double(b[size_t(o * r + k)]) * double(a[size_t(k * in + i)]);
      ref[size_t(o * in + i)] = double(w[size_t(o * in + i)]) + s * d;
      norm += ref[size_t(o * in + i)] * ref[size_t(o * in + i)];
    }
    if (m)
      for (int64_t i = 0; i < in; ++i)
        ref[size_t(o * in + i)] *= double((*m)[size_t(o)]) / std::sqrt(norm);
  }
  return ref;
}

struct MergeCase {
  DType base;
  bool dora;
};

class MergeTest : public ::testing::TestWithParam<MergeCase> {};

TEST_P(MergeTest, MatchesFp64Reference) {
  const int64_t out = 48, in = 80, r = 4;
  const double s = 16.0 / 4;
  std::mt19937 rng(7);
  std::vector<float> w = randomFloats(rng, size_t(out * in), 0.05f);
  std::vector<float> a = randomFloats(rng, size_t(r * in), 0.1f);
  std::vector<float> b = randomFloats(rng, size_t(out * r), 0.02f);
  std::vector<float> m = randomFloats(rng, size_t(out), 1.0f);
  for (float &x : m)
    x = std::fabs(x) + 0.5f;

  // The base as the runtime holds it, and the float values the reference merges.
  std::vector<uint8_t> storage;
  TensorView base{nullptr, GetParam().base, {out, in}};
  std::vector<float> wSeen(w.size());
  if (GetParam().base == DType::NF4) {
    base.quantBlock = 64;
    base.quantDoubleBlock = 256;
    storage.resize(nf4StorageBytes(w.size(), 64, 256));
    quantizeNf4(w.data(), w.size(), 64, 256, storage.data());
    dequantizeNf4(storage.data(), w.size(), 64, 256, wSeen.data());
  } else {
    storage.resize(w.size() * dtypeSize(GetParam().base));
    base.data = storage.data();
    storeF32(w.data(), base);
    loadF32(base, wSeen.data());
  }
  base.data = storage.data();
  TensorView av{a.data(), DType::F32, {r, in}}, bv{b.data(), DType::F32, {out, r}};
  TensorView mv{m.data(), DType::F32, {out}};

  std::vector<float> merged;
  mergeAdapter(base, av, bv, GetParam().dora ? &mv : nullptr, s, merged);
  std::vector<double> ref =
      referenceMerge(wSeen, a, b, GetParam().dora ? &m : nullptr, out, in, r, s);
  ASSERT_EQ(merged.size(), ref.size());
  double scale = 0, worst = 0, effect = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::fabs(ref[i]));
    worst = std::max(worst, std::fabs(double(merged[i]) - ref[i]));
    effect = std::max(effect, std::fabs(ref[i] - double(wSeen[i])));
  }
  EXPECT_LE(worst, 1e-6 * scale);
  // The adapter changes the weight far beyond that tolerance: a lost scale or term would show.
  EXPECT_GE(effect, 1e-3 * scale);
}

INSTANTIATE_TEST_SUITE_P(Bases, MergeTest,
                         ::testing::Values(MergeCase{DType::F32, false},
                                           MergeCase{DType::F32, true},
                                           MergeCase{DType::BF16, false},
                                           MergeCase{DType::NF4, false},
                                           MergeCase{DType::NF4, true}));

/// A plan with two layers of q_proj and v_proj weights, adapters on the modules `adapted`.
LoadedPlan planWith(const std::vector<std::string> &adapted,
                    const std::vector<std::string> &targets, uint32_t rank = 4) {
  LoadedPlan plan;
  plan.path = "test.plan";
  auto add = [&](const std::string &name, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = name;
    t.shape = std::move(shape);
    t.role = TensorRole::Parameter;
    plan.tensors.push_back(t);
    return uint32_t(plan.tensors.size() - 1);
  };
  add("model.embed_tokens.weight", {256, 64});
  for (int layer = 0; layer < 2; ++layer)
    for (const char *proj : {"q_proj", "v_proj"})
      add("model.layers." + std::to_string(layer) + ".self_attn." + proj + ".weight", {64, 64});
  for (const std::string &module : adapted) {
    AdapterInfo a;
    a.module = module;
    for (uint32_t i = 0; i < plan.tensors.size(); ++i)
      if (plan.tensors[i].name == module + ".weight")
        a.base = i;
    a.loraA = add(module + ".lora_A.weight", {int64_t(rank), 64});
    a.loraB = add(module + ".lora_B.weight", {64, int64_t(rank)});
    a.rank = rank;
    a.alpha = 8;
    plan.adapters.push_back(a);
  }
  plan.adapterTargets = targets;
  return plan;
}

std::vector<std::string> targetModules(const LoadedPlan &plan) {
  JsonValue config = parseJson(peftAdapterConfig(plan, "base"), "adapter_config.json");
  std::vector<std::string> out;
  for (const JsonValue &v : config.find("target_modules")->elements())
    out.push_back(v.stringValue());
  return out;
}

TEST(PeftConfigTest, KeysAndValues) {
  LoadedPlan plan = planWith({"model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"},
                             {"q_proj"});
  JsonValue config = parseJson(peftAdapterConfig(plan, "org/base"), "adapter_config.json");
  EXPECT_EQ(config.find("peft_type")->stringValue(), "LORA");
  EXPECT_EQ(config.find("task_type")->stringValue(), "CAUSAL_LM");
  EXPECT_EQ(config.find("r")->unsignedValue(), 4u);
  EXPECT_EQ(config.find("lora_alpha")->numberValue(), 8.0);
  EXPECT_FALSE(config.find("use_dora")->boolValue());
  EXPECT_EQ(config.find("bias")->stringValue(), "none");
  EXPECT_EQ(config.find("lora_dropout")->numberValue(), 0.0);
  EXPECT_EQ(config.find("base_model_name_or_path")->stringValue(), "org/base");
  EXPECT_TRUE(config.find("modules_to_save")->isNull());
}

TEST(PeftConfigTest, PatternsWhenPeftSelectsTheSameModules) {
  EXPECT_EQ(targetModules(planWith({"model.layers.0.self_attn.q_proj",
                                    "model.layers.1.self_attn.q_proj"},
                                   {"q_proj"})),
            std::vector<std::string>{"q_proj"});
}

TEST(PeftConfigTest, ModulePathsWhenPeftWouldSelectMore) {
  // "q_proj" would also adapt layer 1, which the plan did not adapt.
  EXPECT_EQ(targetModules(planWith({"model.layers.0.self_attn.q_proj"}, {"q_proj"})),
            std::vector<std::string>{"model.layers.0.self_attn.q_proj"});
  // A glob means something else to PEFT.
  EXPECT_EQ(targetModules(planWith({"model.layers.1.self_attn.v_proj"}, {"*.1.*v_proj"})),
            std::vector<std::string>{"model.layers.1.self_attn.v_proj"});
}

TEST(PeftConfigTest, Refusals) {
  LoadedPlan none = planWith({}, {});
  EXPECT_THROW(
      {
        try {
          checkPeftExportable(none);
        } catch (const Error &e) {
          EXPECT_NE(std::string(e.what()).find("has no LoRA or DoRA adapters"),
                    std::string::npos);
          throw;
        }
      },
      Error);
  LoadedPlan mixed = planWith({"model.layers.0.self_attn.q_proj"}, {"q_proj"});
  LoadedPlan other = planWith({"model.layers.1.self_attn.q_proj"}, {"q_proj"}, 8);
  AdapterInfo second = other.adapters.front();
  mixed.adapters.push_back(second);
  try {
    checkPeftExportable(mixed);
    FAIL() << "mixed ranks accepted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("one PEFT adapter config holds one rank"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(checkExportDestination("/nonexistent-dir/adapter", "--export-adapter", true),
               Error);
  EXPECT_THROW(checkExportDestination("/", "--export-merged", false), Error);
  EXPECT_NO_THROW(checkExportDestination("adapter-out", "--export-adapter", true));
}

} // namespace
