#!/usr/bin/env bash
# scripts/test.sh - install dependencies, build, and run every test (the README's test command).
#
# Ends with ctest's summary line. CI (.ci/run) calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build="${BONSAI_BUILD_DIR:-build}"
cd "$build"
ctest --output-on-failure -j "$(nproc)"
