#!/usr/bin/env bash
# bench/fp8_h200.sh - issue 10's GPU verification and benchmarks, in one command on a GPU
# machine, from the folder bench/prepare_fp8_run.sh made (default .gpu-fp8/): the CUDA kernel
# tests (the FP8 kernels against their host model and every other kernel against the CPU), the
# FP8 GEMM against bf16 and torch._scaled_mm, the 500-step bf16-vs-FP8 run of TinyLlama's shape,
# the training steps of TinyLlama-1.1B and of Llama-3-8B layer stacks (8, 16 and 24 layers) in
# bf16 and FP8, the 8-layer FP8 step with its backward GEMMs fused against apart (fp8-backward),
# and where one step of the 8-layer stack spends its time (bonsai-run --profile). The part
# `fast` compares the FP8 recipe with and without `forward_accumulation "fast"`: the 500-step
# check and the 8- and 24-layer steps.
# The parts `shared` and `saved` time the 8-layer FP8 step with and without the fusion family
# fp8-shared-input, fp8-saved-input. A second argument picks parts (default all but fast,
# shared and saved): a comma-separated list of tests, gemm, verify, steps, profile, fast,
# shared, saved (the default run takes about 10 minutes on an H200, `fast` about 6 more,
# `shared` and `saved` about 1.5 each). Logs go under $OUT.
set -uo pipefail
dir="${1:-.gpu-fp8}"
parts=",${2:-tests,gemm,verify,steps,profile},"
want() { [[ "$parts" == *",$1,"* ]]; }
out="${OUT:-/tmp/bonsai-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dir/lib:${LD_LIBRARY_PATH:-}"
run="$PWD/$dir/bin/bonsai-run"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

if want tests; then
echo "== CUDA kernels =="
"$dir/bin/bonsai-runtime-tests" --gtest_filter='*Cuda*' > "$out/cuda_tests.log" 2>&1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$out/cuda_tests.log"
grep -B3 -A8 "Failure" "$out/cuda_tests.log" | head -40
fi

if want gemm; then
echo "== FP8 GEMM =="
python3 bench/fp8_gemm_bench.py --bench "$dir/bin/fp8_gemm_bench" --reps 20 > "$out/gemm.log" 2>&1
tail -12 "$out/gemm.log"
fi

# The 500-step check of TinyLlama's shape: bf16 against the FP8 plan plans/verify_$1.plan.
verify() {
  python3 bench/fp8_train_bench.py --bonsai-run "$run" --name "verify_$1" --verify \
    --data "$dir/licenses.tokens" --steps 500 --warmup 20 --tail 20 \
    --bf16-plan "$dir/plans/verify_bf16.plan" --fp8-plan "$dir/plans/verify_$1.plan" \
    --workdir "$out" > "$out/verify_$1.log" 2>&1
  tail -12 "$out/verify_$1.log"
}

if want verify; then
echo "== verification: TinyLlama-1.1B shape, 500 steps, bf16 and FP8 on the same tokens =="
verify fp8
fi

want steps && for model in tinyllama llama3_8b llama3_8b_l16 llama3_8b_l24; do
  echo "== training step $model =="
  grep -E "peak device" "$dir/plans/${model}_bf16.txt" "$dir/plans/${model}_fp8.txt"
  python3 bench/fp8_train_bench.py --bonsai-run "$run" --name "$model" --steps 25 --warmup 5 \
    --bf16-plan "$dir/plans/${model}_bf16.plan" --fp8-plan "$dir/plans/${model}_fp8.plan" \
    --workdir "$out" > "$out/step_$model.log" 2>&1
  tail -6 "$out/step_$model.log"
done

if want steps; then
  echo "== the 8-layer FP8 step: each linear's backward GEMMs apart and fused =="
  python3 bench/fp8_train_bench.py --bonsai-run "$run" --name llama3_8b_pair --steps 25 \
    --labels apart,fused \
    --warmup 5 --bf16-plan "$dir/plans/llama3_8b_fp8pair.plan" \
    --fp8-plan "$dir/plans/llama3_8b_fp8.plan" --workdir "$out" > "$out/step_pair.log" 2>&1
  tail -6 "$out/step_pair.log"
fi

# The 8-layer FP8 step without the fusion family fp8-$1-input against the default plan.
family() {
  python3 bench/fp8_train_bench.py --bonsai-run "$run" --name "llama3_8b_$1" --steps 20 \
    --warmup 5 --labels "un$1,$1" --bf16-plan "$dir/plans/llama3_8b_fp8un$1.plan" \
    --fp8-plan "$dir/plans/llama3_8b_fp8.plan" --workdir "$out" > "$out/step_$1.log" 2>&1
  tail -6 "$out/step_$1.log"
}

if want shared; then
  echo "== the 8-layer FP8 step: each linear casting its input, and linears sharing a cast =="
  family shared
fi

if want saved; then
  echo "== the 8-layer FP8 step: each backward casting its input, and reading the forward's =="
  family saved
fi

if want fast; then
  echo "== verification with fast forward accumulation =="
  verify fp8fast
  for model in llama3_8b llama3_8b_l24; do
    echo "== $model: FP8 promoted against fast forward accumulation =="
    python3 bench/fp8_train_bench.py --bonsai-run "$run" --name "${model}_fast" --steps 20 \
      --warmup 5 --labels promoted,fast --bf16-plan "$dir/plans/${model}_fp8.plan" \
      --fp8-plan "$dir/plans/${model}_fp8fast.plan" --workdir "$out" \
      > "$out/step_${model}_fast.log" 2>&1
    tail -6 "$out/step_${model}_fast.log"
  done
fi

want profile && echo "== where a step of the 8-layer stack goes (kernels timed one by one) ==" &&
for recipe in bf16 fp8; do
  "$run" "$dir/plans/llama3_8b_$recipe.plan" --backend=cuda --steps 3 --seed 1 --profile \
    > "$out/profile_$recipe.log" 2>&1
  echo "-- $recipe"
  grep -E "^profile: (one step|[A-Z][A-Za-z0-9]+ +[a-z]+ +[0-9]+ kernels)" "$out/profile_$recipe.log" | head -12
done
