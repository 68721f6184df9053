//===- ExecutorTest.cpp - Running plans end to end on the CPU backend -----===//
//
// The small plan's loss equals the one computed by calling the cpu:: kernels directly on
// separately allocated buffers; views alias their storage; memory is measured; weights saved to
// safetensors bind back to the same loss; a plan that uses every kernel kind runs; and a
// kernel's error says which kernel failed. For training plans: initializers (zeros, fp32
// master copies of bf16 parameters), each phase doing its own part of a step, the loss scale,
// the learning-rate override, and a plan that uses every training kind running.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Executor.h"

#include "TestPlans.h"
#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Init.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <unistd.h>

namespace bonsai::rt {
namespace {

LoadedPlan loadSpec(const test::PlanSpec &spec) {
  std::vector<uint8_t> bytes = test::buildPlan(spec);
  return loadPlanBuffer(bytes.data(), bytes.size(), "test.plan");
}

TEST(ExecutorTest, SmallPlanMatchesDirectKernelCalls) {
  test::SmallDims d;
  LoadedPlan plan = loadSpec(test::smallPlanSpec(d));
  Executor executor(plan);
  executor.initWeights(5);
  TokenLoader loader("", d.batch, d.seq, d.vocab, 5);
  TokenBatch batch = loader.batch(0);
  executor.setInputs(batch);
  float loss = executor.runStep();

  // The same model by hand: own buffers, same init, the kernels called directly.
  std::vector<float> table(size_t(d.vocab * d.hidden)), norm(size_t(d.hidden)),
      head(size_t(d.vocab * d.hidden));
  TensorView tableV{table.data(), DType::F32, {d.vocab, d.hidden}};
  TensorView normV{norm.data(), DType::F32, {d.hidden}};
  TensorView headV{head.data(), DType::F32, {d.vocab, d.hidden}};
  initTensor("model.embed_tokens.weight", InitRule::Normal, 5, tableV);
  initTensor("model.norm.weight", InitRule::Ones, 5, normV);
  initTensor("lm_head.weight", InitRule::Normal, 5, headV);
  std::vector<int32_t> ids(batch.inputs.begin(), batch.inputs.end());
  std::vector<int32_t> labels(batch.labels.begin(), batch.labels.end());
  std::vector<float> h(size_t(d.batch * d.seq * d.hidden)), n(h.size()),
      logits(size_t(d.batch * d.seq * d.vocab));
  float expected = 0;
  cpu::embedding(tableV, {ids.data(), DType::I32, {d.batch, d.seq}},
                 {h.data(), DType::F32, {d.batch, d.seq, d.hidden}});
  cpu::rmsNorm({h.data(), DType::F32, {d.batch, d.seq, d.hidden}}, normV, 1e-5,
               {n.data(), DType::F32, {d.batch, d.seq, d.hidden}});
  cpu::linear({n.data(), DType::F32, {d.batch, d.seq, d.hidden}}, headV, nullptr,
              {logits.data(), DType::F32, {d.batch, d.seq, d.vocab}});
  cpu::crossEntropy({logits.data(), DType::F32, {d.batch * d.seq, d.vocab}},
                    {labels.data(), DType::I32, {d.batch * d.seq}}, -100,
                    {&expected, DType::F32, {}});

  EXPECT_FLOAT_EQ(loss, expected);
  // Small random weights give near-uniform logits: the loss is close to log(vocab).
  EXPECT_NEAR(loss, std::log(float(d.vocab)), 0.05);
  // The executor's intermediate tensors are the hand-computed ones.
  const float *logitsRun = static_cast<const float *>(executor.view(7).data);
  for (size_t i = 0; i < logits.size(); ++i)
    ASSERT_FLOAT_EQ(logitsRun[i], logits[i]) << i;
}

TEST(ExecutorTest, ViewsShareStorageAndArenasAreAligned) {
  LoadedPlan plan = loadSpec(test::smallPlanSpec());
  Executor executor(plan);
  EXPECT_EQ(executor.view(9).data, executor.view(7).data);   // logits.flat over logits
  EXPECT_EQ(executor.view(10).data, executor.view(4).data);  // labels.flat over labels
  EXPECT_EQ(executor.view(9).shape, (std::vector<int64_t>{8, 16}));
  for (uint32_t t : {0u, 3u})
    EXPECT_EQ(reinterpret_cast<uintptr_t>(executor.view(t).data) % 256, 0u);
  // Arenas start zeroed.
  EXPECT_EQ(static_cast<const float *>(executor.view(7).data)[5], 0.0f);
}

// Host memory is checked before anything is allocated (issue #24, item 6): a plan whose arenas
// exceed MemAvailable is refused with the figures and its largest arena; on the CUDA backend
// only pinned-host arenas count. MemAvailable is read from /proc/meminfo's format.
TEST(ExecutorTest, HostMemoryIsCheckedBeforeAllocation) {
  std::string dir = test::makeTempDir("meminfo");
  std::string meminfo = dir + "/meminfo";
  std::string text = "MemTotal:       25165824 kB\nMemFree:         1048576 kB\n"
                     "MemAvailable:   20971520 kB\nBuffers:           12345 kB\n";
  test::writeFile(meminfo, std::vector<uint8_t>(text.begin(), text.end()));
  EXPECT_EQ(availableHostMemory(meminfo), std::optional<uint64_t>(uint64_t(20) << 30));
  EXPECT_EQ(availableHostMemory(dir + "/missing"), std::nullopt);
  EXPECT_TRUE(availableHostMemory().has_value()); // Linux's own /proc/meminfo
  test::removeTree(dir);

  test::PlanSpec spec = test::smallPlanSpec();
  spec.arenas[0].name = "big";
  spec.arenas[0].size = uint64_t(64) << 40; // 64 TiB: more than any machine here has
  LoadedPlan plan = loadSpec(spec);
  try {
    checkHostMemory(plan, Backend::Cpu, uint64_t(20) << 30);
    ADD_FAILURE() << "a 64 TiB plan passed the check";
  } catch (const Error &e) {
    EXPECT_EQ(std::string(e.what()).rfind("plan 'test.plan' needs 65536.00 GiB of host memory for "
                                          "its arenas on the CPU backend (the largest, 'big', "
                                          "65536.00 GiB), but this machine has 20.00 GiB "
                                          "available (MemAvailable in /proc/meminfo)",
                                          0),
              0u)
        << e.what();
  }
  // Device arenas are not host memory on the CUDA backend; no figure, no check.
  EXPECT_NO_THROW(checkHostMemory(plan, Backend::Cuda, uint64_t(20) << 30));
  // But the host copies of the weights the executor binds are, next to the pinned arenas; a
  // pinned arena's tensors (the mirror, a CopyOf) have no second copy.
  test::TrainingTensors t;
  LoadedPlan offloaded = loadSpec(test::hostStepPlanSpec(t));
  uint64_t pinned = offloaded.arenas[3].size + offloaded.arenas[4].size, written = 0;
  int mirrors = 0;
  for (const TensorInfo &info : offloaded.tensors)
    if (info.role == TensorRole::Parameter || info.init == TensorInit::CopyOf) {
      if (offloaded.arenas[info.arena].space == MemorySpace::PinnedHost)
        ++mirrors;
      else
        written += info.bytes;
    }
  EXPECT_GT(mirrors, 0);
  EXPECT_NO_THROW(checkHostMemory(offloaded, Backend::Cuda, pinned + written));
  try {
    checkHostMemory(offloaded, Backend::Cuda, pinned + written - 1);
    ADD_FAILURE() << "the host copies were not counted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(
                  "of host memory for its pinned host arenas (0.00 GiB, the largest "
                  "'optimizer_host', 0.00 GiB) and the host copies of the device arenas' weights "
                  "and the state initialised from them (0.00 GiB), but this machine has 0.00 GiB "
                  "available"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(checkHostMemory(plan, Backend::Cpu, std::nullopt));
  // The executor checks before it allocates: the error is the check's, not a failed mmap.
  try {
    Executor executor(plan);
    ADD_FAILURE() << "a 64 TiB plan was allocated";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("of host memory for its arenas on the CPU backend"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(checkHostMemory(loadSpec(test::smallPlanSpec()), Backend::Cpu,
                                  availableHostMemory()));
}

TEST(ExecutorTest, MeasuresTheBytesTouched) {
  test::PlanSpec spec = test::smallPlanSpec();
  LoadedPlan plan = loadSpec(spec);
  Executor executor(plan);
  for (const ArenaUsage &u : executor.memoryUsage())
    EXPECT_EQ(u.measured, 0u);
  executor.initWeights(1);
  TokenLoader loader("", 2, 4, 16, 1);
  executor.setInputs(loader.batch(0));
  executor.runStep();
  std::vector<ArenaUsage> usage = executor.memoryUsage();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].planned, spec.arenas[0].size);
  EXPECT_EQ(usage[0].measured, spec.arenas[0].size); // lm_head ends the weights arena
  EXPECT_EQ(usage[1].planned, spec.arenas[1].size);
  const test::TensorSpec &loss = spec.tensors[8];
  EXPECT_EQ(usage[1].measured, loss.offset + 4); // the 60 bytes of slack are never touched
  EXPECT_EQ(usage[1].arena->name, "step");
}

TEST(ExecutorTest, SameSeedSameLossAndWeightsRoundTrip) {
  LoadedPlan plan = loadSpec(test::smallPlanSpec());
  auto run = [&](Executor &e, uint64_t dataSeed) {
    TokenLoader loader("", 2, 4, 16, dataSeed);
    e.setInputs(loader.batch(3));
    return e.runStep();
  };
  Executor a(plan), b(plan), c(plan);
  a.initWeights(11);
  b.initWeights(11);
  c.initWeights(12);
  float lossA = run(a, 1);
  EXPECT_EQ(lossA, run(b, 1));
  EXPECT_NE(lossA, run(c, 1));
  EXPECT_EQ(lossA, run(a, 1)); // a step does not change the weights (no optimizer yet)

  // Save a's parameters, bind them into a fresh executor: same loss, bit for bit.
  std::vector<SafetensorsTensor> params;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i)
    if (plan.tensors[i].role == TensorRole::Parameter)
      params.push_back({plan.tensors[i].name, plan.tensors[i].dtype, plan.tensors[i].shape,
                        a.view(i).data});
  std::string path = test::tempPath("roundtrip.safetensors");
  writeSafetensors(path, params);
  Executor d(plan);
  d.bindWeights(Checkpoint::open(path));
  std::remove(path.c_str());
  EXPECT_EQ(run(d, 1), lossA);
}

TEST(ExecutorTest, EveryKindPlanRuns) {
  LoadedPlan plan = loadSpec(test::everyKindPlanSpec());
  Executor executor(plan);
  executor.initWeights(3);
  TokenLoader loader("", 2, 4, 16, 3);
  executor.setInputs(loader.batch(0));
  float loss = executor.runStep();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, std::log(16.0f), 0.1);
  // Spot-check two dispatches against direct calls on the executor's own operands.
  const KernelInfo &slice = plan.kernels[5]; // k = qkv[..., 8:12]
  std::vector<float> k(16 * 2);
  cpu::slice(executor.view(slice.inputs[0]), 2, 8, {k.data(), DType::F32, {2, 4, 4}});
  const float *kRun = static_cast<const float *>(executor.view(slice.outputs[0]).data);
  for (size_t i = 0; i < k.size(); ++i)
    ASSERT_EQ(kRun[i], k[i]) << i;
  const KernelInfo &attention = plan.kernels[9];
  std::vector<float> o(2 * 4 * 2 * 4);
  cpu::attention(executor.view(attention.inputs[0]), executor.view(attention.inputs[1]),
                 executor.view(attention.inputs[2]), true, 0.5, {o.data(), DType::F32, {2, 4, 2, 4}});
  const float *oRun = static_cast<const float *>(executor.view(attention.outputs[0]).data);
  for (size_t i = 0; i < o.size(); ++i)
    ASSERT_EQ(oRun[i], o[i]) << i;
}

TEST(ExecutorTest, KernelErrorsNameTheKernel) {
  LoadedPlan plan = loadSpec(test::smallPlanSpec());
  Executor executor(plan);
  executor.initWeights(1);
  TokenBatch batch;
  batch.batch = 2;
  batch.seq = 4;
  batch.inputs = {1, 2, 3, 99, 4, 5, 6, 7}; // 99 is outside the vocabulary of 16
  batch.labels = {1, 2, 3, 4, 5, 6, 7, 8};
  executor.setInputs(batch);
  try {
    executor.runStep();
    FAIL() << "an out-of-range id ran";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("kernel 0 'k0' (Embedding): "), std::string::npos)
        << e.what();
  }
}

//===----------------------------------------------------------------------===//
// Training plans.
//===----------------------------------------------------------------------===//

bool allZero(const Executor &e, uint32_t tensor) {
  const auto *p = static_cast<const uint8_t *>(e.view(tensor).data);
  return std::all_of(p, p + e.plan().tensors[tensor].bytes, [](uint8_t b) { return b == 0; });
}

int64_t stepCounter(const Executor &e, uint32_t tensor) {
  int64_t step;
  std::memcpy(&step, e.view(tensor).data, sizeof step);
  return step;
}

TEST(ExecutorTrainingTest, InitializersZeroAndCopy) {
  test::TrainingTensors t;
  test::PlanSpec spec = test::trainingPlanSpec({2, 4, 16, 8, true}, &t);
  LoadedPlan plan = loadSpec(spec);
  Executor e(plan);
  // Garbage where zeros belong: the initializers must clear it.
  static_cast<float *>(e.view(t.gradHead).data)[3] = 5.0f;
  int64_t seven = 7;
  std::memcpy(e.view(t.step).data, &seven, sizeof seven);
  e.initWeights(2);
  EXPECT_TRUE(allZero(e, t.gradHead));
  EXPECT_TRUE(allZero(e, t.gradTable));
  EXPECT_EQ(stepCounter(e, t.step), 0);
  // The fp32 master weights are the bf16 parameters, widened exactly.
  for (auto [param, master] :
       {std::pair{t.table, std::string("optimizer.master.model.embed_tokens.weight")},
        std::pair{t.head, std::string("optimizer.master.lm_head.weight")}}) {
    uint32_t m = 0;
    for (uint32_t i = 0; i < plan.tensors.size(); ++i)
      if (plan.tensors[i].name == master)
        m = i;
    ASSERT_EQ(plan.tensors[m].dtype, DType::F32);
    ASSERT_EQ(plan.tensors[param].dtype, DType::BF16);
    std::vector<float> p = test::floatsOf(e, param), w = test::floatsOf(e, m);
    EXPECT_EQ(p, w) << master;
    EXPECT_NE(p[0], 0.0f);
  }
}

/// The resident set of this process, in bytes (Linux: /proc/self/statm).
int64_t residentBytes() {
  long pages = 0, resident = 0;
  FILE *f = std::fopen("/proc/self/statm", "r");
  if (!f || std::fscanf(f, "%ld %ld", &pages, &resident) != 2)
    resident = -1;
  if (f)
    std::fclose(f);
  return resident < 0 ? -1 : int64_t(resident) * sysconf(_SC_PAGESIZE);
}

TEST(ExecutorTrainingTest, ZeroStateTakesNoHostMemoryUntilWritten) {
  // 512 MiB of zero-initialized optimizer state: the host arena holding it takes memory only
  // where bytes are written, so a GPU plan larger than the host's memory still runs (the
  // arenas live on the device; the host writes the weights and reads a few tensors back).
  test::TrainingTensors t;
  test::PlanSpec spec = test::trainingPlanSpec({2, 4, 16, 8}, &t);
  const int64_t n = int64_t(128) << 20;
  uint32_t big = spec.addInit("big.exp_avg", DType::F32, {n}, TensorRole::OptimizerState, 2,
                              TensorInit::Zeros);
  LoadedPlan plan = loadSpec(spec);
  const int64_t before = residentBytes();
  ASSERT_GT(before, 0) << "no /proc/self/statm";
  Executor e(plan);
  e.initWeights(2);
  TokenLoader loader("", 2, 4, 16, 1);
  EXPECT_TRUE(std::isfinite(e.trainStep(loader, 0, 1).loss));
  EXPECT_LT(residentBytes() - before, int64_t(64) << 20) << "the zero state took host memory";
  // It reads as zeros, and a write takes effect (and memory) where it lands.
  auto *values = static_cast<float *>(e.view(big).data);
  EXPECT_EQ(values[n - 1], 0.0f);
  values[n / 2] = 3.0f;
  EXPECT_EQ(static_cast<const float *>(e.view(big).data)[n / 2], 3.0f);
  // Initializing again clears what is not zero, and only that.
  e.initWeights(2);
  EXPECT_EQ(static_cast<const float *>(e.view(big).data)[n / 2], 0.0f);
  EXPECT_LT(residentBytes() - before, int64_t(64) << 20);
}

TEST(ExecutorTrainingTest, EachPhaseDoesItsPart) {
  test::TrainingTensors t;
  LoadedPlan plan = loadSpec(test::trainingPlanSpec({}, &t));
  Executor e(plan);
  e.initWeights(4);
  std::vector<float> head0 = test::floatsOf(e, t.head);
  TokenLoader loader("", 2, 4, 16, 4);
  e.setInputs(loader.batch(0));
  e.setLossScale(0.5f);

  e.runPhase(Phase::Forward);
  float loss = e.loss();
  EXPECT_NEAR(loss, std::log(16.0f), 0.05);
  EXPECT_TRUE(allZero(e, t.gradHead)) << "the forward phase touched a gradient";

  e.runPhase(Phase::Backward);
  std::vector<float> g = test::floatsOf(e, t.gradHead);
  EXPECT_FALSE(allZero(e, t.gradHead));
  EXPECT_EQ(test::floatsOf(e, t.head), head0) << "the backward phase touched a parameter";
  // The loss scale multiplies the gradient: the same micro-batch at scale 1 gives twice it.
  Executor f(plan);
  f.initWeights(4);
  f.forwardBackward(loader.batch(0), 1.0f);
  std::vector<float> g1 = test::floatsOf(f, t.gradHead);
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(2 * g[i], g1[i], 1e-7f + 1e-6f * std::fabs(g1[i])) << i;

  e.runPhase(Phase::Update);
  EXPECT_NE(test::floatsOf(e, t.head), head0);
  EXPECT_TRUE(allZero(e, t.gradHead)) << "the update phase did not clear the accumulator";
  EXPECT_EQ(stepCounter(e, t.step), 1);
  ASSERT_TRUE(e.metric("lr").has_value());
  EXPECT_FLOAT_EQ(*e.metric("lr"), 5e-3f); // warmup: 1e-2 * 1 / 2
  EXPECT_GT(*e.metric("grad_norm"), 0.0f);
  EXPECT_EQ(e.metric("nothing"), std::nullopt);
}

TEST(ExecutorTrainingTest, LearningRateOverride) {
  test::TrainingTensors t;
  LoadedPlan plan = loadSpec(test::trainingPlanSpec({}, &t));
  Executor e(plan);
  e.initWeights(4);
  e.overrideLearningRate(0.5);
  TokenLoader loader("", 2, 4, 16, 4);
  StepResult r = e.trainStep(loader, 0, 1);
  EXPECT_FLOAT_EQ(*r.lr, 0.25f); // warmup step 1 of 2
  EXPECT_THROW(e.overrideLearningRate(-1.0), Error);
  LoadedPlan forward = loadSpec(test::smallPlanSpec());
  Executor f(forward);
  try {
    f.overrideLearningRate(0.1);
    FAIL() << "a forward-only plan took a learning rate";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("has no LearningRate kernel"), std::string::npos);
  }
}

TEST(ExecutorTrainingTest, RunStepIsOneMicroBatchStep) {
  test::TrainingTensors t;
  LoadedPlan plan = loadSpec(test::trainingPlanSpec({}, &t));
  Executor a(plan), b(plan);
  a.initWeights(8);
  b.initWeights(8);
  TokenLoader loader("", 2, 4, 16, 8);
  a.setInputs(loader.batch(0));
  float loss = a.runStep();
  StepResult r = b.trainStep(loader, 0, 1);
  EXPECT_EQ(loss, r.loss);
  EXPECT_EQ(test::floatsOf(a, t.head), test::floatsOf(b, t.head));
  EXPECT_EQ(stepCounter(a, t.step), 1);
}

TEST(ExecutorTrainingTest, MicroBatchCountsAreChecked) {
  test::TrainingTensors t;
  test::PlanSpec spec = test::trainingPlanSpec({}, &t);
  for (test::KernelSpec &k : spec.kernels)
    if (k.kind == KernelKind::GradNorm)
      k.inputs[1] = t.stepGradHead;
  LoadedPlan plan = loadSpec(spec);
  Executor e(plan);
  e.initWeights(1);
  TokenLoader loader("", 2, 4, 16, 1);
  EXPECT_NO_THROW(e.trainStep(loader, 0, 1));
  try {
    e.trainStep(loader, 1, 2);
    FAIL() << "two micro-batches ran on a plan that cannot accumulate";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("cannot run 2 micro-batches per step"),
              std::string::npos)
        << error.what();
  }
}

TEST(ExecutorTrainingTest, EveryTrainingKindRuns) {
  test::PlanSpec spec = test::everyTrainingKindPlanSpec();
  LoadedPlan plan = loadSpec(spec);
  Executor e(plan);
  e.initWeights(3);
  uint32_t embed = 0, head = 0;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    if (plan.tensors[i].name == "wte.weight" && plan.tensors[i].role == TensorRole::Parameter)
      embed = i;
    if (plan.tensors[i].name == "lm_head.weight" && plan.tensors[i].role == TensorRole::Parameter)
      head = i;
  }
  std::vector<float> embed0 = test::floatsOf(e, embed), head0 = test::floatsOf(e, head);
  TokenLoader loader("", 2, 4, 16, 3);
  for (uint64_t s = 0; s < 3; ++s) {
    StepResult r = e.trainStep(loader, s, 1);
    EXPECT_TRUE(std::isfinite(r.loss));
    ASSERT_TRUE(r.gradNorm && r.lr);
    EXPECT_TRUE(std::isfinite(*r.gradNorm));
  }
  EXPECT_NE(test::floatsOf(e, embed), embed0) << "SGD did not update";
  EXPECT_NE(test::floatsOf(e, head), head0) << "AdamW did not update";
}

TEST(ExecutorTrainingTest, BackwardKernelErrorsNameTheKernel) {
  test::TrainingTensors t;
  LoadedPlan plan = loadSpec(test::trainingPlanSpec({}, &t));
  Executor e(plan);
  e.initWeights(1);
  TokenLoader loader("", 2, 4, 16, 1);
  e.forwardBackward(loader.batch(0), 1.0f);
  // Labels the forward pass never sees (it already ran): the backward pass rejects them.
  static_cast<int32_t *>(e.view(t.labels).data)[2] = 99;
  try {
    e.runPhase(Phase::Backward);
    FAIL() << "an out-of-range label ran";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("kernel 3 'k3' (CrossEntropyGrad): "),
              std::string::npos)
        << error.what();
  }
}

} // namespace
} // namespace bonsai::rt
