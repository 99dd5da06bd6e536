#!/usr/bin/env bash
# compare_matches_one_rank.sh MPIRUN_SH MPIRUN HAM COMPARE_RUNS CONFIG_DIR
# `mpirun -np 2 ham compare` against `ham compare` on one spec (a GDN and a HAM with
# learned thresholds): every run trains on both ranks (sharded data parallel) to the
# one-rank run's losses and weights, within train_matches_one_rank.sh's tolerances (the
# runs differ only in summation order); only rank 0 prints and writes the report; and a
# rerun on 2 ranks finds both runs trained.
set -euo pipefail
mpirun_sh="$1"
mpirun="$2"
ham="$3"
compare="$4"
configs="$5"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }

cat > "$out/spec.json" << SPEC
{
  "runs": {"gdn": "$configs/gdn.json", "ham": "$configs/ham-learned-tau.json"},
  "train": {"steps": 6, "batch_size": 4, "seq_len": 32, "log_every": 1, "eval_every": 1000,
            "eval_batches": 2, "peak_gflops": 1},
  "eval": {"perplexity": false, "mqar_lengths": [32], "mqar_pairs": 4, "samples": 4,
           "batch_size": 4}
}
SPEC

"$ham" compare "$out/spec.json" --out "$out/one" --threads 1 > "$out/one.log" 2>&1 ||
  fail "one rank: $(tail -3 "$out/one.log")"
two=("$mpirun_sh" "$mpirun" 2 "$ham" compare "$out/spec.json" --out "$out/two" --threads 1)
"${two[@]}" > "$out/two.log" 2>&1 || fail "two ranks: $(tail -5 "$out/two.log")"
grep -q "^compare: 2 runs .* on each of 2 ranks$" "$out/two.log" ||
  fail "no 2-rank header: $(head -2 "$out/two.log")"
[ "$(grep -c "^report: " "$out/two.log")" -eq 1 ] ||
  fail "not one report line: $(cat "$out/two.log")"
for run in gdn ham; do
  grep -q "^sharded data parallel: 2 ranks" "$out/two/runs/$run/train.log" ||
    fail "$run did not train on 2 ranks: $(head -3 "$out/two/runs/$run/train.log")"
  echo "== $run: 2 ranks vs 1 rank"
  "$compare" losses "$out/one/runs/$run/metrics/metrics.jsonl" \
    "$out/two/runs/$run/metrics/metrics.jsonl" 1e-5 0 | tail -n 2
  "$compare" weights "$out/one/runs/$run/weights/model.safetensors" \
    "$out/two/runs/$run/weights/model.safetensors" 1e-5 | tail -n 2
done

"${two[@]}" > "$out/again.log" 2>&1 || fail "the rerun: $(tail -5 "$out/again.log")"
[ "$(grep -c ": trained earlier" "$out/again.log")" -eq 2 ] ||
  fail "the rerun trained again: $(grep "^\[" "$out/again.log")"
echo "compare_matches_one_rank: passed"
