#!/usr/bin/env bash
# Installs the missing packages, builds, and runs the whole test suite.
# Exits with ctest's status. Extra arguments go to ctest, e.g. ./scripts/test.sh -R Matmul
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/install_deps.sh
./scripts/build.sh
status=0
ctest --test-dir build --output-on-failure -j 2 "$@" || status=$?
exit "$status"
