//===- Sha256.h - SHA-256 digests of byte strings and files --------------===//
//
// Checkpoint manifests record the SHA-256 of every file they list, and resuming recomputes it:
// a flipped bit or a truncated file is caught before any byte of it is bound. The runtime
// carries its own implementation (FIPS 180-4) rather than a crypto library; it is checked
// against the standard test vectors in test/runtime/Sha256Test.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_SHA256_H
#define BONSAI_RUNTIME_SHA256_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace bonsai::rt {

/// An incremental SHA-256 computation: update() any number of times, then digest() once.
class Sha256 {
public:
  /// A 32-byte digest.
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  /// Appends `size` bytes at `data` to the message.
  void update(const void *data, size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  /// Pads the message and returns its digest; the object must not be updated afterwards.
  Digest digest();

private:
  void compress(const uint8_t *block);

  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0; ///< Message bytes so far.
};

/// The 64 lowercase hex digits of `digest`.
std::string toHex(const Sha256::Digest &digest);
/// The hex SHA-256 of `bytes`.
std::string sha256Hex(std::string_view bytes);
/// The hex SHA-256 of the file at `path`, read in chunks; sets `size` to its length when
/// non-null. Throws rt::Error naming the file when it cannot be opened or read.
std::string sha256File(const std::string &path, uint64_t *size = nullptr);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_SHA256_H
