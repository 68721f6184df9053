//===- Sha256Test.cpp - SHA-256 against the FIPS 180-4 test vectors -------===//
//
// The standard vectors ("", "abc", the 448- and 896-bit messages, a million 'a'), digests that
// do not depend on how the message is split across update() calls (every split of a message
// that crosses the 55/56/64-byte padding boundaries), and hashing a file.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Sha256.h"

#include "TestPlans.h"
#include "bonsai/runtime/Tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace bonsai::rt {
namespace {

TEST(Sha256Test, StandardVectors) {
  EXPECT_EQ(sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklm"
                      "nopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256Test, OneMillionAs) {
  // Fed in uneven pieces, so the buffered path is exercised too.
  Sha256 sha;
  std::string piece(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    size_t n = std::min(left, piece.size());
    sha.update(piece.data(), n);
    left -= n;
  }
  EXPECT_EQ(toHex(sha.digest()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, SplitsDoNotMatter) {
  std::string message;
  for (int i = 0; i < 130; ++i)
    message += char('A' + i % 53);
  for (size_t length : {0u, 1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 128u, 130u}) {
    std::string m = message.substr(0, length);
    std::string whole = sha256Hex(m);
    for (size_t split = 0; split <= length; ++split) {
      Sha256 sha;
      sha.update(m.data(), split);
      sha.update(m.data() + split, length - split);
      ASSERT_EQ(toHex(sha.digest()), whole) << "length " << length << " split " << split;
    }
  }
}

TEST(Sha256Test, HashesAFile) {
  std::string path = test::tempPath("sha.bin");
  std::string content;
  for (int i = 0; i < 3000000; ++i) // larger than the 1 MiB read buffer
    content += char(i * 7 + i / 256);
  test::writeFile(path, std::vector<uint8_t>(content.begin(), content.end()));
  uint64_t size = 0;
  EXPECT_EQ(sha256File(path, &size), sha256Hex(content));
  EXPECT_EQ(size, content.size());
  std::remove(path.c_str());
  try {
    sha256File(path);
    FAIL() << "a missing file hashed";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

} // namespace
} // namespace bonsai::rt
