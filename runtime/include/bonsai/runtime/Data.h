//===- Data.h - Token files and the (input, label) batch loader -----------===//
//
// Training data is a pre-tokenized file (docs/data-format.md): a 24-byte header ("BONSAITK",
// version, bytes per token, token count) followed by little-endian uint16 or uint32 token ids.
// Version 1 is a plain stream: step s reads the window of B*T + 1 tokens starting at
// (s * B * T) mod (count - B*T); inputs are the first B*T of them and labels the same shifted by
// one. Version 2 adds the tokenizer's vocabulary size and fingerprint, the documents' boundaries
// and a per-token loss mask: its documents are packed into rows of T tokens in an order shuffled
// per epoch from the seed, with labels only where the next token is in the same document and
// counts in the loss. Without a file, tokens are drawn uniformly from the vocabulary from the
// seed. Either way a batch is a pure function of the step number, which is what makes runs and
// resumes deterministic.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_DATA_H
#define BONSAI_RUNTIME_DATA_H

#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace bonsai::rt {

/// The eight magic bytes that open a token file.
inline constexpr char kTokenFileMagic[8] = {'B', 'O', 'N', 'S', 'A', 'I', 'T', 'K'};
/// The plain token stream's format version (still written by bonsai-tokenize for text).
inline constexpr uint32_t kTokenFileVersion = 1;
/// The version with vocabulary, fingerprint, documents and loss mask.
inline constexpr uint32_t kTokenFileVersion2 = 2;
/// Bytes before the first token in version 1.
inline constexpr uint64_t kTokenFileHeaderBytes = 24;
/// Bytes before the first token in version 2.
inline constexpr uint64_t kTokenFileHeaderBytesV2 = 48;
/// The label of a position whose prediction is not trained (the models' cross_entropy
/// ignore_index).
inline constexpr int64_t kIgnoreLabel = -100;

/// The fields of a token file header. Version 1 uses the first three.
struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  /// 2 (uint16 ids) or 4 (uint32 ids).
  uint32_t bytesPerToken = 2;
  /// Number of tokens.
  uint64_t count = 0;
  /// Version 2: every id is below this (the tokenizer's vocabulary size, > 0).
  uint32_t vocabSize = 0;
  /// Version 2: the id the loader pads rows with (below vocabSize).
  uint32_t padId = 0;
  /// Version 2: identifies the tokenizer (tok::Tokenizer::fingerprint()); files made with
  /// different tokenizers have different fingerprints.
  uint64_t fingerprint = 0;
  /// Version 2: number of documents.
  uint64_t documents = 0;
};

/// The header's bytes (24 for version 1, 48 for version 2).
std::string encodeTokenFileHeader(const TokenFileHeader &header);

/// An open, validated token file.
class TokenFile {
public:
  /// Opens `path` and validates its header and its size. Throws rt::Error naming the file.
  explicit TokenFile(const std::string &path);

  /// The path it was opened from.
  const std::string &path() const { return path_; }
  /// Number of tokens.
  uint64_t count() const { return count_; }
  /// 2 (uint16 ids) or 4 (uint32 ids).
  uint32_t bytesPerToken() const { return header_.bytesPerToken; }
  /// 1 or 2.
  uint32_t version() const { return header_.version; }
  /// The whole header (version-2 fields are 0 in a version-1 file).
  const TokenFileHeader &header() const { return header_; }
  /// Version 2: where each document ends (exclusive), strictly increasing, the last == count().
  /// Empty for version 1.
  const std::vector<uint64_t> &documentEnds() const { return documentEnds_; }

  /// Reads tokens [first, first + n) into `out` (resized to n). In a version-2 file, an id at
  /// or above the header's vocabulary size is an error naming the token and its byte offset.
  void read(uint64_t first, size_t n, std::vector<uint32_t> &out);
  /// Version 2: reads the loss mask of tokens [first, first + n) into `out` (1: the token counts
  /// in the loss, 0: it does not).
  void readMask(uint64_t first, size_t n, std::vector<uint8_t> &out);

private:
  Error fail(const std::string &message) const;
  std::string path_;
  std::ifstream in_;
  TokenFileHeader header_;
  uint64_t count_ = 0;
  uint64_t headerBytes_ = 0, maskOffset_ = 0;
  std::vector<uint64_t> documentEnds_;
};

/// Writes a token file (temporary name, then rename). `bytesPerToken` is 2 or 4; every token
/// must fit in it.
void writeTokenFile(const std::string &path, const std::vector<uint32_t> &tokens,
                    uint32_t bytesPerToken);

/// The contents of a version-2 token file.
struct TokenDocuments {
  /// The header's version-2 fields (version, count and documents are filled in by the writer).
  TokenFileHeader header;
  /// Every document's tokens, concatenated.
  std::vector<uint32_t> tokens;
  /// Where each document ends in `tokens` (exclusive), strictly increasing.
  std::vector<uint64_t> documentEnds;
  /// Per token: 1 when it counts in the loss (is a target), 0 when not (a prompt).
  std::vector<uint8_t> mask;
};

/// Writes a version-2 token file (temporary name, then rename). Throws rt::Error for
/// inconsistent contents (ends not increasing or not ending at the token count, a mask of
/// another length, an id not below the vocabulary size).
void writeTokenFileV2(const std::string &path, const TokenDocuments &contents);

/// The tokens of one step: `batch * seq` inputs and labels, row-major [batch, seq].
struct TokenBatch {
  /// Rows (B) and tokens per row (T).
  int64_t batch = 0;
  int64_t seq = 0;
  std::vector<int64_t> inputs;
  std::vector<int64_t> labels;
  /// Each token's position within its document, restarting at 0 at each document start
  /// (0..T-1 on every row for version-1 files and random tokens).
  std::vector<int64_t> positions;
  /// Which document of its row each token belongs to, numbered from 0; padding has its own
  /// id (all 0 for version-1 files and random tokens).
  std::vector<int64_t> segmentIds;
};

/// Produces the batch of each step, from a token file or from the seed.
class TokenLoader {
public:
  /// Batches of [batch, seq] from the token file at `path`, or random tokens in [0, vocab)
  /// from `seed` when `path` is empty. `vocab` > 0 bounds the ids (a file's ids are checked
  /// against it as they are read; a version-2 file whose vocabulary is larger is refused at
  /// once). Throws rt::Error if a version-1 file has fewer than batch * seq + 1 tokens.
  /// `shuffle` (version 2 only) orders each epoch's documents by a permutation drawn from
  /// `seed` and the epoch; without it every epoch reads them in file order.
  TokenLoader(const std::string &path, int64_t batch, int64_t seq, int64_t vocab, uint64_t seed,
              bool shuffle = true);
  ~TokenLoader();

  /// The batch of step `step` (counting from 0). Throws rt::Error naming the file, the token
  /// position and the value of an id outside [0, vocab).
  TokenBatch batch(uint64_t step);

  /// Version 1: where step `step`'s window starts in the file: (step * B * T) mod
  /// (count - B * T). 0 for version 2 and random tokens.
  uint64_t windowStart(uint64_t step) const;

  /// How many batches the file holds before it repeats: for version 1 floor((count - 1) /
  /// (B * T)), for version 2 floor(rows of the first epoch / B); at least 1. Batches 0 to
  /// fileBatches() - 1 read each token at most once as an input (an evaluation set's batches);
  /// 0 without a file.
  uint64_t fileBatches() const;

  /// The open file, or nullptr for random tokens.
  const TokenFile *file() const { return file_.get(); }

private:
  struct Packing;
  TokenBatch packedBatch(uint64_t step);
  std::unique_ptr<TokenFile> file_;
  int64_t batch_, seq_, vocab_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<uint32_t> window_;
  std::unique_ptr<Packing> packing_;
};

/// Checks that two token files were made with the same tokenizer (version-2 vocabulary size
/// and fingerprint; a version-1 file records neither and matches anything). Throws rt::Error
/// naming both files and what differs.
void checkSameTokenizer(const TokenFile &a, const TokenFile &b);

/// Writes `batch` into the plan's ids and labels tensors (I32 or I64, shape [batch, seq]).
void writeTokenBatch(const TokenBatch &batch, const TensorView &ids, const TensorView &labels);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_DATA_H
