"""Peers of microscale_cuda_bench on the same GPU, in the same run: torch's own device copy (a
second reading of the memory roof), torch bf16 matmuls at the bench's shapes, and torchao's NVFP4
and MX quantization of the same tensors. Run by scripts/gpu-check.sh on the device machine;
prints a table and writes JSON. Each peer that refuses on this device is recorded with its error.

    python3 bench/cuda_peers.py [--iters N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback
from typing import Any, Callable


def median_seconds(torch: Any, f: Callable[[int], object], iters: int) -> float:
    """Median of per-call event timings after three warm-up calls."""
    for i in range(3):
        f(i)
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (a, b) in enumerate(pairs):
        a.record()
        f(i)
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs) * 1e-3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    import torch

    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"torch": torch.__version__, "rows": rows}
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 1
    props = torch.cuda.get_device_properties(0)
    out["device"] = props.name
    l2 = int(getattr(props, "L2_cache_size", 50 << 20))

    def copies(nbytes: int) -> int:
        return max(1, min(64, -(-4 * l2 // max(nbytes, 1))))

    def save() -> None:  # after every row, so a run stopped at its time limit keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    def add(op: str, shape: str, s: float, nbytes: float = 0, flops: float = 0) -> None:
        row = {"op": op, "shape": shape, "us": s * 1e6, "bytes": nbytes, "gbs": nbytes / s * 1e-9,
               "tflops": flops / s * 1e-12}
        rows.append(row)
        print(f"{op:44s} {shape:16s} {s * 1e6:9.1f} us {row['gbs']:8.0f} GB/s {row['tflops']:8.1f} TFLOP/s",
              flush=True)
        save()

    def refused(op: str, e: BaseException) -> None:
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        rows.append({"op": op, "refused": msg})
        print(f"{op:44s} refused: {msg}", flush=True)
        save()

    n = 1 << 31
    a = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(0x5A)
    b = torch.empty_like(a)
    add("torch copy_ (device to device)", "2 GiB", median_seconds(torch, lambda i: b.copy_(a), args.iters), 2.0 * n)
    del a, b

    R, C = 14336, 4096
    shape = f"{R}x{C}"
    gen = torch.Generator(device="cuda").manual_seed(1)
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

        out["torchao"] = __import__("torchao").__version__
    except Exception as e:  # noqa: BLE001 - recorded: the peer is absent or broken here
        refused("import torchao.prototype.mx_formats", e)
        NVFP4Tensor = MXTensor = None  # noqa: N806
    for dtype in (torch.float32, torch.bfloat16):
        x0 = torch.randn(R, C, device="cuda", dtype=torch.float32, generator=gen).to(dtype)
        xs = [x0.clone() for _ in range(copies(x0.nbytes))]
        name = str(dtype).removeprefix("torch.")
        if NVFP4Tensor is not None:
            scale = per_tensor_amax_to_scale(x0.abs().amax())
            # Bytes: the input read, E2M1 codes and E4M3 scales written.
            nbytes = x0.nbytes + R * C // 2 + R * C // 16
            for triton in (False, True):
                op = f"torchao NVFP4Tensor.to_nvfp4 {name}{' triton' if triton else ''}"
                try:
                    s = median_seconds(
                        torch,
                        lambda i: NVFP4Tensor.to_nvfp4(xs[i % len(xs)], per_tensor_scale=scale,
                                                       use_triton_kernel=triton, is_swizzled_scales=triton),
                        args.iters)
                    add(op, shape, s, nbytes)
                except Exception as e:  # noqa: BLE001
                    refused(op, e)
        if MXTensor is not None:
            for elem, label, code_bytes in ((torch.float4_e2m1fn_x2, "mxfp4", R * C // 2),
                                            (torch.float8_e4m3fn, "mxfp8", R * C)):
                op = f"torchao MXTensor.to_mx {name}->{label}"
                try:
                    s = median_seconds(torch, lambda i: MXTensor.to_mx(xs[i % len(xs)], elem, 32), args.iters)
                    add(op, shape, s, x0.nbytes + code_bytes + R * C // 32)
                except Exception as e:  # noqa: BLE001
                    refused(op, e)
        del xs, x0

    for M in (1, 8, 512):
        w0 = torch.randn(R, C, device="cuda", generator=gen).to(torch.bfloat16)
        ws = [w0.clone() for _ in range(copies(w0.nbytes))]
        x = torch.randn(M, C, device="cuda", generator=gen).to(torch.bfloat16)
        s = median_seconds(torch, lambda i: torch.matmul(x, ws[i % len(ws)].t()), args.iters)
        add("torch bf16 x @ W^T", f"{M}x{R}x{C}", s, w0.nbytes + x.nbytes + M * R * 2, 2.0 * M * R * C)
        del ws, w0

    # Last, since it compiles first: torchao's documented way to run its casts.
    if NVFP4Tensor is not None:
        x0 = torch.randn(R, C, device="cuda", generator=gen).to(torch.bfloat16)
        xs = [x0.clone() for _ in range(copies(x0.nbytes))]
        scale = per_tensor_amax_to_scale(x0.abs().amax())
        op = "torchao to_nvfp4 bfloat16 torch.compile"
        try:
            cast = torch.compile(lambda t: NVFP4Tensor.to_nvfp4(t, per_tensor_scale=scale).qdata)
            s = median_seconds(torch, lambda i: cast(xs[i % len(xs)]), args.iters)
            add(op, shape, s, x0.nbytes + R * C // 2 + R * C // 16)
        except Exception as e:  # noqa: BLE001
            refused(op, e)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
