#!/usr/bin/env bash
# mpirun.sh MPIRUN NP PROGRAM [ARGS...]: runs PROGRAM on NP ranks of this machine,
# oversubscribed (CI has 2 cores). As root (containers, CI) Open MPI needs an explicit
# allowance; the shared-memory transport's single-copy mode needs ptrace rights that
# containers often lack, so it is switched off. Each job keeps its session directory under
# a base of its own: jobs that ctest starts side by side otherwise race to create and remove
# the shared /tmp/ompi.HOST.UID, and the loser ends at once ("A call to mkdir was unable to
# create the desired directory ... File exists"). The bases of jobs that have ended are
# removed by the next job.
set -euo pipefail
mpirun="$1"
np="$2"
shift 2
flags=(-np "$np" --oversubscribe)
if "$mpirun" --version 2>&1 | grep -qiE "open mpi|openrte"; then
  if [ "$(id -u)" -eq 0 ]; then flags+=(--allow-run-as-root); fi
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_rmaps_base_oversubscribe=1
  sessions="${TMPDIR:-/tmp}"
  for base in "$sessions"/ham-mpirun.*; do
    [ -d "$base" ] || continue
    kill -0 "${base##*.}" 2> /dev/null || rm -rf "$base"
  done
  # After the exec below, $$ is mpirun's own pid.
  export OMPI_MCA_orte_tmpdir_base="$sessions/ham-mpirun.$$"
  mkdir -p "$OMPI_MCA_orte_tmpdir_base"
fi
exec "$mpirun" "${flags[@]}" "$@"
