#!/usr/bin/env bash
# bench/run_h200.sh - the GPU verification and benchmarks, in one command on a GPU machine.
#
# Expects a folder (default .gpu-run/) prepared on the build machine by bench/prepare_gpu_run.sh:
# bin/bonsai-run (CUDA build), lib/ (OpenBLAS if the GPU machine lacks it), cases/ (tiny models'
# weights, tokens and training plans) and plans/ (benchmark plans). Writes logs under $OUT.
set -uo pipefail
dir="${1:-.gpu-run}"
out="${OUT:-/tmp/bonsai-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dir/lib:${LD_LIBRARY_PATH:-}"
run="$PWD/$dir/bin/bonsai-run"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

echo "== tiny Llama, CPU backend vs CUDA backend, 20 steps =="
for backend in cpu cuda; do
  "$run" "$dir/cases/tiny_llama_train.plan" --backend=$backend --weights "$dir/cases/tiny_llama.safetensors" \
    --data "$dir/cases/tiny_llama.tokens" --steps 20 > "$out/tiny_$backend.log" 2>&1
  echo "$backend exit $?"; grep -E "^backend|^step (1|10|20) |device memory" "$out/tiny_$backend.log"
done
paste <(grep '^step' "$out/tiny_cpu.log" | awk '{print $4}') <(grep '^step' "$out/tiny_cuda.log" | awk '{print $4}') |
  awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d} END {printf "max relative loss difference cpu vs cuda over 20 steps: %.2e\n", m}'

echo "== Hugging Face parity =="
python3 test/gpu/hf_parity.py --bonsai-run "$run" --cases "$dir/cases" 2>&1 | tee "$out/hf_parity.log" | tail -40

for model in llama_124m gpt2_124m; do
  echo "== benchmark $model =="
  python3 bench/train_bench.py --model $model --plan "$dir/plans/${model}_train.plan" \
    --bonsai-run "$run" --steps 20 --warmup 5 --workdir "$out" 2>&1 | tee "$out/bench_$model.log" | tail -8
done
