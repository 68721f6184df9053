#!/usr/bin/env bash
# scripts/demo.sh - the main job (the README's first command): install, build, train the tiny
# Llama on the CPU on a text every Debian machine has (loss falling, checkpoints, then a greedy
# completion of a prompt), fine-tune it with QLoRA on another text and export the adapter, then
# verify every example model and recipe and print cost reports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
bin="${BONSAI_BUILD_DIR:-build}/bin"
opt="$bin/bonsai-opt"

echo
echo "== Training the tiny Llama on the CPU, on a text every Debian machine has =="
mkdir -p out
# Byte-level tokens: each byte of the GPL-3 text is one token (vocabulary 256).
"$bin/bonsai-tokenize" /usr/share/common-licenses/GPL-3 -o out/gpl3.tokens
# The model plus the recipe (AdamW, warmup + cosine): the plan runs forward, backward, update.
# Its LM head is fused with the loss and keeps no logits; --generate computes the last
# position's from the head's input and weight (docs/training.md).
"$bin/bonsai-compile" examples/models/tiny_llama.mlir examples/recipes/tiny_train.mlir \
  -o out/tiny_train.plan
# Random initial weights from the seed: the loss starts near ln(256) = 5.55 and falls; then the
# model completes a prompt greedily, byte by byte.
rm -rf out/ckpt
"$bin/bonsai-run" out/tiny_train.plan --data out/gpl3.tokens --steps 1500 --seed 1 \
  --metrics out/metrics.jsonl --save-every 500 --ckpt-dir out/ckpt \
  --generate "This License " --max-new-bytes 80 | awk 'NR <= 2 || /^step/ && (++n % 100 == 1) || !/^step/'

echo
echo "== QLoRA: fine-tuning the trained model on another text, NF4 base, LoRA adapters =="
# The checkpoint's weights become the frozen base: the block linears are quantized to NF4 as
# they are bound, LoRA r8 adapters on all seven train (docs/lora.md, docs/quantization.md),
# and the adapters are exported as a PEFT adapter directory (docs/import-export.md).
"$bin/bonsai-tokenize" /usr/share/common-licenses/Apache-2.0 -o out/apache.tokens
targets='["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'
printf 'bonsai.recipe @qlora_tiny {\n  bonsai.quantize "nf4" block 64 double_quant 256 targets %s\n  bonsai.lora rank 8 alpha 1.600000e+01 targets %s\n  bonsai.optimizer "adamw" lr 5.000000e-03\n}\n' \
  "$targets" "$targets" > out/qlora_tiny.mlir
"$bin/bonsai-compile" examples/models/tiny_llama.mlir out/qlora_tiny.mlir -o out/qlora_tiny.plan \
  2> /dev/null | grep -E "trainable|quantized|peak device"
rm -rf out/qlora-adapter
"$bin/bonsai-run" out/qlora_tiny.plan --weights out/ckpt/step-00001500/model.safetensors \
  --data out/apache.tokens --steps 400 --seed 1 --export-adapter out/qlora-adapter \
  --generate "Licensed under the " --max-new-bytes 60 |
  awk '/^step/ && (++n % 100 == 1) || /^(adapter|prompt|generated|time)/'

echo
echo "== Recipes, each verified against the model it is written for =="
for pair in qlora:llama2_7b dora:tinyllama_1_1b galore:tinyllama_1_1b \
            fsdp_offload:llama3_8b remat:llama_124m fp8:llama3_8b ring:llama3_8b; do
  recipe=${pair%%:*}
  model=${pair##*:}
  cat "examples/models/$model.mlir" "examples/recipes/$recipe.mlir" |
    "$opt" --bonsai-verify-model -o /dev/null
  printf '  %-14s on %-16s ok\n' "$recipe" "$model"
done

for model in tiny_llama tiny_gpt2 gpt2_124m llama_124m tinyllama_1_1b llama2_7b llama3_8b; do
  echo
  echo "== examples/models/$model.mlir =="
  "$opt" --bonsai-verify-model --bonsai-print-cost=per-layer=false \
    "examples/models/$model.mlir" -o /dev/null
done
