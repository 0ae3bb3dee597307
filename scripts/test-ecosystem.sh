#!/usr/bin/env bash
# The ecosystems' own loaders on microscale's exports of the architecture fixtures (tests/fixtures,
# scripts/make_fixtures.py): transformers + compressed-tensors forward passes, mlx-lm's load_model
# and mx.dequantize, compressed-tensors' and ModelOpt's config parsers, and llm-compressor's own
# NVFP4A16 export of the same fixtures (scripts/ecosystem_check.py says what each check asserts).
# Not part of CI: it downloads several GB of packages. Exits non-zero when a check fails.
#
#   scripts/test-ecosystem.sh
#
# Environment:
#   MICROSCALE_ECO_VENV   venv for torch, transformers, compressed-tensors, nvidia-modelopt, mlx-lm and
#                         mlx[cpu] (default build/venv-ecosystem; created and filled when missing; an
#                         existing one is used as it is when it already imports them all)
#   MICROSCALE_LLMC_VENV  venv for llmcompressor (default build/venv-llmcompressor): it pins older
#                         torch, transformers and compressed-tensors than the others, so it gets its own
#   MICROSCALE_CLI        the microscale command (default build/src/cli/microscale, built when missing)
#   PYTHON                the Python that creates the venvs (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ECO=${MICROSCALE_ECO_VENV:-build/venv-ecosystem}
LLMC=${MICROSCALE_LLMC_VENV:-build/venv-llmcompressor}
CLI=${MICROSCALE_CLI:-build/src/cli/microscale}
WORK=build/ecosystem-check

# Creates venv $1 unless it exists, then installs packages $3... unless `import $2` already works.
ensure_venv() {
  local venv=$1 imports=$2
  shift 2
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  if "$venv/bin/python" -c "import $imports" 2>/dev/null; then
    echo "$venv: $imports all present"
  else
    "$venv/bin/python" -m pip install "$@"
  fi
}

step "microscale command ($CLI)"
if [ ! -x "$CLI" ]; then
  ensure_apt_packages
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMICROSCALE_BUILD_PYTHON=OFF -DMICROSCALE_BUILD_BENCH=OFF
  cmake --build build --target microscale_cli
fi

step "ecosystem venv ($ECO)"
ensure_venv "$ECO" "torch, transformers, compressed_tensors, modelopt.torch.export, mlx.core, mlx_lm, ml_dtypes, safetensors" \
  torch transformers compressed-tensors nvidia-modelopt mlx-lm "mlx[cpu]" ml_dtypes safetensors requests

step "llm-compressor venv ($LLMC)"
ensure_venv "$LLMC" "llmcompressor, ml_dtypes" llmcompressor ml_dtypes

versions() {
  "$1/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md
names = ["torch", "transformers", "compressed-tensors", "nvidia-modelopt", "mlx", "mlx-lm", "llmcompressor"]
found = []
for n in names:
    try:
        found.append(f"{n} {md.version(n)}")
    except md.PackageNotFoundError:
        pass
print(", ".join(found))
PY
}
echo "ecosystem venv: $(versions "$ECO")"
echo "llm-compressor venv: $(versions "$LLMC")"

mkdir -p "$WORK"
status=0
step "transformers, compressed-tensors, ModelOpt, mlx-lm"
"$ECO/bin/python" scripts/ecosystem_check.py main "$CLI" tests/fixtures "$WORK" || status=1
step "llm-compressor"
"$LLMC/bin/python" scripts/ecosystem_check.py llmc "$CLI" tests/fixtures "$WORK" || status=1
exit $status
