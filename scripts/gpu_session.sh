#!/usr/bin/env bash
# A session's GPU checks in one device call: scripts/gpu_check.sh in stages, each under
# its own time limit and all under one deadline, so that a slow stage costs only its own
# results, then every log and CSV packed into one file (the device tool brings back at
# most 8). Made for sessions with about 15 minutes of device time, of which a call gets
# at most 10.
#
# Usage (on the GPU machine, from anywhere): scripts/gpu_session.sh OUT [STAGE...]
#   STAGE: tests, or one of gpu_check's benchmarks (fla gdr routed timeline decode memory
#   lce gemm profile sanitize diagnose cli goals). Default: tests timeline fla routed lce profile
#   memory decode diagnose, most wanted first. tests runs every GPU test once; the
#   benchmark stages run no tests.
#   OUT receives gpu_session.tgz (STAGE.log and STAGE/ for each stage) and summary.txt.
# Environment:
#   HAM_GPU_SESSION_SECONDS  the deadline for all stages (default 560)
#   HAM_GPU_STAGE_SECONDS    per-stage limits, e.g. "fla=200 routed=150" (defaults below,
#                            measured on the H200 on 2026-11-26 plus a margin)
#   Without HAM_GPU_BUILD, .gpu-prebuilt/build-sm90-carry.tar.xz (scripts/gpu_prebuild.sh)
#   is used when it is there, else gpu_check builds build-gpu/ first (minutes).
#   FLA's autotuning results, from bench/fla_autotune.tgz (committed, since ignored files
#   do not reach the next session's fresh checkout) or .gpu-deps/fla_autotune.tgz where
#   that is carried, are unpacked into Triton's cache (TRITON_CACHE_DIR, default /tmp/tc),
#   so its first call does not spend minutes autotuning; each session packs them again
#   into gpu_session.tgz: commit that fla_autotune.tgz as bench/fla_autotune.tgz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
[[ $# -ge 1 ]] || { echo "usage: scripts/gpu_session.sh OUT [STAGE...]" >&2; exit 2; }
out=$1
shift
stages=("$@")
[[ ${#stages[@]} -gt 0 ]] || stages=(tests timeline fla routed lce profile memory decode diagnose)
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
work=$(mktemp -d)

# Seconds each stage took on the H200 (2026-11-26), with a margin: tests 82-87, fla 155
# with the autotune cache (134 with its ham cases bf16 only, as now), memory 44, lce 31-33,
# decode 36, routed 106-115, profile 23, diagnose of two kernels with their SASS 28, of nine
# 98; sanitize 136 with racecheck stopped at 120 (now up to 630 in five runs). On
# 2026-11-27: tests 74-80, profile 43, routed with its 23 cases 161 (185 with a fresh
# FlexAttention compile per case), fla for one shape 137 without FLA's autotuning results
# and 49 with them. routed has since gained the wgmma forward's table and FlexAttention's
# second compile with small backward tiles at 128 x 192: given 300, a guess. decode has
# since gained a table of the attention kernel's tile sizes (28 more timings, each of 20
# reps of 20 calls): 75. On 2026-11-27 (twentieth session): tests 97, routed 282, profile
# 104; fla stopped at 210 after ham's tables and FLA's first two shapes (one compile each,
# with its autotuning results carried), decode at 75 before the PyTorch reference ran: 330
# and 120. routed has since gained a table of the dQ kernel's key tiles (12 cases): 330.
# timeline (before its first run): 23 cases, each a forward and a backward 13 times for the events,
# 10 for the host's issue, then the forward once and the backward twice recorded, most of
# it making each case's inputs on the host; then the 8 B4 T4096 cases again for the
# blocks' CSV: 120, a guess. On 2026-11-29 (thirty-sixth session): tests 95, routed 264,
# timeline 58; fla stopped at 330 after four of its five shapes, FLA autotuning afresh
# (its results are now bench/fla_autotune.tgz). profile has since gained the paper's
# heads at 16384 tokens: 150. routed has since gained a table of the dQ blocks' start from
# the query tiles' records (12 cases, as the key tiles' table), and timeline one more
# recorded backward a case: 330 and 120 still, untimed. Forty-fifth session: routed runs
# its first table and PyTorch's side before ham's variant tables (a small part of the
# stage, by their calls: the timeline stage, of similar calls, took 58 s; FlexAttention's
# compiles are most of it), and has one more variant table (the dQ kernel's 16-key
# tiles); timeline one more recorded backward a case. Forty-seventh session: timeline
# also records the gated delta rule's 5 bf16 cases (3 event timings and 5 recorded passes
# each, most of it making the inputs on the host, as the gdr stage's cases): 180, a guess.
# On 2026-12-04 (sixty-eighth session): tests 105, fla 98 (with FLA's autotuning results),
# timeline 68; routed stopped at 300 in its variant tables (the first table and PyTorch's
# side were done in about 90 s); profile stopped at 140 in its third of ten cases (about
# 50 s a case): 500. Sixty-ninth session: routed's variant tables now start with the
# unselected keys' zeros in the dQ blocks (12 cases), and timeline records one more
# backward a case (about 8 s more): limits unchanged, untimed.
# Seventieth session: tests 115 (102.6 of test time), routed stopped at 255 in its variant
# tables (the dQ key tiles'), timeline 76, memory 33, decode stopped at 60 before PyTorch's
# reference; cli (the training commands, each under its own limit inside) 52 and 44: 120.
# Seventy-fourth session: goals (#8's 9 cases of routed's first table twice, with
# FlexAttention's compiles for them once, then the persistent tables' 18 cases): 360, a
# guess from routed's first table and PyTorch's side, about 90 s for all 18 cases in the
# sixty-eighth session. Seventy-fifth session: the defaults' run also tunes each case's
# forward (4 combinations) and backward (64 at 128 x 128, 40 since the seventy-sixth; each
# one's gradients copied to the host for the bit check: about 200 MB at B4 T4096), perhaps
# 3 s a case: 390, a guess. Seventy-eighth session: a third persistent table (the dK/dV
# kernel's, 18 backward cases twice, as long as the dQ kernel's table): 420, a guess.
declare -A limit=([tests]=150 [fla]=200 [gdr]=90 [memory]=70 [lce]=100 [decode]=120
                  [routed]=330 [timeline]=120 [gemm]=90 [profile]=500 [sanitize]=580
                  [diagnose]=300 [cli]=120 [goals]=420)
for pair in ${HAM_GPU_STAGE_SECONDS:-}; do
  [[ $pair =~ ^([a-z]+)=([0-9]+)$ ]] ||
    { echo "gpu_session: HAM_GPU_STAGE_SECONDS: '$pair' is not STAGE=SECONDS" >&2; exit 2; }
  limit[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
done
for stage in "${stages[@]}"; do
  [[ -n ${limit[$stage]:-} ]] || { echo "gpu_session: unknown stage '$stage'" >&2; exit 2; }
done

if [[ -z ${HAM_GPU_BUILD:-} && -f .gpu-prebuilt/build-sm90-carry.tar.xz ]]; then
  export HAM_GPU_PREBUILT=1 HAM_GPU_BUILD=build-sm90-carry
fi
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tc}
for results in bench/fla_autotune.tgz .gpu-deps/fla_autotune.tgz; do
  if [[ -f $results ]]; then
    tar -xzf "$results" -C / || exit 1
  fi
done
# FLA's autotuning results (Triton's *.autotune.json, FLA_CACHE_RESULTS being on by
# default), packed beside the logs after each stage: commit the file as
# bench/fla_autotune.tgz for the next session. Only the choices travel, not the compiled
# kernels (tens of MB): the next run compiles the chosen configs alone.
keep_autotune_results() {
  [[ $TRITON_CACHE_DIR == /* && -d $TRITON_CACHE_DIR ]] || return 0
  local results
  results=$(cd / && find "${TRITON_CACHE_DIR#/}" -name '*.autotune.json')
  [[ -n $results ]] || return 0
  # shellcheck disable=SC2086  # Triton's cache paths hold no spaces
  tar -czf "$work/fla_autotune.tgz" -C / $results
}

deadline=$((SECONDS + ${HAM_GPU_SESSION_SECONDS:-560}))
summary="$out/summary.txt"
: >"$summary"
status=0
for stage in "${stages[@]}"; do
  left=$((deadline - SECONDS))
  seconds=$((left < limit[$stage] ? left : limit[$stage]))
  if ((left < 20)); then
    echo "== $stage: skipped, ${left} s left before the deadline" | tee -a "$summary"
    status=1
    continue
  fi
  start=$SECONDS
  if [[ $stage == tests ]]; then
    HAM_GPU_SKIP_BENCH=1 HAM_GPU_TEST_RUNS=1 timeout "$seconds" scripts/gpu_check.sh \
      "$work/$stage" >"$work/$stage.log" 2>&1
  else
    HAM_GPU_TESTS=NONE HAM_GPU_BENCH=$stage timeout "$seconds" scripts/gpu_check.sh \
      "$work/$stage" >"$work/$stage.log" 2>&1
  fi
  rc=$?
  verdict=passed
  ((rc == 124)) && verdict="stopped at its ${seconds} s limit"
  ((rc != 0 && rc != 124)) && verdict="failed (exit $rc)"
  ((rc != 0)) && status=1
  echo "== $stage: $verdict in $((SECONDS - start)) s" | tee -a "$summary"
  if [[ $stage == tests ]]; then
    grep -E 'tests passed|\(Failed\)|\(Timeout\)|Skipped' "$work/$stage.log" | head -20 |
      tee -a "$summary"
  fi
  keep_autotune_results
  tar -czf "$out/gpu_session.tgz" -C "$work" . 2>/dev/null  # after each stage: a kill keeps the rest
done
cp "$summary" "$work/summary.txt"
tar -czf "$out/gpu_session.tgz" -C "$work" .
echo "== gpu_session: $([[ $status -eq 0 ]] && echo PASSED || echo FAILED) (all in $out/gpu_session.tgz)"
exit "$status"
