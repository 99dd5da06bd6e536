#!/usr/bin/env bash
# Prints one SHA-256 over everything a build compiles: the C++/CUDA sources, headers and
# CMake files of the tree, the embedded corpus, and the carried dependencies
# (.gpu-deps/include, .gpu-deps/src). gpu_prebuild.sh stores it with a prebuilt build and
# gpu_check.sh compares it with the tree it runs in, so that device time never goes to
# programs built from other sources. Works without git (the device gets a plain copy).
# Usage: scripts/source_stamp.sh   (from anywhere; prints the stamp)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dirs=(core autograd nn models train cuda distributed tests bench)
[[ -d .gpu-deps ]] && dirs+=(.gpu-deps/include .gpu-deps/src)
{
  find "${dirs[@]}" -type f ! -name '*.py' ! -name '*.md' ! -name '*.sh' \
    ! -path '*/__pycache__/*'
  printf '%s\n' CMakeLists.txt scripts/embed_file.cmake
} | LC_ALL=C sort | tr '\n' '\0' | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
