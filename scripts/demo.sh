#!/usr/bin/env bash
# scripts/demo.sh - the main job (the README's first command): install, build, compile the tiny
# Llama into a plan and evaluate its loss on the CPU runtime, then verify every example model and
# recipe and print each model's cost report.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
bin="${BONSAI_BUILD_DIR:-build}/bin"
opt="$bin/bonsai-opt"

echo
echo "== The tiny Llama: compiled to a plan, its loss evaluated by the CPU runtime =="
mkdir -p out
"$bin/bonsai-compile" examples/models/tiny_llama.mlir -o out/tiny_llama.plan
# Random weights and tokens from the seed: the loss of an untrained model is about ln(256).
"$bin/bonsai-run" out/tiny_llama.plan --seed 1 --steps 3

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
