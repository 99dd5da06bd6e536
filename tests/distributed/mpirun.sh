#!/usr/bin/env bash
# mpirun.sh MPIRUN NP PROGRAM [ARGS...]: runs PROGRAM on NP ranks of this machine,
# oversubscribed (CI has 2 cores). As root (containers, CI) Open MPI needs an explicit
# allowance; the shared-memory transport's single-copy mode needs ptrace rights that
# containers often lack, so it is switched off.
set -euo pipefail
mpirun="$1"
np="$2"
shift 2
flags=(-np "$np" --oversubscribe)
if "$mpirun" --version 2>&1 | grep -qiE "open mpi|openrte"; then
  if [ "$(id -u)" -eq 0 ]; then flags+=(--allow-run-as-root); fi
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_rmaps_base_oversubscribe=1
fi
exec "$mpirun" "${flags[@]}" "$@"
