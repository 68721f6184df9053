#!/usr/bin/env bash
# bench/prepare_fp8_run.sh - prepare, on the build machine, what bench/fp8_h200.sh needs on a GPU
# machine (issue 10: FP8 training): bonsai-run, the runtime tests and the FP8 GEMM benchmark from
# the build (which has the CUDA backend when the toolkit is installed), OpenBLAS for machines
# without it, a token file, and plans of three models, each compiled twice from the same
# model file: with a bf16 recipe and with the same recipe plus `bonsai.fp8` on every block
# linear (docs/fp8.md):
#   verify     TinyLlama-1.1B's shape at batch 4 x sequence 512: the 500-step bf16-vs-FP8 run;
#   tinyllama  TinyLlama-1.1B's shape at its benchmark batch 4 x sequence 2048;
#   llama3_8b  a stack of 8 of Llama-3-8B's layers (vocabulary and head as the model's) at
#              batch 2 x sequence 4096: what fits one GPU with AdamW and fp32 master weights
#              on a 40-48 GB budget;
#   llama3_8b_l16  the same with 16 layers (97 GiB on the H200): the LM head, which FP8 leaves
#              in bf16, is a smaller part of its step, as in the 32-layer model;
#   llama3_8b_l24  with 24 layers (134 GiB): the deepest stack that fits the H200's 140 GiB.
# And llama3_8b_fp8pair: the 8-layer FP8 plan compiled with --fuse-disable=fp8-backward (each
# linear's two backward GEMMs apart), against which the fused plan is timed in the same run;
# verify_fp8fast, llama3_8b_fp8fast and llama3_8b_l24_fp8fast: the FP8 recipe with
# `forward_accumulation "fast"` (the forward GEMMs' sums kept in the tensor cores' accumulator);
# llama3_8b_fp8unshared and llama3_8b_l24_fp8unshared: the FP8 plans compiled with
# --fuse-disable=fp8-shared-input (each linear casts its input itself), and _fp8unsaved with
# --fuse-disable=fp8-saved-input (each backward casts its input again).
# All in one folder (default .gpu-fp8/, ignored by git), packed as .gpu-fp8.tar.xz for `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu-fp8}"
build="${BONSAI_BUILD_DIR:-build}"
scripts/build.sh
if [ ! -x "$build/bin/fp8_gemm_bench" ]; then
  echo "prepare_fp8_run.sh: $build has no CUDA backend (is nvcc at /usr/local/cuda?)" >&2
  exit 1
fi
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/plans" "$dir/models"
for tool in bonsai-run bonsai-runtime-tests fp8_gemm_bench; do
  strip -o "$dir/bin/$tool" "$build/bin/$tool"
done
. bench/gpu_libs.sh
copy_gpu_libs "$dir/lib"
# Training text: the licenses Debian ships, as bytes (bonsai-tokenize).
cat /usr/share/common-licenses/* > "$dir/licenses.txt"
"$build/bin/bonsai-tokenize" "$dir/licenses.txt" -o "$dir/licenses.tokens" > /dev/null
rm "$dir/licenses.txt"

python3 scripts/gen_models.py --print tinyllama_1_1b --set seq=512 > "$dir/models/verify.mlir"
python3 scripts/gen_models.py --print tinyllama_1_1b > "$dir/models/tinyllama.mlir"
python3 scripts/gen_models.py --print llama3_8b --set layers=8 --set batch=2 --set seq=4096 \
  > "$dir/models/llama3_8b.mlir"
for layers in 16 24; do
  python3 scripts/gen_models.py --print llama3_8b --set layers=$layers --set batch=2 \
    --set seq=4096 > "$dir/models/llama3_8b_l$layers.mlir"
done
optimizer='bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64, grad_clip = 1.000000e+00 : f64, schedule = "cosine", warmup_steps = 50 : i64, total_steps = 500 : i64, min_lr_ratio = 1.000000e-01 : f64}'
fp8='bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["model.layers.*"]'
printf 'bonsai.recipe @bf16 {\n  bonsai.target "sm_90"\n  %s\n}\n' "$optimizer" > "$dir/bf16.mlir"
printf 'bonsai.recipe @fp8 {\n  bonsai.target "sm_90"\n  %s\n  %s\n}\n' "$fp8" "$optimizer" \
  > "$dir/fp8.mlir"
sed 's/margin 0 targets/margin 0 forward_accumulation "fast" targets/' "$dir/fp8.mlir" \
  > "$dir/fp8fast.mlir"
for model in verify tinyllama llama3_8b llama3_8b_l16 llama3_8b_l24; do
  for recipe in bf16 fp8; do
    "$build/bin/bonsai-compile" "$dir/models/$model.mlir" "$dir/$recipe.mlir" --target=h200 \
      -o "$dir/plans/${model}_$recipe.plan" > "$dir/plans/${model}_$recipe.txt" 2>&1
    echo "$model $recipe: $(grep -E 'peak device' "$dir/plans/${model}_$recipe.txt" | head -1)"
  done
done
"$build/bin/bonsai-compile" "$dir/models/llama3_8b.mlir" "$dir/fp8.mlir" --target=h200 \
  --fuse-disable=fp8-backward -o "$dir/plans/llama3_8b_fp8pair.plan" \
  > "$dir/plans/llama3_8b_fp8pair.txt" 2>&1
for model in verify llama3_8b llama3_8b_l24; do
  "$build/bin/bonsai-compile" "$dir/models/$model.mlir" "$dir/fp8fast.mlir" --target=h200 \
    -o "$dir/plans/${model}_fp8fast.plan" > "$dir/plans/${model}_fp8fast.txt" 2>&1
done
for model in llama3_8b llama3_8b_l24; do
  for family in shared saved; do
    "$build/bin/bonsai-compile" "$dir/models/$model.mlir" "$dir/fp8.mlir" --target=h200 \
      --fuse-disable=fp8-$family-input -o "$dir/plans/${model}_fp8un$family.plan" \
      > "$dir/plans/${model}_fp8un$family.txt" 2>&1
  done
done
tar cf - "$dir" | xz -T0 -3 > "$dir.tar.xz"
du -sh "$dir" "$dir.tar.xz"
