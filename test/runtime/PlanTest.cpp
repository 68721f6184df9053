//===- PlanTest.cpp - Plan loading: verification layers and fuzzing -------===//
//
// A valid plan loads into the plain structs; every truncation and hundreds of random byte flips
// are rejected with rt::Error or load into something the executor can run without touching
// memory outside its arenas (checked by running it, under ASan in scripts/test-asan.sh); and one
// planted mistake at a time gets a message that names it. The version 2 rules (roles,
// initializers, phases, the new kinds' operands and attributes, micro-batches, vocab_size) each
// get a planted mistake of their own, and valid training plans load.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Plan.h"

#include "TestPlans.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Fp8.h"
#include "bonsai/runtime/PlanPrinter.h"
#include "bonsai/runtime/Random.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace bonsai::rt {
namespace {

using test::buildPlan;
using test::PlanSpec;
namespace fb = bonsai::plan;

LoadedPlan load(const std::vector<uint8_t> &bytes) {
  return loadPlanBuffer(bytes.data(), bytes.size(), "test.plan");
}

/// The message of the rt::Error that loading `bytes` throws ("" if it loads).
std::string loadError(const std::vector<uint8_t> &bytes) {
  try {
    load(bytes);
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

std::string loadError(const PlanSpec &spec) { return loadError(buildPlan(spec)); }

TEST(PlanTest, LoadsTheSmallPlan) {
  LoadedPlan plan = load(buildPlan(test::smallPlanSpec()));
  EXPECT_EQ(plan.version, kPlanVersion);
  EXPECT_EQ(plan.model, "small");
  EXPECT_EQ(plan.targetArch, "cpu");
  ASSERT_EQ(plan.arenas.size(), 2u);
  EXPECT_EQ(plan.arenas[0].name, "weights");
  EXPECT_EQ(plan.arenas[0].lifetime, Lifetime::Persistent);
  ASSERT_EQ(plan.tensors.size(), 11u);
  EXPECT_EQ(plan.tensors[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(plan.tensors[0].shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(plan.tensors[0].numel, 128);
  EXPECT_EQ(plan.tensors[0].bytes, 512u);
  EXPECT_TRUE(plan.tensors[0].trainable);
  ASSERT_EQ(plan.kernels.size(), 4u);
  EXPECT_EQ(plan.kernels[1].kind, KernelKind::RMSNorm);
  EXPECT_DOUBLE_EQ(plan.kernels[1].attrsAs<NormAttrs>().epsilon, 1e-5);
  EXPECT_EQ(plan.kernels[3].attrsAs<CrossEntropyAttrs>().ignoreIndex, -100);
  EXPECT_EQ(plan.inputs, (std::vector<uint32_t>{3, 4}));
  EXPECT_EQ(plan.loss, 8u);
  EXPECT_EQ(plan.vocabularySize(), 16);
  EXPECT_EQ(plan.tokensPerStep, 8u);
  EXPECT_EQ(plan.describeKernel(2), "kernel 2 'k2' (Linear)");
}

TEST(PlanTest, AcceptsEveryKernelKind) {
  LoadedPlan plan = load(buildPlan(test::everyKindPlanSpec()));
  std::vector<bool> seen(size_t(KernelKind::Copy) + 1, false);
  for (const KernelInfo &k : plan.kernels)
    seen[size_t(k.kind)] = true;
  for (size_t i = 0; i < seen.size(); ++i)
    EXPECT_TRUE(seen[i]) << kernelKindName(KernelKind(i)) << " is not covered";
  EXPECT_EQ(plan.kernels[23].attrsAs<TransposeAttrs>().permutation,
            (std::vector<int64_t>{0, 2, 1}));
  EXPECT_TRUE(plan.kernels[9].attrsAs<AttentionAttrs>().causal);
  EXPECT_DOUBLE_EQ(plan.kernels[9].attrsAs<AttentionAttrs>().scale, 0.5);
  EXPECT_TRUE(plan.kernels[17].attrsAs<GeLUAttrs>().tanh);
  EXPECT_EQ(plan.kernels[6].attrsAs<SliceAttrs>().start, 12);
}

// The target's link rate and the compiler's prediction (docs/plan-format.md): loaded as
// written; a rate or time that is not one is an error naming it.
TEST(PlanTest, TargetRatesAndPrediction) {
  PlanSpec spec = test::smallPlanSpec();
  spec.linkGBs = 64;
  spec.predictedStepSeconds = 1.5;
  spec.predictedExposedSeconds = 0.25;
  LoadedPlan plan = load(buildPlan(spec));
  EXPECT_DOUBLE_EQ(plan.targetLinkBytesPerSecond, 64e9);
  EXPECT_DOUBLE_EQ(plan.predictedStepSeconds, 1.5);
  EXPECT_DOUBLE_EQ(plan.predictedExposedSeconds, 0.25);
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    PlanSpec link = spec;
    link.linkGBs = bad;
    EXPECT_THROW(
        {
          try {
            load(buildPlan(link));
          } catch (const Error &e) {
            EXPECT_NE(std::string(e.what()).find("the target's link rate"), std::string::npos)
                << e.what();
            throw;
          }
        },
        Error);
    PlanSpec step = spec;
    step.predictedStepSeconds = bad;
    EXPECT_THROW(load(buildPlan(step)), Error) << bad;
  }
  PlanSpec exposed = spec;
  exposed.predictedExposedSeconds = 2; // more than the step
  EXPECT_THROW(load(buildPlan(exposed)), Error);
}

TEST(PlanTest, FileErrorsNameThePath) {
  std::string missing = test::tempPath("does-not-exist.plan");
  try {
    loadPlanFile(missing);
    FAIL() << "a missing file loaded";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  std::string empty = test::tempPath("empty.plan");
  test::writeFile(empty, {});
  try {
    loadPlanFile(empty);
    FAIL() << "an empty file loaded";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("'" + empty + "' is empty"), std::string::npos) << e.what();
  }
  std::remove(empty.c_str());

  std::string good = test::tempPath("good.plan");
  test::writeFile(good, buildPlan(test::smallPlanSpec()));
  EXPECT_EQ(loadPlanFile(good).path, good);
  std::remove(good.c_str());
}

TEST(PlanTest, WrongIdentifierIsNotAPlan) {
  std::string message = loadError(buildPlan(test::smallPlanSpec(), "XXXX"));
  EXPECT_NE(message.find("not a Bonsai plan"), std::string::npos) << message;
  EXPECT_NE(message.find("identifier"), std::string::npos) << message;
  // A safetensors file or any text is not a plan either.
  std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'};
  EXPECT_NE(loadError(text).find("not a Bonsai plan"), std::string::npos);
}

TEST(PlanTest, WrongVersionSaysRecompile) {
  PlanSpec spec = test::smallPlanSpec();
  spec.version = kPlanVersion + 1;
  std::string message = loadError(spec);
  EXPECT_NE(message.find("plan version " + std::to_string(kPlanVersion + 1) + " is not supported"),
            std::string::npos)
      << message;
  // Version 1 plans (forward only, no vocab_size) are rejected the same way.
  spec.version = 1;
  EXPECT_NE(loadError(spec).find("plan version 1 is not supported"), std::string::npos);
  EXPECT_NE(message.find("recompile"), std::string::npos) << message;
}

TEST(PlanTest, EveryTruncationIsRejected) {
  std::vector<uint8_t> bytes = buildPlan(test::smallPlanSpec());
  ASSERT_NO_THROW(load(bytes));
  for (size_t size = 0; size < bytes.size(); ++size) {
    // A fresh allocation of exactly `size` bytes, so ASan sees any read past the end.
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + std::ptrdiff_t(size));
    EXPECT_THROW(load(prefix), Error) << "prefix of " << size << " bytes loaded";
  }
}

/// Runs a plan that loaded after corruption: it must run or throw rt::Error, never touch memory
/// outside its arenas. Plans whose arenas are large are only loaded (allocating them is not the
/// point of the test).
void runIfSmall(const LoadedPlan &plan) {
  uint64_t total = 0;
  for (const ArenaInfo &a : plan.arenas)
    total += a.size;
  if (total > (uint64_t(1) << 20))
    return;
  try {
    Executor executor(plan);
    executor.initWeights(1);
    std::vector<int64_t> shape = executor.inputShape();
    TokenBatch batch;
    batch.batch = shape[0];
    batch.seq = shape[1];
    batch.inputs.assign(size_t(shape[0] * shape[1]), 1);
    batch.labels.assign(size_t(shape[0] * shape[1]), 2);
    executor.setInputs(batch);
    executor.runStep();
  } catch (const Error &) {
  }
}

void flipBytes(const std::vector<uint8_t> &bytes, uint64_t seed, int trials) {
  Rng rng(seed);
  int loaded = 0, rejected = 0;
  for (int trial = 0; trial < trials; ++trial) {
    std::vector<uint8_t> corrupt = bytes;
    int flips = 1 + int(rng.below(3));
    for (int f = 0; f < flips; ++f)
      corrupt[rng.below(corrupt.size())] ^= uint8_t(1 + rng.below(255));
    try {
      LoadedPlan plan = load(corrupt);
      ++loaded;
      runIfSmall(plan);
    } catch (const Error &e) {
      ++rejected;
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(loaded + rejected, trials);
  ::testing::Test::RecordProperty("loaded", loaded);
  ::testing::Test::RecordProperty("rejected", rejected);
}

TEST(PlanTest, RandomByteFlipsOfATrainingPlanLoadOrThrow) {
  flipBytes(buildPlan(test::everyTrainingKindPlanSpec()), 20261130, 1500);
}

TEST(PlanTest, RandomByteFlipsLoadOrThrow) {
  std::vector<uint8_t> bytes = buildPlan(test::everyKindPlanSpec());
  Rng rng(20261129);
  int loaded = 0, rejected = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> corrupt = bytes;
    int flips = 1 + int(rng.below(3));
    for (int f = 0; f < flips; ++f)
      corrupt[rng.below(corrupt.size())] ^= uint8_t(1 + rng.below(255));
    try {
      LoadedPlan plan = load(corrupt);
      ++loaded;
      runIfSmall(plan);
    } catch (const Error &e) {
      ++rejected;
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  // Most flips land in data the verifier or the semantic checks see.
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(loaded + rejected, 2000);
  RecordProperty("loaded", loaded);
  RecordProperty("rejected", rejected);
}

//===----------------------------------------------------------------------===//
// Planted semantic errors: each message names the tensor or kernel and the problem.
//===----------------------------------------------------------------------===//

void expectError(const PlanSpec &spec, std::initializer_list<std::string> parts) {
  std::string message = loadError(spec);
  ASSERT_FALSE(message.empty()) << "the plan loaded";
  for (const std::string &part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(PlanSemanticsTest, OffsetBeyondArena) {
  PlanSpec spec = test::smallPlanSpec();
  spec.tensors[2].offset = spec.arenas[0].size - 256;
  expectError(spec, {"tensor 2 'lm_head.weight'", "outside arena 0 'weights'"});
}

TEST(PlanSemanticsTest, OffsetOverflowIsCaught) {
  PlanSpec spec = test::smallPlanSpec();
  spec.tensors[2].offset = ~uint64_t(0) - 16;
  expectError(spec, {"tensor 2", "outside arena 0"});
}

TEST(PlanSemanticsTest, BadKernelArity) {
  PlanSpec spec = test::smallPlanSpec();
  spec.kernels[2].inputs.push_back(0);
  spec.kernels[2].inputs.push_back(0);
  expectError(spec, {"kernel 2 'k2' (Linear)", "expected 2 or 3 inputs (x, w, bias), got 4"});
  spec = test::smallPlanSpec();
  spec.kernels[0].outputs.clear();
  expectError(spec, {"kernel 0 'k0' (Embedding)", "expected 1 output, got 0"});
}

TEST(PlanSemanticsTest, TensorIndexOutOfRange) {
  PlanSpec spec = test::smallPlanSpec();
  spec.kernels[1].inputs[1] = 99;
  expectError(spec, {"kernel 1 'k1' (RMSNorm)", "input 1 (weight) is tensor 99",
                     "the plan has 11 tensors"});
  spec = test::smallPlanSpec();
  spec.loss = 42;
  expectError(spec, {"the loss is tensor 42"});
  spec = test::smallPlanSpec();
  spec.inputs[1] = 12;
  expectError(spec, {"plan input 1 (labels) is tensor 12"});
}

TEST(PlanSemanticsTest, ArenaIndexOutOfRange) {
  PlanSpec spec = test::smallPlanSpec();
  spec.tensors[5].arena = 7;
  expectError(spec, {"tensor 5 'h'", "arena 7", "2 arenas"});
}

TEST(PlanSemanticsTest, BytesMustMatchShapeAndDType) {
  PlanSpec spec = test::smallPlanSpec();
  spec.tensors[1].bytes = 16;
  expectError(spec, {"tensor 1 'model.norm.weight' bytes: expected 32 ([8] f32), got 16"});
}

TEST(PlanSemanticsTest, NonPositiveAndHugeDimensions) {
  PlanSpec spec = test::smallPlanSpec();
  spec.tensors[5].shape = {2, 0, 8};
  expectError(spec, {"tensor 5 'h'", "non-positive dimension"});
  spec = test::smallPlanSpec();
  spec.tensors[5].shape = {int64_t(1) << 40, int64_t(1) << 40};
  expectError(spec, {"tensor 5 'h'", "more elements than any arena holds"});
}

TEST(PlanSemanticsTest, MisalignedOffset) {
  PlanSpec spec = test::smallPlanSpec();
  spec.tensors[5].offset += 2;
  expectError(spec, {"tensor 5 'h' offset", "not a multiple of its f32 element size"});
}

TEST(PlanSemanticsTest, NoArenasOrKernels) {
  PlanSpec spec = test::smallPlanSpec();
  spec.arenas.clear();
  expectError(spec, {"no arenas"});
  spec = test::smallPlanSpec();
  spec.kernels.clear();
  expectError(spec, {"no kernels"});
}

TEST(PlanSemanticsTest, BadArenaAlignment) {
  PlanSpec spec = test::smallPlanSpec();
  spec.arenas[1].alignment = 48;
  expectError(spec, {"arena 1 'step' alignment 48"});
}

TEST(PlanSemanticsTest, AttributesMustMatchTheKind) {
  PlanSpec spec = test::smallPlanSpec();
  spec.kernels[1].attrsType = fb::KernelAttrs::NONE;
  spec.kernels[1].attrs = nullptr;
  expectError(spec, {"kernel 1 'k1' (RMSNorm) attributes: expected NormAttrs, got none"});
  spec = test::smallPlanSpec();
  spec.kernels[1].attrsType = fb::KernelAttrs::AttentionAttrs;
  spec.kernels[1].attrs = test::attentionAttrs(true, 1.0);
  expectError(spec, {"expected NormAttrs, got AttentionAttrs"});
  spec = test::smallPlanSpec();
  spec.kernels[2].attrsType = fb::KernelAttrs::AxisAttrs;
  spec.kernels[2].attrs = test::axisAttrs(0);
  expectError(spec, {"kernel 2 'k2' (Linear) attributes: expected none, got AxisAttrs"});
  spec = test::smallPlanSpec();
  spec.kernels[1].attrs = test::normAttrs(0.0);
  expectError(spec, {"epsilon must be positive"});
}

TEST(PlanSemanticsTest, TransposePermutationMustMatchRank) {
  PlanSpec spec = test::everyKindPlanSpec();
  spec.kernels[23].attrs = test::transposeAttrs({0, 1});
  expectError(spec, {"kernel 23 'k23' (Transpose)", "permutation has 2 entries", "rank 3"});
  spec = test::everyKindPlanSpec();
  spec.kernels[23].attrs = test::transposeAttrs({0, 2, 2});
  expectError(spec, {"[0, 2, 2] is not a permutation"});
}

TEST(PlanSemanticsTest, ShapeChecksPerKind) {
  PlanSpec spec = test::smallPlanSpec();
  spec.tensors[2].shape = {8, 16}; // lm_head in [in, out] layout
  expectError(spec, {"kernel 2 'k2' (Linear)", "w (tensor 2 'lm_head.weight') shape: expected [out, 8]"});

  spec = test::smallPlanSpec();
  spec.tensors[5].shape = {2, 4, 4}; // embedding output too narrow
  spec.tensors[5].bytes = -1;
  expectError(spec, {"kernel 0 'k0' (Embedding)", "result (tensor 5 'h') shape: expected [2, 4, 8]"});

  spec = test::smallPlanSpec();
  spec.tensors[8].shape = {1};
  expectError(spec, {"kernel 3 'k3' (CrossEntropy)", "loss (tensor 8 'loss') shape: expected []"});

  spec = test::smallPlanSpec();
  spec.tensors[3].dtype = DType::F32;
  expectError(spec, {"kernel 0 'k0' (Embedding)", "ids (tensor 3 'ids') dtype: expected i32 or i64"});

  spec = test::everyKindPlanSpec();
  spec.kernels[4].attrs = test::sliceAttrs(2, 10); // [10, 18) of 16 columns
  expectError(spec, {"kernel 4 'k4' (Slice)", "outside dimension 2 of size 16"});

  spec = test::everyKindPlanSpec();
  spec.kernels[25].attrs = test::axisAttrs(3);
  expectError(spec, {"kernel 25 'k25' (Softmax)", "axis 3 is out of range"});

  spec = test::everyKindPlanSpec();
  spec.kernels[1].inputs[1] = 0; // wte [16, 8] does not broadcast into [2, 4, 8]
  expectError(spec, {"kernel 1 'k1' (Add)", "does not broadcast"});
}

TEST(PlanSemanticsTest, OutputMayNotOverlapInputs) {
  PlanSpec spec = test::smallPlanSpec();
  spec.tensors[7].offset = spec.tensors[6].offset; // logits over the linear's own input
  expectError(spec, {"kernel 2 'k2' (Linear)", "overlaps x", "cannot run in place"});
}

TEST(PlanSemanticsTest, ElementwiseKernelsMayRunInPlace) {
  PlanSpec spec = test::everyKindPlanSpec();
  // x3 = x1 + ao written over ao: an exact alias, allowed for Add.
  uint32_t ao = spec.kernels[11].inputs[1];
  uint32_t x3 = spec.kernels[11].outputs[0];
  spec.tensors[x3].offset = spec.tensors[ao].offset;
  EXPECT_EQ(loadError(spec), "");
}

TEST(PlanSemanticsTest, InputsAndLossContract) {
  PlanSpec spec = test::smallPlanSpec();
  spec.inputs = {3};
  expectError(spec, {"expected 2 to 4 tensors (ids, labels, then optionally positions and "
                     "segment_ids), got 1"});
  spec = test::smallPlanSpec();
  spec.tensors[4].role = TensorRole::Activation;
  expectError(spec, {"plan input 1 (labels)", "has role activation, expected input"});
  spec = test::smallPlanSpec();
  spec.loss = 7;
  expectError(spec, {"the loss, tensor 7 'logits', must be an f32 scalar"});
  spec = test::smallPlanSpec();
  spec.kernels.pop_back();
  expectError(spec,
              {"the loss, tensor 8 'loss', is not written by any kernel of the forward phase"});
}

TEST(PlanSemanticsTest, ParameterNamesAreUnique) {
  PlanSpec spec = test::smallPlanSpec();
  spec.tensors[2].name = spec.tensors[0].name;
  expectError(spec, {"tensors 0 and 2 are both parameter 'model.embed_tokens.weight'"});
}

TEST(PlanSemanticsTest, UnknownEnumValues) {
  PlanSpec spec = test::smallPlanSpec();
  spec.kernels[2].kind = KernelKind(77);
  expectError(spec, {"kernel 2 'k2' has an unknown kind 77"});
  // A value in a gap between the families' ranges is as unknown as one past the end.
  spec = test::smallPlanSpec();
  spec.kernels[2].kind = KernelKind(60);
  expectError(spec, {"kernel 2 'k2' has an unknown kind 60"});
  spec = test::smallPlanSpec();
  spec.tensors[5].dtype = DType(42);
  spec.tensors[5].bytes = 256;
  expectError(spec, {"tensor 5 'h' has an unknown dtype 42"});
}

//===----------------------------------------------------------------------===//
// Plan version 2: training plans.
//===----------------------------------------------------------------------===//

/// The index of the first kernel of `kind` in `spec`.
size_t kernelOf(const PlanSpec &spec, KernelKind kind) {
  for (size_t i = 0; i < spec.kernels.size(); ++i)
    if (spec.kernels[i].kind == kind)
      return i;
  ADD_FAILURE() << "no " << kernelKindName(kind) << " kernel";
  return 0;
}

/// The index of the tensor named `name` with role `role` in `spec`.
uint32_t tensorOf(const PlanSpec &spec, const std::string &name, TensorRole role) {
  for (uint32_t i = 0; i < spec.tensors.size(); ++i)
    if (spec.tensors[i].name == name && spec.tensors[i].role == role)
      return i;
  ADD_FAILURE() << "no tensor " << name;
  return 0;
}

TEST(PlanTrainingTest, LoadsTheTrainingPlan) {
  test::TrainingTensors t;
  LoadedPlan plan = load(buildPlan(test::trainingPlanSpec({}, &t)));
  EXPECT_TRUE(plan.trains());
  EXPECT_TRUE(plan.hasBackward());
  EXPECT_EQ(plan.vocabularySize(), 16);
  EXPECT_EQ(plan.microBatches, 1u);
  EXPECT_EQ(plan.lossScale, t.lossScale);
  EXPECT_EQ(plan.metric("grad_norm"), t.gradNorm);
  EXPECT_EQ(plan.metric("lr"), t.lr);
  EXPECT_EQ(plan.metric("nothing"), std::nullopt);
  EXPECT_EQ(plan.tensors[t.gradTable].init, TensorInit::Zeros);
  EXPECT_EQ(plan.tensors[t.step].role, TensorRole::OptimizerState);
  EXPECT_EQ(plan.kernels[0].phase, Phase::Forward);
  EXPECT_EQ(plan.kernels[3].phase, Phase::Backward);
  EXPECT_EQ(plan.kernels.back().phase, Phase::Update);
  const KernelInfo &adam =
      plan.kernels[kernelOf(test::trainingPlanSpec(), KernelKind::AdamWUpdate)];
  EXPECT_DOUBLE_EQ(adam.attrsAs<AdamWAttrs>().beta2, 0.95);
  EXPECT_DOUBLE_EQ(adam.attrsAs<AdamWAttrs>().weightDecay, 0.01);
  EXPECT_DOUBLE_EQ(adam.attrsAs<AdamWAttrs>().gradClip, 1.0);
  const KernelInfo &lr = plan.kernels[kernelOf(test::trainingPlanSpec(), KernelKind::LearningRate)];
  EXPECT_TRUE(lr.attrsAs<LearningRateAttrs>().cosine);
  EXPECT_EQ(lr.attrsAs<LearningRateAttrs>().warmupSteps, 2);
  EXPECT_EQ(lr.attrsAs<LearningRateAttrs>().totalSteps, 40);
  EXPECT_DOUBLE_EQ(lr.attrsAs<LearningRateAttrs>().minLrRatio, 0.1);
  EXPECT_EQ(plan.microBatchProblem(4), "");
  EXPECT_EQ(loadError(test::trainingPlanSpec({2, 4, 16, 8, true, 3})), "");
}

TEST(PlanTrainingTest, AcceptsEveryTrainingKernelKind) {
  PlanSpec spec = test::everyTrainingKindPlanSpec();
  LoadedPlan plan = load(buildPlan(spec));
  std::vector<bool> seen(size_t(KernelKind::Zero) + 1, false);
  for (const KernelInfo &k : plan.kernels)
    seen[size_t(k.kind)] = true;
  for (size_t i = 0; i < seen.size(); ++i)
    EXPECT_TRUE(seen[i]) << kernelKindName(KernelKind(i)) << " is not covered";
  const KernelInfo &sgd = plan.kernels[kernelOf(spec, KernelKind::SGDUpdate)];
  EXPECT_DOUBLE_EQ(sgd.attrsAs<SGDAttrs>().momentum, 0.9);
  EXPECT_EQ(sgd.outputs.size(), 3u);
  EXPECT_DOUBLE_EQ(plan.kernels[kernelOf(spec, KernelKind::Fill)].attrsAs<FillAttrs>().value, 0.01);
  EXPECT_EQ(
      plan.tensors[tensorOf(spec, "optimizer.master.wte.weight", TensorRole::OptimizerState)].init,
      TensorInit::CopyOf);
}

TEST(PlanTrainingTest, LossScaleIsOneF32Scalar) {
  PlanSpec spec = test::trainingPlanSpec();
  spec.tensors[4].shape = {1};
  expectError(spec, {"tensor 4 'loss_scale' has role loss scale but is [1] f32",
                     "not a scalar [] of dtype f32"});
  spec = test::trainingPlanSpec();
  spec.add("loss_scale.2", DType::F32, {}, TensorRole::LossScale, 1);
  expectError(spec, {"both have role loss scale (a plan has at most one)"});
}

TEST(PlanTrainingTest, MetricsAreNamedF32Scalars) {
  test::TrainingTensors t;
  PlanSpec spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.lr].dtype = DType::F16;
  spec.tensors[t.lr].bytes = -1;
  expectError(spec, {"'lr' has role metric but is [] f16, not a scalar [] of dtype f32"});
  spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.lr].name = "grad_norm";
  expectError(spec, {"are both metric 'grad_norm'"});
  spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.lr].name = "";
  expectError(spec, {"is a metric without a name (metrics are reported by name)"});
}

TEST(PlanTrainingTest, OptimizerStateNamesAreUnique) {
  test::TrainingTensors t;
  PlanSpec spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.step + 1].name = "optimizer.step";
  expectError(spec, {"are both optimizer state 'optimizer.step'"});
}

TEST(PlanTrainingTest, InitializerRules) {
  test::TrainingTensors t;
  PlanSpec spec = test::trainingPlanSpec({}, &t);
  // A parameter's initializer is an adapter's (Zeros, KaimingUniform, RowNorm; docs/lora.md),
  // never a copy.
  spec.tensors[t.table].init = TensorInit::CopyOf;
  expectError(spec, {"tensor 0 'model.embed_tokens.weight' has role parameter and init CopyOf",
                     "the runtime binds or writes it"});
  spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.stepGradHead].init = TensorInit::Zeros;
  expectError(spec, {"'lm_head.weight' has init Zeros but is in step arena 1 'step'"});
  spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.gradTable].init = TensorInit(7);
  expectError(spec, {"has an unknown init 7"});

  spec = test::trainingPlanSpec({2, 4, 16, 8, true}, &t);
  uint32_t master = tensorOf(spec, "optimizer.master.lm_head.weight", TensorRole::OptimizerState);
  spec.tensors[master].initSource = 999;
  expectError(spec,
              {"'optimizer.master.lm_head.weight' is a copy of tensor 999, but the plan has"});
  spec = test::trainingPlanSpec({2, 4, 16, 8, true}, &t);
  spec.tensors[master].initSource = t.step;
  expectError(spec,
              {"shape [16, 8] differs from that of its source tensor", "'optimizer.step' []"});
  spec = test::trainingPlanSpec({2, 4, 16, 8, true}, &t);
  spec.tensors[master].initSource = master - 1;
  expectError(spec, {"which is itself a copy"});
  spec = test::trainingPlanSpec({2, 4, 16, 8, true}, &t);
  spec.tensors[master].initSource = master;
  expectError(spec, {"which shares its storage"});
  spec = test::trainingPlanSpec({2, 4, 16, 8, true}, &t);
  spec.tensors[t.table].dtype = DType::I32; // an integer source does not convert to f32
  spec.tensors[t.table].bytes = -1;
  expectError(spec, {"'optimizer.master.model.embed_tokens.weight' (f32) cannot be a converted "
                     "copy of tensor 0 'model.embed_tokens.weight' (i32)"});
}

TEST(PlanTrainingTest, PhasesAreOrderedAndOptimizerKernelsUpdate) {
  PlanSpec spec = test::trainingPlanSpec();
  spec.kernels[4].phase = Phase::Forward; // a forward kernel among the backward ones
  expectError(spec, {"kernel 4 'k4' (LinearGradWeight) runs in the forward phase but comes after "
                     "kernel 3 'k3' (CrossEntropyGrad) of the backward phase",
                     "ordered forward, backward, update"});
  // The norm, learning rate and updates may run in the backward pass (update_in_backward);
  // such a plan runs one micro-batch per step. The step counter always moves in the update
  // phase.
  spec = test::trainingPlanSpec();
  size_t adam = kernelOf(spec, KernelKind::AdamWUpdate);
  for (size_t i = kernelOf(spec, KernelKind::GradNorm); i <= adam; ++i)
    spec.kernels[i].phase = Phase::Backward;
  LoadedPlan inBackward = load(buildPlan(spec));
  ASSERT_TRUE(inBackward.updateInBackward().has_value());
  EXPECT_EQ(*inBackward.updateInBackward(), adam);
  EXPECT_NE(inBackward.microBatchProblem(2).find(
                "(AdamWUpdate) updates its parameter in the backward pass"),
            std::string::npos);
  EXPECT_EQ(inBackward.microBatchProblem(1), "");
  for (size_t i = adam + 1; i < spec.kernels.size(); ++i)
    spec.kernels[i].phase = Phase::Backward;
  expectError(spec, {"(StepIncrement): runs in the backward phase, but optimizer kernels run "
                     "once per step, in the update phase"});
  spec = test::trainingPlanSpec();
  spec.kernels[0].phase = Phase(9);
  expectError(spec, {"kernel 0 'k0' (Embedding) has an unknown phase 9"});
  spec = test::trainingPlanSpec();
  spec.kernels[2].phase = Phase::Backward; // the loss computed in the backward phase
  expectError(spec, {"is not written by any kernel of the forward phase"});
}

TEST(PlanTrainingTest, ArityOfTheNewKinds) {
  PlanSpec spec = test::trainingPlanSpec();
  size_t adam = kernelOf(spec, KernelKind::AdamWUpdate);
  spec.kernels[adam].outputs.resize(2);
  expectError(spec, {"(AdamWUpdate): expected 3 or 4 outputs (param, m, v, master), got 2"});
  spec = test::trainingPlanSpec();
  spec.kernels[kernelOf(spec, KernelKind::GradNorm)].inputs.clear();
  expectError(spec, {"(GradNorm): expected 1 or more inputs (g), got 0"});
  spec = test::trainingPlanSpec();
  spec.kernels[kernelOf(spec, KernelKind::CrossEntropyGrad)].inputs.pop_back();
  expectError(spec, {"(CrossEntropyGrad): expected 3 inputs (dloss, logits, labels), got 2"});
  spec = test::trainingPlanSpec();
  spec.kernels[kernelOf(spec, KernelKind::Zero)].inputs = {0};
  expectError(spec, {"(Zero): expected 0 inputs, got 1"});
  spec = test::trainingPlanSpec();
  spec.kernels[kernelOf(spec, KernelKind::GradNorm)].inputs.push_back(4242);
  expectError(spec, {"input 2 (g3) is tensor 4242"});
}

TEST(PlanTrainingTest, AttributesOfTheNewKinds) {
  PlanSpec spec = test::trainingPlanSpec();
  size_t adam = kernelOf(spec, KernelKind::AdamWUpdate);
  spec.kernels[adam].attrsType = fb::KernelAttrs::NONE;
  spec.kernels[adam].attrs = nullptr;
  expectError(spec, {"(AdamWUpdate) attributes: expected AdamWAttrs, got none"});
  spec = test::trainingPlanSpec();
  spec.kernels[adam].attrs = test::adamwAttrs(0.9, 1.0);
  expectError(spec, {"beta2 must be in [0, 1), got 1"});
  spec = test::trainingPlanSpec();
  spec.kernels[adam].attrs = test::adamwAttrs(0.9, 0.999, 0.0);
  expectError(spec, {"eps must be positive and finite, got 0"});
  spec = test::trainingPlanSpec();
  spec.kernels[adam].attrs = test::adamwAttrs(0.9, 0.999, 1e-8, -0.1);
  expectError(spec, {"weight_decay must be finite and non-negative, got -0.1"});
  spec = test::trainingPlanSpec();
  size_t lr = kernelOf(spec, KernelKind::LearningRate);
  spec.kernels[lr].attrs = test::learningRateAttrs(1e-3, true, 10, 10);
  expectError(spec, {"a cosine schedule needs total_steps above warmup_steps, got total_steps 10 "
                     "and warmup_steps 10"});
  spec = test::trainingPlanSpec();
  spec.kernels[lr].attrs = test::learningRateAttrs(-1.0);
  expectError(spec, {"lr must be finite and non-negative, got -1"});
  spec = test::trainingPlanSpec();
  spec.kernels[lr].attrs = test::learningRateAttrs(1e-3, false, 0, 0, 1.5);
  expectError(spec, {"min_lr_ratio must be in [0, 1], got 1.5"});
  spec = test::everyTrainingKindPlanSpec();
  size_t sgd = kernelOf(spec, KernelKind::SGDUpdate);
  spec.kernels[sgd].attrs = test::sgdAttrs(-0.5);
  expectError(spec, {"(SGDUpdate): momentum must be finite and non-negative"});
  spec = test::everyTrainingKindPlanSpec();
  spec.kernels[kernelOf(spec, KernelKind::Fill)].attrs =
      test::fillAttrs(std::numeric_limits<double>::infinity());
  expectError(spec, {"(Fill): value must be finite, got inf"});
  spec = test::everyTrainingKindPlanSpec();
  spec.kernels[kernelOf(spec, KernelKind::SliceGrad)].attrs = test::sliceAttrs(2, 13);
  expectError(spec, {"(SliceGrad): range [13, 13 + 4) is outside dimension 2 of size 16"});
  spec = test::everyTrainingKindPlanSpec();
  spec.kernels[kernelOf(spec, KernelKind::SoftmaxGrad)].attrs = test::axisAttrs(3);
  expectError(spec, {"(SoftmaxGrad): axis 3 is out of range"});
}

TEST(PlanTrainingTest, DTypesAndShapesOfTheNewKinds) {
  test::TrainingTensors t;
  PlanSpec spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.step].dtype = DType::I32;
  spec.tensors[t.step].bytes = -1;
  expectError(spec, {"(LearningRate): step (tensor " + std::to_string(t.step) +
                     " 'optimizer.step') must be a scalar [] of dtype i64, got [] i32"});
  spec = test::trainingPlanSpec({}, &t);
  uint32_t m = tensorOf(spec, "optimizer.exp_avg.lm_head.weight", TensorRole::OptimizerState);
  spec.tensors[m].dtype = DType::BF16;
  spec.tensors[m].bytes = -1;
  expectError(spec, {"(AdamWUpdate): m (tensor " + std::to_string(m) +
                     " 'optimizer.exp_avg.lm_head.weight') dtype: expected f32, got bf16"});
  spec = test::trainingPlanSpec({}, &t);
  spec.kernels[kernelOf(spec, KernelKind::CrossEntropyGrad)].inputs[0] = t.ids;
  expectError(spec, {"dloss (tensor 2 'ids') must be a scalar [] of dtype f32, got [2, 4] i32"});
  spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.stepGradTable].shape = {16, 4};
  spec.tensors[t.stepGradTable].bytes = -1;
  expectError(spec, {"(EmbeddingGrad): dy (tensor", "shape: expected [2, 4, 4], got [2, 4, 8]"});
  spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.stepGradHead].shape = {8, 16};
  spec.tensors[t.stepGradHead].bytes = -1;
  expectError(spec, {"(LinearGradWeight): dw (tensor", "shape: expected [16, 8], got [8, 16]"});
  spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.gradHead].shape = {16, 4};
  spec.tensors[t.gradHead].bytes = -1;
  expectError(spec, {"(Accumulate): acc (tensor", "shape: expected [16, 8], got [16, 4]"});
  spec = test::trainingPlanSpec({}, &t);
  spec.kernels[kernelOf(spec, KernelKind::GradNorm)].outputs = {t.gradTable};
  expectError(spec,
              {"(GradNorm): norm (tensor", "must be a scalar [] of dtype f32, got [16, 8] f32"});
}

TEST(PlanTrainingTest, OffloadedStateIsUpdatedThroughDeviceCopies) {
  test::TrainingTensors t;
  std::vector<uint32_t> copies;
  PlanSpec spec = test::offloadedPlanSpec(t, &copies);
  ASSERT_EQ(loadError(spec), "");
  LoadedPlan plan = load(buildPlan(spec));
  EXPECT_EQ(plan.arenas[3].space, MemorySpace::PinnedHost);

  // The state a copy stands for must still start as it should, and name both tensors.
  uint32_t m = tensorOf(spec, "optimizer.exp_avg.lm_head.weight", TensorRole::OptimizerState);
  spec.tensors[m].init = TensorInit::None;
  expectError(spec, {"(AdamWUpdate): m (tensor " + std::to_string(copies[0]) +
                         " 'copy_h2d.1'), a copy of tensor " + std::to_string(m) +
                         " 'optimizer.exp_avg.lm_head.weight', must have init Zeros (moments "
                         "start at zero)"});
  spec = test::offloadedPlanSpec(t);
  uint32_t master = tensorOf(spec, "optimizer.master.lm_head.weight", TensorRole::OptimizerState);
  spec.tensors[master].initSource = t.table;
  expectError(spec, {"(AdamWUpdate): master (tensor", "a copy of tensor " +
                         std::to_string(master) + " 'optimizer.master.lm_head.weight', is a copy "
                         "of tensor 0 'model.embed_tokens.weight', not of param"});

  // A step-arena tensor that no copy wrote is not state: its update would be lost.
  spec = test::offloadedPlanSpec(t, &copies);
  spec.kernels.erase(std::find_if(spec.kernels.begin(), spec.kernels.end(), [](const auto &k) {
    return k.kind == KernelKind::CopyHostToDevice;
  }));
  expectError(spec, {"(AdamWUpdate): m (tensor " + std::to_string(copies[0]) +
                     " 'copy_h2d.1') is in step arena 1 'step': state updated in place must "
                     "live in a persistent arena"});
}

TEST(PlanTrainingTest, OffloadCopiesCrossTheirSpaces) {
  test::TrainingTensors t;
  // Into the device: from a pinned host arena only.
  PlanSpec spec = test::offloadedPlanSpec(t);
  size_t h2d = kernelOf(spec, KernelKind::CopyHostToDevice);
  spec.kernels[h2d].inputs = {t.gradHead};
  expectError(spec, {"(CopyHostToDevice): x (tensor " + std::to_string(t.gradHead) +
                     " 'lm_head.weight') is in arena 'state', not in a pinned host arena"});
  // ... into a device arena only.
  spec = test::offloadedPlanSpec(t);
  uint32_t v = tensorOf(spec, "optimizer.exp_avg_sq.lm_head.weight", TensorRole::OptimizerState);
  spec.kernels[h2d].outputs = {v};
  expectError(spec, {"(CopyHostToDevice): y (tensor " + std::to_string(v) +
                     " 'optimizer.exp_avg_sq.lm_head.weight') is in arena 'optimizer_host', not "
                     "in a device arena"});
  // Back to the host: into a pinned host arena only.
  spec = test::offloadedPlanSpec(t);
  size_t d2h = kernelOf(spec, KernelKind::CopyDeviceToHost);
  spec.kernels[d2h].outputs = {t.gradHead};
  expectError(spec, {"(CopyDeviceToHost): y (tensor " + std::to_string(t.gradHead) +
                     " 'lm_head.weight') is in arena 'state', not in a pinned host arena"});
  // No other kind reads or writes pinned host memory: the update must work on the copy.
  spec = test::offloadedPlanSpec(t);
  size_t adam = 0;
  for (size_t i = 0; i < spec.kernels.size(); ++i)
    if (spec.kernels[i].kind == KernelKind::AdamWUpdate && spec.kernels[i].outputs[0] == t.head)
      adam = i;
  spec.kernels[adam].outputs[1] = v;
  expectError(spec, {"(AdamWUpdate): m (tensor " + std::to_string(v) +
                     " 'optimizer.exp_avg_sq.lm_head.weight') is in pinned host arena "
                     "'optimizer_host': only the host-offload copies (CopyHostToDevice, "
                     "CopyDeviceToHost) and the kernels on the host stream read or write pinned "
                     "host memory"});
  // Same shape and dtype both ways.
  spec = test::offloadedPlanSpec(t);
  spec.kernels[h2d].inputs = {
      spec.add("small", DType::F32, {4, 8}, TensorRole::OptimizerState, 3)};
  expectError(spec, {"(CopyHostToDevice): y (tensor", "shape: expected [4, 8], got [16, 8]"});
}

/// offloadedPlanSpec with its copies on the copy streams.
TEST(PlanTrainingTest, CopiesOnTheirStreamsWaitForWhatTheirBytesNeed) {
  test::TrainingTensors t;
  PlanSpec spec = test::offloadedPlanSpec(t, nullptr, /*onCopyStreams=*/true);
  std::vector<size_t> in, out;
  size_t adam = 0;
  for (size_t i = 0; i < spec.kernels.size(); ++i) {
    const test::KernelSpec &k = spec.kernels[i];
    if (k.kind == KernelKind::CopyHostToDevice)
      in.push_back(i);
    else if (k.kind == KernelKind::CopyDeviceToHost)
      out.push_back(i);
    else if (k.kind == KernelKind::AdamWUpdate && k.outputs[0] == t.head)
      adam = i;
  }
  ASSERT_EQ(in.size(), 3u);
  LoadedPlan plan = load(buildPlan(spec));
  EXPECT_TRUE(plan.usesSideStreams());
  EXPECT_EQ(plan.kernels[in[0]].stream, StreamId::HostToDevice);
  // Nothing before the copies in touches their bytes; the update reads all three, and waits
  // for the last (its stream runs them in order).
  for (size_t i : in)
    EXPECT_TRUE(plan.kernels[i].waits.empty()) << i;
  EXPECT_EQ(plan.kernels[adam].waits, std::vector<uint32_t>{uint32_t(in.back())});
  // The first copy back waits for the update that wrote its source; the others are implied.
  EXPECT_EQ(plan.kernels[out[0]].waits, std::vector<uint32_t>{uint32_t(adam)});
  EXPECT_TRUE(plan.kernels[out[1]].waits.empty());
  EXPECT_TRUE(plan.kernels[out[2]].waits.empty());
  for (size_t i = 0; i < plan.kernels.size(); ++i) {
    EXPECT_EQ(plan.kernels[i].signals, i == in.back() || i == adam) << i;
    if (i > out.back())
      EXPECT_TRUE(plan.kernels[i].waits.empty()) << i;
  }
  std::string text = printPlan(plan);
  EXPECT_NE(text.find(" on the device-to-host stream after #" + std::to_string(adam)),
            std::string::npos)
      << text;

  // Only the copies run on a copy stream, and only on one that exists.
  spec.kernels[adam].stream = 1;
  expectError(spec, {"(AdamWUpdate): runs on the host-to-device stream, but only the "
                     "host-offload copies (CopyHostToDevice, CopyDeviceToHost) run on a copy "
                     "stream"});
  spec.kernels[adam].stream = 0;
  spec.kernels[in[0]].stream = 5;
  expectError(spec, {"(CopyHostToDevice): runs on the collectives stream, but only the "
                     "exchanges with other ranks (ReduceScatter, AllGather, AllReduce) run there"});
  spec.kernels[in[0]].stream = 6;
  expectError(spec, {"runs on an unknown stream 6 (0 compute, 1 host-to-device copies, 2 "
                     "device-to-host copies, 3 host, 4 copies of the host steps' results, 5 "
                     "collectives)"});
}

/// hostStepPlanSpec: lm_head's update on the host stream, over pinned host memory.
TEST(PlanTrainingTest, HostStepsRunOnPinnedMemoryOnly) {
  test::TrainingTensors t;
  uint32_t mirror = 0;
  size_t update = 0;
  PlanSpec spec = test::hostStepPlanSpec(t, &mirror, &update);
  ASSERT_EQ(loadError(spec), "");
  LoadedPlan plan = load(buildPlan(spec));
  EXPECT_EQ(plan.kernels[update].stream, StreamId::Host);
  // The update waits for the last of the four copies out (its stream runs them in order), the
  // copy of the mirror back into the weight for the update.
  EXPECT_EQ(plan.kernels[update].waits, std::vector<uint32_t>{uint32_t(update - 1)});
  EXPECT_EQ(plan.kernels[update + 1].kind, KernelKind::CopyHostToDevice);
  EXPECT_EQ(plan.kernels[update + 1].waits, std::vector<uint32_t>{uint32_t(update)});
  std::string text = printPlan(plan);
  EXPECT_NE(text.find(" on the host stream after #" + std::to_string(update - 1)),
            std::string::npos)
      << text;

  // The copy back on the stream of the host steps' results (where the compiler puts it, so
  // that it holds up neither the other copies to the device nor the next host step) waits for
  // the update the same way.
  spec.kernels[update + 1].stream = 4;
  ASSERT_EQ(loadError(spec), "");
  plan = load(buildPlan(spec));
  EXPECT_EQ(plan.kernels[update + 1].stream, StreamId::HostResults);
  EXPECT_EQ(plan.kernels[update + 1].waits, std::vector<uint32_t>{uint32_t(update)});
  text = printPlan(plan);
  EXPECT_NE(text.find(" on the host-results stream after #" + std::to_string(update)),
            std::string::npos)
      << text;
  spec = test::hostStepPlanSpec(t, &mirror, &update);

  // Only a kind with a host implementation runs there...
  size_t increment = kernelOf(spec, KernelKind::StepIncrement);
  spec.kernels[increment].stream = 3;
  expectError(spec, {"(StepIncrement): runs on the host stream, but only the optimizer updates "
                     "with a host implementation (AdamWUpdate, SGDUpdate) run there"});
  // ... and it reads and writes pinned host memory only.
  spec = test::hostStepPlanSpec(t, &mirror, &update);
  spec.kernels[update].inputs[0] = t.gradHead;
  expectError(spec, {"(AdamWUpdate): grad (tensor " + std::to_string(t.gradHead) +
                     " 'lm_head.weight') is in device arena 'state': a kernel on the host stream "
                     "reads and writes pinned host memory only"});
  // The master is a copy of the weight the mirror copies, not of another.
  spec = test::hostStepPlanSpec(t, &mirror, &update);
  spec.tensors[mirror].initSource = t.table;
  expectError(spec,
              {"(AdamWUpdate): master (tensor", "is a copy of tensor " + std::to_string(t.head) +
                                                    " 'lm_head.weight', not of param"});
}

/// orderStreams on a hand-made plan: a read-after-write, a write-after-read, a wait implied
/// by an earlier one, and phases apart.
TEST(StreamOrderTest, WaitsFollowTheBytesAcrossStreams) {
  LoadedPlan plan;
  plan.arenas = {{"step", MemorySpace::Device, Lifetime::Step, 256, 256},
                 {"host", MemorySpace::PinnedHost, Lifetime::Persistent, 256, 256}};
  auto tensor = [&](uint32_t arena, uint64_t offset) {
    TensorInfo t;
    t.arena = arena;
    t.offset = offset;
    t.bytes = 64;
    plan.tensors.push_back(t);
    return uint32_t(plan.tensors.size() - 1);
  };
  uint32_t a = tensor(0, 0), b = tensor(0, 32), c = tensor(0, 128), h = tensor(1, 0),
           g = tensor(1, 64);
  auto kernel = [&](StreamId stream, std::vector<uint32_t> in, std::vector<uint32_t> out,
                    Phase phase = Phase::Forward) {
    KernelInfo k;
    k.stream = stream;
    k.inputs = std::move(in);
    k.outputs = std::move(out);
    k.phase = phase;
    plan.kernels.push_back(k);
  };
  kernel(StreamId::Compute, {a}, {c});      // 0
  kernel(StreamId::HostToDevice, {g}, {b}); // 1: writes bytes 0 read (a overlaps b)
  kernel(StreamId::Compute, {b}, {c});      // 2: reads what 1 wrote
  kernel(StreamId::DeviceToHost, {b}, {h}); // 3: reads b, as 2 does: no conflict with 2
  kernel(StreamId::Compute, {c}, {a});      // 4: overwrites what 3 reads
  kernel(StreamId::HostToDevice, {h}, {b}); // 5: reads what 3 wrote, writes what 4 wrote:
                                            //    waiting for 4 implies 3 (4 waited for it)
  kernel(StreamId::Compute, {a}, {b}, Phase::Update); // 6: another phase
  orderStreams(plan);
  std::vector<std::vector<uint32_t>> want = {{}, {0}, {1}, {1}, {3}, {4}, {}};
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(plan.kernels[i].waits, want[i]) << "kernel " << i;
  std::vector<bool> signals = {true, true, false, true, true, false, false};
  for (size_t i = 0; i < signals.size(); ++i)
    EXPECT_EQ(plan.kernels[i].signals, signals[i]) << "kernel " << i;

  // All on the compute stream: no waits at all.
  for (KernelInfo &k : plan.kernels)
    k.stream = StreamId::Compute;
  orderStreams(plan);
  for (const KernelInfo &k : plan.kernels)
    EXPECT_TRUE(k.waits.empty() && !k.signals);
}

TEST(PlanTrainingTest, OptimizerStateIsPersistentAndInitialized) {
  test::TrainingTensors t;
  PlanSpec spec = test::trainingPlanSpec({}, &t);
  uint32_t m = tensorOf(spec, "optimizer.exp_avg.lm_head.weight", TensorRole::OptimizerState);
  spec.tensors[m].init = TensorInit::None;
  expectError(spec, {"m (tensor " + std::to_string(m) +
                     " 'optimizer.exp_avg.lm_head.weight') must have init Zeros (moments start at "
                     "zero)"});
  spec = test::trainingPlanSpec({}, &t);
  spec.tensors[t.step].init = TensorInit::None;
  expectError(spec, {"(StepIncrement): step (tensor", "must have init Zeros (the step counter "
                                                      "starts at zero)"});
  spec = test::trainingPlanSpec({}, &t);
  // lm_head's AdamW writes the parameter in the step arena: its update would be lost.
  spec.tensors[t.head].arena = 1;
  spec.tensors[t.head].offset = spec.arenas[1].size;
  spec.arenas[1].size += 512;
  expectError(spec, {"(AdamWUpdate): param (tensor 1 'lm_head.weight') is in step arena 1 'step': "
                     "state updated in place must live in a persistent arena"});
  spec = test::trainingPlanSpec({2, 4, 16, 8, true}, &t);
  uint32_t master = tensorOf(spec, "optimizer.master.lm_head.weight", TensorRole::OptimizerState);
  spec.tensors[master].initSource = t.table;
  expectError(spec, {"is a copy of tensor 0 'model.embed_tokens.weight', not of param (tensor 1 "
                     "'lm_head.weight')"});
}

TEST(PlanTrainingTest, OverlapRulesOfTheNewKinds) {
  test::TrainingTensors t;
  PlanSpec spec = test::trainingPlanSpec({}, &t);
  // acc += g with g the accumulator itself.
  spec.kernels[kernelOf(spec, KernelKind::Accumulate)].inputs = {t.gradTable};
  expectError(spec, {"(Accumulate): acc (tensor", "overlaps g (tensor", "cannot run in place"});
  spec = test::everyTrainingKindPlanSpec();
  size_t rms = kernelOf(spec, KernelKind::RMSNormGrad);
  uint32_t dx = spec.kernels[rms].outputs[0], dw = spec.kernels[rms].outputs[1];
  spec.tensors[dw].offset = spec.tensors[dx].offset;
  expectError(spec, {"(RMSNormGrad): dw (tensor", "overlaps dx (tensor",
                     "(the outputs of a kernel are distinct tensors)"});
}

//===----------------------------------------------------------------------===//
// Fused kinds (docs/fusion.md): MultiTensorAdamWUpdate, MultiTensorSGDUpdate, LinearGeLU,
// LinearGradWeightAccumulate, LinearAdd.
//===----------------------------------------------------------------------===//

TEST(PlanFusedTest, LoadsTheFusedTrainingPlan) {
  test::TrainingTensors t;
  for (bool master : {false, true}) {
    PlanSpec spec = test::fusedTrainingPlanSpec({2, 4, 16, 8, master, 2}, &t);
    LoadedPlan plan = load(buildPlan(spec));
    const KernelInfo &adam = plan.kernels[kernelOf(spec, KernelKind::MultiTensorAdamWUpdate)];
    EXPECT_EQ(adam.inputs.size(), 5u);
    EXPECT_EQ(adam.outputs.size(), master ? 8u : 6u);
    EXPECT_EQ(adam.phase, Phase::Update);
    EXPECT_DOUBLE_EQ(adam.attrsAs<AdamWAttrs>().beta2, 0.95);
    const KernelInfo &acc = plan.kernels[kernelOf(spec, KernelKind::LinearGradWeightAccumulate)];
    EXPECT_EQ(acc.outputs, std::vector<uint32_t>{t.gradHead});
    EXPECT_EQ(plan.microBatchProblem(2), "");
  }
}

TEST(PlanFusedTest, MultiTensorArityAndAttributes) {
  PlanSpec spec = test::fusedTrainingPlanSpec();
  size_t adam = kernelOf(spec, KernelKind::MultiTensorAdamWUpdate);
  spec.kernels[adam].outputs.pop_back();
  expectError(spec, {"(MultiTensorAdamWUpdate): expected 6 or 8 outputs (param1 .. param2, m1 .. "
                     "m2, v1 .. v2, [master1 .. master2]) for 2 gradients, got 5"});
  spec = test::fusedTrainingPlanSpec();
  spec.kernels[adam].inputs.resize(3);
  expectError(spec, {"(MultiTensorAdamWUpdate): expected step, lr, norm, and at least one "
                     "gradient (g1 ..) as inputs, got 3 inputs"});
  spec = test::fusedTrainingPlanSpec();
  spec.kernels[adam].attrsType = fb::KernelAttrs::NONE;
  spec.kernels[adam].attrs = nullptr;
  expectError(spec, {"(MultiTensorAdamWUpdate) attributes: expected AdamWAttrs, got none"});
  spec = test::fusedTrainingPlanSpec();
  spec.kernels[adam].attrs = test::adamwAttrs(1.0, 0.95);
  expectError(spec, {"(MultiTensorAdamWUpdate): beta1 must be in [0, 1), got 1"});
  spec = test::fusedTrainingPlanSpec();
  spec.kernels[adam].inputs.push_back(4242);
  spec.kernels[adam].outputs.resize(9, spec.kernels[adam].outputs[0]);
  expectError(spec, {"input 5 (g3) is tensor 4242"});
}

TEST(PlanFusedTest, MultiTensorShapesDTypesAndState) {
  test::TrainingTensors t;
  PlanSpec spec = test::fusedTrainingPlanSpec({}, &t);
  size_t adam = kernelOf(spec, KernelKind::MultiTensorAdamWUpdate);
  // g1 (the table's gradient) against param2 (lm_head, [16, 8]): same shape here, so swap in
  // the step counter as a gradient.
  spec.kernels[adam].inputs[4] = t.lr;
  expectError(spec, {"(MultiTensorAdamWUpdate): param2 (tensor", "shape: expected [], got [16, 8]"});
  spec = test::fusedTrainingPlanSpec({}, &t);
  uint32_t m = tensorOf(spec, "optimizer.exp_avg.lm_head.weight", TensorRole::OptimizerState);
  spec.tensors[m].dtype = DType::BF16;
  spec.tensors[m].bytes = -1;
  expectError(spec, {"(MultiTensorAdamWUpdate): m2 (tensor " + std::to_string(m) +
                     " 'optimizer.exp_avg.lm_head.weight') dtype: expected f32, got bf16"});
  spec = test::fusedTrainingPlanSpec({}, &t);
  uint32_t other = spec.add("other", DType::BF16, {16, 8}, TensorRole::OptimizerState, 2);
  spec.kernels[adam].outputs[1] = other;
  expectError(spec, {"param2 (tensor " + std::to_string(other) +
                     " 'other') dtype bf16 differs from param1 (tensor 0 "
                     "'model.embed_tokens.weight')'s f32 (a multi-tensor update has one parameter "
                     "dtype)"});
  spec = test::fusedTrainingPlanSpec({}, &t);
  spec.tensors[m].init = TensorInit::None;
  expectError(spec, {"m2 (tensor " + std::to_string(m) +
                     " 'optimizer.exp_avg.lm_head.weight') must have init Zeros (moments start at "
                     "zero)"});
  spec = test::fusedTrainingPlanSpec({2, 4, 16, 8, true}, &t);
  uint32_t master = tensorOf(spec, "optimizer.master.lm_head.weight", TensorRole::OptimizerState);
  spec.tensors[master].initSource = t.table;
  expectError(spec, {"master2 (tensor", "is a copy of tensor 0 'model.embed_tokens.weight', not "
                     "of param2 (tensor 1 'lm_head.weight')"});
  spec = test::fusedTrainingPlanSpec({}, &t);
  spec.tensors[t.head].arena = 1;
  spec.tensors[t.head].offset = spec.arenas[1].size;
  spec.arenas[1].size += 512;
  expectError(spec, {"(MultiTensorAdamWUpdate): param2 (tensor 1 'lm_head.weight') is in step "
                     "arena 1 'step': state updated in place must live in a persistent arena"});
  // Multi-tensor updates run once per step, in the update phase only.
  spec = test::fusedTrainingPlanSpec({}, &t);
  spec.kernels[adam].phase = Phase::Backward;
  expectError(spec, {"(MultiTensorAdamWUpdate): runs in the backward phase, but optimizer "
                     "kernels run once per step, in the update phase"});
  // A gradient that is also written.
  spec = test::fusedTrainingPlanSpec({}, &t);
  spec.kernels[adam].inputs[3] = t.table;
  expectError(spec, {"(MultiTensorAdamWUpdate): param1 (tensor 0", "overlaps g1 (tensor 0"});
}

TEST(PlanFusedTest, MultiTensorSgd) {
  test::TrainingTensors t;
  PlanSpec spec = test::fusedTrainingPlanSpec({}, &t);
  size_t adam = kernelOf(spec, KernelKind::MultiTensorAdamWUpdate);
  test::KernelSpec &k = spec.kernels[adam];
  k.kind = KernelKind::MultiTensorSGDUpdate;
  k.inputs.erase(k.inputs.begin()); // no step
  k.outputs.resize(4);              // params, momentum (the first moments)
  k.attrsType = fb::KernelAttrs::SGDAttrs;
  k.attrs = test::sgdAttrs(0.9);
  LoadedPlan plan = load(buildPlan(spec));
  EXPECT_DOUBLE_EQ(plan.kernels[adam].attrsAs<SGDAttrs>().momentum, 0.9);
  spec.kernels[adam].attrs = test::sgdAttrs(-1.0);
  expectError(spec, {"(MultiTensorSGDUpdate): momentum must be finite and non-negative, got -1"});
  spec.kernels[adam].attrs = test::sgdAttrs(0.9);
  spec.kernels[adam].outputs.resize(3);
  expectError(spec, {"(MultiTensorSGDUpdate): expected 4 or 6 outputs (param1 .. param2, "
                     "momentum1 .. momentum2, [master1 .. master2]) for 2 gradients, got 3"});
}

TEST(PlanFusedTest, LinearGradWeightAccumulate) {
  test::TrainingTensors t;
  PlanSpec spec = test::fusedTrainingPlanSpec({}, &t);
  size_t acc = kernelOf(spec, KernelKind::LinearGradWeightAccumulate);
  spec.kernels[acc].outputs = {t.gradTable};
  // The table's accumulator is [16, 8] like lm_head's: make the shapes disagree.
  spec.tensors[t.gradTable].shape = {8, 16};
  spec.tensors[t.gradTable].bytes = -1;
  expectError(spec, {"(LinearGradWeightAccumulate): acc (tensor",
                     "shape: expected [16, 8], got [8, 16]"});
  spec = test::fusedTrainingPlanSpec({}, &t);
  spec.kernels[acc].inputs.pop_back();
  expectError(spec, {"(LinearGradWeightAccumulate): expected 2 inputs (dy, x), got 1"});
  spec = test::fusedTrainingPlanSpec({}, &t);
  spec.kernels[acc].inputs[1] = t.ids;
  expectError(spec, {"(LinearGradWeightAccumulate): x (tensor 2 'ids') dtype: expected f32, f16 "
                     "or bf16, got i32"});
  spec = test::fusedTrainingPlanSpec({}, &t);
  spec.kernels[acc].inputs[1] = t.gradHead;
  expectError(spec, {"(LinearGradWeightAccumulate): leading dimensions differ"});
}

TEST(PlanFusedTest, LinearGeLU) {
  // The small plan's linear (x [2, 4, 8], w [16, 8]) with a second output for the
  // pre-activation.
  PlanSpec spec = test::smallPlanSpec();
  size_t linear = kernelOf(spec, KernelKind::Linear);
  uint32_t y = spec.kernels[linear].outputs[0];
  uint32_t pre = spec.add("pre", spec.tensors[y].dtype, spec.tensors[y].shape,
                          TensorRole::Activation, spec.tensors[y].arena);
  spec.kernels[linear].kind = KernelKind::LinearGeLU;
  spec.kernels[linear].outputs.push_back(pre);
  LoadedPlan plan = load(buildPlan(spec));
  EXPECT_EQ(plan.kernels[linear].outputs.size(), 2u);
  PlanSpec bad = spec;
  bad.kernels[linear].outputs.pop_back();
  expectError(bad, {"(LinearGeLU): expected 2 outputs (y, pre), got 1"});
  bad = spec;
  bad.tensors[pre].dtype = DType::BF16;
  bad.tensors[pre].bytes = -1;
  expectError(bad, {"(LinearGeLU): pre (tensor", "dtype: expected f32 (as x), got bf16"});
  bad = spec;
  bad.tensors[pre].shape = {2, 4, 8};
  bad.tensors[pre].bytes = -1;
  expectError(bad, {"(LinearGeLU): pre (tensor", "shape: expected [2, 4, 16], got [2, 4, 8]"});
  bad = spec;
  bad.kernels[linear].outputs[1] = y;
  expectError(bad, {"(LinearGeLU): pre (tensor", "overlaps y (tensor"});
}

TEST(PlanFusedTest, LinearAdd) {
  // The small plan's linear (x [2, 4, 8], w [16, 8]) with a third input, the addend.
  PlanSpec spec = test::smallPlanSpec();
  size_t linear = kernelOf(spec, KernelKind::Linear);
  ASSERT_EQ(spec.kernels[linear].inputs.size(), 2u);
  uint32_t y = spec.kernels[linear].outputs[0];
  uint32_t addend = spec.add("addend", spec.tensors[y].dtype, spec.tensors[y].shape,
                             TensorRole::Activation, spec.tensors[y].arena);
  spec.kernels[linear].kind = KernelKind::LinearAdd;
  spec.kernels[linear].inputs.push_back(addend);
  LoadedPlan plan = load(buildPlan(spec));
  EXPECT_EQ(plan.kernels[linear].inputs.size(), 3u);
  PlanSpec bad = spec;
  bad.kernels[linear].inputs.pop_back();
  expectError(bad, {"(LinearAdd): expected 3 inputs (x, w, addend), got 2"});
  bad = spec;
  bad.tensors[addend].shape = {16}; // a bias's shape: the addend is not broadcast
  bad.tensors[addend].bytes = -1;
  expectError(bad, {"(LinearAdd): addend (tensor", "shape: expected [2, 4, 16], got [16]"});
  bad = spec;
  bad.tensors[addend].dtype = DType::BF16;
  bad.tensors[addend].bytes = -1;
  expectError(bad, {"(LinearAdd): addend (tensor", "dtype: expected f32"});
}

TEST(PlanTrainingTest, MicroBatchRules) {
  PlanSpec spec = test::trainingPlanSpec({2, 4, 16, 8, false, 0});
  expectError(spec, {"micro_batches must be in [1, 1048576], got 0"});
  // More than one micro-batch needs the loss scale...
  test::TrainingTensors t;
  spec = test::trainingPlanSpec({2, 4, 16, 8, false, 2}, &t);
  spec.tensors[t.lossScale].role = TensorRole::Workspace;
  expectError(spec, {"micro_batches 2: the plan has no LossScale tensor, so 2 micro-batches would "
                     "sum their gradients instead of averaging them"});
  // ... and the update must read accumulated gradients, not the last micro-batch's.
  spec = test::trainingPlanSpec({2, 4, 16, 8, false, 2}, &t);
  size_t norm = kernelOf(spec, KernelKind::GradNorm);
  spec.kernels[norm].inputs[1] = t.stepGradHead;
  expectError(spec,
              {"micro_batches 2: kernel " + std::to_string(norm) + " 'k" + std::to_string(norm) +
                   "' (GradNorm) reads tensor " + std::to_string(t.stepGradHead) +
                   " 'lm_head.weight', which each micro-batch produces in step arena 1 "
                   "'step'",
               "accumulate it into a persistent tensor"});
  // Sharing bytes with a backward tensor is fine when the update writes them before reading:
  // the learning rate over the backward pass's h.grad.
  spec = test::trainingPlanSpec({2, 4, 16, 8, false, 2}, &t);
  uint32_t dh = tensorOf(spec, "h.grad", TensorRole::Gradient);
  spec.tensors[t.lr].arena = 1;
  spec.tensors[t.lr].offset = spec.tensors[dh].offset;
  EXPECT_EQ(loadError(spec), "");
  // One micro-batch may read the step-arena gradient directly.
  spec = test::trainingPlanSpec({2, 4, 16, 8, false, 2}, &t);
  spec.kernels[norm].inputs[1] = t.stepGradHead;
  spec.microBatches = 1;
  LoadedPlan plan = load(buildPlan(spec));
  EXPECT_NE(plan.microBatchProblem(2).find("only the last one's value"), std::string::npos);
}

TEST(PlanTrainingTest, VocabSizeBoundsTheIds) {
  PlanSpec spec = test::smallPlanSpec();
  spec.vocabSize = 0;
  expectError(spec, {"vocab_size must be in [1, 2^32], got 0"});
  spec = test::smallPlanSpec();
  spec.vocabSize = 17;
  expectError(spec, {"kernel 0 'k0' (Embedding): the table indexed by the plan's ids, tensor 0 "
                     "'model.embed_tokens.weight', has 16 rows, fewer than vocab_size 17"});
  spec = test::trainingPlanSpec();
  spec.vocabSize = 17;
  expectError(spec, {"fewer than vocab_size 17"});
  // A padded table (more rows than the vocabulary) is fine.
  spec = test::smallPlanSpec();
  spec.vocabSize = 10;
  EXPECT_EQ(load(buildPlan(spec)).vocabularySize(), 10);
  spec = test::smallPlanSpec();
  spec.vocabSize = (uint64_t(1) << 31) + 1;
  expectError(spec, {"does not fit the plan's i32 inputs"});
}

//===----------------------------------------------------------------------===//
// Generated kernels (FusedElementwise): the program, its PTX, the kernel's arity.
//===----------------------------------------------------------------------===//

using Op = ElementwiseOpcode;

/// The small plan with a generated kernel between the embedding and the norm: it computes
/// f = bf16(h + w_norm) (w_norm broadcast over the rows) and f32 = f widened, which the
/// norm reads.
PlanSpec fusedPlanSpec(const std::string &arch = "cpu") {
  PlanSpec spec = test::smallPlanSpec();
  spec.arch = arch;
  uint32_t h = 5, norm = 1;
  uint32_t f = spec.add("f", DType::BF16, {2, 4, 8}, TensorRole::Activation, 1);
  test::GeneratedKernelSpec g;
  g.inputs = {DType::F32, DType::F32};
  g.instructions = {{Op::Add, DType::F32, 0, 1, 0}, {Op::Truncate, DType::BF16, 2, 0, 0}};
  g.outputs = {3};
  if (arch != "cpu") {
    g.ptx = ".version 7.8\n.target " + arch + "\n.visible .entry fused_elementwise_0(\n)\n{}\n";
    g.arch = arch;
  }
  spec.generatedKernels.push_back(g);
  test::KernelSpec fused{KernelKind::FusedElementwise, {h, norm}, {f},
                         fb::KernelAttrs::GeneratedKernelAttrs, test::generatedKernelAttrs(0),
                         "fused", Phase::Forward};
  spec.kernels.insert(spec.kernels.begin() + 1, fused);
  uint32_t f32 = spec.add("f32", DType::F32, {2, 4, 8}, TensorRole::Activation, 1);
  spec.generatedKernels[0].instructions.push_back({Op::Extend, DType::F32, 3, 0, 0});
  spec.generatedKernels[0].outputs.push_back(4);
  spec.kernels[1].outputs.push_back(f32);
  spec.kernels[2].inputs[0] = f32;
  return spec;
}

TEST(PlanGeneratedKernelsTest, LoadsAndRuns) {
  LoadedPlan plan = load(buildPlan(fusedPlanSpec()));
  ASSERT_EQ(plan.generatedKernels.size(), 1u);
  const GeneratedKernelInfo &g = plan.generatedKernels[0];
  EXPECT_EQ(g.name, "fused_elementwise_0");
  EXPECT_EQ(g.program.inputs, (std::vector<DType>{DType::F32, DType::F32}));
  ASSERT_EQ(g.program.instructions.size(), 3u);
  EXPECT_EQ(g.program.instructions[1].opcode, Op::Truncate);
  EXPECT_EQ(g.program.outputs, (std::vector<uint16_t>{3, 4}));
  EXPECT_EQ(plan.kernels[1].kind, KernelKind::FusedElementwise);
  EXPECT_EQ(plan.kernels[1].attrsAs<GeneratedKernelAttrs>().kernel, 0u);
  Executor executor(plan);
  executor.initWeights(1);
  TokenBatch batch;
  batch.batch = 2;
  batch.seq = 4;
  batch.inputs = {1, 2, 3, 4, 5, 6, 7, 8};
  batch.labels = {2, 3, 4, 5, 6, 7, 8, 9};
  executor.setInputs(batch);
  executor.runStep();
  EXPECT_TRUE(std::isfinite(executor.loss()));
  // A GPU plan carries the PTX of every generated kernel.
  plan = load(buildPlan(fusedPlanSpec("sm_90")));
  EXPECT_NE(plan.generatedKernels[0].ptx.find(".target sm_90"), std::string::npos);
}

TEST(PlanGeneratedKernelsTest, MalformedProgramsAreNamed) {
  PlanSpec spec = fusedPlanSpec();
  spec.generatedKernels[0].instructions[0].opcode = static_cast<Op>(99);
  expectError(spec, {"generated kernel 0 'fused_elementwise_0': instruction 0 has an unknown "
                     "opcode 99"});
  spec = fusedPlanSpec();
  spec.generatedKernels[0].instructions[0].b = 7;
  expectError(spec, {"instruction 0 (Add) reads register 7, but only 2 are defined before it"});
  spec = fusedPlanSpec();
  spec.generatedKernels[0].instructions[1].a = 2;
  spec.generatedKernels[0].instructions[2] = {Op::Mul, DType::F32, 3, 0, 0};
  expectError(spec, {"instruction 2 (Mul) type mismatch: computes on f32 registers, got bf16 "
                     "and f32"});
  spec = fusedPlanSpec();
  spec.generatedKernels[0].instructions[1].type = DType::F32;
  expectError(spec, {"instruction 1 (Truncate) type mismatch: rounds f32 to f16 or bf16"});
  spec = fusedPlanSpec();
  spec.generatedKernels[0].instructions[2] = {Op::Extend, DType::F32, 2, 0, 0};
  expectError(spec, {"instruction 2 (Extend) type mismatch: extends f16 or bf16 to f32, got f32"});
  spec = fusedPlanSpec();
  spec.generatedKernels[0].instructions[0].type = DType::I32;
  expectError(spec, {"instruction 0 (Add) defines a value of type 5"});
  spec = fusedPlanSpec();
  spec.generatedKernels[0].inputs[1] = DType::NF4;
  expectError(spec, {"input 1 type must be f32, f16 or bf16, got nf4"});
  spec = fusedPlanSpec();
  spec.generatedKernels[0].outputs[1] = 9;
  expectError(spec, {"output 1 is register 9, but the program defines 5"});
  spec = fusedPlanSpec();
  spec.generatedKernels[0].outputs.clear();
  expectError(spec, {"has no outputs"});
  spec = fusedPlanSpec();
  spec.generatedKernels[0].name = "";
  expectError(spec, {"generated kernel 0 has no name"});
}

TEST(PlanGeneratedKernelsTest, PtxOfGpuPlans) {
  PlanSpec spec = fusedPlanSpec("sm_90");
  spec.generatedKernels[0].ptx.clear();
  expectError(spec, {"generated kernel 0 'fused_elementwise_0' has no PTX, but the plan "
                     "targets sm_90"});
  spec = fusedPlanSpec("sm_90");
  spec.generatedKernels[0].arch = "sm_80";
  expectError(spec, {"is PTX for sm_80, but the plan targets sm_90"});
  spec = fusedPlanSpec("sm_90");
  spec.generatedKernels[0].name = "other";
  expectError(spec, {"its PTX has no .entry other"});
}

TEST(PlanGeneratedKernelsTest, KernelsMatchTheirProgram) {
  PlanSpec spec = fusedPlanSpec();
  spec.kernels[1].inputs.pop_back();
  expectError(spec, {"kernel 1 'fused' (FusedElementwise): expected 2 inputs and 2 outputs "
                     "(those of generated kernel 0 'fused_elementwise_0'), got 1 and 2"});
  spec = fusedPlanSpec();
  spec.kernels[1].attrsType = fb::KernelAttrs::GeneratedKernelAttrs;
  spec.kernels[1].attrs = test::generatedKernelAttrs(3);
  expectError(spec, {"runs generated kernel 3, but the plan has 1 generated kernels"});
  spec = fusedPlanSpec();
  spec.kernels[1].attrsType = fb::KernelAttrs::NONE;
  spec.kernels[1].attrs = {};
  expectError(spec, {"attributes: expected GeneratedKernelAttrs, got none"});
  spec = fusedPlanSpec();
  std::swap(spec.kernels[1].outputs[0], spec.kernels[1].outputs[1]);
  spec.kernels[2].inputs[0] = spec.kernels[1].outputs[1];
  expectError(spec, {"y1 (tensor", "dtype: generated kernel 0 'fused_elementwise_0' computes "
                     "bf16, got f32"});
  spec = fusedPlanSpec();
  spec.kernels[1].inputs[1] = 2; // lm_head.weight: 128 elements do not divide 64
  expectError(spec, {"x2 (tensor 2 'lm_head.weight') has 128 elements, which do not divide the "
                     "outputs' 64"});
  spec = fusedPlanSpec();
  spec.kernels[1].inputs[0] = 0; // the embedding table is f32 [16, 8]: 128 elements
  expectError(spec, {"do not divide"});
}

TEST(PlanGeneratedKernelsTest, RandomByteFlipsLoadOrThrow) {
  flipBytes(buildPlan(fusedPlanSpec()), 20261201, 1500);
  flipBytes(buildPlan(fusedPlanSpec("sm_90")), 20261202, 500);
}

//===----------------------------------------------------------------------===//
// Flash attention (FlashAttention, FlashAttentionGrad): the forward's log-sum-exp and the grad that
// reads it.
//===----------------------------------------------------------------------===//

/// The small plan plus a flash attention forward and its gradient on [2, 4, 4, 2] queries
/// with 2 kv heads (GQA), bf16, and the f32 [2, 4, 4] log-sum-exp between them.
struct FlashAttentionPlan {
  PlanSpec spec;
  uint32_t q, k, v, o, lse, dout, dq, dk, dv;
  size_t forward, grad; ///< kernel indices
};

FlashAttentionPlan flashAttentionPlan() {
  FlashAttentionPlan f;
  f.spec = test::smallPlanSpec();
  PlanSpec &p = f.spec;
  auto act = [&](const char *name, std::vector<int64_t> shape, DType t = DType::BF16) {
    return p.add(name, t, std::move(shape), TensorRole::Activation, 1);
  };
  f.q = act("q", {2, 4, 4, 2});
  f.k = act("k", {2, 4, 2, 2});
  f.v = act("v", {2, 4, 2, 2});
  f.o = act("o", {2, 4, 4, 2});
  f.lse = act("lse", {2, 4, 4}, DType::F32);
  f.dout = act("do", {2, 4, 4, 2});
  f.dq = act("dq", {2, 4, 4, 2});
  f.dk = act("dk", {2, 4, 2, 2});
  f.dv = act("dv", {2, 4, 2, 2});
  f.forward = p.kernels.size();
  p.kernel(KernelKind::FlashAttention, {f.q, f.k, f.v}, {f.o, f.lse},
           fb::KernelAttrs::AttentionAttrs, test::attentionAttrs(true, 0.5));
  f.grad = p.kernels.size();
  p.kernel(KernelKind::FlashAttentionGrad, {f.dout, f.q, f.k, f.v, f.o, f.lse},
           {f.dq, f.dk, f.dv}, fb::KernelAttrs::AttentionAttrs, test::attentionAttrs(true, 0.5));
  return f;
}

TEST(PlanFlashAttentionTest, LoadsWithItsAttributes) {
  FlashAttentionPlan f = flashAttentionPlan();
  LoadedPlan plan = load(buildPlan(f.spec));
  const KernelInfo &forward = plan.kernels[f.forward];
  EXPECT_EQ(forward.kind, KernelKind::FlashAttention);
  EXPECT_STREQ(kernelKindName(forward.kind), "FlashAttention");
  EXPECT_TRUE(forward.attrsAs<AttentionAttrs>().causal);
  EXPECT_DOUBLE_EQ(forward.attrsAs<AttentionAttrs>().scale, 0.5);
  EXPECT_EQ(plan.kernels[f.grad].kind, KernelKind::FlashAttentionGrad);
  EXPECT_EQ(plan.kernels[f.grad].inputs.size(), 6u);
}

TEST(PlanFlashAttentionTest, Arity) {
  FlashAttentionPlan f = flashAttentionPlan();
  f.spec.kernels[f.forward].outputs.pop_back();
  expectError(f.spec, {"(FlashAttention): expected 2 outputs (o, lse), got 1"});
  f = flashAttentionPlan();
  f.spec.kernels[f.grad].inputs.pop_back();
  expectError(f.spec, {"(FlashAttentionGrad): expected 6 or 7 inputs (do, q, k, v, o, lse, "
                       "segment_ids), got 5"});
}

TEST(PlanFlashAttentionTest, LogSumExpIsF32BatchHeadsSeq) {
  FlashAttentionPlan f = flashAttentionPlan();
  f.spec.tensors[f.lse].shape = {2, 4, 4, 1};
  expectError(f.spec, {"(FlashAttention)", "lse (tensor", "expected an f32 [2, 4, 4] log-sum-exp",
                       "got [2, 4, 4, 1] f32"});
  f = flashAttentionPlan();
  f.spec.tensors[f.lse].dtype = DType::BF16;
  f.spec.tensors[f.lse].bytes = -1;
  expectError(f.spec, {"(FlashAttention)", "expected an f32 [2, 4, 4] log-sum-exp", "bf16"});
  // [batch, seq, heads] is not [batch, heads, seq]: the grad names it.
  f = flashAttentionPlan();
  uint32_t wrong = f.spec.add("lse.bshd", DType::F32, {2, 4, 4}, TensorRole::Activation, 1);
  f.spec.tensors[f.q].shape = {2, 4, 2, 4};
  f.spec.tensors[f.o].shape = {2, 4, 2, 4};
  f.spec.tensors[f.dout].shape = {2, 4, 2, 4};
  f.spec.tensors[f.dq].shape = {2, 4, 2, 4};
  f.spec.tensors[f.k].shape = {2, 4, 1, 4};
  f.spec.tensors[f.v].shape = {2, 4, 1, 4};
  f.spec.tensors[f.dk].shape = {2, 4, 1, 4};
  f.spec.tensors[f.dv].shape = {2, 4, 1, 4};
  f.spec.tensors[f.lse].shape = {2, 2, 4};
  f.spec.tensors[f.lse].bytes = -1;
  f.spec.kernels[f.grad].inputs[5] = wrong;
  expectError(f.spec, {"(FlashAttentionGrad)", "lse (tensor", "'lse.bshd'",
                       "expected an f32 [2, 2, 4] log-sum-exp", "got [2, 4, 4] f32"});
}

TEST(PlanFlashAttentionTest, OperandsFollowAttention) {
  FlashAttentionPlan f = flashAttentionPlan();
  f.spec.tensors[f.o].dtype = DType::F32;
  f.spec.tensors[f.o].bytes = -1;
  expectError(f.spec, {"(FlashAttention)", "dtype: expected bf16"});
  f = flashAttentionPlan();
  f.spec.tensors[f.q].shape = {2, 4, 3, 2}; // 3 query heads over 2 kv heads
  f.spec.tensors[f.q].bytes = -1;
  expectError(f.spec, {"(FlashAttention)", "query heads (3) must be a multiple of key/value heads (2)"});
  f = flashAttentionPlan();
  f.spec.kernels[f.grad].attrs = test::attentionAttrs(true, -1.0);
  expectError(f.spec, {"(FlashAttentionGrad)", "scale must be positive and finite, got -1"});
  f = flashAttentionPlan();
  f.spec.kernels[f.forward].attrsType = fb::KernelAttrs::NormAttrs;
  f.spec.kernels[f.forward].attrs = test::normAttrs(1e-5);
  expectError(f.spec, {"(FlashAttention) attributes: expected AttentionAttrs, got NormAttrs"});
}

TEST(PlanFlashAttentionTest, KindsBetweenTheRangesAreUnknown) {
  PlanSpec spec = test::smallPlanSpec();
  // Reserved for the flash-attention family, not yet a kind.
  spec.kernels[2].kind = KernelKind(104);
  expectError(spec, {"kernel 2 'k2' has an unknown kind 104"});
  // One past the table's last kind (a kind added there moves it).
  uint32_t past = 0;
  for (const KernelKindInfo &info : kernelKinds())
    past = std::max(past, uint32_t(info.kind) + 1);
  spec.kernels[2].kind = KernelKind(past);
  expectError(spec, {"kernel 2 'k2' has an unknown kind " + std::to_string(past)});
}

/// The small plan plus a packed flash attention forward and its gradient: q (4 heads), k and v
/// (2 each) of [2, 4, *, 2] in one bf16 qkv [2, 4, 8, 2].
struct PackedAttentionPlan {
  PlanSpec spec;
  uint32_t qkv, o, lse, dout, dqkv;
  size_t forward, grad; ///< kernel indices
};

PackedAttentionPlan packedAttentionPlan() {
  PackedAttentionPlan f;
  f.spec = test::smallPlanSpec();
  PlanSpec &p = f.spec;
  auto act = [&](const char *name, std::vector<int64_t> shape, DType t = DType::BF16) {
    return p.add(name, t, std::move(shape), TensorRole::Activation, 1);
  };
  f.qkv = act("qkv", {2, 4, 8, 2});
  f.o = act("o", {2, 4, 4, 2});
  f.lse = act("lse", {2, 4, 4}, DType::F32);
  f.dout = act("do", {2, 4, 4, 2});
  f.dqkv = act("dqkv", {2, 4, 8, 2});
  f.forward = p.kernels.size();
  p.kernel(KernelKind::FlashAttentionQkv, {f.qkv}, {f.o, f.lse}, fb::KernelAttrs::AttentionAttrs,
           test::attentionAttrs(true, 0.5));
  f.grad = p.kernels.size();
  p.kernel(KernelKind::FlashAttentionQkvGrad, {f.dout, f.qkv, f.o, f.lse}, {f.dqkv},
           fb::KernelAttrs::AttentionAttrs, test::attentionAttrs(true, 0.5));
  return f;
}

TEST(PlanFlashAttentionTest, PackedQkvLoads) {
  PackedAttentionPlan f = packedAttentionPlan();
  LoadedPlan plan = load(buildPlan(f.spec));
  EXPECT_EQ(plan.kernels[f.forward].kind, KernelKind::FlashAttentionQkv);
  EXPECT_STREQ(kernelKindName(plan.kernels[f.grad].kind), "FlashAttentionQkvGrad");
  EXPECT_EQ(plan.kernels[f.grad].inputs.size(), 4u);
}

TEST(PlanFlashAttentionTest, PackedQkvHoldsTheOutputsHeads) {
  PackedAttentionPlan f = packedAttentionPlan();
  f.spec.tensors[f.qkv].shape = {2, 4, 7, 2}; // 4 query heads and 3 more: no k/v pair
  f.spec.tensors[f.qkv].bytes = -1;
  expectError(f.spec, {"(FlashAttentionQkv)", "qkv (tensor",
                       "[2, 4, 7, 2] does not hold the 4 "
                       "query heads of o",
                       "two equal numbers of key/value heads"});
  f = packedAttentionPlan();
  f.spec.tensors[f.qkv].shape = {2, 4, 10, 2}; // k and v of 3 heads do not divide 4
  f.spec.tensors[f.qkv].bytes = -1;
  expectError(f.spec, {"(FlashAttentionQkv)", "does not hold the 4 query heads"});
  f = packedAttentionPlan();
  f.spec.tensors[f.o].shape = {2, 4, 4, 3};
  f.spec.tensors[f.o].bytes = -1;
  expectError(f.spec, {"(FlashAttentionQkv)", "o (tensor", "[2, 4, 4, 3] does not match qkv",
                       "in batch, sequence or head_dim"});
  f = packedAttentionPlan();
  f.spec.tensors[f.lse].shape = {2, 4, 8};
  f.spec.tensors[f.lse].bytes = -1;
  expectError(f.spec, {"(FlashAttentionQkv)", "expected an f32 [2, 4, 4] log-sum-exp"});
  f = packedAttentionPlan();
  f.spec.tensors[f.dqkv].shape = {2, 4, 4, 2};
  f.spec.tensors[f.dqkv].bytes = -1;
  expectError(f.spec, {"(FlashAttentionQkvGrad)", "dqkv (tensor", "shape: expected [2, 4, 8, 2]"});
  f = packedAttentionPlan();
  f.spec.tensors[f.dout].shape = {2, 4, 8, 2};
  f.spec.tensors[f.dout].bytes = -1;
  expectError(f.spec, {"(FlashAttentionQkvGrad)", "do (tensor", "shape: expected [2, 4, 4, 2]"});
}

TEST(PlanFlashAttentionTest, PackedQkvIsNotForRings) {
  PackedAttentionPlan f = packedAttentionPlan();
  f.spec.ranks = f.spec.ringRanks = 2; // a ring plan: its attention may split the sequence
  f.spec.kernels[f.forward].attrs = test::attentionAttrs(true, 0.5, 2);
  expectError(f.spec, {"(FlashAttentionQkv)", "ring_ranks 2: ring attention takes q, k and v "
                                              "apart"});
  f = packedAttentionPlan();
  f.spec.kernels[f.grad].attrs = test::attentionAttrs(true, -1.0);
  expectError(f.spec, {"(FlashAttentionQkvGrad)", "scale must be positive and finite, got -1"});
}

/// The FP8 training plan with its tensors and kernels.
struct Fp8Plan {
  PlanSpec spec;
  test::TrainingTensors t;
  test::Fp8Tensors f;
};

Fp8Plan fp8Plan(test::TrainingDims d = {2, 8, 16, 16}, int64_t history = 4) {
  Fp8Plan p;
  p.spec = test::fp8TrainingPlanSpec(d, history, false, 0, &p.t, &p.f);
  return p;
}

TEST(PlanFp8Test, LoadsWithItsAttributes) {
  Fp8Plan p = fp8Plan();
  p.spec.kernels[p.f.gradWeight].attrs = test::fp8Attrs(true, 3);
  LoadedPlan plan = load(buildPlan(p.spec));
  const KernelInfo &forward = plan.kernels[p.f.forward];
  EXPECT_EQ(forward.kind, KernelKind::Fp8Linear);
  EXPECT_STREQ(kernelKindName(forward.kind), "Fp8Linear");
  EXPECT_FALSE(forward.attrsAs<Fp8Attrs>().current);
  EXPECT_EQ(forward.attrsAs<Fp8Attrs>().margin, 0);
  EXPECT_TRUE(plan.kernels[p.f.gradWeight].attrsAs<Fp8Attrs>().current);
  EXPECT_EQ(plan.kernels[p.f.gradWeight].attrsAs<Fp8Attrs>().margin, 3);
  EXPECT_EQ(plan.kernels[p.f.update].kind, KernelKind::Fp8UpdateScales);
  EXPECT_STREQ(kernelKindName(KernelKind::Fp8LinearGradInput), "Fp8LinearGradInput");
  EXPECT_STREQ(kernelKindName(KernelKind::Fp8LinearGradWeight), "Fp8LinearGradWeight");
  // The update reads the last micro-batch's stats from the step arena by design.
  EXPECT_EQ(loadError(test::fp8TrainingPlanSpec({2, 8, 16, 16, false, 2})), "");
  // A history of 1 and of 1024 entries; the update without backward stats.
  EXPECT_EQ(loadError(fp8Plan({2, 8, 16, 16}, 1).spec), "");
  EXPECT_EQ(loadError(fp8Plan({2, 8, 16, 16}, 1024).spec), "");
  p = fp8Plan();
  p.spec.kernels[p.f.update].inputs.pop_back();
  EXPECT_EQ(loadError(p.spec), "");
}

/// fp8Plan with its weight gradient in the accumulating form (Fp8LinearGradWeightAccumulate):
/// outputs stats, workspace, then the gradient it adds into.
Fp8Plan accumulatingFp8Plan() {
  Fp8Plan p = fp8Plan();
  test::KernelSpec &k = p.spec.kernels[p.f.gradWeight];
  k.kind = KernelKind::Fp8LinearGradWeightAccumulate;
  k.outputs = {k.outputs[1], k.outputs[2], k.outputs[0]};
  return p;
}

TEST(PlanFp8Test, AccumulatingWeightGradient) {
  Fp8Plan p = accumulatingFp8Plan();
  LoadedPlan plan = load(buildPlan(p.spec));
  EXPECT_EQ(plan.kernels[p.f.gradWeight].kind, KernelKind::Fp8LinearGradWeightAccumulate);
  EXPECT_STREQ(kernelKindName(KernelKind::Fp8LinearGradWeightAccumulate),
               "Fp8LinearGradWeightAccumulate");
  p.spec.kernels[p.f.gradWeight].outputs.pop_back();
  expectError(p.spec, {"(Fp8LinearGradWeightAccumulate): expected 3 outputs (stats, workspace, "
                       "acc), got 2"});
  // The unfused kind's output order is refused: the accumulator comes last.
  p = fp8Plan();
  p.spec.kernels[p.f.gradWeight].kind = KernelKind::Fp8LinearGradWeightAccumulate;
  expectError(p.spec, {"(Fp8LinearGradWeightAccumulate): acc (tensor", "shape: expected [16, 16]"});
  p = accumulatingFp8Plan();
  uint32_t acc = p.spec.add("acc.wrong", DType::F32, {16, 32}, TensorRole::Gradient, 1);
  p.spec.kernels[p.f.gradWeight].outputs[2] = acc;
  expectError(p.spec, {"(Fp8LinearGradWeightAccumulate): acc (tensor", "shape: expected [16, 16], "
                       "got [16, 32]"});
  p = accumulatingFp8Plan();
  uint32_t bf16Acc = p.spec.add("acc.bf16", DType::BF16, {16, 16}, TensorRole::Gradient, 1);
  p.spec.kernels[p.f.gradWeight].outputs[2] = bf16Acc;
  expectError(p.spec, {"(Fp8LinearGradWeightAccumulate): acc (tensor", "dtype: expected f32, "
                       "got bf16"});
  p = accumulatingFp8Plan();
  uint32_t small = p.spec.add("ws.small", DType::F32, {191}, TensorRole::Workspace, 1);
  p.spec.kernels[p.f.gradWeight].outputs[1] = small;
  expectError(p.spec, {"(Fp8LinearGradWeightAccumulate): workspace (tensor", "expected a 1-D f32 "
                       "workspace of at least"});
  p = accumulatingFp8Plan();
  p.spec.kernels[p.f.gradWeight].attrs = test::fp8Attrs(false, 40);
  expectError(p.spec, {"(Fp8LinearGradWeightAccumulate): margin must be in [0, 32], got 40"});
  p = accumulatingFp8Plan();
  uint32_t stepState = p.spec.add("step.fp8", DType::F32, {3, 8}, TensorRole::Activation, 1);
  p.spec.kernels[p.f.gradWeight].inputs[2] = stepState;
  expectError(p.spec, {"(Fp8LinearGradWeightAccumulate): state (tensor", "FP8 scaling state must "
                       "live in a persistent arena"});
}

TEST(PlanFp8Test, FusedBackward) {
  test::Fp8Tensors f;
  test::TrainingTensors t;
  auto plan = [&] { return test::fp8FusedBackwardPlanSpec({2, 8, 16, 16}, &t, &f); };
  PlanSpec spec = plan();
  LoadedPlan loaded = load(buildPlan(spec));
  EXPECT_EQ(loaded.kernels[f.gradInput].kind, KernelKind::Fp8LinearBackward);
  EXPECT_STREQ(kernelKindName(KernelKind::Fp8LinearBackward), "Fp8LinearBackward");
  spec.kernels[f.gradInput].outputs.pop_back();
  expectError(spec, {"(Fp8LinearBackward): expected 5 outputs (dx, input_grad_stats, "
                     "weight_grad_stats, workspace, acc), got 4"});
  // Each GEMM's workspace alone is too small: the fused kernel holds both.
  spec = plan();
  uint32_t oneGemm = spec.add("ws.one", DType::F32, {192}, TensorRole::Workspace, 1);
  spec.kernels[f.gradInput].outputs[3] = oneGemm;
  expectError(spec, {"(Fp8LinearBackward): workspace (tensor",
                     "expected a 1-D f32 workspace of "
                     "at least",
                     "the workspaces of Fp8LinearGradInput and Fp8LinearGradWeightAccumulate"});
  spec = plan();
  uint32_t bf16Acc = spec.add("acc.bf16", DType::BF16, {16, 16}, TensorRole::Gradient, 1);
  spec.kernels[f.gradInput].outputs[4] = bf16Acc;
  expectError(spec, {"(Fp8LinearBackward): acc (tensor", "dtype: expected f32, got bf16"});
  spec = plan();
  uint32_t bf16X = spec.add("x.bf16", DType::BF16, {2, 8, 16}, TensorRole::Activation, 1);
  spec.kernels[f.gradInput].inputs[2] = bf16X;
  expectError(spec, {"(Fp8LinearBackward): x (tensor", "dtype: expected f32 (as dy), got bf16"});
  spec = plan();
  uint32_t wideX = spec.add("x.wide", DType::F32, {2, 8, 32}, TensorRole::Activation, 1);
  spec.kernels[f.gradInput].inputs[2] = wideX;
  expectError(spec, {"(Fp8LinearBackward): x (tensor", "shape: expected [2, 8, 16], got "
                                                       "[2, 8, 32]"});
  spec = plan();
  spec.kernels[f.gradInput].outputs[2] = spec.kernels[f.gradInput].outputs[3];
  expectError(spec, {"(Fp8LinearBackward): weight_grad_stats (tensor", "expected f32 [2, 4] FP8 "
                                                                       "cast statistics"});
  spec = plan();
  uint32_t stepState = spec.add("step.fp8", DType::F32, {3, 8}, TensorRole::Activation, 1);
  spec.kernels[f.gradInput].inputs[3] = stepState;
  expectError(spec, {"(Fp8LinearBackward): state (tensor", "FP8 scaling state must live in a "
                                                           "persistent arena"});
  spec = plan();
  spec.kernels[f.gradInput].attrs = test::fp8Attrs(false, 40);
  expectError(spec, {"(Fp8LinearBackward): margin must be in [0, 32], got 40"});
}

TEST(PlanFp8Test, SharedInputCast) {
  // Kinds 96 and 97 (bonsai-fuse's fp8-shared-input): a second forward GEMM reading the
  // forward's cast of x (its workspace and stats), and a second fused backward reading the
  // fused backward's. They load; an input cast too small for x's codes, stats of another
  // shape, a workspace without room for the kernel's own casts and fast accumulation on the
  // backward are named.
  test::Fp8Tensors f;
  test::TrainingTensors t;
  const int64_t M = 16, N = 16, K = 16;
  size_t forwardShared = 0, backwardShared = 0;
  uint32_t smallCast = 0, forwardWorkspace = 0, backwardWorkspace = 0;
  auto plan = [&] {
    PlanSpec spec = test::fp8FusedBackwardPlanSpec({2, 8, 16, 16}, &t, &f);
    auto add = [&](const char *name, std::vector<int64_t> shape,
                   TensorRole role = TensorRole::Activation) {
      return spec.add(name, DType::F32, std::move(shape), role, 1);
    };
    const test::KernelSpec forward = spec.kernels[f.forward], fused = spec.kernels[f.gradInput];
    forwardWorkspace =
        add("ws.shared", {fp8::gemmWorkspaceBytes(0, N * K) / 4}, TensorRole::Workspace);
    test::KernelSpec second = forward;
    second.kind = KernelKind::Fp8LinearSharedInput;
    second.inputs = {f.forwardWorkspace, f.forwardStats, forward.inputs[1], forward.inputs[2]};
    second.outputs = {add("y.shared", {2, 8, N}), add("stats.shared", {2, 4}), forwardWorkspace};
    backwardWorkspace =
        add("ws.backward.shared",
            {(fp8::gemmWorkspaceBytes(M * N, N * K) + fp8::gemmWorkspaceBytes(M * N, 0)) / 4},
            TensorRole::Workspace);
    test::KernelSpec secondBackward = fused;
    secondBackward.kind = KernelKind::Fp8LinearBackwardSharedInput;
    secondBackward.inputs = {fused.inputs[0], fused.inputs[1], f.gradInputWorkspace,
                             f.gradWeightStats, fused.inputs[3]};
    secondBackward.outputs = {add("dx.shared", {2, 8, K}), add("dxs.shared", {2, 4}),
                              add("dws.shared", {2, 4}), backwardWorkspace,
                              add("acc.shared", {N, K}, TensorRole::Gradient)};
    smallCast = add("cast.small", {64}, TensorRole::Workspace);
    std::vector<test::KernelSpec> kernels;
    for (size_t i = 0; i < spec.kernels.size(); ++i) {
      kernels.push_back(spec.kernels[i]);
      if (i == f.forward) {
        forwardShared = kernels.size();
        kernels.push_back(second);
      } else if (i == f.gradInput) {
        backwardShared = kernels.size();
        kernels.push_back(secondBackward);
      }
    }
    spec.kernels = kernels;
    return spec;
  };
  PlanSpec spec = plan();
  ASSERT_EQ(loadError(spec), "");
  LoadedPlan loaded = load(buildPlan(spec));
  EXPECT_EQ(loaded.kernels[forwardShared].kind, KernelKind::Fp8LinearSharedInput);
  EXPECT_EQ(loaded.kernels[backwardShared].kind, KernelKind::Fp8LinearBackwardSharedInput);
  EXPECT_STREQ(kernelKindName(KernelKind::Fp8LinearBackwardSharedInput),
               "Fp8LinearBackwardSharedInput");
  spec.kernels[forwardShared].inputs[0] = smallCast;
  expectError(spec, {"(Fp8LinearSharedInput): input_cast (tensor",
                     "expected an Fp8Linear's workspace holding x's codes, f32 [128] or larger "
                     "for the codes of 256 elements, got [64] f32"});
  spec = plan();
  spec.kernels[backwardShared].inputs[2] = smallCast;
  expectError(spec, {"(Fp8LinearBackwardSharedInput): input_cast (tensor",
                     "expected an Fp8LinearBackward's workspace holding x's transposed codes"});
  spec = plan();
  spec.kernels[forwardShared].inputs[1] = spec.kernels[forwardShared].outputs[0];
  expectError(spec, {"(Fp8LinearSharedInput): input_stats (tensor",
                     "expected f32 [2, 4] FP8 cast statistics"});
  spec = plan();
  spec.kernels[forwardShared].outputs[2] = spec.kernels[forwardShared].outputs[1];
  expectError(spec, {"(Fp8LinearSharedInput): workspace (tensor",
                     "fp8::gemmWorkspaceBytes of w's cast alone"});
  spec = plan();
  spec.kernels[backwardShared].outputs[3] = smallCast;
  expectError(spec, {"(Fp8LinearBackwardSharedInput): workspace (tensor",
                     "Fp8LinearBackward's workspace without x's codes"});
  spec = plan();
  spec.kernels[forwardShared].attrs = test::fp8Attrs(false, 0, /*fastAccumulation=*/true);
  EXPECT_EQ(loadError(spec), "");
  spec.kernels[backwardShared].attrs = test::fp8Attrs(false, 0, /*fastAccumulation=*/true);
  expectError(spec, {"(Fp8LinearBackwardSharedInput): fast_accumulation is the forward GEMMs' "
                     "option"});
  spec = plan();
  spec.kernels[backwardShared].inputs.pop_back();
  expectError(spec, {"(Fp8LinearBackwardSharedInput): expected 5 inputs (dy, w, input_cast, "
                     "input_stats, state), got 4"});
}

TEST(PlanFp8Test, SavedInputCast) {
  // Kinds 98 and 99 (bonsai-fuse's fp8-saved-input): the forward also writes xᵀ's codes,
  // f8e4m3fn [K, M], and the fused backward reads them and the forward's stats. They load;
  // codes of another dtype or shape are named, and fast accumulation is the forward's only.
  test::Fp8Tensors f;
  test::TrainingTensors t;
  const int64_t M = 16, K = 16;
  uint32_t codes = 0;
  auto plan = [&] {
    PlanSpec spec = test::fp8FusedBackwardPlanSpec({2, 8, 16, 16}, &t, &f);
    codes = spec.add("x.codes", DType::F8E4M3FN, {K, M}, TensorRole::Activation, 1);
    test::KernelSpec &forward = spec.kernels[f.forward];
    forward.kind = KernelKind::Fp8LinearWithInputCast;
    forward.outputs.insert(forward.outputs.begin() + 2, codes);
    test::KernelSpec &backward = spec.kernels[f.gradInput];
    backward.kind = KernelKind::Fp8LinearBackwardFromInputCast;
    backward.inputs = {backward.inputs[0], backward.inputs[1], codes, f.forwardStats,
                       backward.inputs[3]};
    return spec;
  };
  PlanSpec spec = plan();
  ASSERT_EQ(loadError(spec), "");
  LoadedPlan loaded = load(buildPlan(spec));
  EXPECT_EQ(loaded.kernels[f.forward].kind, KernelKind::Fp8LinearWithInputCast);
  EXPECT_EQ(loaded.kernels[f.gradInput].kind, KernelKind::Fp8LinearBackwardFromInputCast);
  uint32_t bf16Codes = spec.add("x.codes.bf16", DType::BF16, {K, M}, TensorRole::Activation, 1);
  spec.kernels[f.forward].outputs[2] = bf16Codes;
  expectError(spec, {"(Fp8LinearWithInputCast): input_cast (tensor",
                     "expected f8_e4m3 [16, 16] (x's transposed codes), got [16, 16] bf16"});
  spec = plan();
  uint32_t wide = spec.add("x.codes.wide", DType::F8E4M3FN, {K, 2 * M}, TensorRole::Activation, 1);
  spec.kernels[f.gradInput].inputs[2] = wide;
  expectError(spec, {"(Fp8LinearBackwardFromInputCast): input_cast (tensor",
                     "expected f8_e4m3 [16, 16] (x's transposed codes, an "
                     "Fp8LinearWithInputCast's), got [16, 32] f8_e4m3"});
  spec = plan();
  spec.kernels[f.forward].attrs = test::fp8Attrs(false, 0, /*fastAccumulation=*/true);
  EXPECT_EQ(loadError(spec), "");
  spec.kernels[f.gradInput].attrs = test::fp8Attrs(false, 0, /*fastAccumulation=*/true);
  expectError(spec, {"(Fp8LinearBackwardFromInputCast): fast_accumulation is the forward "
                     "GEMMs' option"});
}

TEST(PlanFp8Test, Arity) {
  Fp8Plan p = fp8Plan();
  p.spec.kernels[p.f.forward].inputs.resize(2);
  expectError(p.spec, {"(Fp8Linear): expected 3 or 4 inputs (x, w, state, bias), got 2"});
  p = fp8Plan();
  p.spec.kernels[p.f.gradInput].outputs.pop_back();
  expectError(p.spec, {"(Fp8LinearGradInput): expected 3 outputs (dx, stats, workspace), got 2"});
  p = fp8Plan();
  p.spec.kernels[p.f.gradWeight].inputs.push_back(p.t.head);
  expectError(p.spec, {"(Fp8LinearGradWeight): expected 3 inputs (dy, x, state), got 4"});
  p = fp8Plan();
  p.spec.kernels[p.f.update].inputs.resize(1);
  expectError(p.spec, {"(Fp8UpdateScales): expected 2 or 3 inputs (step, forward_stats, "
                       "backward_stats), got 1"});
}

TEST(PlanFp8Test, Attributes) {
  Fp8Plan p = fp8Plan();
  p.spec.kernels[p.f.forward].attrsType = fb::KernelAttrs::NONE;
  p.spec.kernels[p.f.forward].attrs = {};
  expectError(p.spec, {"(Fp8Linear) attributes: expected Fp8Attrs, got none"});
  p = fp8Plan();
  p.spec.kernels[p.f.update].attrsType = fb::KernelAttrs::NormAttrs;
  p.spec.kernels[p.f.update].attrs = test::normAttrs(1e-5);
  expectError(p.spec, {"(Fp8UpdateScales) attributes: expected Fp8Attrs, got NormAttrs"});
  p = fp8Plan();
  p.spec.kernels[p.f.gradInput].attrs = test::fp8Attrs(false, 33);
  expectError(p.spec, {"(Fp8LinearGradInput): margin must be in [0, 32], got 33"});
  p = fp8Plan();
  p.spec.kernels[p.f.update].attrs = test::fp8Attrs(false, -1);
  expectError(p.spec, {"(Fp8UpdateScales): margin must be in [0, 32], got -1"});
  // Fast accumulation is the forward GEMM's option alone.
  p = fp8Plan();
  p.spec.kernels[p.f.forward].attrs = test::fp8Attrs(false, 0, /*fastAccumulation=*/true);
  EXPECT_EQ(loadError(p.spec), "");
  p = fp8Plan();
  p.spec.kernels[p.f.gradWeight].attrs = test::fp8Attrs(false, 0, /*fastAccumulation=*/true);
  expectError(p.spec, {"(Fp8LinearGradWeight): fast_accumulation is the forward GEMMs' option "
                       "(Fp8Linear, Fp8LinearSharedInput, Fp8LinearWithInputCast); a gradient "
                       "GEMM always promotes its partial sums to fp32"});
}

TEST(PlanFp8Test, DTypesAndShapes) {
  Fp8Plan p = fp8Plan();
  p.spec.kernels[p.f.forward].inputs[0] = p.t.ids;
  expectError(p.spec, {"(Fp8Linear): x (tensor", "'ids') dtype: expected f32, f16 or bf16, got i32"});
  p = fp8Plan();
  p.spec.kernels[p.f.gradInput].inputs[1] = p.t.step;
  expectError(p.spec, {"(Fp8LinearGradInput): w (tensor", "dtype: expected f32, f16 or bf16, got i64"});
  // M, N and K: multiples of 16.
  expectError(fp8Plan({2, 4, 16, 16}).spec,
              {"(Fp8Linear): M = 8 (the rows of x [2, 4, 16]) is not a multiple of 16"});
  expectError(fp8Plan({2, 8, 24, 16}).spec,
              {"(Fp8Linear): N = 24 (the rows of w [24, 16]) is not a multiple of 16"});
  expectError(fp8Plan({2, 8, 16, 8}).spec,
              {"(Fp8Linear): K = 8 (the columns of w [16, 8]) is not a multiple of 16"});
  p = fp8Plan();
  uint32_t bias = p.spec.add("lm_head.bias", DType::F32, {8}, TensorRole::Parameter, 0);
  p.spec.kernels[p.f.forward].inputs.push_back(bias);
  expectError(p.spec, {"(Fp8Linear): bias (tensor", "shape: expected [16], got [8]"});
  p.spec.tensors[bias].shape = {16};
  p.spec.tensors[bias].bytes = -1;
  p.spec.arenas[0].size += 64;
  EXPECT_EQ(loadError(p.spec), "");
  p = fp8Plan();
  uint32_t y = p.spec.add("y.i32", DType::I32, {2, 8, 16}, TensorRole::Activation, 1);
  p.spec.kernels[p.f.forward].outputs[0] = y;
  expectError(p.spec, {"(Fp8Linear): y (tensor", "dtype: expected f32, f16 or bf16, got i32"});
  p = fp8Plan();
  uint32_t dx = p.spec.add("dx.wrong", DType::F32, {2, 8, 32}, TensorRole::Gradient, 1);
  p.spec.kernels[p.f.gradInput].outputs[0] = dx;
  expectError(p.spec, {"(Fp8LinearGradInput): dx (tensor", "shape: expected [2, 8, 16], got [2, 8, 32]"});
  p = fp8Plan();
  uint32_t x = p.spec.add("x.short", DType::F32, {16, 16}, TensorRole::Activation, 1);
  p.spec.kernels[p.f.gradWeight].inputs[1] = x;
  expectError(p.spec, {"(Fp8LinearGradWeight): leading dimensions differ"});
}

TEST(PlanFp8Test, StateStatsAndWorkspace) {
  Fp8Plan p = fp8Plan();
  uint32_t bad = p.spec.add("bad.fp8", DType::F32, {2, 8}, TensorRole::OptimizerState, 2);
  p.spec.kernels[p.f.forward].inputs[2] = bad;
  expectError(p.spec, {"(Fp8Linear): state (tensor", "'bad.fp8'): expected an f32 [3, 4 + H] "
                       "FP8 scaling state", "1 <= H <= 1024), got [2, 8] f32"});
  expectError(fp8Plan({2, 8, 16, 16}, 0).spec, {"(Fp8Linear): state", "got [3, 4] f32"});
  expectError(fp8Plan({2, 8, 16, 16}, 1025).spec, {"(Fp8Linear): state", "got [3, 1029] f32"});
  p = fp8Plan();
  uint32_t stepState = p.spec.add("step.fp8", DType::F32, {3, 8}, TensorRole::Activation, 1);
  p.spec.kernels[p.f.gradInput].inputs[2] = stepState;
  expectError(p.spec, {"(Fp8LinearGradInput): state (tensor", "is in step arena 1 'step': FP8 "
                       "scaling state must live in a persistent arena"});
  p = fp8Plan();
  p.spec.tensors[p.f.state].init = TensorInit::None;
  expectError(p.spec, {"(Fp8UpdateScales): state (tensor", "must have init Zeros"});
  p = fp8Plan();
  p.spec.tensors[p.f.state].role = TensorRole::Gradient;
  expectError(p.spec, {"(Fp8UpdateScales): state (tensor", "has role gradient, expected "
                       "optimizer state"});
  p = fp8Plan();
  uint32_t stats = p.spec.add("stats.t", DType::F32, {4, 2}, TensorRole::Workspace, 1);
  p.spec.kernels[p.f.gradWeight].outputs[1] = stats;
  expectError(p.spec, {"(Fp8LinearGradWeight): stats (tensor", "expected f32 [2, 4] FP8 cast "
                       "statistics", "got [4, 2] f32"});
  p = fp8Plan();
  p.spec.kernels[p.f.update].inputs[2] = stats = p.spec.add("stats.bf16", DType::BF16, {2, 4},
                                                             TensorRole::Workspace, 1);
  expectError(p.spec, {"(Fp8UpdateScales): backward_stats (tensor", "got [2, 4] bf16"});
  p = fp8Plan();
  uint32_t small = p.spec.add("ws.small", DType::F32, {191}, TensorRole::Workspace, 1);
  p.spec.kernels[p.f.forward].outputs[2] = small;
  expectError(p.spec, {"(Fp8Linear): workspace (tensor", "expected a 1-D f32 workspace of at "
                       "least 192 elements (fp8::gemmWorkspaceBytes of casts of 256 and 256 "
                       "elements), got [191] f32"});
  p = fp8Plan();
  p.spec.kernels[p.f.update].inputs[0] = p.t.lossScale;
  expectError(p.spec, {"(Fp8UpdateScales): step (tensor", "must be a scalar [] of dtype i64"});
}

TEST(PlanFp8Test, TheUpdateRunsInTheUpdatePhase) {
  Fp8Plan p = fp8Plan();
  // Move the update to the end of the backward phase.
  test::KernelSpec update = p.spec.kernels[p.f.update];
  p.spec.kernels.erase(p.spec.kernels.begin() + long(p.f.update));
  update.phase = Phase::Backward;
  size_t firstUpdate = 0;
  while (p.spec.kernels[firstUpdate].phase != Phase::Update)
    ++firstUpdate;
  p.spec.kernels.insert(p.spec.kernels.begin() + long(firstUpdate), update);
  expectError(p.spec, {"(Fp8UpdateScales): runs in the backward phase, but optimizer kernels "
                       "run once per step"});
}

} // namespace
} // namespace bonsai::rt
