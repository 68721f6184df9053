#!/usr/bin/env bash
# bench/finetune_h200.sh - issue #30's GPU checks, in one command on a GPU machine, from the
# repository root: the imported Qwen3 and rope-scaled Llama against transformers
# (test/gpu/hf_families.py). Expects the folder bench/prepare_finetune_run.sh made (or its
# .tar.xz beside it). Writes logs under $OUT.
set -uo pipefail
dir="${1:-.gpu-finetune}"
out="${OUT:-/tmp/bonsai-out}"
mkdir -p "$out"
[ -d "$dir" ] || tar -xJf "$dir.tar.xz"
export LD_LIBRARY_PATH="$PWD/$dir/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee "$out/versions.txt"
echo "== imported families against transformers =="
python3 test/gpu/hf_families.py --bonsai-run "$PWD/$dir/bin/bonsai-run" --cases "$dir/cases" \
  > "$out/hf_families.log" 2>&1
echo "hf_families exit $?"
grep -E "loss bonsai|worst|checked" "$out/hf_families.log"
