//===- Tokenizer.h - Text <-> token ids, as the model was trained ----------===//
//
// The tokenizers of the models people train, in C++ with no Python at run time
// (docs/tokenizers.md): Hugging Face tokenizer.json byte-level BPE (GPT-2, Llama 3, Qwen2 and their
// pre-tokenizer regexes, added and special tokens) and SentencePiece tokenizer.model files (through
// the sentencepiece library). Ids are those the Python libraries give: the tests hold ids that
// `tokenizers` and `sentencepiece` produced.
//
// A Tokenizer is immutable once loaded and may be shared by threads; encoding goes through an
// Encoder, one per thread, which holds that thread's caches and regex match state. Every
// failure, a malformed file or one of a kind this library does not handle, is an rt::Error whose
// message names the file and the cause.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TOKENIZER_TOKENIZER_H
#define BONSAI_TOKENIZER_TOKENIZER_H

#include "bonsai/runtime/Tensor.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai::tok {

/// A tokenizer file of a kind this library does not handle (a WordPiece or Unigram
/// tokenizer.json, a pre-tokenizer or normalizer it does not know). Distinct from a malformed
/// file so that a model directory can fall back to its tokenizer.model.
class UnsupportedTokenizer : public rt::Error {
public:
  explicit UnsupportedTokenizer(const std::string &message) : rt::Error(message) {}
};

/// One thread's working state for encoding: caches and regex match data. Not thread-safe; make
/// one per thread with Tokenizer::newEncoder(). The Tokenizer must outlive it.
class Encoder {
public:
  virtual ~Encoder();
  /// Appends the ids of `text` to `ids`. Text that is not valid UTF-8 is read with each
  /// maximal invalid sequence replaced by U+FFFD, as Python's errors="replace" reads it.
  /// Nothing is added before or after (no BOS, no EOS).
  virtual void encode(std::string_view text, std::vector<uint32_t> &ids) = 0;
  /// How many invalid UTF-8 sequences encode() has replaced so far.
  size_t invalidUtf8() const { return invalidUtf8_; }

protected:
  size_t invalidUtf8_ = 0;
};

/// A token the tokenizer knows by name, such as a BOS or EOS token.
struct NamedToken {
  uint32_t id = 0;
  std::string text;
};

/// Where a long document may be split so that its two parts encode to the ids of the whole:
/// the first part is [0, end), the second starts at `resume` (>= end; the bytes between are
/// stood for by the tokenizer's own handling of a part's start).
struct Cut {
  size_t end = 0;
  size_t resume = 0;
};

/// A loaded tokenizer.
class Tokenizer {
public:
  virtual ~Tokenizer();

  /// A new per-thread encoding state.
  virtual std::unique_ptr<Encoder> newEncoder() const = 0;
  /// The ids of `text` (through a temporary Encoder: for one-off use).
  std::vector<uint32_t> encode(std::string_view text) const;

  /// Appends the text of `ids` to `out`. Special and added tokens are written as their text.
  /// Throws rt::Error naming an id that is not in the vocabulary.
  virtual void decode(const uint32_t *ids, size_t count, std::string &out) const = 0;
  /// The text of `ids`.
  std::string decode(const std::vector<uint32_t> &ids) const;
  /// The largest k <= count such that decoding ids[0, k) and ids[k, count) separately gives the
  /// text of all of them: count when a tokenizer decodes token by token, after the last
  /// document boundary when it does not. Lets long token streams be decoded in pieces.
  virtual size_t decodeSplit(const uint32_t *ids, size_t count) const;

  /// Every id is below this (the largest id + 1, added tokens included).
  virtual uint32_t vocabSize() const = 0;
  /// The id of the token written `token` (a vocabulary entry or an added token), if any.
  virtual std::optional<uint32_t> tokenId(std::string_view token) const = 0;

  /// A position in [from, text.size()) after which `text` may be split (see Cut), or nothing.
  /// The default never splits; tokenizers whose pre-tokenization provably splits there say so.
  virtual std::optional<Cut> findCut(std::string_view text, size_t from) const;

  /// The beginning- and end-of-sequence tokens, if known (see setSpecialTokens).
  const std::optional<NamedToken> &bos() const { return bos_; }
  const std::optional<NamedToken> &eos() const { return eos_; }
  /// Sets the BOS and EOS tokens and where they were found (for describe()).
  void setSpecialTokens(std::optional<NamedToken> bos, std::optional<NamedToken> eos,
                        std::string source);

  /// Identifies the vocabulary: FNV-1a (64-bit) over the vocabulary size and the decoded text
  /// of every id (an id that does not decode counts as a marker). Equal for two loads of one
  /// tokenizer, whatever file it came from; different when any id means other text. Recorded
  /// in version-2 token files (docs/data-format.md).
  uint64_t fingerprint() const;

  /// The file it was loaded from.
  const std::string &path() const { return path_; }
  /// One line that says what was loaded: the kind, the vocabulary, the pre-tokenizer, the
  /// special tokens and where they came from.
  std::string describe() const;

protected:
  explicit Tokenizer(std::string path) : path_(std::move(path)) {}
  /// The kind-specific part of describe() ("byte-level BPE (tokenizer.json), ...").
  virtual std::string describeModel() const = 0;

private:
  std::string path_;
  std::optional<NamedToken> bos_, eos_;
  std::string specialSource_;
  std::string note_;
  friend std::unique_ptr<Tokenizer> loadTokenizer(const std::string &path);
};

/// Loads a tokenizer from a Hugging Face model directory (tokenizer.json if it is one this
/// library handles, else tokenizer.model), a tokenizer.json or a tokenizer.model. BOS and EOS
/// come from tokenizer_config.json (or special_tokens_map.json) beside the file when there is
/// one, else from the tokenizer file itself.
std::unique_ptr<Tokenizer> loadTokenizer(const std::string &path);

/// Parses the text of a tokenizer.json; `path` names it in messages. Throws
/// UnsupportedTokenizer for a kind this library does not handle, rt::Error for a malformed one.
std::unique_ptr<Tokenizer> parseHfTokenizer(std::string_view json, const std::string &path);

/// Loads a SentencePiece model (tokenizer.model).
std::unique_ptr<Tokenizer> loadSentencePiece(const std::string &path);

/// `text` with each maximal invalid UTF-8 sequence replaced by U+FFFD, into `scratch`; returns
/// the number of replacements, and leaves `scratch` untouched (returning 0) when `text` is
/// valid.
size_t repairUtf8(std::string_view text, std::string &scratch);

} // namespace bonsai::tok

#endif // BONSAI_TOKENIZER_TOKENIZER_H
