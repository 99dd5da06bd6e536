#!/usr/bin/env bash
# train_rank_killed.sh MPIRUN_SH MPIRUN HAM CONFIG: SIGKILLs rank 1 of a 2-rank
# `ham train` in the middle of training; the job must exit non-zero within 60 s and the
# output must name rank 1.
set -uo pipefail
mpirun_sh="$1"
mpirun="$2"
ham="$3"
config="$4"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
limit=60
log="$out/train.log"

fail() {
  echo "train_rank_killed: $1"
  echo "---- output ----"
  cat "$log"
  exit 1
}

"$mpirun_sh" "$mpirun" 2 "$ham" train --config "$config" --steps 100000 --batch-size 4 \
  --seq-len 32 --log-every 1 --eval-every 100000 --peak-gflops 1 --threads 1 \
  --log-dir "$out/metrics" > "$log" 2>&1 &
job=$!
for _ in $(seq 1 600); do
  grep -q "step     3/" "$log" && break
  kill -0 "$job" 2> /dev/null || fail "the job ended before step 3"
  sleep 0.1
done
grep -q "step     3/" "$log" || fail "no step 3 within 60 s"
# Rank 1: this job's process whose environment says so. The job is told apart by its
# --log-dir, unique to this run: ctest runs other `ham train` jobs on the same config at
# the same time, and killing their rank 1 failed both tests.
victim=""
for pid in $(pgrep -f -- "--log-dir $out/metrics"); do
  if tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then
    victim="$pid"
  fi
done
[ -n "$victim" ] || fail "no process with OMPI_COMM_WORLD_RANK=1"
start=$SECONDS
kill -9 "$victim"
rc=timeout
for _ in $(seq 1 $((limit * 10))); do
  if ! kill -0 "$job" 2> /dev/null; then
    wait "$job"
    rc=$?
    break
  fi
  sleep 0.1
done
elapsed=$((SECONDS - start))
if [ "$rc" = timeout ]; then
  kill -9 "$job" 2> /dev/null
  fail "job still running ${limit} s after rank 1 was killed"
fi
[ "$rc" -ne 0 ] || fail "job exited 0 after rank 1 was killed"
grep -i "signal\|killed" "$log" | grep -q "rank 1" || fail "the output does not name rank 1"
echo "rank 1 (pid $victim) SIGKILLed mid-training: job exited $rc after ${elapsed} s:" \
  "$(grep -i -m1 "rank 1" "$log")"
echo "train_rank_killed: passed"
