#!/usr/bin/env bash
# scripts/test-asan.sh - build the runtime alone with AddressSanitizer + UBSan and run its tests.
#
# Configures runtime/ as a standalone project (which also proves it needs no MLIR or LLVM) in
# build-asan/, builds it, and runs its ctest. Any sanitizer report fails the test that hit it
# (UBSan is built with -fno-sanitize-recover), so the script exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BONSAI_ASAN_BUILD_DIR:-build-asan}"
jobs="${BONSAI_JOBS:-$(nproc)}"
# The CUDA backend is left out: its host code is tested by the main build, and nvcc does not
# take the sanitizer flags.
# -O1 with line tables only, as the sanitizers' documentation advises: at RelWithDebInfo's -O2 -g
# the test files took 2.2x as long to compile (TrainingTest.cpp 142 s against 64 s), the
# largest part of CI's time; the reports still name file and line. The test files themselves
# build at -O0 (runtime/CMakeLists.txt): PlanTest.cpp 22 s against 44 s at -O1, and the tests
# spend their time in the runtime's code, which keeps -O1.
cmake -G Ninja -S runtime -B "$build" -DBONSAI_SANITIZE=ON -DBONSAI_ENABLE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
ninja -C "$build" -j "$jobs"
# Leak checking is on by default; abort on the first report so a failure is never missed.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd "$build"
ctest --output-on-failure -j "$jobs"
