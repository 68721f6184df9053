//===- Json.cpp - A small strict JSON reader and string quoting -----------===//
//
// A recursive-descent parser over a string_view. Recursion is bounded by the depth limit, so a
// hostile header ("[[[[...") fails with a message instead of overflowing the stack.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Json.h"

#include "bonsai/runtime/Tensor.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

namespace bonsai::rt {

bool JsonValue::getInt64(int64_t &value) const {
  if (!isInteger())
    return false;
  if (!negative_) {
    if (magnitude_ > uint64_t(std::numeric_limits<int64_t>::max()))
      return false;
    value = int64_t(magnitude_);
    return true;
  }
  if (magnitude_ > uint64_t(std::numeric_limits<int64_t>::max()) + 1)
    return false;
  value = magnitude_ == uint64_t(std::numeric_limits<int64_t>::max()) + 1
              ? std::numeric_limits<int64_t>::min()
              : -int64_t(magnitude_);
  return true;
}

const JsonValue *JsonValue::find(std::string_view key) const {
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key)
      return &elements_[i];
  return nullptr;
}

const char *JsonValue::kindName() const {
  switch (kind_) {
  case Kind::Null:
    return "null";
  case Kind::Bool:
    return "boolean";
  case Kind::Number:
    return "number";
  case Kind::String:
    return "string";
  case Kind::Array:
    return "array";
  case Kind::Object:
    return "object";
  }
  return "value";
}

class JsonParser {
public:
  JsonParser(std::string_view text, const std::string &what, int maxDepth)
      : text(text), what(what), maxDepth(maxDepth) {}

  JsonValue parseDocument() {
    skipSpace();
    JsonValue v = parseValue(0);
    skipSpace();
    if (pos != text.size())
      fail("unexpected characters after the end of the document");
    return v;
  }

private:
  [[noreturn]] void fail(const std::string &reason) const {
    throw Error(what + ": invalid JSON at byte " + std::to_string(pos) + ": " + reason);
  }

  bool atEnd() const { return pos >= text.size(); }
  char peek() const { return text[pos]; }

  void skipSpace() {
    while (!atEnd() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
      ++pos;
  }

  void expectLiteral(std::string_view word) {
    if (text.substr(pos, word.size()) != word)
      fail("unexpected character '" + printable(peek()) + "'");
    pos += word.size();
  }

  static std::string printable(char c) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f)
      return std::string(1, c);
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", u);
    return buf;
  }

  JsonValue parseValue(int depth) {
    if (atEnd())
      fail("unexpected end of input, expected a value");
    JsonValue v;
    switch (peek()) {
    case '{':
      return parseObject(depth + 1);
    case '[':
      return parseArray(depth + 1);
    case '"':
      v.kind_ = JsonValue::Kind::String;
      v.string_ = parseString();
      return v;
    case 't':
      expectLiteral("true");
      v.kind_ = JsonValue::Kind::Bool;
      v.bool_ = true;
      return v;
    case 'f':
      expectLiteral("false");
      v.kind_ = JsonValue::Kind::Bool;
      return v;
    case 'n':
      expectLiteral("null");
      return v;
    default:
      if (peek() == '-' || (peek() >= '0' && peek() <= '9'))
        return parseNumber();
      fail("unexpected character '" + printable(peek()) + "', expected a value");
    }
  }

  JsonValue parseObject(int depth) {
    if (depth > maxDepth)
      fail("nesting deeper than " + std::to_string(maxDepth));
    JsonValue v;
    v.kind_ = JsonValue::Kind::Object;
    ++pos; // '{'
    skipSpace();
    if (!atEnd() && peek() == '}') {
      ++pos;
      return v;
    }
    std::set<std::string> seen;
    while (true) {
      skipSpace();
      if (atEnd() || peek() != '"')
        fail(atEnd() ? "unexpected end of input, expected a key" : "expected a string key");
      size_t keyPos = pos;
      std::string key = parseString();
      if (!seen.insert(key).second) {
        pos = keyPos;
        fail("duplicate key \"" + key + "\"");
      }
      skipSpace();
      if (atEnd() || peek() != ':')
        fail("expected ':' after a key");
      ++pos;
      skipSpace();
      JsonValue member = parseValue(depth);
      v.keys_.push_back(std::move(key));
      v.elements_.push_back(std::move(member));
      skipSpace();
      if (atEnd())
        fail("unexpected end of input, expected ',' or '}'");
      if (peek() == '}') {
        ++pos;
        return v;
      }
      if (peek() != ',')
        fail("expected ',' or '}'");
      ++pos;
    }
  }

  JsonValue parseArray(int depth) {
    if (depth > maxDepth)
      fail("nesting deeper than " + std::to_string(maxDepth));
    JsonValue v;
    v.kind_ = JsonValue::Kind::Array;
    ++pos; // '['
    skipSpace();
    if (!atEnd() && peek() == ']') {
      ++pos;
      return v;
    }
    while (true) {
      skipSpace();
      v.elements_.push_back(parseValue(depth));
      skipSpace();
      if (atEnd())
        fail("unexpected end of input, expected ',' or ']'");
      if (peek() == ']') {
        ++pos;
        return v;
      }
      if (peek() != ',')
        fail("expected ',' or ']'");
      ++pos;
    }
  }

  JsonValue parseNumber() {
    size_t start = pos;
    JsonValue v;
    v.kind_ = JsonValue::Kind::Number;
    if (peek() == '-') {
      v.negative_ = true;
      ++pos;
    }
    if (atEnd() || !isDigit(peek()))
      fail("expected a digit");
    // Integer part: exact in 64 bits while it fits.
    bool fits = true;
    uint64_t magnitude = 0;
    if (peek() == '0') {
      ++pos;
      if (!atEnd() && isDigit(peek()))
        fail("leading zeros are not allowed");
    } else {
      while (!atEnd() && isDigit(peek())) {
        unsigned d = unsigned(peek() - '0');
        if (magnitude > (std::numeric_limits<uint64_t>::max() - d) / 10)
          fits = false;
        else
          magnitude = magnitude * 10 + d;
        ++pos;
      }
    }
    bool integer = true;
    if (!atEnd() && peek() == '.') {
      integer = false;
      ++pos;
      if (atEnd() || !isDigit(peek()))
        fail("expected a digit after '.'");
      while (!atEnd() && isDigit(peek()))
        ++pos;
    }
    if (!atEnd() && (peek() == 'e' || peek() == 'E')) {
      integer = false;
      ++pos;
      if (!atEnd() && (peek() == '+' || peek() == '-'))
        ++pos;
      if (atEnd() || !isDigit(peek()))
        fail("expected a digit in the exponent");
      while (!atEnd() && isDigit(peek()))
        ++pos;
    }
    std::string literal(text.substr(start, pos - start));
    v.number_ = std::strtod(literal.c_str(), nullptr);
    if (!std::isfinite(v.number_)) {
      pos = start;
      fail("number " + literal + " is out of range");
    }
    v.integer_ = integer && fits;
    v.magnitude_ = magnitude;
    if (v.integer_ && v.negative_ && magnitude == 0)
      v.negative_ = false; // -0 is the integer 0
    return v;
  }

  static bool isDigit(char c) { return c >= '0' && c <= '9'; }

  unsigned parseHex4() {
    if (text.size() - pos < 4)
      fail("unexpected end of input in a \\u escape");
    unsigned value = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text[pos++];
      value <<= 4;
      if (c >= '0' && c <= '9')
        value |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f')
        value |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        value |= unsigned(c - 'A' + 10);
      else {
        --pos;
        fail("invalid hex digit in a \\u escape");
      }
    }
    return value;
  }

  static void appendUtf8(std::string &out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  /// Length of the valid UTF-8 sequence at `pos`, or 0 (overlongs, surrogates and code points
  /// above U+10FFFF are invalid).
  size_t utf8Length() const {
    auto byte = [&](size_t i) { return static_cast<unsigned char>(text[pos + i]); };
    unsigned char b0 = byte(0);
    size_t n;
    unsigned cp;
    if (b0 < 0x80)
      return 1;
    if ((b0 & 0xe0) == 0xc0) {
      n = 2;
      cp = b0 & 0x1f;
    } else if ((b0 & 0xf0) == 0xe0) {
      n = 3;
      cp = b0 & 0x0f;
    } else if ((b0 & 0xf8) == 0xf0) {
      n = 4;
      cp = b0 & 0x07;
    } else {
      return 0;
    }
    if (text.size() - pos < n)
      return 0;
    for (size_t i = 1; i < n; ++i) {
      if ((byte(i) & 0xc0) != 0x80)
        return 0;
      cp = (cp << 6) | (byte(i) & 0x3f);
    }
    static const unsigned minimum[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < minimum[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return 0;
    return n;
  }

  std::string parseString() {
    ++pos; // opening quote
    std::string out;
    while (true) {
      if (atEnd())
        fail("unterminated string");
      char c = peek();
      if (c == '"') {
        ++pos;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20)
        fail("control character " + printable(c) + " in a string (it must be escaped)");
      if (c != '\\') {
        size_t n = utf8Length();
        if (n == 0)
          fail("invalid UTF-8 in a string");
        out.append(text.substr(pos, n));
        pos += n;
        continue;
      }
      ++pos;
      if (atEnd())
        fail("unterminated escape");
      char e = text[pos++];
      switch (e) {
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case '/':
        out += '/';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        unsigned cp = parseHex4();
        if (cp >= 0xdc00 && cp <= 0xdfff)
          fail("unpaired low surrogate in a \\u escape");
        if (cp >= 0xd800 && cp <= 0xdbff) {
          if (text.substr(pos, 2) != "\\u")
            fail("high surrogate without a following low surrogate");
          pos += 2;
          unsigned low = parseHex4();
          if (low < 0xdc00 || low > 0xdfff)
            fail("high surrogate followed by a non-low surrogate");
          cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
        }
        appendUtf8(out, cp);
        break;
      }
      default:
        --pos;
        fail("invalid escape '\\" + printable(e) + "'");
      }
    }
  }

  std::string_view text;
  const std::string &what;
  int maxDepth;
  size_t pos = 0;
};

JsonValue parseJson(std::string_view text, const std::string &what, int maxDepth) {
  return JsonParser(text, what, maxDepth).parseDocument();
}

std::string jsonQuote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
        out += buf;
      } else {
        out += c;
      }
    }
  }
  return out + "\"";
}

} // namespace bonsai::rt
