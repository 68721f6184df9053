#!/usr/bin/env bash
# bench/prepare_tokenizer_run.sh - prepare, on the build machine, the tokenizer check of
# bench/tokenizer_h200.py: a CPU-only runtime build (build-tok/, ignored by git) of
# bonsai-tokenize, packed with the shared libraries it needs that a GPU image may lack (ICU 72,
# PCRE2, sentencepiece 0.1.97) into build-tok/device.tar.xz, which a device call carries; then
# `bash bench/tokenizer_h200.sh` on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BONSAI_TOKENIZER_BUILD_DIR:-build-tok}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S runtime -B "$build" -DBONSAI_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release
fi
ninja -C "$build" -j "${BONSAI_JOBS:-2}" bonsai-tokenize
dir="$build/device"
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
strip -o "$dir/bin/bonsai-tokenize" "$build/bin/bonsai-tokenize"
. bench/gpu_libs.sh
copy_gpu_libs "$dir/lib"
tar -C "$build" -cJf "$build/device.tar.xz" device
du -sh "$dir" "$build/device.tar.xz"
