#!/usr/bin/env bash
# test/gpu/ring-one-gpu.sh (packed by test/gpu/prepare-shard.sh as .gpu-shard/ring.sh), on the
# GPU machine: ring attention's CUDA side on one GPU (docs/ring-attention.md, "On CUDA"):
# the block steps of N virtual ranks in turn and the ring of N virtual ranks on threads against
# the unpartitioned attention, the flash kernels' own tests (their keys may now be another
# rank's), and the block kernels timed against the unpartitioned kernels and SDPA flash at
# Llama-3-8B's heads, 64k tokens per rank; then the ring tests under memcheck and racecheck.
#
#   bash .gpu-shard/ring.sh [tests|sanitize]   # both when no argument
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
mode="${1:-all}"
nvidia-smi -L
if [ "$mode" != sanitize ]; then
echo "== ring attention and attention kernel tests"
timeout 240 bin/bonsai-runtime-tests \
  --gtest_filter='CudaRingAttention*:CudaAttention*:RingContract*' 2>&1 |
  grep -v "^\[       OK\|^\[ RUN" | tail -40
echo "== ring attention's block kernels against the unpartitioned ones"
timeout 300 python3 ring_attention_bench.py --bin bin/ring_attention_bench --reps 3
fi
[ "$mode" = tests ] && exit 0
echo "== the ring tests under compute-sanitizer (memcheck, racecheck)"
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
for tool in memcheck racecheck; do
  timeout 150 "$sanitizer" --tool "$tool" --error-exitcode 3 bin/bonsai-runtime-tests \
    --gtest_filter='CudaRingAttention*' > "${OUT:-/tmp}/sanitize-ring-$tool.log" 2>&1
  echo "$tool: exit $?; $(grep -c "^=========.*rror" "${OUT:-/tmp}/sanitize-ring-$tool.log") error lines; $(grep "ERROR SUMMARY\|RACECHECK SUMMARY" "${OUT:-/tmp}/sanitize-ring-$tool.log" | tail -1)"
done
