//===- Data.cpp - Token files and the (input, label) batch loader ---------===//
//
// The header is validated once when the file is opened (magic, version, token width, and the
// token count against the file size); each step then reads just its window with one positioned
// read, so data files far larger than memory work.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Data.h"

#include "bonsai/runtime/Random.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>

namespace bonsai::rt {

namespace {

uint32_t readLE32(const unsigned char *p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

uint64_t readLE64(const unsigned char *p) {
  return uint64_t(readLE32(p)) | uint64_t(readLE32(p + 4)) << 32;
}

void putLE(std::string &out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out += char((value >> (8 * i)) & 0xff);
}

} // namespace

std::string encodeTokenFileHeader(const TokenFileHeader &header) {
  std::string out(kTokenFileMagic, sizeof kTokenFileMagic);
  putLE(out, header.version, 4);
  putLE(out, header.bytesPerToken, 4);
  putLE(out, header.count, 8);
  if (header.version >= kTokenFileVersion2) {
    putLE(out, header.vocabSize, 4);
    putLE(out, header.padId, 4);
    putLE(out, header.fingerprint, 8);
    putLE(out, header.documents, 8);
  }
  return out;
}

Error TokenFile::fail(const std::string &message) const {
  return Error("token file '" + path_ + "': " + message);
}

TokenFile::TokenFile(const std::string &path) : path_(path) {
  in_.open(path, std::ios::binary);
  if (!in_)
    throw Error("cannot open token file '" + path + "'");
  in_.seekg(0, std::ios::end);
  std::streamoff size = in_.tellg();
  in_.seekg(0);
  if (size < 0)
    throw fail("cannot determine its size (not a regular file?)");
  if (uint64_t(size) < kTokenFileHeaderBytes)
    throw fail("is " + std::to_string(size) + " bytes long, shorter than the " +
               std::to_string(kTokenFileHeaderBytes) + "-byte header (truncated?)");
  unsigned char header[kTokenFileHeaderBytesV2] = {};
  if (!in_.read(reinterpret_cast<char *>(header), kTokenFileHeaderBytes))
    throw fail("cannot read the header");
  if (std::memcmp(header, kTokenFileMagic, sizeof kTokenFileMagic) != 0)
    throw fail("not a Bonsai token file (the first 8 bytes are not \"BONSAITK\")");
  header_.version = readLE32(header + 8);
  if (header_.version != kTokenFileVersion && header_.version != kTokenFileVersion2)
    throw fail("version " + std::to_string(header_.version) +
               " is not supported (this runtime reads versions 1 and 2)");
  header_.bytesPerToken = readLE32(header + 12);
  if (header_.bytesPerToken != 2 && header_.bytesPerToken != 4)
    throw fail("bytes per token is " + std::to_string(header_.bytesPerToken) +
               ", expected 2 or 4");
  count_ = header_.count = readLE64(header + 16);
  headerBytes_ = header_.version == kTokenFileVersion ? kTokenFileHeaderBytes
                                                      : kTokenFileHeaderBytesV2;
  uint32_t width = header_.bytesPerToken;
  if (header_.version == kTokenFileVersion) {
    uint64_t payload = uint64_t(size) - kTokenFileHeaderBytes;
    // Compared by division: count * bytesPerToken may overflow for a corrupted count.
    if (count_ > payload / width)
      throw fail("the header says " + std::to_string(count_) + " tokens, but the file holds only " +
                 std::to_string(payload / width) + " (truncated?)");
    if (payload != count_ * width)
      throw fail("has " + std::to_string(payload - count_ * width) + " bytes after its " +
                 std::to_string(count_) + " tokens");
    return;
  }

  if (uint64_t(size) < kTokenFileHeaderBytesV2)
    throw fail("is " + std::to_string(size) + " bytes long, shorter than the " +
               std::to_string(kTokenFileHeaderBytesV2) + "-byte version-2 header (truncated?)");
  if (!in_.read(reinterpret_cast<char *>(header + kTokenFileHeaderBytes),
                kTokenFileHeaderBytesV2 - kTokenFileHeaderBytes))
    throw fail("cannot read the header");
  header_.vocabSize = readLE32(header + 24);
  header_.padId = readLE32(header + 28);
  header_.fingerprint = readLE64(header + 32);
  header_.documents = readLE64(header + 40);
  if (header_.vocabSize == 0)
    throw fail("the vocabulary size at byte offset 24 is 0");
  if (width == 2 && header_.vocabSize > 65536)
    throw fail("the vocabulary size at byte offset 24 is " + std::to_string(header_.vocabSize) +
               ", more ids than 2 bytes per token hold");
  if (header_.padId >= header_.vocabSize)
    throw fail("the pad id at byte offset 28 is " + std::to_string(header_.padId) +
               ", not below the vocabulary size " + std::to_string(header_.vocabSize));
  uint64_t payload = uint64_t(size) - kTokenFileHeaderBytesV2;
  // Every size is checked by division before it is multiplied: a corrupted count or document
  // count must be an error, not an overflow.
  if (count_ == 0)
    throw fail("the header says 0 tokens (byte offset 16): a file needs at least one");
  if (count_ > payload / width)
    throw fail("the header says " + std::to_string(count_) + " tokens, but the file holds only " +
               std::to_string(payload / width) + " (truncated?)");
  uint64_t rest = payload - count_ * width;
  uint64_t maskBytes = (count_ + 7) / 8;
  if (header_.documents == 0 || header_.documents > count_)
    throw fail("the header says " + std::to_string(header_.documents) + " documents (byte offset " +
               "40) for " + std::to_string(count_) + " tokens: expected 1 to the token count");
  if (rest < maskBytes || (rest - maskBytes) / 8 < header_.documents)
    throw fail("is " + std::to_string(size) + " bytes long, too short for " +
               std::to_string(count_) + " tokens, " + std::to_string(header_.documents) +
               " document ends and the loss mask (truncated?)");
  uint64_t expected = kTokenFileHeaderBytesV2 + count_ * width + header_.documents * 8 + maskBytes;
  if (uint64_t(size) != expected)
    throw fail("has " + std::to_string(uint64_t(size) - expected) + " bytes after its loss mask");
  uint64_t endsOffset = kTokenFileHeaderBytesV2 + count_ * width;
  maskOffset_ = endsOffset + header_.documents * 8;

  std::vector<unsigned char> raw(header_.documents * 8);
  in_.seekg(std::streamoff(endsOffset));
  if (!in_.read(reinterpret_cast<char *>(raw.data()), std::streamsize(raw.size())))
    throw fail("cannot read the document ends at byte offset " + std::to_string(endsOffset));
  documentEnds_.resize(header_.documents);
  uint64_t previous = 0;
  for (uint64_t d = 0; d < header_.documents; ++d) {
    uint64_t end = readLE64(raw.data() + d * 8);
    if (end <= previous || end > count_)
      throw fail("document " + std::to_string(d) + " ends at " + std::to_string(end) +
                 " (byte offset " + std::to_string(endsOffset + d * 8) + "), " +
                 (end > count_ ? "past the " + std::to_string(count_) + " tokens"
                               : "not after the previous end " + std::to_string(previous)));
    documentEnds_[d] = previous = end;
  }
  if (previous != count_)
    throw fail("the last document ends at " + std::to_string(previous) + " (byte offset " +
               std::to_string(endsOffset + (header_.documents - 1) * 8) + "), not at the " +
               std::to_string(count_) + " tokens");
  if (count_ % 8) {
    unsigned char last = 0;
    in_.seekg(std::streamoff(maskOffset_ + maskBytes - 1));
    if (!in_.read(reinterpret_cast<char *>(&last), 1))
      throw fail("cannot read the loss mask");
    if (last >> (count_ % 8))
      throw fail("the loss mask's last byte (byte offset " +
                 std::to_string(maskOffset_ + maskBytes - 1) + ") has bits set past the " +
                 std::to_string(count_) + " tokens");
  }
}

void TokenFile::read(uint64_t first, size_t n, std::vector<uint32_t> &out) {
  if (first > count_ || n > count_ - first)
    throw fail("tokens [" + std::to_string(first) + ", " + std::to_string(first) + " + " +
               std::to_string(n) + ") are past its " + std::to_string(count_) + " tokens");
  uint32_t width = header_.bytesPerToken;
  std::vector<unsigned char> raw(n * width);
  in_.clear();
  in_.seekg(std::streamoff(headerBytes_ + first * width));
  if (n > 0 && !in_.read(reinterpret_cast<char *>(raw.data()), std::streamsize(raw.size())))
    throw fail("cannot read tokens [" + std::to_string(first) + ", " + std::to_string(first + n) +
               ") (was it truncated?)");
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char *p = raw.data() + i * width;
    out[i] = width == 2 ? uint32_t(p[0]) | uint32_t(p[1]) << 8 : readLE32(p);
    if (header_.version == kTokenFileVersion2 && out[i] >= header_.vocabSize)
      throw fail("token " + std::to_string(first + i) + " (byte offset " +
                 std::to_string(headerBytes_ + (first + i) * width) + ") is " +
                 std::to_string(out[i]) + ", not below the file's vocabulary size " +
                 std::to_string(header_.vocabSize));
  }
}

void TokenFile::readMask(uint64_t first, size_t n, std::vector<uint8_t> &out) {
  if (header_.version != kTokenFileVersion2)
    throw fail("a version-1 file has no loss mask");
  if (first > count_ || n > count_ - first)
    throw fail("mask of tokens [" + std::to_string(first) + ", " + std::to_string(first) + " + " +
               std::to_string(n) + ") is past its " + std::to_string(count_) + " tokens");
  out.resize(n);
  if (n == 0)
    return;
  uint64_t firstByte = first / 8, lastByte = (first + n - 1) / 8;
  std::vector<unsigned char> raw(lastByte - firstByte + 1);
  in_.clear();
  in_.seekg(std::streamoff(maskOffset_ + firstByte));
  if (!in_.read(reinterpret_cast<char *>(raw.data()), std::streamsize(raw.size())))
    throw fail("cannot read the loss mask at byte offset " +
               std::to_string(maskOffset_ + firstByte) + " (was it truncated?)");
  for (size_t i = 0; i < n; ++i) {
    uint64_t bit = first + i;
    out[i] = (raw[bit / 8 - firstByte] >> (bit % 8)) & 1;
  }
}

namespace {

void commitFile(const std::string &path, const std::string &bytes) {
  std::string temp = path + ".tmp";
  {
    std::ofstream file(temp, std::ios::binary | std::ios::trunc);
    if (!file || !file.write(bytes.data(), std::streamsize(bytes.size())) || !file.flush())
      throw Error("cannot write token file '" + temp + "'");
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0)
    throw Error("cannot rename '" + temp + "' to '" + path + "': " + std::strerror(errno));
}

void putTokens(std::string &out, const std::string &path, const std::vector<uint32_t> &tokens,
               uint32_t bytesPerToken) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (bytesPerToken == 2 && tokens[i] > 0xffff)
      throw Error("writing token file '" + path + "': token " + std::to_string(i) + " is " +
                  std::to_string(tokens[i]) + ", which does not fit in 2 bytes");
    putLE(out, tokens[i], int(bytesPerToken));
  }
}

} // namespace

void writeTokenFile(const std::string &path, const std::vector<uint32_t> &tokens,
                    uint32_t bytesPerToken) {
  if (bytesPerToken != 2 && bytesPerToken != 4)
    throw Error("writing token file '" + path + "': bytes per token must be 2 or 4");
  TokenFileHeader header;
  header.bytesPerToken = bytesPerToken;
  header.count = tokens.size();
  std::string out = encodeTokenFileHeader(header);
  putTokens(out, path, tokens, bytesPerToken);
  commitFile(path, out);
}

void writeTokenFileV2(const std::string &path, const TokenDocuments &contents) {
  auto fail = [&](const std::string &message) {
    return Error("writing token file '" + path + "': " + message);
  };
  TokenFileHeader header = contents.header;
  header.version = kTokenFileVersion2;
  header.count = contents.tokens.size();
  header.documents = contents.documentEnds.size();
  if (header.bytesPerToken != 2 && header.bytesPerToken != 4)
    throw fail("bytes per token must be 2 or 4");
  if (header.vocabSize == 0 || header.padId >= header.vocabSize)
    throw fail("the pad id " + std::to_string(header.padId) + " is not below the vocabulary size " +
               std::to_string(header.vocabSize));
  if (header.count == 0 || header.documents == 0)
    throw fail("a version-2 file needs at least one document of at least one token");
  if (contents.mask.size() != header.count)
    throw fail("the mask has " + std::to_string(contents.mask.size()) + " entries for " +
               std::to_string(header.count) + " tokens");
  uint64_t previous = 0;
  for (uint64_t end : contents.documentEnds) {
    if (end <= previous || end > header.count)
      throw fail("document ends must increase strictly up to the token count");
    previous = end;
  }
  if (previous != header.count)
    throw fail("the last document must end at the token count");
  for (size_t i = 0; i < contents.tokens.size(); ++i)
    if (contents.tokens[i] >= header.vocabSize)
      throw fail("token " + std::to_string(i) + " is " + std::to_string(contents.tokens[i]) +
                 ", not below the vocabulary size " + std::to_string(header.vocabSize));
  std::string out = encodeTokenFileHeader(header);
  putTokens(out, path, contents.tokens, header.bytesPerToken);
  for (uint64_t end : contents.documentEnds)
    putLE(out, end, 8);
  std::string mask((header.count + 7) / 8, '\0');
  for (size_t i = 0; i < contents.mask.size(); ++i)
    if (contents.mask[i])
      mask[i / 8] = char(mask[i / 8] | (1 << (i % 8)));
  out += mask;
  commitFile(path, out);
}

void checkSameTokenizer(const TokenFile &a, const TokenFile &b) {
  if (a.version() != kTokenFileVersion2 || b.version() != kTokenFileVersion2)
    return;
  const TokenFileHeader &x = a.header(), &y = b.header();
  if (x.vocabSize != y.vocabSize || x.fingerprint != y.fingerprint) {
    char fx[20], fy[20];
    std::snprintf(fx, sizeof fx, "%016llx", (unsigned long long)x.fingerprint);
    std::snprintf(fy, sizeof fy, "%016llx", (unsigned long long)y.fingerprint);
    throw Error("token files '" + a.path() + "' and '" + b.path() +
                "' were made with different tokenizers (vocabulary " +
                std::to_string(x.vocabSize) + ", fingerprint " + fx + " vs vocabulary " +
                std::to_string(y.vocabSize) + ", fingerprint " + fy + ")");
  }
}

/// The version-2 packing: each epoch's documents in their (shuffled) order, cut into pieces of
/// at most T tokens, laid greedily into rows. Layouts are computed on demand from the epoch
/// number alone and the two most recent are cached.
struct TokenLoader::Packing {
  struct Piece {
    uint64_t start = 0;
    uint32_t length = 0;
    bool last = false; // the document's last piece
  };
  struct Epoch {
    uint64_t index = 0;
    std::vector<Piece> pieces;
    std::vector<uint64_t> rowStart; // row r holds pieces [rowStart[r], rowStart[r + 1])
    uint64_t rows() const { return rowStart.size() - 1; }
  };
  std::vector<uint64_t> firstRow{0}; // firstRow[e]: rows in the epochs before e
  std::deque<Epoch> cache;
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;

  /// Epoch `index`'s layout: its documents in order (shuffled from the seed and the epoch
  /// number), each cut into pieces of at most `seq` tokens, laid greedily into rows: a piece
  /// goes into the current row if it fits, else starts the next one.
  static Epoch layout(const std::vector<uint64_t> &ends, uint64_t seq, uint64_t seed,
                      bool shuffle, uint64_t index) {
    std::vector<uint64_t> order(ends.size());
    for (uint64_t d = 0; d < order.size(); ++d)
      order[d] = d;
    if (shuffle) {
      // One stream per epoch: epoch e's order depends on (seed, e) alone.
      uint64_t state = seed ^ 0xbb67ae8584caa73bull;
      state += (index + 1) * 0x9e3779b97f4a7c15ull;
      Rng rng(splitmix64(state));
      for (uint64_t i = order.size(); i > 1; --i)
        std::swap(order[i - 1], order[rng.below(i)]);
    }
    Epoch e;
    e.index = index;
    e.rowStart.push_back(0);
    uint64_t used = 0;
    for (uint64_t d : order) {
      uint64_t begin = d ? ends[d - 1] : 0, end = ends[d];
      for (uint64_t p = begin; p < end; p += seq) {
        Piece piece;
        piece.start = p;
        piece.length = uint32_t(std::min(seq, end - p));
        piece.last = p + seq >= end;
        if (used + piece.length > seq) {
          e.rowStart.push_back(e.pieces.size());
          used = 0;
        }
        e.pieces.push_back(piece);
        used += piece.length;
      }
    }
    e.rowStart.push_back(e.pieces.size());
    return e;
  }

  const Epoch &epoch(const TokenFile &file, uint64_t seq, uint64_t seed, bool shuffle,
                     uint64_t index) {
    for (const Epoch &e : cache)
      if (e.index == index)
        return e;
    cache.push_back(layout(file.documentEnds(), seq, seed, shuffle, index));
    if (cache.size() > 2)
      cache.pop_front();
    return cache.back();
  }

  /// The epoch and row within it of global row `row` (rows count on across epochs).
  std::pair<uint64_t, uint64_t> locate(const TokenFile &file, uint64_t seq, uint64_t seed,
                                       bool shuffle, uint64_t row) {
    while (firstRow.back() <= row) {
      uint64_t e = firstRow.size() - 1;
      firstRow.push_back(firstRow.back() + epoch(file, seq, seed, shuffle, e).rows());
    }
    uint64_t e = uint64_t(std::upper_bound(firstRow.begin(), firstRow.end(), row) -
                          firstRow.begin()) - 1;
    return {e, row - firstRow[e]};
  }
};

TokenLoader::TokenLoader(const std::string &path, int64_t batch, int64_t seq, int64_t vocab,
                         uint64_t seed, bool shuffle)
    : batch_(batch), seq_(seq), vocab_(vocab), seed_(seed), shuffle_(shuffle) {
  if (batch <= 0 || seq <= 0)
    throw Error("token loader: batch and sequence must be positive, got " + std::to_string(batch) +
                " and " + std::to_string(seq));
  uint64_t needed = uint64_t(batch) * uint64_t(seq) + 1;
  if (path.empty()) {
    if (vocab <= 0)
      throw Error("random tokens need a positive vocabulary size (the plan's vocab_size), got " +
                  std::to_string(vocab) + ": pass --data");
    return;
  }
  file_ = std::make_unique<TokenFile>(path);
  if (file_->version() == kTokenFileVersion2) {
    if (vocab > 0 && int64_t(file_->header().vocabSize) > vocab)
      throw Error("token file '" + path + "' was made with a tokenizer of vocabulary " +
                  std::to_string(file_->header().vocabSize) +
                  ", larger than the plan's vocab_size " + std::to_string(vocab) +
                  " (another model's tokenizer?)");
    if (uint64_t(seq) > std::numeric_limits<uint32_t>::max())
      throw Error("token loader: sequence length " + std::to_string(seq) + " is too long");
    packing_ = std::make_unique<Packing>();
    return;
  }
  if (file_->count() < needed)
    throw Error("token file '" + path + "' has " + std::to_string(file_->count()) +
                " tokens, but a batch of " + std::to_string(batch) + " x " + std::to_string(seq) +
                " needs at least " + std::to_string(needed) + " (batch * seq + 1)");
}

TokenLoader::~TokenLoader() = default;

uint64_t TokenLoader::windowStart(uint64_t step) const {
  if (!file_ || packing_)
    return 0;
  uint64_t bt = uint64_t(batch_) * uint64_t(seq_);
  uint64_t range = file_->count() - bt;
  // step * B * T can exceed 64 bits on long runs: reduce in 128-bit arithmetic.
  return uint64_t((static_cast<unsigned __int128>(step) * bt) % range);
}
uint64_t TokenLoader::fileBatches() const {
  if (!file_)
    return 0;
  if (packing_) {
    uint64_t rows = packing_->epoch(*file_, uint64_t(seq_), seed_, shuffle_, 0).rows();
    return std::max<uint64_t>(1, rows / uint64_t(batch_));
  }
  // Batch m < this reads tokens [m * B * T, (m + 1) * B * T] below the count - B * T at which
  // windowStart wraps; the constructor checked count >= B * T + 1.
  return (file_->count() - 1) / (uint64_t(batch_) * uint64_t(seq_));
}

TokenBatch TokenLoader::packedBatch(uint64_t step) {
  Packing &pk = *packing_;
  size_t T = size_t(seq_);
  uint32_t pad = file_->header().padId;
  TokenBatch b;
  b.batch = batch_;
  b.seq = seq_;
  size_t bt = size_t(batch_) * T;
  b.inputs.assign(bt, pad);
  b.labels.assign(bt, kIgnoreLabel);
  b.positions.assign(bt, 0);
  b.segmentIds.assign(bt, 0);
  for (int64_t r = 0; r < batch_; ++r) {
    auto [epochIndex, row] =
        pk.locate(*file_, T, seed_, shuffle_, step * uint64_t(batch_) + uint64_t(r));
    const Packing::Epoch &e = pk.epoch(*file_, T, seed_, shuffle_, epochIndex);
    size_t at = size_t(r) * T, used = 0;
    int64_t segment = 0;
    for (uint64_t i = e.rowStart[row]; i < e.rowStart[row + 1]; ++i, ++segment) {
      const Packing::Piece &piece = e.pieces[i];
      // The token after a piece that does not end its document is its last token's target.
      size_t n = piece.length + (piece.last ? 0 : 1);
      file_->read(piece.start, n, pk.tokens);
      file_->readMask(piece.start, n, pk.mask);
      for (size_t j = 0; j < piece.length; ++j, ++used) {
        size_t k = at + used;
        uint32_t id = pk.tokens[j];
        if (vocab_ > 0 && int64_t(id) >= vocab_)
          throw Error("token file '" + file_->path() + "': token " +
                      std::to_string(piece.start + j) + " is " + std::to_string(id) +
                      ", not below the vocabulary size " + std::to_string(vocab_));
        b.inputs[k] = id;
        if (j + 1 < n && pk.mask[j + 1])
          b.labels[k] = pk.tokens[j + 1];
        b.positions[k] = int64_t(j);
        b.segmentIds[k] = segment;
      }
    }
    // Padding is a segment of its own, after the row's documents.
    for (size_t j = 0; used < T; ++j, ++used) {
      b.positions[at + used] = int64_t(j);
      b.segmentIds[at + used] = segment;
    }
  }
  return b;
}

TokenBatch TokenLoader::batch(uint64_t step) {
  if (packing_)
    return packedBatch(step);
  size_t bt = size_t(batch_) * size_t(seq_);
  uint64_t start = windowStart(step);
  if (file_) {
    file_->read(start, bt + 1, window_);
    if (vocab_ > 0)
      for (size_t i = 0; i < window_.size(); ++i)
        if (int64_t(window_[i]) >= vocab_)
          throw Error("token file '" + file_->path() + "': token " + std::to_string(start + i) +
                      " is " + std::to_string(window_[i]) + ", not below the vocabulary size " +
                      std::to_string(vocab_));
  } else {
    // One stream per step, so step s's batch does not depend on the steps before it.
    uint64_t state = seed_ ^ 0x6a09e667f3bcc909ull;
    state += step * 0x9e3779b97f4a7c15ull;
    Rng rng(splitmix64(state));
    window_.resize(bt + 1);
    for (uint32_t &token : window_)
      token = uint32_t(rng.below(uint64_t(vocab_)));
  }
  TokenBatch b;
  b.batch = batch_;
  b.seq = seq_;
  b.inputs.assign(window_.begin(), window_.begin() + std::ptrdiff_t(bt));
  b.labels.assign(window_.begin() + 1, window_.begin() + std::ptrdiff_t(bt) + 1);
  // A version-1 file or random tokens form one document per row as far as attention knows.
  b.positions.resize(bt);
  for (size_t i = 0; i < bt; ++i)
    b.positions[i] = int64_t(i % size_t(seq_));
  b.segmentIds.assign(bt, 0);
  return b;
}

void writeTokenBatch(const TokenBatch &batch, const TensorView &ids, const TensorView &labels) {
  std::vector<int64_t> shape = {batch.batch, batch.seq};
  const std::pair<const std::vector<int64_t> *, const TensorView *> targets[] = {
      {&batch.inputs, &ids}, {&batch.labels, &labels}};
  for (const auto &[values, view] : targets) {
    if (view->shape != shape)
      throw Error("token batch " + formatShape(shape) + " does not fit the plan input of shape " +
                  formatShape(view->shape));
    if (values->size() != size_t(batch.batch * batch.seq))
      throw Error("internal error: token batch has " + std::to_string(values->size()) + " ids");
    if (view->dtype == DType::I64) {
      std::memcpy(view->data, values->data(), values->size() * sizeof(int64_t));
    } else if (view->dtype == DType::I32) {
      auto *out = static_cast<int32_t *>(view->data);
      for (size_t i = 0; i < values->size(); ++i) {
        int64_t v = (*values)[i];
        if (v > std::numeric_limits<int32_t>::max())
          throw Error("token id " + std::to_string(v) + " does not fit the plan's i32 input");
        out[i] = int32_t(v);
      }
    } else {
      throw Error(std::string("plan input dtype ") + dtypeName(view->dtype) +
                  " cannot hold token ids (expected i32 or i64)");
    }
  }
}

} // namespace bonsai::rt
