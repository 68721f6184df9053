//===- Unicode.h - UTF-8 and Unicode helpers of the tokenizers -------------===//
//
// What the tokenizers need of Unicode beyond PCRE2's character classes: UTF-8 validation and
// repair, code point decoding, the character properties Hugging Face's added-token matching
// asks (Rust's regex \w and \s), and the normalization forms a tokenizer.json may name (NFC,
// NFKC, NFD, NFKD), through ICU.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TOKENIZER_UNICODE_H
#define BONSAI_TOKENIZER_UNICODE_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace bonsai::tok {

/// The offset of the first byte of `text` that does not start or continue a valid UTF-8
/// sequence, or text.size() when all of it is valid.
size_t firstInvalidUtf8(std::string_view text);

/// Decodes the code point at `text[i]` of valid UTF-8, setting `length` to its byte count.
uint32_t decodeUtf8(std::string_view text, size_t i, size_t &length);

/// Decodes the code point that ends at `text[end]` (exclusive) of valid UTF-8, setting
/// `length` to its byte count.
uint32_t decodeUtf8Before(std::string_view text, size_t end, size_t &length);

/// Appends the UTF-8 of `cp` to `out`.
void appendUtf8(uint32_t cp, std::string &out);

/// Rust's regex `\w`: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control.
bool isRustWordChar(uint32_t cp);

/// Rust's regex `\s` and char::is_whitespace: the White_Space property.
bool isWhiteSpace(uint32_t cp);

/// A Unicode normalization form, applied through ICU.
class Normalization {
public:
  /// The forms a tokenizer.json may name.
  enum class Form { NFC, NFKC, NFD, NFKD };
  /// Throws rt::Error when ICU cannot provide the form.
  explicit Normalization(Form form);
  /// `text` (valid UTF-8) in this form, into `out`; returns false (leaving `out` alone) when it
  /// already is.
  bool apply(std::string_view text, std::string &out) const;
  /// "NFC", ...
  const char *name() const;

private:
  Form form_;
  const void *normalizer_; // const icu::Normalizer2 *, owned by ICU
};

} // namespace bonsai::tok

#endif // BONSAI_TOKENIZER_UNICODE_H
