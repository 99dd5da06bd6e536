#!/usr/bin/env bash
# Checks, on a machine with nvcc but no GPU, that the H200 would accept every kernel launch
# the emulated GPU tests make: registers, __launch_bounds__ and static shared memory as nvcc
# gives them, against each kernel's largest launch (scripts/kernel_resources.py says how).
#   1. builds the CUDA backend for sm_90a into build-resources, with ptxas's report and the
#      PTX kept beside each object (scripts/nvcc_with_resource_report.sh);
#   2. without LAUNCH_LOGs given, runs build/tests/test_emulated_gpu (the emulator build of
#      ./scripts/build.sh; about 3 minutes on 2 cores) with HAM_EMULATOR_LAUNCH_LOG set to
#      build-resources/emulated_launches.log;
#   3. prints each launched kernel's resources and occupancy; exit 1 if a launch would fail.
# Usage: scripts/kernel_resources.sh [LAUNCH_LOG ...]
# Environment: HAM_GPU_ARCH (default 90a, the H200's; for another, the wgmma kernels the
# emulator runs are not compiled, and their launches fail the join). Give the logs of runs
# at the paper's lengths (HAM_EMULATOR_LONGEST_SEQUENCE=16384 HAM_EMULATOR_LAUNCH_LOG=FILE
# ...) to check their launches too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -d /usr/local/cuda/bin ]] && export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "kernel_resources: nvcc not found" >&2; exit 1; }
build=build-resources
arch=${HAM_GPU_ARCH:-90a}
[[ $arch =~ ^[0-9]+a?$ ]] ||
  { echo "kernel_resources: HAM_GPU_ARCH=$arch: expected one architecture, e.g. 90a" >&2; exit 1; }
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHAM_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DHAM_CUDA_EMULATOR=OFF \
  -DHAM_BUILD_TESTS=OFF -DHAM_BUILD_BENCH=OFF \
  -DCMAKE_CUDA_COMPILER_LAUNCHER="$PWD/scripts/nvcc_with_resource_report.sh" >/dev/null
cmake --build "$build" -j "$(nproc)" --target ham_cuda
logs=("$@")
if [[ ${#logs[@]} -eq 0 ]]; then
  emulated=build/tests/test_emulated_gpu
  [[ -x $emulated ]] ||
    { echo "kernel_resources: $emulated missing; run ./scripts/build.sh" >&2; exit 1; }
  log=$build/emulated_launches.log  # kept, for scripts/kernel_resources.py $build $log --all
  rm -f "$log"
  echo "kernel_resources: running $emulated to record its launches in $log"
  HAM_EMULATOR_LAUNCH_LOG=$PWD/$log OMP_NUM_THREADS=1 "$emulated" --gtest_brief=1 >/dev/null
  logs=("$log")
fi
scripts/kernel_resources.py "$build" "${logs[@]}"
