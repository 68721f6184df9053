//===- ChatFormat.cpp - Conversations rendered as the model's chat template -===//
//
// Each format below transcribes the Jinja chat template its models ship (the text is quoted
// above each renderer) for the inputs bonsai-tokenize accepts: system, user and assistant
// messages with string content, no tools, no generation prompt. Detection reads
// tokenizer_config.json's chat_template and refuses the variants of a family whose output
// differs (Llama 3.1's dated system header, Qwen3's thinking blocks, Llama 2's <<SYS>>, Mistral's
// v0.3 templates) rather than render them wrongly.
//
//===----------------------------------------------------------------------===//

#include "bonsai/tokenizer/ChatFormat.h"

#include "bonsai/runtime/Json.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <sys/stat.h>

namespace bonsai::tok {

const char *chatFormatName(ChatFormat format) {
  switch (format) {
  case ChatFormat::Llama3:
    return "llama3";
  case ChatFormat::ChatML:
    return "chatml";
  case ChatFormat::Mistral:
    return "mistral";
  }
  return "?";
}

std::optional<ChatFormat> parseChatFormat(std::string_view name) {
  for (ChatFormat f : {ChatFormat::Llama3, ChatFormat::ChatML, ChatFormat::Mistral})
    if (name == chatFormatName(f))
      return f;
  return std::nullopt;
}

namespace {

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool isFile(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string configPath(const std::string &tokenizerPath) {
  if (isDirectory(tokenizerPath))
    return tokenizerPath + "/tokenizer_config.json";
  size_t slash = tokenizerPath.rfind('/');
  std::string dir = slash == std::string::npos ? "." : tokenizerPath.substr(0, slash);
  return dir + "/tokenizer_config.json";
}

/// The chat_template of tokenizer_config.json: a string, or the "default" entry of a list of
/// {"name", "template"}; empty when there is none.
std::string readChatTemplate(const std::string &path) {
  if (!isFile(path))
    return "";
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  rt::JsonValue config = rt::parseJson(s.str(), path);
  const rt::JsonValue *t = config.isObject() ? config.find("chat_template") : nullptr;
  if (!t || t->isNull())
    return "";
  if (t->isString())
    return t->stringValue();
  if (t->isArray())
    for (const rt::JsonValue &entry : t->elements()) {
      const rt::JsonValue *name = entry.isObject() ? entry.find("name") : nullptr;
      const rt::JsonValue *text = entry.isObject() ? entry.find("template") : nullptr;
      if (name && name->isString() && name->stringValue() == "default" && text &&
          text->isString())
        return text->stringValue();
    }
  throw rt::Error(path + ": chat_template is neither a string nor a list with a \"default\" "
                         "entry");
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

/// The default system prompt of a ChatML template that writes one when the conversation has
/// none (Qwen2: '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n'): the literal
/// between "<|im_start|>system\n" and "<|im_end|>" that is not an expression.
std::string chatmlDefaultSystem(const std::string &tmpl) {
  // The template's newline is a real one (JSON "\n") or a Jinja escape (JSON "\\n").
  for (const std::string open : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    for (size_t at = tmpl.find(open); at != std::string::npos; at = tmpl.find(open, at + 1)) {
      size_t start = at + open.size();
      size_t end = tmpl.find("<|im_end|>", start);
      if (end == std::string::npos)
        break;
      std::string text = tmpl.substr(start, end - start);
      if (text.empty() || contains(text, "'") || contains(text, "\"") || contains(text, "{") ||
          contains(text, "+"))
        continue;
      std::string out;
      for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
          out += '\n';
          ++i;
        } else {
          out += text[i];
        }
      }
      return out;
    }
  }
  return "";
}

void requireToken(const Tokenizer &t, const std::string &token, ChatFormat format) {
  if (!t.tokenId(token))
    throw rt::Error("the tokenizer '" + t.path() + "' has no token " + token + ": it does not know "
                    "the " + chatFormatName(format) + " chat format");
}

} // namespace

ChatTemplate resolveChatTemplate(const Tokenizer &t, const std::string &tokenizerPath,
                                 std::optional<ChatFormat> requested) {
  ChatTemplate result;
  std::string config = configPath(tokenizerPath);
  std::string tmpl = readChatTemplate(config);
  if (requested) {
    result.format = *requested;
    result.source = "--chat-format";
  } else if (!tmpl.empty()) {
    result.source = "chat_template of " + config;
    auto refuse = [&](const std::string &what) {
      return rt::Error("the chat_template of " + config + " is " + what +
                       ", which bonsai-tokenize does not reproduce; pass --chat-format "
                       "llama3|chatml|mistral to render with one of those (docs/tokenizers.md)");
    };
    if (contains(tmpl, "<|start_header_id|>")) {
      if (contains(tmpl, "Cutting Knowledge Date"))
        throw refuse("Llama 3.1's or later (it writes a dated system header)");
      result.format = ChatFormat::Llama3;
    } else if (contains(tmpl, "<|im_start|>")) {
      if (contains(tmpl, "<think>"))
        throw refuse("a template with thinking blocks (Qwen3)");
      result.format = ChatFormat::ChatML;
      result.defaultSystem = chatmlDefaultSystem(tmpl);
    } else if (contains(tmpl, "[INST]")) {
      if (contains(tmpl, "<<SYS>>"))
        throw refuse("Llama 2's");
      if (!contains(tmpl, " [/INST]"))
        throw refuse("a Mistral template other than v0.1's");
      result.format = ChatFormat::Mistral;
    } else {
      throw rt::Error("cannot tell the chat format of " + config +
                      ": its chat_template uses none of <|start_header_id|> (llama3), "
                      "<|im_start|> (chatml) or [INST] (mistral); pass --chat-format");
    }
  } else if (t.tokenId("<|start_header_id|>") && t.tokenId("<|eot_id|>")) {
    result.format = ChatFormat::Llama3;
    result.source = "the special tokens of '" + t.path() + "' (no chat_template)";
  } else if (t.tokenId("<|im_start|>") && t.tokenId("<|im_end|>")) {
    result.format = ChatFormat::ChatML;
    result.source = "the special tokens of '" + t.path() + "' (no chat_template)";
  } else {
    throw rt::Error("cannot tell the chat format: " +
                    (isFile(config) ? config + " has no chat_template"
                                    : "there is no " + config) +
                    " and the vocabulary of '" + t.path() +
                    "' has neither <|start_header_id|> nor <|im_start|>; pass --chat-format");
  }

  switch (result.format) {
  case ChatFormat::Llama3:
    for (const char *token : {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                              "<|eot_id|>"})
      requireToken(t, token, result.format);
    break;
  case ChatFormat::ChatML:
    requireToken(t, "<|im_start|>", result.format);
    requireToken(t, "<|im_end|>", result.format);
    break;
  case ChatFormat::Mistral:
    if (!t.bos() || !t.eos())
      throw rt::Error("the tokenizer '" + t.path() + "' has no " + (t.bos() ? "EOS" : "BOS") +
                      " token: it does not know the mistral chat format");
    result.bos = t.bos()->text;
    result.eos = t.eos()->text;
    break;
  }
  return result;
}

namespace {

/// Jinja's trim: leading and trailing whitespace removed.
std::string trim(const std::string &s) {
  const char *space = " \t\n\r\f\v";
  size_t a = s.find_first_not_of(space);
  if (a == std::string::npos)
    return "";
  size_t b = s.find_last_not_of(space);
  return s.substr(a, b - a + 1);
}

void checkRoles(const std::vector<ChatMessage> &messages) {
  if (messages.empty())
    throw rt::Error("the conversation has no messages");
  bool assistant = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string &role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant")
      throw rt::Error("message " + std::to_string(i) + " has role \"" + role +
                      "\", expected system, user or assistant");
    if (role == "system" && i != 0)
      throw rt::Error("message " + std::to_string(i) +
                      " is a system message: only the first may be one");
    assistant = assistant || role == "assistant";
  }
  if (!assistant)
    throw rt::Error("the conversation has no assistant message: nothing to train on");
}

} // namespace

std::vector<ChatSpan> renderChat(const ChatTemplate &tmpl,
                                 const std::vector<ChatMessage> &messages) {
  checkRoles(messages);
  std::vector<ChatSpan> out;
  auto special = [&](const std::string &token, bool trained = false) {
    out.push_back({token, true, trained});
  };
  auto text = [&](const std::string &s, bool trained = false) {
    if (!s.empty())
      out.push_back({s, false, trained});
  };
  switch (tmpl.format) {
  case ChatFormat::Llama3:
    // Meta-Llama-3-8B-Instruct:
    //   {% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' +
    //      message['content'] | trim + '<|eot_id|>' %}
    //   {% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}
    special("<|begin_of_text|>");
    for (const ChatMessage &m : messages) {
      bool a = m.role == "assistant";
      special("<|start_header_id|>");
      text(m.role);
      special("<|end_header_id|>");
      text("\n\n");
      text(trim(m.content), a);
      special("<|eot_id|>", a);
    }
    break;
  case ChatFormat::ChatML:
    // Qwen2-Instruct:
    //   {% if loop.first and messages[0]['role'] != 'system' %}
    //     {{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}
    //   {{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
    if (messages[0].role != "system" && !tmpl.defaultSystem.empty()) {
      special("<|im_start|>");
      text("system\n" + tmpl.defaultSystem);
      special("<|im_end|>");
      text("\n");
    }
    for (const ChatMessage &m : messages) {
      bool a = m.role == "assistant";
      special("<|im_start|>");
      text(m.role + "\n");
      text(m.content, a);
      special("<|im_end|>", a);
      text("\n");
    }
    break;
  case ChatFormat::Mistral:
    // Mistral-7B-Instruct-v0.1:
    //   {{ bos_token }}{% for message in messages %}
    //   {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception(...) }}
    //   {% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}
    //   {% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}
    //   {% else %}{{ raise_exception('Only user and assistant roles are supported!') }}
    special(tmpl.bos);
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage &m = messages[i];
      if (m.role == "system")
        throw rt::Error("the mistral chat format has no system role (its template accepts only "
                        "user and assistant messages)");
      if ((m.role == "user") != (i % 2 == 0))
        throw rt::Error("message " + std::to_string(i) + " is a " + m.role +
                        " message: the mistral chat format needs roles alternating "
                        "user/assistant/user/...");
      if (m.role == "user") {
        text("[INST] " + m.content + " [/INST]");
      } else {
        text(m.content, true);
        special(tmpl.eos, true);
      }
    }
    break;
  }
  return out;
}

void encodeChat(const Tokenizer &t, Encoder &encoder, const std::vector<ChatSpan> &spans,
                std::vector<uint32_t> &ids, std::vector<uint8_t> &mask) {
  std::vector<uint32_t> run, prefix;
  for (size_t i = 0; i < spans.size();) {
    if (spans[i].special) {
      std::optional<uint32_t> id = t.tokenId(spans[i].text);
      if (!id)
        throw rt::Error("the tokenizer '" + t.path() + "' has no token " + spans[i].text);
      ids.push_back(*id);
      mask.push_back(spans[i].trained);
      ++i;
      continue;
    }
    // A run of text spans, encoded whole; `bounds` are where its trained flag changes.
    std::string text;
    std::vector<std::pair<size_t, bool>> bounds; // (byte offset, flag from there on)
    for (; i < spans.size() && !spans[i].special; ++i) {
      if (bounds.empty() || bounds.back().second != spans[i].trained)
        bounds.push_back({text.size(), spans[i].trained});
      text += spans[i].text;
    }
    run.clear();
    encoder.encode(text, run);
    std::vector<size_t> tokenBounds;
    for (const auto &[offset, trained] : bounds) {
      (void)trained;
      if (offset == 0) {
        tokenBounds.push_back(0);
        continue;
      }
      prefix.clear();
      encoder.encode(std::string_view(text).substr(0, offset), prefix);
      size_t k = 0;
      while (k < prefix.size() && k < run.size() && prefix[k] == run[k])
        ++k;
      tokenBounds.push_back(std::max(k, tokenBounds.back()));
    }
    tokenBounds.push_back(run.size());
    for (size_t b = 0; b < bounds.size(); ++b)
      for (size_t k = tokenBounds[b]; k < tokenBounds[b + 1]; ++k)
        mask.push_back(bounds[b].second);
    ids.insert(ids.end(), run.begin(), run.end());
  }
}

std::vector<ChatMessage> parseChatLine(std::string_view line) {
  rt::JsonValue v;
  try {
    v = rt::parseJson(line, "");
  } catch (const rt::Error &e) {
    std::string m = e.what();
    throw rt::Error(m.rfind(": ", 0) == 0 ? m.substr(2) : m);
  }
  if (!v.isObject())
    throw rt::Error(std::string("the line is a JSON ") + v.kindName() +
                    ", expected an object with \"prompt\" and \"response\" or \"messages\"");
  auto stringField = [&](const rt::JsonValue &object, const char *key,
                         const std::string &where) -> std::string {
    const rt::JsonValue *f = object.find(key);
    if (!f)
      throw rt::Error(where + "has no \"" + key + "\"");
    if (!f->isString())
      throw rt::Error(where + "\"" + key + "\" is a " + f->kindName() + ", expected a string");
    return f->stringValue();
  };
  std::vector<ChatMessage> messages;
  if (const rt::JsonValue *list = v.find("messages")) {
    if (v.find("prompt") || v.find("response"))
      throw rt::Error("the object has both \"messages\" and \"prompt\"/\"response\"");
    if (!list->isArray())
      throw rt::Error(std::string("\"messages\" is a ") + list->kindName() + ", expected an array");
    for (size_t i = 0; i < list->elements().size(); ++i) {
      const rt::JsonValue &m = list->elements()[i];
      std::string where = "message " + std::to_string(i) + " ";
      if (!m.isObject())
        throw rt::Error(where + "is a " + m.kindName() + ", expected an object");
      messages.push_back({stringField(m, "role", where), stringField(m, "content", where)});
    }
    return messages;
  }
  if (!v.find("prompt") && !v.find("response"))
    throw rt::Error("the object has neither \"messages\" nor \"prompt\" and \"response\"");
  if (v.find("system"))
    messages.push_back({"system", stringField(v, "system", "the object ")});
  messages.push_back({"user", stringField(v, "prompt", "the object ")});
  messages.push_back({"assistant", stringField(v, "response", "the object ")});
  return messages;
}

} // namespace bonsai::tok
