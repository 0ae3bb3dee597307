#!/usr/bin/env bash
# Running a quantized model (BENCHMARKS.md, "Running a quantized model (issue 29)"): on a
# Llama-3.2-1B-shaped bfloat16 checkpoint with random weights (bench/make_llama_1b.py), microscale
# writes nvfp4 and mxfp4 compressed-tensors checkpoints and GGUFs; then, in ROUNDS interleaved
# rounds, one process per measurement, 2 threads (bench/model_bench.py says what is timed):
#   - decode tokens/s at batch 1 (a PROMPT-token prompt, then NEW greedy tokens) and prefill
#     tokens/s (PREFILL tokens) for microscale.torch.from_pretrained on each checkpoint (bf16 and
#     float32 activations), transformers bf16 on the source, llama.cpp (llama-cpp-python) on each GGUF;
#   - the memory read bandwidth;
# then the time split of microscale's forward pass (its kernels, lm_head, the rest), the peak RSS
# of loading + one forward of the nvfp4 checkpoint with microscale and with transformers' own
# compressed-tensors load, and the medians with same-run ratios.
#
#   bench/model_bench.sh
#
# Environment:
#   WORK           scratch directory, about 7 GB (default /tmp/microscale-1b-run)
#   SRC            the bf16 source model (default $WORK/llama-1b-bf16, generated when missing)
#   MICROSCALE_CLI the microscale command (default build/src/cli/microscale, a Release build)
#   PY             Python with microscale, torch, transformers (default build/venv/bin/python)
#   MICROSCALE_LLAMA_VENV  venv with llama-cpp-python, built from source for this CPU (default
#                  build/venv-llama, as scripts/test-ecosystem.sh makes it; created when missing)
#   MICROSCALE_CT_VENV     venv with torch, transformers and compressed-tensors, for transformers'
#                  own load of the compressed-tensors checkpoint (default build/venv-ct; created
#                  when missing)
#   ROUNDS         rounds (default 3); PROMPT, NEW, PREFILL token counts (default 16, 64, 512)
#   MS_DTYPES      microscale's activation dtypes (default "bfloat16 float32")
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/microscale-1b-run}
SRC=${SRC:-$WORK/llama-1b-bf16}
CLI=${MICROSCALE_CLI:-build/src/cli/microscale}
PY=${PY:-build/venv/bin/python}
LLAMA_VENV=${MICROSCALE_LLAMA_VENV:-build/venv-llama}
CT_VENV=${MICROSCALE_CT_VENV:-build/venv-ct}
LLAMA_PY=$LLAMA_VENV/bin/python CT_PY=$CT_VENV/bin/python
ROUNDS=${ROUNDS:-3}
PROMPT=${PROMPT:-16} NEW=${NEW:-64} PREFILL=${PREFILL:-512}
MS_DTYPES=${MS_DTYPES:-bfloat16 float32}
export OMP_NUM_THREADS=2 MICROSCALE_NUM_THREADS=2 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
mkdir -p "$WORK"
source scripts/common.sh
# llama-cpp-python compiles its vendored llama.cpp (several minutes on 2 cores); CPU only.
CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF" \
  ensure_venv "$LLAMA_VENV" llama_cpp "llama-cpp-python==0.3.36"
ensure_venv "$CT_VENV" "torch, transformers, compressed_tensors" torch transformers compressed-tensors

if [ ! -f "$SRC/config.json" ]; then
  echo "== generating $SRC"
  "$PY" bench/make_llama_1b.py "$SRC" tests/fixtures/llama
fi

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u '+%F %H:%M UTC')"
echo "== $("$CLI" --version); $("$PY" -c "import microscale; print(f\"microscale.cpu_target() = {microscale.cpu_target()}, package {microscale.__file__}\")")"
echo "== $("$PY" -c 'import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ["torch", "transformers"]))'); $("$LLAMA_PY" -c 'import importlib.metadata as m
print("llama_cpp_python", m.version("llama_cpp_python"))')"

for fmt in nvfp4 mxfp4; do
  "$CLI" quantize "$SRC" --format "$fmt" --export compressed-tensors -o "$WORK/$fmt-ct" --force >/dev/null
  "$CLI" quantize "$SRC" --format "$fmt" --export gguf -o "$WORK/$fmt.gguf" --force >/dev/null
done
echo "== source $(du -cb "$SRC"/*.safetensors | tail -1 | cut -f1) bytes; nvfp4 / mxfp4 compressed-tensors" \
  "$(du -cb "$WORK"/nvfp4-ct/*.safetensors | tail -1 | cut -f1) / $(du -cb "$WORK"/mxfp4-ct/*.safetensors | tail -1 | cut -f1)" \
  "bytes, GGUF $(stat -c %s "$WORK/nvfp4.gguf") / $(stat -c %s "$WORK/mxfp4.gguf") bytes"

LENGTHS=(--prompt "$PROMPT" --new "$NEW" --prefill "$PREFILL")
# Runs one measurement ("$@" after the Python) and appends its JSON line to $WORK/$1.jsonl.
measure() {
  local out=$WORK/$1.jsonl py=$2
  shift 2
  "$py" bench/model_bench.py "$@" | tee -a "$out"
}
: >"$WORK/speed.jsonl"
: >"$WORK/bandwidth.jsonl"
: >"$WORK/split.jsonl"
: >"$WORK/memory.jsonl"
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round"
  measure bandwidth "$PY" bandwidth
  for metric in decode prefill; do
    for fmt in nvfp4 mxfp4; do
      for dtype in $MS_DTYPES; do
        measure speed "$PY" speed microscale "$WORK/$fmt-ct" "$metric" --dtype "$dtype" "${LENGTHS[@]}"
      done
      measure speed "$LLAMA_PY" speed llama "$WORK/$fmt.gguf" "$metric" "${LENGTHS[@]}"
    done
    measure speed "$PY" speed transformers "$SRC" "$metric" --dtype bfloat16 "${LENGTHS[@]}"
  done
done

echo "== time split of microscale's forward pass"
for fmt in nvfp4 mxfp4; do
  for dtype in $MS_DTYPES; do
    measure split "$PY" split "$WORK/$fmt-ct" --dtype "$dtype" "${LENGTHS[@]}"
  done
done

echo "== peak RSS: load + one forward of 16 tokens"
measure memory "$PY" memory microscale "$WORK/nvfp4-ct"
measure memory "$CT_PY" memory transformers "$WORK/nvfp4-ct" ||
  echo "transformers' compressed-tensors load failed (above)"

echo "== done $(date -u "+%F %H:%M UTC"); medians of $ROUNDS rounds"
"$PY" bench/model_bench.py report "$WORK"/{speed,split,bandwidth,memory}.jsonl
