#!/usr/bin/env bash
# `ham compare --jobs 2` trains two runs at once in child processes. A SIGTERM to it (as a
# scheduler sends one) stops both jobs with their checkpoints and exit status 143; the same
# command resumes both and ends with the losses, weights and report rows of a comparison
# run one run after the other. Jobs run the program the comparison started with; a job
# that fails is a one-line error naming its run; --train-only leaves the evaluation to a
# later call.
set -euo pipefail
ham="$1"
dir="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2> /dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# Waits for the background comparison $pid; its exit status goes to $status.
wait_for_comparison() {
  status=0
  wait "$pid" || status=$?
  pid=""
}

# Two small GDNs, so that 2000 steps take a few seconds and the signal lands among them.
cat > "$dir/spec.json" << 'SPEC'
{
  "runs": {"narrow": {"family": "gdn", "vocab_size": 257, "d_model": 32, "n_layers": 1,
                      "gdn_heads": 1, "gdn_head_dim": 16, "gdn_v_head_dim": 16, "d_ff": 64},
           "wide": {"family": "gdn", "vocab_size": 257, "d_model": 32, "n_layers": 1,
                    "gdn_heads": 2, "gdn_head_dim": 16, "gdn_v_head_dim": 16, "d_ff": 96}},
  "train": {"steps": 2000, "batch_size": 1, "seq_len": 16, "log_every": 1,
            "eval_every": 100000},
  "eval": {"perplexity": false, "mqar_lengths": [32], "mqar_pairs": 4, "samples": 4,
           "batch_size": 4}
}
SPEC
compare=("$ham" compare "$dir/spec.json" --threads 1)

"${compare[@]}" --out "$dir/jobs" --jobs 2 > "$dir/stopped.log" 2>&1 &
pid=$!
for run in narrow wide; do
  for _ in $(seq 600); do
    grep -Eqs "^step +3/" "$dir/jobs/runs/$run/train.log" && break
    sleep 0.1
  done
  grep -Eqs "^step +3/" "$dir/jobs/runs/$run/train.log" ||
    fail "$run: no third step within 60 s: $(cat "$dir/stopped.log")"
done
kill -TERM "$pid"
wait_for_comparison
[ "$status" -eq 143 ] || fail "exit status $status, expected 143: $(tail -3 "$dir/stopped.log")"
grep -q "^compare stopped by SIGTERM" "$dir/stopped.log" ||
  fail "no 'compare stopped' line: $(tail -3 "$dir/stopped.log")"
for run in narrow wide; do
  grep -q "\] $run: stopped by SIGTERM" "$dir/stopped.log" ||
    fail "$run: its job was not stopped: $(cat "$dir/stopped.log")"
  grep -q "$run: stopped at step [0-9]* of 2000 by SIGTERM" "$dir/jobs/runs/$run/job.log" ||
    fail "$run: no checkpointed stop in its job's output: $(tail -3 "$dir/jobs/runs/$run/job.log")"
  [ ! -e "$dir/jobs/runs/$run/trained.json" ] || fail "$run: a stopped run wrote its record"
done

"${compare[@]}" --out "$dir/jobs" --jobs 2 > "$dir/resumed.log" 2>&1 ||
  fail "the rerun failed: $(tail -3 "$dir/resumed.log")"
for run in narrow wide; do
  grep -q "$run: .*resuming from $dir/jobs/runs/$run/step-" "$dir/jobs/runs/$run/job.log" ||
    fail "$run: the rerun's job did not resume: $(tail -3 "$dir/jobs/runs/$run/job.log")"
done
grep -q "^compare: every run trained; evaluating them" "$dir/resumed.log" ||
  fail "no evaluation pass: $(cat "$dir/resumed.log")"

"${compare[@]}" --out "$dir/straight" > "$dir/straight.log" 2>&1 ||
  fail "the one-after-the-other comparison failed: $(tail -3 "$dir/straight.log")"
losses() { sed -n '/"step_losses"/,/\]/p' "$1/trained.json"; }
for run in narrow wide; do
  [ "$(losses "$dir/jobs/runs/$run" | wc -l)" -eq 2002 ] || fail "$run: the record lacks the 2000 losses"
  [ "$(losses "$dir/jobs/runs/$run")" = "$(losses "$dir/straight/runs/$run")" ] ||
    fail "$run: the jobs' losses differ from the one-after-the-other run's"
  cmp "$dir/jobs/runs/$run/weights/model.safetensors" \
    "$dir/straight/runs/$run/weights/model.safetensors" ||
    fail "$run: the jobs' weights differ from the one-after-the-other run's"
done
# The report rows, less the last column (training time): peak memory too is the
# uninterrupted run's (a resumed run holds no copy of its checkpoint).
rows() { grep -E '^\| (narrow|wide) \|' "$1/report.md" | sed -E 's/[^|]*\|$//'; }
[ "$(rows "$dir/jobs" | wc -l)" -eq 2 ] || fail "the report lacks its rows: $(cat "$dir/jobs/report.md")"
[ "$(rows "$dir/jobs")" = "$(rows "$dir/straight")" ] ||
  fail "the report rows differ: $(rows "$dir/jobs") against $(rows "$dir/straight")"

# Jobs run the program their comparison started with, even once a rebuild has replaced
# its file: here the later two of four jobs start after it is replaced by a failing script.
cp "$ham" "$dir/ham_copy"
"$dir/ham_copy" compare "$dir/spec.json" --threads 1 --out "$dir/replaced" --jobs 2 \
  --seeds 0,1 > "$dir/replaced.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -Eqs "^step +3/" "$dir/replaced/runs/narrow_seed0/train.log" && break
  sleep 0.1
done
printf '#!/bin/sh\nexit 3\n' > "$dir/ham_new"
chmod +x "$dir/ham_new"
mv -f "$dir/ham_new" "$dir/ham_copy"
wait_for_comparison
[ "$status" -eq 0 ] || fail "with its program replaced: exit status $status: $(tail -3 "$dir/replaced.log")"
grep -q "^\[3/4\] wide@seed=0: started" "$dir/replaced.log" ||
  fail "the third job did not start: $(cat "$dir/replaced.log")"
for run in narrow_seed0 narrow_seed1 wide_seed0 wide_seed1; do
  [ -e "$dir/replaced/runs/$run/trained.json" ] || fail "$run did not train: $(cat "$dir/replaced.log")"
done

# A run whose vocabulary cannot hold the byte-level text fails in its job.
cat > "$dir/failing.json" << 'SPEC'
{
  "runs": {"fine": {"family": "gdn", "vocab_size": 257, "d_model": 32, "n_layers": 1,
                    "gdn_heads": 1, "gdn_head_dim": 16, "gdn_v_head_dim": 16, "d_ff": 64},
           "small": {"family": "gdn", "vocab_size": 128, "d_model": 32, "n_layers": 1,
                     "gdn_heads": 1, "gdn_head_dim": 16, "gdn_v_head_dim": 16, "d_ff": 64}},
  "train": {"steps": 20, "batch_size": 1, "seq_len": 16, "log_every": 1, "eval_every": 100000},
  "eval": {"perplexity": false, "mqar_lengths": [32], "mqar_pairs": 4, "samples": 4,
           "batch_size": 4}
}
SPEC
status=0
"$ham" compare "$dir/failing.json" --threads 1 --jobs 2 --out "$dir/failing" > "$dir/failing.log" 2>&1 ||
  status=$?
[ "$status" -eq 1 ] || fail "exit status $status, expected 1: $(tail -3 "$dir/failing.log")"
error="$(grep "^ham: error:" "$dir/failing.log")" || fail "no error line: $(cat "$dir/failing.log")"
[ "$(wc -l <<< "$error")" -eq 1 ] || fail "more than one error line: $error"
for part in "compare run 'small' failed (exit 1)" "vocab_size" "$dir/failing/runs/small/job.log"; do
  grep -qF "$part" <<< "$error" || fail "the error lacks '$part': $error"
done
[ -e "$dir/failing/runs/fine/trained.json" ] || fail "the run beside the failing one did not finish"
# --train-only trains and writes no report; the same command without it only evaluates.
"${compare[@]}" --out "$dir/later" --steps 30 --train-only > "$dir/train_only.log" 2>&1 ||
  fail "--train-only failed: $(tail -3 "$dir/train_only.log")"
[ -e "$dir/later/runs/narrow/trained.json" ] && [ -e "$dir/later/runs/wide/trained.json" ] ||
  fail "--train-only did not train both runs: $(cat "$dir/train_only.log")"
[ ! -e "$dir/later/report.md" ] || fail "--train-only wrote a report"
"${compare[@]}" --out "$dir/later" --steps 30 > "$dir/evaluated.log" 2>&1 ||
  fail "the evaluation after --train-only failed: $(tail -3 "$dir/evaluated.log")"
[ "$(grep -c "trained earlier" "$dir/evaluated.log")" -eq 2 ] ||
  fail "the runs were trained again: $(cat "$dir/evaluated.log")"
[ -e "$dir/later/report.md" ] || fail "no report after --train-only's runs were evaluated"
echo "two jobs stopped by SIGTERM and resumed to the one-after-the-other losses, weights and rows"
echo "compare_jobs: passed"
