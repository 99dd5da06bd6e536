#!/usr/bin/env bash
# `ham train --export` a tiny HAM model for a few steps, then `ham generate` from the
# export: the continuation comes with the KV cache per layer, the --tau / --kv-fraction
# dial changes the cache, a seeded run repeats exactly, and bad options are named.
set -euo pipefail
ham="$1"
config="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$ham" train --config "$config" --steps 3 --batch-size 2 --seq-len 32 --log-every 1 \
  --eval-every 1000 --threads 1 --export "$dir/export" > /dev/null
generate() { "$ham" generate "$dir/export" --prompt "The " --max-new-tokens 24 --seed 7 --threads 1 "$@"; }

out="$(generate)"
echo "$out"
for expected in "--- continuation ---" "KV cache tokens" "total: KV cache" "recurrent state" \
                "speed (cpu, f32): prompt 5 tokens in" "23 tokens decoded one at a time in"; do
  grep -aqF -- "$expected" <<< "$out" || { echo "FAIL: output lacks '$expected'"; exit 1; }
done
[ "$(grep -acE '^ +[0-9]+ +HAM ' <<< "$out")" -eq 2 ] || { echo "FAIL: expected 2 HAM layer rows"; exit 1; }
# The same seed repeats the run (all but the wall times).
[ "$(grep -av '^speed' <<< "$out")" == "$(generate | grep -av '^speed')" ] ||
  { echo "FAIL: the same seed gave a different run"; exit 1; }

# Every token cached at layer 0 (tau below any score), none at layer 1 (above any score).
out="$(generate --tau 0:0.0001 --tau 1:1.9999)"
grep -aqE '^ +0 +HAM +0\.0001 +[0-9]+ / ([0-9]+) \(100\.0%\)' <<< "$out" ||
  { echo "FAIL: --tau 0:0.0001 did not cache every token"; echo "$out"; exit 1; }
grep -aqE '^ +1 +HAM +1\.9999 +0 / [0-9]+ \(0\.0%\)' <<< "$out" ||
  { echo "FAIL: --tau 1:1.9999 cached tokens"; echo "$out"; exit 1; }
generate --kv-fraction 0.5 --temperature 0 > /dev/null
# bf16 on the CPU (the GPU's rounding points): a continuation of the same length.
out="$(generate --precision bf16)"
grep -aqF "speed (cpu, bf16)" <<< "$out" || { echo "FAIL: no bf16 run"; echo "$out"; exit 1; }
grep -aqF -- "--- end: 24 new tokens" <<< "$out" || { echo "FAIL: bf16 run"; echo "$out"; exit 1; }

check_error() {  # check_error PATTERN ARGS...: one-line error matching PATTERN
  local pattern="$1"; shift
  if err="$(generate "$@" 2>&1 >/dev/null)"; then echo "FAIL: $* was accepted"; exit 1; fi
  grep -qE "$pattern" <<< "$err" || { echo "FAIL: '$err' does not match '$pattern'"; exit 1; }
  [ "$(wc -l <<< "$err")" -eq 1 ] || { echo "FAIL: error is not one line: $err"; exit 1; }
}
check_error "ham: error: --tau 1:x: 'x' is not a number" --tau 1:x
check_error "ham: error: sampling: top_p must lie in \(0, 1\]" --top-p 2
check_error "ham: error: Decoder: give either kv_fraction or tau" --tau 0.5 --kv-fraction 0.5
# Command-line usage errors: CLI11's line naming the option, then its --help hint.
for bad in "--device gpu" "--precision f16"; do
  # shellcheck disable=SC2086
  if err="$(generate $bad 2>&1 >/dev/null)"; then echo "FAIL: $bad was accepted"; exit 1; fi
  grep -qE "^${bad%% *}: .*${bad##* }" <<< "$err" || { echo "FAIL: '$err' does not name $bad"; exit 1; }
done
echo "generate_smoke: passed"
