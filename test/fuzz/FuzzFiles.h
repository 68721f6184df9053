//===- FuzzFiles.h - Scratch files for fuzzers whose loader reads a path ---===//
//
// The token-file and safetensors loaders read files by path (positioned reads, never the whole
// file in memory), so their fuzzers write each input to a file first. Each fuzzer process gets
// its own scratch directory, in /dev/shm where there is one (no disk traffic at thousands of
// inputs a second), removed when the process exits.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_TEST_FUZZ_FUZZFILES_H
#define BONSAI_TEST_FUZZ_FUZZFILES_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

namespace bonsai::fuzz {

namespace detail {
inline int removeEntry(const char *path, const struct stat *, int, struct FTW *) {
  return ::remove(path);
}

inline std::string &scratchPath() {
  static std::string path;
  return path;
}

inline void removeScratch() {
  ::nftw(scratchPath().c_str(), removeEntry, 16, FTW_DEPTH | FTW_PHYS);
}
} // namespace detail

/// This process's scratch directory, created on first use and removed at exit. Aborts when it
/// cannot be created: a fuzzer that cannot write its input would report nothing.
inline const std::string &scratchDir() {
  std::string &path = detail::scratchPath();
  if (path.empty()) {
    struct stat st;
    const char *tmp = std::getenv("TMPDIR");
    std::string base = ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm"
                       : tmp && *tmp                                       ? tmp
                                                                           : "/tmp";
    std::string templ = base + "/bonsai-fuzz-XXXXXX";
    if (!::mkdtemp(templ.data())) {
      std::perror(("bonsai fuzzer: cannot create a scratch directory under " + base).c_str());
      std::abort();
    }
    path = templ;
    std::atexit(detail::removeScratch);
  }
  return path;
}

/// Writes `size` bytes at `data` to `name` in the scratch directory (replacing it) and returns
/// its path. Aborts on a write error, for the reason above.
inline std::string writeScratchFile(const std::string &name, const uint8_t *data, size_t size) {
  std::string path = scratchDir() + "/" + name;
  std::FILE *file = std::fopen(path.c_str(), "wb");
  if (!file || (size > 0 && std::fwrite(data, 1, size, file) != size) || std::fclose(file) != 0) {
    std::perror(("bonsai fuzzer: cannot write " + path).c_str());
    std::abort();
  }
  return path;
}

} // namespace bonsai::fuzz

#endif // BONSAI_TEST_FUZZ_FUZZFILES_H
