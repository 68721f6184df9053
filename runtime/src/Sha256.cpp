//===- Sha256.cpp - SHA-256 digests of byte strings and files ------------===//
//
// FIPS 180-4 SHA-256: 64-byte blocks, big-endian words, the message padded with 0x80, zeros
// and its bit length. Files are hashed through a 1 MiB buffer, so a checkpoint of any size is
// verified in constant memory.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Sha256.h"

#include "bonsai/runtime/Tensor.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace bonsai::rt {

namespace {

constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t kInitialState[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

} // namespace

Sha256::Sha256() { std::memcpy(state_, kInitialState, sizeof state_); }

void Sha256::compress(const uint8_t *block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t(block[4 * i]) << 24 | uint32_t(block[4 * i + 1]) << 16 |
           uint32_t(block[4 * i + 2]) << 8 | uint32_t(block[4 * i + 3]);
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = h + s1 + ch + kRoundConstants[i] + w[i];
    uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void *data, size_t size) {
  if (size == 0)
    return; // data may be null
  const auto *p = static_cast<const uint8_t *>(data);
  length_ += size;
  if (buffered_ > 0) {
    size_t take = std::min(size, sizeof buffer_ - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < sizeof buffer_)
      return;
    compress(buffer_);
    buffered_ = 0;
  }
  for (; size >= 64; p += 64, size -= 64)
    compress(p);
  if (size > 0) {
    std::memcpy(buffer_, p, size);
    buffered_ = size;
  }
}

Sha256::Digest Sha256::digest() {
  uint64_t bits = length_ * 8;
  uint8_t pad[72] = {0x80};
  // 0x80, then zeros up to 56 mod 64, then the 8-byte big-endian bit length.
  size_t padLength = (buffered_ < 56 ? 56 - buffered_ : 120 - buffered_);
  update(pad, padLength);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = uint8_t(bits >> (56 - 8 * i));
  update(length, 8);
  Digest out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j)
      out[size_t(4 * i + j)] = uint8_t(state_[i] >> (24 - 8 * j));
  return out;
}

std::string toHex(const Sha256::Digest &digest) {
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(64);
  for (uint8_t byte : digest) {
    hex += kDigits[byte >> 4];
    hex += kDigits[byte & 15];
  }
  return hex;
}

std::string sha256Hex(std::string_view bytes) {
  Sha256 sha;
  sha.update(bytes);
  return toHex(sha.digest());
}

std::string sha256File(const std::string &path, uint64_t *size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error("cannot open '" + path + "': " + std::strerror(errno));
  Sha256 sha;
  std::vector<uint8_t> buffer(size_t(1) << 20);
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      std::string reason = std::strerror(errno);
      ::close(fd);
      throw Error("cannot read '" + path + "': " + reason);
    }
    if (n == 0)
      break;
    sha.update(buffer.data(), size_t(n));
    total += uint64_t(n);
  }
  ::close(fd);
  if (size)
    *size = total;
  return toHex(sha.digest());
}

} // namespace bonsai::rt
