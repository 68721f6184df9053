//===- OptimizerKernelsTest.cpp - Tests of the CPU optimizer kernels -------===//
//
// adamw_update and sgd_update over several steps against fp64 transcriptions, written here, of
// PyTorch's torch.optim.AdamW and torch.optim.SGD single-tensor steps preceded by
// torch.nn.utils.clip_grad_norm_ (clipping active, inactive and off, with weight decay, bf16
// parameters with and without f32 master weights); learning_rate's constant and cosine schedules
// around every boundary of the warmup and of the decay; grad_norm against a naive fp64 sum;
// step_increment, accumulate and zero. Inputs are fresh random values from fixed seeds, outputs
// are poisoned with NaN where the kernel must not read them, and every element is checked.
//
// Tolerances: the kernels compute each step in fp64 from f32 state and round parameters and
// moments to f32 after every step; the references keep everything in fp64. Over five steps that
// drifts by a few f32 ulps: 1e-6 absolute on parameters (|p| < 2, updates of about lr = 1e-2);
// on moments 1e-6 relative plus an absolute 1e-7 for m and 1e-9 for v, a few ulps of the terms
// they sum (|(1 - beta1) g| <= 0.2, |(1 - beta2) g^2| <= 0.01), since a moment that cancels to
// near zero keeps their rounding errors. Every planted mistake tried (t = step instead of step + 1,
// weight decay after the step or on the gradient, eps inside the square root or before the bias
// correction, a missing clip, clipping by norm / clip, momentum read when it is 0) moves a
// parameter by 1e-5 or more within these five steps.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CpuKernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace bonsai::rt;
namespace cpu = bonsai::rt::cpu;

namespace {

constexpr double kPi = 3.14159265358979323846;

using Shape = std::vector<int64_t>;
using Vec = std::vector<double>;

int64_t numelOf(const Shape &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// An owning tensor for tests: storage, dtype and shape, with exact encode and decode.
class Buf {
public:
  Buf(DType dtype, Shape shape)
      : dtype(dtype), shape(std::move(shape)),
        storage(size_t(numelOf(this->shape)) * dtypeSize(dtype)) {}

  TensorView view() const {
    return TensorView{const_cast<uint8_t *>(storage.data()), dtype, shape};
  }
  int64_t numel() const { return numelOf(shape); }

  /// Stores `values`, each rounded to the dtype (to nearest even).
  void set(const Vec &values) {
    ASSERT_EQ(values.size(), size_t(numel()));
    if (dtype == DType::I64) {
      for (size_t i = 0; i < values.size(); ++i) {
        int64_t v = int64_t(values[i]);
        std::memcpy(&storage[i * 8], &v, 8);
      }
      return;
    }
    std::vector<float> f(values.begin(), values.end());
    storeF32(f.data(), view());
  }

  /// The stored values, decoded exactly.
  Vec get() const {
    Vec values(static_cast<size_t>(numel()));
    if (dtype == DType::I64 || dtype == DType::I32) {
      for (size_t i = 0; i < values.size(); ++i)
        values[i] = double(loadIndex(view(), int64_t(i)));
      return values;
    }
    std::vector<float> f(values.size());
    loadF32(view(), f.data());
    std::copy(f.begin(), f.end(), values.begin());
    return values;
  }

  /// Fills every element with NaN (integers with a byte pattern).
  void poison() {
    if (dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16) {
      std::vector<float> nan(size_t(numel()), std::numeric_limits<float>::quiet_NaN());
      storeF32(nan.data(), view());
    } else {
      std::memset(storage.data(), 0xa5, storage.size());
    }
  }

  DType dtype;
  Shape shape;
  std::vector<uint8_t> storage;
};

Buf withValues(DType dtype, Shape shape, const Vec &values) {
  Buf b(dtype, std::move(shape));
  b.set(values);
  return b;
}

/// Uniform random values in [lo, hi), none of them near zero.
Vec randomValues(std::mt19937 &rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec values(n);
  for (double &v : values) {
    do
      v = dist(rng);
    while (std::fabs(v) < 1e-3 * (hi - lo));
  }
  return values;
}

Buf randomBuf(std::mt19937 &rng, DType dtype, Shape shape, double lo = -1.0, double hi = 1.0) {
  Buf b(dtype, std::move(shape));
  b.set(randomValues(rng, size_t(b.numel()), lo, hi));
  return b;
}

Buf poisoned(DType dtype, Shape shape) {
  Buf b(dtype, std::move(shape));
  b.poison();
  return b;
}

Buf stepBuf(int64_t value) { return withValues(DType::I64, {}, {double(value)}); }

/// A value rounded to f32 and back, as a tensor stores it.
double f32(double v) { return double(float(v)); }

/// Compares every element of `got` with `expected`: |error| <= abs + rel |expected|.
void expectNear(const Vec &got, const Vec &expected, double abs, double rel,
                const std::string &what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(got[i] - expected[i]);
    if (!(err <= abs + rel * std::fabs(expected[i])) && ++failures <= 8)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", expected " << expected[i]
                    << " (error " << err << ")";
  }
  EXPECT_EQ(failures, 0) << what << ": mismatches of " << got.size() << " elements";
}

/// Runs fn, expecting an rt::Error whose message contains every one of `parts`.
void expectError(const std::function<void()> &fn, const std::vector<std::string> &parts) {
  try {
    fn();
  } catch (const Error &e) {
    std::string message = e.what();
    for (const std::string &part : parts)
      EXPECT_NE(message.find(part), std::string::npos)
          << "message \"" << message << "\" does not mention \"" << part << "\"";
    return;
  } catch (const std::exception &e) {
    ADD_FAILURE() << "threw a non-rt::Error: " << e.what();
    return;
  }
  ADD_FAILURE() << "no rt::Error thrown";
}

double l2Norm(const Vec &g) {
  double s = 0;
  for (double v : g)
    s += v * v;
  return std::sqrt(s);
}

/// torch.nn.utils.clip_grad_norm_(max_norm=clip): grads *= min(1, clip / (norm + 1e-6)).
Vec clipRef(const Vec &grad, double norm, double clip) {
  if (clip <= 0)
    return grad;
  double coef = std::min(1.0, clip / (norm + 1e-6));
  Vec g = grad;
  for (double &v : g)
    v *= coef;
  return g;
}

/// torch.optim.AdamW's _single_tensor_adamw, in fp64.
struct AdamWRef {
  double lr, beta1, beta2, eps, weightDecay;
  Vec param, expAvg, expAvgSq;
  int64_t step = 0;

  void update(const Vec &grad) {
    step += 1; // state_step += 1 comes first: the first step has step = 1
    for (size_t i = 0; i < param.size(); ++i) {
      param[i] *= 1 - lr * weightDecay;
      expAvg[i] += (grad[i] - expAvg[i]) * (1 - beta1); // exp_avg.lerp_(grad, 1 - beta1)
      expAvgSq[i] = expAvgSq[i] * beta2 + (1 - beta2) * grad[i] * grad[i];
      double biasCorrection1 = 1 - std::pow(beta1, double(step));
      double biasCorrection2 = 1 - std::pow(beta2, double(step));
      double stepSize = lr / biasCorrection1;
      double denom = std::sqrt(expAvgSq[i]) / std::sqrt(biasCorrection2) + eps;
      param[i] += -stepSize * expAvg[i] / denom; // param.addcdiv_(exp_avg, denom, -step_size)
    }
  }
};

/// torch.optim.SGD's _single_tensor_sgd (dampening 0, no Nesterov), in fp64.
struct SGDRef {
  double lr, momentum, weightDecay;
  Vec param, buffer;
  bool hasBuffer = false;

  void update(const Vec &grad) {
    Vec d(grad.size());
    for (size_t i = 0; i < param.size(); ++i)
      d[i] = grad[i] + weightDecay * param[i]; // d_p = d_p.add(param, alpha=weight_decay)
    if (momentum != 0) {
      if (!hasBuffer) {
        buffer = d; // the first step clones d_p
        hasBuffer = true;
      } else {
        for (size_t i = 0; i < d.size(); ++i)
          buffer[i] = buffer[i] * momentum + d[i];
      }
      d = buffer;
    }
    for (size_t i = 0; i < param.size(); ++i)
      param[i] += -lr * d[i];
  }
};

} // namespace

//===----------------------------------------------------------------------===//
// adamw_update
//===----------------------------------------------------------------------===//

namespace {

struct AdamWCase {
  const char *name;
  double beta1, beta2, eps, weightDecay;
  /// Clip threshold as a multiple of each step's gradient norm: < 1 clips, > 1 does not,
  /// 0 turns clipping off.
  double clipFactor;
  DType paramType, gradType;
  bool master;
};

void runAdamW(const AdamWCase &c) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(4001);
  const Shape shape = {5, 7};
  const size_t n = size_t(numelOf(shape));
  // The fp32 master (or the parameter itself) starts from values its dtype holds exactly.
  Buf start = randomBuf(rng, c.master ? DType::F32 : c.paramType, shape, -2, 2);
  Buf param = c.master ? poisoned(c.paramType, shape) : start;
  Buf master = start;
  Buf m(DType::F32, shape), v(DType::F32, shape); // zero-initialised, as the plan's TensorInit
  Buf step = stepBuf(0);
  // The parameter is never read when there is a master: poisoned above, it must come out as the
  // master's rounding after the first step.
  TensorView masterView = master.view();
  AdamWRef ref{0, c.beta1, c.beta2, c.eps, c.weightDecay, start.get(), Vec(n, 0.0), Vec(n, 0.0)};
  for (int s = 0; s < 5; ++s) {
    SCOPED_TRACE("step " + std::to_string(s + 1));
    Buf grad = randomBuf(rng, c.gradType, shape);
    Vec g = grad.get();
    double norm = f32(l2Norm(g)) * (1.0 + 0.1 * s); // as if other tensors added to the norm
    double clip = c.clipFactor * norm;
    double lr = f32(1e-2 * (1.0 + 0.5 * s)); // a schedule's changing rate
    Buf lrBuf = withValues(DType::F32, {}, {lr}), normBuf = withValues(DType::F32, {}, {norm});
    cpu::AdamWHyper hyper{c.beta1, c.beta2, c.eps, c.weightDecay, clip};
    cpu::adamwUpdate(grad.view(), step.view(), lrBuf.view(), normBuf.view(), hyper, param.view(),
                     m.view(), v.view(), c.master ? &masterView : nullptr);
    cpu::stepIncrement(step.view());
    ref.lr = lr;
    ref.update(clipRef(g, f32(norm), clip));
    EXPECT_EQ(step.get()[0], s + 1);
    expectNear(m.get(), ref.expAvg, 1e-7, 1e-6, "m");
    expectNear(v.get(), ref.expAvgSq, 1e-9, 1e-6, "v");
    if (c.master) {
      expectNear(master.get(), ref.param, 1e-6, 0, "master");
      // The parameter is the master rounded once to its dtype.
      Buf rounded = withValues(c.paramType, shape, master.get());
      EXPECT_EQ(param.storage, rounded.storage) << "param is not the rounded master";
    } else if (c.paramType == DType::F32) {
      expectNear(param.get(), ref.param, 1e-6, 0, "param");
    } else {
      // The kernel rounds a bf16 parameter every step and the reference does not: after one
      // step they differ by that rounding only (half a bf16 ulp, 2^-9 relative; 2^-8 allowed).
      expectNear(param.get(), ref.param, 1e-6, std::ldexp(1.0, -8), "param");
      break;
    }
  }
}

} // namespace

TEST(OptimizerKernelsTest, AdamWMatchesPyTorchOverSeveralSteps) {
  const AdamWCase cases[] = {
      {"no clipping, no decay", 0.9, 0.999, 1e-8, 0.0, 0.0, DType::F32, DType::F32, false},
      {"clipping active, decay", 0.9, 0.999, 1e-8, 0.1, 0.5, DType::F32, DType::F32, false},
      {"clipping inactive, decay", 0.9, 0.95, 1e-8, 0.1, 2.0, DType::F32, DType::F32, false},
      // A large eps makes where it is added visible.
      {"large eps", 0.8, 0.99, 1e-2, 0.05, 0.7, DType::F32, DType::F32, false},
      {"bf16 param, f32 master", 0.9, 0.999, 1e-8, 0.1, 0.5, DType::BF16, DType::BF16, true},
      {"f16 param, f32 master", 0.9, 0.999, 1e-8, 0.1, 0.0, DType::F16, DType::F32, true},
      {"f32 param, f32 master", 0.9, 0.999, 1e-8, 0.1, 0.5, DType::F32, DType::F32, true},
      {"bf16 param alone", 0.9, 0.999, 1e-8, 0.1, 0.5, DType::BF16, DType::F32, false},
  };
  for (const AdamWCase &c : cases)
    runAdamW(c);
}

TEST(OptimizerKernelsTest, AdamWLargeTensorOnThreads) {
  // Many chunks: every element must still get exactly its own update.
  std::mt19937 rng(4002);
  const int64_t n = 300001;
  Buf param = randomBuf(rng, DType::F32, {n}), grad = randomBuf(rng, DType::F32, {n});
  Buf m = randomBuf(rng, DType::F32, {n}, -0.1, 0.1), v = randomBuf(rng, DType::F32, {n}, 0, 0.01);
  AdamWRef ref{f32(3e-3), 0.9, 0.999, 1e-8, 0.01, param.get(), m.get(), v.get(), 6};
  Buf step = stepBuf(6), lr = withValues(DType::F32, {}, {ref.lr});
  Buf norm = withValues(DType::F32, {}, {1.0});
  cpu::adamwUpdate(grad.view(), step.view(), lr.view(), norm.view(), {0.9, 0.999, 1e-8, 0.01, 0},
                   param.view(), m.view(), v.view(), nullptr);
  ref.update(grad.get());
  expectNear(param.get(), ref.param, 1e-6, 0, "param");
  expectNear(m.get(), ref.expAvg, 1e-7, 1e-6, "m");
  expectNear(v.get(), ref.expAvgSq, 1e-9, 1e-6, "v");
}

TEST(OptimizerKernelsTest, AdamWRejectsBadOperands) {
  std::mt19937 rng(4003);
  Buf grad = randomBuf(rng, DType::F32, {4, 3}), param = randomBuf(rng, DType::F32, {4, 3});
  Buf m(DType::F32, {4, 3}), v(DType::F32, {4, 3}), mBad(DType::F32, {3, 4});
  Buf vHalf(DType::BF16, {4, 3});
  Buf step = stepBuf(0), lr = withValues(DType::F32, {}, {1e-3});
  Buf norm = withValues(DType::F32, {}, {1.0});
  cpu::AdamWHyper hyper;
  Buf before = param;
  expectError(
      [&] {
        cpu::adamwUpdate(grad.view(), step.view(), lr.view(), norm.view(), hyper, param.view(),
                         mBad.view(), v.view(), nullptr);
      },
      {"adamw_update", "m", "[3, 4]", "[4, 3]"});
  expectError(
      [&] {
        cpu::adamwUpdate(grad.view(), step.view(), lr.view(), norm.view(), hyper, param.view(),
                         m.view(), vHalf.view(), nullptr);
      },
      {"adamw_update", "v", "f32", "bf16"});
  Buf step32(DType::I32, {});
  expectError(
      [&] {
        cpu::adamwUpdate(grad.view(), step32.view(), lr.view(), norm.view(), hyper, param.view(),
                         m.view(), v.view(), nullptr);
      },
      {"adamw_update", "step", "i64", "i32"});
  Buf lrVector = withValues(DType::F32, {2}, {1e-3, 1e-3});
  expectError(
      [&] {
        cpu::adamwUpdate(grad.view(), step.view(), lrVector.view(), norm.view(), hyper,
                         param.view(), m.view(), v.view(), nullptr);
      },
      {"adamw_update", "lr", "[2]"});
  Buf gradBad = randomBuf(rng, DType::F32, {12});
  expectError(
      [&] {
        cpu::adamwUpdate(gradBad.view(), step.view(), lr.view(), norm.view(), hyper, param.view(),
                         m.view(), v.view(), nullptr);
      },
      {"adamw_update", "grad", "[12]", "[4, 3]"});
  EXPECT_EQ(param.storage, before.storage) << "a rejected update wrote the parameter";
}

//===----------------------------------------------------------------------===//
// sgd_update
//===----------------------------------------------------------------------===//

TEST(OptimizerKernelsTest, SGDMatchesPyTorchOverSeveralSteps) {
  struct Case {
    const char *name;
    double momentum, weightDecay, clipFactor;
    DType paramType;
    bool master;
  };
  const Case cases[] = {
      {"plain", 0.0, 0.0, 0.0, DType::F32, false},
      {"momentum, decay, clipping active", 0.9, 0.01, 0.5, DType::F32, false},
      {"momentum, clipping inactive", 0.8, 0.0, 3.0, DType::F32, false},
      {"no momentum, decay, clipping active", 0.0, 0.1, 0.3, DType::F32, false},
      {"bf16 param, f32 master", 0.9, 0.01, 0.5, DType::BF16, true},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    std::mt19937 rng(4101);
    const Shape shape = {6, 5};
    const size_t n = size_t(numelOf(shape));
    Buf start = randomBuf(rng, DType::F32, shape, -2, 2);
    Buf param = c.master ? poisoned(c.paramType, shape) : start;
    Buf master = start;
    TensorView masterView = master.view();
    // The buffer starts at zero (TensorInit Zeros); without momentum it must not be read at all.
    Buf buffer = c.momentum != 0 ? Buf(DType::F32, shape) : poisoned(DType::F32, shape);
    SGDRef ref{0, c.momentum, c.weightDecay, start.get(), Vec(n, 0.0)};
    for (int s = 0; s < 5; ++s) {
      SCOPED_TRACE("step " + std::to_string(s + 1));
      Buf grad = randomBuf(rng, DType::F32, shape);
      Vec g = grad.get();
      double norm = f32(l2Norm(g) * 1.3), clip = c.clipFactor * norm;
      double lr = f32(0.05 / (1.0 + s));
      Buf lrBuf = withValues(DType::F32, {}, {lr}), normBuf = withValues(DType::F32, {}, {norm});
      cpu::sgdUpdate(grad.view(), lrBuf.view(), normBuf.view(), {c.momentum, c.weightDecay, clip},
                     param.view(), buffer.view(), c.master ? &masterView : nullptr);
      // Without momentum PyTorch keeps no buffer; the kernel's holds this step's d_p.
      Vec dp = clipRef(g, norm, clip);
      for (size_t i = 0; i < n; ++i)
        dp[i] += c.weightDecay * ref.param[i];
      ref.lr = lr;
      ref.update(clipRef(g, norm, clip));
      expectNear(buffer.get(), c.momentum != 0 ? ref.buffer : dp, 1e-7, 1e-6, "momentum");
      if (c.master) {
        expectNear(master.get(), ref.param, 1e-6, 0, "master");
        Buf rounded = withValues(c.paramType, shape, master.get());
        EXPECT_EQ(param.storage, rounded.storage) << "param is not the rounded master";
      } else {
        expectNear(param.get(), ref.param, 1e-6, 0, "param");
      }
    }
  }
}

TEST(OptimizerKernelsTest, SGDRejectsBadOperands) {
  std::mt19937 rng(4102);
  Buf grad = randomBuf(rng, DType::F32, {4}), param = randomBuf(rng, DType::F32, {4});
  Buf buffer(DType::F32, {5}), master(DType::BF16, {4});
  Buf lr = withValues(DType::F32, {}, {0.1}), norm = withValues(DType::F32, {}, {1.0});
  expectError(
      [&] {
        cpu::sgdUpdate(grad.view(), lr.view(), norm.view(), {}, param.view(), buffer.view(),
                       nullptr);
      },
      {"sgd_update", "momentum", "[5]", "[4]"});
  Buf good(DType::F32, {4});
  TensorView masterView = master.view();
  expectError(
      [&] {
        cpu::sgdUpdate(grad.view(), lr.view(), norm.view(), {}, param.view(), good.view(),
                       &masterView);
      },
      {"sgd_update", "master", "f32", "bf16"});
}

//===----------------------------------------------------------------------===//
// learning_rate
//===----------------------------------------------------------------------===//

namespace {

/// LearningRateAttrs' formula, transcribed from plan.fbs.
double scheduleRef(const cpu::LearningRateSchedule &s, int64_t t) {
  if (s.warmupSteps > 0 && t <= s.warmupSteps)
    return s.lr * double(t) / double(s.warmupSteps);
  if (!s.cosine)
    return s.lr;
  double p = std::min(1.0, double(t - s.warmupSteps) / double(s.totalSteps - s.warmupSteps));
  return s.lr * (s.minLrRatio + (1 - s.minLrRatio) * (1 + std::cos(kPi * p)) / 2);
}

double runSchedule(const cpu::LearningRateSchedule &s, int64_t t) {
  Buf step = stepBuf(t - 1), lr = poisoned(DType::F32, {});
  cpu::learningRate(step.view(), s, lr.view());
  return lr.get()[0];
}

} // namespace

TEST(OptimizerKernelsTest, LearningRateScheduleBoundaries) {
  const double base = 3e-4;
  cpu::LearningRateSchedule cosine{base, true, 10, 100, 0.1};
  cpu::LearningRateSchedule constant{base, false, 10, 100, 0.1};
  cpu::LearningRateSchedule noWarmup{base, true, 0, 100, 0.0};
  struct Point {
    int64_t t;
    double cosineValue, constantValue;
  };
  // Worked by hand: t = 1 and t = warmup are lr / 10 and lr; t = 55 is halfway through the decay
  // (cos(pi / 2) = 0), so lr (0.1 + 0.9 / 2); from t = total on, lr * min_lr_ratio.
  const Point points[] = {
      {1, base * 0.1, base * 0.1},
      {5, base * 0.5, base * 0.5},
      {10, base, base},
      {11, base * (0.1 + 0.9 * (1 + std::cos(kPi / 90)) / 2), base},
      {55, base * 0.55, base},
      {100, base * 0.1, base},
      {101, base * 0.1, base},
      {1000, base * 0.1, base},
  };
  for (const Point &p : points) {
    SCOPED_TRACE("t = " + std::to_string(p.t));
    // One f32 rounding of the fp64 value (half an ulp, 2^-24 relative) plus fp64 noise.
    EXPECT_NEAR(runSchedule(cosine, p.t), p.cosineValue, 1e-7 * p.cosineValue);
    EXPECT_NEAR(runSchedule(constant, p.t), p.constantValue, 1e-7 * p.constantValue);
    EXPECT_NEAR(runSchedule(cosine, p.t), scheduleRef(cosine, p.t), 1e-7 * p.cosineValue);
  }
  // Without warmup the first step already decays: p = 1 / 100.
  EXPECT_NEAR(runSchedule(noWarmup, 1), base * (1 + std::cos(kPi / 100)) / 2, 1e-7 * base);
  EXPECT_NEAR(runSchedule(noWarmup, 50), scheduleRef(noWarmup, 50), 1e-7 * base);
  EXPECT_NEAR(runSchedule(noWarmup, 100), 0.0, 1e-12);
  cpu::LearningRateSchedule flat{base, false, 0, 0, 0};
  EXPECT_NEAR(runSchedule(flat, 1), base, 1e-7 * base);
  // The schedule at every t, against the transcription.
  for (int64_t t = 1; t <= 120; ++t)
    ASSERT_NEAR(runSchedule(cosine, t), scheduleRef(cosine, t), 1e-7 * base) << "t = " << t;
}

TEST(OptimizerKernelsTest, LearningRateRejectsBadSchedulesAndSteps) {
  Buf lr = poisoned(DType::F32, {});
  Buf step = stepBuf(0);
  cpu::LearningRateSchedule bad{1e-3, true, 10, 10, 0};
  expectError([&] { cpu::learningRate(step.view(), bad, lr.view()); },
              {"learning_rate", "total_steps 10", "warmup_steps 10"});
  cpu::LearningRateSchedule negative{1e-3, false, -1, 10, 0};
  expectError([&] { cpu::learningRate(step.view(), negative, lr.view()); },
              {"learning_rate", "warmup_steps -1"});
  Buf minusOne = stepBuf(-1);
  expectError([&] { cpu::learningRate(minusOne.view(), {}, lr.view()); },
              {"learning_rate", "step -1"});
  Buf stepF(DType::F32, {});
  expectError([&] { cpu::learningRate(stepF.view(), {}, lr.view()); },
              {"learning_rate", "step", "i64", "f32"});
  EXPECT_TRUE(std::isnan(lr.get()[0]));
}

//===----------------------------------------------------------------------===//
// grad_norm, step_increment, accumulate, zero
//===----------------------------------------------------------------------===//

TEST(OptimizerKernelsTest, GradNormIsTheGlobalL2Norm) {
  std::mt19937 rng(4201);
  // Mixed dtypes, one tensor of several chunks with a partial last chunk, one empty tensor.
  std::vector<Buf> grads = {randomBuf(rng, DType::F32, {3, 5}),
                            randomBuf(rng, DType::BF16, {40001}), Buf(DType::F32, {0, 3}),
                            randomBuf(rng, DType::F16, {7}, -4, 4),
                            randomBuf(rng, DType::F32, {16384})};
  std::vector<TensorView> views;
  double sum = 0;
  for (const Buf &b : grads) {
    views.push_back(b.view());
    for (double v : b.get())
      sum += v * v;
  }
  Buf norm = poisoned(DType::F32, {});
  cpu::gradNorm(views, norm.view());
  // The result is rounded once to f32; the fp64 sums differ only in order (1e-15 relative).
  EXPECT_NEAR(norm.get()[0], std::sqrt(sum), 1e-7 * std::sqrt(sum));
  // Each tensor counts: dropping any changes the norm.
  for (size_t drop = 0; drop < grads.size(); ++drop) {
    if (grads[drop].numel() == 0)
      continue;
    std::vector<TensorView> fewer = views;
    fewer.erase(fewer.begin() + int64_t(drop));
    Buf partial = poisoned(DType::F32, {});
    cpu::gradNorm(fewer, partial.view());
    EXPECT_LT(partial.get()[0], norm.get()[0]) << "without grads[" << drop << "]";
  }
  Buf none = poisoned(DType::F32, {1});
  cpu::gradNorm({}, none.view());
  EXPECT_EQ(none.get()[0], 0.0);
  Buf ids(DType::I64, {3});
  expectError(
      [&] {
        cpu::gradNorm({views[0], ids.view()}, norm.view());
      },
      {"grad_norm", "grads[1]", "i64"});
}

TEST(OptimizerKernelsTest, StepIncrement) {
  for (int64_t start : {int64_t(0), int64_t(41), int64_t(1) << 40}) {
    Buf step = stepBuf(start);
    cpu::stepIncrement(step.view());
    int64_t value;
    std::memcpy(&value, step.storage.data(), 8);
    EXPECT_EQ(value, start + 1);
  }
  Buf step32(DType::I32, {});
  expectError([&] { cpu::stepIncrement(step32.view()); }, {"step_increment", "i64", "i32"});
  Buf top(DType::I64, {});
  int64_t max = std::numeric_limits<int64_t>::max();
  std::memcpy(top.storage.data(), &max, 8);
  expectError([&] { cpu::stepIncrement(top.view()); }, {"step_increment"});
}

TEST(OptimizerKernelsTest, AccumulateAddsInFp32AndRoundsOnce) {
  std::mt19937 rng(4301);
  const Shape shape = {70001}; // several chunks
  for (DType accType : {DType::F32, DType::BF16, DType::F16}) {
    for (DType gType : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtypeName(accType)) + " += " + dtypeName(gType));
      Buf acc = randomBuf(rng, accType, shape), g = randomBuf(rng, gType, shape);
      Vec a = acc.get(), b = g.get();
      cpu::accumulate(g.view(), acc.view());
      Vec sums(a.size());
      for (size_t i = 0; i < a.size(); ++i)
        sums[i] = double(float(a[i]) + float(b[i]));
      Buf expected = withValues(accType, shape, sums);
      EXPECT_EQ(acc.storage, expected.storage);
    }
  }
  // acc += acc doubles it.
  Buf acc = randomBuf(rng, DType::F32, {100});
  Vec before = acc.get();
  cpu::accumulate(acc.view(), acc.view());
  Vec after = acc.get();
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_EQ(after[i], 2 * before[i]);
  Buf other(DType::F32, {99});
  expectError([&] { cpu::accumulate(other.view(), acc.view()); }, {"accumulate", "[99]", "[100]"});
}

TEST(OptimizerKernelsTest, ZeroClearsEveryDType) {
  std::mt19937 rng(4401);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    Buf x = randomBuf(rng, dtype, {3, 50000});
    cpu::zero(x.view());
    for (double v : x.get())
      ASSERT_EQ(v, 0.0) << dtypeName(dtype);
  }
  Buf step = stepBuf(123);
  cpu::zero(step.view());
  EXPECT_EQ(step.get()[0], 0.0);
  Buf empty(DType::F32, {0});
  cpu::zero(empty.view());
}

//===----------------------------------------------------------------------===//
// Fused kernels (docs/fusion.md)
//===----------------------------------------------------------------------===//

namespace {

/// Copies of `bufs` (the same bytes).
std::vector<Buf> copies(const std::vector<Buf> &bufs) { return bufs; }

std::vector<TensorView> views(const std::vector<Buf> &bufs) {
  std::vector<TensorView> out;
  for (const Buf &b : bufs)
    out.push_back(b.view());
  return out;
}

/// Tensors of sizes around the kernels' chunk (16384) so that chunks of several tensors mix.
const std::vector<Shape> kMultiShapes = {{3}, {16384}, {129, 130}, {1}, {40000}};

} // namespace

// The multi-tensor AdamW is the per-tensor kernel applied to every tensor: bitwise, with bf16
// parameters through fp32 masters and with f32 parameters, over sizes that straddle chunks.
TEST(OptimizerKernelsTest, MultiTensorAdamWIsBitwiseThePerTensorKernel) {
  std::mt19937 rng(41);
  for (bool bf16 : {false, true}) {
    std::vector<Buf> grads, params, m, v, masters;
    for (const Shape &shape : kMultiShapes) {
      grads.push_back(randomBuf(rng, DType::F32, shape));
      params.push_back(randomBuf(rng, bf16 ? DType::BF16 : DType::F32, shape));
      m.push_back(randomBuf(rng, DType::F32, shape, -0.1, 0.1));
      v.push_back(randomBuf(rng, DType::F32, shape, 0.0, 0.01));
      if (bf16)
        masters.push_back(randomBuf(rng, DType::F32, shape));
    }
    Buf step = stepBuf(6), lr = withValues(DType::F32, {}, {3e-3}),
        norm = withValues(DType::F32, {}, {2.5});
    cpu::AdamWHyper hyper{0.9, 0.95, 1e-8, 0.1, 1.0};
    std::vector<Buf> p2 = copies(params), m2 = copies(m), v2 = copies(v), w2 = copies(masters);
    for (size_t i = 0; i < grads.size(); ++i) {
      TensorView master = bf16 ? masters[i].view() : TensorView{};
      cpu::adamwUpdate(grads[i].view(), step.view(), lr.view(), norm.view(), hyper,
                       params[i].view(), m[i].view(), v[i].view(), bf16 ? &master : nullptr);
    }
    cpu::multiTensorAdamwUpdate(views(grads), step.view(), lr.view(), norm.view(), hyper,
                                views(p2), views(m2), views(v2), views(w2));
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_EQ(params[i].storage, p2[i].storage) << "param " << i << " bf16 " << bf16;
      EXPECT_EQ(m[i].storage, m2[i].storage) << "m " << i;
      EXPECT_EQ(v[i].storage, v2[i].storage) << "v " << i;
      if (bf16)
        EXPECT_EQ(masters[i].storage, w2[i].storage) << "master " << i;
    }
  }
}

TEST(OptimizerKernelsTest, MultiTensorSGDIsBitwiseThePerTensorKernel) {
  std::mt19937 rng(42);
  for (double momentum : {0.0, 0.9}) {
    std::vector<Buf> grads, params, buffers;
    for (const Shape &shape : kMultiShapes) {
      grads.push_back(randomBuf(rng, DType::BF16, shape));
      params.push_back(randomBuf(rng, DType::F32, shape));
      buffers.push_back(randomBuf(rng, DType::F32, shape));
    }
    Buf lr = withValues(DType::F32, {}, {0.05}), norm = withValues(DType::F32, {}, {4.0});
    cpu::SGDHyper hyper{momentum, 0.01, 1.0};
    std::vector<Buf> p2 = copies(params), b2 = copies(buffers);
    for (size_t i = 0; i < grads.size(); ++i)
      cpu::sgdUpdate(grads[i].view(), lr.view(), norm.view(), hyper, params[i].view(),
                     buffers[i].view(), nullptr);
    cpu::multiTensorSgdUpdate(views(grads), lr.view(), norm.view(), hyper, views(p2), views(b2),
                              {});
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_EQ(params[i].storage, p2[i].storage) << "param " << i;
      EXPECT_EQ(buffers[i].storage, b2[i].storage) << "buffer " << i;
    }
  }
}

TEST(OptimizerKernelsTest, MultiTensorRejectsBadOperands) {
  Buf g = withValues(DType::F32, {2}, {1, 2}), p = withValues(DType::F32, {2}, {1, 2});
  Buf p3 = withValues(DType::F32, {3}, {1, 2, 3}), s = withValues(DType::F32, {2}, {0, 0});
  Buf lr = withValues(DType::F32, {}, {0.1}), norm = withValues(DType::F32, {}, {1.0});
  cpu::SGDHyper hyper;
  expectError([&] { cpu::multiTensorSgdUpdate({}, lr.view(), norm.view(), hyper, {}, {}, {}); },
              {"multi_tensor_sgd_update", "needs at least one gradient"});
  expectError(
      [&] {
        cpu::multiTensorSgdUpdate({g.view()}, lr.view(), norm.view(), hyper, {g.view()}, {}, {});
      },
      {"1 gradients but 0 momentum"});
  expectError(
      [&] {
        cpu::multiTensorSgdUpdate({g.view(), g.view()}, lr.view(), norm.view(), hyper,
                                  {p.view(), p3.view()}, {s.view(), s.view()}, {});
      },
      {"grad[1]", "param[1]"});
  expectError(
      [&] {
        cpu::multiTensorSgdUpdate({g.view()}, lr.view(), norm.view(), hyper, {p.view()},
                                  {s.view()}, {s.view(), s.view()});
      },
      {"1 gradients but 2 masters (expected none or one per parameter)"});
}

// linear_gelu is linear then gelu (tanh) on the stored pre-activation, bit for bit.
TEST(OptimizerKernelsTest, LinearGeluIsLinearThenGelu) {
  std::mt19937 rng(43);
  for (DType dtype : {DType::F32, DType::BF16}) {
    Buf x = randomBuf(rng, dtype, {3, 5, 24}), w = randomBuf(rng, dtype, {40, 24}),
        b = randomBuf(rng, dtype, {40});
    Buf pre(dtype, {3, 5, 40}), y(dtype, {3, 5, 40}), pre2(dtype, {3, 5, 40}),
        y2(dtype, {3, 5, 40});
    TensorView bias = b.view();
    cpu::linear(x.view(), w.view(), &bias, pre.view());
    cpu::gelu(pre.view(), true, y.view());
    cpu::linearGelu(x.view(), w.view(), &bias, y2.view(), pre2.view());
    EXPECT_EQ(pre.storage, pre2.storage);
    EXPECT_EQ(y.storage, y2.storage);
  }
  Buf x = randomBuf(rng, DType::F32, {2, 4}), w = randomBuf(rng, DType::F32, {3, 4});
  Buf y(DType::F32, {2, 3}), pre(DType::F32, {2, 4});
  expectError([&] { cpu::linearGelu(x.view(), w.view(), nullptr, y.view(), pre.view()); },
              {"linear_gelu: y shape [2, 3] does not match pre shape [2, 4]"});
}

// linear_add is linear then add, bit for bit, also into the addend's own storage.
TEST(OptimizerKernelsTest, LinearAddIsLinearThenAdd) {
  std::mt19937 rng(45);
  for (DType dtype : {DType::F32, DType::BF16}) {
    Buf x = randomBuf(rng, dtype, {3, 5, 24}), w = randomBuf(rng, dtype, {40, 24}),
        addend = randomBuf(rng, dtype, {3, 5, 40});
    Buf product(dtype, {3, 5, 40}), y(dtype, {3, 5, 40}), y2(dtype, {3, 5, 40});
    cpu::linear(x.view(), w.view(), nullptr, product.view());
    cpu::add(product.view(), addend.view(), y.view());
    cpu::linearAdd(x.view(), w.view(), addend.view(), y2.view());
    EXPECT_EQ(y.storage, y2.storage);
    cpu::linearAdd(x.view(), w.view(), addend.view(), addend.view());
    EXPECT_EQ(y.storage, addend.storage);
  }
  Buf x = randomBuf(rng, DType::F32, {2, 4}), w = randomBuf(rng, DType::F32, {3, 4});
  Buf y(DType::F32, {2, 3}), addend(DType::F32, {2, 4});
  expectError([&] { cpu::linearAdd(x.view(), w.view(), addend.view(), y.view()); },
              {"linear_add: y shape [2, 3] does not match addend shape [2, 4]"});
}

// acc += dyᵀ x: with f32 operands bitwise linear_grad_weight into a temporary then accumulate;
// with bf16 operands the unfused pair rounds the product to bf16 first, the fused kernel does
// not, so they differ by at most that rounding (half a bf16 ulp of the product per element).
TEST(OptimizerKernelsTest, LinearGradWeightAccumulate) {
  std::mt19937 rng(44);
  for (DType dtype : {DType::F32, DType::BF16}) {
    Buf dy = randomBuf(rng, dtype, {2, 7, 12}), x = randomBuf(rng, dtype, {2, 7, 9});
    Buf acc = randomBuf(rng, DType::F32, {12, 9}), acc2 = acc;
    Buf g(dtype, {12, 9});
    cpu::linearGradWeight(dy.view(), x.view(), g.view());
    cpu::accumulate(g.view(), acc.view());
    cpu::linearGradWeightAccumulate(dy.view(), x.view(), acc2.view());
    if (dtype == DType::F32) {
      EXPECT_EQ(acc.storage, acc2.storage);
      continue;
    }
    Vec a = acc.get(), b = acc2.get(), gv = g.get();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i], b[i], std::fabs(gv[i]) * std::ldexp(1.0, -8) + 1e-6) << i;
  }
  Buf dy = randomBuf(rng, DType::F32, {4, 3}), x = randomBuf(rng, DType::F32, {4, 2});
  Buf acc(DType::F32, {2, 3});
  expectError([&] { cpu::linearGradWeightAccumulate(dy.view(), x.view(), acc.view()); },
              {"linear_grad_weight_accumulate", "acc"});
}
