#!/usr/bin/env bash
# Speed and memory of the GGUF export on a 1B-shaped model (BENCHMARKS.md, "GGUF with llama.cpp"):
# generates a Llama-3.2-1B-shaped bfloat16 checkpoint with random weights and a byte-level BPE
# tokenizer of the model's whole vocabulary (128256 tokens; bench/make_llama_1b.py), then, ROUNDS
# times each under /usr/bin/time -v (wall time, CPU time, peak RSS), 2 threads:
#   - microscale quantize --format nvfp4 --export gguf
#   - microscale quantize --format nvfp4 --export compressed-tensors (the same input)
#   - llama.cpp's convert_hf_to_gguf.py --outtype bf16
#   - llama.cpp's quantizer (llama_cpp.llama_model_quantize, llama-quantize's library call) from
#     that bf16 GGUF to Q4_0: its nearest type to NVFP4; its NVFP4 file type is refused (printed).
# and prints the medians.
#
#   bench/gguf_export_bench.sh
#
# Environment:
#   WORK           scratch directory, about 9 GB (default /tmp/microscale-1b-gguf)
#   MICROSCALE_CLI the microscale command (default build/src/cli/microscale, a Release build)
#   LLAMA_PY       Python with llama_cpp, torch, transformers, gguf, sentencepiece (default
#                  build/venv-llama/bin/python, see scripts/test-ecosystem.sh)
#   LLAMA_CPP_DIR  llama.cpp's source (default build/ecosystem-check/llama_cpp_python-0.3.36/vendor/llama.cpp,
#                  which scripts/test-ecosystem.sh unpacks)
#   ROUNDS         repetitions of each (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/microscale-1b-gguf}
CLI=${MICROSCALE_CLI:-build/src/cli/microscale}
LLAMA_PY=${LLAMA_PY:-build/venv-llama/bin/python}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-build/ecosystem-check/llama_cpp_python-0.3.36/vendor/llama.cpp}
ROUNDS=${ROUNDS:-3}
SRC=$WORK/llama-1b-bf16
export MICROSCALE_NUM_THREADS=2 OMP_NUM_THREADS=2
mkdir -p "$WORK"

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u '+%F %H:%M UTC')"
echo "== $("$CLI" --version); $("$LLAMA_PY" -c 'import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ["llama_cpp_python", "gguf", "torch", "transformers"]))')"

if [ ! -f "$SRC/tokenizer.json" ]; then
  echo "== generating $SRC"
  "$LLAMA_PY" bench/make_llama_1b.py "$SRC" tests/fixtures/llama
fi
SRC_BYTES=$(du -cb "$SRC"/*.safetensors | tail -1 | cut -f1)
echo "== source: $SRC_BYTES bytes of safetensors"

# Runs "$@" under /usr/bin/time -v; appends "label wall cpu rss_kib" to $WORK/times.
timed() {
  local label=$1 log=$WORK/$1.time
  shift
  echo "-- $label (load average before: $(cut -d' ' -f1-3 /proc/loadavg))"
  /usr/bin/time -v "$@" >"$WORK/$label.out" 2>"$log" || { tail -20 "$log"; return 1; }
  local wall cpu rss
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$log" |
    awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
  cpu=$(awk -F': ' '/User time|System time/ { s += $2 } END { print s }' "$log")
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$log")
  echo "${label%-*} $wall $cpu $rss" >>"$WORK/times"
  awk -v w="$wall" -v c="$cpu" -v r="$rss" 'BEGIN { printf "   wall %.1f s, CPU %.1f s, peak RSS %.0f MiB\n", w, c, r / 1024 }'
}

# llama.cpp's converter identifies a BPE pre-tokenizer by hashing one tokenization; the generated
# tokenizer is not in its table, so where it gives up this answers with Llama 3's name.
CONVERT="import runpy, sys
sys.path.insert(0, sys.argv[1])
from conversion import base
original = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:
        return 'llama-bpe'
base.TextModel.get_vocab_base_pre = pre
script = sys.argv[1] + '/convert_hf_to_gguf.py'
sys.argv = [script] + sys.argv[2:]
runpy.run_path(script, run_name='__main__')"

QUANTIZE="import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype, params.nthread = int(sys.argv[3]), 2
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params)
sys.exit(rc)"

: >"$WORK/times"
for i in $(seq 1 "$ROUNDS"); do
  timed "microscale-gguf-$i" "$CLI" quantize "$SRC" -o "$WORK/nvfp4.gguf" --format nvfp4 --export gguf --force
  timed "microscale-ct-$i" "$CLI" quantize "$SRC" -o "$WORK/nvfp4-ct" --format nvfp4 \
    --export compressed-tensors --force
  rm -f "$WORK/bf16.gguf"
  timed "llama-convert-bf16-$i" "$LLAMA_PY" -c "$CONVERT" "$LLAMA_CPP_DIR" "$SRC" --outtype bf16 \
    --outfile "$WORK/bf16.gguf"
  timed "llama-quantize-q4_0-$i" "$LLAMA_PY" -c "$QUANTIZE" "$WORK/bf16.gguf" "$WORK/q4_0.gguf" \
    "$("$LLAMA_PY" -c 'import llama_cpp; print(llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0)')"
done

echo "== llama.cpp's quantizer asked for NVFP4 (file type $("$LLAMA_PY" -c 'import llama_cpp; print(llama_cpp.LLAMA_FTYPE_MOSTLY_NVFP4)')):"
"$LLAMA_PY" -c "$QUANTIZE" "$WORK/bf16.gguf" "$WORK/nvfp4-llama.gguf" \
  "$("$LLAMA_PY" -c 'import llama_cpp; print(llama_cpp.LLAMA_FTYPE_MOSTLY_NVFP4)')" 2>&1 | tail -3 || true

echo "== sizes"
ls -l "$WORK/nvfp4.gguf" "$WORK/bf16.gguf" "$WORK/q4_0.gguf" | awk '{ print $5, $9 }'
du -cb "$WORK/nvfp4-ct"/*.safetensors | tail -1

echo "== medians of $ROUNDS rounds"
# The median of column $2 of $WORK/times over the rows labelled $1.
median() {
  awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$WORK/times" | sort -g |
    awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
echo "| run | wall s | CPU s | peak RSS MiB | source MB/s |"
echo "|---|---|---|---|---|"
for label in microscale-gguf microscale-ct llama-convert-bf16 llama-quantize-q4_0; do
  awk -v l="$label" -v w="$(median "$label" 2)" -v c="$(median "$label" 3)" -v r="$(median "$label" 4)" \
    -v b="$SRC_BYTES" 'BEGIN { printf "| %s | %.1f | %.1f | %.0f | %.0f |\n", l, w, c, r / 1024, b / 1e6 / w }'
done
