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
archs="${BONSAI_GPU_ARCHS:-90a-real}"
scripts/build.sh
cmake -G Ninja -S runtime -B build-gpu -DCMAKE_BUILD_TYPE=Release -DBONSAI_CUDA_ARCHS="$archs"
ninja -C build-gpu bonsai-run
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/cases" "$dir/plans"
cp build-gpu/bin/bonsai-run "$dir/bin/"
. bench/gpu_libs.sh
copy_gpu_libs "$dir/lib"
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

# Adapters (bench/lora_bench.py): TinyLlama-1.1B shape, LoRA r16 alpha 32 on every linear of the
# blocks, bf16 or NF4 base, LoRA or DoRA; and Llama-2-7B QLoRA under 24 GiB
# (examples/recipes/qlora.mlir).
mkdir -p "$dir/adapters"
targets='["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'
# A "-auto10GiB" variant fits the step to 10 GiB by recomputation (bonsai.remat "auto").
for variant in lora qlora dora qdora qlora-auto10GiB; do
  {
    case "$variant" in
      *-auto10GiB) printf 'bonsai.recipe @adapters {\n  bonsai.target "sm_90" device_memory 10240 MiB\n' ;;
      *) printf 'bonsai.recipe @adapters {\n  bonsai.target "sm_90"\n' ;;
    esac
    case "$variant" in q*) printf '  bonsai.quantize "nf4" block 64 double_quant 256 targets %s\n' "$targets" ;; esac
    case "$variant" in *dora*) dora='dora ' ;; *) dora='' ;; esac
    printf '  bonsai.lora %srank 16 alpha 3.200000e+01 targets %s\n' "$dora" "$targets"
    printf '  bonsai.optimizer "adamw" lr 2.000000e-04\n'
    case "$variant" in *-auto10GiB) printf '  bonsai.remat "auto"\n' ;; esac
    printf '}\n'
  } > "$dir/adapters/recipe.mlir"
  if ! "$build/bin/bonsai-compile" examples/models/tinyllama_1_1b.mlir "$dir/adapters/recipe.mlir" \
      -o "$dir/adapters/tinyllama_1_1b.$variant.plan" > "$dir/adapters/tinyllama_1_1b.$variant.txt" 2>&1; then
    rm -f "$dir/adapters/tinyllama_1_1b.$variant.plan"
  fi
  echo "adapters tinyllama_1_1b $variant: $(grep -E 'peak device|error:' "$dir/adapters/tinyllama_1_1b.$variant.txt" | head -1)"
done
if ! "$build/bin/bonsai-compile" examples/models/llama2_7b.mlir examples/recipes/qlora.mlir \
    -o "$dir/adapters/llama2_7b.qlora.plan" > "$dir/adapters/llama2_7b.qlora.txt" 2>&1; then
  rm -f "$dir/adapters/llama2_7b.qlora.plan"
fi
echo "adapters llama2_7b qlora: $(grep -E 'peak device|error:' "$dir/adapters/llama2_7b.qlora.txt" | head -1)"
rm -f "$dir/adapters/recipe.mlir"

# ---- PEFT LoRA/DoRA parity (test/gpu/peft_lora_parity.py, docs/lora.md) ----
# The tiny Llama (cases/tiny_llama.safetensors above) with r8 alpha 16 adapters on all seven
# linears, AdamW lr 1e-3 as the script gives PyTorch; LoRA and DoRA plans.
mkdir -p "$dir/peft"
sed -e 's/lr 1.000000e-02/lr 1.000000e-03/' examples/recipes/lora_tiny.mlir > "$dir/peft/lora.mlir"
sed -e 's/bonsai.lora rank/bonsai.lora dora rank/' "$dir/peft/lora.mlir" > "$dir/peft/dora.mlir"
for variant in lora dora; do
  "$build/bin/bonsai-compile" examples/models/tiny_llama.mlir "$dir/peft/$variant.mlir" \
    -o "$dir/peft/tiny_llama_$variant.plan" > /dev/null
done
rm -f "$dir/peft/lora.mlir" "$dir/peft/dora.mlir"
# ---- end of PEFT parity ----
# ---- GaLore (bench/galore_bench.py, docs/galore.md) ----
# TinyLlama-1.1B shape (batch 4, sequence 2048, bf16 weights): AdamW (lr 1e-3) against GaLore
# rank 512, T 200 on q_proj, o_proj and the MLP, with GaLore's pre-training settings (lr 1e-2,
# scale 0.25, as in the GaLore paper's LLaMA runs); both with 20 warmup steps and clipping at 1.
# The same byte-level corpus for both (this repository's text, tokenized; the loader wraps
# around). And Llama-2-7B shape under a 24 GiB budget with GaLore and remat: the plan when it
# compiles, else the compiler's report of what does not fit.
mkdir -p "$dir/galore"
find README.md docs examples lib dialects runtime tools test -type f \
    \( -name '*.md' -o -name '*.cpp' -o -name '*.h' -o -name '*.td' -o -name '*.py' \) \
    -print0 | sort -z | xargs -0 cat > "$dir/galore/corpus.txt"
"$build/bin/bonsai-tokenize" "$dir/galore/corpus.txt" -o "$dir/galore/corpus.tokens"
rm -f "$dir/galore/corpus.txt"
galore_targets='["q_proj", "o_proj", "*.mlp.*_proj*"]'
printf 'bonsai.recipe @adamw {\n  bonsai.target "sm_90"\n  bonsai.optimizer "adamw" lr 1.000000e-03 {grad_clip = 1.000000e+00 : f64, warmup_steps = 20 : i64}\n}\n' \
  > "$dir/galore/adamw.mlir"
printf 'bonsai.recipe @galore {\n  bonsai.target "sm_90"\n  bonsai.optimizer "adamw" lr 1.000000e-02 {grad_clip = 1.000000e+00 : f64, warmup_steps = 20 : i64}\n  bonsai.galore rank 512 update_proj_gap 200 scale 2.500000e-01 projector "randomized" targets %s\n}\n' \
  "$galore_targets" > "$dir/galore/galore.mlir"
for variant in adamw galore; do
  if ! "$build/bin/bonsai-compile" examples/models/tinyllama_1_1b.mlir "$dir/galore/$variant.mlir" \
      -o "$dir/galore/tinyllama_1_1b.$variant.plan" > "$dir/galore/tinyllama_1_1b.$variant.txt" 2>&1; then
    rm -f "$dir/galore/tinyllama_1_1b.$variant.plan"
  fi
  echo "galore tinyllama_1_1b $variant: $(grep -E 'optimizer state|error:' "$dir/galore/tinyllama_1_1b.$variant.txt" | head -2 | tr '\n' ' ')"
done
# 7B: rank 512 on all seven linears, each update applied in the backward pass as its gradient
# is complete (no gradient accumulators) and bf16 weights updated without fp32 masters (the
# GaLore paper's 7B run also drops both; it keeps 8-bit moments, these are fp32). The plan
# gets 23.5 GiB so that what the runtime holds outside it (the cuBLASLt workspace, the CUDA
# Graphs' scratch pools: +0.22 GiB measured at 24 GiB) stays inside 24 GiB. lr 1e-3: at 1e-2
# without warm-up or clipping (update_in_backward cannot clip) the randomly initialised 7B
# diverged by step 3; at 1e-3 without warm-up the loss still jumped at step 4.
printf 'bonsai.recipe @galore7b {\n  bonsai.target "sm_90" device_memory 24064 MiB\n  bonsai.optimizer "adamw" lr 1.000000e-03 {update_in_backward = true, master_weights = false, warmup_steps = 10 : i64}\n  bonsai.galore rank 512 update_proj_gap 200 scale 2.500000e-01 projector "randomized" targets ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]\n  bonsai.remat "auto"\n}\n' \
  > "$dir/galore/galore7b.mlir"
if ! "$build/bin/bonsai-compile" examples/models/llama2_7b.mlir "$dir/galore/galore7b.mlir" \
    -o "$dir/galore/llama2_7b.galore.plan" > "$dir/galore/llama2_7b.galore.txt" 2>&1; then
  rm -f "$dir/galore/llama2_7b.galore.plan"
fi
echo "galore llama2_7b: $(grep -E 'peak device|error:' "$dir/galore/llama2_7b.galore.txt" | head -1)"
# The GPU unit tests of the GaLore kernels against the CPU ones (test/runtime/CudaGaLoreTest.cpp).
ninja -C build-gpu bonsai-runtime-tests
cp build-gpu/bin/bonsai-runtime-tests "$dir/bin/"
# ---- end of GaLore ----
# Exported adapters in PEFT (test/gpu/peft_export_check.py): tiny Hugging Face directories,
# their imported models, plans and trained exports.
/usr/bin/python3 test/gpu/peft_export_check.py prepare --build "$build" --out "$dir/peft"
cp build-gpu/bin/nf4_gemm_bench "$dir/bin/" 2>/dev/null || true
du -sh "$dir"
