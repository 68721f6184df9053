//===- ChatFormatTest.cpp - Chat formats: rendering, masks, detection -----===//
//
// The expected strings are what Hugging Face's apply_chat_template(messages, tokenize=False)
// gives with each family's published chat_template (Meta-Llama-3-8B-Instruct, Qwen2-7B-Instruct,
// Mistral-7B-Instruct-v0.1; the templates are quoted in runtime/tokenizer/ChatFormat.cpp and
// below). They were written by reading the templates, then confirmed with transformers 5.17.0 on
// the H200 machine (bench/chat_format_h200.py; its reference is compared in CI by
// test/Tools/bonsai-tokenize-jsonl.test). Encoding is checked against encoding the whole
// rendered string, which is how Hugging Face tokenizes a rendered chat, and the mask by decoding
// the trained tokens.
//
//===----------------------------------------------------------------------===//

#include "bonsai/tokenizer/ChatFormat.h"

#include "TestPlans.h"

#include <gtest/gtest.h>

namespace bonsai::tok {
namespace {

namespace test = rt::test;

const std::string kInputs = std::string(BONSAI_TEST_DATA_DIR) + "/tokenizers";

// Meta-Llama-3-8B-Instruct's chat_template, as tokenizer_config.json holds it (JSON-escaped).
const char *const kLlama3Template =
    R"("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")";
// Qwen2-7B-Instruct's.
const char *const kQwen2Template =
    R"("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")";
// Mistral-7B-Instruct-v0.1's.
const char *const kMistralTemplate =
    R"("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")";

std::vector<uint8_t> bytesOf(const std::string &s) { return std::vector<uint8_t>(s.begin(), s.end()); }

/// A model directory holding the test tokenizer `name` and, when `chatTemplate` is given, a
/// tokenizer_config.json with that (JSON-encoded) chat_template.
std::string modelDir(const std::string &name, const std::string &chatTemplate = "") {
  std::string dir = test::makeTempDir("chat-" + name + "-" + std::to_string(chatTemplate.size()));
  if (name == "sp")
    test::writeFile(dir + "/tokenizer.model",
                    test::decodeBase64(test::readText(kInputs + "/sp.model.b64")));
  else
    test::writeFile(dir + "/tokenizer.json", bytesOf(test::readText(kInputs + "/" + name + ".json")));
  if (!chatTemplate.empty())
    test::writeFile(dir + "/tokenizer_config.json",
                    bytesOf("{\"chat_template\": " + chatTemplate + "}"));
  return dir;
}

std::string rendered(const std::vector<ChatSpan> &spans) {
  std::string s;
  for (const ChatSpan &span : spans)
    s += span.text;
  return s;
}

const std::vector<ChatMessage> kConversation = {{"system", "Be brief."},
                                                {"user", "Hi there"},
                                                {"assistant", " Hello! How can I help? "},
                                                {"user", "What is 2+2?"},
                                                {"assistant", "4."}};

TEST(ChatFormatTest, Llama3RendersAsTheTemplate) {
  std::string dir = modelDir("llama3", kLlama3Template);
  std::unique_ptr<Tokenizer> t = loadTokenizer(dir);
  ChatTemplate tmpl = resolveChatTemplate(*t, dir, std::nullopt);
  EXPECT_EQ(tmpl.format, ChatFormat::Llama3);
  std::vector<ChatSpan> spans = renderChat(tmpl, kConversation);
  // Content is trimmed ("| trim"); the BOS is written by the template itself.
  EXPECT_EQ(rendered(spans),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4.<|eot_id|>");
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  encodeChat(*t, *t->newEncoder(), spans, ids, mask);
  EXPECT_EQ(ids, t->encode(rendered(spans)));
  ASSERT_EQ(mask.size(), ids.size());
  std::vector<uint32_t> trained;
  for (size_t i = 0; i < ids.size(); ++i)
    if (mask[i])
      trained.push_back(ids[i]);
  EXPECT_EQ(t->decode(trained), "Hello! How can I help?<|eot_id|>4.<|eot_id|>");
  test::removeTree(dir);
}

TEST(ChatFormatTest, ChatMLWritesQwen2sDefaultSystemPrompt) {
  std::string dir = modelDir("qwen2", kQwen2Template);
  std::unique_ptr<Tokenizer> t = loadTokenizer(dir);
  ChatTemplate tmpl = resolveChatTemplate(*t, dir, std::nullopt);
  EXPECT_EQ(tmpl.format, ChatFormat::ChatML);
  EXPECT_EQ(tmpl.defaultSystem, "You are a helpful assistant.");
  std::vector<ChatMessage> noSystem(kConversation.begin() + 1, kConversation.end());
  std::vector<ChatSpan> spans = renderChat(tmpl, noSystem);
  EXPECT_EQ(rendered(spans), "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                             "<|im_start|>user\nHi there<|im_end|>\n"
                             "<|im_start|>assistant\n Hello! How can I help? <|im_end|>\n"
                             "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                             "<|im_start|>assistant\n4.<|im_end|>\n");
  // With a system message, no default.
  EXPECT_EQ(rendered(renderChat(tmpl, {{"system", "S"}, {"user", "u"}, {"assistant", "a"}})),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
            "<|im_start|>assistant\na<|im_end|>\n");
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  encodeChat(*t, *t->newEncoder(), spans, ids, mask);
  EXPECT_EQ(ids, t->encode(rendered(spans)));
  std::vector<uint32_t> trained;
  for (size_t i = 0; i < ids.size(); ++i)
    if (mask[i])
      trained.push_back(ids[i]);
  EXPECT_EQ(t->decode(trained), " Hello! How can I help? <|im_end|>4.<|im_end|>");
  test::removeTree(dir);
}

TEST(ChatFormatTest, MistralRendersAsV01) {
  std::string dir = modelDir("sp", kMistralTemplate);
  std::unique_ptr<Tokenizer> t = loadTokenizer(dir);
  ChatTemplate tmpl = resolveChatTemplate(*t, dir, std::nullopt);
  EXPECT_EQ(tmpl.format, ChatFormat::Mistral);
  std::vector<ChatMessage> noSystem(kConversation.begin() + 1, kConversation.end());
  std::vector<ChatSpan> spans = renderChat(tmpl, noSystem);
  EXPECT_EQ(rendered(spans),
            "<s>[INST] Hi there [/INST] Hello! How can I help? </s>[INST] What is 2+2? [/INST]4.</s>");
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  encodeChat(*t, *t->newEncoder(), spans, ids, mask);
  ASSERT_EQ(ids.size(), mask.size());
  EXPECT_EQ(ids.front(), *t->tokenId("<s>"));
  EXPECT_EQ(mask.front(), 0);
  EXPECT_EQ(ids.back(), *t->tokenId("</s>"));
  EXPECT_EQ(mask.back(), 1);
  // The system role and roles out of order are the template's raise_exception.
  EXPECT_THROW(renderChat(tmpl, kConversation), rt::Error);
  EXPECT_THROW(renderChat(tmpl, {{"assistant", "a"}, {"user", "u"}}), rt::Error);
  test::removeTree(dir);
}

TEST(ChatFormatTest, DetectionRefusesWhatItCannotRender) {
  auto error = [](const std::string &name, const std::string &chatTemplate,
                  std::optional<ChatFormat> requested = std::nullopt) -> std::string {
    std::string dir = modelDir(name, chatTemplate);
    std::unique_ptr<Tokenizer> t = loadTokenizer(dir);
    std::string message;
    try {
      resolveChatTemplate(*t, dir, requested);
    } catch (const rt::Error &e) {
      message = e.what();
    }
    test::removeTree(dir);
    return message;
  };
  EXPECT_NE(error("llama3", R"("{{ 'Cutting Knowledge Date: December 2023' }}<|start_header_id|>")")
                .find("Llama 3.1's or later"),
            std::string::npos);
  EXPECT_NE(error("qwen2", R"("<|im_start|>{{ '<think>' }}")").find("thinking blocks"),
            std::string::npos);
  EXPECT_NE(error("gpt2", R"("{{ messages }}")").find("cannot tell the chat format"),
            std::string::npos);
  // No chat_template and no special tokens of any format.
  EXPECT_NE(error("gpt2", "").find("has neither <|start_header_id|> nor <|im_start|>"),
            std::string::npos);
  // A format the vocabulary does not know.
  EXPECT_NE(error("gpt2", "", ChatFormat::ChatML).find("has no token <|im_start|>: it does not "
                                                       "know the chatml chat format"),
            std::string::npos);
  EXPECT_NE(error("qwen2", "", ChatFormat::Llama3).find("it does not know the llama3 chat format"),
            std::string::npos);
  // Without a template, the special tokens decide.
  EXPECT_EQ(error("qwen2", ""), "");
}

TEST(ChatFormatTest, LinesAreParsedAndCheckedForFields) {
  std::vector<ChatMessage> m = parseChatLine(R"({"prompt": "p", "response": "r"})");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, "user");
  EXPECT_EQ(m[1].content, "r");
  m = parseChatLine(R"({"system": "s", "prompt": "p", "response": "r"})");
  EXPECT_EQ(m[0].role, "system");
  m = parseChatLine(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})");
  EXPECT_EQ(m[1].role, "assistant");
  auto error = [](const std::string &line) -> std::string {
    try {
      parseChatLine(line);
    } catch (const rt::Error &e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error("{\"prompt\": \"p\",").find("invalid JSON at byte"), std::string::npos);
  EXPECT_NE(error(R"({"prompt": "p"})").find("has no \"response\""), std::string::npos);
  EXPECT_NE(error(R"({"prompt": 3, "response": "r"})").find("\"prompt\" is a number"),
            std::string::npos);
  EXPECT_NE(error(R"({"text": "t"})").find("neither \"messages\" nor"), std::string::npos);
  EXPECT_NE(error(R"([1])").find("is a JSON array"), std::string::npos);
  EXPECT_NE(error(R"({"messages": [{"role": "user"}]})").find("message 0 has no \"content\""),
            std::string::npos);
  ChatTemplate chatml;
  EXPECT_THROW(renderChat(chatml, {{"user", "only a question"}}), rt::Error);
  EXPECT_THROW(renderChat(chatml, {{"tool", "x"}, {"assistant", "y"}}), rt::Error);
}

TEST(ChatFormatTest, FingerprintTellsTokenizersApart) {
  // What a version-2 token file records to refuse data and eval files of different tokenizers.
  std::unique_ptr<Tokenizer> a = loadTokenizer(kInputs + "/llama3.json");
  std::unique_ptr<Tokenizer> b = loadTokenizer(kInputs + "/llama3.json");
  std::unique_ptr<Tokenizer> c = loadTokenizer(kInputs + "/qwen2.json");
  EXPECT_EQ(a->fingerprint(), b->fingerprint());
  EXPECT_NE(a->fingerprint(), c->fingerprint());
}

} // namespace
} // namespace bonsai::tok
