#!/usr/bin/env bash
# Builds microscale (Release, build/) and runs `microscale eval`: quantization error and speed of
# every mode on synthetic weight matrices. Extra arguments go to `microscale eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

step "system packages"
ensure_apt_packages

step "configure + build (Release, build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMICROSCALE_BUILD_PYTHON=OFF
cmake --build build --target microscale_cli -j "$(jobs)"

step "microscale eval"
# The table's CSV and plot go to build/, not into the checkout.
build/src/cli/microscale eval --csv build/microscale-eval.csv --svg build/microscale-eval.svg "$@"
