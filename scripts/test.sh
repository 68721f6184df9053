#!/usr/bin/env bash
# scripts/test.sh - install dependencies, build, and run every test (the README's test command).
#
# Ends with ctest's summary line. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
# The runtime again, alone, under AddressSanitizer and UBSan: plan loading, weights and data are
# fed corrupted files by the tests, and must fail with an error, never with a memory error.
scripts/test-asan.sh
# The libFuzzer targets (docs/fuzzing.md), a bounded run: their regression inputs, then 15 s of
# fuzzing each. A crash, hang or sanitizer report fails CI.
scripts/test-fuzz.sh
build="${BONSAI_BUILD_DIR:-build}"
cd "$build"
ctest --output-on-failure -j "$(nproc)"
