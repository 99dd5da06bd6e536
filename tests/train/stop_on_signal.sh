#!/usr/bin/env bash
# SIGTERM (a scheduler's preemption) and SIGINT (Ctrl-C) stop `ham train` between steps
# with a checkpoint and the exit status 128 + signal; `--resume` from that checkpoint
# gives the losses of a run that was never interrupted.
set -euo pipefail
ham="$1"
dir="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2> /dev/null; rm -rf "$dir"' EXIT
# Warmup longer than the run: the learning rate then does not depend on --steps.
common=(--batch-size 2 --seq-len 32 --warmup 1000 --log-every 1 --eval-every 100000 --threads 1)
fail() { echo "FAIL: $*"; exit 1; }

# Starts a long run into $dir/$1, waits for its third step, sends signal $2; the exit
# status goes to $status.
run_until_signal() {
  "$ham" train --steps 100000 --out "$dir/$1" "${common[@]}" > "$dir/$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    grep -Eq "^step +3/" "$dir/$1.log" && break
    sleep 0.1
  done
  grep -Eq "^step +3/" "$dir/$1.log" || fail "$1: no third step within 60 s: $(cat "$dir/$1.log")"
  kill "-$2" "$pid"
  status=0
  wait "$pid" || status=$?
  pid=""
}

run_until_signal interrupted INT
[ "$status" -eq 130 ] || fail "SIGINT: exit status $status, expected 130"
grep -q "^stopped at step [0-9]* of 100000 by SIGINT: checkpoint " "$dir/interrupted.log" ||
  fail "SIGINT: no 'stopped at' line: $(tail -3 "$dir/interrupted.log")"

run_until_signal preempted TERM
[ "$status" -eq 143 ] || fail "SIGTERM: exit status $status, expected 143"
line="$(grep "^stopped at step" "$dir/preempted.log")" || fail "SIGTERM: no 'stopped at' line"
step="$(sed -E 's/^stopped at step ([0-9]+) .*/\1/' <<< "$line")"
checkpoint="$(printf '%s/preempted/step-%08d' "$dir" "$step")"
[ -f "$checkpoint/state.json" ] || fail "no checkpoint $checkpoint after '$line'"

# Losses printed for steps step+1 and step+2, by the resumed and by an uninterrupted run.
losses() { sed -nE "s/^step +($((step + 1))|$((step + 2)))\/[0-9]+ \| loss ([0-9.]+) .*/\1 \2/p"; }
resumed="$("$ham" train --resume "$dir/preempted" --steps $((step + 2)) --log-every 1 | losses)"
straight="$("$ham" train --steps $((step + 2)) "${common[@]}" | losses)"
[ "$(wc -l <<< "$resumed")" -eq 2 ] || fail "resumed run printed no losses: '$resumed'"
[ "$resumed" = "$straight" ] || fail "resumed losses '$resumed' differ from '$straight'"
echo "stopped at step $step by SIGTERM; resumed: $(tr '\n' ' ' <<< "$resumed")"
echo "stop_on_signal: passed"
