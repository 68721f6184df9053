#!/usr/bin/env bash
# bench/prepare_offload_run.sh [DIR] - on the build machine, the plans of the host-offload
# benchmark (issue #24, docs/offload.md) for bench/offload_bench.py, each with the compiler's
# report, into DIR (default .gpu-offload/, ignored by git) and its xz pack. Every model is full
# AdamW (fp32 moments, and fp32 master weights of its bf16 parameters), in seven variants:
#
#   gpu              the state on the device
#   offload-inorder  bonsai.offload ["optimizer_state", "master_weights"], --overlap-copies=false
#   offload          the same, the copies on the copy streams (docs/offload.md, "Overlap")
#   inbwd-gpu        update_in_backward, the state on the device
#   inbwd-offload    update_in_backward and offload: the copies overlap the backward pass
#   inbwd-host       update_in_backward and offload with update "host": each update runs on
#                    the CPU (docs/offload.md, "The host step")
#   inbwd-auto       the same with update "auto": each update on the CPU or streamed, as the
#                    compiler's simulation of the step decides (docs/offload.md, "Choosing
#                    per update")
#
# for Llama 124M (B16 S1024) and TinyLlama-1.1B (B4 S2048), and for Llama-2-7B (B8 S2048, 16k
# tokens, remat "full") gpu, inbwd-gpu, inbwd-offload, inbwd-host and inbwd-auto, the last
# three compiled for a 24 GiB budget; and the curve of tokens per step (issue #24): Llama-2-7B
# at B2, B4 and B16 (4k, 8k and 32k tokens), gpu and inbwd-auto, named llama2_7b_bN (and B4
# inbwd-host); TinyLlama at B8 (tinyllama_1_1b_b8) and GPT-2 124M, gpu and inbwd-auto; and the
# activation-offload plans listed further down.
# The plans carry no weights (bonsai-run initialises them), so the pack is small; the GPU
# machine runs them with the bonsai-run of test/gpu/prepare.sh: bench/offload_h200.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu-offload}"
build="${BONSAI_BUILD_DIR:-build}"
compile="$build/bin/bonsai-compile"
[ -x "$compile" ] || { echo "prepare_offload_run: build $build first (scripts/build.sh)" >&2; exit 1; }
rm -rf "$dir" && mkdir -p "$dir/plans"

# recipe FILE INBWD OFFLOAD [REMAT]: the AdamW recipe, with update_in_backward and the offload
# directive when asked (OFFLOAD 2: with the updates on the host).
recipe() {
  local file="$1" inbwd="$2" offload="$3" remat="${4:-}"
  {
    printf 'bonsai.recipe @offload {\n'
    if [ "$inbwd" = 1 ]; then
      printf '  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64, update_in_backward = true}\n'
    else
      printf '  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64}\n'
    fi
    [ "$offload" = 1 ] && printf '  bonsai.offload ["optimizer_state", "master_weights"]\n'
    [ "$offload" = 2 ] &&
      printf '  bonsai.offload ["optimizer_state", "master_weights"] update "host"\n'
    [ "$offload" = 3 ] &&
      printf '  bonsai.offload ["optimizer_state", "master_weights"] update "auto"\n'
    [ -n "$remat" ] && printf '  bonsai.remat "%s"\n' "$remat"
    printf '}\n'
  } > "$file"
}

# plan MODEL_FILE NAME VARIANT [REMAT] [bonsai-compile flags...]
plan() {
  local model="$1" name="$2" variant="$3" remat="${4:-}"
  shift 4 || shift $#
  local inbwd=0 offload=0 flags=()
  case "$variant" in inbwd-*) inbwd=1 ;; esac
  case "$variant" in *offload*) offload=1 ;; *host) offload=2 ;; *auto) offload=3 ;; esac
  [ "$variant" = offload-inorder ] && flags+=(--overlap-copies=false)
  recipe "$dir/plans/recipe.mlir" "$inbwd" "$offload" "$remat"
  # A plan that does not compile (over its budget) leaves its report, with the error, for the
  # benchmark to show.
  /usr/bin/time -f "compile %e s" "$compile" "$model" "$dir/plans/recipe.mlir" --target=h200 \
    -o "$dir/plans/$name.$variant.plan" "${flags[@]}" "$@" > "$dir/plans/$name.$variant.txt" 2>&1 ||
    grep -m1 "error:" "$dir/plans/$name.$variant.txt" || true
  echo "$name $variant: $(grep -E 'peak device' "$dir/plans/$name.$variant.txt" | head -1 | tr -s ' ') ($(tail -1 "$dir/plans/$name.$variant.txt"))"
}

for m in llama_124m tinyllama_1_1b; do
  for variant in gpu offload-inorder offload inbwd-gpu inbwd-offload inbwd-host inbwd-auto; do
    plan "examples/models/$m.mlir" "$m" "$variant" ""
  done
done
python3 scripts/gen_models.py --print llama2_7b --set=batch=8 --set=seq=2048 > "$dir/plans/llama2_7b.mlir"
for variant in gpu inbwd-gpu; do
  plan "$dir/plans/llama2_7b.mlir" llama2_7b "$variant" full
done
plan "$dir/plans/llama2_7b.mlir" llama2_7b inbwd-offload full --device-memory=24GiB
plan "$dir/plans/llama2_7b.mlir" llama2_7b inbwd-host full --device-memory=24GiB
plan "$dir/plans/llama2_7b.mlir" llama2_7b inbwd-auto full --device-memory=24GiB
for batch in 2 4 16; do
  python3 scripts/gen_models.py --print llama2_7b --set=batch=$batch --set=seq=2048 \
    > "$dir/plans/llama2_7b.mlir"
  plan "$dir/plans/llama2_7b.mlir" llama2_7b_b$batch gpu full
  plan "$dir/plans/llama2_7b.mlir" llama2_7b_b$batch inbwd-auto full --device-memory=24GiB
  # Plans the step-time prediction's figures were not fitted to (docs/offload.md, "Predicted
  # step time"): this one, TinyLlama at twice the batch and GPT-2 124M below.
  if [ "$batch" = 4 ]; then
    plan "$dir/plans/llama2_7b.mlir" llama2_7b_b4 inbwd-host full --device-memory=24GiB
  fi
done
python3 scripts/gen_models.py --print tinyllama_1_1b --set=batch=8 > "$dir/plans/tinyllama.mlir"
for variant in gpu inbwd-auto; do
  plan "$dir/plans/tinyllama.mlir" tinyllama_1_1b_b8 "$variant" ""
  plan examples/models/gpt2_124m.mlir gpt2_124m "$variant" ""
done
# Activation offload (docs/remat.md, "Offloading activations"): the 32k point of the curve
# (inbwd-auto with the saved activations offloaded too), and Llama-3-8B QLoRA at 16k and 32k
# tokens (B1): recompute-only (`full`, 24 GiB where it fits, else 40 GiB), `full` with the
# saved activations offloaded, and `auto` with them, both at 24 GiB.
python3 scripts/gen_models.py --print llama2_7b --set=batch=16 --set=seq=2048 \
  > "$dir/plans/llama2_7b.mlir"
recipe "$dir/plans/recipe.mlir" 1 3 full
sed -i 's/"master_weights"\]/"master_weights", "activations"]/' "$dir/plans/recipe.mlir"
/usr/bin/time -f "compile %e s" "$compile" "$dir/plans/llama2_7b.mlir" "$dir/plans/recipe.mlir" \
  --target=h200 --device-memory=24GiB -o "$dir/plans/llama2_7b_b16.inbwd-auto-act.plan" \
  > "$dir/plans/llama2_7b_b16.inbwd-auto-act.txt" 2>&1 ||
  grep -m1 "error:" "$dir/plans/llama2_7b_b16.inbwd-auto-act.txt" || true
qlora() { # SEQ VARIANT REMAT ACTIVATIONS BUDGET [SEQUENCE_CHUNKS]
  local name="llama3_8b_qlora_s$1"
  python3 scripts/gen_models.py --print llama3_8b --set=seq="$1" > "$dir/plans/llama3_8b.mlir"
  sed -e "s/\"auto\"/\"$3\"/" -e 's/sm_89/sm_90/' examples/recipes/qlora.mlir > "$dir/plans/recipe.mlir"
  [ -n "${6:-}" ] && sed -i "s/^  bonsai.remat .*/& sequence_chunks $6/" "$dir/plans/recipe.mlir"
  [ "$4" = 1 ] && sed -i 's/^}/  bonsai.offload ["activations"]\n}/' "$dir/plans/recipe.mlir"
  /usr/bin/time -f "compile %e s" "$compile" "$dir/plans/llama3_8b.mlir" "$dir/plans/recipe.mlir" \
    --target=h200 --device-memory="$5" --fit-offload=false -o "$dir/plans/$name.$2.plan" \
    > "$dir/plans/$name.$2.txt" 2>&1 || grep -m1 "error:" "$dir/plans/$name.$2.txt" || true
  echo "$name $2: $(grep -E 'peak device' "$dir/plans/$name.$2.txt" | head -1 | tr -s ' ') ($(tail -1 "$dir/plans/$name.$2.txt"))"
}
qlora 16384 full full 0 24GiB
qlora 32768 full full 0 40GiB
for seq in 16384 32768; do
  qlora $seq full-act full 1 24GiB
  qlora $seq auto-act auto 1 24GiB
done
# Tiling the sequence (docs/remat.md, "Tiling the sequence"): at 32k tokens, `full` with the
# activations offloaded and the MLPs in 4 chunks, against full-act above (what tiling costs);
# at 128k tokens, the MLPs in 8 chunks, on the device (100 GiB: the reference) and with the
# activations offloaded under 24 GiB.
qlora 32768 full-act-tiled full 1 24GiB 4
qlora 131072 full-tiled full 0 100GiB 8
qlora 131072 full-act-tiled full 1 24GiB 8
rm -f "$dir/plans/recipe.mlir" "$dir/plans/llama2_7b.mlir" "$dir/plans/llama3_8b.mlir" \
  "$dir/plans/tinyllama.mlir"
tar -C "$(dirname "$dir")" -cJf "$dir.tar.xz" "$(basename "$dir")"
du -sh "$dir" "$dir.tar.xz"
