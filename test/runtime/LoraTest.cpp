//===- LoraTest.cpp - Adapters in the runtime: kernel, initializers, plans -===//
//
// docs/lora.md: the CPU dora_scale kernel against a direct fp64 evaluation on random data;
// dora_grad against the unfused chain it replaces (mul, mul, reduce_to, dora_scale) and an fp64
// evaluation from the pre-scale output, and its messages (a zero magnitude, shapes);
// the step-0 identity (B = 0 and a RowNorm magnitude give a scale of exactly 1, f32 and bf16);
// the KaimingUniform and RowNorm initializers; the plan verifier's adapter checks (each bad
// index, shape, role and initializer named); and the executor's binding rules (an adapter the
// weights file lacks gets its initializer, one it holds is used as it is).
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Init.h"
#include "bonsai/runtime/Safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

using namespace bonsai::rt;
using namespace bonsai::rt::test;

namespace {

/// Random values in [lo, hi) stored as `dtype` (returned as the stored values, widened).
std::vector<float> randomValues(std::mt19937 &rng, DType dtype, int64_t n, float lo, float hi,
                                std::vector<uint16_t> &half, std::vector<float> &full) {
  std::uniform_real_distribution<float> dist(lo, hi);
  full.resize(size_t(n));
  for (float &v : full)
    v = dist(rng);
  if (dtype != DType::F32) {
    half.resize(size_t(n));
    TensorView view{half.data(), dtype, {n}};
    storeF32(full.data(), view);
    loadF32(view, full.data());
  }
  return full;
}

struct HostTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
  std::vector<uint16_t> half;
  TensorView view() {
    return TensorView{dtype == DType::F32 ? static_cast<void *>(values.data()) : half.data(),
                      dtype, shape};
  }
};

HostTensor randomTensor(std::mt19937 &rng, DType dtype, std::vector<int64_t> shape, float lo,
                        float hi) {
  HostTensor t{dtype, shape, {}, {}};
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  randomValues(rng, dtype, n, lo, hi, t.half, t.values);
  return t;
}

HostTensor emptyTensor(DType dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  HostTensor t{dtype, shape, std::vector<float>(size_t(n), NAN), {}};
  if (dtype != DType::F32)
    t.half.assign(size_t(n), 0xFFFF);
  return t;
}

std::vector<float> read(HostTensor &t) {
  std::vector<float> out(t.values.size());
  loadF32(t.view(), out.data());
  return out;
}

TEST(LoraKernel, DoraScaleMatchesDirectEvaluation) {
  std::mt19937 rng(7);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtypeName(dt));
    const int64_t out = 37, in = 53, r = 5;
    const double s = 1.75;
    HostTensor m = randomTensor(rng, dt, {out}, 0.5f, 2.0f);
    HostTensor w = randomTensor(rng, dt, {out, in}, -1.0f, 1.0f);
    HostTensor a = randomTensor(rng, dt, {r, in}, -0.5f, 0.5f);
    HostTensor b = randomTensor(rng, dt, {out, r}, -0.5f, 0.5f);
    HostTensor y = emptyTensor(dt, {out});
    cpu::doraScale(m.view(), w.view(), a.view(), b.view(), s, y.view());
    std::vector<float> got = read(y);
    double tol = dt == DType::F32 ? 1e-6 : dt == DType::F16 ? 2e-3 : 1.6e-2;
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0;
      for (int64_t i = 0; i < in; ++i) {
        double lora = 0;
        for (int64_t k = 0; k < r; ++k)
          lora += double(b.values[size_t(o * r + k)]) * a.values[size_t(k * in + i)];
        double v = w.values[size_t(o * in + i)] + s * lora;
        sum += v * v;
      }
      double want = m.values[size_t(o)] / std::sqrt(sum);
      EXPECT_NEAR(got[size_t(o)], want, tol * std::fabs(want)) << "row " << o;
    }
  }
}

TEST(LoraKernel, ZeroBAndRowNormMagnitudeGiveExactlyOne) {
  std::mt19937 rng(11);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtypeName(dt));
    const int64_t out = 64, in = 176, r = 8;
    HostTensor w = randomTensor(rng, dt, {out, in}, -0.1f, 0.1f);
    HostTensor a = randomTensor(rng, dt, {r, in}, -0.1f, 0.1f);
    HostTensor b = emptyTensor(dt, {out, r});
    std::vector<float> zeros(size_t(out * r), 0.0f);
    storeF32(zeros.data(), b.view());
    HostTensor m = emptyTensor(dt, {out});
    initRowNorm(w.view(), m.view());
    HostTensor y = emptyTensor(dt, {out});
    cpu::doraScale(m.view(), w.view(), a.view(), b.view(), 2.0, y.view());
    for (float v : read(y))
      EXPECT_EQ(v, 1.0f);
  }
}

TEST(LoraKernel, DoraScaleRejectsBadShapesAndZeroRows) {
  HostTensor m = emptyTensor(DType::F32, {4}), w = emptyTensor(DType::F32, {4, 6});
  HostTensor a = emptyTensor(DType::F32, {2, 6}), b = emptyTensor(DType::F32, {3, 2});
  HostTensor y = emptyTensor(DType::F32, {4});
  try {
    cpu::doraScale(m.view(), w.view(), a.view(), b.view(), 1.0, y.view());
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("lora_b shape"), std::string::npos) << e.what();
  }
  HostTensor b2 = emptyTensor(DType::F32, {4, 2});
  for (HostTensor *t : {&m, &w, &a, &b2})
    std::fill(t->values.begin(), t->values.end(), 0.0f);
  try {
    cpu::doraScale(m.view(), w.view(), a.view(), b2.view(), 1.0, y.view());
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("row 0 of w + scale·lora_b·lora_a has norm 0"),
              std::string::npos)
        << e.what();
  }
}

// dora_grad's dx is the unfused mul's, bit for bit; its dm (from the scaled output y and the
// magnitude) is the detached-norm gradient Σ dy · x / n, which the fp64 evaluation from the
// pre-scale x gives: within the rounding of y (one ulp of the dtype) plus the dtype's rounding
// of dm. The unfused chain rounds the product and the sum to the dtype too, so it is compared
// with the same tolerance.
TEST(LoraKernel, DoraGradMatchesTheUnfusedChain) {
  std::mt19937 rng(13);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtypeName(dt));
    const int64_t tokens = 3 * 29, out = 37, in = 53, r = 5;
    HostTensor m = randomTensor(rng, dt, {out}, 0.5f, 2.0f);
    HostTensor w = randomTensor(rng, dt, {out, in}, -1.0f, 1.0f);
    HostTensor a = randomTensor(rng, dt, {r, in}, -0.5f, 0.5f);
    HostTensor b = randomTensor(rng, dt, {out, r}, -0.5f, 0.5f);
    HostTensor x = randomTensor(rng, dt, {3, 29, out}, -2.0f, 2.0f);
    HostTensor dy = randomTensor(rng, dt, {3, 29, out}, -1.0f, 1.0f);
    HostTensor scale = emptyTensor(dt, {out}), y = emptyTensor(dt, {3, 29, out});
    cpu::doraScale(m.view(), w.view(), a.view(), b.view(), 1.5, scale.view());
    cpu::mul(x.view(), scale.view(), y.view());

    HostTensor dx = emptyTensor(dt, {3, 29, out}), dm = emptyTensor(dt, {out});
    cpu::doraGrad(dy.view(), y.view(), scale.view(), m.view(), dx.view(), dm.view());
    // The unfused chain: dx = dy · scale; dscale = reduce_to(dy · x); dm = dora_scale(dscale).
    HostTensor wantDx = emptyTensor(dt, {3, 29, out}), product = emptyTensor(dt, {3, 29, out});
    HostTensor dscale = emptyTensor(dt, {out}), chainDm = emptyTensor(dt, {out});
    cpu::mul(dy.view(), scale.view(), wantDx.view());
    cpu::mul(dy.view(), x.view(), product.view());
    cpu::reduceTo(product.view(), dscale.view());
    cpu::doraScale(dscale.view(), w.view(), a.view(), b.view(), 1.5, chainDm.view());
    EXPECT_EQ(read(dx), read(wantDx));

    std::vector<float> got = read(dm), chain = read(chainDm), xs = read(x), dys = read(dy);
    std::vector<float> ms = read(m), ss = read(scale);
    double ulp = dt == DType::F32 ? 1e-6 : dt == DType::F16 ? 2e-3 : 1.6e-2;
    for (int64_t o = 0; o < out; ++o) {
      // n = m / scale as the kernels see it; Σ|dy · x| / n bounds the sum's rounding.
      double norm = double(ms[size_t(o)]) / ss[size_t(o)], sum = 0, magnitude = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        double term = double(dys[size_t(t * out + o)]) * xs[size_t(t * out + o)];
        sum += term;
        magnitude += std::fabs(term);
      }
      double want = sum / norm, tol = 2 * ulp * (magnitude / norm) + 1e-7;
      EXPECT_NEAR(got[size_t(o)], want, tol) << "column " << o;
      EXPECT_NEAR(chain[size_t(o)], want, tol) << "column " << o << " (unfused chain)";
    }
  }
}

TEST(LoraKernel, DoraGradRejectsAZeroMagnitudeAndBadShapes) {
  std::mt19937 rng(17);
  HostTensor dy = randomTensor(rng, DType::F32, {2, 4}, -1, 1);
  HostTensor y = randomTensor(rng, DType::F32, {2, 4}, -1, 1);
  HostTensor scale = randomTensor(rng, DType::F32, {4}, 1, 2);
  HostTensor m = randomTensor(rng, DType::F32, {4}, 1, 2);
  HostTensor dx = emptyTensor(DType::F32, {2, 4}), dm = emptyTensor(DType::F32, {4});
  HostTensor shortM = randomTensor(rng, DType::F32, {3}, 1, 2);
  auto expectError = [](const std::function<void()> &run, const std::string &text) {
    try {
      run();
      ADD_FAILURE() << "no error; expected " << text;
    } catch (const Error &e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expectError(
      [&] {
        cpu::doraGrad(dy.view(), y.view(), scale.view(), shortM.view(), dx.view(), dm.view());
      },
      "magnitude shape [3] should be [4]");
  HostTensor bf = randomTensor(rng, DType::BF16, {2, 4}, -1, 1);
  expectError(
      [&] { cpu::doraGrad(dy.view(), bf.view(), scale.view(), m.view(), dx.view(), dm.view()); },
      "y dtype bf16 differs from dy's f32");
  m.values[2] = 0.0f;
  expectError(
      [&] { cpu::doraGrad(dy.view(), y.view(), scale.view(), m.view(), dx.view(), dm.view()); },
      "magnitude[2] is 0");
}

TEST(LoraInit, KaimingUniformIsBoundedSpreadAndDeterministic) {
  std::vector<float> x(64 * 100), y(64 * 100), z(64 * 100);
  initKaimingUniform("m.lora_A.weight", 5, TensorView{x.data(), DType::F32, {64, 100}});
  initKaimingUniform("m.lora_A.weight", 5, TensorView{y.data(), DType::F32, {64, 100}});
  initKaimingUniform("m.lora_A.weight", 6, TensorView{z.data(), DType::F32, {64, 100}});
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  float lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
  EXPECT_GE(lo, -0.1f);
  EXPECT_LE(hi, 0.1f);
  EXPECT_LT(lo, -0.099f); // 6400 draws cover the range
  EXPECT_GT(hi, 0.099f);
  double mean = 0;
  for (float v : x)
    mean += v;
  EXPECT_LT(std::fabs(mean / double(x.size())), 0.003);
}

TEST(LoraInit, RowNormIsTheNormOfEachRow) {
  std::vector<float> w = {3, 4, 0, 0, 0, 2, 1, 2, 2};
  std::vector<float> n(3);
  initRowNorm(TensorView{w.data(), DType::F32, {3, 3}}, TensorView{n.data(), DType::F32, {3}});
  EXPECT_EQ(n, (std::vector<float>{5, 2, 3}));
}

//===----------------------------------------------------------------------===//
// Plans
//===----------------------------------------------------------------------===//

/// smallPlanSpec with a LoRA adapter (r 2) on lm_head and, with `dora`, a magnitude.
struct AdaptedPlan {
  PlanSpec spec;
  uint32_t head, a, b, m;
};

AdaptedPlan adaptedPlan(bool dora) {
  AdaptedPlan p{smallPlanSpec(), 2, 0, 0, 0};
  p.a = p.spec.addInit("lm_head.lora_A.weight", DType::F32, {2, 8}, TensorRole::Parameter, 0,
                       TensorInit::KaimingUniform);
  p.b = p.spec.addInit("lm_head.lora_B.weight", DType::F32, {16, 2}, TensorRole::Parameter, 0,
                       TensorInit::Zeros);
  AdapterSpec adapter{p.head, p.a, p.b, -1, 2, 4.0, "lm_head"};
  if (dora) {
    p.m = p.spec.addInit("lm_head.lora_magnitude_vector", DType::F32, {16},
                         TensorRole::Parameter, 0, TensorInit::RowNorm, p.head);
    adapter.magnitude = int32_t(p.m);
  }
  p.spec.adapters = {adapter};
  p.spec.adapterTargets = {"lm_head"};
  return p;
}

std::string loadError(const PlanSpec &spec) {
  std::vector<uint8_t> bytes = buildPlan(spec);
  try {
    loadPlanBuffer(bytes.data(), bytes.size(), "test.plan");
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

void expectError(const PlanSpec &spec, const std::string &part) {
  std::string error = loadError(spec);
  EXPECT_NE(error.find(part), std::string::npos) << "error: '" << error << "'\nwanted: " << part;
}

TEST(LoraPlan, LoadsAdapters) {
  AdaptedPlan p = adaptedPlan(true);
  std::vector<uint8_t> bytes = buildPlan(p.spec);
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "test.plan");
  ASSERT_EQ(plan.adapters.size(), 1u);
  const AdapterInfo &a = plan.adapters[0];
  EXPECT_EQ(a.base, p.head);
  EXPECT_EQ(a.loraA, p.a);
  EXPECT_EQ(a.loraB, p.b);
  ASSERT_TRUE(a.magnitude);
  EXPECT_EQ(*a.magnitude, p.m);
  EXPECT_EQ(a.rank, 2u);
  EXPECT_DOUBLE_EQ(a.alpha, 4.0);
  EXPECT_EQ(a.module, "lm_head");
  EXPECT_EQ(plan.adapterTargets, (std::vector<std::string>{"lm_head"}));
  EXPECT_EQ(plan.tensors[p.m].init, TensorInit::RowNorm);
}

TEST(LoraPlan, RejectsBadAdapters) {
  {
    AdaptedPlan p = adaptedPlan(false);
    p.spec.adapters[0].loraA = 99;
    expectError(p.spec, "adapter 0 'lm_head' lora_a is tensor 99, but the plan has");
  }
  {
    AdaptedPlan p = adaptedPlan(false);
    p.spec.adapters[0].loraB = p.a;
    expectError(p.spec, "adapter 0 'lm_head' lora_b is tensor " + std::to_string(p.a) +
                            " 'lm_head.lora_A.weight', already used by adapter 0");
  }
  {
    AdaptedPlan p = adaptedPlan(false);
    p.spec.adapters[0].rank = 3;
    expectError(p.spec, "lora_a tensor " + std::to_string(p.a) +
                            " 'lm_head.lora_A.weight' has shape [2, 8], expected [3, 8]");
  }
  {
    AdaptedPlan p = adaptedPlan(false);
    p.spec.adapters[0].loraB = 5; // the activation "h"
    expectError(p.spec, "lora_b is tensor 5 'h' of role activation, not a parameter");
  }
  {
    AdaptedPlan p = adaptedPlan(true);
    p.spec.adapters[0].magnitude = int32_t(p.b);
    expectError(p.spec, "magnitude is tensor " + std::to_string(p.b));
  }
  {
    AdaptedPlan p = adaptedPlan(false);
    p.spec.adapters[0].alpha = 0;
    expectError(p.spec, "adapter 0 'lm_head' alpha must be positive and finite, got 0");
  }
}

// The loader's contract of DoraGrad (runtime/contract/Lora.cpp): a well-formed kernel loads;
// each bad operand is named with the tensor and what was expected.
TEST(LoraPlan, DoraGradContract) {
  struct Ids {
    uint32_t dy, y, scale, m, dx, dm;
  };
  auto plan = [](Ids &ids) {
    PlanSpec spec = smallPlanSpec();
    ids.dy = spec.add("dy", DType::F32, {2, 4, 16}, TensorRole::Activation, 1);
    ids.y = spec.add("y", DType::F32, {2, 4, 16}, TensorRole::Activation, 1);
    ids.scale = spec.add("scale", DType::F32, {16}, TensorRole::Activation, 1);
    ids.m = spec.add("m", DType::F32, {16}, TensorRole::Parameter, 0);
    ids.dx = spec.add("dx", DType::F32, {2, 4, 16}, TensorRole::Activation, 1);
    ids.dm = spec.add("dm", DType::F32, {16}, TensorRole::Activation, 1);
    spec.kernel(KernelKind::DoraGrad, {ids.dy, ids.y, ids.scale, ids.m}, {ids.dx, ids.dm});
    return spec;
  };
  Ids ids{};
  EXPECT_EQ(loadError(plan(ids)), "");
  auto reshaped = [&](uint32_t Ids::*which, std::vector<int64_t> shape, DType dtype) {
    PlanSpec spec = plan(ids);
    spec.tensors[ids.*which].shape = std::move(shape);
    spec.tensors[ids.*which].dtype = dtype;
    spec.tensors[ids.*which].bytes = -1;
    return spec;
  };
  expectError(reshaped(&Ids::y, {2, 4, 8}, DType::F32),
              "'y') shape: expected [2, 4, 16], got [2, 4, 8]");
  expectError(reshaped(&Ids::scale, {8}, DType::F32), "'scale') shape: expected [16], got [8]");
  expectError(reshaped(&Ids::m, {16}, DType::BF16), "'m') dtype: expected f32 (as dy), got bf16");
  expectError(reshaped(&Ids::dm, {16}, DType::BF16),
              "'dm'): expected [16] f32 (as magnitude (tensor");
  PlanSpec wrongArity = plan(ids);
  wrongArity.kernels.back().inputs.pop_back();
  expectError(wrongArity, "expected 4 inputs (dy, y, scale, magnitude), got 3");
}

TEST(LoraPlan, RejectsBadInitializers) {
  {
    AdaptedPlan p = adaptedPlan(false);
    p.spec.tensors[5].init = TensorInit::KaimingUniform; // an activation
    expectError(p.spec, "tensor 5 'h' has role activation and init KaimingUniform, which only a "
                        "parameter can have");
  }
  {
    AdaptedPlan p = adaptedPlan(false);
    p.spec.tensors[1].init = TensorInit::KaimingUniform; // model.norm.weight [8]
    expectError(p.spec, "has init KaimingUniform but shape [8]");
  }
  {
    AdaptedPlan p = adaptedPlan(true);
    p.spec.tensors[p.m].initSource = 0; // the embedding [16, 8]: rows match, fine
    EXPECT_EQ(loadError(p.spec), "");
    p.spec.tensors[p.m].initSource = 1; // model.norm.weight [8]
    expectError(p.spec, "is not the row count of tensor 1 'model.norm.weight' [8]");
    p.spec.tensors[p.m].initSource = p.a; // itself an adapter
    expectError(p.spec, "is the row norms of tensor " + std::to_string(p.a) +
                            " 'lm_head.lora_A.weight', which is not a bound parameter");
  }
}

//===----------------------------------------------------------------------===//
// Executor binding
//===----------------------------------------------------------------------===//

std::vector<float> tensorValues(const Executor &e, uint32_t t) {
  const TensorView &v = e.view(t);
  std::vector<float> out(size_t(v.numel()));
  loadF32(v, out.data());
  return out;
}

TEST(LoraExecutor, InitializesAdaptersTheWeightsLack) {
  AdaptedPlan p = adaptedPlan(true);
  std::vector<uint8_t> bytes = buildPlan(p.spec);
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "test.plan");

  // Base weights only: the adapters start from their initializers.
  std::string dir = makeTempDir("lora_exec");
  std::mt19937 rng(3);
  std::vector<float> table(16 * 8), norm(8), head(16 * 8), a(2 * 8), b(16 * 2), m(16);
  for (auto *v : {&table, &norm, &head, &a, &b, &m})
    for (float &x : *v)
      x = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<SafetensorsTensor> base = {
      {"model.embed_tokens.weight", DType::F32, {16, 8}, table.data()},
      {"model.norm.weight", DType::F32, {8}, norm.data()},
      {"lm_head.weight", DType::F32, {16, 8}, head.data()}};
  writeSafetensors(dir + "/base.safetensors", base);
  Executor e(plan);
  e.bindWeights(Checkpoint::open(dir + "/base.safetensors"), 9);
  std::vector<float> gotA = tensorValues(e, p.a);
  for (float x : gotA)
    EXPECT_LE(std::fabs(x), float(1 / std::sqrt(8.0)));
  std::vector<float> wantA(16);
  initKaimingUniform("lm_head.lora_A.weight", 9, TensorView{wantA.data(), DType::F32, {2, 8}});
  EXPECT_EQ(gotA, wantA);
  EXPECT_EQ(tensorValues(e, p.b), std::vector<float>(32, 0.0f));
  std::vector<float> gotM = tensorValues(e, p.m);
  for (int o = 0; o < 16; ++o) {
    double sum = 0;
    for (int i = 0; i < 8; ++i)
      sum += double(head[size_t(o * 8 + i)]) * head[size_t(o * 8 + i)];
    EXPECT_EQ(gotM[size_t(o)], float(std::sqrt(sum))) << "row " << o;
  }

  // Initialized from the seed alone: the same adapter values.
  Executor fresh(plan);
  fresh.initWeights(9);
  EXPECT_EQ(tensorValues(fresh, p.a), wantA);
  EXPECT_EQ(tensorValues(fresh, p.b), std::vector<float>(32, 0.0f));

  // With the adapters in the file, the file's values are used (B non-zero, m arbitrary).
  std::vector<SafetensorsTensor> all = base;
  all.push_back({"lm_head.lora_A.weight", DType::F32, {2, 8}, a.data()});
  all.push_back({"lm_head.lora_B.weight", DType::F32, {16, 2}, b.data()});
  all.push_back({"lm_head.lora_magnitude_vector", DType::F32, {16}, m.data()});
  writeSafetensors(dir + "/all.safetensors", all);
  Executor bound(plan);
  bound.bindWeights(Checkpoint::open(dir + "/all.safetensors"), 9);
  EXPECT_EQ(tensorValues(bound, p.a), a);
  EXPECT_EQ(tensorValues(bound, p.b), b);
  EXPECT_EQ(tensorValues(bound, p.m), m);

  // A base weight is still required.
  writeSafetensors(dir + "/nohead.safetensors", {base[0], base[1]});
  Executor missing(plan);
  try {
    missing.bindWeights(Checkpoint::open(dir + "/nohead.safetensors"), 9);
    FAIL() << "no error";
  } catch (const Error &err) {
    EXPECT_NE(std::string(err.what()).find("1 missing: lm_head.weight"), std::string::npos)
        << err.what();
  }
  removeTree(dir);
}

} // namespace
