//===- DataTest.cpp - Token files, batch windows and random tokens --------===//
//
// The window formula, inputs and labels shifted by one, both token widths, both input dtypes,
// determinism of random tokens, and every malformed token file the loader must refuse.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Data.h"

#include "TestPlans.h"

#include "bonsai/runtime/Random.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <set>

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
    TokenLoader loader(path, b, t, vocab, 0, /*shuffle=*/false);
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
  bad[8] = 3;
  expect(bad, "version 3 is not supported");
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

//===----------------------------------------------------------------------===//
// Version 2: documents, loss mask, packing.
//===----------------------------------------------------------------------===//

/// Documents of the given lengths; token i of the file is 10 + i (mod vocab 1000) and the
/// mask alternates in runs: a document's first half is its prompt.
TokenDocuments documents(const std::vector<uint64_t> &lengths, uint32_t width = 2) {
  TokenDocuments c;
  c.header.bytesPerToken = width;
  c.header.vocabSize = 1000;
  c.header.padId = 999;
  c.header.fingerprint = 0x1234abcd5678ef00ull;
  for (uint64_t n : lengths) {
    for (uint64_t j = 0; j < n; ++j) {
      c.tokens.push_back(uint32_t(10 + c.tokens.size() % 900));
      c.mask.push_back(j >= n / 2 ? 1 : 0);
    }
    c.documentEnds.push_back(c.tokens.size());
  }
  return c;
}

TEST_F(DataTest, Version2RoundTrips) {
  for (uint32_t width : {2u, 4u}) {
    std::string p = path("v2rt" + std::to_string(width) + ".bin");
    TokenDocuments c = documents({3, 1, 9, 4}, width);
    writeTokenFileV2(p, c);
    TokenFile file(p);
    EXPECT_EQ(file.version(), 2u);
    EXPECT_EQ(file.count(), 17u);
    EXPECT_EQ(file.bytesPerToken(), width);
    EXPECT_EQ(file.header().vocabSize, 1000u);
    EXPECT_EQ(file.header().padId, 999u);
    EXPECT_EQ(file.header().fingerprint, 0x1234abcd5678ef00ull);
    EXPECT_EQ(file.documentEnds(), (std::vector<uint64_t>{3, 4, 13, 17}));
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    file.read(0, 17, tokens);
    file.readMask(0, 17, mask);
    EXPECT_EQ(tokens, c.tokens);
    EXPECT_EQ(mask, c.mask);
    file.readMask(5, 9, mask); // not byte-aligned
    EXPECT_EQ(mask, std::vector<uint8_t>(c.mask.begin() + 5, c.mask.begin() + 14));
  }
}

TEST_F(DataTest, PackingLayoutAndLabels) {
  // Unshuffled, T = 6: documents of 3, 2, 8 and 4 tokens. Rows: [d0 d1 pad], [d2 piece 0 (6)],
  // [d2 piece 1 (2) d3 (4)], then the next epoch starts over.
  std::string p = path("pack.bin");
  TokenDocuments c = documents({3, 2, 8, 4});
  writeTokenFileV2(p, c);
  TokenLoader loader(p, 1, 6, 1000, 7, /*shuffle=*/false);
  EXPECT_EQ(loader.fileBatches(), 3u);
  const int64_t I = kIgnoreLabel;
  auto tok = [](int64_t i) { return int64_t(10 + i); };

  TokenBatch r0 = loader.batch(0);
  // d0 = tokens 0..2, mask 0 1 1; d1 = tokens 3..4, mask 0 1.
  EXPECT_EQ(r0.inputs, (std::vector<int64_t>{tok(0), tok(1), tok(2), tok(3), tok(4), 999}));
  EXPECT_EQ(r0.labels, (std::vector<int64_t>{tok(1), tok(2), I, tok(4), I, I}));
  EXPECT_EQ(r0.positions, (std::vector<int64_t>{0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(r0.segmentIds, (std::vector<int64_t>{0, 0, 0, 1, 1, 2}));

  TokenBatch r1 = loader.batch(1);
  // d2 = tokens 5..12, mask 0 0 0 0 1 1 1 1: its first piece's last label is token 11.
  EXPECT_EQ(r1.inputs, (std::vector<int64_t>{tok(5), tok(6), tok(7), tok(8), tok(9), tok(10)}));
  EXPECT_EQ(r1.labels, (std::vector<int64_t>{I, I, I, tok(9), tok(10), tok(11)}));
  EXPECT_EQ(r1.positions, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(r1.segmentIds, std::vector<int64_t>(6, 0));

  TokenBatch r2 = loader.batch(2);
  // d2's second piece (tokens 11, 12), then d3 = tokens 13..16, mask 0 0 1 1.
  EXPECT_EQ(r2.inputs, (std::vector<int64_t>{tok(11), tok(12), tok(13), tok(14), tok(15), tok(16)}));
  EXPECT_EQ(r2.labels, (std::vector<int64_t>{tok(12), I, I, tok(15), tok(16), I}));
  EXPECT_EQ(r2.positions, (std::vector<int64_t>{0, 1, 0, 1, 2, 3}));
  EXPECT_EQ(r2.segmentIds, (std::vector<int64_t>{0, 0, 1, 1, 1, 1}));

  // Epoch 1 repeats the order without shuffling; batches of 2 rows straddle epochs.
  EXPECT_EQ(loader.batch(3).inputs, r0.inputs);
  TokenLoader two(p, 2, 6, 1000, 7, false);
  TokenBatch b1 = two.batch(1); // rows 2 and 3 = epoch 0 row 2, epoch 1 row 0
  EXPECT_EQ(std::vector<int64_t>(b1.inputs.begin(), b1.inputs.begin() + 6), r2.inputs);
  EXPECT_EQ(std::vector<int64_t>(b1.inputs.begin() + 6, b1.inputs.end()), r0.inputs);
  EXPECT_EQ(std::vector<int64_t>(b1.segmentIds.begin() + 6, b1.segmentIds.end()), r0.segmentIds);
}

/// Every document's tokens appear once per epoch, whatever the order.
std::multiset<int64_t> epochTokens(TokenLoader &loader, uint64_t firstStep, uint64_t steps) {
  std::multiset<int64_t> seen;
  for (uint64_t s = firstStep; s < firstStep + steps; ++s) {
    TokenBatch b = loader.batch(s);
    for (size_t i = 0; i < b.inputs.size(); ++i)
      if (b.inputs[i] != 999)
        seen.insert(b.inputs[i]);
  }
  return seen;
}

TEST_F(DataTest, ShufflingDependsOnSeedAndEpochAndIsAFunctionOfTheStep) {
  std::string p = path("shuffle.bin");
  std::vector<uint64_t> lengths;
  for (int d = 0; d < 40; ++d)
    lengths.push_back(1 + (d * 7) % 11);
  TokenDocuments c = documents(lengths);
  writeTokenFileV2(p, c);
  TokenLoader a(p, 2, 16, 1000, 1), b(p, 2, 16, 1000, 1), other(p, 2, 16, 1000, 2);
  TokenLoader plain(p, 2, 16, 1000, 1, false);
  std::vector<TokenBatch> first;
  for (uint64_t s = 0; s < 30; ++s)
    first.push_back(a.batch(s));
  // Same seed: same batches; read backwards and from a fresh loader (a resume) too.
  for (uint64_t s = 30; s-- > 0;) {
    TokenBatch again = b.batch(s);
    EXPECT_EQ(again.inputs, first[s].inputs) << s;
    EXPECT_EQ(again.labels, first[s].labels) << s;
    EXPECT_EQ(again.positions, first[s].positions) << s;
    EXPECT_EQ(again.segmentIds, first[s].segmentIds) << s;
  }
  EXPECT_EQ(TokenLoader(p, 2, 16, 1000, 1).batch(23).inputs, first[23].inputs);
  // Another seed, or no shuffling, gives another order.
  EXPECT_NE(other.batch(0).inputs, first[0].inputs);
  EXPECT_NE(plain.batch(0).inputs, first[0].inputs);
  // Each epoch holds every token once, in another order than the epoch before.
  uint64_t perEpoch = a.fileBatches();
  std::multiset<int64_t> all(c.tokens.begin(), c.tokens.end());
  TokenLoader rows(p, 1, 16, 1000, 1);
  uint64_t epochRows = rows.fileBatches();
  EXPECT_EQ(epochTokens(rows, 0, epochRows), all);
  EXPECT_EQ(epochTokens(rows, epochRows, 0 + epochRows), epochTokens(rows, 0, epochRows));
  EXPECT_NE(rows.batch(0).inputs, rows.batch(epochRows).inputs);
  EXPECT_GE(perEpoch, 1u);
}

TEST_F(DataTest, Version2VocabularyIsChecked) {
  std::string p = path("vocab.bin");
  writeTokenFileV2(p, documents({5, 5}));
  std::string message = loaderError(p, 1, 4, 500);
  EXPECT_NE(message.find("was made with a tokenizer of vocabulary 1000, larger than the plan's "
                         "vocab_size 500"),
            std::string::npos)
      << message;
  EXPECT_EQ(loaderError(p, 1, 4, 1024), "");

  std::string q = path("vocab2.bin");
  TokenDocuments c = documents({5, 5});
  c.header.fingerprint ^= 1;
  writeTokenFileV2(q, c);
  TokenFile a(p), b(q);
  try {
    checkSameTokenizer(a, b);
    ADD_FAILURE() << "different fingerprints accepted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("were made with different tokenizers"), std::string::npos)
        << e.what();
  }
  checkSameTokenizer(a, a);
  std::string v1 = path("v1.bin");
  writeTokenFile(v1, iota(20, 10), 2);
  TokenFile plainFile(v1);
  checkSameTokenizer(a, plainFile); // version 1 records no tokenizer
}

TEST_F(DataTest, MalformedVersion2FilesAreRefused) {
  std::string good = path("good2.bin");
  writeTokenFileV2(good, documents({3, 4, 5}));
  std::vector<uint8_t> bytes = readFileBytes(good);
  ASSERT_EQ(bytes.size(), 48u + 12 * 2 + 3 * 8 + 2);
  std::string p = path("bad2.bin");
  auto expect = [&](const std::vector<uint8_t> &file, const char *part) {
    test::writeFile(p, file);
    std::string message = loaderError(p, 1, 4, 1000);
    EXPECT_NE(message.find(part), std::string::npos) << "expected '" << part << "' in: " << message;
    EXPECT_NE(message.find(p), std::string::npos) << message;
  };
  auto patch = [&](size_t offset, std::vector<uint8_t> value) {
    std::vector<uint8_t> b = bytes;
    std::copy(value.begin(), value.end(), b.begin() + std::ptrdiff_t(offset));
    return b;
  };
  expect(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 30), "shorter than the 48-byte version-2 header");
  expect(patch(24, {0, 0, 0, 0}), "the vocabulary size at byte offset 24 is 0");
  expect(patch(24, {0, 0, 2, 0}), "more ids than 2 bytes per token hold");
  expect(patch(28, {0xe8, 0x03, 0, 0}), "the pad id at byte offset 28 is 1000");
  expect(patch(40, {0, 0, 0, 0}), "0 documents (byte offset 40)");
  expect(patch(40, {13, 0, 0, 0}), "13 documents (byte offset 40) for 12 tokens");
  expect(patch(40, {4, 0, 0, 0}), "too short for 12 tokens, 4 document ends");
  expect(patch(16, {0, 0, 0, 0, 0, 0, 0, 0}), "the header says 0 tokens");
  expect(patch(16, {0, 0, 0, 0, 0, 0, 0, 0x80}), "the header says");
  // Document ends at 48 + 24 = 72: 3, 7, 12.
  expect(patch(72, {0, 0, 0, 0, 0, 0, 0, 0}), "document 0 ends at 0 (byte offset 72), not after the previous end 0");
  expect(patch(80, {2, 0, 0, 0, 0, 0, 0, 0}), "document 1 ends at 2 (byte offset 80), not after the previous end 3");
  expect(patch(88, {13, 0, 0, 0, 0, 0, 0, 0}), "document 2 ends at 13 (byte offset 88), past the 12 tokens");
  expect(patch(88, {11, 0, 0, 0, 0, 0, 0, 0}), "the last document ends at 11 (byte offset 88), not at the 12");
  // The mask (2 bytes at 96): 12 tokens use 4 bits of the second.
  expect(patch(97, {0x10}), "the loss mask's last byte (byte offset 97) has bits set past the 12 tokens");
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  expect(longer, "has 1 bytes after its loss mask");
  // A token at or above the vocabulary: token 5 at byte offset 48 + 10, read by step 1.
  test::writeFile(p, patch(58, {0xe8, 0x03}));
  std::string message = loaderError(p, 1, 4, 1000, 1);
  EXPECT_NE(message.find("token file '" + p + "': token 5 (byte offset 58) is 1000, not below the "
                         "file's vocabulary size 1000"),
            std::string::npos)
      << message;

  for (size_t size = 0; size < bytes.size(); ++size) {
    test::writeFile(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + std::ptrdiff_t(size)));
    EXPECT_NE(loaderError(p, 1, 4, 1000), "") << size;
  }
  // Writer-side checks.
  TokenDocuments c = documents({3, 4});
  c.mask.pop_back();
  EXPECT_THROW(writeTokenFileV2(path("w.bin"), c), Error);
  c = documents({3, 4});
  c.documentEnds = {4, 3};
  EXPECT_THROW(writeTokenFileV2(path("w.bin"), c), Error);
  c = documents({3, 4});
  c.tokens[2] = 1000;
  EXPECT_THROW(writeTokenFileV2(path("w.bin"), c), Error);
}

TEST_F(DataTest, RandomCorruptionsOfVersion2AreErrorsOrValidBatches) {
  std::string good = path("fuzz-good.bin");
  writeTokenFileV2(good, documents({3, 17, 1, 9, 30, 4, 8}));
  std::vector<uint8_t> bytes = readFileBytes(good);
  std::string p = path("fuzz.bin");
  Rng rng(2026);
  int refused = 0;
  for (int iteration = 0; iteration < 600; ++iteration) {
    std::vector<uint8_t> bad = bytes;
    for (uint64_t flips = 1 + rng.below(3); flips-- > 0;)
      bad[size_t(rng.below(bad.size()))] ^= uint8_t(1 + rng.below(255));
    test::writeFile(p, bad);
    try {
      TokenLoader loader(p, 2, 8, 1000, uint64_t(iteration));
      for (uint64_t step = 0; step < 8; ++step) {
        TokenBatch b = loader.batch(step);
        ASSERT_EQ(b.inputs.size(), 16u);
        for (size_t i = 0; i < 16; ++i) {
          EXPECT_TRUE(b.inputs[i] >= 0 && b.inputs[i] < 1000);
          EXPECT_TRUE(b.labels[i] == kIgnoreLabel || (b.labels[i] >= 0 && b.labels[i] < 1000));
          EXPECT_TRUE(b.positions[i] >= 0 && b.positions[i] < 8);
          EXPECT_TRUE(b.segmentIds[i] >= 0 && b.segmentIds[i] < 8);
        }
      }
    } catch (const Error &e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  // Most flips land in the header, the ends or the ids and are caught; some (mask bits) are
  // valid files.
  EXPECT_GT(refused, 50);
}

} // namespace
} // namespace bonsai::rt
