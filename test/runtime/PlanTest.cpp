//===- PlanTest.cpp - Plan loading: verification layers and fuzzing -------===//
//
// A valid plan loads into the plain structs; every truncation and hundreds of random byte flips
// are rejected with rt::Error or load into something the executor can run without touching
// memory outside its arenas (checked by running it, under ASan in scripts/test-asan.sh); and one
// planted mistake at a time gets a message that names it.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Plan.h"

#include "TestPlans.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Random.h"

#include <gtest/gtest.h>

#include <cstdio>

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
  EXPECT_DOUBLE_EQ(plan.kernels[1].attrs.epsilon, 1e-5);
  EXPECT_EQ(plan.kernels[3].attrs.ignoreIndex, -100);
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
  EXPECT_EQ(plan.kernels[23].attrs.permutation, (std::vector<int64_t>{0, 2, 1}));
  EXPECT_TRUE(plan.kernels[9].attrs.causal);
  EXPECT_DOUBLE_EQ(plan.kernels[9].attrs.scale, 0.5);
  EXPECT_TRUE(plan.kernels[17].attrs.geluTanh);
  EXPECT_EQ(plan.kernels[6].attrs.start, 12);
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
  EXPECT_NE(message.find("plan version 2 is not supported"), std::string::npos) << message;
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

void expectError(const PlanSpec &spec, std::initializer_list<const char *> parts) {
  std::string message = loadError(spec);
  ASSERT_FALSE(message.empty()) << "the plan loaded";
  for (const char *part : parts)
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
  expectError(spec, {"expected 2 tensors (ids, labels), got 1"});
  spec = test::smallPlanSpec();
  spec.tensors[4].role = TensorRole::Activation;
  expectError(spec, {"plan input 1 (labels)", "has role activation, expected input"});
  spec = test::smallPlanSpec();
  spec.loss = 7;
  expectError(spec, {"the loss, tensor 7 'logits', must be an f32 scalar"});
  spec = test::smallPlanSpec();
  spec.kernels.pop_back();
  expectError(spec, {"the loss, tensor 8 'loss', is not written by any kernel"});
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
  spec = test::smallPlanSpec();
  spec.tensors[5].dtype = DType(42);
  spec.tensors[5].bytes = 256;
  expectError(spec, {"tensor 5 'h' has an unknown dtype 42"});
}

} // namespace
} // namespace bonsai::rt
