#!/usr/bin/env bash
# bench/runtime_h200.sh - issue #22's GPU check, in one command on a GPU machine, from the
# repository root: the CUDA unit tests (every handler of the CUDA backend against the CPU
# reference), the GPU tests of bonsai-run --lr, and both 124M training benchmarks next to
# PyTorch eager and torch.compile.
#
# Expects the folder bench/prepare_runtime_run.sh made (default .gpu-runtime/, or its .tar.xz
# pack beside it). Writes logs under $OUT.
set -uo pipefail
dir="${1:-.gpu-runtime}"
parts="${2:-tests,bench}" # a second argument picks parts: tests, bench
out="${OUT:-/tmp/bonsai-out}"
mkdir -p "$out"
[ -d "$dir" ] || tar -xJf "$dir.tar.xz"
export LD_LIBRARY_PATH="$PWD/$dir/lib:${LD_LIBRARY_PATH:-}"
# The tests name bonsai-run and their inputs by the build machine's absolute paths.
root="$(cat "$dir/build_root.txt")"
build="$(cat "$dir/build_dir.txt")"
mkdir -p "$root/$build/bin"
cp "$dir/bin/bonsai-run" "$root/$build/bin/"
if [ "$root" != "$PWD" ]; then
  mkdir -p "$root/test/runtime"
  ln -sfn "$PWD/test/runtime/Inputs" "$root/test/runtime/Inputs"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

if [[ ",$parts," == *,tests,* ]]; then
  echo "== CUDA tests and the GPU tests of --lr =="
  "$dir/bin/bonsai-runtime-tests" --gtest_filter='GeneratedKernelsTest.*:*Cuda*:*OnTheGpu*:*Gpu*' 2>&1 |
    tee "$out/cuda_tests.log" | grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED' | head -40
fi

if [[ ",$parts," == *,bench,* ]]; then
  for model in llama_124m gpt2_124m; do
    echo "== benchmark $model =="
    python3 bench/train_bench.py --model $model --plan "$dir/plans/${model}_train.plan" \
      --bonsai-run "$PWD/$dir/bin/bonsai-run" --steps 20 --warmup 5 --workdir "$out" 2>&1 |
      tee "$out/bench_$model.log" | tail -8
  done
fi
