#!/usr/bin/env bash
# scripts/demo.sh - the main job (the README's first command): install, build, then verify every
# example model and recipe and print each model's cost report.
#
# Until the runtime lands this is what Bonsai does end to end: parse and verify a model and the
# recipe written for it, and say what a training step costs (parameters, FLOPs, memory).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
opt="${BONSAI_BUILD_DIR:-build}/bin/bonsai-opt"

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
