#!/usr/bin/env bash
# bench/prepare_finetune_run.sh - prepare, on the build machine, the GPU checks of issue #30 (a
# real fine-tune): the CUDA build's bonsai-run, the shared libraries a GPU image may lack, and
# one folder per case for test/gpu/hf_families.py (a Hugging Face directory with random fp32
# weights, the model bonsai-import-hf makes of it, compiled with an SGD recipe, and tokens).
# Everything goes into one folder (default .gpu-finetune/, ignored by git) and its xz pack,
# which a device call carries; then `bash bench/finetune_h200.sh .gpu-finetune` there.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu-finetune}"
build="${BONSAI_BUILD_DIR:-build}"
grep -q "BONSAI_HAVE_CUDA=1" "$build/build.ninja" ||
  { echo "prepare_finetune_run: $build has no CUDA backend" >&2; exit 1; }
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/cases"
strip -o "$dir/bin/bonsai-run" "$build/bin/bonsai-run"
. bench/gpu_libs.sh
copy_gpu_libs "$dir/lib"
printf 'bonsai.recipe @parity {\n  bonsai.optimizer "sgd" lr 1.000000e-03\n}\n' > "$dir/sgd.mlir"

# case NAME IMPORT-HF-TEST-ARGS...: a Hugging Face directory of the tiny Llama preset changed by
# the arguments, random weights (std 0.1, so that RoPE and the norms move the loss), imported
# at batch 2, sequence 64.
case_dir() {
  local name="$1"; shift
  local c="$dir/cases/$name"
  mkdir -p "$c"
  python3 test/Tools/import-hf.test.py "$c/hf" --preset tiny_llama "$@"
  /usr/bin/python3 test/gpu/make_hf_case.py "$c/hf" --tokens "$c/data.tokens" --batch 2 --seq 64
  "$build/bin/bonsai-import-hf" "$c/hf" --batch 2 --seq 64 -o "$c/model.mlir"
  "$build/bin/bonsai-compile" "$c/model.mlir" "$dir/sgd.mlir" -o "$c/train.plan" > /dev/null
  printf '{"batch": 2, "seq": 64}\n' > "$c/case.json"
}
case_dir qwen3 --arch Qwen3ForCausalLM --set model_type='"qwen3"' --set head_dim=32 \
  --set rms_norm_eps=1e-6 --set use_sliding_window=false --set tie_word_embeddings=true
case_dir llama3_rope_scaling --set tie_word_embeddings=true --set rope_theta=500000.0 \
  --set rope_scaling='{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":16}'

# Instruction data: docs/finetune.md's tiny Llama 3 directory and conversations (made by
# finetune-doc.test.py's helpers), tokenized with prompts masked, the model imported packed and
# in fp32; micro-batch 0 holds whole conversations, two or three to a row, in 2 rows of 256.
c="$dir/cases/masked_packed"
mkdir -p "$c"
/usr/bin/python3 - "$c" <<'PY'
import os, sys
sys.path.insert(0, "test/EndToEnd")
import importlib.util
spec = importlib.util.spec_from_file_location("doc", "test/EndToEnd/finetune-doc.test.py")
doc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(doc)
doc.make_model(os.path.join(sys.argv[1], "hf"))
doc.make_data(sys.argv[1])
PY
"$build/bin/bonsai-tokenize" --jsonl "$c/train.jsonl" --tokenizer "$c/hf" -o "$c/data.tokens" 2> /dev/null
"$build/bin/bonsai-import-hf" "$c/hf" --batch 2 --seq 256 --packed -o "$c/model.mlir"
"$build/bin/bonsai-compile" "$c/model.mlir" "$dir/sgd.mlir" -o "$c/train.plan" > /dev/null
printf '{"batch": 2, "seq": 256, "packed": true}\n' > "$c/case.json"

tar -C "$(dirname "$dir")" -cJf "$dir.tar.xz" "$(basename "$dir")"
du -sh "$dir" "$dir.tar.xz"
