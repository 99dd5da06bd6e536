#!/usr/bin/env bash
# One command from a fresh Debian machine to a training run: installs the missing
# packages, builds, then trains. Arguments are passed to `ham train`; with none it trains
# a small Transformer on the embedded corpus on CPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/install_deps.sh
./scripts/build.sh
exec ./build/ham train "$@"
