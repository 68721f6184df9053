//===- KnownPatterns.cpp - The GPT-2, Llama-3 and Qwen2 patterns, by hand --===//
//
// Each function tries the pattern's alternatives in their order, as a backtracking engine does
// (the first alternative that matches wins, not the longest), on ASCII character classes:
// \p{L} is A-Z a-z, \p{N} is 0-9, \s (Oniguruma's) is \t \n \v \f \r and space, and everything
// else is [^\s\p{L}\p{N}]. A byte >= 0x80 that the decision needs answers npos.
//
// Llama 3:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Qwen2:    the same with \p{N} for \p{N}{1,3}
// GPT-2:    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
//===----------------------------------------------------------------------===//

#include "KnownPatterns.h"

#include <array>

namespace bonsai::tok {

namespace {

constexpr const char *kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char *kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char *kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr size_t kUnknown = std::string_view::npos;

enum : int { kLetter = 1, kDigit = 2, kSpace = 4, kOther = 8, kNewline = 16, kNonAscii = 32 };

constexpr std::array<int, 256> makeClasses() {
  std::array<int, 256> c{};
  for (int b = 0; b < 256; ++b) {
    if (b >= 0x80)
      c[b] = kNonAscii;
    else if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z'))
      c[b] = kLetter;
    else if (b >= '0' && b <= '9')
      c[b] = kDigit;
    else if (b == '\r' || b == '\n')
      c[b] = kSpace | kNewline;
    else if ((b >= '\t' && b <= '\r') || b == ' ')
      c[b] = kSpace;
    else
      c[b] = kOther;
  }
  return c;
}

constexpr std::array<int, 256> kClasses = makeClasses();

struct Text {
  std::string_view t;
  int at(size_t k) const { return kClasses[static_cast<unsigned char>(t[k])]; }
  char lower(size_t k) const {
    char c = t[k];
    return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c;
  }
  /// The end of the run of `cls` characters from k, or kUnknown when a non-ASCII byte could
  /// continue it.
  size_t run(size_t k, int cls) const {
    while (k < t.size()) {
      int c = at(k);
      if (c & kNonAscii)
        return kUnknown;
      if (!(c & cls))
        break;
      ++k;
    }
    return k;
  }
};

/// The contractions 's 't 're 've 'm 'll 'd at text[i] (text[i] is '\''): the end, 0 for none,
/// or kUnknown.
size_t contraction(const Text &x, size_t i, bool ignoreCase) {
  size_t n = x.t.size();
  if (i + 1 >= n)
    return 0;
  if (x.at(i + 1) & kNonAscii)
    // Case-insensitively, U+017F (long s) is an 's'; case-sensitively no non-ASCII
    // character is one of these letters.
    return ignoreCase ? kUnknown : 0;
  char a = ignoreCase ? x.lower(i + 1) : x.t[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd')
    return i + 2;
  if (a != 'r' && a != 'v' && a != 'l')
    return 0;
  if (i + 2 >= n)
    return 0;
  if (x.at(i + 2) & kNonAscii)
    return ignoreCase ? kUnknown : 0;
  char b = ignoreCase ? x.lower(i + 2) : x.t[i + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
    return i + 3;
  return 0;
}

/// The whitespace alternatives from i (text[i] is whitespace), with or without Llama 3's
/// \s*[\r\n]+ before \s+(?!\S) and \s+.
size_t whitespace(const Text &x, size_t i, bool newlineRun) {
  size_t end = x.run(i, kSpace);
  if (end == kUnknown)
    return kUnknown; // U+00A0, U+3000, ... could continue the run
  if (newlineRun) {
    // \s*[\r\n]+: the run up to and including its last \r or \n.
    for (size_t k = end; k > i; --k)
      if (x.at(k - 1) & kNewline)
        return k;
  }
  // \s+(?!\S): the run, less its last character when something other than space follows.
  if (end == x.t.size())
    return end;
  if (end - i >= 2)
    return end - 1;
  return i + 1; // \s+
}

size_t llama3(const Text &x, size_t i, size_t maxDigits) {
  size_t n = x.t.size();
  int c = x.at(i);
  if (c & kNonAscii)
    return kUnknown;
  if (x.t[i] == '\'') {
    size_t end = contraction(x, i, /*ignoreCase=*/true);
    if (end)
      return end;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c & kLetter)
    return x.run(i, kLetter);
  if (!(c & (kNewline | kDigit)) && i + 1 < n) {
    int next = x.at(i + 1);
    if (next & kNonAscii)
      return kUnknown;
    if (next & kLetter)
      return x.run(i + 1, kLetter);
  }
  // \p{N}{1,3}
  if (c & kDigit) {
    size_t k = i;
    while (k < n && k - i < maxDigits) {
      int d = x.at(k);
      if (d & kNonAscii)
        return kUnknown;
      if (!(d & kDigit))
        break;
      ++k;
    }
    return k;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t j = x.t[i] == ' ' ? i + 1 : i;
  if (j < n) {
    int o = x.at(j);
    if (o & kNonAscii)
      return kUnknown;
    if (o & kOther) {
      size_t k = x.run(j, kOther);
      if (k == kUnknown)
        return kUnknown;
      while (k < n && (x.t[k] == '\r' || x.t[k] == '\n'))
        ++k;
      return k;
    }
  }
  return whitespace(x, i, /*newlineRun=*/true);
}

size_t gpt2(const Text &x, size_t i) {
  size_t n = x.t.size();
  if (x.at(i) & kNonAscii)
    return kUnknown;
  if (x.t[i] == '\'') {
    size_t end = contraction(x, i, /*ignoreCase=*/false);
    if (end)
      return end;
  }
  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
  size_t j = x.t[i] == ' ' ? i + 1 : i;
  if (j < n) {
    int c = x.at(j);
    if (c & kNonAscii)
      return kUnknown;
    for (int cls : {kLetter, kDigit, kOther})
      if (c & cls)
        return x.run(j, cls);
  }
  return whitespace(x, i, /*newlineRun=*/false);
}

} // namespace

KnownPattern knownPattern(const std::string &pattern) {
  for (KnownPattern p : {KnownPattern::Gpt2, KnownPattern::Llama3, KnownPattern::Qwen2})
    if (pattern == knownPatternText(p))
      return p;
  return KnownPattern::None;
}

const char *knownPatternName(KnownPattern p) {
  switch (p) {
  case KnownPattern::Gpt2:
    return "GPT-2";
  case KnownPattern::Llama3:
    return "Llama-3";
  case KnownPattern::Qwen2:
    return "Qwen2";
  case KnownPattern::None:
    break;
  }
  return nullptr;
}

const char *knownPatternText(KnownPattern p) {
  switch (p) {
  case KnownPattern::Gpt2:
    return kGpt2;
  case KnownPattern::Llama3:
    return kLlama3;
  case KnownPattern::Qwen2:
    return kQwen2;
  case KnownPattern::None:
    break;
  }
  return "";
}

size_t matchKnownAscii(KnownPattern p, std::string_view text, size_t i) {
  Text x{text};
  switch (p) {
  case KnownPattern::Gpt2:
    return gpt2(x, i);
  case KnownPattern::Llama3:
    return llama3(x, i, 3);
  case KnownPattern::Qwen2:
    return llama3(x, i, 1);
  case KnownPattern::None:
    break;
  }
  return kUnknown;
}

} // namespace bonsai::tok
