#!/usr/bin/env bash
# Configures and builds ham in build/ (Release, Ninja, one job per core).
# Extra arguments go to the CMake configure step, e.g.
#   ./scripts/build.sh -DHAM_CUDA=OFF -DHAM_NATIVE=OFF
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
ninja -C build -j "$(nproc)"
