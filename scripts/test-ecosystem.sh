#!/usr/bin/env bash
# The ecosystems' own loaders on microscale's exports of the architecture fixtures (tests/fixtures,
# scripts/make_fixtures.py): transformers + compressed-tensors forward passes, mlx-lm's load_model
# and mx.dequantize, compressed-tensors' and ModelOpt's config parsers, and llm-compressor's own
# NVFP4A16 export of the same fixtures (scripts/ecosystem_check.py says what each check asserts),
# and llama.cpp itself (llama-cpp-python, built from source) running the GGUF exports
# (scripts/llama_check.py).
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
#   MICROSCALE_LLAMA_VENV venv for llama-cpp-python (built from its sdist, CPU only) with torch,
#                         transformers, gguf and what llama.cpp's convert_hf_to_gguf.py imports
#                         (default build/venv-llama)
#   MICROSCALE_CLI        the microscale command (default build/src/cli/microscale, built when missing)
#   PYTHON                the Python that creates the venvs (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

ECO=${MICROSCALE_ECO_VENV:-build/venv-ecosystem}
LLMC=${MICROSCALE_LLMC_VENV:-build/venv-llmcompressor}
LLAMA=${MICROSCALE_LLAMA_VENV:-build/venv-llama}
LLAMA_CPP_PYTHON=0.3.36
CLI=${MICROSCALE_CLI:-build/src/cli/microscale}
WORK=build/ecosystem-check

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

step "llama.cpp venv ($LLAMA)"
ensure_venv "$LLAMA" "torch, transformers, gguf, sentencepiece, safetensors, numpy" \
  torch transformers gguf==0.19.0 sentencepiece safetensors numpy
# llama-cpp-python compiles its vendored llama.cpp (several minutes on 2 cores); CPU only.
CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF" \
  ensure_venv "$LLAMA" llama_cpp "llama-cpp-python==$LLAMA_CPP_PYTHON"
# The same release's source, for llama.cpp's own Hugging Face converter (convert_hf_to_gguf.py).
LLAMA_SRC=$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON
if [ ! -f "$LLAMA_SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
  mkdir -p "$WORK"
  "$LLAMA/bin/python" -m pip download --no-deps --no-binary :all: -d "$WORK" "llama-cpp-python==$LLAMA_CPP_PYTHON"
  tar -xzf "$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$WORK"
fi

versions() {
  "$1/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md
names = ["torch", "transformers", "compressed-tensors", "nvidia-modelopt", "mlx", "mlx-lm", "llmcompressor",
         "llama_cpp_python", "gguf"]
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
echo "llama.cpp venv: $(versions "$LLAMA")"

mkdir -p "$WORK"
status=0
step "transformers, compressed-tensors, ModelOpt, mlx-lm"
"$ECO/bin/python" scripts/ecosystem_check.py main "$CLI" tests/fixtures "$WORK" || status=1
step "llm-compressor"
"$LLMC/bin/python" scripts/ecosystem_check.py llmc "$CLI" tests/fixtures "$WORK" || status=1
step "llama.cpp (llama-cpp-python $LLAMA_CPP_PYTHON)"
"$LLAMA/bin/python" scripts/llama_check.py "$CLI" tests/fixtures "$WORK/llama" "$LLAMA_SRC/vendor/llama.cpp" || status=1
exit $status
