//===- Fp8LinearTest.cpp - The CPU FP8 GEMM kernels against a reference ---===//
//
// The kernels of plan kinds Fp8Linear .. Fp8UpdateScales (docs/fp8.md) against a reference written
// here from fp8::encode and fp8::decode alone: the scale of each cast (the state's, or the format's
// largest value over the tensor's amax, over 2^margin), the codes, the underflow and saturation
// counts, and the GEMM of the decoded values summed in f32 in k order and descaled. Data are
// random with zeros, values that underflow and values that saturate; the scale comes from the
// state (delayed), from the tensor (first step, current scaling). fp8_update_scales runs over a
// history that wraps, with an overflowed step. The trained plan runs FP8 end to end.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Fp8.h"

#include "TestPlans.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace bonsai::rt {
namespace {

using fp8::Format;

TensorView f32View(std::vector<float> &v, std::vector<int64_t> shape) {
  return TensorView{v.data(), DType::F32, std::move(shape)};
}

/// Gaussian values times `sigma`, with zeros, values far below the rest (underflows once
/// scaled) and a few far above it (saturated under a scale from smaller values).
std::vector<float> raggedValues(int64_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float x = normal(rng);
    switch (rng() % 29) {
    case 0:
      x = 0.0f;
      break;
    case 1:
      x *= 1e-9f; // underflows
      break;
    case 2:
      x *= 300.0f; // a rare large value
      break;
    default:
      break;
    }
    v[size_t(i)] = x;
  }
  return v;
}

/// An FP8 state [3, 4 + H] with the given scales in column 0.
std::vector<float> stateWith(float input, float weight, float grad, int64_t history = 4) {
  int64_t columns = fp8::kStateColumns + history;
  std::vector<float> s(size_t(3 * columns), 0.0f);
  s[size_t(fp8::InputRow * columns)] = input;
  s[size_t(fp8::WeightRow * columns)] = weight;
  s[size_t(fp8::OutputGradRow * columns)] = grad;
  return s;
}

/// The reference cast of one operand.
struct RefCast {
  std::vector<uint8_t> codes;
  std::vector<float> values; ///< decoded codes
  float scale = 0, amax = 0, underflow = 0, saturation = 0;
};

RefCast refCast(const std::vector<float> &x, float stateScale, bool current, Format format,
                int margin) {
  RefCast r;
  for (float v : x)
    if (!std::isnan(v))
      r.amax = std::max(r.amax, std::fabs(v));
  r.scale = stateScale;
  if (current || !(stateScale > 0.0f) || !std::isfinite(stateScale))
    r.scale = r.amax > 0.0f && std::isfinite(r.amax)
                  ? float(double(fp8::maxFinite(format)) / double(r.amax) / std::ldexp(1.0, margin))
                  : 1.0f;
  int64_t under = 0, saturated = 0;
  for (float v : x) {
    float y = v * r.scale;
    uint8_t code = fp8::encode(y, format);
    r.codes.push_back(code);
    r.values.push_back(fp8::decode(code, format));
    if (std::fabs(y) > fp8::maxFinite(format))
      ++saturated;
    else if (y != 0.0f && fp8::decode(code, format) == 0.0f)
      ++under;
  }
  if (!x.empty()) {
    r.underflow = float(double(under) / double(x.size()));
    r.saturation = float(double(saturated) / double(x.size()));
  }
  return r;
}

/// c[i, j] = (Σ_p a(i, p) b(j, p)) / (sa sb) (+ bias[j]), the sum in f32 in p order; a and b
/// given as accessors.
template <typename A, typename B>
std::vector<float> refGemm(A a, float sa, B b, float sb, int64_t m, int64_t n, int64_t k,
                           const std::vector<float> *bias = nullptr) {
  std::vector<float> c(size_t(m * n));
  float descale = float(1.0 / (double(sa) * double(sb)));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < k; ++p)
        sum += a(i, p) * b(j, p);
      c[size_t(i * n + j)] = sum * descale + (bias ? (*bias)[size_t(j)] : 0.0f);
    }
  return c;
}

/// dw [n, k] = Σ_m dyᵀ x from the casts of dy [m, n] and x [m, k], in f32 (refGemm).
std::vector<float> refGradWeight(const RefCast &dy, const RefCast &x, int64_t m, int64_t n,
                                 int64_t k) {
  return refGemm([&](int64_t i, int64_t p) { return dy.values[size_t(p * n + i)]; }, dy.scale,
                 [&](int64_t j, int64_t p) { return x.values[size_t(p * k + j)]; }, x.scale, n,
                 k, m);
}

/// `values` rounded through `dtype` (what a store into an output of that dtype keeps).
std::vector<float> roundedTo(std::vector<float> values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtypeSize(dtype));
  TensorView v{bytes.data(), dtype, {int64_t(values.size())}};
  storeF32(values.data(), v);
  loadF32(v, values.data());
  return values;
}

void expectStatsRow(const float *row, const RefCast &r, const char *what) {
  EXPECT_EQ(row[fp8::StatsAmax], r.amax) << what;
  EXPECT_EQ(row[fp8::StatsUnderflow], r.underflow) << what;
  EXPECT_EQ(row[fp8::StatsSaturation], r.saturation) << what;
  EXPECT_EQ(row[fp8::StatsScale], r.scale) << what;
}

/// Workspace for casts of `a` and `b` elements.
std::vector<float> workspaceFor(int64_t a, int64_t b) {
  return std::vector<float>(size_t(fp8::gemmWorkspaceBytes(a, b) / 4), 0.0f);
}

std::vector<uint8_t> codesAt(const std::vector<float> &workspace, int64_t offset, int64_t count) {
  const auto *p = reinterpret_cast<const uint8_t *>(workspace.data()) + offset;
  return std::vector<uint8_t>(p, p + count);
}

/// Runs fp8_linear on x [2, 16, 32] and w [48, 32] (+ bias) into y of `dtype` and checks it,
/// the stats and the workspace's codes against the reference.
void checkLinear(std::vector<float> state, bool current, int margin, DType dtype, bool withBias,
                 uint32_t seed) {
  const int64_t M = 32, N = 48, K = 32;
  std::vector<float> x = raggedValues(M * K, 1.0f, seed);
  std::vector<float> w = raggedValues(N * K, 0.05f, seed + 1);
  std::vector<float> bias = raggedValues(N, 0.5f, seed + 2);
  std::vector<float> stats(8, -1.0f), ws = workspaceFor(M * K, N * K);
  std::vector<uint8_t> y(size_t(M * N) * dtypeSize(dtype));
  TensorView xv = f32View(x, {2, 16, K}), wv = f32View(w, {N, K}), bv = f32View(bias, {N});
  TensorView sv = f32View(state, {3, int64_t(state.size() / 3)});
  TensorView yv{y.data(), dtype, {2, 16, N}};
  cpu::fp8Linear(xv, wv, sv, withBias ? &bv : nullptr, current, margin, yv,
                 f32View(stats, {2, 4}), f32View(ws, {int64_t(ws.size())}));

  int64_t columns = int64_t(state.size() / 3);
  RefCast rx = refCast(x, state[size_t(fp8::InputRow * columns)], current, Format::E4M3FN, margin);
  RefCast rw = refCast(w, state[size_t(fp8::WeightRow * columns)], current, Format::E4M3FN, margin);
  expectStatsRow(stats.data(), rx, "x");
  expectStatsRow(stats.data() + 4, rw, "w");
  EXPECT_EQ(codesAt(ws, 0, M * K), rx.codes);
  EXPECT_EQ(codesAt(ws, (M * K + 255) / 256 * 256, N * K), rw.codes);
  std::vector<float> want = roundedTo(
      refGemm([&](int64_t i, int64_t p) { return rx.values[size_t(i * K + p)]; }, rx.scale,
              [&](int64_t j, int64_t p) { return rw.values[size_t(j * K + p)]; }, rw.scale, M, N,
              K, withBias ? &bias : nullptr),
      dtype);
  std::vector<float> got(size_t(M * N));
  loadF32(yv, got.data());
  EXPECT_EQ(got, want);
}

TEST(Fp8LinearTest, FirstStepScalesFromTheTensors) {
  // A zero state: no delayed scale yet, every cast scaled from its own amax.
  checkLinear(stateWith(0, 0, 0), false, 0, DType::F32, true, 1);
  checkLinear(stateWith(0, 0, 0), false, 2, DType::BF16, true, 2);
  // A non-finite or negative scale is no scale either.
  checkLinear(stateWith(std::numeric_limits<float>::infinity(), -1.0f, 0), false, 0, DType::F16,
              false, 3);
}

TEST(Fp8LinearTest, DelayedScalesComeFromTheState) {
  // x's scale saturates its large values, w's flushes its small ones.
  std::vector<float> state = stateWith(64.0f, 0.25f, 0);
  checkLinear(state, false, 0, DType::F32, true, 4);
  checkLinear(state, false, 0, DType::BF16, false, 5);
  // Counted: the scales saturate and underflow something.
  const int64_t M = 32, N = 48, K = 32;
  std::vector<float> x = raggedValues(M * K, 1.0f, 4), w = raggedValues(N * K, 0.05f, 5);
  RefCast rx = refCast(x, 64.0f, false, Format::E4M3FN, 0);
  RefCast rw = refCast(w, 0.25f, false, Format::E4M3FN, 0);
  EXPECT_GT(rx.saturation, 0.0f);
  EXPECT_GT(rw.underflow, 0.0f);
}

TEST(Fp8LinearTest, CurrentScalingIgnoresTheState) {
  checkLinear(stateWith(64.0f, 0.25f, 8.0f), true, 0, DType::F32, true, 6);
  checkLinear(stateWith(64.0f, 0.25f, 8.0f), true, 4, DType::BF16, false, 7);
}

TEST(Fp8LinearTest, EqualsFp8GemmAndApproximatesTheProduct) {
  const int64_t M = 16, N = 32, K = 48;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(M * K)), w(size_t(N * K));
  for (float &v : x)
    v = normal(rng);
  for (float &v : w)
    v = 0.1f * normal(rng);
  std::vector<float> state = stateWith(0, 0, 0), stats(8), y(size_t(M * N));
  std::vector<float> ws = workspaceFor(M * K, N * K);
  cpu::fp8Linear(f32View(x, {M, K}), f32View(w, {N, K}), f32View(state, {3, 8}), nullptr, false,
                 0, f32View(y, {M, N}), f32View(stats, {2, 4}), f32View(ws, {int64_t(ws.size())}));
  // fp8::gemm takes B as [k, n]: w's codes transposed.
  std::vector<uint8_t> a = codesAt(ws, 0, M * K), wc = codesAt(ws, (M * K + 255) / 256 * 256, N * K);
  std::vector<uint8_t> b(size_t(K * N));
  for (int64_t j = 0; j < N; ++j)
    for (int64_t p = 0; p < K; ++p)
      b[size_t(p * N + j)] = wc[size_t(j * K + p)];
  std::vector<float> c(size_t(M * N));
  fp8::gemm(a.data(), Format::E4M3FN, stats[3], b.data(), Format::E4M3FN, stats[7], M, N, K,
            c.data());
  EXPECT_EQ(y, c);
  // Within the formats' precision of the exact product: 2^-4 relative per E4M3FN operand.
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t p = 0; p < K; ++p) {
        exact += double(x[size_t(i * K + p)]) * double(w[size_t(j * K + p)]);
        magnitude += std::fabs(double(x[size_t(i * K + p)]) * double(w[size_t(j * K + p)]));
      }
      EXPECT_NEAR(y[size_t(i * N + j)], exact, 0.13 * magnitude + 1e-3) << i << ", " << j;
    }
}

TEST(Fp8LinearTest, GradInput) {
  // dx [2, 16, 32] = dy [2, 16, 48] · w [48, 32]; dy E5M2 (OutputGradRow), w E4M3FN.
  const int64_t M = 32, N = 48, K = 32;
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<float> dy = raggedValues(M * N, 1e-3f, 20 + variant);
    std::vector<float> w = raggedValues(N * K, 0.05f, 30 + variant);
    bool current = variant == 2;
    std::vector<float> state = variant == 0 ? stateWith(0, 0, 0) : stateWith(1.0f, 0.5f, 2e5f);
    std::vector<float> stats(8), ws = workspaceFor(M * N, N * K);
    DType dtype = variant == 1 ? DType::BF16 : DType::F32;
    std::vector<uint8_t> dx(size_t(M * K) * dtypeSize(dtype));
    TensorView dxv{dx.data(), dtype, {2, 16, K}};
    cpu::fp8LinearGradInput(f32View(dy, {2, 16, N}), f32View(w, {N, K}), f32View(state, {3, 8}),
                            current, 1, dxv, f32View(stats, {2, 4}),
                            f32View(ws, {int64_t(ws.size())}));
    RefCast rdy = refCast(dy, state[16], current, Format::E5M2, 1);
    RefCast rw = refCast(w, state[8], current, Format::E4M3FN, 1);
    expectStatsRow(stats.data(), rdy, "dy");
    expectStatsRow(stats.data() + 4, rw, "w");
    EXPECT_EQ(codesAt(ws, 0, M * N), rdy.codes);
    std::vector<float> want = roundedTo(
        refGemm([&](int64_t i, int64_t p) { return rdy.values[size_t(i * N + p)]; }, rdy.scale,
                [&](int64_t j, int64_t p) { return rw.values[size_t(p * K + j)]; }, rw.scale, M,
                K, N),
        dtype);
    std::vector<float> got(size_t(M * K));
    loadF32(dxv, got.data());
    EXPECT_EQ(got, want) << "variant " << variant;
    if (variant == 1)
      EXPECT_GT(rdy.saturation, 0.0f) << "the delayed scale 2e5 saturates dy's large values";
  }
}

TEST(Fp8LinearTest, GradWeight) {
  // dw [48, 32] = Σ_m dy [2, 16, 48]ᵀ · x [2, 16, 32]; dy E5M2, x E4M3FN (InputRow).
  const int64_t M = 32, N = 48, K = 32;
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<float> dy = raggedValues(M * N, 1e-3f, 40 + variant);
    std::vector<float> x = raggedValues(M * K, 1.0f, 50 + variant);
    bool current = variant == 2;
    std::vector<float> state = variant == 0 ? stateWith(0, 0, 0) : stateWith(16.0f, 1.0f, 1e6f);
    std::vector<float> stats(8), ws = workspaceFor(M * N, M * K);
    DType dtype = variant == 1 ? DType::BF16 : DType::F32;
    std::vector<uint8_t> dw(size_t(N * K) * dtypeSize(dtype));
    TensorView dwv{dw.data(), dtype, {N, K}};
    cpu::fp8LinearGradWeight(f32View(dy, {2, 16, N}), f32View(x, {2, 16, K}),
                             f32View(state, {3, 8}), current, 0, dwv, f32View(stats, {2, 4}),
                             f32View(ws, {int64_t(ws.size())}));
    RefCast rdy = refCast(dy, state[16], current, Format::E5M2, 0);
    RefCast rx = refCast(x, state[0], current, Format::E4M3FN, 0);
    expectStatsRow(stats.data(), rdy, "dy");
    expectStatsRow(stats.data() + 4, rx, "x");
    EXPECT_EQ(codesAt(ws, (M * N + 255) / 256 * 256, M * K), rx.codes);
    std::vector<float> want = roundedTo(refGradWeight(rdy, rx, M, N, K), dtype);
    std::vector<float> got(size_t(N * K));
    loadF32(dwv, got.data());
    EXPECT_EQ(got, want) << "variant " << variant;
  }
}

TEST(Fp8LinearTest, GradWeightAccumulate) {
  // acc [48, 32] += Σ_m dy [2, 16, 48]ᵀ · x [2, 16, 32]: the product of GradWeight in f32,
  // then one f32 addition per element; the statistics and codes are GradWeight's.
  const int64_t M = 32, N = 48, K = 32;
  {
    std::vector<float> dy = raggedValues(M * N, 1e-3f, 60);
    std::vector<float> x = raggedValues(M * K, 1.0f, 61);
    std::vector<float> state = stateWith(16.0f, 1.0f, 1e6f);
    std::vector<float> stats(8), ws = workspaceFor(M * N, M * K);
    std::vector<float> initial = raggedValues(N * K, 1e-2f, 62), acc = initial;
    cpu::fp8LinearGradWeightAccumulate(f32View(dy, {2, 16, N}), f32View(x, {2, 16, K}),
                                       f32View(state, {3, 8}), false, 0,
                                       f32View(stats, {2, 4}),
                                       f32View(ws, {int64_t(ws.size())}), f32View(acc, {N, K}));
    RefCast rdy = refCast(dy, state[16], false, Format::E5M2, 0);
    RefCast rx = refCast(x, state[0], false, Format::E4M3FN, 0);
    expectStatsRow(stats.data(), rdy, "dy");
    expectStatsRow(stats.data() + 4, rx, "x");
    EXPECT_EQ(codesAt(ws, (M * N + 255) / 256 * 256, M * K), rx.codes);
    std::vector<float> want = refGradWeight(rdy, rx, M, N, K);
    for (size_t i = 0; i < want.size(); ++i)
      want[i] += initial[i];
    EXPECT_EQ(acc, want);
  }
  // An accumulator of the wrong shape or not f32 is named.
  std::vector<float> dy(32 * 48), x(32 * 32), state = stateWith(0, 0, 0), stats(8),
      ws = workspaceFor(32 * 48, 32 * 32), acc(32 * 48);
  std::vector<uint16_t> bf16Acc(48 * 32);
  const TensorView accs[2] = {f32View(acc, {32, 48}), {bf16Acc.data(), DType::BF16, {48, 32}}};
  const char *reasons[2] = {"acc", "acc must be f32"};
  for (int i = 0; i < 2; ++i) {
    try {
      cpu::fp8LinearGradWeightAccumulate(f32View(dy, {32, 48}), f32View(x, {32, 32}),
                                         f32View(state, {3, 8}), false, 0,
                                         f32View(stats, {2, 4}),
                                         f32View(ws, {int64_t(ws.size())}), accs[i]);
      ADD_FAILURE() << "expected an error for " << reasons[i];
    } catch (const Error &e) {
      EXPECT_NE(std::string(e.what()).find("fp8_linear_grad_weight_accumulate"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(reasons[i]), std::string::npos) << e.what();
    }
  }
}

TEST(Fp8LinearTest, FusedBackwardIsThePair) {
  // fp8_linear_backward = fp8_linear_grad_input + fp8_linear_grad_weight_accumulate
  // with the same dy and state, bit for bit: dx, the accumulator and both statistics; before
  // the first update (scales 0: each cast scaled from its own amax) and with delayed scales.
  const int64_t M = 32, N = 48, K = 32;
  std::vector<float> dy = raggedValues(M * N, 1e-3f, 70), w = raggedValues(N * K, 0.05f, 71);
  std::vector<float> x = raggedValues(M * K, 1.0f, 72), initial = raggedValues(N * K, 1e-2f, 73);
  for (const std::vector<float> &state : {stateWith(0, 0, 0), stateWith(16.0f, 64.0f, 1e6f)}) {
    std::vector<float> s = state;
    std::vector<float> dx(M * K), dxStats(8), dwStats(8), acc = initial;
    std::vector<float> wsIn = workspaceFor(M * N, N * K), wsW = workspaceFor(M * N, M * K);
    cpu::fp8LinearGradInput(f32View(dy, {2, 16, N}), f32View(w, {N, K}), f32View(s, {3, 8}), false,
                            0, f32View(dx, {2, 16, K}), f32View(dxStats, {2, 4}),
                            f32View(wsIn, {int64_t(wsIn.size())}));
    cpu::fp8LinearGradWeightAccumulate(f32View(dy, {2, 16, N}), f32View(x, {2, 16, K}),
                                       f32View(s, {3, 8}), false, 0, f32View(dwStats, {2, 4}),
                                       f32View(wsW, {int64_t(wsW.size())}), f32View(acc, {N, K}));
    std::vector<float> fdx(M * K), fdxStats(8), fdwStats(8), facc = initial;
    std::vector<float> ws(wsIn.size() + wsW.size());
    cpu::fp8LinearBackward(f32View(dy, {2, 16, N}), f32View(w, {N, K}), f32View(x, {2, 16, K}),
                           f32View(s, {3, 8}), false, 0, f32View(fdx, {2, 16, K}),
                           f32View(fdxStats, {2, 4}), f32View(fdwStats, {2, 4}),
                           f32View(ws, {int64_t(ws.size())}), f32View(facc, {N, K}));
    EXPECT_EQ(fdx, dx);
    EXPECT_EQ(facc, acc);
    EXPECT_EQ(fdxStats, dxStats);
    EXPECT_EQ(fdwStats, dwStats);
    EXPECT_NE(facc, initial);
  }
  // x of another dtype than dy, and a workspace with room for one GEMM only, are named.
  std::vector<float> state = stateWith(0, 0, 0), dx(M * K), st(8), acc(N * K);
  std::vector<float> ws = workspaceFor(M * N, N * K), big(2 * ws.size());
  std::vector<uint16_t> bf16X(M * K);
  struct Case {
    TensorView x, workspace;
    const char *reason;
  } cases[] = {
      {{bf16X.data(), DType::BF16, {2, 16, K}},
       f32View(big, {int64_t(big.size())}),
       "x must have dy's dtype f32, got bf16"},
      {f32View(x, {2, 16, K}), f32View(ws, {int64_t(ws.size())}),
       "the workspaces of the input and weight gradients' GEMMs"},
  };
  for (const Case &c : cases) {
    try {
      cpu::fp8LinearBackward(f32View(dy, {2, 16, N}), f32View(w, {N, K}), c.x,
                             f32View(state, {3, 8}), false, 0, f32View(dx, {2, 16, K}),
                             f32View(st, {2, 4}), f32View(st, {2, 4}), c.workspace,
                             f32View(acc, {N, K}));
      ADD_FAILURE() << "expected an error: " << c.reason;
    } catch (const Error &e) {
      EXPECT_NE(std::string(e.what()).find("fp8_linear_backward"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.reason), std::string::npos) << e.what();
    }
  }
}

TEST(Fp8LinearTest, SharedInputCastIsTheLinearsOwn) {
  // fp8_linear_shared_input and fp8_linear_backward_shared_input, reading
  // the input's cast from a first linear of the same x, give what the second linear computes
  // casting x itself, bit for bit, when the two states' input rows agree (as delayed scaling
  // keeps them): before the first update (scales from the amax) and with delayed scales.
  const int64_t M = 32, N1 = 48, N2 = 16, K = 32;
  std::vector<float> x = raggedValues(M * K, 1.0f, 80), w1 = raggedValues(N1 * K, 0.05f, 81);
  std::vector<float> w2 = raggedValues(N2 * K, 0.02f, 82), b2 = raggedValues(N2, 0.5f, 83);
  std::vector<float> dy1 = raggedValues(M * N1, 1e-3f, 84), dy2 = raggedValues(M * N2, 1e-2f, 85);
  std::vector<float> initial = raggedValues(N2 * K, 1e-2f, 86);
  const std::pair<std::vector<float>, std::vector<float>> states[] = {
      {stateWith(0, 0, 0), stateWith(0, 0, 0)},
      {stateWith(16.0f, 64.0f, 1e6f), stateWith(16.0f, 512.0f, 1e5f)}};
  for (const auto &[state1, state2] : states) {
    std::vector<float> s1 = state1, s2 = state2;
    TensorView xv = f32View(x, {2, 16, K}), s1v = f32View(s1, {3, 8}), s2v = f32View(s2, {3, 8});
    // The forward: the first linear, the second on its own, the second from the first's cast.
    std::vector<float> y1(M * N1), st1(8), ws1 = workspaceFor(M * K, N1 * K);
    cpu::fp8Linear(xv, f32View(w1, {N1, K}), s1v, nullptr, false, 0, f32View(y1, {2, 16, N1}),
                   f32View(st1, {2, 4}), f32View(ws1, {int64_t(ws1.size())}));
    TensorView bias = f32View(b2, {N2});
    std::vector<float> y2(M * N2), st2(8), ws2 = workspaceFor(M * K, N2 * K);
    cpu::fp8Linear(xv, f32View(w2, {N2, K}), s2v, &bias, false, 0, f32View(y2, {2, 16, N2}),
                   f32View(st2, {2, 4}), f32View(ws2, {int64_t(ws2.size())}));
    std::vector<float> sy2(M * N2), sst2(8), sws2 = workspaceFor(0, N2 * K);
    cpu::fp8LinearSharedInput(f32View(ws1, {int64_t(ws1.size())}), f32View(st1, {2, 4}),
                              f32View(w2, {N2, K}), s2v, &bias, false, 0, f32View(sy2, {2, 16, N2}),
                              f32View(sst2, {2, 4}), f32View(sws2, {int64_t(sws2.size())}));
    EXPECT_EQ(sy2, y2);
    EXPECT_EQ(sst2, st2);
    // The backward, likewise.
    std::vector<float> dx1(M * K), ds1(8), dws1(8), acc1(N1 * K, 0.0f);
    std::vector<float> bws1(size_t(
        (fp8::gemmWorkspaceBytes(M * N1, N1 * K) + fp8::gemmWorkspaceBytes(M * N1, M * K)) / 4));
    cpu::fp8LinearBackward(f32View(dy1, {2, 16, N1}), f32View(w1, {N1, K}), xv, s1v, false, 0,
                           f32View(dx1, {2, 16, K}), f32View(ds1, {2, 4}), f32View(dws1, {2, 4}),
                           f32View(bws1, {int64_t(bws1.size())}), f32View(acc1, {N1, K}));
    std::vector<float> dx2(M * K), ds2(8), dws2(8), acc2 = initial;
    std::vector<float> bws2(size_t(
        (fp8::gemmWorkspaceBytes(M * N2, N2 * K) + fp8::gemmWorkspaceBytes(M * N2, M * K)) / 4));
    cpu::fp8LinearBackward(f32View(dy2, {2, 16, N2}), f32View(w2, {N2, K}), xv, s2v, false, 0,
                           f32View(dx2, {2, 16, K}), f32View(ds2, {2, 4}), f32View(dws2, {2, 4}),
                           f32View(bws2, {int64_t(bws2.size())}), f32View(acc2, {N2, K}));
    std::vector<float> sdx2(M * K), sds2(8), sdws2(8), sacc2 = initial;
    std::vector<float> sbws2(
        size_t((fp8::gemmWorkspaceBytes(M * N2, N2 * K) + fp8::gemmWorkspaceBytes(M * N2, 0)) / 4));
    cpu::fp8LinearBackwardSharedInput(
        f32View(dy2, {2, 16, N2}), f32View(w2, {N2, K}), f32View(bws1, {int64_t(bws1.size())}),
        f32View(dws1, {2, 4}), s2v, false, 0, f32View(sdx2, {2, 16, K}), f32View(sds2, {2, 4}),
        f32View(sdws2, {2, 4}), f32View(sbws2, {int64_t(sbws2.size())}), f32View(sacc2, {N2, K}));
    EXPECT_EQ(sdx2, dx2);
    EXPECT_EQ(sacc2, acc2);
    EXPECT_EQ(sds2, ds2);
    EXPECT_EQ(sdws2, dws2);
    EXPECT_NE(sacc2, initial);
  }
  // A workspace too small to hold the input's codes is named, in both kinds.
  std::vector<float> small(64), stats(8), y(M * N2), ws(size_t(fp8::gemmWorkspaceBytes(0, N2 * K)));
  std::vector<float> state = stateWith(0, 0, 0), acc(N2 * K), dx(M * K);
  std::vector<float> bws(
      size_t((fp8::gemmWorkspaceBytes(M * N2, N2 * K) + fp8::gemmWorkspaceBytes(M * N2, 0)) / 4));
  auto expectError = [](const std::function<void()> &run, const char *kernel) {
    try {
      run();
      ADD_FAILURE() << "expected an error from " << kernel;
    } catch (const Error &e) {
      EXPECT_NE(std::string(e.what()).find(kernel), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("input_cast must be the f32 workspace"),
                std::string::npos)
          << e.what();
    }
  };
  expectError(
      [&] {
        cpu::fp8LinearSharedInput(f32View(small, {64}), f32View(stats, {2, 4}),
                                  f32View(w2, {N2, K}), f32View(state, {3, 8}), nullptr, false, 0,
                                  f32View(y, {2, 16, N2}), f32View(stats, {2, 4}),
                                  f32View(ws, {int64_t(ws.size())}));
      },
      "fp8_linear_shared_input");
  expectError(
      [&] {
        cpu::fp8LinearBackwardSharedInput(
            f32View(dy2, {2, 16, N2}), f32View(w2, {N2, K}), f32View(small, {64}),
            f32View(stats, {2, 4}), f32View(state, {3, 8}), false, 0, f32View(dx, {2, 16, K}),
            f32View(stats, {2, 4}), f32View(stats, {2, 4}), f32View(bws, {int64_t(bws.size())}),
            f32View(acc, {N2, K}));
      },
      "fp8_linear_backward_shared_input");
}

TEST(Fp8LinearTest, SavedInputCastIsTheBackwardsOwn) {
  // fp8_linear_with_input_cast is fp8_linear bit for bit and also writes xᵀ's codes;
  // fp8_linear_backward_from_input_cast reading them and the forward's stats is
  // fp8_linear_backward of x (here of another linear with the same input scale), bit for bit.
  const int64_t M = 32, N1 = 48, N2 = 16, K = 32;
  std::vector<float> x = raggedValues(M * K, 1.0f, 90), w1 = raggedValues(N1 * K, 0.05f, 91);
  std::vector<float> w2 = raggedValues(N2 * K, 0.02f, 92), dy = raggedValues(M * N2, 1e-2f, 93);
  std::vector<float> initial = raggedValues(N2 * K, 1e-2f, 94);
  const std::pair<std::vector<float>, std::vector<float>> states[] = {
      {stateWith(0, 0, 0), stateWith(0, 0, 0)},
      {stateWith(16.0f, 64.0f, 1e6f), stateWith(16.0f, 512.0f, 1e5f)}};
  for (const auto &[state1, state2] : states) {
    std::vector<float> s1 = state1, s2 = state2;
    TensorView xv = f32View(x, {2, 16, K}), s1v = f32View(s1, {3, 8}), s2v = f32View(s2, {3, 8});
    std::vector<float> y(M * N1), st(8), ws = workspaceFor(M * K, N1 * K);
    cpu::fp8Linear(xv, f32View(w1, {N1, K}), s1v, nullptr, false, 0, f32View(y, {2, 16, N1}),
                   f32View(st, {2, 4}), f32View(ws, {int64_t(ws.size())}));
    std::vector<float> ky(M * N1), kst(8), kws = workspaceFor(M * K, N1 * K);
    std::vector<uint8_t> xt(size_t(K * M));
    TensorView xtv{xt.data(), DType::F8E4M3FN, {K, M}};
    cpu::fp8LinearWithInputCast(xv, f32View(w1, {N1, K}), s1v, nullptr, false, 0,
                                f32View(ky, {2, 16, N1}), f32View(kst, {2, 4}), xtv,
                                f32View(kws, {int64_t(kws.size())}));
    EXPECT_EQ(ky, y);
    EXPECT_EQ(kst, st);
    EXPECT_EQ(codesAt(kws, 0, M * K), codesAt(ws, 0, M * K));
    std::vector<float> dx(M * K), ds(8), dws(8), acc = initial;
    std::vector<float> bws(size_t(
        (fp8::gemmWorkspaceBytes(M * N2, N2 * K) + fp8::gemmWorkspaceBytes(M * N2, M * K)) / 4));
    cpu::fp8LinearBackward(f32View(dy, {2, 16, N2}), f32View(w2, {N2, K}), xv, s2v, false, 0,
                           f32View(dx, {2, 16, K}), f32View(ds, {2, 4}), f32View(dws, {2, 4}),
                           f32View(bws, {int64_t(bws.size())}), f32View(acc, {N2, K}));
    std::vector<float> fdx(M * K), fds(8), fdws(8), facc = initial;
    std::vector<float> fbws(
        size_t((fp8::gemmWorkspaceBytes(M * N2, N2 * K) + fp8::gemmWorkspaceBytes(M * N2, 0)) / 4));
    cpu::fp8LinearBackwardFromInputCast(
        f32View(dy, {2, 16, N2}), f32View(w2, {N2, K}), xtv, f32View(kst, {2, 4}), s2v, false, 0,
        f32View(fdx, {2, 16, K}), f32View(fds, {2, 4}), f32View(fdws, {2, 4}),
        f32View(fbws, {int64_t(fbws.size())}), f32View(facc, {N2, K}));
    EXPECT_EQ(fdx, dx);
    EXPECT_EQ(facc, acc);
    EXPECT_EQ(fds, ds);
    EXPECT_EQ(fdws, dws);
    EXPECT_NE(facc, initial);
  }
  // Codes of the wrong shape are named.
  std::vector<float> state = stateWith(0, 0, 0), y(M * N1), st(8), ws = workspaceFor(M * K, N1 * K);
  std::vector<uint8_t> codes(size_t(K * M));
  try {
    cpu::fp8LinearWithInputCast(
        f32View(x, {2, 16, K}), f32View(w1, {N1, K}), f32View(state, {3, 8}), nullptr, false, 0,
        f32View(y, {2, 16, N1}), f32View(st, {2, 4}),
        TensorView{codes.data(), DType::F8E4M3FN, {K, 16}}, f32View(ws, {int64_t(ws.size())}));
    ADD_FAILURE() << "input_cast [K, 16] was accepted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("input_cast must be f8_e4m3 [32, 32]"), std::string::npos)
        << e.what();
  }
}

TEST(Fp8LinearTest, EmptyAndNonFiniteOperands) {
  // No rows: zero fractions, the scale of an amax of 0 (1), an empty product.
  std::vector<float> x, w(16 * 16, 0.5f), y, state = stateWith(0, 0, 0), stats(8, -1.0f);
  std::vector<float> ws = workspaceFor(0, 256);
  cpu::fp8Linear(f32View(x, {0, 16}), f32View(w, {16, 16}), f32View(state, {3, 8}), nullptr,
                 false, 0, f32View(y, {0, 16}), f32View(stats, {2, 4}),
                 f32View(ws, {int64_t(ws.size())}));
  EXPECT_EQ(std::vector<float>(stats.begin(), stats.begin() + 4),
            (std::vector<float>{0.0f, 0.0f, 0.0f, 1.0f}));
  // An infinity saturates (its amax is infinite, so the first-step scale is 1).
  x.assign(16 * 16, 1.0f);
  x[3] = std::numeric_limits<float>::infinity();
  x[4] = -1e6f;
  y.assign(16 * 16, 0.0f);
  ws = workspaceFor(256, 256);
  cpu::fp8Linear(f32View(x, {16, 16}), f32View(w, {16, 16}), f32View(state, {3, 8}), nullptr,
                 false, 0, f32View(y, {16, 16}), f32View(stats, {2, 4}),
                 f32View(ws, {int64_t(ws.size())}));
  EXPECT_TRUE(std::isinf(stats[fp8::StatsAmax]));
  EXPECT_EQ(stats[fp8::StatsScale], 1.0f);
  EXPECT_EQ(stats[fp8::StatsSaturation], 2.0f / 256.0f);
  // Row 0: the saturated +inf and -1e6 (448 and -448) cancel, 14 ones times 0.5 remain.
  EXPECT_NEAR(y[0], 7.0f, 1e-5f);
}

TEST(Fp8LinearTest, UpdateScalesOverAWrappingHistory) {
  const int64_t H = 4;
  const int margin = 1;
  std::vector<float> state = stateWith(0, 0, 0, H);
  const int64_t columns = fp8::kStateColumns + H;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(0.5f, 100.0f);
  // The amaxes each row has seen, for the reference.
  std::vector<std::vector<float>> seen(3);
  std::vector<float> previous(3, 0.0f);
  float beforeOverflow = 0.0f;
  for (int64_t step = 0; step < 12; ++step) {
    std::vector<float> forward(8), backward(8);
    for (int c = 0; c < 8; ++c) {
      forward[size_t(c)] = uniform(rng) / (c % 4 == 0 ? 1.0f : 1000.0f);
      backward[size_t(c)] = uniform(rng) / (c % 4 == 0 ? 1e4f : 1000.0f);
    }
    if (step == 5)
      forward[0] = std::numeric_limits<float>::infinity(); // x overflowed this step
    if (step == 0)
      backward[0] = 0.0f; // an all-zero gradient: still no scale for it
    int64_t stepValue = step;
    TensorView stepView{&stepValue, DType::I64, {}};
    std::vector<float> fs = forward, bs = backward;
    TensorView bv = f32View(bs, {2, 4});
    cpu::fp8UpdateScales(stepView, f32View(fs, {2, 4}), &bv, margin,
                         f32View(state, {3, columns}));
    const float *rows[3] = {&forward[0], &forward[4], &backward[0]};
    for (int r = 0; r < 3; ++r) {
      Format format = r == 2 ? Format::E5M2 : Format::E4M3FN;
      seen[size_t(r)].push_back(rows[r][0]);
      // The last min(step + 1, H) amaxes: the ring's contents.
      float amax = 0.0f;
      bool finite = true;
      const std::vector<float> &s = seen[size_t(r)];
      for (size_t i = s.size() > size_t(H) ? s.size() - size_t(H) : 0; i < s.size(); ++i) {
        finite = finite && std::isfinite(s[i]);
        amax = std::max(amax, s[i]);
      }
      float want = finite && amax > 0.0f
                       ? float(double(fp8::maxFinite(format)) / double(amax) / 2.0)
                       : previous[size_t(r)];
      const float *row = &state[size_t(r * columns)];
      EXPECT_EQ(row[fp8::ScaleColumn], want) << "step " << step << " row " << r;
      EXPECT_EQ(row[fp8::AmaxColumn], rows[r][0]);
      EXPECT_EQ(row[fp8::UnderflowColumn], rows[r][1]);
      EXPECT_EQ(row[fp8::SaturationColumn], rows[r][2]);
      EXPECT_EQ(row[fp8::kStateColumns + step % H], rows[r][0]) << "the ring entry of step " << step;
      previous[size_t(r)] = want;
    }
    if (step == 0)
      EXPECT_EQ(state[size_t(2 * columns)], 0.0f) << "no gradient amax yet: still no scale";
    if (step == 4)
      beforeOverflow = state[0];
    if (step >= 5 && step < 5 + H)
      EXPECT_EQ(state[0], beforeOverflow) << "the overflow keeps x's scale for H steps";
    if (step == 5 + H)
      EXPECT_NE(state[0], beforeOverflow) << "the infinity left the history";
  }
  // Without backward stats, the output gradient's row is left alone.
  std::vector<float> before(state.begin() + 2 * columns, state.end());
  std::vector<float> forward(8, 1.0f);
  int64_t stepValue = 12;
  cpu::fp8UpdateScales(TensorView{&stepValue, DType::I64, {}}, f32View(forward, {2, 4}), nullptr,
                       margin, f32View(state, {3, columns}));
  EXPECT_EQ(std::vector<float>(state.begin() + 2 * columns, state.end()), before);
  EXPECT_EQ(state[fp8::AmaxColumn], 1.0f);
}

TEST(Fp8LinearTest, TheTrainingPlanRunsInFp8) {
  test::TrainingTensors t;
  test::Fp8Tensors f;
  std::vector<uint8_t> bytes =
      test::buildPlan(test::fp8TrainingPlanSpec({2, 8, 16, 16}, 4, false, 0, &t, &f));
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "fp8.plan");
  Executor e(plan);
  e.initWeights(3);
  TokenLoader loader("", 2, 8, 16, 3);
  std::vector<float> stateBefore = test::floatsOf(e, f.state);
  EXPECT_TRUE(std::all_of(stateBefore.begin(), stateBefore.end(), [](float v) { return v == 0; }));
  std::vector<float> losses;
  for (uint64_t s = 0; s < 6; ++s) {
    std::vector<float> scales = test::floatsOf(e, f.state);
    StepResult r = e.trainStep(loader, s, 1);
    losses.push_back(r.loss);
    ASSERT_TRUE(std::isfinite(r.loss));
    std::vector<float> state = test::floatsOf(e, f.state), stats = test::floatsOf(e, f.forwardStats);
    if (s > 0) {
      // Delayed scaling: the forward casts used the scales the last update left.
      EXPECT_EQ(stats[fp8::StatsScale], scales[0]);
      EXPECT_EQ(stats[4 + fp8::StatsScale], scales[8]);
    }
    // The update recorded this step's amaxes and set positive scales.
    for (int r2 = 0; r2 < 3; ++r2) {
      EXPECT_GT(state[size_t(r2 * 8)], 0.0f) << "row " << r2 << " step " << s;
      EXPECT_EQ(state[size_t(r2 * 8 + 4 + int64_t(s) % 4)], state[size_t(r2 * 8 + 1)]);
    }
    EXPECT_EQ(state[1], stats[fp8::StatsAmax]);
  }
  // The same step in f32: FP8's rounding moves the first loss only a little.
  std::vector<uint8_t> f32Bytes = test::buildPlan(test::trainingPlanSpec({2, 8, 16, 16}));
  LoadedPlan f32Plan = loadPlanBuffer(f32Bytes.data(), f32Bytes.size(), "f32.plan");
  Executor g(f32Plan);
  g.initWeights(3);
  TokenLoader loader2("", 2, 8, 16, 3);
  float f32Loss = g.trainStep(loader2, 0, 1).loss;
  EXPECT_NEAR(losses[0], f32Loss, 0.02 * std::fabs(f32Loss));
}

TEST(Fp8LinearTest, TheFusedBackwardTrainsAsThePair) {
  // The training plan with its FP8 backward fused (Fp8LinearBackward) against the unfused one: the
  // same losses, states and weights, bit for bit, over steps that start without scales and then use
  // delayed ones.
  test::TrainingTensors t;
  test::Fp8Tensors f;
  std::vector<uint8_t> fusedBytes =
      test::buildPlan(test::fp8FusedBackwardPlanSpec({2, 8, 16, 16}, &t, &f));
  std::vector<uint8_t> pairBytes = test::buildPlan(test::fp8TrainingPlanSpec());
  LoadedPlan fusedPlan = loadPlanBuffer(fusedBytes.data(), fusedBytes.size(), "fused.plan");
  LoadedPlan pairPlan = loadPlanBuffer(pairBytes.data(), pairBytes.size(), "pair.plan");
  ASSERT_EQ(fusedPlan.kernels[f.gradInput].kind, KernelKind::Fp8LinearBackward);
  ASSERT_EQ(fusedPlan.kernels.size() + 2, pairPlan.kernels.size());
  Executor fused(fusedPlan), pair(pairPlan);
  fused.initWeights(3);
  pair.initWeights(3);
  TokenLoader a("", 2, 8, 16, 3), b("", 2, 8, 16, 3);
  for (uint64_t s = 0; s < 4; ++s) {
    EXPECT_EQ(fused.trainStep(a, s, 1).loss, pair.trainStep(b, s, 1).loss) << "step " << s;
    EXPECT_EQ(test::floatsOf(fused, f.state), test::floatsOf(pair, f.state)) << "step " << s;
    EXPECT_EQ(test::floatsOf(fused, t.head), test::floatsOf(pair, t.head)) << "step " << s;
  }
}

TEST(Fp8LinearTest, SeveralMicroBatchesUpdateFromTheLast) {
  // Two micro-batches per step: the update records the last micro-batch's casts.
  test::Fp8Tensors f;
  std::vector<uint8_t> bytes = test::buildPlan(
      test::fp8TrainingPlanSpec({2, 8, 16, 16, false, 2}, 4, false, 0, nullptr, &f));
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "fp8.plan");
  Executor e(plan);
  e.initWeights(3);
  TokenLoader loader("", 2, 8, 16, 3);
  StepResult r = e.trainStep(loader, 0, 2);
  ASSERT_EQ(r.microBatchLosses.size(), 2u);
  // The second micro-batch alone, from the same weights and state, gives the same stats.
  std::vector<float> state = test::floatsOf(e, f.state);
  Executor g(plan);
  g.initWeights(3);
  g.forwardBackward(loader.batch(1), 0.5f);
  std::vector<float> forward = test::floatsOf(g, f.forwardStats);
  std::vector<float> backward = test::floatsOf(g, f.gradInputStats);
  EXPECT_EQ(state[fp8::AmaxColumn], forward[fp8::StatsAmax]);
  EXPECT_EQ(state[8 + fp8::UnderflowColumn], forward[4 + fp8::StatsUnderflow]);
  EXPECT_EQ(state[16 + fp8::AmaxColumn], backward[fp8::StatsAmax]);
  EXPECT_EQ(state[16 + 4], backward[fp8::StatsAmax]) << "the history's entry of step 0";
}

TEST(Fp8LinearTest, TelemetryReadsEveryState) {
  test::PlanSpec spec = test::fp8TrainingPlanSpec();
  // Not FP8 states: another role, another shape, another name.
  spec.addInit("w.fp8", DType::F32, {3, 8}, TensorRole::Gradient, 2, TensorInit::Zeros);
  spec.addInit("x.fp8", DType::F32, {3, 4}, TensorRole::OptimizerState, 2, TensorInit::Zeros);
  spec.addInit("x.fp8.m", DType::F32, {3, 8}, TensorRole::OptimizerState, 2, TensorInit::Zeros);
  std::vector<uint8_t> bytes = test::buildPlan(spec);
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "fp8.plan");
  std::vector<uint32_t> states = plan.fp8States();
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(plan.tensors[states[0]].name, "lm_head.weight.fp8");

  Executor e(plan);
  e.initWeights(3);
  TokenLoader loader("", 2, 8, 16, 3);
  e.trainStep(loader, 0, 1);
  e.trainStep(loader, 1, 1);
  std::optional<Fp8Summary> summary = e.fp8Summary();
  ASSERT_TRUE(summary);
  EXPECT_EQ(summary->tensors, 1u);
  ASSERT_EQ(summary->operands.size(), 3u);
  std::vector<float> state = test::floatsOf(e, states[0]);
  const char *operands[] = {"input", "weight", "grad_output"};
  for (size_t r = 0; r < 3; ++r) {
    const Fp8OperandStats &o = summary->operands[r];
    EXPECT_EQ(o.tensor, "lm_head.weight");
    EXPECT_EQ(o.operand, operands[r]);
    EXPECT_EQ(o.scale, state[r * 8 + fp8::ScaleColumn]);
    EXPECT_GT(o.scale, 0.0f);
    EXPECT_EQ(o.amax, state[r * 8 + fp8::AmaxColumn]);
    EXPECT_EQ(o.underflow, state[r * 8 + fp8::UnderflowColumn]);
    EXPECT_EQ(o.saturation, state[r * 8 + fp8::SaturationColumn]);
  }
  // A plan without FP8 has no telemetry.
  std::vector<uint8_t> plain = test::buildPlan(test::trainingPlanSpec());
  Executor f(loadPlanBuffer(plain.data(), plain.size(), "plain.plan"));
  EXPECT_FALSE(f.fp8Summary());
}

} // namespace
} // namespace bonsai::rt
