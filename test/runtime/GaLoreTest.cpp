//===- GaLoreTest.cpp - GaLore's CPU kernels and plan rules ---------------===//
//
// The CPU GaLore kernels' properties that the end-to-end NumPy comparison
// (test/EndToEnd/galore.test) does not single out: the randomized projector is orthonormal and
// reproducible, the exact one holds eigenvectors of A·Aᵀ, a refresh that is not due or meets a
// non-finite or zero gradient leaves the projector untouched and records why, a non-finite
// one is retried round-robin (one weight per step) and a zero one waits for the schedule, a
// rank-1 or rank-3 gradient still refreshes (P spans it, completed by unit vectors); and
// the plan verifier's rules for the three kinds, one planted mistake at a time, on the
// training test plan whose lm_head update is replaced by GaLore's (16 x 8: projected on the
// right, rank 2). A few steps of that plan run, and a NaN gradient surfaces as a skipped
// refresh through Executor::galoreSkipped.
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"

#include "bonsai/runtime/GaLore.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace bonsai::rt;
using namespace bonsai::rt::test;
namespace fb = bonsai::plan;

namespace {

std::vector<float> randomValues(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng);
  return v;
}

TensorView viewOf(std::vector<float> &v, std::vector<int64_t> shape) {
  return TensorView{v.data(), DType::F32, std::move(shape)};
}

struct Refresh {
  std::vector<float> grad, workspace, projector, status;
  int64_t step = 0;
  galore::RefreshParams params;
  int64_t m, n;

  Refresh(int64_t m, int64_t n, int64_t rank, bool randomized) : m(m), n(n) {
    int64_t s = std::min(m, n), l = std::max(m, n);
    grad = randomValues(size_t(m * n), uint32_t(m * 7 + n));
    workspace.assign(size_t(galore::workspaceElements(s, l, rank)), 0.0f);
    projector.assign(size_t(s * rank), 0.0f);
    status.assign(2, 0.0f);
    params.rank = rank;
    params.updateProjGap = 5;
    params.offset = 2;
    params.slot = 1;
    params.left = m <= n;
    params.randomized = randomized;
  }
  void run() {
    int64_t s = std::min(m, n), l = std::max(m, n);
    cpu::galoreRefresh(viewOf(grad, {m, n}), TensorView{&step, DType::I64, {}}, params,
                       viewOf(workspace, {galore::workspaceElements(s, l, params.rank)}),
                       viewOf(projector, {s, params.rank}), viewOf(status, {2}));
  }
  /// A (the gradient with its smaller side first) as a function.
  double a(int64_t i, int64_t k) const {
    return params.left ? grad[size_t(i * n + k)] : grad[size_t(k * n + i)];
  }
};

TEST(GaLoreKernelTest, RandomizedProjectorIsOrthonormalAndReproducible) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{12, 30}, {30, 12}}) {
    Refresh r(m, n, 4, true);
    r.run();
    EXPECT_EQ(r.status[1], 0.0f);
    int64_t s = std::min(m, n);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        double dot = 0.0;
        for (int64_t k = 0; k < s; ++k)
          dot += double(r.projector[size_t(k * 4 + i)]) * r.projector[size_t(k * 4 + j)];
        EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << m << "x" << n << " columns " << i << j;
      }
    std::vector<float> first = r.projector;
    r.projector.assign(r.projector.size(), 0.0f);
    r.run();
    EXPECT_EQ(r.projector, first) << "the same seed, slot and step give the same sketch";
    r.params.seed = 1;
    r.run();
    EXPECT_NE(r.projector, first) << "another seed gives another sketch";
  }
}

TEST(GaLoreKernelTest, ExactProjectorHoldsTopEigenvectors) {
  Refresh r(10, 24, 3, false);
  r.run();
  ASSERT_EQ(r.status[1], 0.0f);
  // A·Aᵀ·p = λ·p for each column, λ = pᵀ·A·Aᵀ·p, decreasing.
  double previous = INFINITY;
  for (int64_t c = 0; c < 3; ++c) {
    std::vector<double> w(10, 0.0);
    for (int64_t i = 0; i < 10; ++i)
      for (int64_t k = 0; k < 24; ++k) {
        double aTp = 0.0;
        for (int64_t j = 0; j < 10; ++j)
          aTp += r.a(j, k) * r.projector[size_t(j * 3 + c)];
        w[size_t(i)] += r.a(i, k) * aTp;
      }
    double lambda = 0.0, residual = 0.0;
    for (int64_t i = 0; i < 10; ++i)
      lambda += w[size_t(i)] * r.projector[size_t(i * 3 + c)];
    for (int64_t i = 0; i < 10; ++i)
      residual =
          std::max(residual, std::fabs(w[size_t(i)] - lambda * r.projector[size_t(i * 3 + c)]));
    EXPECT_LT(residual, 1e-5 * lambda) << "column " << c;
    EXPECT_LT(lambda, previous);
    previous = lambda;
  }
}

TEST(GaLoreKernelTest, SkippedRefreshesKeepTheProjector) {
  Refresh r(12, 30, 4, true);
  r.projector = randomValues(r.projector.size(), 3);
  std::vector<float> kept = r.projector;
  r.step = 1; // (1 + 2) % 5 != 0 and no failure pending: not due
  r.run();
  EXPECT_EQ(r.projector, kept);
  EXPECT_EQ(r.status[1], 0.0f);

  r.step = 3; // due, but a NaN
  r.grad[17] = NAN;
  r.run();
  EXPECT_EQ(r.projector, kept);
  EXPECT_EQ(r.status[1], float(galore::kNonFinite));
  EXPECT_EQ(r.status[0], 0.0f) << "another weight's slot";

  r.step = 5; // slot 1 of 2 weights: 5 % 2 == 1, the failure's retry, now with a zero gradient
  r.grad.assign(r.grad.size(), 0.0f);
  r.run();
  EXPECT_EQ(r.projector, kept);
  EXPECT_EQ(r.status[1], float(galore::kRankDeficient)) << "a zero gradient has no subspace";

  r.grad = randomValues(r.grad.size(), 4);
  for (int64_t step : {6, 7}) { // a zero sketch waits for the schedule: not retried
    r.step = step;
    r.run();
    EXPECT_EQ(r.projector, kept) << "step " << step;
    EXPECT_EQ(r.status[1], -float(galore::kRankDeficient)) << "pending, not reported again";
  }
  r.step = 8; // (8 + 2) % 5 == 0: the next scheduled refresh
  r.run();
  EXPECT_NE(r.projector, kept);
  EXPECT_EQ(r.status[1], 0.0f);
}

TEST(GaLoreKernelTest, NonFiniteRetriesAreRoundRobin) {
  // Slot 2 of 4 weights, T = 100 (offset 10): the staggered refreshes are at steps 0 and 90.
  // A refresh that met a NaN is retried only on steps with step % 4 == 2, so over all weights
  // together at most one retry runs per step.
  Refresh r(12, 30, 4, true);
  r.status.assign(4, 0.0f);
  r.params.slot = 2;
  r.params.updateProjGap = 100;
  r.params.offset = 10;
  auto run = [&] {
    cpu::galoreRefresh(viewOf(r.grad, {12, 30}), TensorView{&r.step, DType::I64, {}}, r.params,
                       viewOf(r.workspace, {galore::workspaceElements(12, 30, 4)}),
                       viewOf(r.projector, {12, 4}), viewOf(r.status, {4}));
  };
  r.step = 0;
  run();
  ASSERT_EQ(r.status[2], 0.0f);
  std::vector<float> kept = r.projector;
  r.grad[5] = INFINITY;
  r.step = 90;
  run();
  ASSERT_EQ(r.status[2], float(galore::kNonFinite));
  int attempts = 0;
  for (r.step = 91; r.step < 110; ++r.step) {
    run();
    bool retried = r.status[2] > 0.0f;
    attempts += retried;
    EXPECT_EQ(retried, r.step % 4 == 2) << "step " << r.step;
    EXPECT_EQ(std::fabs(r.status[2]), float(galore::kNonFinite)) << "step " << r.step;
    EXPECT_EQ(r.projector, kept);
  }
  EXPECT_EQ(attempts, 4); // 94, 98, 102 and 106
  // A finite gradient is taken at the next turn only, then the weight is back on schedule.
  r.grad[5] = 0.5f;
  r.step = 111;
  run();
  EXPECT_EQ(r.projector, kept) << "not slot 2's turn";
  EXPECT_EQ(r.status[2], -float(galore::kNonFinite));
  r.step = 114;
  run();
  EXPECT_NE(r.projector, kept);
  EXPECT_EQ(r.status[2], 0.0f);
  kept = r.projector;
  r.step = 118; // 118 % 4 == 2, but nothing is pending and (118 + 10) % 100 != 0
  run();
  EXPECT_EQ(r.projector, kept);
}

/// Columns i, j of the s x rank projector.
double columnDot(const std::vector<float> &p, int64_t s, int64_t rank, int64_t i, int64_t j) {
  double dot = 0.0;
  for (int64_t k = 0; k < s; ++k)
    dot += double(p[size_t(k * rank + i)]) * p[size_t(k * rank + j)];
  return dot;
}

void expectOrthonormal(const std::vector<float> &p, int64_t s, int64_t rank, double tol) {
  for (int64_t i = 0; i < rank; ++i)
    for (int64_t j = 0; j < rank; ++j)
      EXPECT_NEAR(columnDot(p, s, rank, i, j), i == j ? 1.0 : 0.0, tol) << "columns " << i << j;
}

TEST(GaLoreKernelTest, RankOneGradientStillRefreshes) {
  // G = u·vᵀ exactly in f32 (entries with few significant bits, products exact), rank 1 < 6:
  // the sketch A·Ω has one independent column. The refresh succeeds; P's first column spans
  // u, and the other five complete it: the unit vectors e_0, e_1, ... projected off the
  // columns before them (Gram-Schmidt, taken when their squared residual exceeds 1 / (4 r)),
  // computed here independently of the kernel.
  for (bool left : {true, false}) {
    int64_t m = left ? 10 : 26, n = left ? 26 : 10, s = 10, rank = 6;
    Refresh r(m, n, rank, true);
    std::vector<double> u(static_cast<size_t>(s)), v(26);
    for (int64_t i = 0; i < s; ++i)
      u[size_t(i)] = double((i * 5 + 3) % 11 - 5) / 8.0;
    for (int64_t k = 0; k < 26; ++k)
      v[size_t(k)] = double((k * 7 + 2) % 13 - 6) / 4.0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < n; ++k)
        r.grad[size_t(i * n + k)] = float(left ? u[size_t(i)] * v[size_t(k)]
                                               : v[size_t(i)] * u[size_t(k)]);
    r.step = 0;
    r.run();
    ASSERT_EQ(r.status[1], 0.0f) << "a rank-1 gradient refreshes";
    expectOrthonormal(r.projector, s, rank, 1e-6);

    double unorm = 0.0;
    for (double x : u)
      unorm += x * x;
    unorm = std::sqrt(unorm);
    double sign = r.projector[0] * u[0] >= 0 ? 1.0 : -1.0;
    std::vector<std::vector<double>> basis{{}};
    for (int64_t i = 0; i < s; ++i)
      basis[0].push_back(sign * u[size_t(i)] / unorm);
    for (int64_t e = 0; e < rank && int64_t(basis.size()) < rank; ++e) {
      std::vector<double> w(static_cast<size_t>(s), 0.0);
      w[size_t(e)] = 1.0;
      for (int pass = 0; pass < 2; ++pass)
        for (const auto &b : basis) {
          double dot = 0.0;
          for (int64_t i = 0; i < s; ++i)
            dot += b[size_t(i)] * w[size_t(i)];
          for (int64_t i = 0; i < s; ++i)
            w[size_t(i)] -= dot * b[size_t(i)];
        }
      double norm = 0.0;
      for (double x : w)
        norm += x * x;
      if (norm <= 0.25 / double(rank))
        continue;
      for (double &x : w)
        x /= std::sqrt(norm);
      basis.push_back(w);
    }
    ASSERT_EQ(int64_t(basis.size()), rank);
    for (int64_t c = 0; c < rank; ++c)
      for (int64_t i = 0; i < s; ++i)
        EXPECT_NEAR(r.projector[size_t(i * rank + c)], basis[size_t(c)][size_t(i)], 1e-6)
            << (left ? "left" : "right") << " column " << c << " row " << i;
  }
}

TEST(GaLoreKernelTest, LowRankGradientSpansItsRange) {
  // Rank 3 < 8: only rows 2, 5 and 7 of A are nonzero (random), so every sketch lies in
  // span(e_2, e_5, e_7) exactly. P is orthonormal, its first three columns span that space
  // (A = P·Pᵀ·A), and the refresh is the same when repeated.
  int64_t m = 12, n = 40, rank = 8;
  Refresh r(m, n, rank, true);
  for (int64_t i = 0; i < m; ++i)
    if (i != 2 && i != 5 && i != 7)
      for (int64_t k = 0; k < n; ++k)
        r.grad[size_t(i * n + k)] = 0.0f;
  r.step = 0;
  r.run();
  ASSERT_EQ(r.status[1], 0.0f);
  expectOrthonormal(r.projector, m, rank, 1e-6);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t i = 0; i < m; ++i)
      if (i != 2 && i != 5 && i != 7)
        EXPECT_NEAR(r.projector[size_t(i * rank + c)], 0.0, 1e-7) << "column " << c;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t k = 0; k < n; ++k) {
      double back = 0.0;
      for (int64_t c = 0; c < rank; ++c) {
        double pta = 0.0;
        for (int64_t j = 0; j < m; ++j)
          pta += double(r.projector[size_t(j * rank + c)]) * r.a(j, k);
        back += r.projector[size_t(i * rank + c)] * pta;
      }
      EXPECT_NEAR(back, r.a(i, k), 1e-5) << i << ", " << k;
    }
  std::vector<float> first = r.projector;
  r.projector.assign(r.projector.size(), 0.0f);
  r.run();
  EXPECT_EQ(r.projector, first) << "the completion is deterministic";
}

//===----------------------------------------------------------------------===//
// The training test plan with GaLore on the lm_head.
//===----------------------------------------------------------------------===//

auto refreshAttrs(int64_t rank, int64_t gap, int64_t offset, int64_t slot, bool left) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return fb::CreateGaloreRefreshAttrs(b, rank, gap, offset, slot, left, true, 1, 0).Union();
  };
}
auto projectAttrs(bool left) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return fb::CreateGaloreProjectAttrs(b, left, false).Union();
  };
}
auto galoreAdamWAttrs(bool left, double scale = 0.25) {
  return [=](flatbuffers::FlatBufferBuilder &b) {
    return fb::CreateGaloreAdamWAttrs(b, 0.9, 0.95, 1e-8, 0.01, 1.0, scale, left).Union();
  };
}

struct GaLorePlan {
  PlanSpec spec;
  TrainingTensors t;
  size_t refresh, project, update;
  uint32_t projector, status, workspace, r, m, v;
};

/// trainingPlanSpec with the lm_head's AdamW replaced by GaLore at rank 2, T = 3.
GaLorePlan galorePlan() {
  GaLorePlan g;
  g.spec = trainingPlanSpec({}, &g.t);
  PlanSpec &p = g.spec;
  const int64_t V = 16, D = 8, rank = 2;
  auto Z = TensorInit::Zeros;
  auto S = TensorRole::OptimizerState;
  g.projector = p.addInit("lm_head.weight.galore_projector", DType::F32, {D, rank}, S, 2, Z);
  g.status = p.addInit("galore.status", DType::F32, {1}, S, 2, Z);
  g.m = p.addInit("lm_head.weight.galore.exp_avg", DType::F32, {V, rank}, S, 2, Z);
  g.v = p.addInit("lm_head.weight.galore.exp_avg_sq", DType::F32, {V, rank}, S, 2, Z);
  g.workspace = p.add("galore_refresh.ws", DType::F32, {galore::workspaceElements(D, V, rank)},
                      TensorRole::Workspace, 1);
  g.r = p.add("galore_project.r", DType::F32, {V, rank}, TensorRole::Activation, 1);
  // The lm_head's AdamWUpdate is the second one; GaLore's kernels take its place.
  size_t adam = 0;
  for (size_t i = 0, seen = 0; i < p.kernels.size(); ++i)
    if (p.kernels[i].kind == KernelKind::AdamWUpdate && seen++ == 1)
      adam = i;
  std::vector<KernelSpec> galore = {{KernelKind::GaloreRefresh,
                                     {g.t.gradHead, g.t.step},
                                     {g.workspace, g.projector, g.status},
                                     fb::KernelAttrs::GaloreRefreshAttrs,
                                     refreshAttrs(rank, 3, 0, 0, false),
                                     "refresh",
                                     Phase::Update},
                                    {KernelKind::GaloreProject,
                                     {g.t.gradHead, g.projector},
                                     {g.r},
                                     fb::KernelAttrs::GaloreProjectAttrs,
                                     projectAttrs(false),
                                     "project",
                                     Phase::Update},
                                    {KernelKind::GaloreAdamWUpdate,
                                     {g.t.step, g.t.lr, g.t.gradNorm, g.projector},
                                     {g.r, g.t.head, g.m, g.v},
                                     fb::KernelAttrs::GaloreAdamWAttrs,
                                     galoreAdamWAttrs(false),
                                     "update",
                                     Phase::Update}};
  p.kernels.erase(p.kernels.begin() + long(adam));
  p.kernels.insert(p.kernels.begin() + long(adam), galore.begin(), galore.end());
  g.refresh = adam;
  g.project = adam + 1;
  g.update = adam + 2;
  return g;
}

std::string loadError(const PlanSpec &spec) {
  std::vector<uint8_t> bytes = buildPlan(spec);
  try {
    loadPlanBuffer(bytes.data(), bytes.size(), "galore.plan");
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

void expectError(const PlanSpec &spec, std::initializer_list<std::string> parts) {
  std::string message = loadError(spec);
  ASSERT_FALSE(message.empty()) << "the plan loaded";
  for (const std::string &part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(GaLorePlanTest, LoadsAndTrains) {
  GaLorePlan g = galorePlan();
  std::vector<uint8_t> bytes = buildPlan(g.spec);
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "galore.plan");
  const KernelInfo &refresh = plan.kernels[g.refresh];
  EXPECT_EQ(refresh.kind, KernelKind::GaloreRefresh);
  EXPECT_EQ(refresh.attrsAs<GaloreRefreshAttrs>().rank, 2);
  EXPECT_EQ(refresh.attrsAs<GaloreRefreshAttrs>().updateProjGap, 3);
  EXPECT_FALSE(refresh.attrsAs<GaloreRefreshAttrs>().left);
  EXPECT_DOUBLE_EQ(plan.kernels[g.update].attrsAs<GaloreAdamWAttrs>().scale, 0.25);

  // The non-finite guard off: the refresh must meet the non-finite gradient planted below,
  // whose step the guard would skip (docs/training.md, "Non-finite steps").
  ExecutorOptions unguarded;
  unguarded.guardNonFinite = false;
  Executor e(plan, unguarded);
  e.initWeights(1);
  TokenLoader loader("", 2, 4, 16, 1);
  std::vector<float> before = floatsOf(e, g.t.head);
  for (uint64_t s = 0; s < 6; ++s) {
    StepResult r = e.trainStep(loader, s, 1);
    EXPECT_TRUE(std::isfinite(r.loss));
    EXPECT_TRUE(r.galoreSkipped.empty());
  }
  EXPECT_NE(floatsOf(e, g.t.head), before) << "GaLore moved the lm_head";
  std::vector<float> p = floatsOf(e, g.projector);
  double norm = 0.0;
  for (float x : p)
    norm += double(x) * x;
  EXPECT_NEAR(norm, 2.0, 1e-5) << "two orthonormal columns";

  // A NaN in the parameter makes the next gradient non-finite, and the refresh at t = 6 is
  // due: it is skipped, and said so.
  const TensorView &head = e.view(g.t.head);
  float nan = NAN;
  std::memcpy(head.data, &nan, 4);
  e.markWritten(g.t.head);
  StepResult r = e.trainStep(loader, 6, 1);
  ASSERT_EQ(r.galoreSkipped.size(), 1u);
  EXPECT_EQ(r.galoreSkipped[0].first, "lm_head.weight");
  EXPECT_EQ(r.galoreSkipped[0].second, int(galore::kNonFinite));
  EXPECT_EQ(floatsOf(e, g.projector), p) << "the projector was kept";
}

TEST(GaLorePlanTest, PlantedMistakes) {
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.refresh].attrs = refreshAttrs(2, 3, 0, 0, true);
    expectError(g.spec, {"(GaloreRefresh)", "projects the left side of a [16, 8] matrix"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.refresh].attrs = refreshAttrs(8, 3, 0, 0, false);
    expectError(g.spec, {"(GaloreRefresh)", "rank 8 must be positive and below min(m, n) = 8"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.refresh].attrs = refreshAttrs(2, 0, 0, 0, false);
    expectError(g.spec, {"(GaloreRefresh)", "update_proj_gap must be positive, got 0"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.refresh].attrs = refreshAttrs(2, 3, 3, 0, false);
    expectError(g.spec, {"offset 3 is outside [0, update_proj_gap = 3)"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.refresh].attrs = refreshAttrs(2, 3, 0, 1, false);
    expectError(g.spec, {"slot 1 is outside status (tensor", "of 1 weight"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.tensors[g.workspace].shape = {100};
    g.spec.tensors[g.workspace].bytes = 400;
    expectError(g.spec,
                {"(GaloreRefresh)", "workspace (tensor", "shape: expected [128], got [100]"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.tensors[g.projector].init = TensorInit::None;
    expectError(g.spec, {"(GaloreRefresh)", "the projector is zero until its first refresh"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.refresh].phase = Phase::Backward;
    expectError(g.spec, {"(GaloreRefresh)"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.project].inputs[1] = g.t.gradHead;
    expectError(g.spec, {"(GaloreProject)", "projector with 0 < rank < 8"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.update].outputs[2] = g.t.gradTable; // m of the full shape
    expectError(g.spec,
                {"(GaloreAdamWUpdate)", "m (tensor", "shape: expected [16, 2], got [16, 8]"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.update].attrs = galoreAdamWAttrs(false, 0.0);
    expectError(g.spec, {"(GaloreAdamWUpdate)", "scale must be positive and finite, got 0"});
  }
  {
    GaLorePlan g = galorePlan();
    g.spec.kernels[g.update].attrsType = fb::KernelAttrs::AdamWAttrs;
    g.spec.kernels[g.update].attrs = adamwAttrs();
    expectError(g.spec, {"(GaloreAdamWUpdate)", "attributes: expected GaloreAdamWAttrs"});
  }
}

} // namespace
