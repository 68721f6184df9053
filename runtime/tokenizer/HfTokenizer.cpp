//===- HfTokenizer.cpp - Hugging Face tokenizer.json byte-level BPE --------===//
//
// Encoding follows the steps of Hugging Face tokenizers (tokenizer.rs, added_vocabulary.rs,
// pre_tokenizers/, models/bpe/), so that the ids are the same:
//
//   1. added tokens that are not "normalized" are split out of the raw text (leftmost-longest,
//      with their single_word / lstrip / rstrip rules);
//   2. the rest is normalized (NFC, NFKC, NFD, NFKD or none), and the "normalized" added tokens
//      are split out of it;
//   3. the pre-tokenizer (Split with a regex, ByteLevel, or a Sequence of them) cuts the rest
//      into pre-tokens;
//   4. each pre-token goes through BPE: its bytes become the ids of their byte-level
//      characters, and the pair of adjacent symbols with the lowest merge rank (the leftmost
//      among equals) is merged until no pair has a rank.
//
// Byte-level vocabularies write each byte as a printable character (GPT-2's bytes_to_unicode);
// this file converts the vocabulary back to bytes once, when loading, so encoding works on the
// text's own bytes and never builds the mapped strings. Each Encoder caches the ids of the
// pre-tokens it has seen.
//
//===----------------------------------------------------------------------===//

#include "FlatMap.h"
#include "KnownPatterns.h"
#include "Regex.h"
#include "Unicode.h"

#include "bonsai/runtime/Json.h"
#include "bonsai/tokenizer/Tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <cstdio>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace bonsai::tok {

namespace {

/// GPT-2's bytes_to_unicode: the character that stands for each byte in a byte-level
/// vocabulary. Printable Latin-1 bytes stand for themselves, the others for U+0100 upwards.
std::array<uint32_t, 256> byteChars() {
  std::array<uint32_t, 256> chars{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    chars[b] = printable ? b : next++;
  }
  return chars;
}

/// The bytes a byte-level token string stands for, or false when a character of it is not one
/// of the 256 byte characters.
bool byteLevelToBytes(std::string_view token, const std::unordered_map<uint32_t, uint8_t> &bytes,
                      std::string &out) {
  out.clear();
  for (size_t i = 0; i < token.size();) {
    size_t length;
    uint32_t cp = decodeUtf8(token, i, length);
    auto it = bytes.find(cp);
    if (it == bytes.end())
      return false;
    out += char(it->second);
    i += length;
  }
  return true;
}

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

/// One step of the pre-tokenizer.
struct Stage {
  bool byteLevel = false;
  bool addPrefixSpace = false;
  std::shared_ptr<Regex> regex; // null for a ByteLevel step without its regex
  KnownPattern known = KnownPattern::None;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
};

/// A token of tokenizer.json's added_tokens.
struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool singleWord = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

/// Leftmost-longest matching of the added tokens (Hugging Face uses aho-corasick's
/// LeftmostLongest): at the first position where any token starts, the longest that does.
class TokenTrie {
public:
  TokenTrie() : nodes_(1) { starts_.fill(false); }
  void add(std::string_view s, int32_t index) {
    uint32_t node = 0;
    for (char c : s) {
      unsigned char b = static_cast<unsigned char>(c);
      uint32_t child = 0;
      for (auto &[byte, next] : nodes_[node].next)
        if (byte == b)
          child = next;
      if (!child) {
        child = uint32_t(nodes_.size());
        nodes_[node].next.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    // The first token of a content wins, as in aho-corasick (later duplicates never match).
    if (nodes_[node].token < 0)
      nodes_[node].token = index;
    starts_[static_cast<unsigned char>(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  /// The first position >= i where a token may start.
  size_t nextStart(std::string_view text, size_t i) const {
    while (i < text.size() && !starts_[static_cast<unsigned char>(text[i])])
      ++i;
    return i;
  }
  /// The index of the longest token at text[i] (setting `length`), or -1.
  int32_t longestAt(std::string_view text, size_t i, size_t &length) const {
    int32_t found = -1;
    uint32_t node = 0;
    for (size_t k = i; k < text.size(); ++k) {
      unsigned char b = static_cast<unsigned char>(text[k]);
      uint32_t child = 0;
      for (auto &[byte, next] : nodes_[node].next)
        if (byte == b)
          child = next;
      if (!child)
        break;
      node = child;
      if (nodes_[node].token >= 0) {
        found = nodes_[node].token;
        length = k + 1 - i;
      }
    }
    return found;
  }

private:
  struct Node {
    std::vector<std::pair<unsigned char, uint32_t>> next;
    int32_t token = -1;
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> starts_;
  bool empty_ = true;
};

class HfBpeTokenizer;

/// One thread's encoding state.
class HfBpeEncoder final : public Encoder {
public:
  explicit HfBpeEncoder(const HfBpeTokenizer &t);
  void encode(std::string_view text, std::vector<uint32_t> &ids) override;

private:
  struct Match {
    size_t start, end;
    uint32_t id;
  };
  struct Span {
    size_t start, end;
    bool match;
  };
  void splitAdded(std::string_view text, const TokenTrie &trie, std::vector<Match> &matches);
  void normalizeAndSplit(std::string_view text);
  void preTokenize(size_t stage, std::string_view piece);
  void bpe(std::string_view piece);
  void mergeSymbols();
  void mergeSymbolsWithHeap();

  const HfBpeTokenizer &t_;
  std::vector<uint32_t> *ids_ = nullptr;
  RegexMatcher matcher_;
  PieceCache cache_;
  std::string repaired_, normalized_[2];
  std::vector<Match> rawMatches_, normalizedMatches_;
  std::vector<std::vector<Span>> spans_;
  std::vector<std::string> prefixed_;
  std::vector<uint32_t> symbols_, ranks_, merged_;
};

class HfBpeTokenizer final : public Tokenizer {
public:
  explicit HfBpeTokenizer(std::string path) : Tokenizer(std::move(path)) {}

  std::unique_ptr<Encoder> newEncoder() const override {
    return std::make_unique<HfBpeEncoder>(*this);
  }

  void decode(const uint32_t *ids, size_t count, std::string &out) const override {
    for (size_t i = 0; i < count; ++i) {
      uint32_t id = ids[i];
      if (id >= vocabSize_ || !known_[id])
        throw rt::Error("token id " + std::to_string(id) + " is not in the vocabulary of '" +
                        path() + "'");
      out += decoded_[id];
    }
  }

  uint32_t vocabSize() const override { return vocabSize_; }

  std::optional<uint32_t> tokenId(std::string_view token) const override {
    auto it = tokenIds_.find(std::string(token));
    if (it == tokenIds_.end())
      return std::nullopt;
    return it->second;
  }

  std::optional<Cut> findCut(std::string_view text, size_t from) const override {
    if (!cutsAllowed_)
      return std::nullopt;
    // After a newline that follows a printable ASCII character and precedes an ASCII letter,
    // each of the known patterns ends a pre-token (the newline is one, or ends one that began
    // with punctuation) and starts the next one at the letter, and no added token spans it (no
    // added token has a newline, none strips whitespace on its left): both parts encode as the
    // whole does.
    size_t p = from > 0 ? from - 1 : 0;
    for (;;) {
      size_t newline = text.find('\n', p);
      if (newline == std::string_view::npos || newline + 1 >= text.size())
        return std::nullopt;
      size_t cut = newline + 1;
      if (newline >= 1) {
        unsigned char before = static_cast<unsigned char>(text[newline - 1]);
        unsigned char after = static_cast<unsigned char>(text[cut]);
        if (before > 0x20 && before < 0x7f && std::isalpha(after))
          return Cut{cut, cut};
      }
      p = cut;
    }
  }

  std::string describeModel() const override {
    std::ostringstream s;
    s << "byte-level BPE (tokenizer.json), vocabulary " << vocabSize_ << " (" << modelVocab_
      << " in the model, " << added_.size() << " added tokens), " << merges_
      << " merges, pre-tokenizer " << preTokenizerName_;
    for (const auto &n : normalizers_)
      s << ", " << n->name();
    if (ignoreMerges_)
      s << ", ignore_merges";
    if (byteFallback_)
      s << ", byte_fallback";
    return s.str();
  }

  // The loaded tokenizer, read by HfBpeEncoder.
  std::vector<std::unique_ptr<Normalization>> normalizers_;
  std::vector<Stage> stages_;
  PairMap mergeMap_;
  size_t merges_ = 0;
  StringMap rawVocab_; // vocabulary entries by the bytes they stand for
  std::unordered_map<std::string, uint32_t> tokenIds_;
  std::array<int64_t, 256> byteIds_{};
  std::array<std::vector<uint32_t>, 256> fallbackIds_;
  std::optional<uint32_t> unkId_;
  bool fuseUnk_ = false, byteFallback_ = false, ignoreMerges_ = false;
  std::vector<AddedToken> added_;
  TokenTrie rawTrie_, normalizedTrie_;
  std::vector<std::string> decoded_;
  std::vector<bool> known_;
  uint32_t vocabSize_ = 0;
  size_t modelVocab_ = 0;
  bool cutsAllowed_ = false;
  std::string preTokenizerName_;
};

HfBpeEncoder::HfBpeEncoder(const HfBpeTokenizer &t)
    : t_(t), cache_(1 << 14), spans_(t.stages_.size()), prefixed_(t.stages_.size()) {}

void HfBpeEncoder::encode(std::string_view text, std::vector<uint32_t> &ids) {
  if (size_t replaced = repairUtf8(text, repaired_)) {
    invalidUtf8_ += replaced;
    text = repaired_;
  }
  ids_ = &ids;
  if (t_.rawTrie_.empty()) {
    normalizeAndSplit(text);
    return;
  }
  splitAdded(text, t_.rawTrie_, rawMatches_);
  size_t previous = 0;
  for (const Match &m : rawMatches_) {
    if (m.start > previous)
      normalizeAndSplit(text.substr(previous, m.start - previous));
    ids.push_back(m.id);
    previous = m.end;
  }
  if (previous < text.size())
    normalizeAndSplit(text.substr(previous));
}

// Hugging Face's AddedVocabulary::find_matches.
void HfBpeEncoder::splitAdded(std::string_view s, const TokenTrie &trie,
                              std::vector<Match> &matches) {
  matches.clear();
  size_t startOffset = 0;
  for (size_t pos = trie.nextStart(s, 0); pos < s.size(); pos = trie.nextStart(s, pos)) {
    size_t length = 0;
    int32_t index = trie.longestAt(s, pos, length);
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + length;
    pos = stop;
    const AddedToken &token = t_.added_[size_t(index)];
    if (token.singleWord) {
      size_t n;
      bool startSpace = start == 0 || !isRustWordChar(decodeUtf8Before(s, start, n));
      bool stopSpace = stop == s.size() || !isRustWordChar(decodeUtf8(s, stop, n));
      if (!startSpace || !stopSpace)
        continue;
    }
    if (token.lstrip) {
      size_t newStart = start, n;
      while (newStart > 0 && isWhiteSpace(decodeUtf8Before(s, newStart, n)))
        newStart -= n;
      start = std::max(newStart, startOffset);
    }
    if (token.rstrip) {
      size_t n;
      while (stop < s.size() && isWhiteSpace(decodeUtf8(s, stop, n)))
        stop += n;
    }
    // A match inside the whitespace an rstrip took is not one.
    if (start < startOffset)
      continue;
    matches.push_back(Match{start, stop, token.id});
    startOffset = stop;
  }
}

void HfBpeEncoder::normalizeAndSplit(std::string_view text) {
  int buffer = 0;
  for (const auto &n : t_.normalizers_) {
    if (n->apply(text, normalized_[buffer])) {
      text = normalized_[buffer];
      buffer ^= 1;
    }
  }
  if (t_.normalizedTrie_.empty()) {
    preTokenize(0, text);
    return;
  }
  splitAdded(text, t_.normalizedTrie_, normalizedMatches_);
  size_t previous = 0;
  for (const Match &m : normalizedMatches_) {
    if (m.start > previous)
      preTokenize(0, text.substr(previous, m.start - previous));
    ids_->push_back(m.id);
    previous = m.end;
  }
  if (previous < text.size())
    preTokenize(0, text.substr(previous));
}

// Hugging Face's NormalizedString::split with a regex Pattern, per step of the pre-tokenizer.
void HfBpeEncoder::preTokenize(size_t stage, std::string_view piece) {
  if (piece.empty())
    return;
  if (stage == t_.stages_.size()) {
    bpe(piece);
    return;
  }
  const Stage &st = t_.stages_[stage];
  if (st.byteLevel && st.addPrefixSpace && piece[0] != ' ') {
    prefixed_[stage].assign(1, ' ');
    prefixed_[stage].append(piece);
    piece = prefixed_[stage];
  }
  if (!st.regex) {
    preTokenize(stage + 1, piece);
    return;
  }
  if (st.behavior == Behavior::Isolated && !st.invert && st.known != KnownPattern::None) {
    // A known pattern, isolated: ASCII pre-tokens by hand, the others by PCRE2 (see
    // KnownPatterns.h). Each of these patterns matches at every position, so the pieces are
    // its consecutive matches.
    for (size_t i = 0; i < piece.size();) {
      size_t end = matchKnownAscii(st.known, piece, i);
      if (end == std::string_view::npos) {
        size_t start;
        if (!matcher_.find(*st.regex, piece, i, start, end) || start != i || end <= start)
          throw rt::Error("the pre-tokenizer regex '" + st.regex->pattern() +
                          "' did not match at offset " + std::to_string(i) + " as it always does");
      }
      preTokenize(stage + 1, piece.substr(i, end - i));
      i = end;
    }
    return;
  }
  if (st.behavior == Behavior::Isolated && !st.invert) {
    // The common case, streamed: every match and every gap between matches is a piece.
    size_t previous = 0;
    matcher_.forEachMatch(*st.regex, piece, [&](size_t start, size_t end) {
      if (previous != start)
        preTokenize(stage + 1, piece.substr(previous, start - previous));
      if (end > start)
        preTokenize(stage + 1, piece.substr(start, end - start));
      previous = end;
    });
    if (previous != piece.size())
      preTokenize(stage + 1, piece.substr(previous));
    return;
  }
  // Pieces covering `piece`, each flagged as a match or not.
  std::vector<Span> &spans = spans_[stage];
  spans.clear();
  size_t previous = 0;
  matcher_.forEachMatch(*st.regex, piece, [&](size_t start, size_t end) {
    if (previous != start)
      spans.push_back(Span{previous, start, false});
    spans.push_back(Span{start, end, true});
    previous = end;
  });
  if (previous != piece.size())
    spans.push_back(Span{previous, piece.size(), false});
  if (st.invert)
    for (Span &s : spans)
      s.match = !s.match;

  // The behaviours of SplitDelimiterBehavior; `match` then means "remove".
  switch (st.behavior) {
  case Behavior::Removed:
    break;
  case Behavior::Isolated:
    for (Span &s : spans)
      s.match = false;
    break;
  case Behavior::Contiguous:
  case Behavior::MergedWithPrevious: {
    std::vector<Span> out;
    bool previousMatch = false;
    for (const Span &s : spans) {
      bool merge = st.behavior == Behavior::Contiguous ? s.match == previousMatch
                                                       : s.match && !previousMatch;
      if (merge && !out.empty())
        out.back().end = s.end;
      else
        out.push_back(Span{s.start, s.end, false});
      previousMatch = s.match;
    }
    spans = std::move(out);
    break;
  }
  case Behavior::MergedWithNext: {
    std::vector<Span> out;
    bool previousMatch = false;
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
      if (it->match && !previousMatch && !out.empty())
        out.back().start = it->start;
      else
        out.push_back(Span{it->start, it->end, false});
      previousMatch = it->match;
    }
    std::reverse(out.begin(), out.end());
    spans = std::move(out);
    break;
  }
  }
  // The spans of this stage stay valid while the later stages (which use their own) run.
  for (size_t i = 0; i < spans_[stage].size(); ++i) {
    Span s = spans_[stage][i];
    if (!s.match && s.end > s.start)
      preTokenize(stage + 1, piece.substr(s.start, s.end - s.start));
  }
}

void HfBpeEncoder::bpe(std::string_view piece) {
  std::vector<uint32_t> &ids = *ids_;
  // The cache holds what either path below gave, so it is asked first; Hugging Face caches
  // pre-tokens shorter than 256 bytes, and so does this.
  bool cacheable = piece.size() <= PieceCache::kMaxKey;
  uint64_t hash = 0;
  if (cacheable) {
    hash = hashBytes(piece);
    if (cache_.lookup(piece, hash, ids))
      return;
  }
  if (t_.ignoreMerges_)
    if (const uint32_t *id = t_.rawVocab_.find(piece)) {
      ids.push_back(*id);
      if (cacheable)
        cache_.store(piece, hash, id, 1);
      return;
    }

  // The initial symbols: one per byte (BPE.merge_word, one byte-level character per byte).
  symbols_.clear();
  std::optional<uint32_t> pendingUnk;
  for (char c : piece) {
    unsigned char b = static_cast<unsigned char>(c);
    if (t_.byteIds_[b] >= 0) {
      if (pendingUnk) {
        symbols_.push_back(*pendingUnk);
        pendingUnk.reset();
      }
      symbols_.push_back(uint32_t(t_.byteIds_[b]));
      continue;
    }
    if (t_.byteFallback_ && !t_.fallbackIds_[b].empty()) {
      symbols_.insert(symbols_.end(), t_.fallbackIds_[b].begin(), t_.fallbackIds_[b].end());
      continue;
    }
    if (t_.unkId_) {
      if (pendingUnk && !t_.fuseUnk_)
        symbols_.push_back(*pendingUnk);
      pendingUnk = *t_.unkId_;
    }
    // Without an unknown token, a byte the vocabulary lacks is dropped, as Hugging Face does.
  }
  if (pendingUnk)
    symbols_.push_back(*pendingUnk);

  if (symbols_.size() > 64)
    mergeSymbolsWithHeap();
  else if (symbols_.size() > 1)
    mergeSymbols();
  ids.insert(ids.end(), symbols_.begin(), symbols_.end());
  if (cacheable && symbols_.size() <= 255)
    cache_.store(piece, hash, symbols_.data(), symbols_.size());
}

// The lowest-ranked pair first, the leftmost among equal ranks: a linear scan per merge, which
// beats a heap on the short symbol lists most pre-tokens have.
void HfBpeEncoder::mergeSymbols() {
  std::vector<uint32_t> &sym = symbols_;
  size_t n = sym.size();
  ranks_.resize(n - 1);
  merged_.resize(n - 1);
  auto rate = [&](size_t i) {
    if (const PairMap::Merge *m = t_.mergeMap_.find(sym[i], sym[i + 1])) {
      ranks_[i] = m->rank;
      merged_[i] = m->id;
    } else {
      ranks_[i] = UINT32_MAX;
    }
  };
  for (size_t i = 0; i + 1 < n; ++i)
    rate(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks_[i] < ranks_[best])
        best = i;
    if (ranks_[best] == UINT32_MAX)
      break;
    sym[best] = merged_[best];
    sym.erase(sym.begin() + long(best) + 1);
    ranks_.erase(ranks_.begin() + long(best));
    merged_.erase(merged_.begin() + long(best));
    --n;
    if (best + 1 < n)
      rate(best);
    if (best > 0)
      rate(best - 1);
  }
}

// The same order for long symbol lists, with a heap of candidate merges and lazy deletion, as
// Hugging Face's Word::merge_all does it.
void HfBpeEncoder::mergeSymbolsWithHeap() {
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    uint32_t id;
    bool operator>(const Candidate &o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<uint32_t> &sym = symbols_;
  size_t n = sym.size();
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  for (size_t i = 0; i < n; ++i) {
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
    if (i + 1 < n)
      if (const PairMap::Merge *m = t_.mergeMap_.find(sym[i], sym[i + 1]))
        heap.push(Candidate{m->rank, uint32_t(i), m->id});
  }
  while (!heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    size_t pos = top.pos;
    if (!alive[pos] || next[pos] < 0)
      continue;
    size_t right = size_t(next[pos]);
    const PairMap::Merge *m = t_.mergeMap_.find(sym[pos], sym[right]);
    if (!m || m->id != top.id)
      continue; // the pair changed since this candidate was pushed
    sym[pos] = top.id;
    alive[right] = false;
    next[pos] = next[right];
    if (next[right] >= 0)
      prev[size_t(next[right])] = int32_t(pos);
    if (prev[pos] >= 0) {
      size_t left = size_t(prev[pos]);
      if (const PairMap::Merge *lm = t_.mergeMap_.find(sym[left], sym[pos]))
        heap.push(Candidate{lm->rank, uint32_t(left), lm->id});
    }
    if (next[pos] >= 0)
      if (const PairMap::Merge *rm = t_.mergeMap_.find(sym[pos], sym[size_t(next[pos])]))
        heap.push(Candidate{rm->rank, uint32_t(pos), rm->id});
  }
  size_t out = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i])
      sym[out++] = sym[i];
  sym.resize(out);
}

//===----------------------------------------------------------------------===//
// Loading tokenizer.json.
//===----------------------------------------------------------------------===//

/// Reads the fields of tokenizer.json, each error naming the file and the field.
class Reader {
public:
  explicit Reader(const std::string &path) : path_(path) {}

  /// `what`, prefixed with the file's path, for messages made elsewhere.
  std::string named(const std::string &what) const { return path_ + ": " + what; }

  [[noreturn]] void fail(const std::string &message) const {
    throw rt::Error(path_ + ": " + message);
  }
  [[noreturn]] void unsupported(const std::string &message) const {
    throw UnsupportedTokenizer(path_ + ": " + message);
  }

  const rt::JsonValue &object(const rt::JsonValue &v, const std::string &where) const {
    if (!v.isObject())
      fail(where + " is a " + v.kindName() + ", expected an object");
    return v;
  }
  const rt::JsonValue &member(const rt::JsonValue &obj, std::string_view key,
                              const std::string &where) const {
    const rt::JsonValue *v = obj.find(key);
    if (!v)
      fail(where + " has no \"" + std::string(key) + "\"");
    return *v;
  }
  const std::string &string(const rt::JsonValue &v, const std::string &where) const {
    if (!v.isString())
      fail(where + " is a " + v.kindName() + ", expected a string");
    return v.stringValue();
  }
  /// A boolean member, `fallback` when absent or null.
  bool flag(const rt::JsonValue &obj, std::string_view key, bool fallback,
            const std::string &where) const {
    const rt::JsonValue *v = obj.find(key);
    if (!v || v->isNull())
      return fallback;
    if (!v->isBool())
      fail(where + "." + std::string(key) + " is a " + v->kindName() + ", expected true or false");
    return v->boolValue();
  }
  uint32_t id(const rt::JsonValue &v, const std::string &where) const {
    // Ids stay below 2^31 so that every pair of them is a valid key of the merge table.
    if (!v.isUnsigned() || v.unsignedValue() >= (uint64_t(1) << 31))
      fail(where + " is not a token id (an integer in [0, 2^31))");
    return uint32_t(v.unsignedValue());
  }
  /// The "type" of a component; `what` names the component ("normalizer", ...).
  const std::string &type(const rt::JsonValue &v, const std::string &what) const {
    object(v, what);
    const rt::JsonValue *t = v.find("type");
    if (!t || !t->isString())
      fail(what + " has no \"type\"");
    return t->stringValue();
  }

private:
  const std::string &path_;
};

void parseNormalizer(const Reader &r, const rt::JsonValue &v, HfBpeTokenizer &t) {
  if (v.isNull())
    return;
  const std::string &type = r.type(v, "normalizer");
  using Form = Normalization::Form;
  if (type == "Sequence") {
    const rt::JsonValue &list = r.member(v, "normalizers", "normalizer Sequence");
    if (!list.isArray())
      r.fail("normalizer Sequence's \"normalizers\" is not an array");
    for (const rt::JsonValue &n : list.elements())
      parseNormalizer(r, n, t);
  } else if (type == "NFC") {
    t.normalizers_.push_back(std::make_unique<Normalization>(Form::NFC));
  } else if (type == "NFKC") {
    t.normalizers_.push_back(std::make_unique<Normalization>(Form::NFKC));
  } else if (type == "NFD") {
    t.normalizers_.push_back(std::make_unique<Normalization>(Form::NFD));
  } else if (type == "NFKD") {
    t.normalizers_.push_back(std::make_unique<Normalization>(Form::NFKD));
  } else {
    r.unsupported("normalizer \"" + type +
                  "\" is not supported (byte-level BPE with an NFC, NFKC, NFD or NFKD normalizer "
                  "or none is)");
  }
}

void parsePreTokenizer(const Reader &r, const rt::JsonValue &v, HfBpeTokenizer &t,
                       std::vector<std::string> &names) {
  if (v.isNull())
    return;
  const std::string &type = r.type(v, "pre_tokenizer");
  bool byteLevelSeen =
      std::any_of(t.stages_.begin(), t.stages_.end(), [](const Stage &s) { return s.byteLevel; });
  if (type == "Sequence") {
    const rt::JsonValue &list = r.member(v, "pretokenizers", "pre_tokenizer Sequence");
    if (!list.isArray())
      r.fail("pre_tokenizer Sequence's \"pretokenizers\" is not an array");
    for (const rt::JsonValue &p : list.elements())
      parsePreTokenizer(r, p, t, names);
    return;
  }
  if (type == "ByteLevel") {
    if (byteLevelSeen)
      r.unsupported("the pre-tokenizer has two ByteLevel steps");
    Stage s;
    s.byteLevel = true;
    s.addPrefixSpace = r.flag(v, "add_prefix_space", true, "pre_tokenizer ByteLevel");
    if (r.flag(v, "use_regex", true, "pre_tokenizer ByteLevel")) {
      s.known = KnownPattern::Gpt2;
      s.regex =
          std::make_shared<Regex>(knownPatternText(s.known), r.named("pre_tokenizer ByteLevel"));
      names.push_back("ByteLevel with the GPT-2 regex");
    } else {
      names.push_back("ByteLevel");
    }
    if (s.addPrefixSpace)
      names.back() += " (add_prefix_space)";
    t.stages_.push_back(std::move(s));
    return;
  }
  if (type == "Split") {
    if (byteLevelSeen)
      r.unsupported("a Split after the ByteLevel pre-tokenizer is not supported (its regex "
                    "would see byte-level characters)");
    const rt::JsonValue &pattern =
        r.object(r.member(v, "pattern", "pre_tokenizer Split"), "pre_tokenizer Split's pattern");
    Stage s;
    std::string text;
    if (const rt::JsonValue *re = pattern.find("Regex")) {
      text = r.string(*re, "pre_tokenizer Split's pattern.Regex");
      s.known = knownPattern(text);
      const char *known = knownPatternName(s.known);
      names.push_back(known ? std::string(known) + " regex" : "regex '" + text + "'");
      s.regex = std::make_shared<Regex>(text, r.named("pre_tokenizer Split"));
    } else if (const rt::JsonValue *str = pattern.find("String")) {
      text = r.string(*str, "pre_tokenizer Split's pattern.String");
      names.push_back("split on '" + text + "'");
      s.regex = std::make_shared<Regex>(Regex::escape(text), r.named("pre_tokenizer Split"));
    } else {
      r.fail("pre_tokenizer Split's pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    const std::string &behavior =
        r.string(r.member(v, "behavior", "pre_tokenizer Split"), "pre_tokenizer Split's behavior");
    static const std::pair<const char *, Behavior> behaviors[] = {
        {"Removed", Behavior::Removed},
        {"Isolated", Behavior::Isolated},
        {"MergedWithPrevious", Behavior::MergedWithPrevious},
        {"MergedWithNext", Behavior::MergedWithNext},
        {"Contiguous", Behavior::Contiguous}};
    bool found = false;
    for (auto &[name, b] : behaviors)
      if (behavior == name) {
        s.behavior = b;
        found = true;
      }
    if (!found)
      r.fail("pre_tokenizer Split's behavior \"" + behavior +
             "\" is not one of Removed, "
             "Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
    s.invert = r.flag(v, "invert", false, "pre_tokenizer Split");
    t.stages_.push_back(std::move(s));
    return;
  }
  r.unsupported("pre-tokenizer \"" + type +
                "\" is not supported (byte-level BPE takes Split, ByteLevel and Sequence)");
}

/// The BOS and EOS a TemplateProcessing post-processor puts around a single sequence.
void templateTokens(const rt::JsonValue &v, std::string &bos, std::string &eos) {
  if (!v.isObject())
    return;
  const rt::JsonValue *type = v.find("type");
  if (!type || !type->isString())
    return;
  if (type->stringValue() == "Sequence") {
    if (const rt::JsonValue *list = v.find("processors"); list && list->isArray())
      for (const rt::JsonValue &p : list->elements())
        templateTokens(p, bos, eos);
    return;
  }
  if (type->stringValue() != "TemplateProcessing")
    return;
  const rt::JsonValue *single = v.find("single");
  if (!single || !single->isArray())
    return;
  bool sequenceSeen = false;
  for (const rt::JsonValue &item : single->elements()) {
    if (!item.isObject())
      continue;
    if (item.find("Sequence")) {
      sequenceSeen = true;
    } else if (const rt::JsonValue *special = item.find("SpecialToken")) {
      const rt::JsonValue *id = special->isObject() ? special->find("id") : nullptr;
      if (id && id->isString())
        (sequenceSeen ? eos : bos) = id->stringValue();
    }
  }
}

} // namespace

std::unique_ptr<Tokenizer> parseHfTokenizer(std::string_view json, const std::string &path) {
  rt::JsonValue root = rt::parseJson(json, path);
  Reader r(path);
  r.object(root, "the file");
  auto t = std::make_unique<HfBpeTokenizer>(path);

  // The model.
  const rt::JsonValue &model = r.object(r.member(root, "model", "the file"), "model");
  std::string type;
  if (const rt::JsonValue *ty = model.find("type"))
    type = r.string(*ty, "model.type");
  else if (model.find("merges") && model.find("vocab"))
    type = "BPE"; // files from before the type was written
  if (type != "BPE")
    r.unsupported("model type \"" + (type.empty() ? std::string("(none)") : type) +
                  "\" is not supported (byte-level BPE tokenizer.json and SentencePiece "
                  "tokenizer.model are)");
  if (const rt::JsonValue *d = model.find("dropout");
      d && !d->isNull() && !(d->isNumber() && d->numberValue() == 0))
    r.unsupported("BPE dropout is set: encoding would be random");
  for (const char *key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const rt::JsonValue *v = model.find(key);
        v && !v->isNull() && !(v->isString() && v->stringValue().empty()))
      r.unsupported(std::string("model.") + key + " is set, which byte-level BPE does not use");
  t->fuseUnk_ = r.flag(model, "fuse_unk", false, "model");
  t->byteFallback_ = r.flag(model, "byte_fallback", false, "model");
  t->ignoreMerges_ = r.flag(model, "ignore_merges", false, "model");

  // The pre-tokenizer decides whether this is byte-level BPE at all: say so before anything
  // else is checked, so that a Llama-2-style (Metaspace) or WordPiece-like file is "not
  // supported" rather than a confusing later error.
  std::vector<std::string> names;
  const rt::JsonValue *pre = root.find("pre_tokenizer");
  parsePreTokenizer(r, pre ? *pre : rt::JsonValue(), *t, names);
  if (std::none_of(t->stages_.begin(), t->stages_.end(),
                   [](const Stage &s) { return s.byteLevel; }))
    r.unsupported("not a byte-level BPE: the pre-tokenizer has no ByteLevel step");
  if (const rt::JsonValue *dec = root.find("decoder"); dec && !dec->isNull()) {
    const std::string &decType = r.type(*dec, "decoder");
    bool byteLevel = decType == "ByteLevel";
    if (decType == "Sequence")
      if (const rt::JsonValue *list = dec->find("decoders"); list && list->isArray())
        byteLevel =
            list->elements().size() == 1 && r.type(list->elements()[0], "decoder") == "ByteLevel";
    if (!byteLevel)
      r.unsupported("decoder \"" + decType +
                    "\" is not supported (byte-level BPE decodes with "
                    "ByteLevel)");
  }
  const rt::JsonValue *norm = root.find("normalizer");
  parseNormalizer(r, norm ? *norm : rt::JsonValue(), *t);
  for (size_t i = 0; i < names.size(); ++i)
    t->preTokenizerName_ += (i ? " + " : "") + names[i];

  // The vocabulary: token strings are byte-level characters; each is kept as the bytes it
  // stands for.
  std::array<uint32_t, 256> chars = byteChars();
  std::unordered_map<uint32_t, uint8_t> charBytes;
  for (uint32_t b = 0; b < 256; ++b)
    charBytes[chars[b]] = uint8_t(b);
  const rt::JsonValue &vocab = r.member(model, "vocab", "model");
  if (!vocab.isObject())
    r.fail("model.vocab is a " + std::string(vocab.kindName()) + ", expected an object");
  uint32_t maxId = 0;
  bool any = false;
  std::unordered_map<uint32_t, std::string> vocabById;
  t->rawVocab_.reserve(vocab.keys().size());
  t->tokenIds_.reserve(vocab.keys().size() + 1024);
  std::string bytes;
  for (size_t i = 0; i < vocab.keys().size(); ++i) {
    const std::string &token = vocab.keys()[i];
    uint32_t id = r.id(vocab.values()[i], "model.vocab[\"" + token + "\"]");
    if (!vocabById.emplace(id, token).second)
      r.fail("model.vocab gives id " + std::to_string(id) + " to both \"" + vocabById[id] +
             "\" and \"" + token + "\"");
    t->tokenIds_[token] = id;
    if (byteLevelToBytes(token, charBytes, bytes))
      t->rawVocab_.insert(bytes, id);
    maxId = std::max(maxId, id);
    any = true;
  }
  t->modelVocab_ = vocab.keys().size();
  auto vocabId = [&](const std::string &token) -> std::optional<uint32_t> {
    auto it = t->tokenIds_.find(token);
    return it == t->tokenIds_.end() ? std::nullopt : std::optional<uint32_t>(it->second);
  };
  std::string utf8;
  for (uint32_t b = 0; b < 256; ++b) {
    utf8.clear();
    appendUtf8(chars[b], utf8);
    std::optional<uint32_t> id = vocabId(utf8);
    t->byteIds_[b] = id ? int64_t(*id) : -1;
    if (!id && t->byteFallback_) {
      // Hugging Face falls back on the bytes of the byte-level character, all or none.
      std::vector<uint32_t> ids;
      for (char c : utf8) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(c));
        if (std::optional<uint32_t> fb = vocabId(name))
          ids.push_back(*fb);
      }
      if (ids.size() == utf8.size())
        t->fallbackIds_[b] = std::move(ids);
    }
  }
  if (const rt::JsonValue *unk = model.find("unk_token"); unk && !unk->isNull()) {
    const std::string &name = r.string(*unk, "model.unk_token");
    t->unkId_ = vocabId(name);
    if (!t->unkId_)
      r.fail("model.unk_token \"" + name + "\" is not in model.vocab");
  }

  // The merges, as "a b" strings or [a, b] pairs; a later duplicate replaces an earlier one,
  // as in Hugging Face's HashMap.
  const rt::JsonValue &merges = r.member(model, "merges", "model");
  if (!merges.isArray())
    r.fail("model.merges is a " + std::string(merges.kindName()) + ", expected an array");
  t->mergeMap_.reserve(merges.elements().size());
  t->merges_ = merges.elements().size();
  for (size_t rank = 0; rank < merges.elements().size(); ++rank) {
    const rt::JsonValue &m = merges.elements()[rank];
    std::string where = "model.merges[" + std::to_string(rank) + "]";
    std::string a, b;
    if (m.isString()) {
      const std::string &s = m.stringValue();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        r.fail(where + " \"" + s + "\" is not two tokens separated by one space");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.isArray() && m.elements().size() == 2) {
      a = r.string(m.elements()[0], where + "[0]");
      b = r.string(m.elements()[1], where + "[1]");
    } else {
      r.fail(where + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    std::optional<uint32_t> ia = vocabId(a), ib = vocabId(b), merged = vocabId(a + b);
    if (!ia)
      r.fail(where + ": \"" + a + "\" is not in model.vocab");
    if (!ib)
      r.fail(where + ": \"" + b + "\" is not in model.vocab");
    if (!merged)
      r.fail(where + ": the merged token \"" + a + b + "\" is not in model.vocab");
    t->mergeMap_.insert(*ia, *ib, PairMap::Merge{uint32_t(rank), *merged});
  }

  // Added tokens. Their ids are assigned as Hugging Face's AddedVocabulary::add_tokens does
  // (a token already in the vocabulary keeps its id, the others follow the largest id), which
  // for every file written by the library is the id the file gives.
  std::unordered_map<uint32_t, std::string> decodedAdded;
  std::optional<uint32_t> maxAdded;
  if (const rt::JsonValue *list = root.find("added_tokens"); list && !list->isNull()) {
    if (!list->isArray())
      r.fail("added_tokens is a " + std::string(list->kindName()) + ", expected an array");
    std::unordered_map<std::string, size_t> seen;
    for (size_t i = 0; i < list->elements().size(); ++i) {
      std::string where = "added_tokens[" + std::to_string(i) + "]";
      const rt::JsonValue &v = r.object(list->elements()[i], where);
      AddedToken a;
      a.content = r.string(r.member(v, "content", where), where + ".content");
      r.id(r.member(v, "id", where), where + ".id");
      a.special = r.flag(v, "special", false, where);
      a.singleWord = r.flag(v, "single_word", false, where);
      a.lstrip = r.flag(v, "lstrip", false, where);
      a.rstrip = r.flag(v, "rstrip", false, where);
      a.normalized = r.flag(v, "normalized", !a.special, where);
      if (a.content.empty() || seen.count(a.content))
        continue;
      if (std::optional<uint32_t> existing = vocabId(a.content)) {
        a.id = *existing;
      } else {
        uint32_t modelSize = uint32_t(t->modelVocab_);
        a.id = maxAdded && (*maxAdded >= modelSize || modelSize == 0) ? *maxAdded + 1 : modelSize;
      }
      maxAdded = maxAdded ? std::max(*maxAdded, a.id) : a.id;
      seen[a.content] = t->added_.size();
      t->tokenIds_[a.content] = a.id;
      decodedAdded[a.id] = a.content;
      maxId = std::max(maxId, a.id);
      any = true;
      t->added_.push_back(std::move(a));
    }
  }
  if (!any)
    r.fail("the vocabulary is empty");
  for (size_t i = 0; i < t->added_.size(); ++i) {
    AddedToken &a = t->added_[i];
    if (!a.normalized) {
      t->rawTrie_.add(a.content, int32_t(i));
      continue;
    }
    // A normalized token is matched in normalized text, so by its normalized form.
    std::string_view content = a.content;
    std::string buffers[2];
    int buffer = 0;
    for (const auto &n : t->normalizers_)
      if (n->apply(content, buffers[buffer])) {
        content = buffers[buffer];
        buffer ^= 1;
      }
    if (!content.empty())
      t->normalizedTrie_.add(content, int32_t(i));
  }

  // Decoding: the ByteLevel decoder turns a token's characters back into bytes when all of
  // them are byte characters, and keeps its text otherwise. Added tokens decode from their
  // content.
  t->vocabSize_ = maxId + 1;
  t->decoded_.resize(t->vocabSize_);
  t->known_.assign(t->vocabSize_, false);
  auto setDecoded = [&](uint32_t id, const std::string &token) {
    if (!byteLevelToBytes(token, charBytes, bytes))
      bytes = token;
    t->decoded_[id] = bytes;
    t->known_[id] = true;
  };
  for (auto &[id, token] : vocabById)
    setDecoded(id, token);
  for (auto &[id, content] : decodedAdded)
    setDecoded(id, content);

  // Long documents may be split for the threads only where the known patterns provably split
  // (findCut): every Split a known regex, isolated; no prefix space; no added token with a
  // newline or a left strip.
  t->cutsAllowed_ = true;
  for (const Stage &s : t->stages_) {
    if (s.addPrefixSpace || (s.regex && s.known == KnownPattern::None) || s.invert ||
        s.behavior != Behavior::Isolated)
      t->cutsAllowed_ = false;
  }
  if (std::count_if(t->stages_.begin(), t->stages_.end(),
                    [](const Stage &s) { return s.regex != nullptr; }) != 1)
    t->cutsAllowed_ = false;
  for (const AddedToken &a : t->added_)
    if (a.lstrip || a.content.find('\n') != std::string::npos)
      t->cutsAllowed_ = false;

  // BOS and EOS: those the post-processor adds, else the usual names among the added tokens.
  std::string bosName, eosName;
  if (const rt::JsonValue *post = root.find("post_processor"))
    templateTokens(*post, bosName, eosName);
  auto pick = [&](std::string &name, std::initializer_list<const char *> candidates) {
    if (!name.empty() && vocabId(name))
      return;
    name.clear();
    for (const char *c : candidates)
      if (std::any_of(t->added_.begin(), t->added_.end(),
                      [&](const AddedToken &a) { return a.special && a.content == c; })) {
        name = c;
        return;
      }
  };
  pick(bosName, {"<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>"});
  pick(eosName, {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"});
  auto named = [&](const std::string &name) -> std::optional<NamedToken> {
    if (name.empty())
      return std::nullopt;
    return NamedToken{*vocabId(name), name};
  };
  t->setSpecialTokens(named(bosName), named(eosName), "tokenizer.json");
  return t;
}

} // namespace bonsai::tok
