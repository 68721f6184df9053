//===- DataTest.cpp - Token files, batch windows and random tokens --------===//
//
// The window formula, inputs and labels shifted by one, both token widths, both input dtypes,
// determinism of random tokens, and every malformed token file the loader must refuse.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Data.h"

#include "TestPlans.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

namespace bonsai::rt {
namespace {

class DataTest : public ::testing::Test {
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
};

std::vector<uint32_t> iota(size_t n, uint32_t mod) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = uint32_t(i % mod);
  return v;
}

std::string loaderError(const std::string &path, int64_t b, int64_t t, int64_t vocab,
                        uint64_t step = 0) {
  try {
    TokenLoader loader(path, b, t, vocab, 0);
    loader.batch(step);
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

TEST_F(DataTest, WindowsFollowTheFormula) {
  for (uint32_t width : {2u, 4u}) {
    std::string p = path("tokens" + std::to_string(width) + ".bin");
    const uint64_t count = 50;
    writeTokenFile(p, iota(count, 1000), width);
    TokenFile file(p);
    EXPECT_EQ(file.count(), count);
    EXPECT_EQ(file.bytesPerToken(), width);

    const int64_t B = 2, T = 5;
    TokenLoader loader(p, B, T, 1000, 0);
    for (uint64_t step = 0; step < 12; ++step) {
      uint64_t start = (step * B * T) % (count - B * T);
      EXPECT_EQ(loader.windowStart(step), start);
      TokenBatch batch = loader.batch(step);
      ASSERT_EQ(batch.inputs.size(), size_t(B * T));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          EXPECT_EQ(batch.inputs[size_t(b * T + t)], int64_t(start + b * T + t));
          EXPECT_EQ(batch.labels[size_t(b * T + t)], int64_t(start + b * T + t + 1));
        }
    }
  }
}

TEST_F(DataTest, Version1AndRandomRowsAreOneDocument) {
  std::string p = path("v1rows.bin");
  writeTokenFile(p, iota(40, 10), 2);
  for (const std::string &source : {p, std::string()}) {
    TokenBatch batch = TokenLoader(source, 2, 5, 10, 3).batch(1);
    EXPECT_EQ(batch.positions, (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
    EXPECT_EQ(batch.segmentIds, std::vector<int64_t>(10, 0));
  }
}

TEST_F(DataTest, WindowStartDoesNotOverflow) {
  std::string p = path("tokens.bin");
  writeTokenFile(p, iota(1001, 7), 2);
  TokenLoader loader(p, 1, 10, 7, 0);
  uint64_t step = uint64_t(1) << 62; // step * 10 overflows 64 bits
  EXPECT_EQ(loader.windowStart(step), uint64_t((static_cast<unsigned __int128>(step) * 10) % 991));
}

TEST_F(DataTest, WideIdsAreRead) {
  std::string p = path("wide.bin");
  std::vector<uint32_t> tokens = {70000, 70001, 70002, 70003, 70004};
  writeTokenFile(p, tokens, 4);
  TokenLoader loader(p, 1, 4, 100000, 0);
  EXPECT_EQ(loader.batch(0).labels, (std::vector<int64_t>{70001, 70002, 70003, 70004}));
  EXPECT_THROW(writeTokenFile(path("narrow.bin"), tokens, 2), Error);
}

TEST_F(DataTest, RandomTokensAreDeterministicAndInRange) {
  TokenLoader a("", 2, 8, 50, 42), b("", 2, 8, 50, 42), c("", 2, 8, 50, 43);
  TokenBatch a0 = a.batch(0), a1 = a.batch(1);
  EXPECT_EQ(a0.inputs, b.batch(0).inputs);
  EXPECT_EQ(a1.labels, b.batch(1).labels);
  EXPECT_NE(a0.inputs, a1.inputs);
  EXPECT_NE(a0.inputs, c.batch(0).inputs);
  // A batch depends on the step alone, not on which steps were loaded before.
  EXPECT_EQ(TokenLoader("", 2, 8, 50, 42).batch(1).inputs, a1.inputs);
  for (int64_t id : a0.inputs)
    EXPECT_TRUE(id >= 0 && id < 50);
  // Labels are the inputs shifted by one.
  for (size_t i = 0; i + 1 < a0.inputs.size(); ++i)
    EXPECT_EQ(a0.labels[i], a0.inputs[i + 1]);
  EXPECT_NE(loaderError("", 2, 8, 0).find("vocabulary size"), std::string::npos);
}

TEST_F(DataTest, WritesI32AndI64Inputs) {
  TokenBatch batch;
  batch.batch = 2;
  batch.seq = 2;
  batch.inputs = {1, 2, 3, 4};
  batch.labels = {2, 3, 4, 5};
  std::vector<int32_t> ids32(4);
  std::vector<int64_t> labels64(4);
  writeTokenBatch(batch, {ids32.data(), DType::I32, {2, 2}}, {labels64.data(), DType::I64, {2, 2}});
  EXPECT_EQ(ids32, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(labels64, (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_THROW(writeTokenBatch(batch, {ids32.data(), DType::I32, {4}}, {labels64.data(), DType::I64, {2, 2}}),
               Error);
  std::vector<float> f(4);
  EXPECT_THROW(writeTokenBatch(batch, {f.data(), DType::F32, {2, 2}}, {labels64.data(), DType::I64, {2, 2}}),
               Error);
}

TEST_F(DataTest, MalformedFilesAreRefused) {
  std::string good = path("good.bin");
  writeTokenFile(good, iota(20, 10), 2);
  std::vector<uint8_t> bytes = readFileBytes(good);
  std::string p = path("bad.bin");

  auto expect = [&](const std::vector<uint8_t> &file, const char *part) {
    test::writeFile(p, file);
    std::string message = loaderError(p, 1, 4, 10);
    EXPECT_NE(message.find(part), std::string::npos) << "expected '" << part << "' in: " << message;
    EXPECT_NE(message.find(p), std::string::npos) << message;
  };
  expect(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 10), "shorter than the 24-byte header");
  std::vector<uint8_t> bad = bytes;
  bad[0] = 'X';
  expect(bad, "not a Bonsai token file");
  bad = bytes;
  bad[8] = 2;
  expect(bad, "version 2 is not supported");
  bad = bytes;
  bad[12] = 3;
  expect(bad, "bytes per token is 3");
  expect(std::vector<uint8_t>(bytes.begin(), bytes.end() - 3), "the header says 20 tokens, but the file holds only 18");
  bad = bytes;
  bad.push_back(0);
  expect(bad, "has 1 bytes after its 20 tokens");
  bad = bytes;
  bad[23] = 0x80; // a count near 2^63: count * 2 would overflow
  expect(bad, "the header says");

  // Every truncation is refused.
  for (size_t size = 0; size < bytes.size(); ++size) {
    test::writeFile(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + std::ptrdiff_t(size)));
    EXPECT_NE(loaderError(p, 1, 4, 10), "") << size;
  }
  EXPECT_NE(loaderError(path("missing.bin"), 1, 4, 10).find("cannot open token file"), std::string::npos);
}

TEST_F(DataTest, TooFewTokensNamesTheSizes) {
  std::string p = path("short.bin");
  writeTokenFile(p, iota(8, 10), 2);
  std::string message = loaderError(p, 2, 4, 10);
  EXPECT_NE(message.find("token file '" + p + "' has 8 tokens, but a batch of 2 x 4 needs at least 9"),
            std::string::npos)
      << message;
  writeTokenFile(p, iota(9, 10), 2);
  EXPECT_EQ(loaderError(p, 2, 4, 10), "");
}

TEST_F(DataTest, IdsAtOrAboveTheVocabularyAreNamed) {
  std::string p = path("oov.bin");
  std::vector<uint32_t> tokens = iota(30, 10);
  tokens[17] = 10;
  writeTokenFile(p, tokens, 2);
  // Step 1 reads [8, 17): the bad token is not in it; step 2 reads [16, 25).
  EXPECT_EQ(loaderError(p, 2, 4, 10, 1), "");
  std::string message = loaderError(p, 2, 4, 10, 2);
  EXPECT_NE(message.find("token 17 is 10, not below the vocabulary size 10"), std::string::npos) << message;
  EXPECT_NE(message.find(p), std::string::npos) << message;
}

} // namespace
} // namespace bonsai::rt
