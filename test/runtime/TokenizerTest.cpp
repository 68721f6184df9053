//===- TokenizerTest.cpp - Tokenizers against the Python libraries' ids ---===//
//
// The inputs under Inputs/tokenizers/ were made on the H200 machine by bench/tokenizer_h200.py:
// four small tokenizers trained there with Hugging Face `tokenizers` and `sentencepiece`
// (Llama-3-, GPT-2- and Qwen2-style byte-level BPE, and a SentencePiece BPE with byte fallback),
// a mixed sample text, and the ids and decoded text those libraries give for it
// (expected.json). The same script compared bonsai-tokenize with the libraries on 4 MB there;
// this test keeps the sample's ids checked in CI. Also: the places where long documents are
// split for threads, invalid UTF-8, the loader's choices, one-line errors for files of other
// kinds and broken files, and bonsai-tokenize itself.
//
//===----------------------------------------------------------------------===//

#include "bonsai/tokenizer/Tokenizer.h"

#include "KnownPatterns.h"
#include "Regex.h"
#include "TestPlans.h"
#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Json.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace bonsai::tok {
namespace {

namespace test = rt::test;

const std::string kInputs = std::string(BONSAI_TEST_DATA_DIR) + "/tokenizers";

std::string inputPath(const std::string &name) { return kInputs + "/" + name; }

/// The SentencePiece model is binary; the repository keeps it as base64 text
/// (Inputs/tokenizers/sp.model.b64) and the tests load a decoded copy. One per process, removed
/// at exit: ctest runs each test in its own process, side by side, and a shared path let one
/// read the copy another was still writing.
std::string spModelPath() {
  struct DecodedModel {
    std::string path = ::testing::TempDir() + "/bonsai-tokenizer-test-sp." +
                       std::to_string(getpid()) + ".model";
    DecodedModel() {
      test::writeFile(path, test::decodeBase64(test::readText(inputPath("sp.model.b64"))));
    }
    ~DecodedModel() { std::remove(path.c_str()); }
  };
  static const DecodedModel model;
  return model.path;
}

std::string tokenizerPath(const std::string &name) {
  return name == "sp" ? spModelPath() : inputPath(name + ".json");
}

std::vector<uint32_t> idsOf(const rt::JsonValue &v) {
  std::vector<uint32_t> ids;
  for (const rt::JsonValue &e : v.elements())
    ids.push_back(uint32_t(e.unsignedValue()));
  return ids;
}

/// The documents of bonsai-tokenize --lines: non-empty lines, without '\n' or a final '\r'.
std::vector<std::string> linesOf(const std::string &text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos)
      end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (!line.empty())
      lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

/// The message of the rt::Error that `f` throws ("" if none).
template <typename F> std::string errorOf(F &&f) {
  try {
    f();
  } catch (const rt::Error &e) {
    return e.what();
  }
  return "";
}

const char *const kNames[] = {"llama3", "gpt2", "qwen2", "sp"};

TEST(TokenizerTest, IdsAndTextMatchThePythonLibraries) {
  std::string sample = test::readText(inputPath("sample.txt"));
  ASSERT_FALSE(sample.empty());
  rt::JsonValue expected = rt::parseJson(test::readText(inputPath("expected.json")), "expected");
  std::vector<std::string> lines = linesOf(sample);
  for (const char *name : kNames) {
    SCOPED_TRACE(name);
    std::unique_ptr<Tokenizer> t = loadTokenizer(tokenizerPath(name));
    const rt::JsonValue *e = expected.find(name);
    ASSERT_NE(e, nullptr);
    std::vector<uint32_t> want = idsOf(*e->find("document"));
    ASSERT_GT(want.size(), 500u);
    EXPECT_EQ(t->encode(sample), want);
    const auto &wantLines = e->find("lines")->elements();
    ASSERT_EQ(wantLines.size(), lines.size());
    std::unique_ptr<Encoder> encoder = t->newEncoder();
    for (size_t i = 0; i < lines.size(); ++i) {
      std::vector<uint32_t> ids;
      encoder->encode(lines[i], ids);
      EXPECT_EQ(ids, idsOf(wantLines[i])) << "line " << i << ": " << lines[i];
    }
    EXPECT_EQ(t->decode(want), e->find("decoded")->stringValue());
  }
}

TEST(TokenizerTest, WhatTheLoaderSaysItFound) {
  std::unique_ptr<Tokenizer> llama = loadTokenizer(tokenizerPath("llama3"));
  EXPECT_EQ(llama->describe(),
            tokenizerPath("llama3") +
                ": byte-level BPE (tokenizer.json), vocabulary 2048 (2048 in the model, 5 added "
                "tokens), 1787 merges, pre-tokenizer Llama-3 regex + ByteLevel, ignore_merges, "
                "BOS <|begin_of_text|> (0), EOS <|end_of_text|> (1) from tokenizer.json");
  std::unique_ptr<Tokenizer> gpt2 = loadTokenizer(tokenizerPath("gpt2"));
  EXPECT_NE(gpt2->describe().find("pre-tokenizer ByteLevel with the GPT-2 regex, BOS none, EOS "
                                  "<|endoftext|> (0)"),
            std::string::npos)
      << gpt2->describe();
  std::unique_ptr<Tokenizer> qwen = loadTokenizer(tokenizerPath("qwen2"));
  EXPECT_NE(qwen->describe().find("Qwen2 regex + ByteLevel, NFC"), std::string::npos);
  std::unique_ptr<Tokenizer> sp = loadTokenizer(tokenizerPath("sp"));
  EXPECT_NE(sp->describe().find("SentencePiece BPE (tokenizer.model), vocabulary 1000, byte "
                                "fallback, normalizer identity, BOS <s> (1), EOS </s> (2)"),
            std::string::npos)
      << sp->describe();
  EXPECT_EQ(sp->tokenId("<s>"), std::optional<uint32_t>(1));
  EXPECT_EQ(sp->tokenId("no such piece"), std::nullopt);
  EXPECT_EQ(gpt2->tokenId("<mask>"), gpt2->encode("<mask>").at(0));
  EXPECT_EQ(gpt2->tokenId("no such token"), std::nullopt);
}

// A document may be split wherever findCut says, and its parts encode as the whole does.
TEST(TokenizerTest, DocumentsSplitWhereBothPartsEncodeAsTheWhole) {
  std::string sample = test::readText(inputPath("sample.txt"));
  std::string text;
  for (int i = 0; i < 4; ++i)
    text += sample + "More text\nand lines, Words and 123 numbers here.\n";
  for (const char *name : kNames) {
    SCOPED_TRACE(name);
    std::unique_ptr<Tokenizer> t = loadTokenizer(tokenizerPath(name));
    std::vector<uint32_t> whole = t->encode(text);
    size_t cuts = 0;
    // Every cut up to 20, to keep the test short (each check encodes the text again).
    for (size_t from = 1; from < text.size() && cuts < 20;) {
      std::optional<Cut> cut = t->findCut(text, from);
      if (!cut)
        break;
      ASSERT_GE(cut->end, from);
      ASSERT_GE(cut->resume, cut->end);
      std::vector<uint32_t> parts = t->encode(std::string_view(text).substr(0, cut->end));
      std::vector<uint32_t> rest = t->encode(std::string_view(text).substr(cut->resume));
      parts.insert(parts.end(), rest.begin(), rest.end());
      EXPECT_EQ(parts, whole) << "cut at " << cut->end;
      ++cuts;
      from = cut->end + 1;
    }
    // Qwen2's sample tokenizer has an added token that strips whitespace on its left, so no
    // cut is safe; the others have many.
    if (std::string(name) == "qwen2")
      EXPECT_EQ(cuts, 0u);
    else
      EXPECT_GT(cuts, 10u);
  }
}

TEST(TokenizerTest, InvalidUtf8IsReadAsPythonReadsIt) {
  std::string scratch;
  EXPECT_EQ(repairUtf8("valid é 😀", scratch), 0u);
  EXPECT_TRUE(scratch.empty());
  // One U+FFFD per maximal ill-formed subpart: a truncated sequence is one, a surrogate's
  // bytes are three, a lone continuation byte or 0xff one each.
  EXPECT_EQ(repairUtf8("a\xe2\x82z", scratch), 1u);
  EXPECT_EQ(scratch, "a\xef\xbf\xbdz");
  EXPECT_EQ(repairUtf8("\xed\xa0\x80!", scratch), 3u);
  EXPECT_EQ(scratch, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd!");
  EXPECT_EQ(repairUtf8("\x80\xff\xf0\x9f\x98", scratch), 3u);
  EXPECT_EQ(scratch, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(repairUtf8("\xc0\xaf", scratch), 2u); // an overlong '/'

  for (const char *name : kNames) {
    SCOPED_TRACE(name);
    std::unique_ptr<Tokenizer> t = loadTokenizer(tokenizerPath(name));
    std::unique_ptr<Encoder> encoder = t->newEncoder();
    std::vector<uint32_t> ids;
    encoder->encode("caf\xc3 ok \xff", ids);
    EXPECT_EQ(ids, t->encode("caf\xef\xbf\xbd ok \xef\xbf\xbd"));
    EXPECT_EQ(encoder->invalidUtf8(), 2u);
  }
}

// The hand-written GPT-2, Llama-3 and Qwen2 patterns (with PCRE2 where they need a non-ASCII
// character) cut random text exactly where PCRE2 alone does.
TEST(TokenizerTest, HandWrittenPatternsMatchAsPcre2Does) {
  const char *alphabet[] = {"a",      "Z", "s",     "t",    "re", "ve",     "m",      "ll",
                            "d",      "S", "LL",    "RE",   "0",  "7",      "123",    "'",
                            "''",     " ", "  ",    "\t",   "\n", "\r",     "\r\n",   "\v",
                            "\f",     ".", ",",     "(",    "-",  "_",      "#",      "\x01",
                            "\x7f",   "é", "Größe", "我们", "😀",  "\u00a0", "\u3000", "\u2028",
                            "\u0085", "ſ", "²",     "٣",    "—",  "\u180e", "\u212a"};
  std::mt19937 rng(30);
  RegexMatcher matcher;
  for (KnownPattern p : {KnownPattern::Gpt2, KnownPattern::Llama3, KnownPattern::Qwen2}) {
    SCOPED_TRACE(knownPatternName(p));
    Regex re(knownPatternText(p), "test");
    size_t handled = 0, asked = 0;
    for (int trial = 0; trial < 3000; ++trial) {
      std::string text;
      int length = 1 + int(rng() % 24);
      for (int k = 0; k < length; ++k)
        text += alphabet[rng() % (sizeof alphabet / sizeof *alphabet)];
      std::vector<std::pair<size_t, size_t>> want, got;
      matcher.forEachMatch(re, text, [&](size_t s, size_t e) { want.emplace_back(s, e); });
      for (size_t i = 0; i < text.size();) {
        size_t end = matchKnownAscii(p, text, i), start = i;
        if (end == std::string_view::npos) {
          ASSERT_TRUE(matcher.find(re, text, i, start, end));
          ++asked;
        } else {
          ++handled;
        }
        got.emplace_back(start, end);
        i = end;
      }
      ASSERT_EQ(got, want) << "text: " << text;
    }
    // Both paths were taken many times.
    EXPECT_GT(handled, 10000u);
    EXPECT_GT(asked, 1000u);
  }
}

class TokenizerFilesTest : public ::testing::Test {
protected:
  void SetUp() override { dir = test::makeTempDir("tokenizer"); }
  void TearDown() override { test::removeTree(dir); }
  std::string write(const std::string &name, const std::string &text) {
    std::string path = dir + "/" + name;
    test::writeFile(path, std::vector<uint8_t>(text.begin(), text.end()));
    return path;
  }
  /// llama3.json with `from` replaced by `to` (which must occur).
  std::string edited(const std::string &from, const std::string &to) {
    std::string text = test::readText(tokenizerPath("llama3"));
    size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos)
      text.replace(at, from.size(), to);
    return text;
  }
  std::string dir;
};

TEST_F(TokenizerFilesTest, AModelDirectoryIsFoundAndItsConfigNamesBosAndEos) {
  std::string model = dir + "/model";
  ::mkdir(model.c_str(), 0755);
  EXPECT_NE(
      errorOf([&] { loadTokenizer(model); }).find("has no tokenizer.json and no tokenizer.model"),
      std::string::npos);

  // tokenizer.model alone.
  std::string sp = test::readText(tokenizerPath("sp"));
  test::writeFile(model + "/tokenizer.model", std::vector<uint8_t>(sp.begin(), sp.end()));
  EXPECT_EQ(loadTokenizer(model)->path(), model + "/tokenizer.model");

  // A tokenizer.json of another kind beside it: tokenizer.model is used, and the reason said.
  std::string wordPiece = edited("\"type\": \"BPE\"", "\"type\": \"WordPiece\"");
  test::writeFile(model + "/tokenizer.json",
                  std::vector<uint8_t>(wordPiece.begin(), wordPiece.end()));
  std::unique_ptr<Tokenizer> t = loadTokenizer(model);
  EXPECT_EQ(t->path(), model + "/tokenizer.model");
  EXPECT_NE(t->describe().find("; tokenizer.json not used: " + model +
                               "/tokenizer.json: model type \"WordPiece\" is not supported"),
            std::string::npos)
      << t->describe();

  // A byte-level tokenizer.json is preferred; tokenizer_config.json names BOS and EOS.
  std::string llama = test::readText(tokenizerPath("llama3"));
  test::writeFile(model + "/tokenizer.json", std::vector<uint8_t>(llama.begin(), llama.end()));
  std::string config =
      R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}})";
  test::writeFile(model + "/tokenizer_config.json",
                  std::vector<uint8_t>(config.begin(), config.end()));
  t = loadTokenizer(model);
  EXPECT_EQ(t->path(), model + "/tokenizer.json");
  ASSERT_TRUE(t->bos() && t->eos());
  EXPECT_EQ(t->bos()->text, "<|begin_of_text|>");
  EXPECT_EQ(t->eos()->text, "<|eot_id|>");
  EXPECT_EQ(t->eos()->id, 4u);
  EXPECT_NE(t->describe().find("EOS <|eot_id|> (4) from tokenizer_config.json"), std::string::npos);

  config = R"({"bos_token": null, "eos_token": "<|not a token|>"})";
  test::writeFile(model + "/tokenizer_config.json",
                  std::vector<uint8_t>(config.begin(), config.end()));
  EXPECT_EQ(errorOf([&] { loadTokenizer(model); }),
            model +
                "/tokenizer_config.json: eos_token \"<|not a token|>\" is not in the "
                "vocabulary of '" +
                model + "/tokenizer.json'");
  config = R"({"bos_token": null})";
  test::writeFile(model + "/tokenizer_config.json",
                  std::vector<uint8_t>(config.begin(), config.end()));
  t = loadTokenizer(model);
  EXPECT_FALSE(t->bos());
  EXPECT_TRUE(t->eos());
}

TEST_F(TokenizerFilesTest, OtherKindsAndBrokenFilesAreOneLineErrors) {
  struct Case {
    std::string text;
    std::string message;
    bool unsupported;
  };
  std::vector<Case> cases = {
      {edited("\"type\": \"BPE\"", "\"type\": \"WordPiece\""),
       "model type \"WordPiece\" is not supported (byte-level BPE tokenizer.json and "
       "SentencePiece tokenizer.model are)",
       true},
      {R"({"model": {"type": "Unigram", "vocab": [["a", -1.0]], "unk_id": 0}})",
       "model type \"Unigram\" is not supported", true},
      {edited("\"type\": \"Sequence\"", "\"type\": \"Metaspace\""),
       "pre-tokenizer \"Metaspace\" is not supported", true},
      {edited("\"pre_tokenizer\": {", "\"pre_tokenizer\": null, \"unused\": {"),
       "not a byte-level BPE: the pre-tokenizer has no ByteLevel step", true},
      {edited("\"normalizer\": null", "\"normalizer\": {\"type\": \"Lowercase\"}"),
       "normalizer \"Lowercase\" is not supported", true},
      {edited("\"dropout\": null", "\"dropout\": 0.1"), "BPE dropout is set", true},
      {"{\"model\": ", "invalid JSON at byte 10", false},
      {"[]", "the file is a array, expected an object", false},
      {"{\"version\": \"1.0\"}", "the file has no \"model\"", false},
      {edited("\"vocab\": {", "\"vocabulary\": {"), "model has no \"vocab\"", false},
      {edited("\"merges\": [", "\"merges\": [\n      [\"Ġ\", \"zzz-not-a-token\"],"),
       "model.merges[0]: \"zzz-not-a-token\" is not in model.vocab", false},
      {edited("\"merges\": [", "\"merges\": [\n      \"a b c\","),
       "model.merges[0] \"a b c\" is not two tokens separated by one space", false},
      {edited("\"Regex\": \"", "\"Regex\": \"(unclosed"), "does not compile", false},
      {edited("\"behavior\": \"Isolated\"", "\"behavior\": \"Sideways\""),
       "behavior \"Sideways\" is not one of", false},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].message);
    std::string path = write("case" + std::to_string(i) + ".json", cases[i].text);
    std::string message;
    bool unsupported = false;
    try {
      loadTokenizer(path);
    } catch (const UnsupportedTokenizer &e) {
      message = e.what();
      unsupported = true;
    } catch (const rt::Error &e) {
      message = e.what();
    }
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(cases[i].message), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(unsupported, cases[i].unsupported) << message;
  }

  // Broken SentencePiece models: truncated, garbage, empty.
  std::string sp = test::readText(tokenizerPath("sp"));
  std::string garbage(4096, '\0');
  for (size_t i = 0; i < garbage.size(); ++i)
    garbage[i] = char((i * 2654435761u) >> 13);
  for (const std::string &bytes : {sp.substr(0, sp.size() / 2), garbage}) {
    std::string path = write("broken.model", bytes);
    std::string message = errorOf([&] { loadTokenizer(path); });
    EXPECT_EQ(message.rfind("'" + path + "' is not a SentencePiece model: ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  std::string empty = write("empty.model", "");
  EXPECT_EQ(errorOf([&] { loadTokenizer(empty); }),
            "'" + empty + "' is empty, not a SentencePiece model");
  EXPECT_EQ(errorOf([&] { loadTokenizer(dir + "/missing.json"); }),
            "tokenizer '" + dir + "/missing.json' does not exist");
}

//===----------------------------------------------------------------------===//
// bonsai-tokenize.
//===----------------------------------------------------------------------===//

struct ToolResult {
  int code = -1;
  std::string out, err;
};

ToolResult runTokenize(const std::vector<std::string> &args, const std::string &scratch) {
  std::string outPath = scratch + "/stdout", errPath = scratch + "/stderr";
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child == 0) {
    int out = ::open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = ::open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char *> argv = {const_cast<char *>(BONSAI_TOKENIZE_PATH)};
    for (const std::string &a : args)
      argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(BONSAI_TOKENIZE_PATH, argv.data());
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

std::vector<uint32_t> tokensOf(const std::string &path) {
  rt::TokenFile file(path);
  std::vector<uint32_t> ids;
  file.read(0, size_t(file.count()), ids);
  return ids;
}

TEST_F(TokenizerFilesTest, BonsaiTokenizeEncodesDecodesAndSplitsDocuments) {
  std::string sample = test::readText(inputPath("sample.txt"));
  std::string text;
  for (int i = 0; i < 40; ++i) // 100 KB: a few units for the threads
    text += sample;
  std::string a = write("a.txt", text), b = write("b.txt", "Second document.\n");
  std::unique_ptr<Tokenizer> llama = loadTokenizer(tokenizerPath("llama3"));
  uint32_t bos = llama->bos()->id, eos = llama->eos()->id;

  // Each file a document, BOS and EOS around each; the same ids on 1 and 3 threads.
  std::vector<uint32_t> want = {bos};
  for (const std::string &doc : {text, std::string("Second document.\n")}) {
    if (want.size() > 1)
      want.push_back(bos);
    std::vector<uint32_t> ids = llama->encode(doc);
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(eos);
  }
  for (const char *threads : {"1", "3"}) {
    std::string out = dir + "/docs" + threads + ".bin";
    ToolResult r = runTokenize({a, b, "-o", out, "--tokenizer", tokenizerPath("llama3"), "--bos",
                                "--eos", "--threads", threads},
                               dir);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("tokenizer: " + llama->describe() + "\n", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("tokenize: " + a + ", " + b + ": " + std::to_string(text.size() + 17) +
                         " bytes, 2 documents -> " + std::to_string(want.size()) +
                         " tokens (vocabulary 2048, 2 bytes per token) -> " + out + "\n"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(tokensOf(out), want);
  }

  // --lines: each non-empty line a document.
  std::unique_ptr<Tokenizer> sp = loadTokenizer(tokenizerPath("sp"));
  std::vector<uint32_t> wantLines;
  size_t documents = 0;
  for (const std::string &line : linesOf(text)) {
    std::vector<uint32_t> ids = sp->encode(line);
    wantLines.insert(wantLines.end(), ids.begin(), ids.end());
    wantLines.push_back(sp->eos()->id);
    ++documents;
  }
  std::string lines = dir + "/lines.bin";
  ToolResult r = runTokenize({a, "-o", lines, "--tokenizer", tokenizerPath("sp"), "--lines",
                              "--eos", "--threads", "2", "--token-bytes", "4"},
                             dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(std::to_string(documents) + " documents"), std::string::npos) << r.out;
  EXPECT_EQ(rt::TokenFile(lines).bytesPerToken(), 4u);
  EXPECT_EQ(tokensOf(lines), wantLines);

  // --decode gives the text back (byte-level BPE is lossless; the special tokens as text).
  std::string plain = dir + "/plain.bin", decoded = dir + "/decoded.txt";
  ASSERT_EQ(runTokenize({a, "-o", plain, "--tokenizer", tokenizerPath("llama3")}, dir).code, 0);
  r = runTokenize({"--decode", plain, "-o", decoded, "--tokenizer", tokenizerPath("llama3")}, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(test::readText(decoded) == text);
  EXPECT_NE(r.out.find("decode: " + plain + ": "), std::string::npos) << r.out;
  std::string docs = dir + "/docs1.bin";
  r = runTokenize({"--decode", docs, "-o", decoded, "--tokenizer", tokenizerPath("llama3")}, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(test::readText(decoded) == "<|begin_of_text|>" + text +
                                             "<|end_of_text|><|begin_of_text|>Second "
                                             "document.\n<|end_of_text|>");
  // SentencePiece decodes each document apart (its dummy-prefix space), control tokens as text.
  r = runTokenize({"--decode", lines, "-o", decoded, "--tokenizer", tokenizerPath("sp")}, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  std::string wantText;
  for (const std::string &line : linesOf(text))
    wantText += sp->decode(sp->encode(line)) + "</s>";
  EXPECT_TRUE(test::readText(decoded) == wantText);
}

TEST_F(TokenizerFilesTest, BonsaiTokenizeErrorsAreOneLine) {
  std::string input = write("in.txt", "Hello world\n");
  auto expectError = [&](std::vector<std::string> args, const std::string &part) {
    ToolResult r = runTokenize(args, dir);
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("bonsai-tokenize: error: ", 0), 0u) << r.err;
    std::string first = r.err.substr(0, r.err.find('\n'));
    EXPECT_NE(first.find(part), std::string::npos) << r.err;
  };
  std::string out = dir + "/out.bin";
  expectError({input, "-o", out, "--tokenizer", tokenizerPath("gpt2"), "--bos"},
              "--bos: the tokenizer '" + tokenizerPath("gpt2") + "' has no BOS token");
  expectError({input, "-o", out, "--lines"}, "--lines, --bos and --eos need --tokenizer");
  expectError({input, "-o", out, "--tokenizer", dir + "/none"},
              "tokenizer '" + dir + "/none' does not exist");
  std::string wordPiece = write("wp.json", R"({"model": {"type": "WordPiece", "vocab": {}}})");
  expectError({input, "-o", out, "--tokenizer", wordPiece},
              wordPiece + ": model type \"WordPiece\" is not supported");
  expectError({input, "-o", out, "--tokenizer", tokenizerPath("sp"), "--threads", "0"},
              "--threads must be an integer from 1 to 1024, got '0'");
  expectError({input, "-o", "-", "--tokenizer", tokenizerPath("sp")},
              "a token file cannot be written to stdout");
  std::string blank = write("blank.txt", "\n\r\n\n");
  expectError({blank, "-o", out, "--tokenizer", tokenizerPath("sp"), "--lines"}, "gives no tokens");
  // A token file with an id the tokenizer does not have.
  std::string bad = dir + "/bad.bin";
  rt::writeTokenFile(bad, {5, 6, 70000}, 4);
  expectError({"--decode", bad, "-o", dir + "/x.txt", "--tokenizer", tokenizerPath("gpt2")},
              "token file '" + bad + "': token 2 is 70000, not below the vocabulary size " +
                  std::to_string(loadTokenizer(tokenizerPath("gpt2"))->vocabSize()) + " of '" +
                  tokenizerPath("gpt2") + "'");
  expectError({"--decode", bad, "-o", dir + "/x.txt"}, "not below the vocabulary size 256");
  std::ifstream none(out);
  EXPECT_FALSE(none.good()) << "a failed run left an output file";
}

} // namespace
} // namespace bonsai::tok
