#!/usr/bin/env bash
# Builds, on a machine with nvcc but no GPU, what scripts/gpu_check.sh runs on a GPU
# machine, so that the lent device time goes to tests and benchmarks instead of nvcc
# (routed_attention.cu alone takes about 2 minutes). Carry .gpu-prebuilt (a slim copy of
# the build, packed) and .gpu-deps with the tree, then run there:
#   HAM_GPU_PREBUILT=1 HAM_GPU_BUILD=build-sm90-carry scripts/gpu_check.sh OUT
# The build takes its headers from .gpu-deps (as on the GPU machine: no fmt, MPI or ICU
# libraries to find there) and targets no particular host CPU (no -march=native).
# Usage: scripts/gpu_prebuild.sh [BUILD_DIR]   (default build-sm90)
# Environment: HAM_GPU_ARCH (default 90a), HAM_GPU_TARGETS (default: gpu_check's list + ham).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build-sm90}
arch=${HAM_GPU_ARCH:-90a}
targets=${HAM_GPU_TARGETS:-test_core test_nn test_cuda test_train test_distributed bench_matmul_cuda bench_routed_attention_cuda bench_gated_delta_rule_cuda bench_linear_cross_entropy_cuda bench_memory_bound_cuda bench_decoding_cuda ham}
[[ -d /usr/local/cuda/bin ]] && export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "gpu_prebuild: nvcc not found" >&2; exit 1; }
[[ -f .gpu-deps/include/Eigen/Core ]] || ./scripts/gpu_bundle_deps.sh
stamp=$(scripts/source_stamp.sh)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHAM_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DHAM_DEPS_PREFIX="$PWD/.gpu-deps" -DHAM_ICU=OFF \
  -DHAM_CUDA_EMULATOR=OFF -DHAM_NATIVE=OFF -DHAM_BUILD_TESTS=ON -DHAM_BUILD_BENCH=ON >/dev/null
# shellcheck disable=SC2086
cmake --build "$build" -j "$(nproc)" --target $targets
[[ $(scripts/source_stamp.sh) == "$stamp" ]] ||
  { echo "gpu_prebuild: the sources changed during the build; run it again" >&2; exit 1; }
# A slim copy travels (64 MiB carry limit): programs stripped, CTest files, no objects,
# packed by xz (each program holds the same device code, which xz's window folds into one).
carry="$build-carry"
rm -rf "$carry" && mkdir -p "$carry" .gpu-prebuilt
tar -C "$build" -cf - --exclude=CMakeFiles --exclude='*.o' --exclude='*.a' --exclude=Testing \
  --exclude=pylib --exclude=.ninja_deps --exclude=.ninja_log . | tar -C "$carry" -xf -
find "$carry" -type f -perm -u+x -exec strip --strip-unneeded {} + 2>/dev/null || true  # ELF files only
echo "$stamp" >"$carry/ham_source_stamp"  # gpu_check.sh refuses the build for other sources
tar -cf - "$carry" | xz -9 -T2 >".gpu-prebuilt/$carry.tar.xz"
rm -rf "$carry"
echo "gpu_prebuild: .gpu-prebuilt/$carry.tar.xz, $(du -sh ".gpu-prebuilt/$carry.tar.xz" | cut -f1); carry .gpu-prebuilt and .gpu-deps, then on the GPU machine:"
echo "  HAM_GPU_PREBUILT=1 HAM_GPU_BUILD=$carry scripts/gpu_check.sh OUT"
