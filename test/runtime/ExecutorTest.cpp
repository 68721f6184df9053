//===- ExecutorTest.cpp - Running plans end to end on the CPU backend -----===//
//
// The small plan's loss equals the one computed by calling the cpu:: kernels directly on
// separately allocated buffers; views alias their storage; memory is measured; weights saved to
// safetensors bind back to the same loss; a plan that uses every kernel kind runs; and a
// kernel's error says which kernel failed.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Executor.h"

#include "TestPlans.h"
#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

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

} // namespace
} // namespace bonsai::rt
