#!/usr/bin/env bash
# scripts/build.sh - configure and build Bonsai in Release into build/ (or $BONSAI_BUILD_DIR).
#
# Uses Ninja and every core; a configured build directory is reused, so a second run only
# rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BONSAI_BUILD_DIR:-build}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" -j "$(nproc)"
