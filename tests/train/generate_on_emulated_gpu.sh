#!/usr/bin/env bash
# `ham generate --device cuda` on the SIMT emulator (ham_on_emulated_gpu runs the CUDA
# kernels on the CPU): the decode kernels of both hard ops under a whole model. A tiny HAM
# model with a learned router (its KV cache is value-scaled) trained for a few steps
# decodes greedily, on "cuda", the tokens it decodes on the CPU in f32, with the same KV
# caches; in bf16 it decodes to the end.
set -euo pipefail
ham="$1"
ham_gpu="$2"
config="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$ham" train --config "$config" --steps 3 --batch-size 2 --seq-len 32 --log-every 1 \
  --eval-every 1000 --threads 1 --export "$dir/export" > /dev/null
run() {
  local program="$1"; shift
  "$program" generate "$dir/export" --prompt "The quick brown fox jumps over the lazy dog. " \
    --max-new-tokens 20 --temperature 0 --ignore-eot --threads 1 "$@"
}
cpu="$(run "$ham")"
gpu="$(run "$ham_gpu" --device cuda)"
echo "$gpu"
grep -aqF "speed (cuda, f32)" <<< "$gpu" || { echo "FAIL: did not decode on cuda"; exit 1; }
if ! diff <(grep -av '^speed' <<< "$cpu") <(grep -av '^speed' <<< "$gpu"); then
  echo "FAIL: greedy decoding on cuda differs from the CPU's (above: < cpu, > cuda)"
  exit 1
fi
bf16="$(run "$ham_gpu" --device cuda --precision bf16)"
grep -aqF -- "--- end: 20 new tokens" <<< "$bf16" || { echo "FAIL: bf16 on cuda"; echo "$bf16"; exit 1; }
echo "generate_on_emulated_gpu: passed"
