#!/usr/bin/env bash
# SIGKILL a training run at several moments while it writes a checkpoint every step; after
# each kill the newest checkpoint must load and a resumed run must continue from it.
set -euo pipefail
ham="$1"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--seq-len 16 --batch-size 2 --log-every 1000 --eval-every 100000 --threads 1)

"$ham" train --steps 2 --checkpoint-every 1 --keep 2 --out "$out" "${common[@]}" > /dev/null
for delay in 0.15 0.3 0.45 0.6 0.9; do
  "$ham" train --resume "$out" --steps 100000 --checkpoint-every 1 --keep 2 "${common[@]}" > /dev/null 2>&1 &
  pid=$!
  sleep "$delay"
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  latest="$(ls -d "$out"/step-* | sort | tail -n 1)"
  step="${latest##*step-}"
  step=$((10#$step))
  # The newest complete checkpoint loads and training continues for two more steps.
  log="$("$ham" train --resume "$out" --steps $((step + 2)) --checkpoint-every 1 --keep 2 "${common[@]}")"
  grep -q "resumed from .* at step $step" <<< "$log" || { echo "resume after kill at ${delay}s failed"; exit 1; }
  echo "killed after ${delay}s: resumed from step $step"
done
echo "kill_during_checkpoint: passed"
