#!/usr/bin/env bash
# `ham analyze` on a freshly initialised HAM export (one training step) with noise-haystack
# NIAH prompts: the CSVs and PNG plots must be written, the per-token CSV must mark the
# needle, and the summary must list the needle/haystack score ratio of every layer.
set -euo pipefail
ham="$1"
config="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$ham" train --config "$config" --steps 1 --batch-size 1 --seq-len 32 --eval-every 1000 \
  --threads 1 --export "$work/model" > "$work/train.log"
log="$("$ham" analyze "$work/model" --out "$work/analysis" --niah single_1 --length 512 \
        --samples 2 --detail 1 --threads 1)"
echo "$log"

fail() { echo "FAIL: $*"; exit 1; }
out="$work/analysis"
for f in summary.csv heads.csv sequences.csv by_position_layer0.csv by_position_layer1.csv \
         needle_aligned_layer0.csv seq000_layer0.csv seq000_layer1.csv; do
  [ -s "$out/$f" ] || fail "$f was not written"
done
for p in seq000_score seq000_gates seq000_kv mean_score mean_alpha mean_kv needle_aligned_score; do
  for ext in png csv gp; do
    [ -s "$out/plots/$p.$ext" ] || fail "plots/$p.$ext was not written"
  done
  [ "$(head -c 8 "$out/plots/$p.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] ||
    fail "plots/$p.png is not a PNG"
done
header="$(head -n 1 "$out/seq000_layer0.csv")"
[ "$header" = "t,token,text,region,score,selected,T_KV,fit_error_h0,fit_error_h1,alpha_h0,alpha_h1,reset_h0,reset_h1" ] ||
  fail "unexpected per-token CSV header: $header"
grep -q ',needle,' "$out/seq000_layer0.csv" || fail "no token is marked as the needle"
grep -Eq '^needle/haystack score ratio by layer: 0=[0-9.]+ 1=[0-9.]+' <<< "$log" ||
  fail "the summary does not list the needle/haystack ratio per layer"

# Exactly one input source.
if err="$("$ham" analyze "$work/model" --out "$work/bad" --text hi --niah single_1 2>&1)"; then
  fail "--text with --niah was accepted"
fi
grep -q 'give exactly one of --text, --text-file and --niah' <<< "$err" || fail "unexpected error: $err"
echo "analyze_niah: passed"
