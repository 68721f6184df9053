//===- CrashReport.h - What a process prints when it crashes -------------===//
//
// A tool that dies of SIGSEGV prints "Segmentation fault" through the shell, or nothing when
// a launcher (mpirun, compute-sanitizer, a test driver) started it. The crash report says which
// tool died of which signal, and where: the stack, one frame a line, as glibc's backtrace
// gives it (module(+offset)[address]; `addr2line -f -C -e MODULE OFFSET` names the function
// and line of an unstripped build). The process then ends as the signal ends it by default,
// with the same exit status and core dump, so callers that check for the signal still see it.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_CRASHREPORT_H
#define BONSAI_RUNTIME_CRASHREPORT_H

#include <vector>

namespace bonsai::rt {

/// Installs the crash report for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, each where the
/// signal still has its default action (a handler a launcher or sanitizer installed first is
/// left alone), on an alternate stack so that a stack overflow is reported too. `tool` names
/// the process in the report (at most 63 characters are kept). Returns the signals it installed
/// the report for. Call once, early in main, before any thread starts.
std::vector<int> installCrashReport(const char *tool);

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_CRASHREPORT_H
