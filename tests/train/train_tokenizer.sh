#!/usr/bin/env bash
# `ham train-tokenizer` learns a BPE tokenizer that `ham tokenize` and `ham train` use: the
# training split encodes to the tokens it reports (plus one document-start token each), in
# shards or read from the text by `ham train --tokenizer`, a model trains on them, and bad
# options fail at once with a one-line error naming them.
set -euo pipefail
ham="$1"
corpus="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

log="$("$ham" train-tokenizer --in "$corpus" --out "$dir/tok/tokenizer.json" --vocab-size 512 \
        --val-fraction 0.05 --threads 1)"
echo "$log"
grep -q "the vocabulary is full (512 ids)" <<< "$log" || fail "the vocabulary is not full"
documents="$(sed -n 's/^documents: \([0-9]*\) (\([0-9]*\) held out).*/\1/p' <<< "$log")"
tokens="$(sed -n 's/.* encode to \([0-9]*\) tokens.*/\1/p' <<< "$log")"
[ -n "$documents" ] && [ -n "$tokens" ] || fail "no document or token count in the log"

shards="$("$ham" tokenize --tokenizer "$dir/tok/tokenizer.json" --in "$corpus" --out "$dir/shards/c" \
           --val-fraction 0.05)"
echo "$shards"
grep -q "byte-level BPE, 512 tokens" <<< "$shards" || fail "tokenize did not load the learned tokenizer"
grep -q "^train: $documents documents, $((tokens + documents)) tokens" <<< "$shards" ||
  fail "the training split does not encode to the $tokens tokens train-tokenizer reported (+ $documents starts)"

log="$("$ham" train --data "$dir/shards/c_train_*.bin" --val-data "$dir/shards/c_val_000000.bin" \
        --tokenizer "$dir/tok/tokenizer.json" --set model.vocab_size=512 --out "$dir/run" \
        --export "$dir/export" --steps 20 --seq-len 32 --batch-size 4 --warmup 5 --log-every 10 --threads 1)"
grep '^done:' <<< "$log" || fail "training on the learned tokens did not finish: $log"
# The checkpoint and the export keep the tokenizer, and generate reads text with it unasked.
cmp -s "$dir/tok/tokenizer.json" "$dir/run/step-00000020/tokenizer.json" || fail "the checkpoint has no tokenizer copy"
cmp -s "$dir/tok/tokenizer.json" "$dir/export/tokenizer.json" || fail "the export has no tokenizer copy"
out="$("$ham" generate "$dir/export" --prompt "The " --max-new-tokens 4 --threads 1)"
grep -q "tokenizer $dir/export/tokenizer.json (byte-level BPE, 512 tokens)" <<< "$out" ||
  fail "generate did not read the exported tokenizer: $out"

# The text itself, encoded by the tokenizer as it is read: the same training split.
log="$("$ham" train --data "$corpus" --tokenizer "$dir/tok/tokenizer.json" --set model.vocab_size=512 \
        --steps 2 --seq-len 32 --batch-size 4 --warmup 1 --log-every 1 --threads 1)"
grep -q -F "(byte-level BPE, 512 tokens)) ($((tokens + documents)) train tokens" <<< "$log" ||
  fail "text read through the tokenizer is not the $((tokens + documents))-token training split: $log"

expect_error() {  # expect_error "what the message names" ham args...
  local want="$1"; shift
  local err
  if err="$("$ham" "$@" 2>&1)"; then fail "accepted: $*"; fi
  grep -q -- "$want" <<< "$err" || fail "the error does not name '$want': $err"
}
expect_error "--vocab-size: must be a whole number >= 257, got 100" \
  train-tokenizer --in "$corpus" --out "$dir/t.json" --vocab-size 100
expect_error "--min-frequency: must be a whole number >= 1, got 0" \
  train-tokenizer --in "$corpus" --out "$dir/t.json" --min-frequency 0
# A file stands where the output's directory should be: refused before any work.
expect_error "ham: error: --out $corpus/t.json" train-tokenizer --in "$corpus" --out "$corpus/t.json"
[ ! -e "$dir/t.json" ] || fail "a failed run wrote its output"
echo "train_tokenizer: passed"
