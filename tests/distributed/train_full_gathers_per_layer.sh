#!/usr/bin/env bash
# train_full_gathers_per_layer.sh MPIRUN_SH MPIRUN HAM CONFIG
# `mpirun -np 2 ham train --shard full` on an 8-layer model gathers block by block: the
# peak of gathered parameters it logs ("rest" + two layers) is under half of the model.
set -euo pipefail
mpirun_sh="$1"
mpirun="$2"
ham="$3"
config="$4"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
if ! "$mpirun_sh" "$mpirun" 2 "$ham" train --config "$config" --set model.n_layers=8 \
    --shard full --steps 2 --batch-size 4 --seq-len 32 --log-every 1 --eval-every 2 \
    --set train.eval_batches=1 --peak-gflops 1 --threads 1 --log-dir "$out/log" \
    > "$out/train.log" 2>&1; then
  echo "train_full_gathers_per_layer: training failed"
  cat "$out/train.log"
  exit 1
fi
line="$(grep -m1 "peak gathered parameters" "$out/train.log" || true)"
echo "$line"
percent="$(sed -n 's/.*(\([0-9.]*\)%).*/\1/p' <<< "$line")"
if [ -z "$percent" ]; then
  echo "train_full_gathers_per_layer: no peak line in the log"
  cat "$out/train.log"
  exit 1
fi
if ! awk -v p="$percent" 'BEGIN { exit !(p < 50) }'; then
  echo "train_full_gathers_per_layer: peak gathered parameters are $percent% of the model (want < 50%)"
  exit 1
fi
echo "train_full_gathers_per_layer: passed"
