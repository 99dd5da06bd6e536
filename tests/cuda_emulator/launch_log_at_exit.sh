#!/usr/bin/env bash
# HAM_EMULATOR_LAUNCH_LOG=FILE: each process that launched kernels appends its lines to FILE
# at exit; a FILE that cannot be opened fails the first launch in one line naming it.
# Usage: launch_log_at_exit.sh TEST_CUDA_EMULATOR_BINARY
set -euo pipefail
binary=$1
filter=--gtest_filter=SimtEmulator.TheLaunchLogNamesEachKernelAndItsLargestLaunch
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "launch_log_at_exit: $*"; exit 1; }

for run in 1 2; do
  HAM_EMULATOR_LAUNCH_LOG=$scratch/log "$binary" "$filter" >"$scratch/out.$run" 2>&1 ||
    fail "run $run failed: $(tail -5 "$scratch/out.$run")"
done
lines=$(grep -c $'\trecorded_in_the_launch_log\t' "$scratch/log" || true)
[[ $lines == 2 ]] || fail "expected the kernel's line from each of 2 processes, found $lines"
awk -F '\t' 'NF != 10 { bad = 1 } END { exit bad }' "$scratch/log" ||
  fail "a line without the 10 tab-separated fields: $(head -3 "$scratch/log")"
grep $'\trecorded_in_the_launch_log\t' "$scratch/log" |
  awk -F '\t' '$5 != 96 || $6 != 2000 || $10 != "default_stream,created_stream" { bad = 1 }
               END { exit bad }' ||
  fail "the kernel's largest launch is not 96 threads and 2000 dynamic bytes, on both streams"

unwritable=$scratch/missing/log
if HAM_EMULATOR_LAUNCH_LOG=$unwritable "$binary" "$filter" >"$scratch/out.bad" 2>&1; then
  fail "a log path in a missing directory did not fail the launch"
fi
grep -q "HAM_EMULATOR_LAUNCH_LOG=$unwritable: cannot open for appending" "$scratch/out.bad" ||
  fail "the error does not name the variable and path: $(grep -m1 -i error "$scratch/out.bad")"
echo "launch_log_at_exit: passed"
