//===- CheckpointTest.cpp - Crash-safe checkpoints, verification, resume --===//
//
// The layout a save writes (step directory, files, manifest, latest); a save and load that
// restore every parameter and optimizer byte; a second save that leaves the first untouched; a
// writer killed at each of its crash points (in a forked child) that leaves the previous
// checkpoint loadable and `latest` naming it; every kind of corruption (a flipped byte, a
// truncated file, a missing file, an edited manifest, a bad `latest`) rejected with an error
// naming the file, before anything is bound; mismatched plans listed name by name; and the
// gradient dump choosing the accumulator.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Checkpoint.h"

#include "TestPlans.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Safetensors.h"
#include "bonsai/runtime/Sha256.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace bonsai::rt {
namespace {

LoadedPlan loadSpec(const test::PlanSpec &spec) {
  std::vector<uint8_t> bytes = test::buildPlan(spec);
  return loadPlanBuffer(bytes.data(), bytes.size(), "train.plan");
}

void writeText(const std::string &path, const std::string &text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

bool exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class CheckpointTest : public ::testing::Test {
protected:
  void SetUp() override {
    root = test::makeTempDir("ckpt");
    plan = loadSpec(test::trainingPlanSpec({2, 4, 16, 8, true, 2}));
  }
  void TearDown() override { test::removeTree(root); }

  /// Trains `e` for `steps` steps from `pos` on random tokens of seed 3.
  void train(Executor &e, TrainingPosition &pos, int steps) {
    TokenLoader loader("", 2, 4, 16, pos.seed);
    for (int s = 0; s < steps; ++s) {
      e.trainStep(loader, pos.dataPosition, 2);
      pos.step += 1;
      pos.dataPosition += 2;
    }
  }

  std::string loadError(const std::string &dir) {
    Executor e(plan);
    e.initWeights(99);
    std::map<std::string, std::vector<uint8_t>> before = test::stateOf(e);
    try {
      loadCheckpoint(resolveCheckpoint(dir), e);
    } catch (const Error &error) {
      // Nothing was bound: the executor still holds its own weights.
      EXPECT_EQ(test::stateOf(e), before) << "a rejected checkpoint changed the executor";
      return error.what();
    }
    return "";
  }

  /// A copy of step directory `from` as `root/<name>`, for corrupting.
  std::string copyCheckpoint(const std::string &from, const std::string &name) {
    std::string to = root + "/" + name;
    ::mkdir(to.c_str(), 0755);
    for (const char *file :
         {kCheckpointModelFile, kCheckpointOptimizerFile, kCheckpointManifestFile})
      writeText(to + "/" + file, test::readText(from + "/" + file));
    return to;
  }

  std::string root;
  LoadedPlan plan;
};

TEST_F(CheckpointTest, WritesTheLayout) {
  Executor e(plan);
  e.initWeights(3);
  TrainingPosition pos{0, 0, 3};
  train(e, pos, 3);
  std::string dir = saveCheckpoint(root, e, pos);
  EXPECT_EQ(dir, root + "/step-00000003");
  EXPECT_EQ(checkpointDirName(123456789), "step-123456789");
  EXPECT_EQ(test::readText(root + "/latest"), "step-00000003\n");
  EXPECT_FALSE(exists(root + "/latest.tmp"));
  EXPECT_FALSE(exists(root + "/.tmp-step-00000003-" + std::to_string(::getpid())));

  Checkpoint model = Checkpoint::open(dir + "/model.safetensors");
  ASSERT_EQ(model.tensors().size(), 2u);
  EXPECT_EQ(model.tensors()[0].name, "lm_head.weight");
  EXPECT_EQ(model.tensors()[0].dtype, "BF16");
  EXPECT_EQ(model.tensors()[1].name, "model.embed_tokens.weight");
  Checkpoint optimizer = Checkpoint::open(dir + "/optimizer.safetensors");
  EXPECT_EQ(optimizer.tensors().size(), 7u); // step, 2 x (m, v, master)
  const SafetensorsEntry *step = optimizer.find("optimizer.step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->dtype, "I64");
  int64_t stepValue = 0;
  optimizer.read(*step, {&stepValue, DType::I64, {}});
  EXPECT_EQ(stepValue, 3);

  JsonValue manifest = parseJson(test::readText(dir + "/manifest.json"), "manifest");
  EXPECT_EQ(manifest.find("format")->stringValue(), "bonsai-checkpoint");
  EXPECT_EQ(manifest.find("format_version")->unsignedValue(), 1u);
  EXPECT_EQ(manifest.find("model")->stringValue(), "train");
  EXPECT_EQ(manifest.find("step")->unsignedValue(), 3u);
  EXPECT_EQ(manifest.find("data_position")->unsignedValue(), 6u);
  EXPECT_EQ(manifest.find("seed")->unsignedValue(), 3u);
  const JsonValue *files = manifest.find("files");
  ASSERT_NE(files, nullptr);
  const JsonValue *modelEntry = files->find("model.safetensors");
  ASSERT_NE(modelEntry, nullptr);
  uint64_t size = 0;
  EXPECT_EQ(modelEntry->find("sha256")->stringValue(),
            sha256File(dir + "/model.safetensors", &size));
  EXPECT_EQ(modelEntry->find("size")->unsignedValue(), size);

  CheckpointManifest verified = verifyCheckpoint(dir);
  EXPECT_EQ(verified.position.step, 3u);
  EXPECT_EQ(verified.position.dataPosition, 6u);
  EXPECT_EQ(verified.files.size(), 2u);
}

TEST_F(CheckpointTest, LoadRestoresEveryByte) {
  Executor a(plan);
  a.initWeights(3);
  TrainingPosition pos{0, 0, 3};
  train(a, pos, 4);
  saveCheckpoint(root, a, pos);

  Executor b(plan);
  CheckpointManifest m = loadCheckpoint(resolveCheckpoint(root), b);
  EXPECT_EQ(m.position.step, 4u);
  EXPECT_EQ(m.position.dataPosition, 8u);
  EXPECT_EQ(m.position.seed, 3u);
  EXPECT_EQ(test::stateOf(b), test::stateOf(a));
  // The accumulators start at zero, as in the uninterrupted run.
  for (uint32_t i = 0; i < plan.tensors.size(); ++i)
    if (plan.tensors[i].role == TensorRole::Gradient && plan.tensors[i].init == TensorInit::Zeros) {
      const auto *p = static_cast<const uint8_t *>(b.view(i).data);
      EXPECT_TRUE(std::all_of(p, p + plan.tensors[i].bytes, [](uint8_t x) { return x == 0; }));
    }
}

// The spike rule's windows (bonsai-run --spike-zscore) come back bit for bit, the smallest
// subnormal and values that need all 9 digits among them; a manifest whose window is not two
// arrays of finite numbers is refused, naming the member.
TEST_F(CheckpointTest, SpikeWindowsComeBackBitForBit) {
  Executor e(plan);
  e.initWeights(3);
  TrainingPosition pos{0, 0, 3};
  train(e, pos, 2);
  pos.spikeLosses = {2.77258873f, 0.1f, 1.0f / 3.0f, std::numeric_limits<float>::denorm_min(),
                     std::numeric_limits<float>::max()};
  pos.spikeGradNorms = {0.858935058f, 12345.6789f};
  std::string dir = saveCheckpoint(root, e, pos);
  CheckpointManifest m = verifyCheckpoint(dir);
  auto bits = [](const std::vector<float> &v) {
    std::vector<uint32_t> out(v.size());
    std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
    return out;
  };
  EXPECT_EQ(bits(m.position.spikeLosses), bits(pos.spikeLosses));
  EXPECT_EQ(bits(m.position.spikeGradNorms), bits(pos.spikeGradNorms));
  // Without windows the member is absent (the manifest of a run without the rule).
  pos.spikeLosses.clear();
  pos.spikeGradNorms.clear();
  train(e, pos, 1);
  std::string plain = saveCheckpoint(root, e, pos);
  EXPECT_EQ(test::readText(plain + "/manifest.json").find("spike_window"), std::string::npos);
  EXPECT_TRUE(verifyCheckpoint(plain).position.spikeLosses.empty());

  std::string text = test::readText(dir + "/manifest.json");
  size_t from = text.find("\"spike_window\"");
  ASSERT_NE(from, std::string::npos) << text;
  size_t to = text.find('\n', from);
  for (const auto &[window, message] : std::vector<std::pair<std::string, std::string>>{
           {"[1, 2]", "\"spike_window\" is not an object of \"loss\" and \"grad_norm\""},
           {"{\"loss\": [1]}", "\"spike_window\" is not an object"},
           {"{\"loss\": [1], \"grad_norm\": 3}", "\"grad_norm\" is not an array"},
           {"{\"loss\": [1, \"x\"], \"grad_norm\": []}", "other than a finite f32 number"},
           {"{\"loss\": [1e39], \"grad_norm\": []}", "other than a finite f32 number"}}) {
    std::string edited = text;
    edited.replace(from, to - from, "\"spike_window\": " + window + ",");
    try {
      parseCheckpointManifest(edited, "checkpoint 'x'", "x/manifest.json");
      ADD_FAILURE() << "accepted " << window;
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos)
          << window << ": " << error.what();
    }
  }
}

// The manifest of a sharded checkpoint (version 3, written by several ranks) reads back as
// written, and each malformed member of its own is named.
TEST(CheckpointManifestTest, ShardedManifestRoundTripsAndNamesItsFaults) {
  CheckpointManifest m;
  m.formatVersion = kShardedCheckpointFormatVersion;
  m.model = "tiny";
  m.position = {10, 40, 7};
  m.ranks = 4;
  m.shardedTensors = {{"a.weight", {8, 4}}, {"a.weight.exp_avg", {8, 4}}};
  for (uint32_t r = 0; r < 4; ++r)
    for (const char *file : {kCheckpointModelFile, kCheckpointOptimizerFile})
      m.files.push_back({checkpointRankFile(file, r, 4), 100 + r, std::string(64, 'c')});
  EXPECT_EQ(checkpointRankFile(kCheckpointModelFile, 1, 4),
            "model.rank-00001-of-00004.safetensors");
  std::string text = renderCheckpointManifest(m);
  CheckpointManifest back = parseCheckpointManifest(text, "checkpoint 'x'", "x/manifest.json");
  EXPECT_EQ(back.ranks, 4u);
  EXPECT_EQ(back.shardedTensors, m.shardedTensors);
  EXPECT_EQ(back.files.size(), 8u);
  EXPECT_TRUE(back.baseSha256.empty());
  // An adapter checkpoint of several ranks: version 3 with the base's identity.
  m.baseSha256 = std::string(64, 'd');
  m.baseTensors = 2;
  m.baseBytes = 64;
  EXPECT_EQ(parseCheckpointManifest(renderCheckpointManifest(m), "c", "p").baseSha256,
            m.baseSha256);

  auto expectError = [](const CheckpointManifest &bad, const std::string &message) {
    try {
      parseCheckpointManifest(renderCheckpointManifest(bad), "checkpoint 'x'", "x/manifest.json");
      ADD_FAILURE() << "accepted a manifest that should fail with: " << message;
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
    }
  };
  CheckpointManifest bad = m;
  bad.ranks = 1;
  expectError(bad, "\"ranks\" is 1, expected 2 to 99999");
  bad = m;
  bad.shardedTensors[0].second = {3, 5};
  expectError(bad, "\"sharded_tensors\" \"a.weight\" is not a shape of positive dimensions "
                   "whose element count the 4 ranks divide");
  bad = m;
  std::swap(bad.shardedTensors[0], bad.shardedTensors[1]);
  expectError(bad, "\"sharded_tensors\" is not sorted by name");
  bad = m;
  bad.files.pop_back();
  expectError(bad, "does not list 'optimizer.rank-00003-of-00004.safetensors'");
  // A single-rank version has no "ranks".
  std::string v1 = renderCheckpointManifest(CheckpointManifest{});
  v1.insert(v1.find("\"model\""), "\"ranks\": 2,\n  ");
  try {
    parseCheckpointManifest(v1, "checkpoint 'x'", "x/manifest.json");
    ADD_FAILURE() << "accepted \"ranks\" in version 1";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("has \"ranks\" but format version 1"),
              std::string::npos)
        << error.what();
  }
}

TEST_F(CheckpointTest, ASecondSaveLeavesTheFirstUntouched) {
  Executor e(plan);
  e.initWeights(3);
  TrainingPosition pos{0, 0, 3};
  train(e, pos, 2);
  std::string first = saveCheckpoint(root, e, pos);
  std::string model = test::readText(first + "/model.safetensors");
  std::string manifest = test::readText(first + "/manifest.json");
  train(e, pos, 2);
  std::string second = saveCheckpoint(root, e, pos);
  EXPECT_EQ(second, root + "/step-00000004");
  EXPECT_EQ(test::readText(first + "/model.safetensors"), model);
  EXPECT_EQ(test::readText(first + "/manifest.json"), manifest);
  EXPECT_EQ(test::readText(root + "/latest"), "step-00000004\n");
  EXPECT_EQ(resolveCheckpoint(root), second);
  EXPECT_EQ(resolveCheckpoint(first), first);
  // The latest checkpoint is never overwritten.
  try {
    saveCheckpoint(root, e, pos);
    FAIL() << "the latest checkpoint was overwritten";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("already exists and is the latest checkpoint"),
              std::string::npos)
        << error.what();
  }
  EXPECT_NO_THROW(verifyCheckpoint(second));
}

TEST_F(CheckpointTest, AKilledWriterLeavesThePreviousCheckpoint) {
  Executor e(plan);
  e.initWeights(3);
  TrainingPosition pos{0, 0, 3};
  train(e, pos, 2);
  std::string previous = saveCheckpoint(root, e, pos);
  std::map<std::string, std::vector<uint8_t>> previousState = test::stateOf(e);
  train(e, pos, 2);

  for (const char *point : {"after-model", "after-optimizer", "before-rename", "before-latest"}) {
    SCOPED_TRACE(point);
    std::fflush(nullptr);
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::setenv(kCheckpointCrashVariable, point, 1);
      try {
        saveCheckpoint(root, e, pos);
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0); // the crash point was not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 99) << "the writer did not stop at " << point;

    EXPECT_EQ(test::readText(root + "/latest"), "step-00000002\n");
    EXPECT_EQ(resolveCheckpoint(root), previous);
    Executor restored(plan);
    CheckpointManifest m = loadCheckpoint(resolveCheckpoint(root), restored);
    EXPECT_EQ(m.position.step, 2u);
    EXPECT_EQ(test::stateOf(restored), previousState);
    // Only a save that got past its rename leaves the new directory, complete but unnamed.
    bool renamed = std::string(point) == "before-latest";
    EXPECT_EQ(exists(root + "/step-00000004"), renamed);
    if (renamed)
      EXPECT_NO_THROW(verifyCheckpoint(root + "/step-00000004"));
  }
  // A later save of the same step replaces the unnamed directory and becomes the latest.
  EXPECT_EQ(saveCheckpoint(root, e, pos), root + "/step-00000004");
  EXPECT_EQ(test::readText(root + "/latest"), "step-00000004\n");
  Executor restored(plan);
  loadCheckpoint(resolveCheckpoint(root), restored);
  EXPECT_EQ(test::stateOf(restored), test::stateOf(e));
}

TEST_F(CheckpointTest, CorruptionIsRejectedNamingTheFile) {
  Executor e(plan);
  e.initWeights(3);
  TrainingPosition pos{0, 0, 3};
  train(e, pos, 2);
  std::string good = saveCheckpoint(root, e, pos);
  ASSERT_EQ(loadError(good), "");

  auto expectRejected = [&](const std::string &dir, std::initializer_list<std::string> parts) {
    std::string message = loadError(dir);
    ASSERT_FALSE(message.empty()) << "a corrupt checkpoint loaded: " << dir;
    for (const std::string &part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  };

  // One flipped byte in the tensor data of each file.
  for (const char *file : {kCheckpointModelFile, kCheckpointOptimizerFile}) {
    std::string dir = copyCheckpoint(good, std::string("flip-") + file);
    std::string bytes = test::readText(dir + "/" + file);
    bytes[bytes.size() - 3] ^= 0x10;
    writeText(dir + "/" + file, bytes);
    expectRejected(dir, {dir + "/" + file + "' fails its SHA-256 check", "the file is corrupt"});
  }
  // A truncated file.
  std::string dir = copyCheckpoint(good, "truncated");
  std::string bytes = test::readText(dir + "/optimizer.safetensors");
  writeText(dir + "/optimizer.safetensors", bytes.substr(0, bytes.size() / 2));
  expectRejected(dir, {dir + "/optimizer.safetensors' is " + std::to_string(bytes.size() / 2) +
                           " bytes, but the manifest says " + std::to_string(bytes.size()),
                       "truncated"});
  // A missing file.
  dir = copyCheckpoint(good, "missing");
  std::remove((dir + "/model.safetensors").c_str());
  expectRejected(dir, {dir + "/model.safetensors' is missing"});
  // A missing manifest.
  dir = copyCheckpoint(good, "no-manifest");
  std::remove((dir + "/manifest.json").c_str());
  expectRejected(dir, {dir + "/manifest.json' is missing"});
  // An edited manifest: the step, then a file's checksum made to match a corrupted file.
  std::string manifest = test::readText(good + "/manifest.json");
  dir = copyCheckpoint(good, "edited-step");
  std::string edited = manifest;
  edited.replace(edited.find("\"step\": 2"), 9, "\"step\": 3");
  writeText(dir + "/manifest.json", edited);
  expectRejected(dir, {dir + "/manifest.json' fails its own checksum", "edited or corrupted"});
  dir = copyCheckpoint(good, "edited-sha");
  std::string model = test::readText(dir + "/model.safetensors");
  model[model.size() - 1] ^= 1;
  writeText(dir + "/model.safetensors", model);
  edited = manifest;
  size_t at = edited.find("\"sha256\": \"") + 11;
  edited.replace(at, 64, sha256Hex(model));
  writeText(dir + "/manifest.json", edited);
  expectRejected(dir, {dir + "/manifest.json' fails its own checksum"});
  // A manifest that is not JSON, or not this format.
  dir = copyCheckpoint(good, "garbage");
  writeText(dir + "/manifest.json", manifest.substr(0, manifest.size() / 2));
  expectRejected(dir, {dir + "/manifest.json'", "invalid JSON"});
  dir = copyCheckpoint(good, "version");
  edited = manifest;
  edited.replace(edited.find("\"format_version\": 1"), 19, "\"format_version\": 7");
  writeText(dir + "/manifest.json", edited);
  expectRejected(dir, {dir + "/manifest.json' has format version 7"});
  // A `latest` that names nothing, or something outside the root.
  std::string other = test::makeTempDir("ckpt-latest");
  writeText(other + "/latest", "step-00000099\n");
  expectRejected(other, {other + "/latest' names 'step-00000099', which does not exist"});
  writeText(other + "/latest", "../elsewhere\n");
  expectRejected(other, {other + "/latest' does not name a checkpoint directory inside it"});
  test::removeTree(other);
  expectRejected(root + "/nowhere", {"checkpoint '" + root + "/nowhere' is not a directory"});
}

TEST_F(CheckpointTest, AnotherPlanIsListedNameByName) {
  Executor e(plan);
  e.initWeights(3);
  TrainingPosition pos{0, 0, 3};
  train(e, pos, 1);
  std::string dir = saveCheckpoint(root, e, pos);
  // The same model in f32 without master weights: dtypes differ and the masters are extra.
  LoadedPlan f32 = loadSpec(test::trainingPlanSpec());
  Executor other(f32);
  try {
    loadCheckpoint(dir, other);
    FAIL() << "a checkpoint of another plan loaded";
  } catch (const Error &error) {
    std::string message = error.what();
    EXPECT_NE(message.find("checkpoint '" + dir +
                           "' does not match plan 'train.plan': "
                           "model.safetensors: 2 mismatched: model.embed_tokens.weight (plan "
                           "[16, 8] f32, checkpoint [16, 8] BF16), lm_head.weight (plan [16, 8] "
                           "f32, checkpoint [16, 8] BF16); optimizer.safetensors"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("optimizer.safetensors: 2 extra: optimizer.master.lm_head.weight, "
                           "optimizer.master.model.embed_tokens.weight"),
              std::string::npos)
        << message;
  }
}

TEST_F(CheckpointTest, UnclearedAccumulatorsAreNotCheckpointed) {
  test::TrainingTensors t;
  LoadedPlan p = loadSpec(test::trainingPlanSpec({}, &t));
  Executor e(p);
  e.initWeights(3);
  static_cast<float *>(e.view(t.gradHead).data)[5] = 1.0f;
  try {
    saveCheckpoint(root, e, {1, 1, 3});
    FAIL() << "a checkpoint missed the accumulator";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what())
                  .find("gradient accumulator tensor " + std::to_string(t.gradHead) +
                        " 'lm_head.weight' is not zero between steps"),
              std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(exists(root + "/step-00000001"));
  EXPECT_FALSE(exists(root + "/latest"));
}

TEST_F(CheckpointTest, Fp8StateIsOptimizerState) {
  // docs/fp8.md: the scales and amax histories ("<weight>.fp8") are saved and restored with
  // the optimizer's state, so a resumed FP8 run continues bit for bit.
  LoadedPlan fp8 = loadSpec(test::fp8TrainingPlanSpec());
  Executor a(fp8);
  a.initWeights(3);
  TokenLoader loader("", 2, 8, 16, 3);
  for (uint64_t s = 0; s < 3; ++s)
    a.trainStep(loader, s, 1);
  std::string dir = saveCheckpoint(root, a, TrainingPosition{3, 3, 3});
  EXPECT_NE(test::readText(dir + "/" + kCheckpointOptimizerFile).find("lm_head.weight.fp8"),
            std::string::npos);
  std::map<std::string, std::vector<uint8_t>> saved = test::stateOf(a);
  const std::vector<uint8_t> &state = saved.at("state:lm_head.weight.fp8");
  EXPECT_TRUE(std::any_of(state.begin(), state.end(), [](uint8_t b) { return b != 0; }));

  Executor b(fp8);
  loadCheckpoint(resolveCheckpoint(root), b);
  EXPECT_EQ(test::stateOf(b), saved);
  StepResult ra = a.trainStep(loader, 3, 1), rb = b.trainStep(loader, 3, 1);
  EXPECT_EQ(ra.loss, rb.loss);
  EXPECT_EQ(test::stateOf(b), test::stateOf(a));
}

TEST_F(CheckpointTest, GradientDumpWritesTheAccumulators) {
  test::TrainingTensors t;
  LoadedPlan p = loadSpec(test::trainingPlanSpec({}, &t));
  Executor e(p);
  e.initWeights(3);
  TokenLoader loader("", 2, 4, 16, 3);
  // Two micro-batches: the accumulator holds their sum, the step tensor only the second.
  e.forwardBackward(loader.batch(0), 1.0f);
  e.forwardBackward(loader.batch(1), 1.0f);
  std::string path = root + "/grads.safetensors";
  // The two parameters' gradients, logits.grad (and its 3-d view), h.grad.
  EXPECT_EQ(writeGradients(path, e), 5u);
  Checkpoint grads = Checkpoint::open(path);
  ASSERT_NE(grads.find("lm_head.weight"), nullptr);
  ASSERT_NE(grads.find("logits.grad"), nullptr);
  std::vector<float> head(16 * 8);
  grads.read(*grads.find("lm_head.weight"), {head.data(), DType::F32, {16, 8}});
  EXPECT_EQ(std::memcmp(head.data(), e.view(t.gradHead).data, head.size() * 4), 0);
  EXPECT_NE(std::memcmp(head.data(), e.view(t.stepGradHead).data, head.size() * 4), 0);

  LoadedPlan forward = loadSpec(test::smallPlanSpec());
  Executor f(forward);
  EXPECT_THROW(writeGradients(path, f), Error);
}

/// The test plan as an adapter plan: its first parameter frozen (the base) and one adapter
/// recorded, which is what makes checkpoints leave the frozen parameters out.
LoadedPlan adapterPlan(LoadedPlan plan, uint32_t *frozen) {
  for (uint32_t i = 0; i < plan.tensors.size(); ++i)
    if (plan.tensors[i].role == TensorRole::Parameter) {
      plan.tensors[i].trainable = false;
      *frozen = i;
      break;
    }
  AdapterInfo a;
  a.base = *frozen;
  a.rank = 1;
  a.alpha = 1;
  a.module = "m";
  plan.adapters.push_back(a);
  return plan;
}

TEST_F(CheckpointTest, AdapterCheckpointsLeaveTheBaseOutAndCheckIt) {
  uint32_t frozen = 0;
  LoadedPlan adapted = adapterPlan(plan, &frozen);
  Executor e(adapted);
  e.initWeights(3);
  // The trained state: trainable parameters unlike their init.
  for (uint32_t i = 0; i < adapted.tensors.size(); ++i)
    if (adapted.tensors[i].role == TensorRole::Parameter && adapted.tensors[i].trainable) {
      std::vector<float> values(size_t(adapted.tensors[i].numel), 0.25f + float(i));
      storeF32(values.data(), e.view(i));
      e.markWritten(i);
    }
  TrainingPosition pos{0, 0, 3};
  ASSERT_TRUE(writesAdapterCheckpoints(e));
  BaseIdentity id = baseIdentity(e);
  EXPECT_EQ(id.tensors, 1u);
  EXPECT_EQ(id.bytes, adapted.tensors[frozen].bytes);
  std::string dir = saveCheckpoint(root, e, pos);

  // model.safetensors holds every parameter but the frozen one; the manifest names the base.
  Checkpoint model = Checkpoint::open(dir + "/model.safetensors");
  EXPECT_EQ(model.find(adapted.tensors[frozen].name), nullptr);
  size_t trainable = 0;
  for (const TensorInfo &t : adapted.tensors)
    trainable += t.role == TensorRole::Parameter && t.trainable;
  EXPECT_EQ(model.tensors().size(), trainable);
  CheckpointManifest m = verifyCheckpoint(dir);
  EXPECT_EQ(m.formatVersion, kAdapterCheckpointFormatVersion);
  EXPECT_EQ(m.baseSha256, id.sha256);
  EXPECT_EQ(m.baseTensors, 1u);
  CheckpointSize size = checkpointSize(adapted);
  EXPECT_EQ(size.frozenTensors, 1u);
  EXPECT_EQ(size.frozenBytes, id.bytes);
  EXPECT_EQ(size.modelTensors, trainable);

  // The same base (the same init seed): every byte comes back.
  Executor same(adapted);
  same.initWeights(3);
  loadCheckpoint(dir, same);
  EXPECT_EQ(test::stateOf(same), test::stateOf(e));

  // Another base: refused, naming both identities.
  Executor other(adapted);
  other.initWeights(4);
  try {
    loadCheckpoint(dir, other);
    FAIL() << "a checkpoint was resumed on another base";
  } catch (const Error &error) {
    std::string what = error.what();
    EXPECT_NE(what.find("was trained on another base model"), std::string::npos) << what;
    EXPECT_NE(what.find(id.sha256), std::string::npos) << what;
  }

  // A full plan does not take an adapter checkpoint; an edited base identity fails the checksum.
  Executor full(plan);
  full.initWeights(3);
  EXPECT_THROW(loadCheckpoint(dir, full), Error);
  std::string edited = copyCheckpoint(dir, "edited");
  std::string manifest = test::readText(edited + "/manifest.json");
  manifest.replace(manifest.find(id.sha256), 4, "0000");
  writeText(edited + "/manifest.json", manifest);
  EXPECT_NE(loadError(edited).find("fails its own checksum"), std::string::npos);
}

TEST_F(CheckpointTest, KeepLastRemovesTheOldestButNeverTheLatest) {
  Executor e(plan);
  e.initWeights(3);
  for (uint64_t step : {1, 2, 3, 10})
    saveCheckpoint(root, e, {step, step, 3});
  ::mkdir((root + "/step-notanumber").c_str(), 0755);
  std::vector<std::string> removed = pruneCheckpoints(root, 2);
  EXPECT_EQ(removed, (std::vector<std::string>{root + "/step-00000002", root + "/step-00000001"}));
  auto isDirectory = [](const std::string &path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  };
  EXPECT_TRUE(isDirectory(root + "/step-00000010"));
  EXPECT_TRUE(isDirectory(root + "/step-00000003"));
  EXPECT_FALSE(isDirectory(root + "/step-00000002"));
  EXPECT_TRUE(isDirectory(root + "/step-notanumber")); // not a name saveCheckpoint makes
  // `latest` is kept even when it is not among the newest (a later step left by another run).
  writeText(root + "/latest", "step-00000003\n");
  removed = pruneCheckpoints(root, 1);
  EXPECT_TRUE(removed.empty());
  EXPECT_EQ(pruneCheckpoints(root, 5).size(), 0u);
}

} // namespace
} // namespace bonsai::rt
