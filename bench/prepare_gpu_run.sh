#!/usr/bin/env bash
# bench/prepare_gpu_run.sh - prepare, on the build machine, what bench/run_h200.sh needs on a GPU
# machine: a CUDA build of bonsai-run, the shared libraries it needs that a GPU image may lack
# (OpenBLAS), the tiny models' weights, tokens and training plans for the parity checks, and the
# benchmark plans. Everything goes into one folder (default .gpu-run/, ignored by git), which is
# copied to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu-run}"
build="${BONSAI_BUILD_DIR:-build}"
archs="${BONSAI_GPU_ARCHS:-90-real}"
scripts/build.sh
cmake -G Ninja -S runtime -B build-gpu -DCMAKE_BUILD_TYPE=Release -DBONSAI_CUDA_ARCHS="$archs"
ninja -C build-gpu bonsai-run
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/cases" "$dir/plans"
cp build-gpu/bin/bonsai-run "$dir/bin/"
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do
  cp "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" "$dir/lib/"
done
# Parity: fp32 tiny models, AdamW lr 1e-3 (the settings test/gpu/hf_parity.py uses for PyTorch).
printf 'bonsai.recipe @parity {\n  bonsai.optimizer "adamw" lr 1.000000e-03\n}\n' > "$dir/parity_recipe.mlir"
for model in tiny_llama tiny_gpt2; do
  /usr/bin/python3 test/reference/make_case.py --model "$model" --out "$dir/cases"
  "$build/bin/bonsai-compile" "examples/models/$model.mlir" "$dir/parity_recipe.mlir" \
    -o "$dir/cases/${model}_train.plan" > /dev/null
done
# Benchmarks: AdamW as bench/train_bench.py gives PyTorch (lr 3e-4, weight decay 0.01).
printf 'bonsai.recipe @bench {\n  bonsai.target "sm_90"\n  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64}\n}\n' \
  > "$dir/bench_recipe.mlir"
for model in llama_124m gpt2_124m; do
  "$build/bin/bonsai-compile" "examples/models/$model.mlir" "$dir/bench_recipe.mlir" \
    --target=h200 -o "$dir/plans/${model}_train.plan"
done

# Recomputation (bench/remat_bench.py): one plan per policy and budget, each with the compiler's
# report (the remat remark and planned memory, or the error of a budget nothing meets).
mkdir -p "$dir/remat"
remat_recipe() {  # $1 = policy, $2 = budget in MiB (0: none), $3 = extra optimizer attributes
  local target='  bonsai.target "sm_90"'
  [ "$2" != 0 ] && target="  bonsai.target \"sm_90\" device_memory $2 MiB"
  printf 'bonsai.recipe @remat {\n%s\n  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64%s}\n  bonsai.remat "%s"\n}\n' "$target" "${3:-}" "$1"
}
# A "uib-" policy also applies the updates in the backward pass (no gradient accumulators).
for model in llama_124m tinyllama_1_1b; do
  policies="none selective full auto-24GiB auto-16GiB auto-8GiB auto-6GiB"
  [ "$model" = tinyllama_1_1b ] && policies="$policies uib-none uib-full uib-auto-18GiB uib-auto-16GiB"
  for policy in $policies; do
    extra=""
    case "$policy" in uib-*) extra=", update_in_backward = true" ;; esac
    base="${policy#uib-}"
    case "$base" in
      auto-*) gib="${base#auto-}"; remat_recipe auto $(( ${gib%GiB} * 1024 )) "$extra" ;;
      *) remat_recipe "$base" 0 "$extra" ;;
    esac > "$dir/remat/recipe.mlir"
    if ! "$build/bin/bonsai-compile" "examples/models/$model.mlir" "$dir/remat/recipe.mlir" \
        -o "$dir/remat/$model.$policy.plan" > "$dir/remat/$model.$policy.txt" 2>&1; then
      rm -f "$dir/remat/$model.$policy.plan"
    fi
    echo "remat $model $policy: $(grep -E 'peak device|error:' "$dir/remat/$model.$policy.txt" | head -1)"
  done
done
rm -f "$dir/remat/recipe.mlir"
du -sh "$dir"
