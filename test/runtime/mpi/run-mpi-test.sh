#!/usr/bin/env bash
# test/runtime/mpi/run-mpi-test.sh - runs bonsai-comm-tests under mpirun and judges the job.
#
# usage: run-mpi-test.sh MODE NP MPIEXEC BINARY
#   collectives  the job must exit 0.
#   repeat       two runs of `collectives` must both pass and print the same DIGEST (the
#                results do not depend on timing).
#   skip         deadline 2 s: the job must exit non-zero within the deadline plus start-up
#                slack, with NP-1 ranks reporting SKIP-DETECTED (the error named the rank that
#                skipped) and none reporting a FAIL.
#   kill         deadline 5 s: a rank kills itself mid-collective; the job must exit non-zero
#                within the deadline plus slack, ended by our error (KILL-DETECTED) or by
#                mpirun noticing the killed rank, and with no FAIL.
#   kill-recovery  the same under `mpirun --enable-recovery`, which lets the survivors run on:
#                every one of the NP-1 must end with our error naming the dead rank, within the
#                deadline plus slack. (mpirun then exits 0 whatever the ranks return: its exit
#                status is not judged here, the plain `kill` test judges it.)
#   late         deadline 2 s: the last rank starts 20 s late; the job must exit non-zero long
#                before it wakes, ended by a start-up error (LATE-DETECTED: the error or the
#                MPI_Init watchdog's message) on some rank, and with no FAIL.
# Every mpirun runs under `timeout`, so a hang is a failure here, not a stuck CI job.
set -u

mode=$1 np=$2 mpiexec=$3 binary=$4
log=$(mktemp)
trap 'rm -f "$log"' EXIT

below() { python3 -c "import sys; sys.exit(0 if $1 < $2 else 1)"; }

# run DEADLINE LIMIT PROGRAM_MODE [MPIRUN_FLAGS...]: runs the job, sets rc and elapsed (seconds).
run() {
  local deadline=$1 limit=$2 what=$3 start end
  shift 3
  start=$(date +%s.%N)
  timeout -k 5 "$limit" "$mpiexec" --allow-run-as-root --oversubscribe "$@" -np "$np" \
    -x BONSAI_COLLECTIVE_TIMEOUT="$deadline" "$binary" "$what" >"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  elapsed=$(python3 -c "print(round($end - $start, 2))")
  cat "$log"
  echo "run-mpi-test: $what on $np ranks: exit $rc after ${elapsed} s (deadline $deadline s)"
  if [ "$rc" -eq 124 ] || ! below "$elapsed" "$limit"; then
    echo "run-mpi-test: FAIL: the job was still running after $limit s (a hang)"
    exit 1
  fi
}

case "$mode" in
collectives)
  run 60 150 collectives
  [ "$rc" -eq 0 ] || { echo "run-mpi-test: FAIL: exit $rc"; exit 1; }
  ;;
repeat)
  run 60 150 collectives
  [ "$rc" -eq 0 ] || { echo "run-mpi-test: FAIL: first run exit $rc"; exit 1; }
  first=$(grep '^DIGEST' "$log")
  run 60 150 collectives
  [ "$rc" -eq 0 ] || { echo "run-mpi-test: FAIL: second run exit $rc"; exit 1; }
  second=$(grep '^DIGEST' "$log")
  if [ -z "$first" ] || [ "$first" != "$second" ]; then
    echo "run-mpi-test: FAIL: digests differ between runs: '$first' vs '$second'"
    exit 1
  fi
  echo "run-mpi-test: both runs: $first"
  ;;
skip)
  run 2 60 skip
  [ "$rc" -ne 0 ] || { echo "run-mpi-test: FAIL: the job exited 0"; exit 1; }
  if grep -q "FAIL" "$log"; then echo "run-mpi-test: FAIL: a rank reported a failure"; exit 1; fi
  detected=$(grep -c "^SKIP-DETECTED" "$log")
  [ "$detected" -eq $((np - 1)) ] || {
    echo "run-mpi-test: FAIL: $detected ranks reported the skipped rank, expected $((np - 1))"
    exit 1
  }
  below "$elapsed" 2+20 || { echo "run-mpi-test: FAIL: took $elapsed s"; exit 1; }
  ;;
kill)
  run 5 60 kill
  [ "$rc" -ne 0 ] || { echo "run-mpi-test: FAIL: the job exited 0"; exit 1; }
  if grep -q "FAIL" "$log"; then echo "run-mpi-test: FAIL: a rank reported a failure"; exit 1; fi
  grep -q "raising SIGKILL" "$log" || { echo "run-mpi-test: FAIL: no rank was killed"; exit 1; }
  if ! grep -q "^KILL-DETECTED" "$log" && ! grep -q "signal 9" "$log"; then
    echo "run-mpi-test: FAIL: the job ended, but neither by our error nor by mpirun's"
    exit 1
  fi
  below "$elapsed" 5+20 || { echo "run-mpi-test: FAIL: took $elapsed s"; exit 1; }
  ;;
late)
  run 2 60 late
  [ "$rc" -ne 0 ] || { echo "run-mpi-test: FAIL: the job exited 0"; exit 1; }
  if grep -q "FAIL" "$log"; then echo "run-mpi-test: FAIL: a rank reported a failure"; exit 1; fi
  if ! grep -q "^LATE-DETECTED" "$log" && ! grep -q "MPI_Init did not return within 2 s" "$log"
  then
    echo "run-mpi-test: FAIL: no rank reported the late start"
    exit 1
  fi
  below "$elapsed" 15 || { echo "run-mpi-test: FAIL: took $elapsed s"; exit 1; }
  ;;
kill-recovery)
  run 5 60 kill --enable-recovery
  if grep -q "FAIL" "$log"; then echo "run-mpi-test: FAIL: a rank reported a failure"; exit 1; fi
  grep -q "raising SIGKILL" "$log" || { echo "run-mpi-test: FAIL: no rank was killed"; exit 1; }
  detected=$(grep -c "^KILL-DETECTED" "$log")
  [ "$detected" -eq $((np - 1)) ] || {
    echo "run-mpi-test: FAIL: $detected ranks reported the dead rank, expected $((np - 1))"
    exit 1
  }
  below "$elapsed" 5+20 || { echo "run-mpi-test: FAIL: took $elapsed s"; exit 1; }
  ;;
*)
  echo "usage: run-mpi-test.sh collectives|repeat|skip|kill|kill-recovery|late NP MPIEXEC" \
    "BINARY" >&2
  exit 2
  ;;
esac
echo "run-mpi-test: PASS"
