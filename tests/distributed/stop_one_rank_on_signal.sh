#!/usr/bin/env bash
# stop_one_rank_on_signal.sh MPIRUN_SH MPIRUN HAM
# SIGTERM sent to rank 1 alone of `mpirun -np 2 ham train` stops every rank at the same
# step: rank 0 reports the stop, the sharded checkpoint of that step is written, and two
# ranks resume from it.
set -euo pipefail
mpirun_sh="$1"
mpirun="$2"
ham="$3"
dir="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2> /dev/null; rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1
common=(--batch-size 4 --seq-len 32 --log-every 1 --eval-every 100000 --peak-gflops 1 --threads 1)
fail() { echo "FAIL: $*"; exit 1; }

"$mpirun_sh" "$mpirun" 2 "$ham" train --steps 100000 --out "$dir/run" "${common[@]}" \
  > "$dir/run.log" 2>&1 &
pid=$!  # mpirun.sh execs mpirun: its ranks are this process's children
for _ in $(seq 600); do
  grep -Eq "^step +3/" "$dir/run.log" && break
  sleep 0.1
done
grep -Eq "^step +3/" "$dir/run.log" || fail "no third step within 60 s: $(cat "$dir/run.log")"
rank1=""
for child in $(pgrep -P "$pid"); do
  if tr '\0' '\n' < "/proc/$child/environ" | grep -qx "OMPI_COMM_WORLD_RANK=1"; then
    rank1=$child
  fi
done
[ -n "$rank1" ] || fail "rank 1 not found among mpirun's children: $(pgrep -P "$pid" | tr '\n' ' ')"
kill -TERM "$rank1"
status=0
wait "$pid" || status=$?
pid=""
[ "$status" -ne 0 ] || fail "mpirun exited 0 after SIGTERM"
line="$(grep "^stopped at step" "$dir/run.log")" ||
  fail "rank 0 did not report the stop: $(tail -5 "$dir/run.log")"
step="$(sed -E 's/^stopped at step ([0-9]+) .*/\1/' <<< "$line")"
checkpoint="$(printf '%s/run/step-%08d' "$dir" "$step")"
[ -f "$checkpoint/state.json" ] && [ -d "$checkpoint/optimizer" ] ||
  fail "no sharded checkpoint $checkpoint after '$line'"
log="$("$mpirun_sh" "$mpirun" 2 "$ham" train --resume "$dir/run" --steps $((step + 2)) --threads 1)"
grep -q "resumed from .* at step $step (sharded optimizer state)" <<< "$log" ||
  fail "2 ranks did not resume from step $step: $log"
grep -Eq "^step +$((step + 2))/$((step + 2)) \| loss" <<< "$log" ||
  fail "the resumed run did not finish"
echo "rank 1 got SIGTERM; all stopped at step $step and resumed"
echo "stop_one_rank_on_signal: passed"
