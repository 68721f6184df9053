#!/usr/bin/env bash
# bench/prepare_fusion_run.sh - prepare, on the build machine, what bench/fusion_h200.sh needs on
# a GPU machine (issue #8: fused kernels): bonsai-run, the runtime tests and the kernel
# benchmarks from the build (which has the CUDA backend for sm_80 to sm_90 when the toolkit is
# installed), OpenBLAS for machines without it, the tiny models' parity cases and the
# training-step plans of Llama 124M and GPT-2 124M compiled with and without bonsai-fuse. All in
# one folder (default .gpu-fusion/, ignored by git), packed as .gpu-fusion.tar.xz for `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu-fusion}"
build="${BONSAI_BUILD_DIR:-build}"
scripts/build.sh
if [ ! -x "$build/bin/attention_bench" ]; then
  echo "prepare_fusion_run.sh: $build has no CUDA backend (is nvcc at /usr/local/cuda?)" >&2
  exit 1
fi
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/cases" "$dir/plans"
for tool in bonsai-run bonsai-runtime-tests attention_bench; do
  strip -o "$dir/bin/$tool" "$build/bin/$tool"
done
. bench/gpu_libs.sh
copy_gpu_libs "$dir/lib"
# Parity with Hugging Face (test/gpu/hf_parity.py): fp32 tiny models, AdamW lr 1e-3, fused.
printf 'bonsai.recipe @parity {\n  bonsai.optimizer "adamw" lr 1.000000e-03\n}\n' > "$dir/parity_recipe.mlir"
for model in tiny_llama tiny_gpt2; do
  /usr/bin/python3 test/reference/make_case.py --model "$model" --out "$dir/cases"
  "$build/bin/bonsai-compile" "examples/models/$model.mlir" "$dir/parity_recipe.mlir" \
    -o "$dir/cases/${model}_train.plan" > /dev/null
done
# Training steps as bench/train_bench.py gives PyTorch (AdamW lr 3e-4, weight decay 0.01), with
# and without fusion; the compiler's report of each (planned memory) is kept next to the plan.
printf 'bonsai.recipe @bench {\n  bonsai.target "sm_90"\n  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64}\n}\n' \
  > "$dir/bench_recipe.mlir"
for model in llama_124m gpt2_124m; do
  for fuse in true false; do
    suffix=$([ "$fuse" = true ] && echo fused || echo unfused)
    "$build/bin/bonsai-compile" "examples/models/$model.mlir" "$dir/bench_recipe.mlir" \
      --target=h200 --fuse=$fuse -o "$dir/plans/${model}_$suffix.plan" \
      > "$dir/plans/${model}_$suffix.txt" 2>&1
    echo "$model $suffix: $(grep -E 'peak device' "$dir/plans/${model}_$suffix.txt" | head -1)"
  done
done
tar cf - "$dir" | xz -T0 -3 > "$dir.tar.xz"
du -sh "$dir" "$dir.tar.xz"
