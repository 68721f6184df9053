#!/usr/bin/env bash
# bench/tokenizer_h200.sh - the tokenizer check on the GPU machine, from the repository root:
# unpacks what bench/prepare_tokenizer_run.sh packed and runs bench/tokenizer_h200.py with it
# (ids of bonsai-tokenize against tokenizers and sentencepiece, and throughput). Arguments are
# passed on to the script; logs and files go under $OUT.
set -uo pipefail
build="${BONSAI_TOKENIZER_BUILD_DIR:-build-tok}"
out="${OUT:-/tmp/bonsai-out}"
mkdir -p "$out"
[ -d "$build/device" ] || tar -C "$build" -xJf "$build/device.tar.xz"
export LD_LIBRARY_PATH="$PWD/$build/device/lib:${LD_LIBRARY_PATH:-}"
nproc
lscpu | grep -m1 'Model name' || true
PYTHONUNBUFFERED=1 python3 bench/tokenizer_h200.py --bonsai-tokenize "$PWD/$build/device/bin/bonsai-tokenize" \
  --workdir /tmp/tokbench "$@" 2>&1 | tee "$out/tokenizer_h200.log"
