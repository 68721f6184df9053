//===- CrashReport.cpp - What a process prints when it crashes -----------===//
//
// The handler runs after memory may have been corrupted: it calls only what POSIX lists as
// async-signal-safe (write, getpid, raise), plus glibc's backtrace and backtrace_symbols_fd,
// which are safe once backtrace has run once (its first call loads libgcc_s, which allocates:
// installCrashReport makes that call).
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CrashReport.h"

#include <csignal>
#include <cstring>
#include <execinfo.h>
#include <unistd.h>

namespace bonsai::rt {
namespace {

/// The tool's name for the report, copied at install time.
char gTool[64] = "bonsai";

/// The alternate stack the handler runs on: a stack overflow leaves no room on the faulting
/// one. 64 KiB holds the handler and backtrace's unwinding.
alignas(16) char gAltStack[64 * 1024];

struct CrashSignal {
  int number;
  const char *name;
  const char *meaning;
};
constexpr CrashSignal kCrashSignals[] = {
    {SIGSEGV, "SIGSEGV", "an invalid memory access"},
    {SIGBUS, "SIGBUS",
     "a bus error: memory that cannot be accessed, as in a truncated mapped file"},
    {SIGFPE, "SIGFPE", "an arithmetic exception"},
    {SIGILL, "SIGILL", "an illegal instruction: a build for another CPU?"},
    {SIGABRT, "SIGABRT", "an abort: a failed check or an uncaught exception"},
};

void writeText(const char *text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    ssize_t written = ::write(STDERR_FILENO, text, left);
    if (written <= 0)
      return;
    text += written;
    left -= size_t(written);
  }
}

/// Writes `value` in decimal: printf and its kin are not async-signal-safe.
void writeNumber(long value) {
  char digits[24];
  int at = sizeof digits;
  digits[--at] = '\0';
  bool negative = value < 0;
  unsigned long magnitude = negative ? 0ul - (unsigned long)value : (unsigned long)value;
  do {
    digits[--at] = char('0' + magnitude % 10);
    magnitude /= 10;
  } while (magnitude != 0 && at > 1);
  if (negative)
    digits[--at] = '-';
  writeText(digits + at);
}

extern "C" void onCrashSignal(int number) {
  const CrashSignal *signal = nullptr;
  for (const CrashSignal &s : kCrashSignals)
    if (s.number == number)
      signal = &s;
  writeText("\n");
  writeText(gTool);
  writeText(": fatal signal ");
  writeNumber(number);
  if (signal) {
    writeText(" (");
    writeText(signal->name);
    writeText(", ");
    writeText(signal->meaning);
    writeText(")");
  }
  writeText(" in process ");
  writeNumber(long(::getpid()));
  writeText("; the stack, innermost first (addr2line -f -C -e MODULE OFFSET names a frame):\n");
  void *frames[64];
  int count = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, count, STDERR_FILENO);
  // SA_RESETHAND has put the default action back: end as the signal ends a process by default.
  std::raise(number);
}

} // namespace

std::vector<int> installCrashReport(const char *tool) {
  std::strncpy(gTool, tool, sizeof gTool - 1);
  gTool[sizeof gTool - 1] = '\0';
  // backtrace's first call loads the unwinder (an allocation): make it here, not in a handler.
  void *frame[1];
  ::backtrace(frame, 1);

  // An alternate stack someone installed first (AddressSanitizer's) is kept.
  stack_t current = {};
  bool onAltStack = ::sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE);
  if (!onAltStack) {
    stack_t stack = {};
    stack.ss_sp = gAltStack;
    stack.ss_size = sizeof gAltStack;
    onAltStack = ::sigaltstack(&stack, nullptr) == 0;
  }

  std::vector<int> installed;
  for (const CrashSignal &s : kCrashSignals) {
    struct sigaction previous = {};
    if (::sigaction(s.number, nullptr, &previous) != 0 || previous.sa_handler != SIG_DFL ||
        (previous.sa_flags & SA_SIGINFO))
      continue;
    struct sigaction action = {};
    action.sa_handler = onCrashSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND | (onAltStack ? SA_ONSTACK : 0);
    if (::sigaction(s.number, &action, nullptr) == 0)
      installed.push_back(s.number);
  }
  return installed;
}

} // namespace bonsai::rt
