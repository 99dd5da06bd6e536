#!/usr/bin/env bash
# Runs a CUDA benchmark program built for the SIMT emulator with --smoke (small cases that
# take every table's path; the times mean nothing) and checks what a GPU session's scripts
# read from it: exit status 0, and a CSV whose every row has as many fields as its header
# (commas inside quotes, as in kernel names, not counted).
# Usage: bench/smoke_on_emulated_gpu.sh PROGRAM CSV [MORE ARGUMENTS]
# With SMOKE_CSV_ROWS=N in the environment, the CSV must also have exactly N rows (a
# --filter's cases).
set -euo pipefail
program=$1
csv=$2
shift 2
rm -f "$csv"
"$program" --smoke --reps 1 --csv "$csv" "$@"
if [ ! -s "$csv" ]; then
  echo "smoke_on_emulated_gpu: $program wrote no CSV at $csv" >&2
  exit 1
fi
awk -v file="$csv" '
  { line = $0; gsub(/"[^"]*"/, "", line); fields = gsub(/,/, ",", line) + 1 }
  NR == 1 { header = fields; next }
  fields != header {
    printf "smoke_on_emulated_gpu: %s line %d has %d fields, its header %d\n", file, NR,
           fields, header > "/dev/stderr"
    bad = 1
  }
  END {
    if (NR < 2) { printf "smoke_on_emulated_gpu: %s has no rows\n", file > "/dev/stderr"; exit 1 }
    exit bad
  }' "$csv"
rows=$(($(wc -l < "$csv") - 1))
if [ -n "${SMOKE_CSV_ROWS:-}" ] && [ "$rows" -ne "$SMOKE_CSV_ROWS" ]; then
  echo "smoke_on_emulated_gpu: $csv has $rows rows, not the $SMOKE_CSV_ROWS expected" >&2
  exit 1
fi
echo "smoke_on_emulated_gpu: $(basename "$program") $* passed, $rows CSV rows"
