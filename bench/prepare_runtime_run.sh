#!/usr/bin/env bash
# bench/prepare_runtime_run.sh - prepare, on the build machine, the GPU check of the runtime's
# structure (issue #22: the kernel table, one handler per kind on each backend, the contracts):
# the CUDA build's bonsai-run and bonsai-runtime-tests, the shared libraries a GPU image may lack,
# and the two 124M training plans of bench/train_bench.py. Everything goes into one folder
# (default .gpu-runtime/, ignored by git) and its xz pack, which a device call carries; then
# `bash bench/runtime_h200.sh .gpu-runtime` on the GPU machine.
#
# The tests are those of the main build ($BONSAI_BUILD_DIR, default build/), which must have the
# CUDA backend: they name their inputs and bonsai-run by absolute path, so runtime_h200.sh puts
# them back at the same paths.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu-runtime}"
build="${BONSAI_BUILD_DIR:-build}"
scripts/build.sh
grep -q "BONSAI_HAVE_CUDA=1" "$build/build.ninja" ||
  { echo "prepare_runtime_run: $build has no CUDA backend" >&2; exit 1; }
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/plans"
for tool in bonsai-run bonsai-runtime-tests; do
  strip -o "$dir/bin/$tool" "$build/bin/$tool"
done
. bench/gpu_libs.sh
copy_gpu_libs "$dir/lib"
# The plans of bench/train_bench.py: AdamW as it gives PyTorch (lr 3e-4, weight decay 0.01).
printf 'bonsai.recipe @bench {\n  bonsai.target "sm_90"\n  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64}\n}\n' \
  > "$dir/bench_recipe.mlir"
for model in llama_124m gpt2_124m; do
  "$build/bin/bonsai-compile" "examples/models/$model.mlir" "$dir/bench_recipe.mlir" \
    --target=h200 -o "$dir/plans/${model}_train.plan" > /dev/null
done
# Where the tests look for them: the paths compiled into bonsai-runtime-tests.
printf '%s\n' "$PWD" > "$dir/build_root.txt"
printf '%s\n' "$build" > "$dir/build_dir.txt"
tar -C "$(dirname "$dir")" -cJf "$dir.tar.xz" "$(basename "$dir")"
du -sh "$dir" "$dir.tar.xz"
