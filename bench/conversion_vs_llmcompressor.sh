#!/usr/bin/env bash
# A real-size conversion next to llm-compressor's (BENCHMARKS.md, "Conversion of a 1B model"):
# generates a Llama-3.2-1B-shaped bfloat16 checkpoint with random weights, converts it to nvfp4
# compressed-tensors with `microscale quantize` (RUNS times) and with llm-compressor's data-free
# NVFP4A16 oneshot, each under /usr/bin/time -v (wall time, peak RSS), and compares the outputs
# tensor by tensor (names, dtypes, shapes, equal bytes).
#
#   bench/conversion_vs_llmcompressor.sh
#
# Environment:
#   WORK           scratch directory, about 6 GB (default /tmp/microscale-1b)
#   MICROSCALE_CLI the microscale command (default build/src/cli/microscale, a Release build)
#   ECO_PY         Python with torch, transformers, safetensors, numpy, ml_dtypes
#                  (default build/venv-ecosystem/bin/python, see scripts/test-ecosystem.sh)
#   LLMC_PY        Python with llmcompressor (default build/venv-llmcompressor/bin/python)
#   RUNS           microscale repetitions (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/microscale-1b}
CLI=${MICROSCALE_CLI:-build/src/cli/microscale}
ECO_PY=${ECO_PY:-build/venv-ecosystem/bin/python}
LLMC_PY=${LLMC_PY:-build/venv-llmcompressor/bin/python}
RUNS=${RUNS:-3}
SRC=$WORK/llama-1b-bf16
mkdir -p "$WORK"

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u '+%F %H:%M UTC')"
echo "== $("$CLI" --version); $("$LLMC_PY" -c 'import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ["llmcompressor", "compressed-tensors", "torch", "transformers"]))')"

if [ ! -f "$SRC/config.json" ]; then
  echo "== generating $SRC"
  "$ECO_PY" - "$SRC" <<'PY'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
# Llama-3.2-1B's dimensions; the weights are random (the figures depend on shapes, not values).
cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                  max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5)
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
model = LlamaForCausalLM(cfg)
model.save_pretrained(sys.argv[1])
PY
fi
SRC_BYTES=$(du -cb "$SRC"/*.safetensors | tail -1 | cut -f1)
echo "== source: $SRC_BYTES bytes of safetensors"

# Runs "$@" under /usr/bin/time -v; prints wall seconds, peak RSS and the load average before it.
timed() {
  local label=$1 log=$WORK/$1.time
  shift
  echo "-- $label (load average before: $(cut -d' ' -f1-3 /proc/loadavg))"
  /usr/bin/time -v "$@" >"$WORK/$label.out" 2>"$log" || { tail -20 "$log"; return 1; }
  local wall rss
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$log" |
    awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$log")
  awk -v l="$label" -v w="$wall" -v r="$rss" -v b="$SRC_BYTES" \
    'BEGIN { printf "   %s: wall %.1f s, peak RSS %.0f MiB, %.0f MB/s of source\n", l, w, r / 1024, b / 1e6 / w }'
}

for i in $(seq 1 "$RUNS"); do
  timed "microscale-$i" "$CLI" quantize "$SRC" -o "$WORK/microscale-nvfp4" --format nvfp4 \
    --export compressed-tensors --force
done

rm -rf "$WORK/llmcompressor-nvfp4a16"
timed llmcompressor "$LLMC_PY" - "$SRC" "$WORK/llmcompressor-nvfp4a16" <<'PY'
import sys, torch
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=["lm_head"]))
model.save_pretrained(sys.argv[2], save_compressed=True)
PY

echo "== byte agreement (microscale vs llm-compressor)"
"$ECO_PY" - "$WORK/microscale-nvfp4" "$WORK/llmcompressor-nvfp4a16" "$SRC" <<'PY'
import collections, glob, json, os, sys
import numpy as np
import torch
from safetensors import safe_open

def tensors(d):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(f, "pt") as h:
            for k in h.keys():
                t = h.get_tensor(k)
                out[k] = (str(t.dtype), tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy())
    return out

ours, theirs = tensors(sys.argv[1]), tensors(sys.argv[2])
print(f"tensors: ours {len(ours)}, llm-compressor's {len(theirs)}; same names: {set(ours) == set(theirs)}")
common = sorted(set(ours) & set(theirs))
meta = [k for k in common if ours[k][:2] != theirs[k][:2]]
print(f"same dtype and shape: {len(common) - len(meta)} of {len(common)}" + (f" (differ: {meta[:4]})" if meta else ""))
kinds = collections.defaultdict(lambda: [0, 0, 0, 0])  # tensors, identical tensors, equal bytes, bytes
for k in common:
    if ours[k][:2] != theirs[k][:2]:
        continue
    kind = k.rsplit(".", 1)[1] if k.rsplit(".", 1)[1].startswith("weight_") else "unquantized"
    a, b = ours[k][2], theirs[k][2]
    s = kinds[kind]
    s[0] += 1; s[1] += bool(np.array_equal(a, b)); s[2] += int((a == b).sum()); s[3] += a.size
for kind, (n, same, eq, total) in sorted(kinds.items()):
    print(f"{kind}: {same} of {n} tensors identical; {eq} of {total} bytes equal ({100 * eq / total:.4f} %)")
# The global scales side by side: llm-compressor computes 448*6/amax in bfloat16, microscale in float32.
gs = [k for k in common if k.endswith("weight_global_scale")][:3]
for k in gs:
    print(f"{k}: ours {np.frombuffer(ours[k][2].tobytes(), np.float32)}, theirs {np.frombuffer(theirs[k][2].tobytes(), np.float32)}")
# llm-compressor's block scales: compressed-tensors' calculate_qparams divides the bf16 block amax
# by 6 in bfloat16, multiplies by the global scale (itself 2688/amax computed in bfloat16) and rounds
# to E4M3. Reproducing that from the source weights shows where every scale byte difference comes from.
src = {}
for f in sorted(glob.glob(os.path.join(sys.argv[3], "*.safetensors"))):
    h = safe_open(f, "pt")
    src.update({k: h for k in h.keys()})
repro = 0
modules = [k[: -len(".weight_global_scale")] for k in common if k.endswith(".weight_global_scale")]
for m in modules:
    w = src[m + ".weight"].get_tensor(m + ".weight")
    amax = w.reshape(w.shape[0], -1, 16).abs().amax(-1)
    gs = torch.from_numpy(theirs[m + ".weight_global_scale"][2].view(np.float32).copy())
    sim = ((amax / 6) * gs).to(torch.float8_e4m3fn).view(torch.uint8).reshape(-1).numpy()
    repro += bool(np.array_equal(sim, theirs[m + ".weight_scale"][2]))
print(f"llm-compressor's weight_scale reproduced from the source by the bf16 rule: {repro} of {len(modules)} layers")
# Codes that differ although the global scale and the block scale are the same bytes: where does
# compressed-tensors' x / (scale / global_scale) (float32) fall? Distance to the nearest midpoint
# between two E2M1 magnitudes, relative to the value.
mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
n_diff, worst = 0, 0.0
for m in modules:
    if not np.array_equal(ours[m + ".weight_global_scale"][2], theirs[m + ".weight_global_scale"][2]):
        continue
    w = src[m + ".weight"].get_tensor(m + ".weight").float()
    codes = [torch.from_numpy(d[m + ".weight_packed"][2].copy()).long() for d in (ours, theirs)]
    ca, cb = (torch.stack([c & 15, c >> 4], -1).reshape(w.shape) for c in codes)
    sa, sb = (torch.from_numpy(d[m + ".weight_scale"][2].copy()) for d in (ours, theirs))
    same_scale = (sa == sb).reshape(w.shape[0], -1).repeat_interleave(16, 1)
    diff = (ca != cb) & same_scale & ~(((ca & 7) == 0) & ((cb & 7) == 0))  # +0 and -0 are the same
    gs = torch.from_numpy(theirs[m + ".weight_global_scale"][2].view(np.float32).copy())
    scale = (sb.view(torch.float8_e4m3fn).float().reshape(w.shape[0], -1) / gs).repeat_interleave(16, 1)
    r = (w / scale).abs()[diff]
    n_diff += int(diff.sum())
    if r.numel():
        worst = max(worst, float(((r.unsqueeze(-1) - mids).abs().min(-1).values / r).max()))
print(f"layers with equal global scales: {n_diff} codes differ in blocks of equal scale; the largest relative "
      f"distance of compressed-tensors' x / (scale / global_scale) from an E2M1 rounding midpoint there: {worst}")
qa, qb = (json.load(open(os.path.join(d, "config.json")))["quantization_config"] for d in sys.argv[1:3])
print("quantization_config equal:", qa == qb)
print("ignore lists: ours", qa.get("ignore"), "theirs", qb.get("ignore"))
PY
