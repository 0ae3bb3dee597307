#!/usr/bin/env bash
# Speed and memory of the GGUF export on a 1B-shaped model (BENCHMARKS.md, "GGUF with llama.cpp"):
# generates a Llama-3.2-1B-shaped bfloat16 checkpoint with random weights and a byte-level BPE
# tokenizer of the model's whole vocabulary (128256 tokens), then, ROUNDS times each under
# /usr/bin/time -v (wall time, CPU time, peak RSS), 2 threads:
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
  "$LLAMA_PY" - "$SRC" tests/fixtures/llama <<'PY'
import json, os, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
out, fixture = sys.argv[1:3]
VOCAB, SPECIALS = 128256, 256
# Llama-3.2-1B's dimensions; the weights are random (the timings depend on shapes, not values).
cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, vocab_size=VOCAB, tie_word_embeddings=True,
                  max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                  bos_token_id=VOCAB - SPECIALS, eos_token_id=VOCAB - SPECIALS + 1)
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
LlamaForCausalLM(cfg).save_pretrained(out)
# A byte-level BPE as large as Llama 3's: the 256 byte symbols, then merged tokens (every pair of
# byte symbols, then byte-pair + byte) up to 128000, then 256 special tokens as Llama 3 has them.
# The fixture's tokenizer.json gives the pre-tokenizer, decoder and post-processor.
tj = json.load(open(os.path.join(fixture, "tokenizer.json")))
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
symbols = [chr(c) for c in cs]
vocab, merges = {s: i for i, s in enumerate(symbols)}, []
pairs = ((a, b) for a in symbols for b in symbols)
triples = ((a + b, c) for a in symbols for b in symbols for c in symbols)
for left, right in (p for gen in (pairs, triples) for p in gen):
    if len(vocab) == VOCAB - SPECIALS:
        break
    vocab[left + right] = len(vocab)
    merges.append([left, right])
names = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
names += [f"<|reserved_special_token_{k}|>" for k in range(SPECIALS - len(names))]
added = [{"id": VOCAB - SPECIALS + k, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for k, t in enumerate(names)]
for a in added:
    vocab[a["content"]] = a["id"]
tj["model"]["vocab"], tj["model"]["merges"], tj["added_tokens"] = vocab, merges, added
template = next(p for p in tj["post_processor"]["processors"] if p["type"] == "TemplateProcessing")
template["special_tokens"]["<|begin_of_text|>"]["ids"] = [VOCAB - SPECIALS]
json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
tc = json.load(open(os.path.join(fixture, "tokenizer_config.json")))
tc["added_tokens_decoder"] = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                               "single_word", "special")} for a in added}
json.dump(tc, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)
PY
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
