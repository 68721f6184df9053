//===- SentencePieceTokenizer.cpp - tokenizer.model through sentencepiece --===//
//
// SentencePiece models (Llama 2, Mistral, Gemma, T5, ...) are encoded and decoded by the
// sentencepiece library itself (Debian's libsentencepiece), so the ids are the library's. What
// this file adds: a check of the file and one-line errors, decoding that writes control tokens
// (BOS, EOS) as their text, and the places where a long document may be split for threads,
// which depend on options the library does not expose and which are therefore read from the
// model's protobuf directly (a handful of scalar fields, by their numbers in
// sentencepiece_model.proto).
//
//===----------------------------------------------------------------------===//

#include "Unicode.h"

#include "bonsai/tokenizer/Tokenizer.h"

#include <cctype>
#include <fstream>
#include <sstream>

#include <sentencepiece_processor.h>

namespace bonsai::tok {

namespace {

/// The options of a ModelProto this file needs, with the proto's defaults.
struct ModelOptions {
  int modelType = 1; // UNIGRAM = 1, BPE = 2, WORD = 3, CHAR = 4
  bool byteFallback = false;
  bool treatWhitespaceAsSuffix = false;
  bool addDummyPrefix = true;
  bool removeExtraWhitespaces = true;
  std::string normalizer;
};

/// A reader of protobuf's wire format, enough to walk fields and read varints.
struct Wire {
  const unsigned char *p, *end;
  bool varint(uint64_t &v) {
    v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      unsigned char b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80))
        return true;
    }
    return false;
  }
  /// Calls f(field, wireType, value, bytes) for each field; false on malformed input.
  template <typename F> bool fields(F &&f) {
    while (p < end) {
      uint64_t key, value = 0;
      if (!varint(key))
        return false;
      int type = int(key & 7);
      std::string_view bytes;
      switch (type) {
      case 0:
        if (!varint(value))
          return false;
        break;
      case 1:
      case 5: {
        size_t n = type == 1 ? 8 : 4;
        if (size_t(end - p) < n)
          return false;
        p += n;
        break;
      }
      case 2: {
        uint64_t n;
        if (!varint(n) || n > uint64_t(end - p))
          return false;
        bytes = std::string_view(reinterpret_cast<const char *>(p), size_t(n));
        p += n;
        break;
      }
      default:
        return false;
      }
      f(uint32_t(key >> 3), type, value, bytes);
    }
    return true;
  }
};

ModelOptions readOptions(std::string_view proto) {
  ModelOptions o;
  auto sub = [](std::string_view bytes) {
    return Wire{reinterpret_cast<const unsigned char *>(bytes.data()),
                reinterpret_cast<const unsigned char *>(bytes.data()) + bytes.size()};
  };
  Wire model = sub(proto);
  model.fields([&](uint32_t field, int type, uint64_t, std::string_view bytes) {
    if (type != 2)
      return;
    if (field == 2) { // trainer_spec
      sub(bytes).fields([&](uint32_t f, int t, uint64_t v, std::string_view) {
        if (t != 0)
          return;
        if (f == 3)
          o.modelType = int(v);
        else if (f == 24)
          o.treatWhitespaceAsSuffix = v != 0;
        else if (f == 35)
          o.byteFallback = v != 0;
      });
    } else if (field == 3) { // normalizer_spec
      sub(bytes).fields([&](uint32_t f, int t, uint64_t v, std::string_view s) {
        if (f == 1 && t == 2)
          o.normalizer = std::string(s);
        else if (f == 3 && t == 0)
          o.addDummyPrefix = v != 0;
        else if (f == 4 && t == 0)
          o.removeExtraWhitespaces = v != 0;
      });
    }
  });
  return o;
}

const char *modelTypeName(int type) {
  switch (type) {
  case 1:
    return "unigram";
  case 2:
    return "BPE";
  case 3:
    return "word";
  case 4:
    return "char";
  default:
    return "unknown-type";
  }
}

class SentencePieceTokenizer;

class SentencePieceEncoder final : public Encoder {
public:
  explicit SentencePieceEncoder(const SentencePieceTokenizer &t) : t_(t) {}
  void encode(std::string_view text, std::vector<uint32_t> &ids) override;

private:
  const SentencePieceTokenizer &t_;
  std::string repaired_;
  std::vector<int> pieces_;
};

class SentencePieceTokenizer final : public Tokenizer {
public:
  explicit SentencePieceTokenizer(std::string path) : Tokenizer(std::move(path)) {}

  std::unique_ptr<Encoder> newEncoder() const override {
    return std::make_unique<SentencePieceEncoder>(*this);
  }

  void decode(const uint32_t *ids, size_t count, std::string &out) const override {
    // The library drops control tokens and removes the dummy-prefix space at the start of
    // what it decodes; a document starts after a control token, so runs between them are
    // decoded one by one and the control tokens written as their text.
    std::vector<int> run;
    std::string text;
    auto flush = [&]() {
      if (run.empty())
        return;
      sentencepiece::util::Status status = processor_.Decode(run, &text);
      if (!status.ok())
        throw rt::Error("'" + path() + "': cannot decode: " + status.ToString());
      out += text;
      run.clear();
    };
    for (size_t i = 0; i < count; ++i) {
      if (ids[i] >= vocab_)
        throw rt::Error("token id " + std::to_string(ids[i]) + " is not in the vocabulary of '" +
                        path() + "' (" + std::to_string(vocab_) + " pieces)");
      int id = int(ids[i]);
      if (processor_.IsControl(id)) {
        flush();
        out += processor_.IdToPiece(id);
      } else {
        run.push_back(id);
      }
    }
    flush();
  }

  size_t decodeSplit(const uint32_t *ids, size_t count) const override {
    for (size_t k = count; k > 0; --k)
      if (ids[k - 1] < vocab_ && processor_.IsControl(int(ids[k - 1])))
        return k;
    return 0;
  }

  uint32_t vocabSize() const override { return vocab_; }

  std::optional<uint32_t> tokenId(std::string_view token) const override {
    int id = processor_.PieceToId(token);
    // PieceToId answers unk_id for a piece it does not have.
    if (id < 0 || (id == processor_.unk_id() && processor_.IdToPiece(id) != token))
      return std::nullopt;
    return uint32_t(id);
  }

  std::optional<Cut> findCut(std::string_view text, size_t from) const override {
    if (!cutsAllowed_)
      return std::nullopt;
    // Before a single space between ASCII letters or digits: no piece holds a space after
    // anything else (checked when loading), so none spans it, and the dummy prefix the second
    // part gets stands for the space it drops.
    for (size_t p = std::max<size_t>(from, 1); p + 1 < text.size(); ++p) {
      p = text.find(' ', p);
      if (p == std::string_view::npos || p + 1 >= text.size())
        return std::nullopt;
      if (std::isalnum(static_cast<unsigned char>(text[p - 1])) &&
          std::isalnum(static_cast<unsigned char>(text[p + 1])))
        return Cut{p, p + 1};
    }
    return std::nullopt;
  }

  std::string describeModel() const override {
    std::ostringstream s;
    s << "SentencePiece " << modelTypeName(options_.modelType) << " (tokenizer.model), vocabulary "
      << vocab_;
    if (options_.byteFallback)
      s << ", byte fallback";
    s << ", normalizer " << (options_.normalizer.empty() ? "none" : options_.normalizer);
    return s.str();
  }

  void load(const std::string &bytes) {
    sentencepiece::util::Status status = processor_.LoadFromSerializedProto(bytes);
    if (!status.ok())
      throw rt::Error("'" + path() + "' is not a SentencePiece model: " + status.ToString());
    int size = processor_.GetPieceSize();
    if (size <= 0)
      throw rt::Error("'" + path() + "' is a SentencePiece model without pieces");
    vocab_ = uint32_t(size);
    options_ = readOptions(bytes);

    // Parts of a long document encode as the whole only for BPE models (a unigram lattice's
    // float sums could tie-break differently), with a dummy prefix, and when no piece has the
    // space mark (U+2581) after another character.
    cutsAllowed_ =
        options_.modelType == 2 && options_.addDummyPrefix && !options_.treatWhitespaceAsSuffix;
    const std::string mark = "\xe2\x96\x81";
    for (int id = 0; id < size && cutsAllowed_; ++id) {
      if (processor_.IsControl(id) || processor_.IsUnknown(id) || processor_.IsByte(id) ||
          processor_.IsUnused(id))
        continue;
      const std::string &piece = processor_.IdToPiece(id);
      size_t lead = 0;
      while (piece.compare(lead, mark.size(), mark) == 0)
        lead += mark.size();
      if (piece.find(mark, lead) != std::string::npos)
        cutsAllowed_ = false;
    }

    auto named = [&](int id) -> std::optional<NamedToken> {
      if (id < 0 || id >= size)
        return std::nullopt;
      return NamedToken{uint32_t(id), processor_.IdToPiece(id)};
    };
    setSpecialTokens(named(processor_.bos_id()), named(processor_.eos_id()), "tokenizer.model");
  }

  sentencepiece::SentencePieceProcessor processor_;

private:
  uint32_t vocab_ = 0;
  ModelOptions options_;
  bool cutsAllowed_ = false;
};

void SentencePieceEncoder::encode(std::string_view text, std::vector<uint32_t> &ids) {
  if (size_t replaced = repairUtf8(text, repaired_)) {
    invalidUtf8_ += replaced;
    text = repaired_;
  }
  sentencepiece::util::Status status = t_.processor_.Encode(text, &pieces_);
  if (!status.ok())
    throw rt::Error("'" + t_.path() + "': cannot encode: " + status.ToString());
  for (int id : pieces_)
    ids.push_back(uint32_t(id));
}

} // namespace

std::unique_ptr<Tokenizer> loadSentencePiece(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw rt::Error("cannot open SentencePiece model '" + path + "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty())
    throw rt::Error("'" + path + "' is empty, not a SentencePiece model");
  auto t = std::make_unique<SentencePieceTokenizer>(path);
  t->load(bytes);
  return t;
}

} // namespace bonsai::tok
