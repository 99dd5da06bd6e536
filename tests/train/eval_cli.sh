#!/usr/bin/env bash
# `ham eval` on a model that `ham train --export` wrote: every task asked for gets a table
# row and a JSON entry (its directory created), a HAM model reports its KV fraction per
# layer, a bad multiple-choice line is a one-line error naming the file, the line and the
# key, a --json path that cannot be written fails before any task runs, and
# --every-checkpoint gives each metric against the step of the run's checkpoints.
set -euo pipefail
ham="$1"
config="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

"$ham" train --config "$config" --steps 3 --batch-size 2 --seq-len 32 --log-every 3 \
  --eval-every 1000 --threads 1 --export "$dir/model" --out "$dir/run" --checkpoint-every 1 \
  --keep 0 > "$dir/train.log"
printf '%s\n' '{"context": "The cat sat on the", "choices": [" mat", " moon"], "answer": 0}' \
  '{"context": "1, 2,", "choices": [" 3", " 7"], "answer": 0}' > "$dir/choices.jsonl"

table="$("$ham" eval "$dir/model" --seq-len 32 --max-batches 1 --batch-size 2 \
  --mqar-lengths 32,64 --mqar-pairs 4 --samples 2 --niah single_1 --niah-lengths 400 \
  --niah-margin 2 --choices "$dir/choices.jsonl" --json "$dir/results/eval.json" --threads 1)"
echo "$table"
json="$(cat "$dir/results/eval.json")"

expect() {  # expect WHAT PATTERN TEXT
  grep -Eq -- "$2" <<< "$3" || { echo "FAIL: $1: no line matches '$2'"; exit 1; }
}
kv='[0-9.]+ \[[0-9.]+ [0-9.]+\]$'  # mean [layer 0, layer 1] of the tiny HAM
expect "table header" '^task +length +samples +metrics +kv fraction' "$table"
expect "perplexity row" "^perplexity +32 +2 +loss [0-9.]+ +ppl [0-9.]+ +bpb [0-9.]+ +tokens 64 +$kv" "$table"
expect "mqar row (32)" "^mqar 4 pairs +32 +2 +acc [0-9.]+ +seq_acc [0-9.]+ +$kv" "$table"
expect "mqar row (64)" "^mqar 4 pairs +64 +2 +acc" "$table"
expect "niah row" "^niah single_1 +400 +2 +acc [0-9.]+ +$kv" "$table"
# A progress line per task as it finishes, before the table.
expect "perplexity progress" \
  "^eval: perplexity at 32 \(2 samples\): loss [0-9.]+ .* \| kv [0-9.]+ .*\| [0-9.]+ s$" "$table"
expect "niah progress" "^eval: niah single_1 at 400 \(2 samples\): acc [0-9.]+ .*\| [0-9.]+ s$" \
  "$table"
expect "choices progress" "^eval: choices choices.jsonl \(2 samples\): acc" "$table"
[ "$(grep -c '^eval: ' <<< "$table")" -eq 5 ] ||
  { echo "FAIL: not one progress line per task"; exit 1; }
expect "choices row" "^choices .*choices.jsonl +- +2 +acc [0-9.]+ +acc_norm [0-9.]+ +$kv" "$table"
expect "json family" '"family": "ham"' "$json"
expect "json perplexity" '"perplexity": [0-9.]+' "$json"
expect "json bits per byte" '"bits_per_byte": [0-9.]+' "$json"
expect "json mqar" '"sequence_accuracy": [0-9.]+' "$json"
expect "json niah" '"task": "single_1"' "$json"
expect "json choices" '"acc_norm": [0-9.]+' "$json"

printf '%s\n' '{"context": "a", "choices": [" b", " c"]}' > "$dir/bad.jsonl"
if "$ham" eval "$dir/model" --no-perplexity --choices "$dir/bad.jsonl" 2> "$dir/err.log"; then
  echo "FAIL: a choices line without 'answer' was accepted"
  exit 1
fi
expect "bad line error" "^ham: error: .*bad.jsonl:1: key 'answer' is missing$" "$(cat "$dir/err.log")"
if "$ham" eval "$dir/model" --seq-len 32 --json "$dir/train.log/eval.json" \
    > "$dir/out.log" 2> "$dir/err.log"; then
  echo "FAIL: --json under a file was accepted"
  exit 1
fi
expect "unwritable --json error" \
  "^ham: error: --json .*train.log/eval.json: cannot create its directory" \
  "$(cat "$dir/err.log")"
[ "$(wc -l < "$dir/err.log")" -eq 1 ] || { echo "FAIL: --json error is not one line"; exit 1; }
[ ! -s "$dir/out.log" ] || { echo "FAIL: eval ran before the --json path was checked"; exit 1; }
# Every checkpoint of the run: a progress line each, then each metric against the step, in
# the table, the JSON and the plot; the last equals the evaluation of that checkpoint alone.
curves="$("$ham" eval "$dir/run" --every-checkpoint --no-perplexity --mqar-lengths 32 \
  --mqar-pairs 4 --samples 2 --json "$dir/curves.json" --plot "$dir/plots/curves.png" \
  --threads 1)"
echo "$curves"
for step in 1 2 3; do
  expect "checkpoint $step progress" \
    "^checkpoint $step/3: $dir/run/step-0000000$step\$" "$curves"
  expect "row of step $step" "^ +$step +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$curves"
done
expect "curve header" "^ *step +MQAR T=32 acc +MQAR T=32 all-correct +KV fraction$" "$curves"
[ "$(grep -c '"step": [123],' "$dir/curves.json")" -eq 3 ] ||
  { echo "FAIL: curves.json does not hold steps 1, 2 and 3"; exit 1; }
[ "$(head -c 8 "$dir/plots/curves.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
  { echo "FAIL: no PNG at $dir/plots/curves.png"; exit 1; }
expect "plot data" "MQAR T=32 acc" "$(cat "$dir/plots/curves.csv")"
"$ham" eval "$dir/run/step-00000003" --no-perplexity --mqar-lengths 32 --mqar-pairs 4 \
  --samples 2 --json "$dir/last.json" --threads 1 > /dev/null
accuracies() { grep -Eo '"(accuracy|sequence_accuracy)": [0-9.e+-]+' "$1"; }
[ "$(accuracies "$dir/curves.json" | tail -2)" = "$(accuracies "$dir/last.json")" ] ||
  { echo "FAIL: the last checkpoint's curve point differs from its own evaluation"; exit 1; }

if "$ham" eval "$dir/model" --every-checkpoint --no-perplexity 2> "$dir/err.log"; then
  echo "FAIL: --every-checkpoint on an export was accepted"
  exit 1
fi
expect "no checkpoints error" "^ham: error: $dir/model: holds no complete checkpoint" \
  "$(cat "$dir/err.log")"
if "$ham" eval "$dir/model" --plot "$dir/p.png" 2> "$dir/err.log"; then
  echo "FAIL: --plot without --every-checkpoint was accepted"
  exit 1
fi
expect "plot without curves error" "^ham: error: --plot draws the metrics of --every-checkpoint" \
  "$(cat "$dir/err.log")"
echo "eval_cli: passed"
