//===- Data.h - Token files and the (input, label) batch loader -----------===//
//
// Training data is a pre-tokenized file (docs/data-format.md): a 24-byte header ("BONSAITK",
// version, bytes per token, token count) followed by little-endian uint16 or uint32 token ids.
// Step s reads the window of B*T + 1 tokens starting at (s * B * T) mod (count - B*T); inputs
// are the first B*T of them and labels the same shifted by one. Without a file, tokens are drawn
// uniformly from the vocabulary from the seed. Either way a batch is a pure function of the
// step number, which is what makes runs and resumes deterministic.
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
/// The token file format version this runtime reads.
inline constexpr uint32_t kTokenFileVersion = 1;
/// Bytes before the first token.
inline constexpr uint64_t kTokenFileHeaderBytes = 24;

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
  uint32_t bytesPerToken() const { return bytesPerToken_; }

  /// Reads tokens [first, first + n) into `out` (resized to n).
  void read(uint64_t first, size_t n, std::vector<uint32_t> &out);

private:
  std::string path_;
  std::ifstream in_;
  uint64_t count_ = 0;
  uint32_t bytesPerToken_ = 0;
};

/// Writes a token file (temporary name, then rename). `bytesPerToken` is 2 or 4; every token
/// must fit in it.
void writeTokenFile(const std::string &path, const std::vector<uint32_t> &tokens,
                    uint32_t bytesPerToken);

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
  /// against it as they are read). Throws rt::Error if the file has fewer than
  /// batch * seq + 1 tokens.
  TokenLoader(const std::string &path, int64_t batch, int64_t seq, int64_t vocab, uint64_t seed);

  /// The batch of step `step` (counting from 0). Throws rt::Error naming the file, the token
  /// position and the value of an id outside [0, vocab).
  TokenBatch batch(uint64_t step);

  /// Where step `step`'s window starts in the file: (step * B * T) mod (count - B * T).
  uint64_t windowStart(uint64_t step) const;

  /// How many batches the file holds one after another from its start before the windows
  /// wrap around: floor((count - 1) / (B * T)), at least 1. Batches 0 to fileBatches() - 1
  /// read each token at most once as an input (an evaluation set's batches); 0 without a file.
  uint64_t fileBatches() const;

private:
  std::unique_ptr<TokenFile> file_;
  int64_t batch_, seq_, vocab_;
  uint64_t seed_;
  std::vector<uint32_t> window_;
};

/// Writes `batch` into the plan's ids and labels tensors (I32 or I64, shape [batch, seq]).
void writeTokenBatch(const TokenBatch &batch, const TensorView &ids, const TensorView &labels);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_DATA_H
