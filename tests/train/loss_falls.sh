#!/usr/bin/env bash
# `ham train` on CONFIG for a few steps on the embedded corpus: the training loss must fall
# by at least MIN_DROP percent (and the run must report per-layer KV use for HAM).
set -euo pipefail
ham="$1"
config="$2"
min_drop="${3:-20}"
log="$("$ham" train --config "$config" --steps 30 --batch-size 4 --seq-len 32 --warmup 5 \
        --log-every 10 --eval-every 1000 --threads 1)"
line="$(grep '^done: training loss' <<< "$log")"
first="$(sed -E 's/^done: training loss ([0-9.]+) -> ([0-9.]+).*/\1/' <<< "$line")"
last="$(sed -E 's/^done: training loss ([0-9.]+) -> ([0-9.]+).*/\2/' <<< "$line")"
echo "$line"
if grep -q '"family":"ham"' <<< "$log" && ! grep -q 'kv fraction by layer' <<< "$log"; then
  echo "FAIL: a HAM run did not report its KV fraction per layer"
  exit 1
fi
awk -v a="$first" -v b="$last" -v d="$min_drop" 'BEGIN { exit !(b < a * (1 - d / 100)) }' ||
  { echo "FAIL: loss fell from $first to $last, less than ${min_drop}%"; exit 1; }
echo "loss_falls: passed"
