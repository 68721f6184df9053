//===- KnownPatterns.h - The GPT-2, Llama-3 and Qwen2 patterns, by hand ----===//
//
// The pre-tokenizer regexes of GPT-2, Llama 3 and Qwen2, written out as code for ASCII text.
// Pre-tokenization is a match per pre-token, and for English and code most pre-tokens are
// ASCII: deciding them with a table and a loop instead of a JIT-compiled regex call makes
// encoding markedly faster. Whenever the decision would depend on a character outside ASCII
// (a letter, a digit or a space of another script could continue the match), the caller asks
// PCRE2 instead, for that one match; the patterns have no lookbehind, so a match depends only on
// the text from its start, and the two kinds of answer compose.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TOKENIZER_KNOWNPATTERNS_H
#define BONSAI_TOKENIZER_KNOWNPATTERNS_H

#include <cstddef>
#include <string>
#include <string_view>

namespace bonsai::tok {

/// The patterns matched by hand.
enum class KnownPattern { None, Gpt2, Llama3, Qwen2 };

/// The pattern `pattern` is, if one of the known ones.
KnownPattern knownPattern(const std::string &pattern);

/// Its name, for messages ("GPT-2", ...); null for None.
const char *knownPatternName(KnownPattern p);

/// The exact text of each known pattern, as tokenizer.json writes it.
const char *knownPatternText(KnownPattern p);

/// The end of `p`'s match at text[i] (i < text.size(); every position of a text starts one),
/// or std::string_view::npos when deciding it needs a character outside ASCII.
size_t matchKnownAscii(KnownPattern p, std::string_view text, size_t i);

} // namespace bonsai::tok

#endif // BONSAI_TOKENIZER_KNOWNPATTERNS_H
