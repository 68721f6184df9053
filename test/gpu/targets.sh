#!/usr/bin/env bash
# test/gpu/targets.sh - the Ampere and Ada code paths on a Hopper GPU (issue #27, item 6), in
# one command on a GPU machine, from the repository root:
#
#   bash test/gpu/targets.sh [DIR]
#
# DIR is the folder test/gpu/prepare.sh made (default .gpu-check/, or its .tar.xz pack). The
# builds whose device code is PTX for compute_80 and compute_89 only (the driver compiles it
# for the GPU at load: the mma.sync attention kernels, no warpgroup MMA, no FP8 conversions
# below compute_89) run
#   1. the CUDA unit tests of bonsai-runtime-tests;
#   2. test/gpu/hf_parity.py: the tiny Llama and GPT-2, plans compiled for their architecture,
#      gradients and 50 AdamW steps against Hugging Face's models;
# and then 3. one recipe compiled for sm_80, sm_86, sm_89 and sm_90 trains 20 steps with each
# plan on the build of its architecture (sm_86: the compute_80 build, what an sm_86 GPU runs
# from the same source), and the losses are compared:
#   tiny Llama, f32 (tiny_train.mlir)      every pair within 1e-5 relative;
#   2-layer Llama-3-shaped, bf16 (fp8.mlir)  sm_80 against sm_86 (bf16 both) and sm_89 against
#                                           sm_90 (FP8 both) within 2e-3 relative, FP8 against
#                                           bf16 within 1e-2 (docs/fp8.md's 1%).
# Writes logs and targets-summary.txt under $OUT; exits non-zero on any failure.
# BONSAI_TARGETS_STAGES picks the stages (default "tests parity losses"), so that each can have
# a device call of its own: the driver compiles each build's PTX again in a fresh machine.
set -uo pipefail
dir="${1:-.gpu-check}"
out="${OUT:-/tmp/bonsai-out}"
mkdir -p "$out"
[ -d "$dir" ] || tar -xJf "$dir.tar.xz"
export LD_LIBRARY_PATH="$PWD/$dir/lib:${LD_LIBRARY_PATH:-}"
# The PTX is compiled once per kernel by the driver; keep every kernel's result for the next
# process (the default cache, 256 MiB, would evict them).
export CUDA_CACHE_PATH=/tmp/bonsai-ptx-cache CUDA_CACHE_MAXSIZE=4294967296
root="$(cat "$dir/build_root.txt")"
summary="$out/targets-summary.txt"
: > "$summary"
failures=0
stages=" ${BONSAI_TARGETS_STAGES:-tests parity losses} "
for stage in $stages; do
  case $stage in
    tests | parity | losses) ;;
    *) echo "targets: unknown stage '$stage' in BONSAI_TARGETS_STAGES (tests, parity, losses)" >&2
       exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

# The GPU training tests of each build run bonsai-run from that build's directory.
for b in ptx80 ptx89 sm90a; do
  mkdir -p "$root/build-$b/bin"
  cp "$dir/bin-$b/bonsai-run" "$root/build-$b/bin/"
done
if [ "$root" != "$PWD" ]; then
  mkdir -p "$root/test/runtime"
  ln -sfn "$PWD/test/runtime/Inputs" "$root/test/runtime/Inputs"
fi

for build in ptx80 ptx89; do
  [[ $stages == *" tests "* ]] || break
  echo "== $build: CUDA tests =="
  start=$(date +%s)
  "$dir/bin-$build/bonsai-runtime-tests" --gtest_filter='*Cuda*:*OnTheGpu*:*Gpu*' \
    > "$out/tests-$build.log" 2>&1
  rc=$?
  line="$(grep -E '^\[  PASSED|^\[  FAILED' "$out/tests-$build.log" | head -1)"
  echo "$build CUDA tests: ${line:-no summary} (exit $rc, $(( $(date +%s) - start )) s)" |
    tee -a "$summary"
  grep -E '^\[  FAILED' "$out/tests-$build.log" | head -20
  [ $rc = 0 ] || failures=$((failures + 1))
done

for pair in ptx80:sm_80 ptx89:sm_89 sm90a:sm_90; do
  [[ $stages == *" parity "* ]] || break
  build="${pair%%:*}" arch="${pair#*:}"
  echo "== $build: Hugging Face parity, plans for $arch =="
  python3 test/gpu/hf_parity.py --bonsai-run "$dir/bin-$build/bonsai-run" \
    --cases "$dir/cases-$arch" > "$out/hf_parity-$build.log" 2>&1
  rc=$?
  tail -4 "$out/hf_parity-$build.log"
  echo "$build hf_parity ($arch plans): exit $rc" >> "$summary"
  [ $rc = 0 ] || failures=$((failures + 1))
done

if [[ $stages != *" losses "* ]]; then
  cat "$summary"
  echo "targets: $failures failure(s)"
  exit $((failures > 0))
fi
echo "== one recipe, four targets: 20 steps each =="
for family in tiny_llama llama3_small_fp8; do
  for pair in sm_80:ptx80 sm_86:ptx80 sm_89:ptx89 sm_90:sm90a; do
    arch="${pair%%:*}" build="${pair#*:}" start=$(date +%s)
    "$dir/bin-$build/bonsai-run" "$dir/plans/targets/$family-$arch.plan" --backend cuda \
      --steps 20 --metrics "$out/$family-$arch.jsonl" > "$out/$family-$arch.log" 2>&1 ||
      { echo "$family $arch: bonsai-run failed"; tail -3 "$out/$family-$arch.log";
        failures=$((failures + 1)); }
    echo "$family $arch ($build build): $(( $(date +%s) - start )) s"
  done
done
python3 - "$out" >> "$summary" <<'EOF' || failures=$((failures + 1))
import json, sys, os
out = sys.argv[1]
def losses(name):
    path = os.path.join(out, name + ".jsonl")
    if not os.path.exists(path):
        return None
    return [r["loss"] for r in map(json.loads, open(path)) if "loss" in r and "step" in r]
ok = True
checks = [("tiny_llama", [("sm_80", "sm_86"), ("sm_80", "sm_89"), ("sm_80", "sm_90"),
                          ("sm_86", "sm_89"), ("sm_86", "sm_90"), ("sm_89", "sm_90")], 1e-5),
          ("llama3_small_fp8", [("sm_80", "sm_86"), ("sm_89", "sm_90")], 2e-3),
          ("llama3_small_fp8", [("sm_80", "sm_89"), ("sm_80", "sm_90"), ("sm_86", "sm_89"),
                                ("sm_86", "sm_90")], 1e-2)]
for family, pairs, tol in checks:
    for a, b in pairs:
        la, lb = losses(family + "-" + a), losses(family + "-" + b)
        if not la or not lb or len(la) != len(lb):
            print("%s %s vs %s: losses missing" % (family, a, b)); ok = False; continue
        worst = max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(la, lb))
        good = worst <= tol
        ok &= good
        print("%-18s %s vs %s: %d steps, last loss %.6f / %.6f, largest relative difference "
              "%.2e (tolerance %.0e, margin %.1fx) %s" % (family, a, b, len(la), la[-1], lb[-1],
              worst, tol, tol / worst if worst else float("inf"), "ok" if good else "FAIL"))
sys.exit(0 if ok else 1)
EOF
cat "$summary"
echo "targets: $failures failure(s)"
[ $failures = 0 ]
