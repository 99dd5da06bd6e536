#!/usr/bin/env bash
# `ham tokenize` writes llm.c shards that `ham train` reads (creating the prefix's
# directory); a corrupted shard is a one-line error naming the file.
set -euo pipefail
ham="$1"
corpus="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$ham" tokenize --in "$corpus" --out "$dir/shards/corpus" --val-fraction 0.05 > /dev/null
log="$("$ham" train --data "$dir/shards/corpus_train_*.bin" \
        --val-data "$dir/shards/corpus_val_000000.bin" \
        --steps 20 --seq-len 32 --batch-size 4 --warmup 5 --log-every 10 --threads 1)"
grep -q "(token shards)" <<< "$log" || { echo "FAIL: shards were not used"; exit 1; }
grep '^done:' <<< "$log"
head -c 2000 "$dir/shards/corpus_val_000000.bin" > "$dir/truncated.bin"
if err="$("$ham" train --data "$dir/shards/corpus_train_*.bin" --val-data "$dir/truncated.bin" \
             --steps 1 2>&1)"; then
  echo "FAIL: a truncated shard was accepted"; exit 1
fi
grep -q "ham: error: $dir/truncated.bin: " <<< "$err" || { echo "FAIL: error does not name the file: $err"; exit 1; }
[ "$(wc -l <<< "$err")" -eq 1 ] || { echo "FAIL: error is not one line: $err"; exit 1; }
echo "train_on_shards: passed"
