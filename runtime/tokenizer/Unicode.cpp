//===- Unicode.cpp - UTF-8 and Unicode helpers of the tokenizers -----------===//
//
// UTF-8 validity follows the Unicode standard's table 3-7 (no overlongs, no surrogates, nothing
// above U+10FFFF), and repair replaces each maximal subpart of an ill-formed sequence by one
// U+FFFD, which is what Python's decoder does with errors="replace": a corpus read here and the
// same corpus read by Python give the same text.
//
//===----------------------------------------------------------------------===//

#include "Unicode.h"

#include "bonsai/runtime/Tensor.h"
#include "bonsai/tokenizer/Tokenizer.h"

#include <cstring>

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

namespace bonsai::tok {

namespace {

/// The length of the valid UTF-8 sequence at text[i], or the length of its maximal ill-formed
/// prefix (at least 1) negated.
long sequenceAt(std::string_view text, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  unsigned char b = byte(i);
  if (b < 0x80)
    return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xbf;
  if (b >= 0xc2 && b <= 0xdf) {
    need = 1;
  } else if (b >= 0xe0 && b <= 0xef) {
    need = 2;
    if (b == 0xe0)
      lo = 0xa0;
    else if (b == 0xed)
      hi = 0x9f;
  } else if (b >= 0xf0 && b <= 0xf4) {
    need = 3;
    if (b == 0xf0)
      lo = 0x90;
    else if (b == 0xf4)
      hi = 0x8f;
  } else {
    return -1;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= text.size())
      return -long(k);
    unsigned char c = byte(i + k);
    // Only the second byte has the narrowed range.
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xbf))
      return -long(k);
  }
  return long(need + 1);
}

} // namespace

size_t firstInvalidUtf8(std::string_view text) {
  size_t i = 0, n = text.size();
  while (i < n) {
    // ASCII runs, eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, text.data() + i, 8);
      if (w & 0x8080808080808080ull)
        break;
      i += 8;
    }
    if (i >= n)
      break;
    long len = sequenceAt(text, i);
    if (len < 0)
      return i;
    i += size_t(len);
  }
  return n;
}

size_t repairUtf8(std::string_view text, std::string &scratch) {
  size_t bad = firstInvalidUtf8(text);
  if (bad == text.size())
    return 0;
  std::string out(text.substr(0, bad));
  size_t replaced = 0;
  for (size_t i = bad; i < text.size();) {
    long len = sequenceAt(text, i);
    if (len > 0) {
      out.append(text.data() + i, size_t(len));
      i += size_t(len);
    } else {
      out += "\xef\xbf\xbd";
      ++replaced;
      i += size_t(-len);
    }
  }
  scratch = std::move(out);
  return replaced;
}

uint32_t decodeUtf8(std::string_view text, size_t i, size_t &length) {
  auto b = [&](size_t k) { return uint32_t(static_cast<unsigned char>(text[i + k])); };
  uint32_t c = b(0);
  if (c < 0x80) {
    length = 1;
    return c;
  }
  if (c < 0xe0) {
    length = 2;
    return (c & 0x1f) << 6 | (b(1) & 0x3f);
  }
  if (c < 0xf0) {
    length = 3;
    return (c & 0x0f) << 12 | (b(1) & 0x3f) << 6 | (b(2) & 0x3f);
  }
  length = 4;
  return (c & 0x07) << 18 | (b(1) & 0x3f) << 12 | (b(2) & 0x3f) << 6 | (b(3) & 0x3f);
}

uint32_t decodeUtf8Before(std::string_view text, size_t end, size_t &length) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80)
    --start;
  return decodeUtf8(text, start, length);
}

void appendUtf8(uint32_t cp, std::string &out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | cp >> 6);
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | cp >> 12);
    out += char(0x80 | (cp >> 6 & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | cp >> 18);
    out += char(0x80 | (cp >> 12 & 0x3f));
    out += char(0x80 | (cp >> 6 & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

bool isRustWordChar(uint32_t cp) {
  UChar32 c = UChar32(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL))
    return true;
  int8_t type = u_charType(c);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION;
}

bool isWhiteSpace(uint32_t cp) { return u_hasBinaryProperty(UChar32(cp), UCHAR_WHITE_SPACE); }

Normalization::Normalization(Form form) : form_(form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2 *n = nullptr;
  switch (form) {
  case Form::NFC:
    n = icu::Normalizer2::getNFCInstance(status);
    break;
  case Form::NFKC:
    n = icu::Normalizer2::getNFKCInstance(status);
    break;
  case Form::NFD:
    n = icu::Normalizer2::getNFDInstance(status);
    break;
  case Form::NFKD:
    n = icu::Normalizer2::getNFKDInstance(status);
    break;
  }
  if (U_FAILURE(status) || !n)
    throw rt::Error(std::string("ICU has no ") + name() + " normalizer: " + u_errorName(status));
  normalizer_ = n;
}

const char *Normalization::name() const {
  switch (form_) {
  case Form::NFC:
    return "NFC";
  case Form::NFKC:
    return "NFKC";
  case Form::NFD:
    return "NFD";
  case Form::NFKD:
    return "NFKD";
  }
  return "?";
}

bool Normalization::apply(std::string_view text, std::string &out) const {
  auto *n = static_cast<const icu::Normalizer2 *>(normalizer_);
  UErrorCode status = U_ZERO_ERROR;
  icu::StringPiece piece(text.data(), int32_t(text.size()));
  if (n->isNormalizedUTF8(piece, status) && U_SUCCESS(status))
    return false;
  status = U_ZERO_ERROR;
  std::string result;
  icu::StringByteSink<std::string> sink(&result, int32_t(text.size()));
  n->normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status))
    throw rt::Error(std::string(name()) + " normalization failed: " + u_errorName(status));
  out = std::move(result);
  return true;
}

} // namespace bonsai::tok
