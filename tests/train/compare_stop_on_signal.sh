#!/usr/bin/env bash
# Ctrl-C stops `ham compare` in the middle of a run with that run's checkpoint and exit
# status 130; the same command then resumes the run from its checkpoint and finishes with
# the losses and weights of a comparison that was never interrupted.
set -euo pipefail
ham="$1"
dir="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2> /dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# A small GDN, so that its 2000 steps take a few seconds and the signal lands among them.
cat > "$dir/spec.json" << 'SPEC'
{
  "runs": {"gdn": {"family": "gdn", "vocab_size": 257, "d_model": 32, "n_layers": 1,
                   "gdn_heads": 1, "gdn_head_dim": 16, "gdn_v_head_dim": 16, "d_ff": 64}},
  "train": {"steps": 2000, "batch_size": 1, "seq_len": 16, "log_every": 1,
            "eval_every": 100000},
  "eval": {"perplexity": false, "mqar_lengths": [32], "mqar_pairs": 4, "samples": 4,
           "batch_size": 4}
}
SPEC
compare=("$ham" compare "$dir/spec.json" --threads 1)

"${compare[@]}" --out "$dir/stopped" > "$dir/stopped.log" 2>&1 &
pid=$!
train_log="$dir/stopped/runs/gdn/train.log"
for _ in $(seq 600); do
  grep -Eqs "^step +3/" "$train_log" && break
  sleep 0.1
done
grep -Eqs "^step +3/" "$train_log" || fail "no third step within 60 s: $(cat "$dir/stopped.log")"
kill -INT "$pid"
status=0
wait "$pid" || status=$?
pid=""
[ "$status" -eq 130 ] || fail "exit status $status, expected 130: $(tail -3 "$dir/stopped.log")"
line="$(grep "gdn: stopped at step" "$dir/stopped.log")" ||
  fail "no 'stopped at step' line: $(tail -3 "$dir/stopped.log")"
step="$(sed -E 's/.*stopped at step ([0-9]+) of 2000 by SIGINT.*/\1/' <<< "$line")"
[ "$step" -lt 2000 ] 2> /dev/null || fail "the run was not stopped midway: '$line'"
grep -q "^compare stopped by SIGINT after 0 of 1 runs" "$dir/stopped.log" ||
  fail "no 'compare stopped' line: $(tail -2 "$dir/stopped.log")"
checkpoint="$(printf '%s/stopped/runs/gdn/step-%08d' "$dir" "$step")"
[ -f "$checkpoint/state.json" ] || fail "no checkpoint $checkpoint after '$line'"
[ ! -e "$dir/stopped/runs/gdn/trained.json" ] || fail "a stopped run wrote its record"

"${compare[@]}" --out "$dir/stopped" > "$dir/resumed.log" 2>&1 ||
  fail "the rerun failed: $(tail -3 "$dir/resumed.log")"
grep -q "resuming from $checkpoint at step $step of 2000" "$dir/resumed.log" ||
  fail "the rerun did not resume from $checkpoint: $(grep gdn: "$dir/resumed.log")"
grep -q "^resumed from $checkpoint" "$train_log" || fail "train.log was not continued"

"${compare[@]}" --out "$dir/straight" > "$dir/straight.log" 2>&1 ||
  fail "the uninterrupted comparison failed: $(tail -3 "$dir/straight.log")"
losses() { sed -n '/"step_losses"/,/\]/p' "$1/runs/gdn/trained.json"; }
[ "$(losses "$dir/stopped" | wc -l)" -eq 2002 ] || fail "the record lacks the 2000 losses"
[ "$(losses "$dir/stopped")" = "$(losses "$dir/straight")" ] ||
  fail "the resumed run's losses differ from the uninterrupted run's"
cmp "$dir/stopped/runs/gdn/weights/model.safetensors" \
  "$dir/straight/runs/gdn/weights/model.safetensors" ||
  fail "the resumed run's weights differ from the uninterrupted run's"
echo "stopped at step $step by SIGINT; resumed to the uninterrupted run's 2000 losses and weights"
echo "compare_stop_on_signal: passed"
