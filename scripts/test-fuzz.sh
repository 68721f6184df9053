#!/usr/bin/env bash
# scripts/test-fuzz.sh - build the libFuzzer targets and run each of them (docs/fuzzing.md).
#
#   scripts/test-fuzz.sh          the bounded run of CI: each target replays its regression
#                                 inputs (test/fuzz/regressions/<target>/), then fuzzes for
#                                 BONSAI_FUZZ_SECONDS seconds (default 15) from the seed corpus
#   scripts/test-fuzz.sh --long   the long run: 1,000,000 executions per target (after the
#                                 replay), BONSAI_FUZZ_RUNS to change it
#   ... [TARGET...]               only these targets (plan, safetensors, safetensors-index,
#                                 token-file, checkpoint-manifest, bonsai-ir, hf-config)
#
# The targets run BONSAI_JOBS at a time (default: one per core), each for its own budget.
#
# Builds with clang-22 in build-fuzz/ (or $BONSAI_FUZZ_BUILD_DIR): the whole project configured
# with BONSAI_BUILD_FUZZERS, of which only the fuzzers and what they link are built. The seed
# corpus is generated (bonsai-fuzz-seeds, the HF test's config writer) and the examples' and
# dialect tests' IR; each target's corpus grows in build-fuzz/fuzz-corpus/<target>. Any crash,
# input slower than 10 s, memory above 2 GiB or sanitizer report fails the script, with the
# input left in build-fuzz/fuzz-artifacts/ (add it to the regression inputs once fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
src="$PWD"
build="${BONSAI_FUZZ_BUILD_DIR:-build-fuzz}"
jobs="${BONSAI_JOBS:-$(nproc)}"
mode=bounded
if [ "${1:-}" = "--long" ]; then
  mode=long
  shift
fi

if [ ! -f "$build/build.ninja" ]; then
  # -O1 with assertions on (no NDEBUG): an assert is a finding too. The CUDA backend is left
  # out, as in the ASan build: nvcc does not take the sanitizer flags.
  # No precompiled headers (cmake/PrecompiledHeaders.cmake): this build also checks that the
  # dialects and the importer include what they use.
  cmake -G Ninja -S . -B "$build" -DBONSAI_BUILD_FUZZERS=ON -DBONSAI_ENABLE_CUDA=OFF \
    -DBONSAI_PRECOMPILED_HEADERS=OFF \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only"
fi
ninja -C "$build" -j "$jobs" bonsai-fuzzers
build="$(cd "$build" && pwd)"

# The seed corpus, made afresh from the tests' inputs.
seeds="$build/fuzz-seeds"
rm -rf "$seeds"
"$build/bin/bonsai-fuzz-seeds" "$seeds"
mkdir -p "$seeds/bonsai-ir" "$seeds/hf-config"
# Models and recipes, and the dialect tests split at their `// -----` markers.
cp examples/models/*.mlir examples/recipes/*.mlir "$seeds/bonsai-ir/"
for file in test/Dialect/*/*.mlir; do
  awk -v out="$seeds/bonsai-ir/$(basename "$(dirname "$file")")-$(basename "$file" .mlir)" \
    '/^\/\/ -----/ { n++; next } { print > (out "-" n+0 ".mlir") }' "$file"
done
# config.json of each family the importer supports, as the importer's lit test writes them.
hf="$build/fuzz-hf-seeds"
rm -rf "$hf"
while read -r name args; do
  # shellcheck disable=SC2086 # the arguments are words
  python3 test/Tools/import-hf.test.py "$hf/$name" $args
  cp "$hf/$name/config.json" "$seeds/hf-config/$name.json"
done <<'PRESETS'
llama --preset tiny_llama
llama31 --preset tiny_llama --set rope_scaling={"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":32}
mistral --preset tiny_llama --arch MistralForCausalLM --set sliding_window=64
qwen2 --preset tiny_llama --arch Qwen2ForCausalLM
qwen3 --preset tiny_llama --arch Qwen3ForCausalLM --set head_dim=32
gpt2 --preset tiny_gpt2
PRESETS
rm -rf "$hf"

# target:max_len. Plans and IR are the largest inputs the seeds hold; the rest is headers.
all=(plan:16384 safetensors:4096 safetensors-index:4096 token-file:4096
     checkpoint-manifest:4096 bonsai-ir:16384 hf-config:4096)
targets=()
for entry in "${all[@]}"; do
  if [ $# -eq 0 ] || [[ " $* " == *" ${entry%%:*} "* ]]; then
    targets+=("$entry")
  fi
done
if [ "${#targets[@]}" -eq 0 ]; then
  echo "usage: scripts/test-fuzz.sh [--long] [TARGET...]; targets: ${all[*]%%:*}" >&2
  exit 2
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"

# fuzz TARGET MAXLEN: replays the target's regression inputs, then fuzzes; prints one line.
fuzz() {
  local target="$1" maxlen="$2"
  local fuzzer="$build/bin/bonsai-fuzz-$target" corpus="$build/fuzz-corpus/$target"
  local regressions="$src/test/fuzz/regressions/$target" log="$build/fuzz-$target.log"
  local start stats budget
  mkdir -p "$corpus"
  local common=(-max_len="$maxlen" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
                -artifact_prefix="$artifacts/$target-")
  # Every input that once crashed must still pass, before any fuzzing.
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    if ! "$fuzzer" "${common[@]}" -runs=0 "$regressions" > "$log.replay" 2>&1; then
      echo "test-fuzz: $target: a regression input fails again (see $log.replay)"
      tail -30 "$log.replay"
      return 1
    fi
  fi
  if [ "$mode" = long ]; then
    budget=(-runs="${BONSAI_FUZZ_RUNS:-1000000}")
  else
    budget=(-max_total_time="${BONSAI_FUZZ_SECONDS:-15}")
  fi
  start=$(date +%s)
  if "$fuzzer" "${common[@]}" "${budget[@]}" "$corpus" "$seeds/$target" > "$log" 2>&1; then
    # libFuzzer's last status line: executions, coverage (edges, features), corpus, exec/s.
    stats=$(grep -E '^#[0-9]+' "$log" | tail -1)
    echo "test-fuzz: $target: $(( $(date +%s) - start )) s: $stats"
  else
    echo "test-fuzz: $target: FAILED (log: $log; input in $artifacts/)"
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" || tail -30 "$log"
    return 1
  fi
}

# The targets run $jobs at a time (libFuzzer runs one thread a target), each for its own
# time, and report in the order listed.
status=0
for ((first = 0; first < ${#targets[@]}; first += jobs)); do
  batch=("${targets[@]:first:jobs}")
  pids=()
  for entry in "${batch[@]}"; do
    fuzz "${entry%%:*}" "${entry##*:}" > "$build/fuzz-${entry%%:*}.result" 2>&1 &
    pids+=($!)
  done
  for i in "${!batch[@]}"; do
    result="$build/fuzz-${batch[i]%%:*}.result"
    if wait "${pids[i]}"; then
      cat "$result"
    else
      cat "$result" >&2
      status=1
    fi
  done
done
exit "$status"
