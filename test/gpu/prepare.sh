#!/usr/bin/env bash
# test/gpu/prepare.sh - prepare, on the build machine, what the GPU checks of issue #27 need on
# a GPU machine: test/gpu/sanitize.sh (compute-sanitizer over the CUDA tests and the example
# plans) and test/gpu/targets.sh (the Ampere and Ada code paths, run from PTX on a Hopper GPU).
#
#   test/gpu/prepare.sh [DIR]        # default .gpu-check/ (ignored by git) and DIR.tar.xz
#
# Builds (each only when missing or stale):
#   $BONSAI_BUILD_DIR (default build/)  the main build (all of it when not configured yet,
#                                       else only bonsai-compile);
#   build-sm90a/, build-ptx80/,         the runtime alone (no MLIR), each with one kind of
#   build-ptx89/                        device code: sm_90a machine code (what the H200 runs
#                                       from a default build), or PTX for compute_80 /
#                                       compute_89 only, so that a Hopper GPU's driver compiles
#                                       the Ampere and Ada code paths (mma.sync attention, no
#                                       warpgroup MMA; no FP8 conversions below 89). One
#                                       architecture each keeps the pack under a device call's
#                                       64 MiB. BONSAI_PREPARE_BUILDS="sm90a" builds and packs
#                                       only the first (enough for test/gpu/sanitize.sh).
# Compiles the plans (the GPU machine has no MLIR):
#   plans/sanitize/   every example recipe on a 2-layer model of its example's shape;
#   plans/targets/    one recipe compiled for sm_80, sm_86, sm_89 and sm_90, twice: the tiny
#                     Llama in f32 (examples/recipes/tiny_train.mlir) and a 2-layer bf16 Llama
#                     with Llama 3's heads (GQA 8/2, head dim 128) under examples/recipes/fp8.mlir
#                     (FP8 on sm_89 and sm_90; bf16 on sm_80 and sm_86);
#   cases-sm_XX/      the tiny models' Hugging Face parity cases (test/gpu/hf_parity.py), plans
#                     for sm_80, sm_89 and sm_90.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-.gpu-check}"
build="${BONSAI_BUILD_DIR:-build}"
jobs="${BONSAI_JOBS:-$(nproc)}"
# Of the main build only the compiler is needed here (the plans); the runtime builds below.
if [ -f "$build/build.ninja" ]; then
  ninja -C "$build" -j "$jobs" bonsai-compile
else
  scripts/build.sh
fi
builds="${BONSAI_PREPARE_BUILDS:-sm90a ptx80 ptx89}"
for pair in sm90a:90a-real ptx80:80-virtual ptx89:89-virtual; do
  [[ " $builds " == *" ${pair%%:*} "* ]] || continue
  b="build-${pair%%:*}"
  if [ ! -f "$b/build.ninja" ]; then
    cmake -G Ninja -S runtime -B "$b" -DCMAKE_BUILD_TYPE=Release \
      -DBONSAI_CUDA_ARCHS="${pair#*:}" > /dev/null
  fi
  ninja -C "$b" -j "$jobs" bonsai-run bonsai-runtime-tests
  grep -q "BONSAI_HAVE_CUDA=1" "$b/build.ninja" ||
    { echo "prepare: $b has no CUDA backend (is nvcc at /usr/local/cuda?)" >&2; exit 1; }
done

rm -rf "$dir" && mkdir -p "$dir/lib" "$dir/plans/sanitize" "$dir/plans/targets"
# The host optimizer step's benchmark (bench/host_adamw_bench.py) goes along: a static binary.
ninja -C build-sm90a -j "$jobs" host_adamw_bench
for b in $builds; do
  mkdir -p "$dir/bin-$b"
  for tool in bonsai-run bonsai-runtime-tests; do
    strip -o "$dir/bin-$b/$tool" "build-$b/bin/$tool"
  done
done
strip -o "$dir/bin-sm90a/host_adamw_bench" build-sm90a/bin/host_adamw_bench
# The probe that shows initcheck does not see cuBLASLt's stores (docs/reliability.md).
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90a -std=c++17 -o "$dir/bin-sm90a/initcheck-cublaslt" \
  test/gpu/probes/initcheck_cublaslt.cu -lcublasLt
# The probe of synccheck inside a conditional graph body (docs/reliability.md, fifth round).
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90a -std=c++17 -o "$dir/bin-sm90a/synccheck-conditional" \
  test/gpu/probes/synccheck_conditional.cu
. bench/gpu_libs.sh
copy_gpu_libs "$dir/lib"
compile="$build/bin/bonsai-compile"
models="$dir/models"
mkdir -p "$models"

# model NAME BASE KEY=VALUE...: a variant of an example model (scripts/gen_models.py --set).
model() {
  local name="$1" base="$2"
  shift 2
  python3 scripts/gen_models.py --print "$base" "${@/#/--set=}" > "$models/$name.mlir"
}

# The sanitizer's plans: each example recipe on two layers of its example model, short rows
# (Llama 3 with a 32000-word vocabulary: four tools at once must fit in the GPU).
# The recipes' own targets and budgets are replaced by the H200's (--target=h200).
model tiny_llama tiny_llama
model tiny_gpt2 tiny_gpt2
model llama_124m llama_124m layers=2 seq=512 batch=2
model gpt2_124m gpt2_124m layers=2 seq=512 batch=2
model tinyllama_1_1b tinyllama_1_1b layers=2 seq=256 batch=2
model llama2_7b llama2_7b layers=2 seq=256 batch=1
model llama3_8b llama3_8b layers=2 seq=256 batch=1 vocab=32000
printf 'bonsai.recipe @adamw {\n  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64}\n}\n' \
  > "$models/adamw.mlir"
# The same with the optimizer state in pinned host memory (docs/offload.md): the copy kinds.
printf 'bonsai.recipe @offload {\n  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64}\n  bonsai.offload ["optimizer_state"]\n}\n' \
  > "$models/offload.mlir"
# The optimizer step on the host (update "host", docs/offload.md): the host stream's functions.
printf 'bonsai.recipe @offload_host {\n  bonsai.optimizer "adamw" lr 3.000000e-04 {weight_decay = 1.000000e-02 : f64, update_in_backward = true}\n  bonsai.offload ["optimizer_state", "master_weights"] update "host"\n}\n' \
  > "$models/offload_host.mlir"
for pair in tiny_llama:examples/recipes/tiny_train.mlir tiny_gpt2:examples/recipes/tiny_train.mlir \
    tiny_llama:examples/recipes/lora_tiny.mlir llama_124m:"$models/adamw.mlir" \
    gpt2_124m:"$models/adamw.mlir" llama_124m:"$models/offload.mlir" \
    llama_124m:"$models/offload_host.mlir" \
    llama_124m:examples/recipes/remat.mlir \
    llama2_7b:examples/recipes/qlora.mlir llama2_7b:examples/recipes/lora_7b.mlir \
    tinyllama_1_1b:examples/recipes/dora.mlir tinyllama_1_1b:examples/recipes/galore.mlir \
    llama3_8b:examples/recipes/fp8.mlir; do
  m="${pair%%:*}" recipe="${pair#*:}"
  name="${m}_$(basename "$recipe" .mlir)"
  "$compile" "$models/$m.mlir" "$recipe" --target=h200 -o "$dir/plans/sanitize/$name.plan" \
    > "$dir/plans/sanitize/$name.txt" 2>&1
done

# One recipe, four targets.
model llama3_small llama3_8b layers=2 hidden=1024 heads=8 kv_heads=2 intermediate=2816 \
  vocab=32000 seq=512 batch=2
for arch in sm_80 sm_86 sm_89 sm_90; do
  "$compile" "$models/tiny_llama.mlir" examples/recipes/tiny_train.mlir --target=$arch \
    -o "$dir/plans/targets/tiny_llama-$arch.plan" > "$dir/plans/targets/tiny_llama-$arch.txt" 2>&1
  "$compile" "$models/llama3_small.mlir" examples/recipes/fp8.mlir --target=$arch \
    -o "$dir/plans/targets/llama3_small_fp8-$arch.plan" \
    > "$dir/plans/targets/llama3_small_fp8-$arch.txt" 2>&1
done

# Parity with Hugging Face (test/gpu/hf_parity.py): fp32 tiny models, AdamW lr 1e-3, for each
# build's architecture.
printf 'bonsai.recipe @parity {\n  bonsai.optimizer "adamw" lr 1.000000e-03\n}\n' > "$models/parity.mlir"
mkdir -p "$dir/cases-sm_90"
for model in tiny_llama tiny_gpt2; do
  /usr/bin/python3 test/reference/make_case.py --model "$model" --out "$dir/cases-sm_90" > /dev/null
done
for arch in sm_80 sm_89 sm_90; do
  mkdir -p "$dir/cases-$arch"
  [ $arch = sm_90 ] || cp "$dir/cases-sm_90"/*.safetensors "$dir/cases-sm_90"/*.tokens "$dir/cases-$arch/"
  for model in tiny_llama tiny_gpt2; do
    "$compile" "examples/models/$model.mlir" "$models/parity.mlir" --target=$arch \
      -o "$dir/cases-$arch/${model}_train.plan" > /dev/null 2>&1
  done
done

# Where the GPU training tests look for bonsai-run (build-*/bin/) and their inputs: the paths
# compiled into bonsai-runtime-tests.
printf '%s\n' "$PWD" > "$dir/build_root.txt"
tar cf - "$dir" | xz -T0 -6 > "$dir.tar.xz"
du -sh "$dir" "$dir.tar.xz"
