#!/usr/bin/env bash
# The emulator's racecheck over every emulated GPU test (docs/cuda_emulator.md): builds
# the kernels with GCC's -fsanitize=thread instrumentation into build-racecheck/
# (-DHAM_EMULATOR_RACECHECK=ON; the emulator takes the instrumentation's calls, no
# ThreadSanitizer runtime is linked) and runs test_cuda_emulator and test_emulated_gpu
# there. Every load and store of shared and device memory is held against the other threads'
# since the last barrier (or __syncwarp, within a warp), in device memory against the
# launch's other blocks' too and against earlier stream work (kernels, copies, memsets,
# GEMMs) no stream order, event or synchronization orders before it, and cp.async writes
# from its issue to its wait: a race fails its test, naming both sides, the byte and both
# places in the source.
# Not part of scripts/test.sh: a build of its own, and the tests run slower instrumented.
# Usage: ./scripts/racecheck.sh [test_emulated_gpu arguments], e.g. --gtest_filter=*Routed*
# Environment: HAM_RACECHECK_BUILD (default build-racecheck); HAM_EMULATOR_RACECHECK_MEMORY
# (all, the default, or shared: device memory's histories need 36 bytes a byte a launch
# touches, 23 GiB and more at the paper's lengths); HAM_EMULATOR_SCHEDULE and the rest of the
# emulator's settings as usual.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/install_deps.sh
build=${HAM_RACECHECK_BUILD:-build-racecheck}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHAM_CUDA=OFF \
  -DHAM_EMULATOR_RACECHECK=ON -DHAM_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target test_cuda_emulator test_emulated_gpu
export OMP_NUM_THREADS=1
"$build/tests/test_cuda_emulator" --gtest_brief=1
"$build/tests/test_emulated_gpu" --gtest_brief=1 "$@"
