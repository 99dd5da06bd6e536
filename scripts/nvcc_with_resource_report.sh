#!/usr/bin/env bash
# The CUDA compiler launcher of scripts/kernel_resources.sh: runs the nvcc command it is
# given and keeps, beside the object OBJ, what ptxas reports of each kernel (OBJ.ptxas:
# registers, spills, static shared memory) and the PTX (OBJ.keep/*.ptx: .maxntid, the
# threads a __launch_bounds__ allows).
set -uo pipefail
object=""
previous=""
for argument in "$@"; do
  [[ $previous == -o ]] && object=$argument
  previous=$argument
done
[[ -n $object ]] || exec "$@"
rm -rf "$object.keep" && mkdir -p "$object.keep"
"$@" -Xptxas=-v -keep -keep-dir "$object.keep" 2>"$object.ptxas"
status=$?
find "$object.keep" -type f ! -name '*.ptx' -delete  # -keep leaves every intermediate
grep -v '^ptxas info\|^    [0-9]* bytes stack frame' "$object.ptxas" >&2
exit $status
