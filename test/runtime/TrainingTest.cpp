//===- TrainingTest.cpp - Training steps, micro-batches, resume, the tools -===//
//
// The hand-built training plan (embedding -> linear -> cross_entropy, its backward kernels,
// persistent gradient accumulators and AdamW) learns: its loss falls over 20 steps, and its
// gradient matches finite differences of its own loss. Micro-batches average: the step loss is
// the mean of the micro-batch losses, runs are deterministic, and two micro-batches of batch B
// train like one of batch 2B. Resuming from a checkpoint continues bit for bit, and so does
// training with forward-only evaluations on held-out data in between. Then the
// tools, run as a user runs them: bonsai-run's output formats, metrics file, checkpoints and
// resume, gradient dump, generation, evaluation and one-line errors, and bonsai-tokenize.
//
//===----------------------------------------------------------------------===//

#include "TestPlans.h"
#include "bonsai/runtime/Checkpoint.h"
#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Random.h"
#include "bonsai/runtime/Safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

#ifdef BONSAI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <sys/wait.h>
#include <unistd.h>

namespace bonsai::rt {
namespace {

LoadedPlan loadSpec(const test::PlanSpec &spec, const std::string &name = "train.plan") {
  std::vector<uint8_t> bytes = test::buildPlan(spec);
  return loadPlanBuffer(bytes.data(), bytes.size(), name);
}

/// A token file whose next token is always the current one plus one (mod `vocab`): a bigram
/// model can learn it exactly.
std::string cyclicTokens(const std::string &path, uint32_t count, uint32_t vocab) {
  std::vector<uint32_t> tokens(count);
  for (uint32_t i = 0; i < count; ++i)
    tokens[i] = i % vocab;
  writeTokenFile(path, tokens, 2);
  return path;
}

/// Runs `steps` steps of `count` micro-batches from `pos`, appending the losses.
void train(Executor &e, TokenLoader &loader, TrainingPosition &pos, uint32_t count, int steps,
           std::vector<float> &losses) {
  for (int s = 0; s < steps; ++s) {
    StepResult r = e.trainStep(loader, pos.dataPosition, count);
    losses.push_back(r.loss);
    pos.step += 1;
    pos.dataPosition += count;
  }
}

#ifdef BONSAI_HAVE_CUDA
/// Whether a CUDA device is present (the GPU tests skip without one).
bool gpuPresent() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
    return true;
  cudaGetLastError();
  return false;
}

/// The CUDA backend's options with CUDA Graphs and without: every GPU training test runs both
/// (SCOPED_TRACE(describe(options)) names the one that failed).
std::vector<ExecutorOptions> gpuModes() {
  std::vector<ExecutorOptions> modes(2);
  for (size_t i = 0; i < modes.size(); ++i) {
    modes[i].backend = Backend::Cuda;
    modes[i].cudaGraphs = i == 0;
  }
  return modes;
}

const char *describe(const ExecutorOptions &options) {
  return options.cudaGraphs ? "CUDA Graphs" : "no CUDA Graphs";
}

/// Runs `check(options)` for each of gpuModes() and expects no phase or guarded update to have
/// fallen back to running without a CUDA Graph (the backend says so on stderr).
template <typename Check> void expectInEveryGpuModeWithoutFallback(Check check) {
  for (const ExecutorOptions &gpu : gpuModes()) {
    SCOPED_TRACE(describe(gpu));
    ::testing::internal::CaptureStderr();
    check(gpu);
    std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("without a CUDA Graph"), std::string::npos) << err;
  }
}
#endif

class TrainingTest : public ::testing::Test {
protected:
  void SetUp() override { dir = test::makeTempDir("training"); }
  void TearDown() override { test::removeTree(dir); }
  std::string dir;
};

TEST_F(TrainingTest, LossFallsOverTwentySteps) {
  test::TrainingTensors t;
  test::TrainingDims dims;
  dims.lr = 5e-2;
  LoadedPlan plan = loadSpec(test::trainingPlanSpec(dims, &t));
  Executor e(plan);
  e.initWeights(7);
  TokenLoader loader(cyclicTokens(dir + "/tokens.bin", 4096, 16), 2, 4, 16, 7);
  std::vector<float> losses;
  std::vector<float> lrs, norms;
  TrainingPosition pos;
  for (int s = 0; s < 20; ++s) {
    StepResult r = e.trainStep(loader, pos.dataPosition, 1);
    losses.push_back(r.loss);
    ASSERT_TRUE(r.gradNorm && r.lr);
    norms.push_back(*r.gradNorm);
    lrs.push_back(*r.lr);
    pos.dataPosition += 1;
  }
  EXPECT_NEAR(losses[0], std::log(16.0f), 0.05);
  // 2.77 -> 1.47 (a bigram model learning "next = current + 1").
  EXPECT_LT(losses[19], 0.6f * losses[0]) << "the loss did not fall";
  RecordProperty("first_loss", std::to_string(losses[0]));
  RecordProperty("last_loss", std::to_string(losses[19]));
  for (size_t i = 5; i < losses.size(); ++i)
    EXPECT_LT(losses[i], losses[i - 5]) << "step " << i + 1;
  // The schedule: warmup over 2 steps to 5e-2, then cosine decay.
  EXPECT_FLOAT_EQ(lrs[0], 2.5e-2f);
  EXPECT_FLOAT_EQ(lrs[1], 5e-2f);
  EXPECT_LT(lrs[19], lrs[2]);
  EXPECT_GT(norms[0], 0.0f);
  int64_t step;
  std::memcpy(&step, e.view(t.step).data, sizeof step);
  EXPECT_EQ(step, 20);
}

// bonsai-fuse's optimizer and gemm-epilogue kernels compute on the CPU exactly what the
// kernels they replace compute: three steps of the fused plan (one MultiTensorAdamWUpdate,
// lm_head's gradient accumulated by its GEMM) leave the same bytes in every parameter,
// moment, master copy and the step counter as the unfused plan, with the same losses; with
// fp32 and bf16 parameters (master weights) and with two micro-batches per step.
TEST_F(TrainingTest, FusedKernelsTrainBitForBitAsUnfused) {
  for (test::TrainingDims dims : {test::TrainingDims{}, test::TrainingDims{2, 4, 16, 8, true},
                                  test::TrainingDims{2, 4, 16, 8, false, 2}}) {
    SCOPED_TRACE("bf16 " + std::to_string(dims.bf16Master) + ", micro-batches " +
                 std::to_string(dims.microBatches));
    LoadedPlan plain = loadSpec(test::trainingPlanSpec(dims), "plain.plan");
    LoadedPlan fused = loadSpec(test::fusedTrainingPlanSpec(dims), "fused.plan");
    Executor a(plain), b(fused);
    a.initWeights(3);
    b.initWeights(3);
    TokenLoader loader(cyclicTokens(dir + "/tokens.bin", 4096, 16), 2, 4, 16, 7);
    for (uint64_t s = 0; s < 3; ++s) {
      StepResult ra = a.trainStep(loader, s * dims.microBatches, dims.microBatches);
      StepResult rb = b.trainStep(loader, s * dims.microBatches, dims.microBatches);
      EXPECT_EQ(ra.loss, rb.loss) << "step " << s + 1;
      ASSERT_TRUE(ra.gradNorm && rb.gradNorm);
      EXPECT_EQ(*ra.gradNorm, *rb.gradNorm) << "step " << s + 1;
    }
    size_t compared = 0;
    for (uint32_t i = 0; i < plain.tensors.size(); ++i) {
      const TensorInfo &info = plain.tensors[i];
      if (info.role != TensorRole::Parameter && info.role != TensorRole::OptimizerState)
        continue;
      ASSERT_EQ(fused.tensors[i].name, info.name);
      EXPECT_EQ(std::memcmp(a.view(i).data, b.view(i).data, info.bytes), 0) << info.name;
      ++compared;
    }
    EXPECT_GE(compared, dims.bf16Master ? 9u : 7u);
  }
}

#ifdef BONSAI_HAVE_CUDA
// The fused kernels on the GPU, inside the executor's CUDA Graphs (and without them): three
// steps of the fused plan track the CPU's (losses, parameters and moments within fp32 GEMM
// tolerance), and the multi-tensor AdamW, the beta = 1 accumulating GEMM and the graphs'
// replay of both keep doing so step after step.
TEST_F(TrainingTest, FusedKernelsTrainOnTheGpuAsOnTheCpu) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  for (const ExecutorOptions &gpuOptions : gpuModes()) {
    SCOPED_TRACE(describe(gpuOptions));
    test::TrainingDims dims{2, 4, 16, 8, false, 2};
    LoadedPlan fused = loadSpec(test::fusedTrainingPlanSpec(dims), "fused.plan");
    Executor cpu(fused), gpu(fused, gpuOptions);
    cpu.initWeights(3);
    gpu.initWeights(3);
    TokenLoader loader(cyclicTokens(dir + "/tokens.bin", 4096, 16), 2, 4, 16, 7);
    for (uint64_t s = 0; s < 3; ++s) {
      StepResult rc = cpu.trainStep(loader, 2 * s, 2), rg = gpu.trainStep(loader, 2 * s, 2);
      EXPECT_NEAR(rg.loss, rc.loss, 1e-4 * std::fabs(rc.loss)) << "step " << s + 1;
      ASSERT_TRUE(rc.gradNorm && rg.gradNorm);
      EXPECT_NEAR(*rg.gradNorm, *rc.gradNorm, 1e-4 * *rc.gradNorm) << "step " << s + 1;
    }
    for (uint32_t i = 0; i < fused.tensors.size(); ++i) {
      const TensorInfo &info = fused.tensors[i];
      if (info.role != TensorRole::Parameter && info.role != TensorRole::OptimizerState)
        continue;
      if (info.dtype != DType::F32)
        continue; // the step counter
      std::vector<float> c = test::floatsOf(cpu, i), g = test::floatsOf(gpu, i);
      float scale = 0.0f;
      for (float v : c)
        scale = std::max(scale, std::fabs(v));
      for (size_t e = 0; e < c.size(); ++e)
        ASSERT_NEAR(g[e], c[e], 1e-4f * scale + 1e-4f * std::fabs(c[e]))
            << info.name << "[" << e << "]";
    }
  }
}

// bonsai-run --lr on the GPU: the CUDA backend once ran a copy of the plan that the override
// never reached, so the GPU trained at the plan's lr while the CPU followed --lr. Now an
// override before the first step, and one between steps (after the phases were captured as
// CUDA Graphs), change the GPU's lr and losses as they change the CPU's.
TEST_F(TrainingTest, LearningRateOverrideTakesEffectOnTheGpu) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  for (const ExecutorOptions &gpuOptions : gpuModes()) {
    SCOPED_TRACE(describe(gpuOptions));
    test::TrainingTensors t{};
    LoadedPlan plan = loadSpec(test::trainingPlanSpec({}, &t)); // lr 1e-2
    Executor cpu(plan), gpu(plan, gpuOptions), planLr(plan, gpuOptions);
    for (Executor *e : {&cpu, &gpu, &planLr})
      e->initWeights(3);
    cpu.overrideLearningRate(3e-3);
    gpu.overrideLearningRate(3e-3);
    TokenLoader loader(cyclicTokens(dir + "/tokens.bin", 4096, 16), 2, 4, 16, 7);
    for (uint64_t s = 0; s < 3; ++s) {
      StepResult rc = cpu.trainStep(loader, s, 1), rg = gpu.trainStep(loader, s, 1),
                 rp = planLr.trainStep(loader, s, 1);
      ASSERT_TRUE(rc.lr && rg.lr && rp.lr);
      EXPECT_NEAR(*rg.lr, *rc.lr, 1e-6 * *rc.lr) << "step " << s + 1;
      EXPECT_NEAR(rg.loss, rc.loss, 1e-4 * std::fabs(rc.loss)) << "step " << s + 1;
      if (s == 2) {
        ASSERT_GT(*rp.lr, 0.0f);
        EXPECT_NEAR(*rg.lr / *rp.lr, 0.3, 1e-5); // 3e-3 against the plan's 1e-2
        EXPECT_NE(rg.loss, rp.loss);
      }
    }
    // After three captured steps: lr 0 leaves the weights where they are, on both.
    std::vector<float> before = test::floatsOf(gpu, t.head);
    cpu.overrideLearningRate(0);
    gpu.overrideLearningRate(0);
    StepResult rc = cpu.trainStep(loader, 3, 1), rg = gpu.trainStep(loader, 3, 1);
    ASSERT_TRUE(rc.lr && rg.lr);
    EXPECT_EQ(*rg.lr, 0.0f);
    EXPECT_EQ(*rc.lr, 0.0f);
    EXPECT_EQ(test::floatsOf(gpu, t.head), before);
  }
}
#endif

TEST_F(TrainingTest, GradientMatchesFiniteDifferences) {
  test::TrainingTensors t;
  LoadedPlan plan = loadSpec(test::trainingPlanSpec({}, &t));
  Executor e(plan);
  e.initWeights(1);
  // Weights of order one, so the gradient is far above the rounding of a finite difference.
  Rng rng(11);
  for (uint32_t w : {t.table, t.head}) {
    auto *p = static_cast<float *>(e.view(w).data);
    for (int64_t i = 0; i < plan.tensors[w].numel; ++i)
      p[i] = float(0.5 * rng.normal());
  }
  TokenLoader loader("", 2, 4, 16, 5);
  TokenBatch batch = loader.batch(0);
  e.forwardBackward(batch, 1.0f);
  std::vector<float> gTable = test::floatsOf(e, t.gradTable), gHead = test::floatsOf(e, t.gradHead);
  const float eps = 1e-2f;
  int checked = 0;
  for (auto [w, g] : {std::pair{t.table, &gTable}, std::pair{t.head, &gHead}}) {
    auto *p = static_cast<float *>(e.view(w).data);
    // The rows of the first ids (table) and every 7th element (head).
    std::vector<int64_t> indices;
    if (w == t.table)
      for (int d = 0; d < 8; d += 3)
        indices.push_back(batch.inputs[0] * 8 + d);
    else
      for (int64_t i = 0; i < 128; i += 7)
        indices.push_back(i);
    for (int64_t i : indices) {
      float saved = p[i];
      p[i] = saved + eps;
      float up = e.forward(batch);
      p[i] = saved - eps;
      float down = e.forward(batch);
      p[i] = saved;
      double numeric = (double(up) - double(down)) / (2.0 * eps);
      EXPECT_NEAR((*g)[size_t(i)], numeric, 2e-3 + 2e-2 * std::fabs(numeric))
          << plan.tensors[w].name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST_F(TrainingTest, MicroBatchLossIsTheMeanAndDeterministic) {
  LoadedPlan plan = loadSpec(test::trainingPlanSpec({2, 4, 16, 8, false, 2}));
  std::string data = cyclicTokens(dir + "/tokens.bin", 997, 16);
  auto run = [&](std::vector<StepResult> &results) {
    Executor e(plan);
    e.initWeights(4);
    TokenLoader loader(data, 2, 4, 16, 4);
    for (uint64_t s = 0; s < 4; ++s)
      results.push_back(e.trainStep(loader, s * 2, 2));
    return test::stateOf(e);
  };
  std::vector<StepResult> a, b;
  auto stateA = run(a), stateB = run(b);
  EXPECT_EQ(stateA, stateB);
  ASSERT_EQ(a.size(), 4u);
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].microBatchLosses.size(), 2u);
    EXPECT_EQ(a[s].loss, b[s].loss);
    EXPECT_EQ(a[s].loss,
              float((double(a[s].microBatchLosses[0]) + double(a[s].microBatchLosses[1])) / 2));
    EXPECT_NE(a[s].microBatchLosses[0], a[s].microBatchLosses[1]);
  }
}

TEST_F(TrainingTest, TwoMicroBatchesOfBTrainLikeOneOf2B) {
  // Micro-batches 2s and 2s+1 of [2, 4] read the rows step s of [4, 4] reads (the file is long
  // enough not to wrap), and every position counts in the loss, so the accumulated gradient
  // of the mean micro-batch loss is the gradient of the big batch's loss.
  std::string data = cyclicTokens(dir + "/tokens.bin", 4001, 13);
  // Random data would do as well; a cycle of 13 over a vocabulary of 16 keeps some ids unseen.
  LoadedPlan small = loadSpec(test::trainingPlanSpec({2, 4, 16, 8}));
  LoadedPlan big = loadSpec(test::trainingPlanSpec({4, 4, 16, 8}));
  Executor a(small), b(big);
  a.initWeights(9);
  b.initWeights(9);
  EXPECT_EQ(test::stateOf(a), test::stateOf(b));
  TokenLoader la(data, 2, 4, 16, 9), lb(data, 4, 4, 16, 9);
  for (uint64_t s = 0; s < 5; ++s) {
    StepResult ra = a.trainStep(la, 2 * s, 2);
    StepResult rb = b.trainStep(lb, s, 1);
    EXPECT_NEAR(ra.loss, rb.loss, 1e-5f) << "step " << s + 1;
    EXPECT_NEAR(*ra.gradNorm, *rb.gradNorm, 1e-5f) << "step " << s + 1;
  }
  auto sa = test::stateOf(a), sb = test::stateOf(b);
  for (const auto &[name, bytes] : sa) {
    if (name == "state:optimizer.step") {
      EXPECT_EQ(bytes, sb[name]);
      continue;
    }
    std::vector<float> x(bytes.size() / 4), y(bytes.size() / 4);
    std::memcpy(x.data(), bytes.data(), bytes.size());
    std::memcpy(y.data(), sb[name].data(), bytes.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(x[i], y[i], 1e-4f + 1e-3f * std::fabs(y[i])) << name << "[" << i << "]";
  }
}

TEST_F(TrainingTest, ResumeContinuesBitForBit) {
  struct Config {
    test::TrainingDims dims;
    uint32_t count;
  };
  for (Config c : {Config{{2, 4, 16, 8, false, 1}, 1}, Config{{2, 4, 16, 8, true, 2}, 2},
                   Config{{2, 4, 16, 8, true, 1}, 3}}) {
    SCOPED_TRACE("bf16 master " + std::to_string(c.dims.bf16Master) + ", micro-batches " +
                 std::to_string(c.count));
    LoadedPlan plan = loadSpec(test::trainingPlanSpec(c.dims));
    std::string data = cyclicTokens(dir + "/tokens.bin", 611, 16);

    // Twenty steps straight.
    Executor straight(plan);
    straight.initWeights(5);
    TokenLoader loader(data, 2, 4, 16, 5);
    TrainingPosition pos{0, 0, 5};
    std::vector<float> expected;
    train(straight, loader, pos, c.count, 20, expected);

    // Ten, a checkpoint, a fresh executor resumed from it, ten more.
    std::string ckpt = dir + "/ckpt";
    test::removeTree(ckpt);
    std::vector<float> losses;
    {
      Executor first(plan);
      first.initWeights(5);
      TokenLoader l(data, 2, 4, 16, 5);
      TrainingPosition p{0, 0, 5};
      train(first, l, p, c.count, 10, losses);
      saveCheckpoint(ckpt, first, p);
    }
    Executor resumed(plan);
    CheckpointManifest m = loadCheckpoint(resolveCheckpoint(ckpt), resumed);
    TrainingPosition p = m.position;
    EXPECT_EQ(p.step, 10u);
    EXPECT_EQ(p.dataPosition, 10u * c.count);
    TokenLoader l(data, 2, 4, 16, p.seed);
    train(resumed, l, p, c.count, 10, losses);

    ASSERT_EQ(losses.size(), expected.size());
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&losses[i], &expected[i], 4), 0)
          << "step " << i + 1 << ": " << losses[i] << " vs " << expected[i];
    EXPECT_EQ(test::stateOf(resumed), test::stateOf(straight));
  }
}

#ifdef BONSAI_HAVE_CUDA
// On the GPU, a checkpoint reads back only the arenas of the tensors it saves (weights,
// gradient accumulators, optimizer state), and a resumed executor sends what it loaded: the
// run resumed after step 5 continues bit for bit as the straight one, on the same device.
TEST_F(TrainingTest, ResumeOnTheGpuContinuesBitForBit) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  LoadedPlan plan = loadSpec(test::fusedTrainingPlanSpec({2, 4, 16, 8, true, 2}), "gpu.plan");
  std::string data = cyclicTokens(dir + "/tokens.bin", 611, 16);
  ExecutorOptions gpu;
  gpu.backend = Backend::Cuda;
  Executor straight(plan, gpu);
  straight.initWeights(5);
  TokenLoader loader(data, 2, 4, 16, 5);
  TrainingPosition pos{0, 0, 5};
  std::vector<float> expected;
  train(straight, loader, pos, 2, 10, expected);

  std::string ckpt = dir + "/ckpt";
  test::removeTree(ckpt);
  std::vector<float> losses;
  {
    Executor first(plan, gpu);
    first.initWeights(5);
    TokenLoader l(data, 2, 4, 16, 5);
    TrainingPosition p{0, 0, 5};
    train(first, l, p, 2, 5, losses);
    saveCheckpoint(ckpt, first, p);
    // Training goes on after a checkpoint as before it.
    std::vector<float> more;
    train(first, l, p, 2, 1, more);
    EXPECT_EQ(std::memcmp(&more[0], &expected[5], 4), 0) << more[0] << " vs " << expected[5];
  }
  Executor resumed(plan, gpu);
  CheckpointManifest m = loadCheckpoint(resolveCheckpoint(ckpt), resumed);
  TrainingPosition p = m.position;
  ASSERT_EQ(p.step, 5u);
  TokenLoader l(data, 2, 4, 16, p.seed);
  train(resumed, l, p, 2, 5, losses);
  ASSERT_EQ(losses.size(), expected.size());
  for (size_t i = 0; i < losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&losses[i], &expected[i], 4), 0)
        << "step " << i + 1 << ": " << losses[i] << " vs " << expected[i];
  EXPECT_EQ(test::stateOf(resumed), test::stateOf(straight));
}
#endif

//===----------------------------------------------------------------------===//
// Profiling (bonsai-run --profile): every kernel of a step timed, training unchanged.
//===----------------------------------------------------------------------===//

/// Four steps of `plan` with `options` and the state after them; with `profiledStep` >= 0 that
/// step (0-based) runs with profiling on and `ms` receives its kernels' times.
std::map<std::string, std::vector<uint8_t>>
trainProfiled(const LoadedPlan &plan, const ExecutorOptions &options, const std::string &data,
              int profiledStep, std::vector<float> &losses, std::vector<double> &ms) {
  Executor e(plan, options);
  e.initWeights(3);
  TokenLoader loader(data, 2, 4, 16, 3);
  TrainingPosition pos;
  for (int s = 0; s < 4; ++s) {
    e.setProfiling(s == profiledStep);
    train(e, loader, pos, 2, 1, losses);
    if (s == profiledStep)
      ms = e.kernelMilliseconds();
  }
  return test::stateOf(e);
}

/// A profiled step times every kernel the step ran (the forward, backward and update phases of
/// the plan, all of them here) and trains exactly as an unprofiled one: the same losses and
/// state bit for bit, also in the steps after it.
void expectProfilingTimesEveryKernel(const ExecutorOptions &options, const std::string &dir) {
  LoadedPlan plan = loadSpec(test::fusedTrainingPlanSpec({2, 4, 16, 8, true, 2}), "profile.plan");
  std::string data = cyclicTokens(dir + "/tokens.bin", 611, 16);
  std::vector<float> plainLosses, profiledLosses;
  std::vector<double> unused, ms;
  auto plain = trainProfiled(plan, options, data, -1, plainLosses, unused);
  auto profiled = trainProfiled(plan, options, data, 1, profiledLosses, ms);
  ASSERT_EQ(profiledLosses.size(), plainLosses.size());
  for (size_t i = 0; i < plainLosses.size(); ++i)
    EXPECT_EQ(std::memcmp(&profiledLosses[i], &plainLosses[i], 4), 0)
        << "step " << i + 1 << ": " << profiledLosses[i] << " vs " << plainLosses[i];
  EXPECT_EQ(profiled, plain);
  ASSERT_EQ(ms.size(), plan.kernels.size());
  for (size_t i = 0; i < ms.size(); ++i)
    EXPECT_GT(ms[i], 0.0) << plan.describeKernel(i);
}

TEST_F(TrainingTest, ProfilingTimesEveryKernelAndTrainsBitForBit) {
  expectProfilingTimesEveryKernel({}, dir);
}

#ifdef BONSAI_HAVE_CUDA
// On the GPU a profiled step runs its phases kernel by kernel between CUDA events instead of
// replaying their graphs: the same kernels, so the same bits, in both modes.
TEST_F(TrainingTest, ProfilingOnTheGpuTimesEveryKernelAndTrainsBitForBit) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  for (const ExecutorOptions &gpu : gpuModes()) {
    SCOPED_TRACE(describe(gpu));
    expectProfilingTimesEveryKernel(gpu, dir);
  }
}
#endif

//===----------------------------------------------------------------------===//
// Evaluation on held-out data: the Forward phase alone, training unchanged.
//===----------------------------------------------------------------------===//

/// The training plan with the LM head's gradient computed and accumulated in the Forward
/// phase, as a fused head (LinearCrossEntropy) computes its gradients there: a Forward kernel
/// writes a persistent tensor (the accumulator), which an evaluation must leave as it was.
test::PlanSpec headGradientInForwardSpec(test::TrainingDims dims = {}) {
  test::PlanSpec p = test::trainingPlanSpec(dims);
  // 0 Embedding, 1 Linear, 2 CrossEntropy | 3 CrossEntropyGrad, 4 LinearGradWeight (head),
  // 5 LinearGradInput, 6 EmbeddingGrad, 7 Accumulate (table), 8 Accumulate (head) | update.
  std::vector<test::KernelSpec> kernels;
  for (size_t i : {0, 1, 2, 3, 4, 8}) {
    kernels.push_back(p.kernels[i]);
    kernels.back().phase = Phase::Forward;
  }
  for (size_t i : {5, 6, 7})
    kernels.push_back(p.kernels[i]);
  for (size_t i = 9; i < p.kernels.size(); ++i)
    kernels.push_back(p.kernels[i]);
  EXPECT_EQ(p.kernels[8].kind, KernelKind::Accumulate);
  EXPECT_EQ(p.kernels[9].kind, KernelKind::GradNorm);
  p.kernels = std::move(kernels);
  return p;
}

/// Trains `steps` steps of `count` micro-batches from fresh weights (seed 3); with
/// `evalBatches` > 0, evaluates that many batches of `evalData` after every step. Returns the
/// losses, the final parameters and optimizer state, and the val losses.
struct EvalRun {
  std::vector<float> losses, valLosses;
  std::map<std::string, std::vector<uint8_t>> state;
};
EvalRun trainWithEvaluation(const LoadedPlan &plan, const ExecutorOptions &options,
                            const std::string &data, const std::string &evalData, uint32_t count,
                            int steps, uint64_t evalBatches) {
  Executor e(plan, options);
  e.initWeights(3);
  const std::vector<int64_t> shape = e.inputShape();
  TokenLoader loader(data, shape[0], shape[1], plan.vocabularySize(), 3);
  TokenLoader held(evalData, shape[0], shape[1], plan.vocabularySize(), 3);
  EvalRun run;
  TrainingPosition pos;
  for (int s = 0; s < steps; ++s) {
    train(e, loader, pos, count, 1, run.losses);
    if (evalBatches > 0)
      run.valLosses.push_back(e.evaluate(held, evalBatches));
  }
  run.state = test::stateOf(e);
  return run;
}

TEST_F(TrainingTest, EvaluationLeavesTrainingBitForBit) {
  std::string data = cyclicTokens(dir + "/tokens.bin", 611, 16);
  // Another stream of the same vocabulary: next = current + 3.
  std::vector<uint32_t> other(203);
  for (uint32_t i = 0; i < other.size(); ++i)
    other[i] = (3 * i + 5) % 16;
  std::string evalData = dir + "/eval.bin";
  writeTokenFile(evalData, other, 2);
  struct Case {
    const char *name;
    test::PlanSpec spec;
    uint32_t count;
  };
  Case cases[] = {
      {"plain", test::trainingPlanSpec(), 1},
      {"bf16 master, 2 micro-batches", test::trainingPlanSpec({2, 4, 16, 8, true, 2}), 2},
      {"fused", test::fusedTrainingPlanSpec({2, 4, 16, 8, true, 2}), 2},
      {"fp8", test::fp8TrainingPlanSpec(), 1},
      {"head gradient in the forward phase", headGradientInForwardSpec(), 1},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    LoadedPlan plan = loadSpec(c.spec);
    EvalRun straight = trainWithEvaluation(plan, {}, data, evalData, c.count, 6, 0);
    EvalRun evaluated = trainWithEvaluation(plan, {}, data, evalData, c.count, 6, 3);
    ASSERT_EQ(evaluated.losses.size(), straight.losses.size());
    for (size_t i = 0; i < straight.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&evaluated.losses[i], &straight.losses[i], 4), 0)
          << "step " << i + 1 << ": " << evaluated.losses[i] << " vs " << straight.losses[i];
    EXPECT_EQ(evaluated.state, straight.state);
    ASSERT_EQ(evaluated.valLosses.size(), 6u);
    // The weights change from step to step, and so does the val loss.
    EXPECT_NE(evaluated.valLosses.front(), evaluated.valLosses.back());
    for (float v : evaluated.valLosses)
      EXPECT_TRUE(std::isfinite(v)) << v;
  }
}

TEST_F(TrainingTest, EvaluationIsTheMeanForwardLoss) {
  std::string evalData = cyclicTokens(dir + "/eval.bin", 30, 16); // 3 batches of 2 x 4
  for (const test::PlanSpec &spec : {test::trainingPlanSpec(), headGradientInForwardSpec()}) {
    LoadedPlan plan = loadSpec(spec);
    Executor evaluating(plan);
    evaluating.initWeights(4);
    TokenLoader held(evalData, 2, 4, 16, 4);
    EXPECT_EQ(held.fileBatches(), 3u);
    float one = evaluating.evaluate(held, 1);
    float three = evaluating.evaluate(held, 3);
    // Independently: the training losses of the same batches, before any update changes the
    // weights (lr 0 keeps them where they are).
    Executor training(plan);
    training.initWeights(4);
    training.overrideLearningRate(0);
    TokenLoader loader(evalData, 2, 4, 16, 4);
    std::vector<float> losses;
    TrainingPosition pos;
    train(training, loader, pos, 1, 3, losses);
    EXPECT_NEAR(one, losses[0], 1e-6);
    EXPECT_NEAR(three, (double(losses[0]) + losses[1] + losses[2]) / 3, 1e-6);
    EXPECT_NE(losses[0], losses[1]) << "the batches differ";
    EXPECT_THROW(evaluating.evaluate(held, 0), Error);
  }
}

#ifdef BONSAI_HAVE_CUDA
// The same on the CUDA backend, with its captured CUDA Graphs: an evaluation replays the
// Forward phase's graph, and training goes on bit for bit as without it; the val losses are
// the CPU's to fp32 rounding.
TEST_F(TrainingTest, EvaluationOnTheGpuLeavesTrainingBitForBit) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  std::string data = cyclicTokens(dir + "/tokens.bin", 611, 16);
  std::string evalData = cyclicTokens(dir + "/eval.bin", 203, 16);
  ExecutorOptions gpu;
  gpu.backend = Backend::Cuda;
  ExecutorOptions eager = gpu;
  eager.cudaGraphs = false;
  // The val losses match the CPU's to fp32 rounding; with FP8, the scales the two backends
  // derive after each update may round a few casts to neighbouring FP8 codes.
  struct Case {
    const char *name;
    test::PlanSpec spec;
    uint32_t count;
    double tolerance;
  };
  Case cases[] = {
      {"plain", test::trainingPlanSpec(), 1, 1e-4},
      {"fused, 2 micro-batches", test::fusedTrainingPlanSpec({2, 4, 16, 8, true, 2}), 2, 1e-4},
      {"fp8", test::fp8TrainingPlanSpec(), 1, 1e-2},
      {"head gradient in the forward phase", headGradientInForwardSpec(), 1, 1e-4},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    LoadedPlan plan = loadSpec(c.spec, "gpu.plan");
    for (const ExecutorOptions &options : {gpu, eager}) {
      SCOPED_TRACE(options.cudaGraphs ? "CUDA Graphs" : "eager");
      EvalRun straight = trainWithEvaluation(plan, options, data, evalData, c.count, 6, 0);
      EvalRun evaluated = trainWithEvaluation(plan, options, data, evalData, c.count, 6, 3);
      ASSERT_EQ(evaluated.losses.size(), straight.losses.size());
      for (size_t i = 0; i < straight.losses.size(); ++i)
        EXPECT_EQ(std::memcmp(&evaluated.losses[i], &straight.losses[i], 4), 0)
            << "step " << i + 1 << ": " << evaluated.losses[i] << " vs " << straight.losses[i];
      EXPECT_EQ(evaluated.state, straight.state);
      EvalRun cpu = trainWithEvaluation(plan, {}, data, evalData, c.count, 6, 3);
      ASSERT_EQ(evaluated.valLosses.size(), cpu.valLosses.size());
      for (size_t i = 0; i < cpu.valLosses.size(); ++i)
        EXPECT_NEAR(evaluated.valLosses[i], cpu.valLosses[i],
                    c.tolerance * std::fabs(cpu.valLosses[i]))
            << "step " << i + 1;
    }
  }
}
#endif

/// The bytes of every tensor of a persistent arena (weights, optimizer state, accumulators,
/// the step counter) but the metrics (grad_norm and lr, which the test plan keeps there and
/// every step recomputes), by tensor index.
std::map<uint32_t, std::vector<char>> persistentBytes(const Executor &e) {
  const LoadedPlan &p = e.plan();
  std::map<uint32_t, std::vector<char>> out;
  for (uint32_t i = 0; i < p.tensors.size(); ++i)
    if (p.arenas[p.tensors[i].arena].lifetime == Lifetime::Persistent &&
        p.tensors[i].role != TensorRole::Metric) {
      const auto *b = static_cast<const char *>(e.view(i).data);
      out[i] = std::vector<char>(b, b + p.tensors[i].bytes);
    }
  return out;
}

/// Expects `after` to hold `before`'s bytes in every tensor, naming the first that differs.
void expectSameBytes(const Executor &e, const std::map<uint32_t, std::vector<char>> &before,
                     const std::map<uint32_t, std::vector<char>> &after, const char *what) {
  ASSERT_EQ(before.size(), after.size());
  for (const auto &[tensor, bytes] : before)
    EXPECT_TRUE(after.at(tensor) == bytes) << what << ": " << e.plan().describeTensor(tensor);
}

/// The non-finite guard (docs/training.md, "Non-finite steps") on `options`' backend: a step
/// whose gradient is not finite (a NaN planted in a gradient accumulator: the loss stays
/// finite) and a step whose loss is not finite (a NaN planted in every embedding row) each
/// skip their update, leaving every persistent tensor bit for bit, and the step after a
/// skipped one trains exactly as if the skipped step had not been run; a checkpoint of the
/// NaN weights is refused.
void expectNonFiniteStepsSkipped(const ExecutorOptions &options, const std::string &dir) {
  test::TrainingTensors t;
  LoadedPlan plan = loadSpec(test::trainingPlanSpec({}, &t));
  std::string data = cyclicTokens(dir + "/tokens.bin", 611, 16);
  TokenLoader loader(data, 2, 4, 16, 5);
  Executor straight(plan, options);
  straight.initWeights(5);
  for (uint64_t m = 0; m < 3; ++m)
    EXPECT_FALSE(straight.trainStep(loader, m, 1).skipped) << "step " << m + 1;

  Executor e(plan, options);
  e.initWeights(5);
  e.trainStep(loader, 0, 1);
  e.trainStep(loader, 1, 1);
  auto before = persistentBytes(e);
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(e.view(t.gradHead).data, &nan, sizeof nan);
  StepResult r = e.trainStep(loader, 2, 1);
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(std::isfinite(r.loss)) << r.loss;
  ASSERT_TRUE(r.gradNorm);
  EXPECT_FALSE(std::isfinite(*r.gradNorm)) << *r.gradNorm;
  expectSameBytes(e, before, persistentBytes(e), "after a non-finite gradient");
  int64_t step = -1;
  std::memcpy(&step, e.view(t.step).data, sizeof step);
  EXPECT_EQ(step, 2);
  // The planted NaN is gone with the accumulator the skipped update cleared: a re-run kernel
  // by kernel finds nothing, and changes nothing.
  EXPECT_EQ(e.findNonFinite(loader, 2, 1), "");
  expectSameBytes(e, before, persistentBytes(e), "after --find-nonfinite");

  // The same micro-batch again, now finite: the run continues as the straight one.
  r = e.trainStep(loader, 2, 1);
  EXPECT_FALSE(r.skipped);
  expectSameBytes(e, persistentBytes(straight), persistentBytes(e), "after the retried step");

  // A non-finite loss.
  const TensorView &table = e.view(t.table);
  for (int64_t row = 0; row < table.shape[0]; ++row)
    std::memcpy(static_cast<float *>(table.data) + row * table.shape[1], &nan, sizeof nan);
  before = persistentBytes(e);
  r = e.trainStep(loader, 3, 1);
  EXPECT_TRUE(r.skipped);
  EXPECT_FALSE(std::isfinite(r.loss)) << r.loss;
  expectSameBytes(e, before, persistentBytes(e), "after a non-finite loss");
  std::string found = e.findNonFinite(loader, 3, 1);
  EXPECT_NE(found.find("micro-batch 3: kernel 0 "), std::string::npos) << found;
  EXPECT_NE(found.find("(Embedding) wrote a non-finite value to tensor"), std::string::npos)
      << found;
  EXPECT_NE(found.find("non-finite inputs: tensor 0 'model.embed_tokens.weight' (element 0 is "),
            std::string::npos)
      << found;
  expectSameBytes(e, before, persistentBytes(e), "after --find-nonfinite");

  TrainingPosition pos{3, 4, 5};
  try {
    saveCheckpoint(dir + "/ckpt", e, pos);
    ADD_FAILURE() << "a checkpoint of NaN weights was written";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("model.embed_tokens.weight"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("non-finite"), std::string::npos) << error.what();
  }
  EXPECT_NE(::access((dir + "/ckpt/step-00000003").c_str(), F_OK), 0);
}

TEST_F(TrainingTest, NonFiniteStepsSkipTheirUpdate) { expectNonFiniteStepsSkipped({}, dir); }

// With the guard off (bonsai-run --max-nonfinite 0) the planted NaN reaches the weights.
TEST_F(TrainingTest, WithoutTheGuardANonFiniteStepUpdates) {
  test::TrainingTensors t;
  LoadedPlan plan = loadSpec(test::trainingPlanSpec({}, &t));
  ExecutorOptions off;
  off.guardNonFinite = false;
  Executor e(plan, off);
  e.initWeights(5);
  TokenLoader loader(cyclicTokens(dir + "/tokens.bin", 611, 16), 2, 4, 16, 5);
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(e.view(t.gradHead).data, &nan, sizeof nan);
  EXPECT_FALSE(e.trainStep(loader, 0, 1).skipped);
  float w;
  std::memcpy(&w, e.view(t.head).data, sizeof w);
  EXPECT_TRUE(std::isnan(w));
}

#ifdef BONSAI_HAVE_CUDA
// The same on the GPU, with CUDA Graphs (the guarded update is one graph whose body is a
// conditional node) and without (the host reads the flag).
TEST_F(TrainingTest, NonFiniteStepsSkipTheirUpdateOnTheGpu) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  // With graphs, the conditional graph was built: no fallback to the host's decision.
  expectInEveryGpuModeWithoutFallback(
      [&](const ExecutorOptions &gpu) { expectNonFiniteStepsSkipped(gpu, dir); });
}
#endif

/// The spike rule's bounds (SpikeLimits, docs/training.md "Loss and gradient spikes") on
/// `options`' backend: a step whose global gradient norm exceeds its bound (a large finite
/// value planted in a gradient accumulator) and a step whose loss exceeds its bound each skip
/// their update bit for bit and say why; the same steps under bounds they meet update, and the
/// run goes on as one that never met a bound.
void expectSpikesSkipped(const ExecutorOptions &options, const std::string &dir) {
  using Cause = StepResult::Cause;
  test::TrainingTensors t;
  LoadedPlan plan = loadSpec(test::trainingPlanSpec({}, &t));
  std::string data = cyclicTokens(dir + "/tokens.bin", 611, 16);
  TokenLoader loader(data, 2, 4, 16, 5);
  Executor straight(plan, options);
  straight.initWeights(5);
  for (uint64_t m = 0; m < 3; ++m)
    straight.trainStep(loader, m, 1);

  Executor e(plan, options);
  e.initWeights(5);
  e.trainStep(loader, 0, 1);
  e.trainStep(loader, 1, 1);
  auto before = persistentBytes(e);
  float big = 1e4f;
  std::memcpy(e.view(t.gradHead).data, &big, sizeof big);
  SpikeLimits normBound;
  normBound.gradNorm = 100.0f;
  StepResult r = e.trainStep(loader, 2, 1, normBound);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.cause, Cause::GradNormSpike);
  ASSERT_TRUE(r.gradNorm);
  EXPECT_TRUE(std::isfinite(*r.gradNorm) && *r.gradNorm > 100.0f) << *r.gradNorm;
  expectSameBytes(e, before, persistentBytes(e), "after a gradient-norm spike");
  int64_t step = -1;
  std::memcpy(&step, e.view(t.step).data, sizeof step);
  EXPECT_EQ(step, 2);

  // The micro-batch again, its norm under the bound: the run continues as the straight one.
  r = e.trainStep(loader, 2, 1, normBound);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.cause, Cause::None);
  expectSameBytes(e, persistentBytes(straight), persistentBytes(e), "after the retried step");

  // A loss above its bound skips; at its bound it runs (the bound is inclusive) as the
  // straight run's step does.
  StepResult want = straight.trainStep(loader, 3, 1);
  SpikeLimits lossBound;
  lossBound.loss = std::nextafter(want.loss, 0.0f);
  before = persistentBytes(e);
  r = e.trainStep(loader, 3, 1, lossBound);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.cause, Cause::LossSpike);
  EXPECT_EQ(r.loss, want.loss);
  expectSameBytes(e, before, persistentBytes(e), "after a loss spike");
  lossBound.loss = want.loss;
  r = e.trainStep(loader, 3, 1, lossBound);
  EXPECT_FALSE(r.skipped);
  expectSameBytes(e, persistentBytes(straight), persistentBytes(e), "after the loss at its bound");
}

TEST_F(TrainingTest, SpikesSkipTheirUpdate) { expectSpikesSkipped({}, dir); }

#ifdef BONSAI_HAVE_CUDA
// The same on the GPU: the gradient norm's bound is a device scalar the guard kernel reads,
// inside the update's CUDA Graph and without one.
TEST_F(TrainingTest, SpikesSkipTheirUpdateOnTheGpu) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  for (const ExecutorOptions &gpu : gpuModes()) {
    SCOPED_TRACE(describe(gpu));
    expectSpikesSkipped(gpu, dir);
  }
}
#endif

/// Offloaded state on `options`' backend (docs/offload.md): lm_head's moments and fp32 master
/// in pinned host memory, copied to the device around its update, train three steps to the
/// same losses and the same persistent bytes as the plan that keeps them on the device,
/// whether the copies run in order on the compute stream or on the copy streams (where the
/// GPU orders them by the waits the loader derives).
void expectOffloadBitForBit(const ExecutorOptions &options, const std::string &dir) {
  test::TrainingTensors t;
  LoadedPlan onDevice = loadSpec(test::trainingPlanSpec({2, 4, 16, 8, true}, &t), "device.plan");
  LoadedPlan inOrder = loadSpec(test::offloadedPlanSpec(t), "in-order.plan");
  test::PlanSpec spec = test::offloadedPlanSpec(t, nullptr, true);
  LoadedPlan streamed = loadSpec(spec, "streamed.plan");
  // The copies in moved to the start of the update phase, as bonsai-schedule issues the first
  // update's: ahead of the guard's check kernels (a CUDA Graph once crashed on them).
  auto firstUpdate = std::find_if(spec.kernels.begin(), spec.kernels.end(),
                                  [](const auto &k) { return k.phase == Phase::Update; });
  auto copiesIn = std::stable_partition(firstUpdate, spec.kernels.end(), [](const auto &k) {
    return k.kind == KernelKind::CopyHostToDevice;
  });
  ASSERT_EQ(copiesIn - firstUpdate, 3);
  LoadedPlan prefetched = loadSpec(spec, "prefetched.plan");
  ASSERT_FALSE(inOrder.usesSideStreams());
  ASSERT_TRUE(streamed.usesSideStreams());
  std::string data = cyclicTokens(dir + "/tokens.bin", 611, 16);
  TokenLoader loader(data, 2, 4, 16, 5);
  // The offloaded plans with their copies timed (docs/offload.md, "Telemetry"), and one
  // without: the same training, the bytes without the times.
  ExecutorOptions timedOptions = options;
  timedOptions.offloadTiming = true;
  Executor a(onDevice, options), b(inOrder, timedOptions), c(streamed, timedOptions),
      d(prefetched, timedOptions), untimed(streamed, options);
  for (Executor *e : {&a, &b, &c, &d, &untimed})
    e->initWeights(5);
  for (uint64_t m = 0; m < 3; ++m) {
    StepResult ra = a.trainStep(loader, m, 1);
    EXPECT_FALSE(ra.offload) << "a plan without copies has no offload telemetry";
    StepResult ru = untimed.trainStep(loader, m, 1);
    EXPECT_EQ(ru.loss, ra.loss) << "step " << m + 1;
    ASSERT_TRUE(ru.offload);
    EXPECT_FALSE(ru.offload->timed);
    EXPECT_EQ(ru.offload->toDeviceSeconds + ru.offload->toHostSeconds, 0.0);
    EXPECT_EQ(ru.offload->exposedSeconds, 0.0);
    for (Executor *e : {&b, &c, &d}) {
      StepResult r = e->trainStep(loader, m, 1);
      EXPECT_EQ(r.loss, ra.loss) << "step " << m + 1;
      // Every copy of the step is timed, once (docs/offload.md, "Telemetry"): the bytes are
      // the plan's, the time each way is positive, and the compute stream waited for part of
      // it at most (all of it where the copies run in order on it). On a GPU with CUDA
      // Graphs, the copies inside the guarded update's conditional node cannot be (a body
      // holds no event records): the timed bytes are at most the plan's.
      ASSERT_TRUE(r.offload) << "step " << m + 1;
      EXPECT_TRUE(r.offload->timed);
      LoadedPlan::PcieBytes pcie = e->plan().pcieBytesPerStep(1);
      bool inConditionalBody = options.backend == Backend::Cuda && options.cudaGraphs;
      if (inConditionalBody) {
        EXPECT_LE(r.offload->toDeviceBytes, pcie.hostToDevice) << "step " << m + 1;
        EXPECT_LE(r.offload->toHostBytes, pcie.deviceToHost) << "step " << m + 1;
      } else {
        EXPECT_EQ(r.offload->toDeviceBytes, pcie.hostToDevice) << "step " << m + 1;
        EXPECT_EQ(r.offload->toHostBytes, pcie.deviceToHost) << "step " << m + 1;
        EXPECT_GT(r.offload->toDeviceSeconds, 0.0) << "step " << m + 1;
        EXPECT_GT(r.offload->toHostSeconds, 0.0) << "step " << m + 1;
      }
      if (!inConditionalBody)
        EXPECT_GT(r.offload->exposedSeconds, 0.0) << "step " << m + 1;
      EXPECT_EQ(r.offload->hostStepSeconds, 0.0) << "step " << m + 1;
      if (e == &b)
        EXPECT_GE(r.offload->exposedSeconds,
                  (r.offload->toDeviceSeconds + r.offload->toHostSeconds) * (1 - 1e-9))
            << "copies run in order on the compute stream are exposed whole";
    }
  }
  expectSameBytes(b, persistentBytes(a), persistentBytes(b), "copies in order");
  expectSameBytes(untimed, persistentBytes(a), persistentBytes(untimed), "copies not timed");
  expectSameBytes(c, persistentBytes(a), persistentBytes(c), "copies on the copy streams");
  expectSameBytes(d, persistentBytes(a), persistentBytes(d), "copies in first");
}

TEST_F(TrainingTest, OffloadedStateTrainsBitForBit) { expectOffloadBitForBit({}, dir); }

#ifdef BONSAI_HAVE_CUDA
// The same on the GPU: with CUDA Graphs, the guarded update's conditional body forks and joins
// the copy streams inside the graph (no fallback to eager); without, the events order them.
TEST_F(TrainingTest, OffloadedStateTrainsBitForBitOnTheGpu) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  expectInEveryGpuModeWithoutFallback([&](const ExecutorOptions &gpu) { expectOffloadBitForBit(gpu, dir); });
}
#endif

/// The host step on `options`' backend (docs/offload.md, "The host step"): lm_head's AdamW
/// update on the host stream, over its state and a mirror of the weight in pinned host memory,
/// trains three steps to the same losses and the same persistent bytes as the plan that
/// updates on the device, and the mirror stays the weight's copy. On the CPU the update is the
/// CPU backend's kernel over other bytes; on the GPU it is the host implementation of the CUDA
/// kernel (HostOptimizer.h), a host function in stream order with the copies.
void expectHostStepBitForBit(const ExecutorOptions &options, const std::string &dir) {
  test::TrainingTensors t;
  LoadedPlan onDevice = loadSpec(test::trainingPlanSpec({2, 4, 16, 8, true}, &t), "device.plan");
  uint32_t mirror = 0;
  size_t update = 0;
  test::PlanSpec hostSpec = test::hostStepPlanSpec(t, &mirror, &update);
  LoadedPlan onHost = loadSpec(hostSpec, "host-step.plan");
  ASSERT_TRUE(onHost.usesSideStreams());
  // The same with the copy back into the weight on the stream of the host steps' results,
  // where the compiler puts it.
  hostSpec.kernels[update + 1].stream = 4;
  LoadedPlan copyOnHostStream = loadSpec(hostSpec, "host-step-copy.plan");
  std::string data = cyclicTokens(dir + "/tokens.bin", 611, 16);
  TokenLoader loader(data, 2, 4, 16, 5);
  ExecutorOptions timedOptions = options;
  timedOptions.offloadTiming = true;
  Executor a(onDevice, options), b(onHost, timedOptions), c(copyOnHostStream, options);
  a.initWeights(5);
  b.initWeights(5);
  c.initWeights(5);
  for (uint64_t m = 0; m < 3; ++m) {
    StepResult ra = a.trainStep(loader, m, 1), rb = b.trainStep(loader, m, 1),
               rc = c.trainStep(loader, m, 1);
    EXPECT_EQ(rb.loss, ra.loss) << "step " << m + 1;
    EXPECT_EQ(rc.loss, ra.loss) << "step " << m + 1;
    // The host steps' wall time is counted for the plan that has them, and only for it; the
    // compute stream waited for the parameter's copy back, after the host step.
    EXPECT_FALSE(ra.offload);
    // Untimed (c), the host steps' time is still counted.
    for (const StepResult *r : {&rb, &rc}) {
      ASSERT_TRUE(r->offload) << "step " << m + 1;
      EXPECT_GT(r->offload->hostStepSeconds, 0.0) << "step " << m + 1;
    }
    EXPECT_TRUE(rb.offload->timed);
    EXPECT_GT(rb.offload->toDeviceBytes, 0u) << "step " << m + 1;
    EXPECT_GT(rb.offload->toHostBytes, 0u) << "step " << m + 1;
    EXPECT_GT(rb.offload->exposedSeconds, 0.0) << "step " << m + 1;
    EXPECT_FALSE(rc.offload->timed);
    EXPECT_EQ(rc.offload->exposedSeconds, 0.0);
  }
  EXPECT_FALSE(onDevice.hasHostSteps());
  EXPECT_TRUE(onHost.hasHostSteps());
  auto want = persistentBytes(a);
  for (Executor *e : {&b, &c}) {
    auto got = persistentBytes(*e);
    EXPECT_TRUE(got.at(mirror) == want.at(t.head)) << "the mirror is not lm_head.weight's copy";
    // The tensors both plans have (the host step's are appended).
    for (auto it = got.begin(); it != got.end();)
      it = it->first >= onDevice.tensors.size() ? got.erase(it) : std::next(it);
    expectSameBytes(*e, want, got, "the update on the host");
  }
}

TEST_F(TrainingTest, HostStepTrainsBitForBit) { expectHostStepBitForBit({}, dir); }

#ifdef BONSAI_HAVE_CUDA
// The same on the GPU, where the host computes the CUDA kernel's bits: with CUDA Graphs the
// guarded update (a conditional body cannot hold a host function) runs eagerly, by design and
// without a fallback message; the other phases stay graphs.
TEST_F(TrainingTest, HostStepTrainsBitForBitOnTheGpu) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  expectInEveryGpuModeWithoutFallback([&](const ExecutorOptions &gpu) { expectHostStepBitForBit(gpu, dir); });
}
#endif

//===----------------------------------------------------------------------===//
// The tools.
//===----------------------------------------------------------------------===//

struct ToolResult {
  int code = -1;
  std::string out, err;
};

/// Runs `tool` with `args` (no shell), stdout and stderr to files (not a terminal).
ToolResult runTool(const char *tool, const std::vector<std::string> &args,
                   const std::string &scratch) {
  std::string outPath = scratch + "/stdout", errPath = scratch + "/stderr";
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child == 0) {
    int out = ::open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = ::open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char *> argv = {const_cast<char *>(tool)};
    for (const std::string &a : args)
      argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(tool, argv.data());
    ::_exit(127);
  }
  ToolResult r;
  int status = 0;
  if (child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status))
    r.code = WEXITSTATUS(status);
  r.out = test::readText(outPath);
  r.err = test::readText(errPath);
  return r;
}

/// The "step ..." lines of an output, in order.
std::vector<std::string> stepLines(const std::string &out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("step ", 0) == 0)
      lines.push_back(line);
  return lines;
}

/// The backends bonsai-run can run here: the CPU, and CUDA where a GPU is present.
std::vector<std::string> backendsHere() {
  std::vector<std::string> backends{"cpu"};
#ifdef BONSAI_HAVE_CUDA
  if (gpuPresent())
    backends.push_back("cuda");
#endif
  return backends;
}

class ToolTest : public TrainingTest {
protected:
  ToolResult run(std::vector<std::string> args) { return runTool(BONSAI_RUN_PATH, args, dir); }
  std::string writePlan(const test::PlanSpec &spec, const std::string &name) {
    std::string path = dir + "/" + name;
    test::writeFile(path, test::buildPlan(spec));
    return path;
  }
  /// Expects exit status 1 and exactly one stderr line starting "bonsai-run: error: " that
  /// contains every part (a usage synopsis may follow a command-line mistake).
  void expectError(const ToolResult &r, std::initializer_list<std::string> parts) {
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    std::string first = r.err.substr(0, r.err.find('\n'));
    EXPECT_EQ(first.rfind("bonsai-run: error: ", 0), 0u) << r.err;
    for (const std::string &part : parts)
      EXPECT_NE(first.find(part), std::string::npos) << "'" << part << "' not in: " << r.err;
  }
};

TEST_F(ToolTest, ForwardOnlyPlanPrintsPlainStepLines) {
  std::string plan = writePlan(test::smallPlanSpec(), "small.plan");
  ToolResult r = run({plan, "--steps", "2", "--seed", "3"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = stepLines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  std::regex exact(R"(step [12] loss -?[0-9.]+(e[-+][0-9]+)?)");
  for (const std::string &line : lines)
    EXPECT_TRUE(std::regex_match(line, exact)) << line;
  // The same losses as the library computes.
  LoadedPlan loaded = loadSpec(test::smallPlanSpec());
  Executor e(loaded);
  e.initWeights(3);
  TokenLoader loader("", 2, 4, 16, 3);
  char expected[64];
  std::snprintf(expected, sizeof expected, "step 1 loss %.9g",
                double(e.trainStep(loader, 0, 1).loss));
  EXPECT_EQ(lines[0], expected);
  EXPECT_NE(r.out.find("memory: arena 0 'weights'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("time: 2 steps in"), std::string::npos) << r.out;
}

TEST_F(ToolTest, TrainingPrintsMetricsAndWritesJsonLines) {
  std::string plan = writePlan(test::trainingPlanSpec(), "train.plan");
  std::string data = cyclicTokens(dir + "/tokens.bin", 3000, 16);
  std::string metrics = dir + "/metrics.jsonl";
  // On the CPU, as the library's executor below runs (with a GPU present, bonsai-run would
  // default to it, whose sums round differently).
  ToolResult r = run({plan, "--data", data, "--steps", "6", "--seed", "2", "--metrics", metrics,
                      "--backend", "cpu"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = stepLines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  std::regex exact(R"(step ([0-9]+) loss (\S+) grad_norm (\S+) lr (\S+))");
  std::vector<float> losses;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(lines[i], m, exact)) << lines[i];
    EXPECT_EQ(m[1], std::to_string(i + 1));
    losses.push_back(std::strtof(m[2].str().c_str(), nullptr));
  }
  // The library, same plan, data and seed: the same losses to the bit.
  LoadedPlan loaded = loadSpec(test::trainingPlanSpec());
  Executor e(loaded);
  e.initWeights(2);
  TokenLoader loader(data, 2, 4, 16, 2);
  for (uint64_t s = 0; s < 6; ++s)
    EXPECT_EQ(e.trainStep(loader, s, 1).loss, losses[s]) << "step " << s + 1;

  std::istringstream in(test::readText(metrics));
  int count = 0;
  for (std::string line; std::getline(in, line); ++count) {
    JsonValue v = parseJson(line, "metrics line");
    EXPECT_EQ(v.find("step")->unsignedValue(), uint64_t(count + 1));
    EXPECT_EQ(float(v.find("loss")->numberValue()), losses[size_t(count)]);
    EXPECT_TRUE(v.find("grad_norm")->isNumber());
    EXPECT_TRUE(v.find("lr")->isNumber());
    EXPECT_GT(v.find("tokens_per_s")->numberValue(), 0.0);
    EXPECT_EQ(v.find("tokens")->unsignedValue(), 8u);
    EXPECT_EQ(v.find("micro_batches")->unsignedValue(), 1u);
    uint64_t planned = v.find("memory_planned_bytes")->unsignedValue();
    uint64_t measured = v.find("memory_measured_bytes")->unsignedValue();
    EXPECT_GT(measured, 0u);
    EXPECT_LE(measured, planned);
  }
  EXPECT_EQ(count, 6);

  // --lr overrides the schedule's peak: lr 0 leaves the weights where they are.
  r = run({plan, "--data", data, "--steps", "3", "--lr", "0"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const std::string &line : stepLines(r.out))
    EXPECT_NE(line.find(" lr 0"), std::string::npos) << line;
}

// lr 1e30 makes the weights overflow after the first update: every later step has a
// non-finite loss. bonsai-run skips their updates, counts them (step line, metrics) and stops
// after --max-nonfinite of them in a row, naming the steps; with --max-nonfinite 0 the run goes
// on, and its checkpoint of non-finite weights is refused.
TEST_F(ToolTest, NonFiniteStepsAreSkippedCountedAndStopTheRun) {
  test::TrainingDims dims;
  dims.lr = 1e30;
  std::string plan = writePlan(test::trainingPlanSpec(dims), "nan.plan");
  std::string data = cyclicTokens(dir + "/tokens.bin", 3000, 16);
  std::string metrics = dir + "/metrics.jsonl";
  ToolResult r = run({plan, "--data", data, "--steps", "8", "--metrics", metrics});
  // The warnings of the skipped steps come first; the error is the last line.
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  ASSERT_FALSE(r.err.empty());
  std::string last = r.err.substr(r.err.rfind('\n', r.err.size() - 2) + 1);
  EXPECT_EQ(last, "bonsai-run: error: 3 steps in a row had a non-finite loss or gradient norm "
                  "(steps 2, 3, 4; --max-nonfinite 3): stopping; their updates were skipped, so "
                  "the weights are those after step 1\n");
  std::vector<std::string> lines = stepLines(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  EXPECT_EQ(lines[0].find("skipped"), std::string::npos) << lines[0];
  EXPECT_NE(lines[3].find(" skipped 3"), std::string::npos) << lines[3];
  EXPECT_NE(r.err.find("warning: step 2: loss "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not finite, update skipped (1 in a row, --max-nonfinite 3)"),
            std::string::npos)
      << r.err;
  std::istringstream in(test::readText(metrics));
  std::vector<uint64_t> skipped;
  for (std::string line; std::getline(in, line);)
    skipped.push_back(parseJson(line, "metrics line").find("skipped_steps")->unsignedValue());
  EXPECT_EQ(skipped, (std::vector<uint64_t>{0, 1, 2, 3}));

  r = run({plan, "--data", data, "--steps", "4", "--max-nonfinite", "0", "--save-every", "4",
           "--ckpt-dir", dir + "/ck"});
  EXPECT_EQ(stepLines(r.out).size(), 4u) << r.out;
  expectError(r, {"cannot checkpoint step 4", "non-finite"});
  EXPECT_NE(::access((dir + "/ck/step-00000004").c_str(), F_OK), 0);
}

// --spike-zscore on each backend: constant tokens but for one micro-batch of varied ones (step
// 25's, once the loss has settled near 0): that step's loss is a spike, its update is skipped
// and counted, and no other step is. A run saved at step 20 and resumed decides as the
// uninterrupted one, which needs the windows from the checkpoint (a resumed run's own window
// would fill only at step 28). Flag mistakes are one-line errors.
TEST_F(ToolTest, SpikeRuleSkipsAnOutlierAndResumesOnCpuAndGpu) {
  std::string plan = writePlan(test::trainingPlanSpec(), "train.plan");
  std::vector<uint32_t> tokens(400, 3);
  for (uint32_t i = 193; i < 200; ++i) // micro-batch 24 reads tokens [192, 201)
    tokens[i] = (i * 7) % 16;
  std::string data = dir + "/spiky.bin";
  writeTokenFile(data, tokens, 2);
  for (const std::string &backend : backendsHere()) {
    SCOPED_TRACE(backend);
    std::vector<std::string> common = {plan,           "--data",         data, "--backend",
                                       backend,        "--spike-zscore", "3",  "--spike-window",
                                       "8",            "--seed",         "1", "--lr", "0.05"};
    auto with = [&](std::vector<std::string> more) {
      std::vector<std::string> args = common;
      args.insert(args.end(), more.begin(), more.end());
      return run(args);
    };
    ToolResult straight = with({"--steps", "30"});
    ASSERT_EQ(straight.code, 0) << straight.err;
    std::vector<std::string> lines = stepLines(straight.out);
    ASSERT_EQ(lines.size(), 30u) << straight.out;
    // The progress line's count of skipped steps appears from the first one on.
    for (size_t s = 0; s < lines.size(); ++s)
      EXPECT_EQ(lines[s].find(" skipped"), s < 24 ? std::string::npos : lines[s].size() - 10)
          << lines[s];
    EXPECT_NE(straight.err.find("warning: step 25: loss "), std::string::npos)
        << straight.out << straight.err;
    EXPECT_NE(straight.err.find(" above the spike limit "), std::string::npos) << straight.err;
    EXPECT_NE(straight.err.find("(mean + 3 sd of the last 8 steps), update skipped (1 in a row, "
                                "--max-nonfinite 3)"),
              std::string::npos)
        << straight.err;

    std::string ckpt = dir + "/ckpt-" + backend;
    ToolResult first = with({"--steps", "20", "--save-every", "20", "--ckpt-dir", ckpt});
    ASSERT_EQ(first.code, 0) << first.err;
    ToolResult resumed = with({"--steps", "10", "--resume", ckpt});
    ASSERT_EQ(resumed.code, 0) << resumed.err;
    std::vector<std::string> tail = stepLines(resumed.out);
    EXPECT_EQ(tail, std::vector<std::string>(lines.begin() + 20, lines.end())) << resumed.out;
  }
  expectError(run({plan, "--spike-window", "8"}), {"--spike-window needs --spike-zscore"});
  expectError(run({plan, "--spike-zscore", "0"}), {"--spike-zscore expects a positive number"});
  expectError(run({plan, "--spike-zscore", "3", "--spike-window", "1"}),
              {"--spike-window is between 2 and 10000 steps, got 1"});
  expectError(run({plan, "--spike-zscore", "3", "--max-nonfinite", "0"}),
              {"--spike-zscore needs the non-finite guard"});
}

// Steps past a cosine schedule's total_steps (40 in the test plan) are a warning at start.
TEST_F(ToolTest, StepsPastTheScheduleAreAWarning) {
  std::string plan = writePlan(test::trainingPlanSpec(), "train.plan");
  ToolResult r = run({plan, "--steps", "41"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("bonsai-run: warning: this run ends at step 41, past the schedule's "
                       "total_steps 40: the learning rate is min_lr (0.001) from step 40"),
            std::string::npos)
      << r.err;
  r = run({plan, "--steps", "40"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

// bonsai-run --nondeterministic on either backend: the CPU's kernels are deterministic either
// way, so the run is the plain one line for line; on a GPU the backend says it is on, and a plan
// without a kernel that has a faster unordered form (this one has no attention) trains as
// without it. The kernel that has one is checked against the CPU and the deterministic path in
// CudaAttentionReducingDqTest.
TEST_F(ToolTest, NondeterministicFlagOnEitherBackend) {
  std::string plan = writePlan(test::trainingPlanSpec(), "train.plan");
  std::string data = cyclicTokens(dir + "/tokens.bin", 3000, 16);
  for (const std::string &backend : backendsHere()) {
    SCOPED_TRACE(backend);
    std::vector<std::string> args{plan,     "--data", data,        "--steps", "4",
                                  "--seed", "2",      "--backend", backend};
    ToolResult plain = run(args);
    args.push_back("--nondeterministic");
    ToolResult unordered = run(args);
    ASSERT_EQ(plain.code, 0) << plain.err;
    ASSERT_EQ(unordered.code, 0) << unordered.err;
    EXPECT_EQ(stepLines(unordered.out), stepLines(plain.out));
    EXPECT_EQ(stepLines(plain.out).size(), 4u) << plain.out;
    const bool says = unordered.out.find(", nondeterministic\n") != std::string::npos;
    EXPECT_EQ(says, backend == "cuda") << unordered.out;
    EXPECT_EQ(plain.out.find("nondeterministic"), std::string::npos) << plain.out;
  }
}

#ifdef BONSAI_HAVE_CUDA
// bonsai-run --lr, as a user runs it, on the CUDA backend: every step's lr is the one asked
// for and matches the CPU backend's, step by step (the plan's own peak is 1e-2).
TEST_F(ToolTest, LearningRateFlagTakesEffectOnTheGpu) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU here";
  std::string plan = writePlan(test::trainingPlanSpec(), "train.plan");
  std::string data = cyclicTokens(dir + "/tokens.bin", 3000, 16);
  std::regex line(R"(step ([0-9]+) loss (\S+) grad_norm (\S+) lr (\S+))");
  auto lrs = [&](const std::string &backend, const std::string &lr) {
    ToolResult r = run({plan, "--data", data, "--steps", "4", "--seed", "2", "--backend",
                        backend, "--lr", lr});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.find("backend: cpu") != std::string::npos, backend == "cpu") << r.out;
    std::vector<double> values;
    for (const std::string &l : stepLines(r.out)) {
      std::smatch m;
      if (std::regex_match(l, m, line))
        values.push_back(std::strtod(m[4].str().c_str(), nullptr));
      else
        ADD_FAILURE() << "not a step line: " << l;
    }
    EXPECT_EQ(values.size(), 4u) << r.out;
    return values;
  };
  std::vector<double> gpu = lrs("cuda", "3e-3"), cpu = lrs("cpu", "3e-3");
  std::vector<double> plain = lrs("cuda", "1e-2");
  ASSERT_EQ(gpu.size(), 4u);
  ASSERT_EQ(cpu.size(), 4u);
  ASSERT_EQ(plain.size(), 4u);
  for (size_t s = 0; s < gpu.size(); ++s) {
    EXPECT_NEAR(gpu[s], cpu[s], 1e-6 * cpu[s]) << "step " << s + 1;
    EXPECT_NEAR(gpu[s], 0.3 * plain[s], 1e-6 * plain[s]) << "step " << s + 1;
  }
  EXPECT_GT(gpu.back(), 0.0);
  for (double lr : lrs("cuda", "0"))
    EXPECT_EQ(lr, 0.0);
}
#endif

TEST_F(ToolTest, CheckpointAndResumeContinueTheRun) {
  std::string plan = writePlan(test::trainingPlanSpec({2, 4, 16, 8, true, 2}), "train.plan");
  std::string data = cyclicTokens(dir + "/tokens.bin", 777, 16);
  std::string ckpt = dir + "/ckpt";
  ToolResult straight = run({plan, "--data", data, "--steps", "8", "--seed", "4"});
  ASSERT_EQ(straight.code, 0) << straight.err;
  std::vector<std::string> expected = stepLines(straight.out);
  ASSERT_EQ(expected.size(), 8u);

  ToolResult first = run({plan, "--data", data, "--steps", "4", "--seed", "4", "--save-every", "2",
                          "--ckpt-dir", ckpt});
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.out.find("checkpoint: step 2 saved to " + ckpt + "/step-00000002\n"),
            std::string::npos)
      << first.out;
  EXPECT_NE(first.out.find("checkpoint: step 4 saved to " + ckpt + "/step-00000004\n"),
            std::string::npos);
  std::vector<std::string> lines = stepLines(first.out);
  EXPECT_EQ(lines, std::vector<std::string>(expected.begin(), expected.begin() + 4));

  // From the latest: steps 5..8 as the straight run printed them.
  ToolResult resumed = run({plan, "--data", data, "--resume", "--ckpt-dir", ckpt, "--steps", "4"});
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resume: " + ckpt + "/step-00000004 (step 4, micro-batch 8)\n"),
            std::string::npos)
      << resumed.out;
  EXPECT_EQ(stepLines(resumed.out), std::vector<std::string>(expected.begin() + 4, expected.end()));
  // From a named checkpoint: steps 3..8.
  resumed = run({plan, "--resume", ckpt + "/step-00000002", "--data", data, "--steps", "6"});
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(stepLines(resumed.out), std::vector<std::string>(expected.begin() + 2, expected.end()));

  // A resumed run keeps the checkpoint's seed.
  expectError(run({plan, "--resume=" + ckpt, "--seed", "5", "--data", data}),
              {"--seed 5 differs from the seed 4 of checkpoint"});
  // A corrupt checkpoint: one line naming the file.
  std::string model = ckpt + "/step-00000004/model.safetensors";
  std::string bytes = test::readText(model);
  bytes[bytes.size() / 2] ^= 4;
  test::writeFile(model, std::vector<uint8_t>(bytes.begin(), bytes.end()));
  ToolResult bad = run({plan, "--resume", ckpt, "--data", data});
  expectError(bad, {model + "' fails its SHA-256 check"});
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}

TEST_F(ToolTest, DumpsOneMicroBatchOfGradients) {
  test::TrainingTensors t;
  test::PlanSpec spec = test::trainingPlanSpec({2, 4, 16, 8, false, 4}, &t);
  std::string plan = writePlan(spec, "train.plan");
  std::string grads = dir + "/grads.safetensors";
  // The CPU backend, as the executor below: on a GPU machine bonsai-run would default to
  // CUDA, whose GEMMs round differently from the CPU's.
  ToolResult r = run({plan, "--seed", "6", "--dump-gradients", grads, "--backend", "cpu"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("gradients: 5 tensors of micro-batch 0 written to " + grads + "\n"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(stepLines(r.out).empty()) << "--dump-gradients alone trains no step";
  // The gradient of micro-batch 0's own loss (loss scale 1, not 1/4), no update.
  LoadedPlan loaded = loadSpec(spec);
  Executor e(loaded);
  e.initWeights(6);
  TokenLoader loader("", 2, 4, 16, 6);
  e.forwardBackward(loader.batch(0), 1.0f);
  Checkpoint file = Checkpoint::open(grads);
  for (auto [name, tensor] : {std::pair{"lm_head.weight", t.gradHead},
                              std::pair{"model.embed_tokens.weight", t.gradTable}}) {
    const SafetensorsEntry *entry = file.find(name);
    ASSERT_NE(entry, nullptr) << name;
    std::vector<float> got(128);
    file.read(*entry, {got.data(), DType::F32, {16, 8}});
    EXPECT_EQ(got, test::floatsOf(e, tensor)) << name;
  }
  expectError(run({writePlan(test::smallPlanSpec(), "small.plan"), "--dump-gradients", grads}),
              {"--dump-gradients: plan", "has no backward phase"});
}

TEST_F(ToolTest, GeneratesBytesAfterTrainingAndFromACheckpoint) {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "abcdefgh";
  std::string input = dir + "/corpus.txt";
  test::writeFile(input, std::vector<uint8_t>(text.begin(), text.end()));
  std::string tokens = dir + "/corpus.bin";
  ToolResult tok = runTool(BONSAI_TOKENIZE_PATH, {input, "-o", tokens}, dir);
  ASSERT_EQ(tok.code, 0) << tok.err;

  test::TrainingDims dims{2, 8, 256, 16, false, 1, 5e-2};
  std::string plan = writePlan(test::trainingPlanSpec(dims), "bytes.plan");
  std::string ckpt = dir + "/ckpt";
  ToolResult r = run({plan, "--data", tokens, "--steps", "40", "--save-every", "40", "--ckpt-dir",
                      ckpt, "--generate", "abc", "--max-new-bytes", "10"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("prompt: abc\ngenerated: defghabcde\n"), std::string::npos) << r.out;
  // The trained model, resumed: the same text, and no training step.
  ToolResult again = run({plan, "--resume", ckpt, "--generate", "abc", "--max-new-bytes", "10"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("prompt: abc\ngenerated: defghabcde\n"), std::string::npos) << again.out;
  EXPECT_TRUE(stepLines(again.out).empty());
  // Prompts longer than the context slide; non-printable bytes are escaped.
  ToolResult escaped = run({plan, "--resume", ckpt, "--generate",
                            "x\ty\\z\n\x01"
                            "abcdefghabc",
                            "--max-new-bytes", "3"});
  ASSERT_EQ(escaped.code, 0) << escaped.err;
  EXPECT_NE(escaped.out.find("prompt: x\\ty\\\\z\\n\\x01abcdefghabc\ngenerated: def\n"),
            std::string::npos)
      << escaped.out;
  // A byte-level prompt needs a vocabulary that holds its bytes.
  expectError(run({writePlan(test::trainingPlanSpec(), "small.plan"), "--generate", "abc"}),
              {"--generate: prompt byte 0 is 97, not below the plan's vocabulary size 16"});
  // Neither logits nor a fused LM head whose operands give them.
  test::PlanSpec unnamed = test::trainingPlanSpec();
  for (test::TensorSpec &t : unnamed.tensors)
    if (t.name == "logits")
      t.name = "scores";
  expectError(run({writePlan(unnamed, "unnamed.plan"), "--generate", "abc"}),
              {"--generate reads a float tensor named 'logits'", "has neither"});
}

TEST_F(ToolTest, CommandLineMistakesAreOneLine) {
  std::string plan = writePlan(test::trainingPlanSpec(), "train.plan");
  std::string small = writePlan(test::smallPlanSpec(), "small.plan");
  expectError(run({plan, "--micro-batches", "0"}), {"--micro-batches must be between 1"});
  expectError(run({plan, "--save-every", "2"}), {"--save-every needs --ckpt-dir"});
  expectError(run({plan, "--resume"}), {"--resume without a path needs --ckpt-dir"});
  // A full checkpoint holds every parameter: --weights would be ignored, so it is refused
  // (an adapter checkpoint takes its base from --weights instead; CheckpointTest).
  ASSERT_EQ(run({plan, "--save-every", "1", "--ckpt-dir", dir + "/full"}).code, 0);
  expectError(run({plan, "--resume", dir + "/full", "--weights", "w.safetensors"}),
              {"holds the whole model: --weights is not used with it"});
  expectError(run({plan, "--keep-last", "2"}), {"--keep-last needs --save-every"});
  expectError(run({plan, "--max-new-tokens", "2", "--generate", "a"}),
              {"--max-new-tokens needs --tokenizer"});
  expectError(run({plan, "--shard-size", "1GB"}), {"--shard-size needs --export-merged"});
  expectError(run({plan, "--shard-size", "1XB", "--export-merged", dir + "/m"}),
              {"--shard-size expects a positive size such as 5GB"});
  expectError(run({plan, "--lr", "-1"}), {"--lr expects a finite non-negative number, got '-1'"});
  expectError(run({plan, "--max-new-bytes", "3"}), {"--max-new-bytes needs --generate"});
  expectError(run({small, "--lr", "0.1"}), {"has no LearningRate kernel"});
  expectError(run({plan, "--resume", dir + "/none"}), {"checkpoint '" + dir + "/none'"});
  // A plan whose update reads a per-micro-batch gradient cannot accumulate.
  test::TrainingTensors t;
  test::PlanSpec spec = test::trainingPlanSpec({}, &t);
  for (test::KernelSpec &k : spec.kernels)
    if (k.kind == KernelKind::GradNorm)
      k.inputs[1] = t.stepGradHead;
  std::string direct = writePlan(spec, "direct.plan");
  EXPECT_EQ(run({direct}).code, 0);
  expectError(run({direct, "--micro-batches", "2"}),
              {"cannot run 2 micro-batches per step", "only the last one's value"});
}

/// The value after `key ` in a step line, or nullopt when the line has none.
std::optional<std::string> fieldOf(const std::string &line, const std::string &key) {
  size_t at = line.find(" " + key + " ");
  if (at == std::string::npos)
    return std::nullopt;
  at += key.size() + 2;
  return line.substr(at, line.find(' ', at) - at);
}

/// The step line without its val_loss: what a run without evaluation prints.
std::string withoutValLoss(const std::string &line) {
  size_t at = line.find(" val_loss ");
  return at == std::string::npos ? line : line.substr(0, at);
}

TEST_F(ToolTest, EvaluatesHeldOutDataEveryNSteps) {
  std::string plan = writePlan(test::trainingPlanSpec(), "train.plan");
  std::string data = cyclicTokens(dir + "/tokens.bin", 3000, 16);
  // 30 tokens: 3 batches of 2 x 4 (each reads 9 tokens, starting 8 apart), next = current + 5.
  std::vector<uint32_t> held(30);
  for (uint32_t i = 0; i < held.size(); ++i)
    held[i] = (5 * i + 1) % 16;
  std::string evalData = dir + "/eval.bin";
  writeTokenFile(evalData, held, 4);
  std::string metrics = dir + "/metrics.jsonl";

  ToolResult plain = run({plan, "--data", data, "--steps", "5", "--seed", "2"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  ToolResult r = run({plan, "--data", data, "--steps", "5", "--seed", "2", "--eval-data", evalData,
                      "--eval-every", "2", "--eval-batches", "2", "--metrics", metrics});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = stepLines(r.out), expected = stepLines(plain.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  ASSERT_EQ(expected.size(), 5u) << plain.out;
  std::map<uint64_t, std::string> valLosses;
  for (size_t i = 0; i < lines.size(); ++i) {
    // The training losses, grad norms and lrs to the last digit of %.9g: bit for bit.
    EXPECT_EQ(withoutValLoss(lines[i]), expected[i]);
    if (std::optional<std::string> v = fieldOf(lines[i], "val_loss"))
      valLosses[i + 1] = *v;
  }
  // Steps 2 and 4 (multiples of 2) and the last.
  ASSERT_EQ(valLosses.size(), 3u) << r.out;
  EXPECT_TRUE(valLosses.count(2) && valLosses.count(4) && valLosses.count(5)) << r.out;
  EXPECT_NE(r.out.find("(evaluation: "), std::string::npos) << r.out;
  // The metrics line of an evaluation step carries the same val_loss; the others none.
  std::istringstream in(test::readText(metrics));
  int count = 0;
  for (std::string line; std::getline(in, line); ++count) {
    JsonValue v = parseJson(line, "metrics line");
    uint64_t step = v.find("step")->unsignedValue();
    const JsonValue *val = v.find("val_loss");
    ASSERT_EQ(val != nullptr, valLosses.count(step) == 1) << line;
    if (val)
      EXPECT_EQ(float(val->numberValue()), std::strtof(valLosses[step].c_str(), nullptr)) << line;
  }
  EXPECT_EQ(count, 5);

  // With lr 0 the weights stay at their initial values, so every val_loss is the mean of the
  // first training losses of a run on the eval file itself: here all 3 batches (the default).
  r = run({plan, "--data", data, "--steps", "2", "--seed", "2", "--lr", "0", "--eval-data",
           evalData, "--eval-every", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  ToolResult onEval = run({plan, "--data", evalData, "--steps", "3", "--seed", "2", "--lr", "0"});
  ASSERT_EQ(onEval.code, 0) << onEval.err;
  std::vector<std::string> evalLines = stepLines(onEval.out);
  ASSERT_EQ(evalLines.size(), 3u) << onEval.out;
  double mean = 0;
  for (const std::string &line : evalLines)
    mean += std::strtod(fieldOf(line, "loss")->c_str(), nullptr) / 3;
  lines = stepLines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  for (const std::string &line : lines) {
    std::optional<std::string> v = fieldOf(line, "val_loss");
    ASSERT_TRUE(v) << line;
    EXPECT_NEAR(std::strtod(v->c_str(), nullptr), mean, 1e-6) << line;
  }
  // --eval-batches 1: the first batch's loss, the first step's training loss on the eval file.
  r = run({plan, "--data", data, "--steps", "1", "--seed", "2", "--lr", "0", "--eval-data",
           evalData, "--eval-every", "1", "--eval-batches", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(stepLines(r.out).size(), 1u) << r.out;
  EXPECT_NEAR(std::strtod(fieldOf(stepLines(r.out)[0], "val_loss")->c_str(), nullptr),
              std::strtod(fieldOf(evalLines[0], "loss")->c_str(), nullptr), 1e-6);
  // Without steps, the weights as given are evaluated once.
  r = run({plan, "--steps", "0", "--seed", "2", "--eval-data", evalData, "--eval-every", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(r.out, m, std::regex(R"(eval: step 0 val_loss (\S+) \(3 batches\))")))
      << r.out;
  EXPECT_NEAR(std::strtod(m[1].str().c_str(), nullptr), mean, 1e-6);
}

TEST_F(ToolTest, EvaluationMistakesAreOneLine) {
  std::string plan = writePlan(test::trainingPlanSpec(), "train.plan"); // vocabulary 16
  std::string data = cyclicTokens(dir + "/tokens.bin", 300, 16);
  std::string good = cyclicTokens(dir + "/eval.bin", 30, 16);
  // Another vocabulary: ids up to 31.
  std::string wide = cyclicTokens(dir + "/wide.bin", 40, 32);
  expectError(
      run({plan, "--data", data, "--eval-data", wide, "--eval-every", "1"}),
      {"--eval-data: token file '" + wide + "': token 16 is 16, not below the vocabulary size 16"});
  // Checked before the first step, not when the first evaluation reaches the bad id.
  expectError(
      run({plan, "--data", data, "--steps", "100", "--eval-data", wide, "--eval-every", "100"}),
      {"--eval-data: ", "not below the vocabulary size 16"});
  // A token width other than 2 or 4.
  std::string bad = dir + "/width.bin";
  {
    std::vector<uint8_t> bytes;
    std::string text = test::readText(good);
    bytes.assign(text.begin(), text.end());
    bytes[12] = 3;
    test::writeFile(bad, bytes);
  }
  expectError(run({plan, "--data", data, "--eval-data", bad, "--eval-every", "1"}),
              {"--eval-data: token file '" + bad + "': bytes per token is 3, expected 2 or 4"});
  std::string shortFile = cyclicTokens(dir + "/short.bin", 8, 16);
  expectError(run({plan, "--data", data, "--eval-data", shortFile, "--eval-every", "1"}),
              {"--eval-data: token file '" + shortFile +
               "' has 8 tokens, but a batch of 2 x 4 needs at least 9"});
  expectError(
      run({plan, "--data", data, "--eval-data", good, "--eval-every", "1", "--eval-batches", "4"}),
      {"--eval-batches 4: token file '" + good + "' holds 3 batches of 2 x 4"});
  expectError(run({plan, "--eval-every", "2"}), {"--eval-every needs --eval-data"});
  expectError(run({plan, "--eval-data", good}), {"--eval-data needs --eval-every"});
  expectError(run({plan, "--eval-batches", "2"}), {"--eval-batches needs --eval-data"});
  expectError(run({plan, "--eval-data=", "--eval-every", "1"}), {"--eval-data needs a token file"});
  for (const char *value : {"0", "-1", "x", "1.5", ""}) {
    expectError(run({plan, "--eval-data", good, "--eval-every", value}),
                {std::string("--eval-every expects a positive integer, got '") + value + "'"});
    expectError(run({plan, "--eval-data", good, "--eval-every", "1", "--eval-batches", value}),
                {std::string("--eval-batches expects a positive integer, got '") + value + "'"});
  }
}

TEST_F(ToolTest, Fp8TelemetryEveryNStepsWithAnUnderflowWarning) {
  // A margin of 20 puts each E4M3FN cast's largest value at 448 / 2^20, below half the
  // smallest subnormal: every nonzero activation and weight underflows.
  std::string plan =
      writePlan(test::fp8TrainingPlanSpec({2, 8, 16, 16}, 4, false, 20), "fp8.plan");
  std::string metrics = dir + "/fp8.jsonl";
  ToolResult r = run({plan, "--steps", "4", "--seed", "2", "--metrics", metrics,
                      "--fp8-stats-every", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream in(test::readText(metrics));
  int count = 0;
  for (std::string line; std::getline(in, line); ++count) {
    JsonValue v = parseJson(line, "metrics line");
    const JsonValue *fp8 = v.find("fp8");
    if (count % 2 == 0) {
      EXPECT_EQ(fp8, nullptr) << line;
      continue;
    }
    ASSERT_NE(fp8, nullptr) << line;
    EXPECT_EQ(fp8->find("tensors")->unsignedValue(), 1u);
    const std::vector<JsonValue> &rows = fp8->find("per_tensor")->elements();
    ASSERT_EQ(rows.size(), 3u);
    const char *operands[] = {"input", "weight", "grad_output"};
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(rows[i].find("tensor")->stringValue(), "lm_head.weight");
      EXPECT_EQ(rows[i].find("operand")->stringValue(), operands[i]);
      EXPECT_GT(rows[i].find("scale")->numberValue(), 0.0);
    }
    EXPECT_GT(rows[0].find("underflow")->numberValue(), 0.9);
    EXPECT_GT(fp8->find("max_underflow")->find("fraction")->numberValue(), 0.9);
  }
  EXPECT_EQ(count, 4);
  // One warning per stats step, on stderr, naming the step, operand and tensor.
  std::regex warning(R"(warning: step ([24]): FP8 underflow: [0-9.]+% of (input|weight) of )"
                     R"('lm_head.weight' became zero \(--fp8-underflow-warn 1%; 1 more FP8 )"
                     R"(operand above it\))");
  std::istringstream err(r.err);
  int warnings = 0;
  for (std::string line; std::getline(err, line);) {
    EXPECT_TRUE(std::regex_match(line, warning)) << line;
    ++warnings;
  }
  EXPECT_EQ(warnings, 2) << r.err;
  EXPECT_EQ(stepLines(r.out).size(), 4u) << "warnings stay off stdout";

  // Off, or a threshold nothing exceeds: no telemetry, no warning.
  r = run({plan, "--steps", "2", "--metrics", metrics, "--fp8-stats-every", "0"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(test::readText(metrics).find("fp8"), std::string::npos);
  r = run({plan, "--steps", "2", "--fp8-stats-every=1", "--fp8-underflow-warn", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // The default: every 10 steps.
  r = run({plan, "--steps", "10", "--metrics", metrics});
  ASSERT_EQ(r.code, 0) << r.err;
  std::string text = test::readText(metrics);
  EXPECT_EQ(text.find("fp8"), text.rfind("fp8")) << "only step 10's line has it";
  EXPECT_NE(text.find("\"step\": 10, "), std::string::npos);
  EXPECT_GT(text.find("fp8"), text.find("\"step\": 10, "));
  EXPECT_NE(r.err.find("warning: step 10: FP8 underflow"), std::string::npos) << r.err;

  expectError(run({plan, "--fp8-stats-every", "-1"}),
              {"--fp8-stats-every expects a non-negative integer, got '-1'"});
  expectError(run({plan, "--fp8-underflow-warn", "1.5"}),
              {"--fp8-underflow-warn is a fraction in [0, 1], got 1.5"});
  expectError(run({plan, "--fp8-underflow-warn", "x"}),
              {"--fp8-underflow-warn expects a finite non-negative number, got 'x'"});
}

TEST_F(ToolTest, TokenizeWritesByteTokens) {
  std::string text = "Hello, world!\n";
  text += '\0';
  text += '\xff';
  std::string input = dir + "/in.txt";
  test::writeFile(input, std::vector<uint8_t>(text.begin(), text.end()));
  for (uint32_t width : {2u, 4u}) {
    std::string out = dir + "/out" + std::to_string(width) + ".bin";
    ToolResult r = runTool(BONSAI_TOKENIZE_PATH,
                           {input, "-o", out, "--token-bytes", std::to_string(width)}, dir);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, "tokenize: " + input +
                         ": 16 bytes -> 16 tokens (byte-level, vocabulary 256, " +
                         std::to_string(width) + " bytes per token) -> " + out + "\n");
    TokenFile file(out);
    EXPECT_EQ(file.count(), 16u);
    EXPECT_EQ(file.bytesPerToken(), width);
    std::vector<uint32_t> ids;
    file.read(0, 16, ids);
    for (size_t i = 0; i < text.size(); ++i)
      EXPECT_EQ(ids[i], uint32_t(static_cast<unsigned char>(text[i]))) << i;
  }
  auto expectFailure = [&](std::vector<std::string> args, const std::string &part) {
    ToolResult r = runTool(BONSAI_TOKENIZE_PATH, args, dir);
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.err.rfind("bonsai-tokenize: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.substr(0, r.err.find('\n')).find(part), std::string::npos) << r.err;
  };
  expectFailure({dir + "/missing.txt", "-o", dir + "/x.bin"}, "cannot open input");
  expectFailure({input, "-o", dir + "/x.bin", "--token-bytes", "3"},
                "--token-bytes must be 2 or 4");
  expectFailure({input}, "no output file given");
  std::string empty = dir + "/empty.txt";
  test::writeFile(empty, {});
  expectFailure({empty, "-o", dir + "/x.bin"}, "is empty");
  std::ifstream none(dir + "/x.bin");
  EXPECT_FALSE(none.good()) << "a failed run left an output file";
}

} // namespace
} // namespace bonsai::rt
