#!/usr/bin/env bash
# train_matches_one_rank.sh MPIRUN_SH MPIRUN HAM COMPARE_RUNS CONFIG
# `mpirun -np 2 ham train` against `ham train` on the same global batch of 4 rows, for one
# model config: 10 steps per sharding stage (grads, full) give the same per-step losses
# (train and validation) and final weights; a 1-rank checkpoint at step 5 resumed on 2
# ranks and a 2-rank one resumed on 1 rank continue with the same losses and weights.
#
# Tolerances: losses 1e-5 relative, weights 1e-5 absolute. The runs differ only in
# summation order (each rank sums its 2 rows, MPI averages the gradients), a few fp32 ulps
# per step; eps is 1e-8 because the paper's 1e-15 turns a gradient that is zero up to
# rounding into a full +-lr step whose sign is the rounding's.
# HAM_TRAIN_PRECISION=bf16 trains in mixed precision instead; LOSS_TOL and WEIGHT_TOL then
# allow for the bf16 roundings that the different summation order moves (the weights
# compared are the exported f32 masters). HAM_TRAIN_DEVICE=cuda trains on the GPU (with
# HAM the program built on the SIMT emulator, ham_on_emulated_gpu: CUDA tensors, NCCL
# between the ranks).
set -euo pipefail
mpirun_sh="$1"
mpirun="$2"
ham="$3"
compare="$4"
config="$5"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
loss_tol=${LOSS_TOL:-1e-5}
weight_tol=${WEIGHT_TOL:-1e-5}
common=(--steps 10 --batch-size 4 --seq-len 32 --log-every 1 --eval-every 1000
        --set train.eval_batches=2 --set train.eps=1e-8 --peak-gflops 1 --threads 1
        --checkpoint-every 5 --keep 0 --precision "${HAM_TRAIN_PRECISION:-f32}"
        --device "${HAM_TRAIN_DEVICE:-cpu}")

run() {  # run NAME NP ARGS...: trains into $out/NAME, its output in $out/NAME.log
  local name="$1" np="$2"
  shift 2
  local cmd=("$ham" train "$@" --log-dir "$out/$name/log" --out "$out/$name/out"
             --export "$out/$name/weights")
  if [ "$np" -gt 1 ]; then cmd=("$mpirun_sh" "$mpirun" "$np" "${cmd[@]}"); fi
  if ! "${cmd[@]}" > "$out/$name.log" 2>&1; then
    echo "train_matches_one_rank: $name failed"
    cat "$out/$name.log"
    exit 1
  fi
}

check() {  # check WHAT REFERENCE RUN [FROM_STEP]
  local what="$1" reference="$2" run="$3" from="${4:-0}"
  echo "== $what"
  "$compare" losses "$out/$reference/log/metrics.jsonl" "$out/$run/log/metrics.jsonl" \
    "$loss_tol" "$from" | tail -n "${DETAIL_LINES:-2}"
  "$compare" weights "$out/$reference/weights/model.safetensors" \
    "$out/$run/weights/model.safetensors" "$weight_tol" | tail -n 2
}

run one 1 --config "$config" "${common[@]}"
for stage in grads full; do
  run "two-$stage" 2 --config "$config" --shard "$stage" "${common[@]}"
  grep -m1 "sharded data parallel" "$out/two-$stage.log"
  check "2 ranks ($stage) vs 1 rank, 10 steps" one "two-$stage"
done
# Resume across rank counts from the step-5 checkpoints.
run one-to-two 2 --resume "$out/one/out/step-00000005" --shard full
check "1-rank checkpoint resumed on 2 ranks (full)" one one-to-two 6
run two-to-one 1 --resume "$out/two-grads/out/step-00000005"
ls "$out/two-grads/out/step-00000005/optimizer"
check "2-rank checkpoint resumed on 1 rank" one two-to-one 6
echo "train_matches_one_rank: passed"
