//===- ChatFormat.h - Conversations rendered as the model's chat template ---===//
//
// Instruction data (bonsai-tokenize --jsonl, docs/tokenizers.md) is a conversation per line. It
// is rendered as the model family's Hugging Face chat template renders it: Llama 3
// (<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>), ChatML as Qwen2 uses it
// (<|im_start|>role\n...<|im_end|>\n, with the template's default system prompt) or Mistral
// v0.1 ([INST] ... [/INST]...</s>). The rendering is a list of spans, special tokens apart from
// text, each marked as trained (the assistant's words and the token that ends its turn) or not,
// and encodes to ids and a per-token loss mask. The formats are written from the templates'
// published definitions (the Jinja text in each model's tokenizer_config.json); no Jinja is
// evaluated here.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TOKENIZER_CHATFORMAT_H
#define BONSAI_TOKENIZER_CHATFORMAT_H

#include "bonsai/tokenizer/Tokenizer.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai::tok {

/// The chat formats rendered here.
enum class ChatFormat { Llama3, ChatML, Mistral };

/// "llama3", "chatml" or "mistral".
const char *chatFormatName(ChatFormat format);
/// The format named `name`, or nothing.
std::optional<ChatFormat> parseChatFormat(std::string_view name);

/// One message of a conversation: role "system", "user" or "assistant".
struct ChatMessage {
  std::string role;
  std::string content;
};

/// A chat format bound to a tokenizer: the format, the default system prompt its template
/// puts first when a conversation has none (ChatML as Qwen2 writes it; empty for none), and
/// the special tokens it uses.
struct ChatTemplate {
  ChatFormat format = ChatFormat::ChatML;
  std::string defaultSystem;
  /// Mistral's BOS and EOS (the tokenizer's).
  std::string bos, eos;
  /// Where the format came from, for messages ("chat_template of <file>", "--chat-format").
  std::string source;
};

/// The chat template to render with for the tokenizer `t` loaded from `tokenizerPath` (a
/// model directory, or a file whose directory holds tokenizer_config.json). With `requested`,
/// that format; without it, the one the chat_template of tokenizer_config.json names (or, with
/// no template, the one whose special tokens the vocabulary has). Throws rt::Error when the
/// format cannot be told, the template is one of the family's variants not reproduced here, or
/// the vocabulary lacks a special token of the format.
ChatTemplate resolveChatTemplate(const Tokenizer &t, const std::string &tokenizerPath,
                                 std::optional<ChatFormat> requested);

/// A piece of a rendered conversation.
struct ChatSpan {
  std::string text;
  /// A special token (encoded as its id, never split) rather than text.
  bool special = false;
  /// Counts in the loss: the assistant's content and the token that ends its turn.
  bool trained = false;
};

/// Renders `messages` (validated: roles, order and content as the format requires; an
/// rt::Error says what is wrong).
std::vector<ChatSpan> renderChat(const ChatTemplate &tmpl, const std::vector<ChatMessage> &messages);

/// Appends the ids of `spans` to `ids` and one mask entry per id to `mask` (1: trained). Runs
/// of text between special tokens are encoded whole, as Hugging Face encodes the rendered
/// string; where a trained part starts inside a run, the tokens from the first one that differs
/// from encoding the run's untrained prefix alone are trained.
void encodeChat(const Tokenizer &t, Encoder &encoder, const std::vector<ChatSpan> &spans,
                std::vector<uint32_t> &ids, std::vector<uint8_t> &mask);

/// Parses one JSON line: {"prompt": ..., "response": ...} (and an optional "system") or
/// {"messages": [{"role": ..., "content": ...}, ...]}. Throws rt::Error saying what is wrong
/// (without the file and line, which the caller adds).
std::vector<ChatMessage> parseChatLine(std::string_view line);

} // namespace bonsai::tok

#endif // BONSAI_TOKENIZER_CHATFORMAT_H
