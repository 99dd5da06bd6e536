#!/usr/bin/env bash
# Gathers, on this (Debian) machine, what a build on the bare GPU machine needs but that
# machine lacks, into .gpu-deps/ (ignored by git; carried to the GPU machine with the tree):
#   include/  Eigen, nlohmann/json, CLI11 and fmt headers (fmt used header-only)
#   src/googletest/  GoogleTest's sources, built there with the tests
#   wheels/   flash-linear-attention's kernels (fla-core, pure Python + Triton) and einops,
#             the reference the gated delta rule benchmark compares against (pip download:
#             this machine has network; skipped with a note when it has none)
# Not carried: ICU (31 MB of data; the GPU build sets -DHAM_ICU=OFF, so only the BPE
# tokenizer is unavailable there, with an error saying so), MPI (single-process GPU tests)
# and Google Benchmark (the CUDA GEMM benchmark is a plain program).
# Usage: ./scripts/gpu_bundle_deps.sh [DEST]   (default .gpu-deps)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=${1:-.gpu-deps}

require() {
  if [[ ! -e $1 ]]; then
    echo "gpu_bundle_deps: missing $1 (run scripts/install_deps.sh first)" >&2
    exit 1
  fi
}
require /usr/include/eigen3/Eigen/Core
require /usr/include/nlohmann/json.hpp
require /usr/include/CLI/CLI.hpp
require /usr/include/fmt/format.h
require /usr/src/googletest/googletest/CMakeLists.txt

rm -rf "$dest"
mkdir -p "$dest/include" "$dest/src/googletest"
# Eigen's headers without its unsupported/ modules (ham uses none).
cp -r /usr/include/eigen3/Eigen "$dest/include/"
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/fmt "$dest/include/"
# GoogleTest without googlemock, docs, samples and its own tests.
src=/usr/src/googletest/googletest
cp -r "$src/CMakeLists.txt" "$src/cmake" "$src/include" "$src/src" "$dest/src/googletest/"
# The FLA reference for bench/bench_gated_delta_rule_fla.py. The GPU machine has torch and
# triton; fla-core needs only einops beyond them.
mkdir -p "$dest/wheels"
if ! python3 -m pip download --quiet --no-deps -d "$dest/wheels" fla-core==0.6.0 einops; then
  echo "gpu_bundle_deps: could not download the fla-core wheel; the GPU check will time ham's gated delta rule alone" >&2
fi
cat > "$dest/README" <<NOTE
Made by scripts/gpu_bundle_deps.sh on $(date -u +%Y-%m-%d) from this machine's packages:
eigen $(dpkg-query -W -f='${Version}' libeigen3-dev 2>/dev/null || echo '?'),
nlohmann-json $(dpkg-query -W -f='${Version}' nlohmann-json3-dev 2>/dev/null || echo '?'),
CLI11 $(dpkg-query -W -f='${Version}' libcli11-dev 2>/dev/null || echo '?'),
fmt $(dpkg-query -W -f='${Version}' libfmt-dev 2>/dev/null || echo '?'),
googletest $(dpkg-query -W -f='${Version}' googletest 2>/dev/null || echo '?').
Use: cmake -DHAM_DEPS_PREFIX=$dest -DHAM_ICU=OFF ...
NOTE
echo "gpu_bundle_deps: $(du -sh "$dest" | cut -f1) in $dest"
