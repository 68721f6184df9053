//===- Tokenizer.cpp - The tokenizer interface and the loader --------------===//
//
// The loader finds the tokenizer of a Hugging Face model directory: tokenizer.json when it is
// a kind this library handles, else tokenizer.model; a tokenizer.json of another kind with no
// tokenizer.model beside it is an error that names the kind. BOS and EOS come from
// tokenizer_config.json (or special_tokens_map.json), which is where transformers reads them.
//
//===----------------------------------------------------------------------===//

#include "bonsai/tokenizer/Tokenizer.h"

#include "bonsai/runtime/Json.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <sys/stat.h>

namespace bonsai::tok {

Encoder::~Encoder() = default;
Tokenizer::~Tokenizer() = default;

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids;
  newEncoder()->encode(text, ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<uint32_t> &ids) const {
  std::string out;
  decode(ids.data(), ids.size(), out);
  return out;
}

size_t Tokenizer::decodeSplit(const uint32_t *, size_t count) const { return count; }

std::optional<Cut> Tokenizer::findCut(std::string_view, size_t) const { return std::nullopt; }

uint64_t Tokenizer::fingerprint() const {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](const void *data, size_t n) {
    const unsigned char *p = static_cast<const unsigned char *>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ull;
    }
  };
  auto mix32 = [&](uint32_t v) {
    unsigned char b[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
    mix(b, 4);
  };
  uint32_t vocab = vocabSize();
  mix32(vocab);
  std::string text;
  for (uint32_t id = 0; id < vocab; ++id) {
    text.clear();
    try {
      decode(&id, 1, text);
    } catch (const rt::Error &) {
      mix32(0xffffffffu); // an id with no entry (a gap in the vocabulary)
      continue;
    }
    mix32(uint32_t(text.size()));
    mix(text.data(), text.size());
  }
  return h;
}

void Tokenizer::setSpecialTokens(std::optional<NamedToken> bos, std::optional<NamedToken> eos,
                                 std::string source) {
  bos_ = std::move(bos);
  eos_ = std::move(eos);
  specialSource_ = std::move(source);
}

std::string Tokenizer::describe() const {
  std::ostringstream s;
  s << path_ << ": " << describeModel();
  auto name = [&](const char *what, const std::optional<NamedToken> &t) {
    s << ", " << what << " ";
    if (t)
      s << t->text << " (" << t->id << ")";
    else
      s << "none";
  };
  name("BOS", bos_);
  name("EOS", eos_);
  if (bos_ || eos_)
    s << " from " << specialSource_;
  if (!note_.empty())
    s << "; " << note_;
  return s.str();
}

namespace {

enum class Kind { Missing, File, Directory, Other };

Kind kindOf(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return Kind::Missing;
  if (S_ISDIR(st.st_mode))
    return Kind::Directory;
  return S_ISREG(st.st_mode) ? Kind::File : Kind::Other;
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw rt::Error("cannot open '" + path + "': " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad())
    throw rt::Error("cannot read '" + path + "'");
  return s.str();
}

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<Tokenizer> loadFile(const std::string &path) {
  if (endsWith(path, ".json"))
    return parseHfTokenizer(readFile(path), path);
  // A tokenizer.model is a protobuf; a JSON file under another name starts with '{'.
  std::ifstream in(path, std::ios::binary);
  char first = 0;
  in >> std::ws;
  in.get(first);
  if (first == '{')
    return parseHfTokenizer(readFile(path), path);
  return loadSentencePiece(path);
}

/// BOS and EOS from tokenizer_config.json or special_tokens_map.json in `dir`, when either
/// names them; an entry is a string, {"content": ...} or null (none).
void applyConfig(const std::string &dir, Tokenizer &t) {
  for (const char *name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    std::string path = dir + "/" + name;
    if (kindOf(path) != Kind::File)
      continue;
    rt::JsonValue config = rt::parseJson(readFile(path), path);
    if (!config.isObject())
      throw rt::Error(path + ": is a " + config.kindName() + ", expected an object");
    std::optional<NamedToken> special[2] = {t.bos(), t.eos()};
    const char *keys[2] = {"bos_token", "eos_token"};
    bool found = false;
    for (int i = 0; i < 2; ++i) {
      const rt::JsonValue *v = config.find(keys[i]);
      if (!v)
        continue;
      found = true;
      if (v->isObject())
        v = v->find("content");
      if (!v || v->isNull()) {
        special[i].reset();
        continue;
      }
      if (!v->isString())
        throw rt::Error(path + ": " + keys[i] +
                        " is neither a string, {\"content\": ...} nor null");
      std::optional<uint32_t> id = t.tokenId(v->stringValue());
      if (!id)
        throw rt::Error(path + ": " + keys[i] + " \"" + v->stringValue() +
                        "\" is not in the vocabulary of '" + t.path() + "'");
      special[i] = NamedToken{*id, v->stringValue()};
    }
    if (found) {
      t.setSpecialTokens(special[0], special[1], name);
      return;
    }
  }
}

std::string directoryOf(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

} // namespace

std::unique_ptr<Tokenizer> loadTokenizer(const std::string &path) {
  std::unique_ptr<Tokenizer> t;
  std::string dir;
  switch (kindOf(path)) {
  case Kind::Missing:
    throw rt::Error("tokenizer '" + path + "' does not exist");
  case Kind::Other:
    throw rt::Error("tokenizer '" + path + "' is neither a file nor a directory");
  case Kind::File:
    t = loadFile(path);
    dir = directoryOf(path);
    break;
  case Kind::Directory: {
    dir = path;
    std::string json = path + "/tokenizer.json", model = path + "/tokenizer.model";
    bool haveModel = kindOf(model) == Kind::File;
    if (kindOf(json) == Kind::File) {
      try {
        t = parseHfTokenizer(readFile(json), json);
      } catch (const UnsupportedTokenizer &e) {
        if (!haveModel)
          throw;
        t = loadSentencePiece(model);
        t->note_ = std::string("tokenizer.json not used: ") + e.what();
      }
    } else if (haveModel) {
      t = loadSentencePiece(model);
    } else {
      throw rt::Error("'" + path + "' has no tokenizer.json and no tokenizer.model");
    }
    break;
  }
  }
  applyConfig(dir, *t);
  return t;
}

} // namespace bonsai::tok
