//===- JsonTest.cpp - The strict JSON reader -------------------------------===//
//
// Values of every kind, exact integers, escapes and surrogate pairs, and the errors (with their
// byte offsets) that safetensors headers written by broken tools would hit.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Json.h"

#include "bonsai/runtime/Tensor.h"

#include <gtest/gtest.h>

namespace bonsai::rt {
namespace {

std::string jsonError(std::string_view text, int depth = 64) {
  try {
    parseJson(text, "doc", depth);
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

TEST(JsonTest, ParsesEveryKind) {
  JsonValue v = parseJson(R"( {"a": [1, -2.5e1, true, false, null], "b": {"c": "d"}, "e": {}} )", "doc");
  ASSERT_TRUE(v.isObject());
  EXPECT_EQ(v.keys(), (std::vector<std::string>{"a", "b", "e"}));
  const JsonValue *a = v.find("a");
  ASSERT_TRUE(a && a->isArray());
  ASSERT_EQ(a->elements().size(), 5u);
  EXPECT_TRUE(a->elements()[0].isUnsigned());
  EXPECT_EQ(a->elements()[0].unsignedValue(), 1u);
  EXPECT_DOUBLE_EQ(a->elements()[1].numberValue(), -25.0);
  EXPECT_FALSE(a->elements()[1].isInteger());
  EXPECT_TRUE(a->elements()[2].boolValue());
  EXPECT_FALSE(a->elements()[3].boolValue());
  EXPECT_TRUE(a->elements()[4].isNull());
  EXPECT_EQ(v.find("b")->find("c")->stringValue(), "d");
  EXPECT_TRUE(v.find("e")->isObject());
  EXPECT_EQ(v.find("zz"), nullptr);
  EXPECT_TRUE(parseJson("[]", "doc").elements().empty());
  EXPECT_TRUE(parseJson("\"\"", "doc").stringValue().empty());
}

TEST(JsonTest, IntegersAreExact) {
  JsonValue big = parseJson("18446744073709551615", "doc");
  EXPECT_TRUE(big.isUnsigned());
  EXPECT_EQ(big.unsignedValue(), 18446744073709551615ull);
  int64_t i;
  EXPECT_FALSE(big.getInt64(i));
  // Above 2^53 a double would round; the exact value is kept.
  EXPECT_EQ(parseJson("9007199254740993", "doc").unsignedValue(), 9007199254740993ull);
  ASSERT_TRUE(parseJson("-9223372036854775808", "doc").getInt64(i));
  EXPECT_EQ(i, INT64_MIN);
  EXPECT_FALSE(parseJson("-9223372036854775809", "doc").getInt64(i));
  EXPECT_FALSE(parseJson("18446744073709551616", "doc").isInteger()); // overflows 64 bits
  EXPECT_TRUE(parseJson("-0", "doc").isUnsigned());
  EXPECT_FALSE(parseJson("-1", "doc").isUnsigned());
  EXPECT_FALSE(parseJson("1.0", "doc").isInteger());
  EXPECT_FALSE(parseJson("1e3", "doc").isInteger());
}

TEST(JsonTest, StringEscapes) {
  EXPECT_EQ(parseJson(R"("a\"b\\c\/d\b\f\n\r\t")", "doc").stringValue(), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(parseJson(R"("\u00e9\u20AC")", "doc").stringValue(), "\xc3\xa9\xe2\x82\xac");
  EXPECT_EQ(parseJson(R"("\ud83d\ude00")", "doc").stringValue(), "\xf0\x9f\x98\x80");
  EXPECT_EQ(parseJson("\"h\xc3\xa9\"", "doc").stringValue(), "h\xc3\xa9");
}

TEST(JsonTest, QuoteRoundTrips) {
  std::string text = "model.layers.0 \"q\"\\\n\t\x01 caf\xc3\xa9";
  EXPECT_EQ(parseJson(jsonQuote(text), "doc").stringValue(), text);
}

TEST(JsonTest, ErrorsNameTheByteOffset) {
  EXPECT_EQ(jsonError("{\"a\": 1,}"), "doc: invalid JSON at byte 8: expected a string key");
  EXPECT_EQ(jsonError("[1 2]"), "doc: invalid JSON at byte 3: expected ',' or ']'");
  EXPECT_EQ(jsonError("{\"a\": 1, \"a\": 2}"), "doc: invalid JSON at byte 9: duplicate key \"a\"");
  EXPECT_EQ(jsonError("{} x"), "doc: invalid JSON at byte 3: unexpected characters after the end of the document");
  EXPECT_EQ(jsonError(""), "doc: invalid JSON at byte 0: unexpected end of input, expected a value");
}

TEST(JsonTest, RejectsWhatRfc8259Rejects) {
  for (const char *bad : {"[1,]", "01", "1.", ".5", "+1", "-", "1e", "NaN", "Infinity", "tru",
                          "nul", "'a'", "\"a", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"",
                          "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"a\tb\"", "{\"a\" 1}", "{1: 2}",
                          "[", "{", "// c\n1", "1e999", "\"\xff\"", "\"\xc0\xaf\"",
                          "\"\xed\xa0\x80\""})
    EXPECT_NE(jsonError(bad), "") << "accepted: " << bad;
}

TEST(JsonTest, DepthIsLimited) {
  std::string deep(100000, '[');
  EXPECT_NE(jsonError(deep).find("nesting deeper than 64"), std::string::npos);
  EXPECT_EQ(jsonError("[[[]]]", 3), "");
  EXPECT_NE(jsonError("[[[[]]]]", 3), "");
}

} // namespace
} // namespace bonsai::rt
