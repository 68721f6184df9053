//===- SafetensorsTest.cpp - Safetensors reading, writing and binding -----===//
//
// Round trips through the writer, hostile files (every truncation, random byte flips, planted
// header mistakes), sharded checkpoints, and binding a checkpoint to a plan with its
// all-mismatches-in-one-message error and its dtype conversions.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Safetensors.h"

#include "TestPlans.h"
#include "bonsai/runtime/Random.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

namespace bonsai::rt {
namespace {

std::vector<uint8_t> readAll(const std::string &path) { return readFileBytes(path); }

/// A safetensors file with the given header text and data bytes.
std::vector<uint8_t> rawFile(const std::string &header, size_t dataBytes) {
  std::vector<uint8_t> out(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[size_t(i)] = uint8_t(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < dataBytes; ++i)
    out.push_back(uint8_t(i * 37));
  return out;
}

std::string openError(const std::string &path) {
  try {
    Checkpoint::open(path);
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

/// Opens `path` and reads every tensor the runtime has a type for; rt::Error is the only
/// acceptable failure.
void openAndReadAll(const std::string &path) {
  Checkpoint ckpt = Checkpoint::open(path);
  for (const SafetensorsEntry &e : ckpt.tensors()) {
    if (!e.runtimeDType)
      continue;
    std::vector<uint64_t> storage(size_t(e.bytes / 8 + 1));
    TensorView view;
    view.data = storage.data();
    view.dtype = *e.runtimeDType;
    view.shape = e.shape;
    ckpt.read(e, view);
  }
}

class SafetensorsTest : public ::testing::Test {
protected:
  void TearDown() override {
    for (const std::string &p : cleanup)
      std::remove(p.c_str());
  }
  std::string path(const std::string &name) {
    cleanup.push_back(test::tempPath(name));
    return cleanup.back();
  }
  std::vector<std::string> cleanup;

  // A file of three tensors of three dtypes, written by the writer under test.
  std::string writeSample() {
    std::string p = path("sample.safetensors");
    std::vector<SafetensorsTensor> tensors = {
        {"a.weight", DType::F32, {2, 3}, f32.data()},
        {"b", DType::BF16, {4}, bf16.data()},
        {"c.ids", DType::I64, {2}, i64.data()},
    };
    writeSafetensors(p, tensors, {{"format", "pt"}, {"note", "quote \" and \\"}});
    return p;
  }
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.1f, 1e-8f, -7.0f};
  std::vector<uint16_t> bf16 = {f32ToBf16(1.0f), f32ToBf16(-0.5f), f32ToBf16(3.140625f),
                                f32ToBf16(100.0f)};
  std::vector<int64_t> i64 = {7, -9};
};

TEST_F(SafetensorsTest, RoundTrip) {
  std::string p = writeSample();
  std::vector<uint8_t> bytes = readAll(p);
  uint64_t headerBytes = 0;
  std::memcpy(&headerBytes, bytes.data(), 8);
  EXPECT_EQ(headerBytes % 8, 0u) << "data section must start 8-byte aligned";

  Checkpoint ckpt = Checkpoint::open(p);
  ASSERT_EQ(ckpt.tensors().size(), 3u);
  EXPECT_EQ(ckpt.metadata().at("format"), "pt");
  EXPECT_EQ(ckpt.metadata().at("note"), "quote \" and \\");
  const SafetensorsEntry *a = ckpt.find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "F32");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->bytes, 24u);
  EXPECT_EQ(ckpt.find("nope"), nullptr);

  std::vector<float> af(6);
  ckpt.read(*a, {af.data(), DType::F32, {2, 3}});
  EXPECT_EQ(af, f32);
  std::vector<uint16_t> b(4);
  ckpt.read(*ckpt.find("b"), {b.data(), DType::BF16, {4}});
  EXPECT_EQ(b, bf16);
  std::vector<int64_t> c(2);
  ckpt.read(*ckpt.find("c.ids"), {c.data(), DType::I64, {2}});
  EXPECT_EQ(c, i64);

  // bf16 widens exactly to f32; f32 narrows to bf16 with round-to-nearest-even.
  std::vector<float> bAsF32(4);
  ckpt.read(*ckpt.find("b"), {bAsF32.data(), DType::F32, {4}});
  EXPECT_EQ(bAsF32, (std::vector<float>{1.0f, -0.5f, 3.140625f, 100.0f}));
  std::vector<uint16_t> aAsBf16(6);
  ckpt.read(*a, {aAsBf16.data(), DType::BF16, {2, 3}});
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(aAsBf16[i], f32ToBf16(f32[i]));
  // Integers do not convert to floats, and shapes must match.
  std::vector<float> cAsF32(2);
  EXPECT_THROW(ckpt.read(*ckpt.find("c.ids"), {cAsF32.data(), DType::F32, {2}}), Error);
  EXPECT_THROW(ckpt.read(*a, {af.data(), DType::F32, {3, 2}}), Error);
}

TEST_F(SafetensorsTest, EveryTruncationIsRejected) {
  std::vector<uint8_t> bytes = readAll(writeSample());
  std::string p = path("truncated.safetensors");
  for (size_t size = 0; size < bytes.size(); ++size) {
    test::writeFile(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + std::ptrdiff_t(size)));
    EXPECT_THROW(openAndReadAll(p), Error) << "prefix of " << size << " bytes was accepted";
  }
}

TEST_F(SafetensorsTest, RandomByteFlipsAreRejectedOrRead) {
  std::vector<uint8_t> bytes = readAll(writeSample());
  std::string p = path("flipped.safetensors");
  Rng rng(7);
  int rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<uint8_t> corrupt = bytes;
    // Flip inside the header most of the time: that is where the parser is exercised.
    uint64_t headerEnd = 8 + (bytes[0] | uint64_t(bytes[1]) << 8);
    size_t at = trial % 4 == 0 ? size_t(rng.below(bytes.size())) : size_t(rng.below(headerEnd));
    corrupt[at] ^= uint8_t(1 + rng.below(255));
    test::writeFile(p, corrupt);
    try {
      openAndReadAll(p);
    } catch (const Error &) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
}

TEST_F(SafetensorsTest, HeaderMistakesAreNamed) {
  struct Case {
    std::string header;
    size_t data;
    const char *message;
  } cases[] = {
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "outside the 4-byte data section"},
      {R"({"x":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype \"F31\""},
      {R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 12, "has 8 bytes of data, but [3] F32 needs 12"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap"},
      {R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "not a non-negative integer"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "data_offsets [8, 0]"},
      {R"({"x":{"dtype":"F32","shape":[2]}})", 8, "lacks \"data_offsets\""},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8, "unknown field \"extra\""},
      {R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, "needs more bytes than the file has"},
      {R"({"__metadata__":{"a":1}})", 0, "__metadata__ value of \"a\" is a number"},
      {R"([1,2])", 0, "header is a JSON array"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},})", 8, "invalid JSON at byte"},
  };
  std::string p = path("bad.safetensors");
  for (const Case &c : cases) {
    test::writeFile(p, rawFile(c.header, c.data));
    std::string message = openError(p);
    EXPECT_NE(message.find(c.message), std::string::npos)
        << "header " << c.header << "\n  got: " << message;
    EXPECT_NE(message.find(p), std::string::npos) << message;
  }
  std::vector<uint8_t> hugeLength = rawFile("{}", 0);
  hugeLength[7] = 0x7f;
  test::writeFile(p, hugeLength);
  EXPECT_NE(openError(p).find("exceeds the 2 bytes after it"), std::string::npos) << openError(p);
  test::writeFile(p, {1, 2, 3});
  EXPECT_NE(openError(p).find("too short"), std::string::npos);
  EXPECT_NE(openError(path("missing.safetensors")).find("cannot open"), std::string::npos);
  // Empty tensors and unsupported-but-valid dtypes are legal safetensors.
  test::writeFile(p, rawFile(R"({"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8));
  EXPECT_EQ(openError(p), "");
}

TEST_F(SafetensorsTest, ShardedIndex) {
  std::vector<float> w1 = {1, 2, 3, 4}, w2 = {5, 6};
  std::string shard1 = path("model-00001-of-00002.safetensors");
  std::string shard2 = path("model-00002-of-00002.safetensors");
  writeSafetensors(shard1, {{"layers.0.w", DType::F32, {2, 2}, w1.data()},
                            {"unlisted", DType::F32, {2}, w2.data()}});
  writeSafetensors(shard2, {{"layers.1.w", DType::F32, {2}, w2.data()}});
  auto base = [](const std::string &p) { return p.substr(p.find_last_of('/') + 1); };
  std::string index = path("model.safetensors.index.json");
  std::string json = R"({"metadata": {"total_size": 24}, "weight_map": {"layers.0.w": ")" +
                     base(shard1) + R"(", "layers.1.w": ")" + base(shard2) + "\"}}";
  test::writeFile(index, std::vector<uint8_t>(json.begin(), json.end()));

  Checkpoint ckpt = Checkpoint::open(index);
  ASSERT_EQ(ckpt.tensors().size(), 2u); // "unlisted" is not in the weight map
  EXPECT_EQ(ckpt.metadata().at("total_size"), "24");
  std::vector<float> out(2);
  ckpt.read(*ckpt.find("layers.1.w"), {out.data(), DType::F32, {2}});
  EXPECT_EQ(out, w2);
  EXPECT_EQ(ckpt.find("layers.0.w")->file, shard1);

  std::string bad = R"({"weight_map": {"layers.9.w": ")" + base(shard1) + "\"}}";
  test::writeFile(index, std::vector<uint8_t>(bad.begin(), bad.end()));
  EXPECT_NE(openError(index).find("puts 'layers.9.w' in"), std::string::npos) << openError(index);
  bad = R"({"weight_map": {"layers.0.w": "absent.safetensors"}})";
  test::writeFile(index, std::vector<uint8_t>(bad.begin(), bad.end()));
  EXPECT_NE(openError(index).find("absent.safetensors"), std::string::npos) << openError(index);
  bad = R"({"weight_map": {"layers.0.w": "/etc/passwd"}})";
  test::writeFile(index, std::vector<uint8_t>(bad.begin(), bad.end()));
  EXPECT_NE(openError(index).find("absolute path"), std::string::npos) << openError(index);
  bad = R"({"weights": {}})";
  test::writeFile(index, std::vector<uint8_t>(bad.begin(), bad.end()));
  EXPECT_NE(openError(index).find("no \"weight_map\""), std::string::npos) << openError(index);
}

/// Views over plain buffers, one per tensor of `plan`.
struct Arenas {
  explicit Arenas(const LoadedPlan &plan) {
    for (const ArenaInfo &a : plan.arenas)
      storage.emplace_back(size_t(a.size / 8 + 1), 0);
    for (const TensorInfo &t : plan.tensors)
      views.push_back({reinterpret_cast<char *>(storage[t.arena].data()) + t.offset, t.dtype, t.shape});
  }
  std::vector<std::vector<uint64_t>> storage;
  std::vector<TensorView> views;
};

TEST_F(SafetensorsTest, BindingListsEveryMismatch) {
  std::vector<uint8_t> bytes = test::buildPlan(test::smallPlanSpec());
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "small.plan");
  std::vector<float> embed(16 * 8, 0.5f), head(16 * 8, 0.25f), extra(3, 1.0f);
  std::string p = path("wrong.safetensors");
  writeSafetensors(p, {{"model.embed_tokens.weight", DType::F32, {16, 8}, embed.data()},
                       {"lm_head.weight", DType::F32, {8, 16}, head.data()},
                       {"model.layers.0.bias", DType::F32, {3}, extra.data()},
                       {"rotary.inv_freq", DType::F32, {3}, extra.data()}});
  Arenas arenas(plan);
  try {
    bindCheckpoint(plan, Checkpoint::open(p), arenas.views);
    FAIL() << "a mismatched checkpoint was bound";
  } catch (const Error &e) {
    std::string m = e.what();
    EXPECT_NE(m.find("weights '" + p + "' do not match plan 'small.plan'"), std::string::npos) << m;
    EXPECT_NE(m.find("1 missing: model.norm.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("2 extra: model.layers.0.bias, rotary.inv_freq"), std::string::npos) << m;
    EXPECT_NE(m.find("1 mis-shaped: lm_head.weight (plan [16, 8] f32, checkpoint [8, 16] F32)"),
              std::string::npos)
        << m;
  }
  // Nothing was written before the error.
  EXPECT_EQ(reinterpret_cast<float *>(arenas.views[0].data)[0], 0.0f);
}

TEST_F(SafetensorsTest, BindingConvertsFloatDTypes) {
  std::vector<uint8_t> bytes = test::buildPlan(test::smallPlanSpec());
  LoadedPlan plan = loadPlanBuffer(bytes.data(), bytes.size(), "small.plan");
  Rng rng(3);
  std::vector<uint16_t> embed(16 * 8), head(16 * 8);
  for (uint16_t &v : embed)
    v = f32ToBf16(float(rng.normal()));
  for (uint16_t &v : head)
    v = f32ToF16(float(rng.normal()));
  std::vector<float> norm(8, 1.0f);
  std::string p = path("mixed.safetensors");
  writeSafetensors(p, {{"model.embed_tokens.weight", DType::BF16, {16, 8}, embed.data()},
                       {"model.norm.weight", DType::F32, {8}, norm.data()},
                       {"lm_head.weight", DType::F16, {16, 8}, head.data()}});
  Arenas arenas(plan);
  bindCheckpoint(plan, Checkpoint::open(p), arenas.views);
  const float *e = static_cast<const float *>(arenas.views[0].data);
  const float *n = static_cast<const float *>(arenas.views[1].data);
  const float *h = static_cast<const float *>(arenas.views[2].data);
  for (size_t i = 0; i < embed.size(); ++i) {
    EXPECT_EQ(e[i], bf16ToF32(embed[i]));
    EXPECT_EQ(h[i], f16ToF32(head[i]));
  }
  EXPECT_EQ(n[7], 1.0f);
}

TEST_F(SafetensorsTest, WriterRejectsDuplicateNames) {
  std::vector<float> x(2);
  EXPECT_THROW(writeSafetensors(path("dup.safetensors"), {{"a", DType::F32, {2}, x.data()},
                                                          {"a", DType::F32, {2}, x.data()}}),
               Error);
}

TEST(HfIgnoredTensorsTest, TheListBonsaiImportHfAndWeightsShare) {
  EXPECT_NE(ignoredHfTensorReason("model.layers.0.self_attn.rotary_emb.inv_freq"), nullptr);
  EXPECT_NE(ignoredHfTensorReason("transformer.h.11.attn.bias"), nullptr);
  EXPECT_NE(ignoredHfTensorReason("h.0.attn.masked_bias"), nullptr);
  EXPECT_NE(ignoredHfTensorReason("lm_head.weight"), nullptr);
  // Real parameters, whose names end alike, are not on it.
  EXPECT_EQ(ignoredHfTensorReason("h.0.attn.c_attn.bias"), nullptr);
  EXPECT_EQ(ignoredHfTensorReason("model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_EQ(ignoredHfTensorReason("model.layers.0.self_attn.other"), nullptr);
  EXPECT_EQ(ignoredHfTensorReason("model.lm_head.weight.extra"), nullptr);
}

} // namespace
} // namespace bonsai::rt
