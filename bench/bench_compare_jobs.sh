#!/usr/bin/env bash
# Wall time of `ham compare` trained one run at a time with --threads N against --jobs N
# with one thread each, on the same spec, alternating the two so that drift in the
# machine's speed hits both. Prints each repetition's times and the ratio
# (jobs / one at a time; below 1: the jobs are faster) as min, median and max.
#
#   bench/bench_compare_jobs.sh [HAM] [SPEC] [STEPS] [REPETITIONS] [N]
#   bench/bench_compare_jobs.sh build/ham configs/compare/mqar.json 300 3 2
set -euo pipefail
ham="${1:-build/ham}"
spec="${2:-configs/compare/mqar.json}"
steps="${3:-300}"
repetitions="${4:-3}"
n="${5:-$(nproc)}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

seconds() {  # the wall time of one comparison from scratch, in seconds
  local out="$dir/out"
  rm -rf "$out"
  local start end
  start=$(date +%s.%N)
  "$ham" compare "$spec" --out "$out" --steps "$steps" --seeds 0 "$@" > "$dir/log" 2>&1 ||
    { echo "ham compare $* failed: $(tail -3 "$dir/log")" >&2; exit 1; }
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { print b - a }'
}

echo "spec $spec, $steps steps a run, seed 0; $repetitions repetitions; N = $n"
ratios=()
for r in $(seq "$repetitions"); do
  alone=$(seconds --threads "$n")
  jobs=$(seconds --jobs "$n" --threads 1)
  ratio=$(awk -v a="$alone" -v j="$jobs" 'BEGIN { print j / a }')
  ratios+=("$ratio")
  printf 'repetition %d: one at a time with %d threads %.1f s, %d jobs of 1 thread %.1f s, ratio %.3f\n' \
    "$r" "$n" "$alone" "$n" "$jobs" "$ratio"
done
sorted=($(printf '%s\n' "${ratios[@]}" | sort -g))
count=${#sorted[@]}
if (( count % 2 )); then
  median=${sorted[$((count / 2))]}
else
  median=$(awk -v a="${sorted[$((count / 2 - 1))]}" -v b="${sorted[$((count / 2))]}" 'BEGIN { print (a + b) / 2 }')
fi
printf 'jobs / one at a time: min %.3f, median %.3f, max %.3f\n' "${sorted[0]}" "$median" \
  "${sorted[$((count - 1))]}"
