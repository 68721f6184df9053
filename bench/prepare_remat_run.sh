#!/usr/bin/env bash
# bench/prepare_remat_run.sh - prepare, on the build machine, the GPU check of the recomputation
# search (issue #23): the plans `bonsai.remat "auto"` makes for Llama 124M (AdamW, B16 S1024)
# under 7 and 6 GiB and for TinyLlama-1.1B QLoRA r16 (B4 S2048) under 10 GiB, the plans without
# recomputation next to them, each with the compiler's report, and the CUDA build's bonsai-run.
# Everything goes into one folder (default .gpu-remat/, ignored by git) and its xz pack, which a
# device call carries; then `bash bench/remat_h200.sh .gpu-remat` on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu-remat}"
build="${BONSAI_BUILD_DIR:-build}"
scripts/build.sh
grep -q "BONSAI_HAVE_CUDA=1" "$build/build.ninja" ||
  { echo "prepare_remat_run: $build has no CUDA backend" >&2; exit 1; }
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/remat" "$dir/adapters"
strip -o "$dir/bin/bonsai-run" "$build/bin/bonsai-run"
. bench/gpu_libs.sh
copy_gpu_libs "$dir/lib"

# Llama 124M as bench/remat_bench.py names its plans: <model>.<policy>.plan and .txt.
for policy in none auto-7GiB auto-6GiB; do
  case "$policy" in
    auto-*) gib="${policy#auto-}"; target="  bonsai.target \"sm_90\" device_memory $(( ${gib%GiB} * 1024 )) MiB"; remat=auto ;;
    *) target='  bonsai.target "sm_90"'; remat=none ;;
  esac
  printf 'bonsai.recipe @remat {\n%s\n  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64}\n  bonsai.remat "%s"\n}\n' \
    "$target" "$remat" > "$dir/remat/recipe.mlir"
  /usr/bin/time -f "compile %e s" "$build/bin/bonsai-compile" examples/models/llama_124m.mlir \
    "$dir/remat/recipe.mlir" -o "$dir/remat/llama_124m.$policy.plan" \
    > "$dir/remat/llama_124m.$policy.txt" 2>&1
  echo "remat llama_124m $policy: $(grep -E 'peak device' "$dir/remat/llama_124m.$policy.txt") ($(tail -1 "$dir/remat/llama_124m.$policy.txt"))"
done

# TinyLlama-1.1B QLoRA r16 on every linear, as bench/lora_bench.py names its plans.
targets='["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'
for variant in qlora qlora-auto10GiB; do
  {
    case "$variant" in
      *-auto10GiB) printf 'bonsai.recipe @adapters {\n  bonsai.target "sm_90" device_memory 10240 MiB\n' ;;
      *) printf 'bonsai.recipe @adapters {\n  bonsai.target "sm_90"\n' ;;
    esac
    printf '  bonsai.quantize "nf4" block 64 double_quant 256 targets %s\n' "$targets"
    printf '  bonsai.lora rank 16 alpha 3.200000e+01 targets %s\n' "$targets"
    printf '  bonsai.optimizer "adamw" lr 2.000000e-04\n'
    case "$variant" in *-auto10GiB) printf '  bonsai.remat "auto"\n' ;; esac
    printf '}\n'
  } > "$dir/adapters/recipe.mlir"
  /usr/bin/time -f "compile %e s" "$build/bin/bonsai-compile" examples/models/tinyllama_1_1b.mlir \
    "$dir/adapters/recipe.mlir" -o "$dir/adapters/tinyllama_1_1b.$variant.plan" \
    > "$dir/adapters/tinyllama_1_1b.$variant.txt" 2>&1
  echo "adapters tinyllama_1_1b $variant: $(grep -E 'peak device' "$dir/adapters/tinyllama_1_1b.$variant.txt") ($(tail -1 "$dir/adapters/tinyllama_1_1b.$variant.txt"))"
done
rm -f "$dir/remat/recipe.mlir" "$dir/adapters/recipe.mlir"
tar -C "$(dirname "$dir")" -cJf "$dir.tar.xz" "$(basename "$dir")"
du -sh "$dir" "$dir.tar.xz"
