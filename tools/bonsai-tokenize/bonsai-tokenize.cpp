//===- bonsai-tokenize.cpp - Text to Bonsai token files, and back ---------===//
//
// Turns text into the token file bonsai-run --data reads (docs/data-format.md), with the
// model's own tokenizer (--tokenizer: a Hugging Face model directory, a tokenizer.json or a
// tokenizer.model; docs/tokenizers.md) or, without one, byte-level (token id = byte value,
// vocabulary 256). --decode turns a token file back into text.
//
// With a tokenizer, a document is an input file, or a line of one with --lines; --bos and --eos
// put the tokenizer's BOS and EOS around each. Input is read in 1 MiB pieces and cut into units
// of about 64 KiB (at line ends with --lines; inside a long document only where the tokenizer
// says both parts encode as the whole does), which --threads workers encode while the main
// thread reads ahead and writes the ids in order: memory stays bounded by the units in flight,
// except for a document that offers no such cut. The output is written under a temporary name,
// fsynced and renamed, so an interrupted run never leaves a partial file under the requested
// name. Every failure is one line, "bonsai-tokenize: error: <cause>", exit status 1.
//
// --jsonl reads instruction data, a conversation per line, renders each with the model's chat
// format (bonsai/tokenizer/ChatFormat.h) and writes a version-2 token file: the documents'
// boundaries, a loss mask that is 1 on the assistant's tokens only, and the tokenizer's
// vocabulary size and fingerprint. Units are whole lines, encoded by the same workers; a bad
// line stops the run with its file and line number, and nothing is written.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CrashReport.h"
#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Tensor.h"
#include "bonsai/tokenizer/ChatFormat.h"
#include "bonsai/tokenizer/Tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rt = bonsai::rt;
namespace tok = bonsai::tok;

namespace {

const char *const kSynopsis =
    "usage: bonsai-tokenize INPUT... -o TOKENS.bin [--tokenizer DIR|FILE] [--lines] [--bos] "
    "[--eos]\n"
    "                       [--threads N] [--token-bytes 2|4]\n"
    "       bonsai-tokenize --jsonl FILE... -o TOKENS.bin --tokenizer DIR|FILE\n"
    "                       [--chat-format auto|llama3|chatml|mistral] [--threads N]\n"
    "       bonsai-tokenize --decode TOKENS.bin -o TEXT [--tokenizer DIR|FILE]\n";

const char *const kHelp =
    "\n"
    "Writes INPUT (one or more files, '-' for stdin) as a Bonsai token file for bonsai-run\n"
    "--data, or with --decode a token file back as text. See docs/tokenizers.md and\n"
    "docs/data-format.md.\n"
    "\n"
    "  -o, --output FILE    the file to write ('-' for stdout with --decode)\n"
    "  --tokenizer PATH     a Hugging Face model directory (tokenizer.json, else\n"
    "                       tokenizer.model), a tokenizer.json or a tokenizer.model; without\n"
    "                       it, token id = byte value (vocabulary 256)\n"
    "  --lines              each non-empty line is a document (the newline and a '\\r' before\n"
    "                       it are not part of it); by default each input file is one\n"
    "  --bos, --eos         put the tokenizer's BOS / EOS token before / after each document\n"
    "  --threads N          encoding threads (default: the machine's cores)\n"
    "  --token-bytes N      2 (uint16 ids) or 4 (uint32 ids); default: 2 when the vocabulary\n"
    "                       fits in 65536 ids, else 4\n"
    "  --jsonl FILE         instruction data: each line {\"prompt\": ..., \"response\": ...}\n"
    "                       or {\"messages\": [{\"role\": ..., \"content\": ...}, ...]},\n"
    "                       rendered with the model's chat format; only the assistant's\n"
    "                       tokens count in the loss (writes a version-2 token file)\n"
    "  --chat-format F      auto (default: from tokenizer_config.json), llama3, chatml or\n"
    "                       mistral\n"
    "  --decode             read TOKENS.bin and write its text\n"
    "  --help               this text\n";

/// Bytes per unit of work: small enough that a few MB keep every thread busy.
constexpr size_t kUnitBytes = size_t(64) << 10;
/// Bytes per read.
constexpr size_t kReadBytes = size_t(1) << 20;

struct UsageError {
  std::string message;
};

struct Options {
  std::vector<std::string> inputs, jsonlInputs;
  std::string output;
  std::string tokenizer;
  uint32_t tokenBytes = 0; // 0: chosen from the vocabulary
  bool lines = false, bos = false, eos = false, decode = false, help = false;
  bool jsonl = false;
  std::optional<tok::ChatFormat> chatFormat; // nothing: auto
  bool chatFormatGiven = false;
  unsigned threads = 0;
};

Options parseOptions(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-') {
      std::string flag = arg, value;
      bool hasValue = false;
      if (size_t eq = arg.find('='); eq != std::string::npos && arg.rfind("--", 0) == 0) {
        flag = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        hasValue = true;
      }
      auto takeValue = [&]() {
        if (hasValue)
          return value;
        if (i + 1 >= argc)
          throw UsageError{flag + " needs a value"};
        return std::string(argv[++i]);
      };
      auto noValue = [&](bool &target) {
        if (hasValue)
          throw UsageError{flag + " takes no value"};
        target = true;
      };
      if (flag == "-o" || flag == "--output") {
        o.output = takeValue();
      } else if (flag == "--token-bytes") {
        std::string v = takeValue();
        if (v != "2" && v != "4")
          throw UsageError{"--token-bytes must be 2 or 4, got '" + v + "'"};
        o.tokenBytes = uint32_t(v[0] - '0');
      } else if (flag == "--tokenizer") {
        o.tokenizer = takeValue();
      } else if (flag == "--threads") {
        std::string v = takeValue();
        char *end = nullptr;
        errno = 0;
        unsigned long n = std::strtoul(v.c_str(), &end, 10);
        if (v.empty() || *end || errno || n < 1 || n > 1024 || v[0] == '-')
          throw UsageError{"--threads must be an integer from 1 to 1024, got '" + v + "'"};
        o.threads = unsigned(n);
      } else if (flag == "--jsonl") {
        o.jsonl = true;
        o.jsonlInputs.push_back(takeValue());
      } else if (flag == "--chat-format") {
        std::string v = takeValue();
        o.chatFormatGiven = true;
        if (v != "auto") {
          o.chatFormat = tok::parseChatFormat(v);
          if (!o.chatFormat)
            throw UsageError{"--chat-format must be auto, llama3, chatml or mistral, got '" + v +
                             "'"};
        }
      } else if (flag == "--lines") {
        noValue(o.lines);
      } else if (flag == "--bos") {
        noValue(o.bos);
      } else if (flag == "--eos") {
        noValue(o.eos);
      } else if (flag == "--decode") {
        noValue(o.decode);
      } else {
        throw UsageError{"unknown option '" + arg + "'"};
      }
      continue;
    }
    o.inputs.push_back(arg);
  }
  if (o.help)
    return o;
  if (o.jsonl) {
    if (!o.inputs.empty())
      throw UsageError{"with --jsonl every input is a --jsonl FILE; '" + o.inputs[0] +
                       "' is not"};
    if (o.decode || o.lines || o.bos || o.eos)
      throw UsageError{"--jsonl takes no --decode, --lines, --bos or --eos (the chat format "
                       "puts the special tokens)"};
    if (o.tokenizer.empty())
      throw UsageError{"--jsonl needs --tokenizer (the chat format is the model's)"};
    o.inputs = o.jsonlInputs;
  } else if (o.chatFormatGiven) {
    throw UsageError{"--chat-format is for --jsonl"};
  }
  if (o.inputs.empty())
    throw UsageError{"no input file given"};
  if (o.output.empty())
    throw UsageError{o.decode ? "no output file given (-o TEXT)"
                              : "no output file given (-o TOKENS.bin)"};
  if (o.decode) {
    if (o.inputs.size() != 1)
      throw UsageError{"--decode reads one token file, got " + std::to_string(o.inputs.size())};
    if (o.lines || o.bos || o.eos || o.tokenBytes)
      throw UsageError{"--lines, --bos, --eos and --token-bytes are for encoding, not --decode"};
  } else {
    if (o.output == "-")
      throw UsageError{"a token file cannot be written to stdout (its header is completed last)"};
    if (o.tokenizer.empty() && (o.lines || o.bos || o.eos))
      throw UsageError{"--lines, --bos and --eos need --tokenizer (byte-level files have no "
                       "documents or special tokens)"};
  }
  if (o.threads == 0)
    o.threads = std::max(1u, std::thread::hardware_concurrency());
  return o;
}

std::string reason() { return std::strerror(errno); }

/// An output file written under a temporary name and renamed by commit(); removed otherwise.
struct Output {
  std::string path, temp;
  int fd = -1;
  bool keep = false;

  explicit Output(const std::string &target) : path(target) {
    if (target == "-") {
      fd = 1;
      keep = true;
      return;
    }
    temp = target + ".tmp." + std::to_string(::getpid());
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      throw rt::Error("cannot create '" + temp + "': " + reason());
  }
  ~Output() {
    if (fd > 1)
      ::close(fd);
    if (!keep && !temp.empty())
      ::unlink(temp.c_str());
  }
  const std::string &name() const { return temp.empty() ? path : temp; }
  void writeAll(const void *data, size_t size) {
    const char *p = static_cast<const char *>(data);
    while (size > 0) {
      ssize_t n = ::write(fd, p, size);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        throw rt::Error("cannot write '" + name() + "': " + reason());
      p += n;
      size -= size_t(n);
    }
  }
  void commit() {
    if (temp.empty())
      return;
    if (::fsync(fd) != 0)
      throw rt::Error("cannot flush '" + temp + "': " + reason());
    int f = fd;
    fd = -1;
    if (::close(f) != 0)
      throw rt::Error("cannot close '" + temp + "': " + reason());
    if (std::rename(temp.c_str(), path.c_str()) != 0)
      throw rt::Error("cannot rename '" + temp + "' to '" + path + "': " + reason());
    keep = true;
  }
};

/// An input file (or stdin) read in pieces.
struct Input {
  std::string name;
  int fd = -1;
  uint64_t size = 0; // 0 when unknown (stdin, a pipe)

  explicit Input(const std::string &path) : name(path) {
    if (path == "-") {
      fd = 0;
      name = "<stdin>";
      return;
    }
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw rt::Error("cannot open input '" + path + "': " + reason());
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
      size = uint64_t(st.st_size);
  }
  ~Input() {
    if (fd > 0)
      ::close(fd);
  }
  /// Appends up to `n` bytes to `buffer`; returns how many (0 at the end).
  size_t read(std::string &buffer, size_t n) {
    size_t old = buffer.size();
    buffer.resize(old + n);
    for (;;) {
      ssize_t got = ::read(fd, &buffer[old], n);
      if (got < 0 && errno == EINTR)
        continue;
      if (got < 0) {
        buffer.resize(old);
        throw rt::Error("cannot read input '" + name + "': " + reason());
      }
      buffer.resize(old + size_t(got));
      return size_t(got);
    }
  }
};

void putLE(unsigned char *p, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i)
    p[i] = static_cast<unsigned char>(value >> (8 * i));
}

std::string joinNames(const std::vector<std::string> &inputs) {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i)
    s += (i ? ", " : "") + (inputs[i] == "-" ? std::string("<stdin>") : inputs[i]);
  return s;
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Progress on stderr once a run has taken a second: then a line rewritten twice a second on a
/// terminal, or a line every ten seconds otherwise.
class Progress {
public:
  explicit Progress(uint64_t totalBytes) : total_(totalBytes), tty_(::isatty(2)) {}
  void update(uint64_t bytes, uint64_t tokens) {
    double t = secondsSince(start_);
    if (t < 1 || (shown_ && t - last_ < (tty_ ? 0.5 : 10)))
      return;
    last_ = t;
    char line[160];
    double mib = double(bytes) / (1 << 20);
    if (total_)
      std::snprintf(
          line, sizeof line, "tokenize: %.1f of %.1f MiB (%.0f%%), %.1f MiB/s, %" PRIu64 " tokens",
          mib, double(total_) / (1 << 20), 100.0 * double(bytes) / double(total_), mib / t, tokens);
    else
      std::snprintf(line, sizeof line, "tokenize: %.1f MiB, %.1f MiB/s, %" PRIu64 " tokens", mib,
                    mib / t, tokens);
    std::fprintf(stderr, tty_ ? "\r%s\033[K" : "%s\n", line);
    shown_ = true;
  }
  ~Progress() {
    if (shown_ && tty_)
      std::fputc('\n', stderr);
  }
  double seconds() const { return secondsSince(start_); }

private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  uint64_t total_;
  bool tty_;
  double last_ = 0;
  bool shown_ = false;
};

/// The token file header; its count is patched in once the input has been read.
void writeHeader(Output &out, uint32_t tokenBytes) {
  unsigned char header[rt::kTokenFileHeaderBytes] = {};
  std::memcpy(header, rt::kTokenFileMagic, sizeof rt::kTokenFileMagic);
  putLE(header + 8, rt::kTokenFileVersion, 4);
  putLE(header + 12, tokenBytes, 4);
  out.writeAll(header, sizeof header);
}

void finishTokenFile(Output &out, uint64_t count, const std::string &inputs) {
  if (count == 0)
    throw rt::Error("input '" + inputs + "' gives no tokens: a token file needs at least one");
  unsigned char bytes[8];
  putLE(bytes, count, 8);
  if (::pwrite(out.fd, bytes, 8, 16) != 8)
    throw rt::Error("cannot write '" + out.name() + "': " + reason());
  out.commit();
}

int runByteLevel(const Options &o) {
  uint32_t tokenBytes = o.tokenBytes ? o.tokenBytes : 2;
  std::vector<std::unique_ptr<Input>> inputs;
  for (const std::string &path : o.inputs)
    inputs.push_back(std::make_unique<Input>(path));
  Output out(o.output);
  writeHeader(out, tokenBytes);
  std::string buffer;
  std::vector<unsigned char> tokens(kReadBytes * tokenBytes);
  uint64_t count = 0;
  for (auto &in : inputs) {
    for (;;) {
      buffer.clear();
      size_t n = in->read(buffer, kReadBytes);
      if (n == 0)
        break;
      for (size_t i = 0; i < n; ++i)
        putLE(tokens.data() + i * tokenBytes, static_cast<unsigned char>(buffer[i]),
              int(tokenBytes));
      out.writeAll(tokens.data(), n * tokenBytes);
      count += n;
    }
  }
  std::string names = joinNames(o.inputs);
  if (count == 0)
    throw rt::Error("input '" + names + "' is empty: a token file needs at least one token");
  finishTokenFile(out, count, names);
  std::printf("tokenize: %s: %" PRIu64 " bytes -> %" PRIu64
              " tokens (byte-level, vocabulary 256, %u bytes per token) -> %s\n",
              names.c_str(), count, count, tokenBytes, o.output.c_str());
  return 0;
}

//===----------------------------------------------------------------------===//
// Encoding with a tokenizer: workers encode units, the main thread reads and writes in order.
//===----------------------------------------------------------------------===//

/// A unit of work: lines (each a document, or with --jsonl a conversation), or a part of one
/// document.
struct Job {
  std::string text;
  bool lines = false;
  std::string input;      // --jsonl: the file, for messages
  uint64_t firstLine = 0; // --jsonl: the line number of the text's first line
  std::vector<uint8_t> mask;      // --jsonl: per id, 1 when it counts in the loss
  std::vector<uint64_t> lengths;  // --jsonl: tokens per conversation
  bool first = false, last = false; // the document's first / last part
  std::vector<uint32_t> ids;
  uint64_t documents = 0;
  std::string error;
  bool done = false;
};

class Encoding {
public:
  Encoding(const tok::Tokenizer &t, const Options &o, Output &out, uint32_t tokenBytes,
           const tok::ChatTemplate *chat = nullptr)
      : t_(t), o_(o), out_(out), tokenBytes_(tokenBytes), chat_(chat) {
    if (o.bos)
      bos_ = t.bos()->id;
    if (o.eos)
      eos_ = t.eos()->id;
    for (unsigned i = 0; i < o.threads; ++i)
      workers_.emplace_back([this] { work(); });
  }
  ~Encoding() { stop(); }

  /// Queues `job`; writes finished jobs in order, waiting while too many are in flight.
  void submit(std::unique_ptr<Job> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(job.get());
    }
    work_.notify_one();
    inFlight_.push_back(std::move(job));
    writeDone(inFlight_.size() >= 4 * o_.threads);
  }

  /// Writes every job; returns when all are written.
  void finish() {
    while (!inFlight_.empty())
      writeDone(true);
    stop();
  }

  uint64_t tokens() const { return tokens_; }
  uint64_t documents() const { return documents_; }
  uint64_t invalidUtf8() const { return invalidUtf8_; }
  /// --jsonl: where each conversation ends, and the loss mask, one bit per token.
  const std::vector<uint64_t> &documentEnds() const { return ends_; }
  const std::string &maskBits() const { return maskBits_; }

private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    for (std::thread &w : workers_)
      w.join();
    workers_.clear();
  }

  void work() {
    std::unique_ptr<tok::Encoder> encoder = t_.newEncoder();
    for (;;) {
      Job *job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty())
          break;
        job = queue_.front();
        queue_.pop_front();
      }
      try {
        encode(*encoder, *job);
      } catch (const std::exception &e) {
        job->error = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        job->done = true;
      }
      done_.notify_all();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    invalidUtf8_ += encoder->invalidUtf8();
  }

  /// --jsonl: each non-blank line is a conversation. A bad line is an error naming it.
  void encodeConversations(tok::Encoder &encoder, Job &job) {
    std::string_view text = job.text;
    uint64_t line = job.firstLine;
    for (size_t start = 0; start < text.size(); ++line) {
      size_t end = text.find('\n', start);
      if (end == std::string_view::npos)
        end = text.size();
      std::string_view record = text.substr(start, end - start);
      start = end + 1;
      if (record.find_first_not_of(" \t\r") == std::string_view::npos)
        continue; // a blank line holds no record
      try {
        std::vector<tok::ChatSpan> spans = tok::renderChat(*chat_, tok::parseChatLine(record));
        size_t before = job.ids.size();
        tok::encodeChat(t_, encoder, spans, job.ids, job.mask);
        job.lengths.push_back(job.ids.size() - before);
      } catch (const std::exception &e) {
        throw rt::Error(job.input + ":" + std::to_string(line) + ": " + e.what());
      }
      ++job.documents;
    }
  }

  void encode(tok::Encoder &encoder, Job &job) {
    std::vector<uint32_t> &ids = job.ids;
    if (chat_) {
      encodeConversations(encoder, job);
      return;
    }
    if (!job.lines) {
      if (job.first && bos_)
        ids.push_back(*bos_);
      encoder.encode(job.text, ids);
      if (job.last && eos_)
        ids.push_back(*eos_);
      return;
    }
    std::string_view text = job.text;
    for (size_t start = 0; start < text.size();) {
      size_t end = text.find('\n', start);
      if (end == std::string_view::npos)
        end = text.size();
      std::string_view line = text.substr(start, end - start);
      start = end + 1;
      if (!line.empty() && line.back() == '\r')
        line.remove_suffix(1);
      if (line.empty())
        continue;
      if (bos_)
        ids.push_back(*bos_);
      encoder.encode(line, ids);
      if (eos_)
        ids.push_back(*eos_);
      ++job.documents;
    }
  }

  /// Writes the finished jobs at the front; with `wait`, waits for the first one.
  void writeDone(bool wait) {
    while (!inFlight_.empty()) {
      Job &job = *inFlight_.front();
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (wait)
          done_.wait(lock, [&] { return job.done; });
        else if (!job.done)
          return;
      }
      wait = false;
      if (!job.error.empty())
        throw rt::Error(job.error);
      write(job.ids);
      if (chat_) {
        for (uint64_t length : job.lengths)
          ends_.push_back((ends_.empty() ? 0 : ends_.back()) + length);
        for (uint8_t bit : job.mask) {
          if (maskCount_ % 8 == 0)
            maskBits_ += '\0';
          if (bit)
            maskBits_.back() = char(maskBits_.back() | (1 << (maskCount_ % 8)));
          ++maskCount_;
        }
      }
      documents_ += job.documents;
      inFlight_.pop_front();
    }
  }

  void write(const std::vector<uint32_t> &ids) {
    buffer_.resize(ids.size() * tokenBytes_);
    uint32_t vocab = t_.vocabSize();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] >= vocab)
        throw rt::Error("the tokenizer produced id " + std::to_string(ids[i]) +
                        ", outside its vocabulary of " + std::to_string(t_.vocabSize()));
      putLE(buffer_.data() + i * tokenBytes_, ids[i], int(tokenBytes_));
    }
    out_.writeAll(buffer_.data(), buffer_.size());
    tokens_ += ids.size();
  }

  const tok::Tokenizer &t_;
  const Options &o_;
  Output &out_;
  uint32_t tokenBytes_;
  std::optional<uint32_t> bos_, eos_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<Job *> queue_;
  bool stopping_ = false;
  std::deque<std::unique_ptr<Job>> inFlight_;
  std::vector<unsigned char> buffer_;
  uint64_t tokens_ = 0, documents_ = 0, invalidUtf8_ = 0;
  const tok::ChatTemplate *chat_;
  std::vector<uint64_t> ends_;
  std::string maskBits_;
  uint64_t maskCount_ = 0;
};

int runTokenizer(const Options &o) {
  std::unique_ptr<tok::Tokenizer> t = tok::loadTokenizer(o.tokenizer);
  std::printf("tokenizer: %s\n", t->describe().c_str());
  if (o.bos && !t->bos())
    throw rt::Error("--bos: the tokenizer '" + t->path() +
                    "' has no BOS token (none in tokenizer_config.json or the tokenizer file)");
  if (o.eos && !t->eos())
    throw rt::Error("--eos: the tokenizer '" + t->path() +
                    "' has no EOS token (none in tokenizer_config.json or the tokenizer file)");
  uint32_t vocab = t->vocabSize();
  uint32_t tokenBytes = o.tokenBytes ? o.tokenBytes : (vocab <= 65536 ? 2 : 4);
  if (tokenBytes == 2 && vocab > 65536)
    throw rt::Error("--token-bytes 2 holds ids below 65536, but the vocabulary of '" + t->path() +
                    "' has " + std::to_string(vocab));
  std::optional<tok::ChatTemplate> chat;
  rt::TokenFileHeader header;
  header.bytesPerToken = tokenBytes;
  if (o.jsonl) {
    chat = tok::resolveChatTemplate(*t, o.tokenizer, o.chatFormat);
    std::printf("chat format: %s (from %s)%s\n", tok::chatFormatName(chat->format),
                chat->source.c_str(),
                chat->defaultSystem.empty()
                    ? ""
                    : (", default system prompt " + rt::jsonQuote(chat->defaultSystem)).c_str());
    header.version = rt::kTokenFileVersion2;
    header.vocabSize = vocab;
    header.padId = t->eos() ? t->eos()->id : 0;
    header.fingerprint = t->fingerprint();
  }

  std::vector<std::unique_ptr<Input>> inputs;
  uint64_t total = 0;
  for (const std::string &path : o.inputs) {
    inputs.push_back(std::make_unique<Input>(path));
    total += inputs.back()->size;
  }
  Output out(o.output);
  std::string headerBytes = rt::encodeTokenFileHeader(header);
  out.writeAll(headerBytes.data(), headerBytes.size());
  Progress progress(total);
  Encoding encoding(*t, o, out, tokenBytes, chat ? &*chat : nullptr);
  uint64_t bytes = 0, fileDocuments = 0;
  std::string buffer;
  for (auto &in : inputs) {
    // The unread part of the input is buffer[start, size); it moves to the front once a read.
    buffer.clear();
    size_t start = 0;
    bool firstPart = true, eof = false;
    size_t searched = 0; // bytes after `start` that findCut has already looked through
    uint64_t line = 1;   // --jsonl: the number of the next unit's first line
    auto part = [&](size_t length, size_t resume, bool last) {
      auto job = std::make_unique<Job>();
      job->text.assign(buffer, start, length);
      job->lines = o.lines;
      job->input = in->name;
      job->firstLine = line;
      line += uint64_t(std::count(job->text.begin(), job->text.end(), '\n'));
      job->first = firstPart;
      job->last = last;
      firstPart = false;
      start += resume;
      searched = 0;
      encoding.submit(std::move(job));
    };
    while (!eof) {
      buffer.erase(0, start);
      start = 0;
      size_t n = in->read(buffer, kReadBytes);
      eof = n == 0;
      bytes += n;
      if (o.lines || o.jsonl) {
        // Units of whole lines, about kUnitBytes each.
        while (buffer.size() - start > kUnitBytes) {
          size_t end = buffer.find('\n', start + kUnitBytes);
          if (end == std::string::npos)
            end = buffer.rfind('\n');
          if (end == std::string::npos || end < start)
            break; // one line longer than what is buffered: read on
          part(end + 1 - start, end + 1 - start, false);
        }
      } else {
        while (buffer.size() - start > kUnitBytes) {
          std::string_view rest = std::string_view(buffer).substr(start);
          std::optional<tok::Cut> cut =
              t->findCut(rest, std::max(kUnitBytes, searched > 4 ? searched - 4 : 0));
          if (!cut) {
            searched = rest.size();
            break;
          }
          part(cut->end, cut->resume, false);
        }
      }
      progress.update(bytes, encoding.tokens());
    }
    if (o.lines || o.jsonl) {
      if (buffer.size() > start)
        part(buffer.size() - start, buffer.size() - start, true);
    } else if (!firstPart || buffer.size() > start) {
      part(buffer.size() - start, buffer.size() - start, true);
      ++fileDocuments;
    }
  }
  encoding.finish();
  uint64_t documents = o.lines || o.jsonl ? encoding.documents() : fileDocuments;
  std::string names = joinNames(o.inputs);
  if (o.jsonl) {
    // Version 2's tail: the conversations' ends, then the loss mask; the header's document
    // count is patched in with the token count.
    if (documents == 0)
      throw rt::Error("input '" + names + "' holds no conversations: a token file needs one");
    std::vector<unsigned char> ends(documents * 8);
    for (uint64_t d = 0; d < documents; ++d)
      putLE(ends.data() + d * 8, encoding.documentEnds()[d], 8);
    out.writeAll(ends.data(), ends.size());
    out.writeAll(encoding.maskBits().data(), encoding.maskBits().size());
    unsigned char count[8];
    putLE(count, documents, 8);
    if (::pwrite(out.fd, count, 8, 40) != 8)
      throw rt::Error("cannot write '" + out.name() + "': " + reason());
  }
  finishTokenFile(out, encoding.tokens(), names);
  double seconds = progress.seconds();
  if (encoding.invalidUtf8())
    std::fprintf(stderr,
                 "bonsai-tokenize: warning: %" PRIu64
                 " invalid UTF-8 sequences in the input were read as U+FFFD\n",
                 encoding.invalidUtf8());
  std::printf("tokenize: %s: %" PRIu64 " bytes, %" PRIu64 " %s -> %" PRIu64
              " tokens (vocabulary %u, %u bytes per token) -> %s\n",
              names.c_str(), bytes, documents, o.jsonl ? "conversations" : "documents",
              encoding.tokens(), vocab, tokenBytes, o.output.c_str());
  if (o.jsonl) {
    uint64_t trained = 0;
    for (char c : encoding.maskBits())
      trained += uint64_t(__builtin_popcount(static_cast<unsigned char>(c)));
    std::printf("tokenize: %" PRIu64 " of %" PRIu64 " tokens count in the loss (version-2 "
                "file, tokenizer fingerprint %016" PRIx64 ")\n",
                trained, encoding.tokens(), header.fingerprint);
  }
  std::printf("tokenize: %.3f s, %.2f MB/s, %u threads\n", seconds,
              double(bytes) / 1e6 / std::max(seconds, 1e-9), o.threads);
  return 0;
}

int runDecode(const Options &o) {
  std::unique_ptr<tok::Tokenizer> t;
  if (!o.tokenizer.empty()) {
    t = tok::loadTokenizer(o.tokenizer);
    std::fprintf(o.output == "-" ? stderr : stdout, "tokenizer: %s\n", t->describe().c_str());
  }
  uint32_t vocab = t ? t->vocabSize() : 256;
  rt::TokenFile file(o.inputs[0]);
  Output out(o.output);
  std::vector<uint32_t> chunk, pending;
  std::string text;
  uint64_t bytes = 0;
  const size_t kChunk = size_t(1) << 20;
  for (uint64_t first = 0; first < file.count(); first += kChunk) {
    size_t n = size_t(std::min<uint64_t>(kChunk, file.count() - first));
    file.read(first, n, chunk);
    for (size_t i = 0; i < n; ++i)
      if (chunk[i] >= vocab)
        throw rt::Error("token file '" + file.path() + "': token " + std::to_string(first + i) +
                        " is " + std::to_string(chunk[i]) + ", not below the vocabulary size " +
                        std::to_string(vocab) +
                        (t ? " of '" + t->path() + "'" : std::string(" (byte-level)")));
    pending.insert(pending.end(), chunk.begin(), chunk.end());
    // Decode what can be decoded apart from what follows; keep the rest.
    size_t k = t ? t->decodeSplit(pending.data(), pending.size()) : pending.size();
    text.clear();
    if (t)
      t->decode(pending.data(), k, text);
    else
      for (size_t i = 0; i < k; ++i)
        text += char(pending[i]);
    out.writeAll(text.data(), text.size());
    bytes += text.size();
    pending.erase(pending.begin(), pending.begin() + long(k));
  }
  text.clear();
  if (t)
    t->decode(pending.data(), pending.size(), text);
  else
    for (uint32_t id : pending)
      text += char(id);
  out.writeAll(text.data(), text.size());
  bytes += text.size();
  out.commit();
  std::fprintf(o.output == "-" ? stderr : stdout,
               "decode: %s: %" PRIu64 " tokens -> %" PRIu64 " bytes (%s) -> %s\n",
               o.inputs[0].c_str(), file.count(), bytes,
               t ? ("vocabulary " + std::to_string(vocab)).c_str() : "byte-level",
               o.output.c_str());
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  rt::installCrashReport("bonsai-tokenize");
  try {
    Options options = parseOptions(argc, argv);
    if (options.help) {
      std::fputs(kSynopsis, stdout);
      std::fputs(kHelp, stdout);
      return 0;
    }
    if (options.decode)
      return runDecode(options);
    if (options.tokenizer.empty())
      return runByteLevel(options);
    return runTokenizer(options);
  } catch (const UsageError &e) {
    std::fprintf(stderr, "bonsai-tokenize: error: %s\n%s", e.message.c_str(), kSynopsis);
  } catch (const rt::Error &e) {
    std::fprintf(stderr, "bonsai-tokenize: error: %s\n", e.what());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "bonsai-tokenize: error: %s\n", e.what());
  }
  return 1;
}
