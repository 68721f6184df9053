#!/usr/bin/env bash
# test/gpu/sanitize.sh - the CUDA backend under NVIDIA's compute-sanitizer (issue #27, item 2),
# on a GPU machine, from the repository root:
#
#   bash test/gpu/sanitize.sh [DIR] [full|quick|tests|plans] [TOOL...]
#
# DIR is the folder test/gpu/prepare.sh made on the build machine (default .gpu-check/, or its
# .tar.xz pack beside it). Each TOOL (default: all four) runs over
#   - the CUDA unit tests of bonsai-runtime-tests (every CUDA handler against the CPU
#     reference, the GPU training tests), split into gtest shards that run side by side;
#   - 3 training steps of every plan in DIR/plans/sanitize/ (the example recipes on
#     2-layer models of the examples' shapes: docs/reliability.md lists them), with the
#     CUDA Graph path and, for the first plan, without graphs.
# `tests` and `plans` run one of the two halves. The tools: memcheck (out-of-bounds and
# misaligned accesses, device leaks at exit), racecheck (shared-memory hazards), synccheck
# (barrier misuse), initcheck (reads of uninitialised device memory). The whole run does not fit one 10-minute device call: run
# it as three (memcheck synccheck / racecheck / initcheck), as docs/reliability.md shows.
#
# `quick` is the subset to repeat after every kernel change (a few minutes): memcheck and
# racecheck over the kernel-level CUDA tests, and memcheck over one plan's steps.
#
# Every process must end within BONSAI_SANITIZE_SECONDS (default 540) of the start: one that
# cannot is stopped (exit 124) or not started, and counts as a failure. BONSAI_SANITIZE_SHARDS
# sets the gtest shards per tool (default: 14 processes' worth shared among the tools), and
# BONSAI_SANITIZE_SHARD_RANGE=A-B runs shards A..B of them only, BONSAI_SANITIZE_JOBS (default 14)
# processes at a time. BONSAI_SANITIZE_TEST_GROUPS=FILE
# runs one process per line of FILE instead, each line a gtest filter: the tests an earlier run
# did not finish, as test/gpu/rest-of-tests.py groups them from its logs.
# BONSAI_SANITIZE_PLAN=TEXT keeps only the plans whose name contains TEXT, and
# BONSAI_SANITIZE_KERNEL_FAMILIES=FILE checks each plan's kernels one family at a time: one
# process per line of FILE (a kernel-name substring, `--kernel-name kns=LINE`; # starts a
# comment), for a plan the tool cannot take whole within the time (test/gpu/kernel-families.txt
# lists those of the example plans: docs/reliability.md, seventeenth round).
# BONSAI_SANITIZE_EXCLUDE=NAME[,NAME...] leaves the kernels whose names contain a NAME
# uninstrumented in the plans' runs (`--kernel-name-exclude kns=NAME`): synccheck cannot take
# cuBLASLt's nvjet GEMMs at GPT-2 124M's sizes within a call, while the rest of that plan passes
# it in seconds (docs/reliability.md, eighteenth round: BONSAI_SANITIZE_EXCLUDE=nvjet).
# Writes sanitize-summary.txt (one line per process: errors, exit status, wall time) and
# sanitize-logs.tar.xz (every process's output, the tools' reports in it after the test that
# caused them) under $OUT. Exits non-zero when any tool reports an error or a run fails.
set -uo pipefail
dir="${1:-.gpu-check}"
mode="${2:-full}"
shift 2 2>/dev/null || shift $#
out="${OUT:-/tmp/bonsai-out}"
mkdir -p "$out"
[ -d "$dir" ] || tar -xJf "$dir.tar.xz"
bin="$dir/bin-sm90a"
export LD_LIBRARY_PATH="$PWD/$dir/lib:${LD_LIBRARY_PATH:-}"
# The GPU training tests run bonsai-run and read their inputs by the build machine's paths.
root="$(cat "$dir/build_root.txt")"
mkdir -p "$root/build-sm90a/bin"
cp "$bin/bonsai-run" "$root/build-sm90a/bin/"
if [ "$root" != "$PWD" ]; then
  mkdir -p "$root/test/runtime"
  ln -sfn "$PWD/test/runtime/Inputs" "$root/test/runtime/Inputs"
fi
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
[ -x "$sanitizer" ] || { echo "sanitize: compute-sanitizer not found" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
"$sanitizer" --version | tail -1 | tee -a "$out/gpu.txt"

# The filter of the CUDA unit tests, and the shards each tool's pass over them is split into
# (the tools slow kernels down 10-100x; shards of one tool, and the tools, run at once).
# The timing tests (Perf*, Timing*) are left out: they measure the kernels that the
# correctness tests check, at sizes that take the tools hours.
all_tests='*Cuda*:*OnTheGpu*:*Gpu*-*.Perf*:*.Timing*'
kernel_tests='Cuda*-*.Perf*:*.Timing*'
jobs="${BONSAI_SANITIZE_JOBS:-14}"
logs=/tmp/bonsai-sanitize
rm -rf "$logs" && mkdir -p "$logs"
tools=(memcheck racecheck synccheck initcheck)
[ $# -gt 0 ] && tools=("$@")
for tool in "${tools[@]}"; do
  case "$tool" in
    memcheck | racecheck | synccheck | initcheck) ;;
    *) echo "sanitize: no tool '$tool' (memcheck, racecheck, synccheck, initcheck)" >&2; exit 2 ;;
  esac
done
tests="$all_tests"
plans=("$dir"/plans/sanitize/*.plan)
case "$mode" in
  full) ;;
  tests) plans=() ;;
  plans) tests="" ;;
  quick)
    [ $# -gt 0 ] || tools=(memcheck racecheck)
    tests="$kernel_tests"
    plans=("${plans[0]}") ;;
  *) echo "sanitize: the mode is full, quick, tests or plans, not '$mode'" >&2; exit 2 ;;
esac
if [ -n "${BONSAI_SANITIZE_PLAN:-}" ]; then
  kept=()
  for plan in ${plans[@]+"${plans[@]}"}; do
    [[ "$(basename "$plan" .plan)" == *"$BONSAI_SANITIZE_PLAN"* ]] && kept+=("$plan")
  done
  plans=(${kept[@]+"${kept[@]}"})
  if [ ${#plans[@]} = 0 ]; then
    echo "sanitize: BONSAI_SANITIZE_PLAN: no plan of this mode in $dir/plans/sanitize/ has" \
      "'$BONSAI_SANITIZE_PLAN' in its name" >&2
    exit 2
  fi
fi
shards="${BONSAI_SANITIZE_SHARDS:-$(( (jobs + ${#tools[@]} - 1) / ${#tools[@]} ))}"
# BONSAI_SANITIZE_SHARD_RANGE=A-B runs only shards A..B of each tool's pass over the tests, so
# that a pass longer than one device call (racecheck's) can be split over several calls.
range="${BONSAI_SANITIZE_SHARD_RANGE:-0-$((shards - 1))}"
first_shard="${range%-*}"
last_shard="${range#*-}"
if ! [[ "$first_shard" =~ ^[0-9]+$ && "$last_shard" =~ ^[0-9]+$ ]] ||
  [ "$first_shard" -gt "$last_shard" ] || [ "$last_shard" -ge "$shards" ]; then
  echo "sanitize: BONSAI_SANITIZE_SHARD_RANGE is A-B with A <= B < $shards shards, not '$range'" >&2
  exit 2
fi

# Tool options (docs/reliability.md says why): memcheck also checks for device allocations
# never freed. initcheck runs with BONSAI_ZERO_GEMM_OUTPUTS=1 (runtime/cuda/Gemm.cpp): it does
# not see the TMA stores of cuBLASLt's Hopper GEMMs, and the memset before each GEMM is an
# initialisation it does see. racecheck instruments every kernel, cuBLASLt's too (leaving
# them out makes the tool fail on a hardware exception); the hazards it reports between two
# accesses inside cuBLASLt's own kernels (nvjet_*, cublasLt::*), closed code that synchronises
# through mbarriers the tool does not model, are listed apart and not counted. Telling them
# apart needs every report printed: racecheck prints all (a plan's steps give up to ~200), and a
# report the tool counted but did not print counts as an error. The other tools' summaries
# count every error, printed or not. The reports go to the process's stdout, so that each
# follows the test that caused it.
options() {
  case "$1" in
    memcheck) echo "--tool memcheck --leak-check full --error-exitcode 99" ;;
    racecheck) echo "--tool racecheck --print-limit 100000" ;;
    synccheck) echo "--tool synccheck --error-exitcode 99" ;;
    initcheck) echo "--tool initcheck --error-exitcode 99" ;;
  esac
}

# errors TOOL LOG: the errors a process's log counts, and for racecheck after them the
# hazards inside cuBLASLt that are not counted.
errors() {
  if [ "$1" = racecheck ]; then
    awk '/Error: Race reported between/ { first = $0; getline
           if (first ~ /(nvjet_|cublas)/ && $0 ~ /(nvjet_|cublas)/) lib++; else own++ }
         /Internal Sanitizer Error/ { own++ }
         /RACECHECK SUMMARY: [0-9]+ hazards displayed/ {
           shown = $4 + 0; counted = substr($7, 2) + 0; if (counted > shown) own += counted - shown }
         END { print own + 0, lib + 0 }' "$2"
  else
    grep -o 'ERROR SUMMARY: [0-9]* error' "$2" | awk '{s += $3} END {print s + 0}'
  fi
}

# run NAME TOOL [VAR=VALUE...] COMMAND...: one sanitized process (and the bonsai-run processes
# a test starts: the tools follow children), its logs (one per process) and a summary line.
run() {
  local name="$1" tool="$2" start rc counts left
  shift 2
  while [[ "$1" == *=* ]]; do export "${1?}"; shift; done # the gtest shard
  start=$(date +%s)
  left=$((deadline - start))
  if [ "$left" -lt 30 ]; then
    printf '%-44s %-10s not run: the time limit came first\n' "$name" "$tool" >> "$logs/summary.txt"
    return
  fi
  [ "$tool" = initcheck ] && export BONSAI_ZERO_GEMM_OUTPUTS=1
  # shellcheck disable=SC2046
  timeout "$left" "$sanitizer" $(options "$tool") "$@" > "$logs/$name.log" 2>&1
  rc=$?
  read -r -a counts <<< "$(errors "$tool" "$logs/$name.log")"
  printf '%-44s %-10s errors %-4s exit %-3s %4ss%s\n' "$name" "$tool" "${counts[0]}" "$rc" \
    "$(( $(date +%s) - start ))" \
    "$([ "${counts[1]:-0}" -gt 0 ] && echo "  (cuBLASLt-internal hazards, not counted: ${counts[1]})")" \
    >> "$logs/summary.txt"
}

# racecheck keeps about 35 GiB of host memory per bonsai-run process over the example plans
# (measured on the H100 machine: 16 at once ran its 125 GiB out and the kernel killed 7 of
# them): with plans under racecheck, as many processes at a time as 40 GiB each allows.
if [[ " ${tools[*]} " == *" racecheck "* ]] && [ ${#plans[@]} -gt 0 ]; then
  mem_gib=$(awk '/^MemTotal:/ { print int($2 / 1048576) }' /proc/meminfo)
  fit=$((mem_gib / 40 > 0 ? mem_gib / 40 : 1))
  if [ "$fit" -lt "$jobs" ]; then
    echo "sanitize: racecheck over plans: at most $fit at a time (${mem_gib} GiB of host memory)"
    jobs=$fit
  fi
fi

# One line per sanitized process: NAME TOOL COMMAND...; at most $jobs at a time (each tool
# process also works on the host: 16 cores here).
list="$logs/jobs.txt"
: > "$list"
groups="${BONSAI_SANITIZE_TEST_GROUPS:-}"
if [ -n "$groups" ]; then
  if [ ! -f "$groups" ]; then
    echo "sanitize: BONSAI_SANITIZE_TEST_GROUPS: no file '$groups'" >&2
    exit 2
  fi
  n=0
  while read -r filter; do
    [ -n "$filter" ] || continue
    for tool in "${tools[@]}"; do
      echo "tests-$tool-group$n $tool $bin/bonsai-runtime-tests --gtest_filter=$filter" >> "$list"
    done
    n=$((n + 1))
  done < "$groups"
  tests="" # the groups replace the shards
fi
for ((s = first_shard; s <= last_shard && ${#tests} > 0; s++)); do
  for tool in "${tools[@]}"; do
    echo "tests-$tool-$s $tool GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$s" \
      "$bin/bonsai-runtime-tests --gtest_filter=$tests" >> "$list"
  done
done
families=()
if [ -n "${BONSAI_SANITIZE_KERNEL_FAMILIES:-}" ]; then
  if [ ! -f "$BONSAI_SANITIZE_KERNEL_FAMILIES" ]; then
    echo "sanitize: BONSAI_SANITIZE_KERNEL_FAMILIES: no file '$BONSAI_SANITIZE_KERNEL_FAMILIES'" >&2
    exit 2
  fi
  while read -r family _; do
    [[ -z "$family" || "$family" == \#* ]] || families+=("$family")
  done < "$BONSAI_SANITIZE_KERNEL_FAMILIES"
fi
exclude=""
suffix=""
if [ -n "${BONSAI_SANITIZE_EXCLUDE:-}" ]; then
  for family in ${BONSAI_SANITIZE_EXCLUDE//,/ }; do
    if ! [[ "$family" =~ ^[A-Za-z0-9_:]+$ ]]; then
      echo "sanitize: BONSAI_SANITIZE_EXCLUDE: '$family' is not a kernel-name substring" \
        "(letters, digits, _ and :)" >&2
      exit 2
    fi
    exclude+=" --kernel-name-exclude kns=$family"
    suffix+="-without-$family"
  done
fi
first=1
for plan in ${plans[@]+"${plans[@]}"}; do
  name="$(basename "$plan" .plan)$suffix"
  for tool in "${tools[@]}"; do
    if [ ${#families[@]} -gt 0 ]; then
      for family in "${families[@]}"; do
        echo "plan-$name-$family-$tool $tool --kernel-name kns=$family$exclude" \
          "$bin/bonsai-run $plan --backend cuda --steps 3" >> "$list"
      done
      continue
    fi
    echo "plan-$name-$tool $tool$exclude $bin/bonsai-run $plan --backend cuda --steps 3" >> "$list"
    if [ $first = 1 ]; then
      echo "plan-$name-nographs-$tool $tool$exclude $bin/bonsai-run $plan --backend cuda" \
        "--steps 3 --no-cuda-graphs" >> "$list"
    fi
  done
  first=0
done
if [ -n "$groups" ]; then
  what="tests in the $n groups of $groups"
else
  what="tests '${tests:-none}' in $shards shards (running $first_shard-$last_shard)"
fi
echo "== compute-sanitizer ($mode): ${tools[*]}; $what;" \
  "${#plans[@]} plan(s); $(wc -l < "$list") processes, $jobs at a time =="
: > "$logs/summary.txt"
export -f run options errors
start=$(date +%s)
deadline=$((start + ${BONSAI_SANITIZE_SECONDS:-540}))
export sanitizer logs deadline
xargs -r -P "$jobs" -L 1 bash -c 'run "$@"' _ < "$list"
# A process that `timeout` stopped may leave its target (bonsai-run, the tests) running on the
# GPU and the host cores, slowing whatever the same device call runs next (a 7B step measured
# 4.2 s after two such runs, 2.2 s alone: docs/benchmarks.md): none of this run's may outlive it.
# (The pattern covers bonsai-run and bonsai-runtime-tests, and the copy the tests start.)
pkill -KILL -f "^$bin/bonsai-run" 2>/dev/null
pkill -KILL -f "^$root/build-sm90a/bin/bonsai-run" 2>/dev/null
sort -o "$logs/summary.txt" "$logs/summary.txt"
echo "wall time $(( $(date +%s) - start )) s" >> "$logs/summary.txt"
cp "$logs/summary.txt" "$out/sanitize-summary.txt"
cat "$out/sanitize-summary.txt"
# The tests' own verdicts (a sanitized run must still pass).
grep -h '^\[  PASSED\|^\[  FAILED' "$logs"/tests-*.log 2>/dev/null | sed 's/([0-9]* ms)//' |
  sort | uniq -c
tar -C "$logs" -cJf "$out/sanitize-logs.tar.xz" .
failed=$(grep -c ' errors [1-9]\| exit [1-9]\|not run' "$logs/summary.txt")
echo "sanitize: $failed of $(wc -l < "$list") runs with errors or a failure"
[ "$failed" = 0 ]
