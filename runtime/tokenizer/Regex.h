//===- Regex.h - Pre-tokenizer regexes with Oniguruma's meaning, on PCRE2 --===//
//
// Hugging Face tokenizers run their Split patterns with Oniguruma; Bonsai runs them with PCRE2
// (UTF and UCP modes, JIT-compiled). The two agree on the syntax these patterns use, and where
// their class escapes differ (Oniguruma's \s is 0009-000D, 0085 and the separators Z, PCRE2's
// adds U+180E; Oniguruma's \w counts marks; its \h is a hex digit) the pattern is rewritten to
// Oniguruma's meaning before PCRE2 compiles it. Matches are enumerated as Oniguruma's find_iter
// does, which is what the Split pre-tokenizer sees.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TOKENIZER_REGEX_H
#define BONSAI_TOKENIZER_REGEX_H

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace bonsai::tok {

class RegexMatcher;

/// A compiled pattern; immutable, shared by threads.
class Regex {
public:
  /// Compiles `pattern` (Oniguruma syntax as tokenizer.json writes it). Throws rt::Error naming
  /// `what` and the offset PCRE2 stopped at.
  Regex(std::string_view pattern, const std::string &what);
  /// A pattern matching `literal` exactly.
  static std::string escape(std::string_view literal);
  ~Regex();
  Regex(const Regex &) = delete;
  Regex &operator=(const Regex &) = delete;

  /// The pattern as written.
  const std::string &pattern() const { return pattern_; }

private:
  friend class RegexMatcher;
  std::string pattern_;
  void *code_ = nullptr; // pcre2_code_8 *
  bool jit_ = false;
};

/// One thread's match state for any Regex.
class RegexMatcher {
public:
  RegexMatcher();
  ~RegexMatcher();
  RegexMatcher(const RegexMatcher &) = delete;
  RegexMatcher &operator=(const RegexMatcher &) = delete;

  /// Calls `f(start, end)` for each match of `re` in `text` (valid UTF-8), left to right, as
  /// Oniguruma's find_iter gives them: an empty match right after the previous match is
  /// skipped by one character.
  template <typename F> void forEachMatch(const Regex &re, std::string_view text, F &&f) {
    size_t lastEnd = 0;
    bool haveLastMatch = false;
    size_t lastMatchEnd = 0;
    size_t start, end;
    while (lastEnd <= text.size() && find(re, text, lastEnd, start, end)) {
      if (start == end && haveLastMatch && lastMatchEnd == lastEnd) {
        lastEnd += lastEnd < text.size() ? charLength(text, lastEnd) : 1;
        continue;
      }
      lastEnd = end;
      lastMatchEnd = end;
      haveLastMatch = true;
      f(start, end);
    }
  }

  /// The first match of `re` in `text` (valid UTF-8) at or after `from`, as [start, end).
  bool find(const Regex &re, std::string_view text, size_t from, size_t &start, size_t &end);

private:
  static size_t charLength(std::string_view text, size_t i);
  void *matchData_ = nullptr; // pcre2_match_data_8 *
  void *context_ = nullptr;   // pcre2_match_context_8 *
  void *jitStack_ = nullptr;  // pcre2_jit_stack_8 *
};

} // namespace bonsai::tok

#endif // BONSAI_TOKENIZER_REGEX_H
