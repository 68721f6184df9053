//===- Data.cpp - Token files and the (input, label) batch loader ---------===//
//
// The header is validated once when the file is opened (magic, version, token width, and the
// token count against the file size); each step then reads just its window with one positioned
// read, so data files far larger than memory work.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Data.h"

#include "bonsai/runtime/Random.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
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

TokenFile::TokenFile(const std::string &path) : path_(path) {
  auto fail = [&](const std::string &message) -> Error {
    return Error("token file '" + path + "': " + message);
  };
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
  unsigned char header[kTokenFileHeaderBytes];
  if (!in_.read(reinterpret_cast<char *>(header), sizeof header))
    throw fail("cannot read the header");
  if (std::memcmp(header, kTokenFileMagic, sizeof kTokenFileMagic) != 0)
    throw fail("not a Bonsai token file (the first 8 bytes are not \"BONSAITK\")");
  uint32_t version = readLE32(header + 8);
  if (version != kTokenFileVersion)
    throw fail("version " + std::to_string(version) + " is not supported (this runtime reads version " +
               std::to_string(kTokenFileVersion) + ")");
  bytesPerToken_ = readLE32(header + 12);
  if (bytesPerToken_ != 2 && bytesPerToken_ != 4)
    throw fail("bytes per token is " + std::to_string(bytesPerToken_) + ", expected 2 or 4");
  count_ = readLE64(header + 16);
  uint64_t payload = uint64_t(size) - kTokenFileHeaderBytes;
  // Compared by division: count * bytesPerToken may overflow for a corrupted count.
  if (count_ > payload / bytesPerToken_)
    throw fail("the header says " + std::to_string(count_) + " tokens, but the file holds only " +
               std::to_string(payload / bytesPerToken_) + " (truncated?)");
  if (payload != count_ * bytesPerToken_)
    throw fail("has " + std::to_string(payload - count_ * bytesPerToken_) +
               " bytes after its " + std::to_string(count_) + " tokens");
}

void TokenFile::read(uint64_t first, size_t n, std::vector<uint32_t> &out) {
  if (first > count_ || n > count_ - first)
    throw Error("token file '" + path_ + "': tokens [" + std::to_string(first) + ", " +
                std::to_string(first) + " + " + std::to_string(n) + ") are past its " +
                std::to_string(count_) + " tokens");
  std::vector<unsigned char> raw(n * bytesPerToken_);
  in_.clear();
  in_.seekg(std::streamoff(kTokenFileHeaderBytes + first * bytesPerToken_));
  if (n > 0 && !in_.read(reinterpret_cast<char *>(raw.data()), std::streamsize(raw.size())))
    throw Error("token file '" + path_ + "': cannot read tokens [" + std::to_string(first) +
                ", " + std::to_string(first + n) + ") (was it truncated?)");
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char *p = raw.data() + i * bytesPerToken_;
    out[i] = bytesPerToken_ == 2 ? uint32_t(p[0]) | uint32_t(p[1]) << 8 : readLE32(p);
  }
}

void writeTokenFile(const std::string &path, const std::vector<uint32_t> &tokens,
                    uint32_t bytesPerToken) {
  if (bytesPerToken != 2 && bytesPerToken != 4)
    throw Error("writing token file '" + path + "': bytes per token must be 2 or 4");
  std::string out(kTokenFileMagic, sizeof kTokenFileMagic);
  putLE(out, kTokenFileVersion, 4);
  putLE(out, bytesPerToken, 4);
  putLE(out, tokens.size(), 8);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (bytesPerToken == 2 && tokens[i] > 0xffff)
      throw Error("writing token file '" + path + "': token " + std::to_string(i) + " is " +
                  std::to_string(tokens[i]) + ", which does not fit in 2 bytes");
    putLE(out, tokens[i], int(bytesPerToken));
  }
  std::string temp = path + ".tmp";
  {
    std::ofstream file(temp, std::ios::binary | std::ios::trunc);
    if (!file || !file.write(out.data(), std::streamsize(out.size())) || !file.flush())
      throw Error("cannot write token file '" + temp + "'");
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0)
    throw Error("cannot rename '" + temp + "' to '" + path + "': " + std::strerror(errno));
}

TokenLoader::TokenLoader(const std::string &path, int64_t batch, int64_t seq, int64_t vocab,
                         uint64_t seed)
    : batch_(batch), seq_(seq), vocab_(vocab), seed_(seed) {
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
  if (file_->count() < needed)
    throw Error("token file '" + path + "' has " + std::to_string(file_->count()) +
                " tokens, but a batch of " + std::to_string(batch) + " x " + std::to_string(seq) +
                " needs at least " + std::to_string(needed) + " (batch * seq + 1)");
}

uint64_t TokenLoader::windowStart(uint64_t step) const {
  if (!file_)
    return 0;
  uint64_t bt = uint64_t(batch_) * uint64_t(seq_);
  uint64_t range = file_->count() - bt;
  // step * B * T can exceed 64 bits on long runs: reduce in 128-bit arithmetic.
  return uint64_t((static_cast<unsigned __int128>(step) * bt) % range);
}

uint64_t TokenLoader::fileBatches() const {
  if (!file_)
    return 0;
  // Batch m < this reads tokens [m * B * T, (m + 1) * B * T] below the count - B * T at which
  // windowStart wraps; the constructor checked count >= B * T + 1.
  return (file_->count() - 1) / (uint64_t(batch_) * uint64_t(seq_));
}

TokenBatch TokenLoader::batch(uint64_t step) {
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
