//===- SeedCorpus.cpp - Write the fuzzers' seed corpus from the test inputs ===//
//
// bonsai-fuzz-seeds DIR writes, under DIR/<fuzzer>/, valid inputs of each runtime fuzzer, made
// with the same builders and writers the unit tests use: the plans of test/runtime/TestPlans.h
// (inference, training, bf16 with fp32 masters, every kernel kind), safetensors files of every
// runtime dtype, a sharded checkpoint's index, version-1 and version-2 token files, and the
// manifest of a real checkpoint. Generated rather than committed, so the seeds follow the
// formats when they change. scripts/test-fuzz.sh runs it before the fuzzers.
//
//===----------------------------------------------------------------------===//

#include "../runtime/TestPlans.h"

#include "bonsai/runtime/Checkpoint.h"
#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Safetensors.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <sys/stat.h>

using namespace bonsai::rt;

namespace {

std::string subdir(const std::string &root, const std::string &name) {
  std::string dir = root + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void copyFile(const std::string &from, const std::string &to) {
  std::string bytes = test::readText(from);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out.flush())
    throw Error("cannot write '" + to + "'");
}

void writePlans(const std::string &dir) {
  test::TrainingDims bf16;
  bf16.bf16Master = true;
  test::TrainingDims accumulating;
  accumulating.microBatches = 2;
  const std::pair<const char *, test::PlanSpec> plans[] = {
      {"small.plan", test::smallPlanSpec()},
      {"training.plan", test::trainingPlanSpec()},
      {"training-bf16.plan", test::trainingPlanSpec(bf16)},
      {"training-microbatches.plan", test::trainingPlanSpec(accumulating)},
      {"training-fused.plan", test::fusedTrainingPlanSpec()},
      {"every-kind.plan", test::everyKindPlanSpec()},
      {"every-training-kind.plan", test::everyTrainingKindPlanSpec()},
      {"sharded.plan", test::shardedPlanSpec()},
      {"ring.plan", test::ringPlanSpec()},
  };
  for (const auto &[name, spec] : plans) {
    std::vector<uint8_t> bytes = test::buildPlan(spec);
    // Only plans the loader accepts are seeds: a seed that fails at once covers nothing.
    (void)loadPlanBuffer(bytes.data(), bytes.size(), name);
    test::writeFile(dir + "/" + name, bytes);
  }
}

void writeSafetensorsSeeds(const std::string &dir) {
  std::vector<float> f32 = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f, 8.0f};
  std::vector<uint16_t> half = {0x3c00, 0xc000, 0x3800, 0x4200};
  std::vector<uint8_t> fp8 = {0x38, 0xb8, 0x40, 0x00};
  std::vector<int64_t> i64 = {0, 1, -1, 1 << 20};
  std::vector<int32_t> i32 = {7, -7, 0, 65535};
  writeSafetensors(dir + "/every-dtype.safetensors",
                   {{"f32", DType::F32, {2, 3}, f32.data()},
                    {"f16", DType::F16, {4}, half.data()},
                    {"bf16", DType::BF16, {2, 2}, half.data()},
                    {"e4m3", DType::F8E4M3FN, {4}, fp8.data()},
                    {"e5m2", DType::F8E5M2, {2, 2}, fp8.data()},
                    {"i32", DType::I32, {4}, i32.data()},
                    {"i64", DType::I64, {2, 2}, i64.data()},
                    {"empty", DType::F32, {0, 3}, nullptr},
                    {"scalar", DType::F32, {}, f32.data()}},
                   {{"format", "pt"}, {"source", "bonsai-fuzz-seeds"}});
  writeSafetensors(dir + "/empty.safetensors", {});
}

void writeIndexSeed(const std::string &dir) {
  // The shards SafetensorsIndexFuzzer writes beside each input.
  std::ofstream out(dir + "/model.safetensors.index.json", std::ios::trunc);
  out << "{\n  \"metadata\": {\"total_size\": 48, \"format\": \"pt\"},\n"
         "  \"weight_map\": {\n"
         "    \"lm_head.weight\": \"model-00002-of-00002.safetensors\",\n"
         "    \"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\",\n"
         "    \"model.layers.0.input_layernorm.weight\": \"model-00002-of-00002.safetensors\",\n"
         "    \"model.norm.weight\": \"model-00001-of-00002.safetensors\"\n"
         "  }\n}\n";
}

void writeTokenSeeds(const std::string &dir) {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 40; ++i)
    tokens.push_back((i * 7919u) % 300u);
  writeTokenFile(dir + "/v1-u16.bin", tokens, 2);
  writeTokenFile(dir + "/v1-u32.bin", tokens, 4);
  TokenDocuments docs;
  docs.header.bytesPerToken = 2;
  docs.header.vocabSize = 300;
  docs.header.padId = 0;
  docs.header.fingerprint = 0x0123456789abcdefull;
  docs.tokens = tokens;
  docs.documentEnds = {5, 17, 18, 33, 40};
  for (size_t i = 0; i < tokens.size(); ++i)
    docs.mask.push_back(i % 3 != 0);
  writeTokenFileV2(dir + "/v2-u16.bin", docs);
  docs.header.bytesPerToken = 4;
  docs.header.vocabSize = 100000;
  docs.documentEnds = {40};
  writeTokenFileV2(dir + "/v2-u32-one-document.bin", docs);
}

void writeManifestSeed(const std::string &dir, const std::string &scratch) {
  std::vector<uint8_t> bytes = test::buildPlan(test::trainingPlanSpec());
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "training.plan");
  Executor executor(plan);
  executor.initWeights(3);
  std::string saved = saveCheckpoint(scratch, executor, TrainingPosition{3, 6, 3});
  copyFile(saved + "/" + kCheckpointManifestFile, dir + "/manifest.json");
  // A sharded adapter checkpoint's manifest (format version 3): what a run of several ranks
  // writes, with the members a single-rank run does not.
  CheckpointManifest sharded = verifyCheckpoint(saved);
  sharded.formatVersion = kShardedCheckpointFormatVersion;
  sharded.ranks = 2;
  sharded.shardedTensors = {{"layers.0.w", {4, 8}}, {"layers.0.w.exp_avg", {4, 8}}};
  sharded.baseSha256 = std::string(64, 'a');
  sharded.baseTensors = 3;
  sharded.baseBytes = 96;
  sharded.files.clear();
  for (uint32_t r = 0; r < 2; ++r)
    for (const char *file : {kCheckpointModelFile, kCheckpointOptimizerFile})
      sharded.files.push_back({checkpointRankFile(file, r, 2), 64, std::string(64, 'b')});
  std::ofstream(dir + "/manifest-sharded.json") << renderCheckpointManifest(sharded);
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::cerr << "usage: bonsai-fuzz-seeds DIR\n";
    return 2;
  }
  std::string root = argv[1];
  ::mkdir(root.c_str(), 0755);
  std::string scratch = test::makeTempDir("fuzz-seeds");
  try {
    writePlans(subdir(root, "plan"));
    writeSafetensorsSeeds(subdir(root, "safetensors"));
    writeIndexSeed(subdir(root, "safetensors-index"));
    writeTokenSeeds(subdir(root, "token-file"));
    writeManifestSeed(subdir(root, "checkpoint-manifest"), scratch);
  } catch (const Error &e) {
    test::removeTree(scratch);
    std::cerr << "bonsai-fuzz-seeds: error: " << e.what() << "\n";
    return 1;
  }
  test::removeTree(scratch);
  return 0;
}
