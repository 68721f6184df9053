//===- CrashReportTest.cpp - The report a crashing tool prints -----------===//
//
// Each fatal signal, raised in a child process (a gtest death test), prints the tool's name,
// the signal and the stack, and still ends the child by that signal.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CrashReport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/resource.h>

namespace bonsai::rt {
namespace {

/// Installs the report, turns core dumps off (the test raises five fatal signals) and raises
/// `number`; exits 3 if the report was not installed for it.
void crashWith(int number) {
  std::vector<int> installed = installCrashReport("crash-report-test");
  struct rlimit none = {0, 0};
  ::setrlimit(RLIMIT_CORE, &none);
  if (std::find(installed.begin(), installed.end(), number) == installed.end())
    std::exit(3);
  std::raise(number);
}

TEST(CrashReportDeathTest, NamesTheSignalAndPrintsTheStack) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const struct {
    int number;
    const char *name;
  } signals[] = {{SIGSEGV, "SIGSEGV"},
                 {SIGBUS, "SIGBUS"},
                 {SIGFPE, "SIGFPE"},
                 {SIGILL, "SIGILL"},
                 {SIGABRT, "SIGABRT"}};
  int checked = 0;
  for (const auto &s : signals) {
    struct sigaction current = {};
    ASSERT_EQ(::sigaction(s.number, nullptr, &current), 0);
    if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO)) {
      // AddressSanitizer handles SIGSEGV, SIGBUS and SIGFPE itself (and reports them): the
      // crash report leaves a handler it finds alone.
      std::printf("%s: left to the handler already installed (a sanitizer's)\n", s.name);
      continue;
    }
    SCOPED_TRACE(s.name);
    // The header line, then at least one frame ("module(+offset)[address]").
    std::string report = std::string("crash-report-test: fatal signal ") +
                         std::to_string(s.number) + " \\(" + s.name +
                         ", [^)]+\\) in process [0-9]+; the stack, innermost first[^\n]*\n" +
                         "[^\n]*\\[0x[0-9a-f]+\\]";
    EXPECT_EXIT(crashWith(s.number), ::testing::KilledBySignal(s.number), report);
    ++checked;
  }
  // SIGILL and SIGABRT are left to the report under every build this suite runs in.
  EXPECT_GE(checked, 2);
}

} // namespace
} // namespace bonsai::rt
