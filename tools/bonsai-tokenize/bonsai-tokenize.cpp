//===- bonsai-tokenize.cpp - Byte-level tokenizer writing Bonsai token files ===//
//
// Turns a text (or any) file into the token file bonsai-run --data reads (docs/data-format.md):
// byte-level, so token id = byte value (0..255) and the vocabulary is 256. The input is streamed
// in 1 MiB pieces, so corpora larger than memory work; the output is written under a temporary
// name, fsynced and renamed, so an interrupted run never leaves a partial token file under the
// requested name. Every failure is one line, "bonsai-tokenize: error: <cause>", exit status 1.
//
// Output (stdout):
//   tokenize: <input>: <n> bytes -> <n> tokens (byte-level, vocabulary 256, <w> bytes per token) ->
//   <output>
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Tensor.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace rt = bonsai::rt;

namespace {

const char *const kSynopsis = "usage: bonsai-tokenize INPUT -o TOKENS.bin [--token-bytes 2|4]\n";

const char *const kHelp =
    "\n"
    "Writes the bytes of INPUT as a Bonsai token file (token id = byte value, vocabulary 256)\n"
    "for bonsai-run --data. See docs/data-format.md.\n"
    "\n"
    "  -o, --output FILE   the token file to write\n"
    "  --token-bytes N     2 (uint16 ids, default) or 4 (uint32 ids)\n"
    "  --help              this text\n";

struct UsageError {
  std::string message;
};

struct Options {
  std::string input;
  std::string output;
  uint32_t tokenBytes = 2;
  bool help = false;
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
      if (flag == "-o" || flag == "--output") {
        o.output = takeValue();
      } else if (flag == "--token-bytes") {
        std::string v = takeValue();
        if (v != "2" && v != "4")
          throw UsageError{"--token-bytes must be 2 or 4, got '" + v + "'"};
        o.tokenBytes = uint32_t(v[0] - '0');
      } else {
        throw UsageError{"unknown option '" + arg + "'"};
      }
      continue;
    }
    if (!o.input.empty())
      throw UsageError{"more than one input given ('" + o.input + "' and '" + arg + "')"};
    o.input = arg;
  }
  if (o.help)
    return o;
  if (o.input.empty())
    throw UsageError{"no input file given"};
  if (o.output.empty())
    throw UsageError{"no output file given (-o TOKENS.bin)"};
  return o;
}

std::string reason() { return std::strerror(errno); }

/// A file descriptor closed on scope exit; the temporary output is removed unless kept.
struct Output {
  std::string temp;
  int fd = -1;
  bool keep = false;
  ~Output() {
    if (fd >= 0)
      ::close(fd);
    if (!keep && !temp.empty())
      ::unlink(temp.c_str());
  }
  void writeAll(const void *data, size_t size) {
    const char *p = static_cast<const char *>(data);
    while (size > 0) {
      ssize_t n = ::write(fd, p, size);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        throw rt::Error("cannot write '" + temp + "': " + reason());
      p += n;
      size -= size_t(n);
    }
  }
};

void putLE(unsigned char *p, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i)
    p[i] = static_cast<unsigned char>(value >> (8 * i));
}

int run(const Options &o) {
  int in = ::open(o.input.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0)
    throw rt::Error("cannot open input '" + o.input + "': " + reason());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closeInput{in};

  Output out;
  out.temp = o.output + ".tmp." + std::to_string(::getpid());
  out.fd = ::open(out.temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out.fd < 0)
    throw rt::Error("cannot create '" + out.temp + "': " + reason());

  // The header's count is patched in once the input has been read.
  unsigned char header[rt::kTokenFileHeaderBytes] = {};
  std::memcpy(header, rt::kTokenFileMagic, sizeof rt::kTokenFileMagic);
  putLE(header + 8, rt::kTokenFileVersion, 4);
  putLE(header + 12, o.tokenBytes, 4);
  out.writeAll(header, sizeof header);

  std::vector<unsigned char> buffer(size_t(1) << 20);
  std::vector<unsigned char> tokens(buffer.size() * o.tokenBytes);
  uint64_t count = 0;
  for (;;) {
    ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      throw rt::Error("cannot read input '" + o.input + "': " + reason());
    if (n == 0)
      break;
    for (ssize_t i = 0; i < n; ++i)
      putLE(tokens.data() + size_t(i) * o.tokenBytes, buffer[size_t(i)], int(o.tokenBytes));
    out.writeAll(tokens.data(), size_t(n) * o.tokenBytes);
    count += uint64_t(n);
  }
  if (count == 0)
    throw rt::Error("input '" + o.input + "' is empty: a token file needs at least one token");
  putLE(header + 16, count, 8);
  if (::pwrite(out.fd, header + 16, 8, 16) != 8)
    throw rt::Error("cannot write '" + out.temp + "': " + reason());
  if (::fsync(out.fd) != 0)
    throw rt::Error("cannot flush '" + out.temp + "': " + reason());
  int fd = out.fd;
  out.fd = -1;
  if (::close(fd) != 0)
    throw rt::Error("cannot close '" + out.temp + "': " + reason());
  if (std::rename(out.temp.c_str(), o.output.c_str()) != 0)
    throw rt::Error("cannot rename '" + out.temp + "' to '" + o.output + "': " + reason());
  out.keep = true;
  std::printf("tokenize: %s: %" PRIu64 " bytes -> %" PRIu64
              " tokens (byte-level, vocabulary 256, %u bytes per token) -> %s\n",
              o.input.c_str(), count, count, o.tokenBytes, o.output.c_str());
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    Options options = parseOptions(argc, argv);
    if (options.help) {
      std::fputs(kSynopsis, stdout);
      std::fputs(kHelp, stdout);
      return 0;
    }
    return run(options);
  } catch (const UsageError &e) {
    std::fprintf(stderr, "bonsai-tokenize: error: %s\n%s", e.message.c_str(), kSynopsis);
  } catch (const rt::Error &e) {
    std::fprintf(stderr, "bonsai-tokenize: error: %s\n", e.what());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "bonsai-tokenize: error: %s\n", e.what());
  }
  return 1;
}
