//===- Regex.cpp - Pre-tokenizer regexes with Oniguruma's meaning, on PCRE2 ===//
//
// The rewrite walks the pattern once, tracking whether it is inside a bracket expression, and
// replaces the class escapes whose meaning differs (see Regex.h); everything else is copied as
// written. Matching uses a JIT stack of its own per thread, so that long runs of whitespace
// (which `\s+(?!\S)` backtracks over) do not exhaust PCRE2's small default one.
//
//===----------------------------------------------------------------------===//

#define PCRE2_CODE_UNIT_WIDTH 8

#include "Regex.h"

#include "bonsai/runtime/Tensor.h"

#include <cctype>

#include <pcre2.h>

namespace bonsai::tok {

namespace {

// Oniguruma's classes, as PCRE2 class items (without brackets).
constexpr const char *kSpaceItems = "\\t-\\r\\x{85}\\p{Z}";
constexpr const char *kWordItems = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr const char *kHexItems = "0-9a-fA-F";

/// `pattern` with \s \S \w \W \h \H given Oniguruma's meaning. Inside a bracket expression the
/// positive escapes are expanded in place; the negated ones keep PCRE2's meaning there (a
/// negated set cannot be spliced into another set), which no known tokenizer pattern uses.
std::string toPcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool inClass = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char e = pattern[i + 1];
      const char *items = nullptr;
      bool negated = false;
      switch (e) {
      case 's':
      case 'S':
        items = kSpaceItems;
        negated = e == 'S';
        break;
      case 'w':
      case 'W':
        items = kWordItems;
        negated = e == 'W';
        break;
      case 'h':
      case 'H':
        items = kHexItems;
        negated = e == 'H';
        break;
      default:
        break;
      }
      if (items && !inClass) {
        out += negated ? "[^" : "[";
        out += items;
        out += ']';
      } else if (items && !negated) {
        out += items;
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!inClass && c == '[') {
      inClass = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out += '^';
        ++i;
      }
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') {
        out += ']';
        ++i;
      }
      continue;
    }
    if (inClass && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // A POSIX class such as [:alpha:] inside a bracket expression.
      size_t close = pattern.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (inClass && c == ']')
      inClass = false;
    out += c;
  }
  return out;
}

std::string pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0)
    return "error " + std::to_string(code);
  return reinterpret_cast<const char *>(buffer);
}

} // namespace

Regex::Regex(std::string_view pattern, const std::string &what) : pattern_(pattern) {
  std::string translated = toPcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code *code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!code)
    throw rt::Error(what + ": the regex '" + pattern_ +
                    "' does not compile: " + pcre2Message(error) + " (at offset " +
                    std::to_string(offset) + " of its PCRE2 form)");
  // Without a JIT (an unusual PCRE2 build) the interpreter gives the same matches, slower.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code *>(code_)); }

std::string Regex::escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u))
      out += '\\';
    out += c;
  }
  return out;
}

RegexMatcher::RegexMatcher() {
  matchData_ = pcre2_match_data_create(1, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  jitStack_ = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
  if (!matchData_ || !context_ || !jitStack_)
    throw rt::Error("cannot allocate PCRE2 match state");
  pcre2_jit_stack_assign(static_cast<pcre2_match_context *>(context_), nullptr, jitStack_);
}

RegexMatcher::~RegexMatcher() {
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack *>(jitStack_));
  pcre2_match_context_free(static_cast<pcre2_match_context *>(context_));
  pcre2_match_data_free(static_cast<pcre2_match_data *>(matchData_));
}

bool RegexMatcher::find(const Regex &re, std::string_view text, size_t from, size_t &start,
                        size_t &end) {
  auto *md = static_cast<pcre2_match_data *>(matchData_);
  // The text was validated once by the caller: PCRE2 need not check it again at every call.
  // pcre2_jit_match is the JIT's fast path, without pcre2_match's per-call checks.
  auto *code = static_cast<const pcre2_code *>(re.code_);
  auto *subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  auto *context = static_cast<pcre2_match_context *>(context_);
  int rc = re.jit_ ? pcre2_jit_match(code, subject, text.size(), from, 0, md, context)
                   : pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, md, context);
  if (rc == PCRE2_ERROR_NOMATCH)
    return false;
  // rc == 0 says that the ovector has no room for the captures; the whole match is still there.
  if (rc < 0)
    throw rt::Error("the pre-tokenizer regex '" + re.pattern() +
                    "' failed to match: " + pcre2Message(rc));
  PCRE2_SIZE *ovector = pcre2_get_ovector_pointer(md);
  start = ovector[0];
  end = ovector[1];
  return true;
}

size_t RegexMatcher::charLength(std::string_view text, size_t i) {
  unsigned char b = static_cast<unsigned char>(text[i]);
  return b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
}

} // namespace bonsai::tok
