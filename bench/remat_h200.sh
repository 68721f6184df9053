#!/usr/bin/env bash
# bench/remat_h200.sh DIR - on the GPU machine, the plans of bench/prepare_remat_run.sh: planned
# next to measured peak and tokens/s for what `bonsai.remat "auto"` chose, with the peers of
# bench/remat_bench.py (PyTorch with and without full checkpointing) and bench/lora_bench.py
# (PEFT LoRA) in the same run. Logs under $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:?usage: bench/remat_h200.sh DIR}"
[ -d "$dir" ] || tar -xJf "$dir.tar.xz"
out="${OUT:-/tmp/remat_h200}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
run="$PWD/$dir/bin/bonsai-run"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
echo "== Llama 124M, AdamW, B16 S1024: auto under 7 and 6 GiB =="
python3 bench/remat_bench.py --model llama_124m --plans "$dir/remat" --bonsai-run "$run" \
  --policies none,auto-7GiB,auto-6GiB --batch 16 --seq 1024 --steps 20 --warmup 5 \
  --workdir "$out" 2>&1 | tee "$out/remat_llama_124m.log" | tail -12
echo "== TinyLlama-1.1B QLoRA r16, B4 S2048: auto under 10 GiB =="
python3 bench/lora_bench.py --model tinyllama_1_1b --plans "$dir/adapters" --bonsai-run "$run" \
  --variants qlora,qlora-auto10GiB --peft lora --batch 4 --seq 2048 --steps 8 --warmup 2 \
  --workdir "$out" 2>&1 | tee "$out/lora_bench.log" | tail -12
