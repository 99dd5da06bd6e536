#!/usr/bin/env bash
# failed_rank_ends_the_job.sh MPIRUN_SH MPIRUN PROBE: a rank that dies (SIGKILL), throws,
# or hangs in the middle of a 2-rank job makes the whole job exit non-zero within 60 s,
# and the output names the failed rank (or, for a hang, the rank that gave up waiting).
set -uo pipefail
mpirun_sh="$1"
mpirun="$2"
probe="$3"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
limit=60

# Waits at most $limit s for background job $1; sets rc to its exit code, or to "timeout"
# (and kills it). Runs in this shell: only it can wait for its own jobs.
wait_bounded() {
  local job="$1" waited=0
  while kill -0 "$job" 2> /dev/null; do
    if [ "$waited" -ge $((limit * 10)) ]; then
      kill -9 "$job" 2> /dev/null
      wait "$job" 2> /dev/null
      rc=timeout
      return
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  wait "$job"
  rc=$?
}

fail() {
  echo "failed_rank_ends_the_job: $1"
  echo "---- output ----"
  cat "$2"
  exit 1
}

# Starts a 2-rank probe job in the background and waits until rank 1 has run 3 steps.
start_job() {
  local log="$1"
  shift
  "$mpirun_sh" "$mpirun" 2 "$@" > "$log" 2>&1 &
  job=$!
  for _ in $(seq 1 600); do
    grep -q "rank 1 step 3" "$log" && return
    kill -0 "$job" 2> /dev/null || break
    sleep 0.1
  done
  fail "the probe job did not start" "$log"
}

# 1. SIGKILL rank 1 in the middle of the run.
start_job "$out/kill.log" "$probe" loop
pid="$(grep -m1 -o "rank 1 pid [0-9]*" "$out/kill.log" | awk '{print $4}')"
[ -n "$pid" ] || fail "no pid for rank 1" "$out/kill.log"
start=$SECONDS
kill -9 "$pid"
wait_bounded "$job"
elapsed=$((SECONDS - start))
[ "$rc" != timeout ] || fail "job still running ${limit} s after rank 1 was killed" "$out/kill.log"
[ "$rc" -ne 0 ] || fail "job exited 0 after rank 1 was killed" "$out/kill.log"
grep -q "rank 1" <(grep -i "signal\|killed" "$out/kill.log") ||
  fail "the output does not name rank 1 as killed" "$out/kill.log"
echo "SIGKILL of rank 1: job exited $rc after ${elapsed} s: $(grep -i -m1 "signal" "$out/kill.log")"

# 2. Rank 1 throws.
start=$SECONDS
"$mpirun_sh" "$mpirun" 2 "$probe" throw 1 > "$out/throw.log" 2>&1 &
wait_bounded $!
elapsed=$((SECONDS - start))
[ "$rc" != timeout ] || fail "job still running ${limit} s after rank 1 threw" "$out/throw.log"
[ "$rc" -ne 0 ] || fail "job exited 0 after rank 1 threw" "$out/throw.log"
grep -q "rank 1 failed: probe: rank 1 throws at step 5" "$out/throw.log" ||
  fail "no 'rank 1 failed: ...' line" "$out/throw.log"
echo "rank 1 threw: job exited $rc after ${elapsed} s: $(grep -m1 "rank 1 failed" "$out/throw.log")"

# 3. Rank 1 hangs outside any collective: rank 0's watchdog gives up after 3 s.
start=$SECONDS
HAM_COLLECTIVE_TIMEOUT_S=3 "$mpirun_sh" "$mpirun" 2 "$probe" hang 1 \
  > "$out/hang.log" 2>&1 &
wait_bounded $!
elapsed=$((SECONDS - start))
[ "$rc" != timeout ] || fail "job still running ${limit} s after rank 1 hung" "$out/hang.log"
[ "$rc" -ne 0 ] || fail "job exited 0 after rank 1 hung" "$out/hang.log"
grep -q "rank 0: all_reduce(sum) of f32\[4\] on world did not complete within 3 s" "$out/hang.log" ||
  fail "no watchdog line from rank 0" "$out/hang.log"
echo "rank 1 hung: job exited $rc after ${elapsed} s: $(grep -m1 "did not complete" "$out/hang.log")"

echo "failed_rank_ends_the_job: passed"
