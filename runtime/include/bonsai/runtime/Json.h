//===- Json.h - A small strict JSON reader and string quoting -------------===//
//
// Safetensors headers and sharded-checkpoint indexes are JSON written by other programs, so the
// reader is strict (RFC 8259: no comments, no trailing commas, no NaN, valid UTF-8, no duplicate
// keys), bounded (a nesting depth limit), and every error names the byte offset where parsing
// stopped. Integers are kept exactly, beside their double value, because tensor offsets are
// byte counts that can exceed 2^53.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_JSON_H
#define BONSAI_RUNTIME_JSON_H

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai::rt {

/// A parsed JSON value. Objects keep their members in file order.
class JsonValue {
public:
  /// The JSON value kinds.
  enum class Kind { Null, Bool, Number, String, Array, Object };

  /// The kind of this value, and one predicate per kind.
  Kind kind() const { return kind_; }
  bool isNull() const { return kind_ == Kind::Null; }
  bool isBool() const { return kind_ == Kind::Bool; }
  bool isNumber() const { return kind_ == Kind::Number; }
  bool isString() const { return kind_ == Kind::String; }
  bool isArray() const { return kind_ == Kind::Array; }
  bool isObject() const { return kind_ == Kind::Object; }

  /// The value of a Bool.
  bool boolValue() const { return bool_; }
  /// The value of a Number, as a double (rounded when the literal has more precision).
  double numberValue() const { return number_; }
  /// True when a Number was written as an integer literal that fits in int64 or uint64.
  bool isInteger() const { return kind_ == Kind::Number && integer_; }
  /// True when the Number is an integer literal in [0, 2^64).
  bool isUnsigned() const { return isInteger() && !negative_; }
  /// The exact value of an unsigned integer literal (see isUnsigned()).
  uint64_t unsignedValue() const { return magnitude_; }
  /// The exact value of an integer literal that fits in int64; false otherwise.
  bool getInt64(int64_t &value) const;
  /// The text of a String (UTF-8, escapes decoded).
  const std::string &stringValue() const { return string_; }

  /// Elements of an Array.
  const std::vector<JsonValue> &elements() const { return elements_; }
  /// Keys and values of an Object, in file order (keys are unique).
  const std::vector<std::string> &keys() const { return keys_; }
  const std::vector<JsonValue> &values() const { return elements_; }
  /// The member named `key` of an Object, or nullptr.
  const JsonValue *find(std::string_view key) const;

  /// A one-word name of the kind ("object", "string", ...), for messages.
  const char *kindName() const;

private:
  friend class JsonParser;
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  double number_ = 0;
  bool integer_ = false;
  bool negative_ = false;
  uint64_t magnitude_ = 0;
  std::string string_;
  std::vector<std::string> keys_;
  std::vector<JsonValue> elements_; // array elements or object values
};

/// Parses a complete JSON document (surrounding whitespace allowed). Throws rt::Error
/// "<what>: invalid JSON at byte <offset>: <reason>" on the first error. Arrays and objects
/// nest at most `maxDepth` deep.
JsonValue parseJson(std::string_view text, const std::string &what, int maxDepth = 64);

/// `text` as a JSON string literal, with quotes and escapes.
std::string jsonQuote(std::string_view text);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_JSON_H
