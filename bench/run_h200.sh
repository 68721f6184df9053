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

# ---- PEFT LoRA/DoRA parity (docs/lora.md): needs peft besides torch and transformers ----
echo "== PEFT LoRA/DoRA parity =="
python3 test/gpu/peft_lora_parity.py --bonsai-run "$run" --cases "$dir/cases" \
  --lora-plan "$dir/peft/tiny_llama_lora.plan" --dora-plan "$dir/peft/tiny_llama_dora.plan" \
  2>&1 | tee "$out/peft_lora_parity.log" | tail -80
# ---- end of PEFT parity ----

for model in llama_124m gpt2_124m; do
  echo "== benchmark $model =="
  python3 bench/train_bench.py --model $model --plan "$dir/plans/${model}_train.plan" \
    --bonsai-run "$run" --steps 20 --warmup 5 --workdir "$out" 2>&1 | tee "$out/bench_$model.log" | tail -8
done

# ---- GaLore (docs/galore.md): AdamW vs GaLore at TinyLlama-1.1B shape, the step-time
# histogram, and first the GPU unit tests of the GaLore kernels against the CPU ones ----
echo "== GaLore =="
"$dir/bin/bonsai-runtime-tests" --gtest_filter='CudaGaLoreTest.*' 2>&1 | tee "$out/galore_tests.log" | tail -20
python3 bench/galore_bench.py --dir "$dir" --workdir "$out" 2>&1 | tee "$out/galore_bench.log" | tail -40
# ---- end of GaLore ----

echo "== Exported adapters in PEFT =="
python3 test/gpu/peft_export_check.py check --work "$dir/peft" --bonsai-run "$run" 2>&1 |
  tee "$out/peft_export.log" | tail -30

echo "== Adapters: LoRA, QLoRA, DoRA, QDoRA vs PEFT (TinyLlama-1.1B shape) =="
python3 bench/lora_bench.py --model tinyllama_1_1b --plans "$dir/adapters" --bonsai-run "$run" \
  --variants lora,qlora,dora,qdora,qlora-auto10GiB --batch 4 --seq 2048 --steps 8 --warmup 2 \
  --workdir "$out" 2>&1 | tee "$out/lora_bench.log" | tail -14
echo "== Llama-2-7B QLoRA under 24 GiB =="
"$run" "$dir/adapters/llama2_7b.qlora.plan" --backend=cuda --steps 4 --seed 1 2>&1 |
  tee "$out/qlora7b.log" | grep -E "^step|device memory|^time"
[ -x "$dir/bin/nf4_gemm_bench" ] && "$dir/bin/nf4_gemm_bench" | tee "$out/nf4_gemm.log"

echo "== Recomputation policies =="
python3 bench/remat_bench.py --model llama_124m --plans "$dir/remat" --bonsai-run "$run" \
  --policies none,selective,full,auto-24GiB,auto-16GiB,auto-8GiB,auto-6GiB --batch 16 --seq 1024 \
  --steps 20 --warmup 5 --workdir "$out" 2>&1 | tee "$out/remat_llama_124m.log" | tail -16
python3 bench/remat_bench.py --model tinyllama_1_1b --plans "$dir/remat" --bonsai-run "$run" \
  --policies none,selective,full,auto-24GiB,auto-16GiB,uib-none,uib-full,uib-auto-18GiB \
  --batch 4 --seq 2048 --steps 12 --warmup 3 --workdir "$out" 2>&1 |
  tee "$out/remat_tinyllama.log" | tail -16
