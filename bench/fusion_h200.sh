#!/usr/bin/env bash
# bench/fusion_h200.sh - issue #8's GPU verification and benchmarks, in one command on a GPU
# machine, from the folder bench/prepare_fusion_run.sh made (default .gpu-fusion/): every CUDA
# kernel test, Hugging Face parity of the fused training step, the training steps of Llama 124M
# and GPT-2 124M (fused, unfused, PyTorch eager and torch.compile in the same run), causal
# attention against SDPA's FlashAttention-2 and cuDNN, and the FP8 GEMM against bf16 and
# torch._scaled_mm. Logs go under $OUT.
set -uo pipefail
dir="${1:-.gpu-fusion}"
out="${OUT:-/tmp/bonsai-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dir/lib:${LD_LIBRARY_PATH:-}"
run="$PWD/$dir/bin/bonsai-run"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

echo "== CUDA kernels against the CPU =="
"$dir/bin/bonsai-runtime-tests" --gtest_filter='*Cuda*' > "$out/cuda_tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$out/cuda_tests.log"
grep -B3 -A8 "Failure" "$out/cuda_tests.log" | head -40

echo "== Hugging Face parity (fused plans) =="
python3 test/gpu/hf_parity.py --bonsai-run "$run" --cases "$dir/cases" > "$out/hf_parity.log" 2>&1
tail -6 "$out/hf_parity.log"

for model in llama_124m gpt2_124m; do
  echo "== training step $model =="
  grep -E "peak device" "$dir/plans/${model}_fused.txt" "$dir/plans/${model}_unfused.txt"
  python3 bench/train_bench.py --model $model --plan "$dir/plans/${model}_fused.plan" \
    --unfused-plan "$dir/plans/${model}_unfused.plan" --bonsai-run "$run" --steps 30 --warmup 5 \
    --workdir "$out" > "$out/bench_$model.log" 2>&1
  tail -7 "$out/bench_$model.log"
done

echo "== causal attention =="
python3 bench/attention_bench.py --bin "$dir/bin/attention_bench" --reps 20 > "$out/attention.log" 2>&1
tail -12 "$out/attention.log"
