"""Python call overhead of the microscale package (issue 14): a 16 x 64 quantize and a
1 x 4096 by 4096 x 4096 nvfp4 GEMV through the public API (numpy and torch inputs), against the
same C++ call made directly through microscale._core (the overhead is the difference) and against
torchao's own Python quantize of the same tensor.

    python bench/python_overhead.py [--repeats N]

Prints one line per case: the median and the minimum over N timed batches of the per-call time,
in microseconds (each batch runs the call enough times to last about a millisecond). On a shared,
loaded machine the minimum is the better estimate of the cost itself (the batches that nothing
preempted); the median includes the machine's load. Needs the built package;
torch and torchao rows are skipped when they are not installed.
"""

import argparse
import platform
import statistics
import sys
import time

import numpy as np

import microscale
from microscale import _core


def per_call_us(fn, repeats, min_batch_s=1e-3):
    fn()  # warm up (imports, first-touch allocations)
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= min_batch_s:
            break
        n *= 2
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples), min(samples)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=201)
    args = ap.parse_args()
    r = args.repeats
    print(f"# {cpu_model()}, {microscale.cpu_target()}, {microscale.num_threads()} threads, "
          f"python {platform.python_version()}, numpy {np.__version__}, repeats {r}")
    rows = []

    rng = np.random.default_rng(0)
    x_small = rng.standard_normal((16, 64)).astype(np.float32)
    spec_small = _core.QuantSpec(mode=_core.Mode.nvfp4)
    rows.append(("quantize 16x64 nvfp4: _core direct (numpy)",
                 per_call_us(lambda: _core.quantize(x_small, spec_small), r)))
    rows.append(("quantize 16x64 nvfp4: microscale.quantize (numpy)",
                 per_call_us(lambda: microscale.quantize(x_small, mode="nvfp4"), r)))
    rows.append(("quantize_dequantize 16x64 nvfp4 (numpy)",
                 per_call_us(lambda: microscale.quantize_dequantize(x_small, mode="nvfp4"), r)))

    w = (rng.standard_normal((4096, 4096)) * 0.02).astype(np.float32)
    xv = rng.standard_normal((1, 4096)).astype(np.float32)
    wq, ws = microscale.quantize(w, mode="nvfp4")
    spec_mm = _core.QuantSpec(mode=_core.Mode.nvfp4)
    rows.append(("GEMV 1x4096 @ 4096x4096^T nvfp4: _core direct (numpy)",
                 per_call_us(lambda: _core.quantized_matmul(xv, wq, ws, None, True, spec_mm, None), r)))
    rows.append(("GEMV 1x4096 @ 4096x4096^T nvfp4: microscale.quantized_matmul (numpy)",
                 per_call_us(lambda: microscale.quantized_matmul(xv, wq, ws, mode="nvfp4"), r)))

    try:
        import torch
    except ImportError:
        torch = None
        print("# torch not installed: torch rows skipped")
    if torch is not None:
        t_small = torch.from_numpy(x_small)
        rows.append(("quantize 16x64 nvfp4: microscale.quantize (torch in, torch out)",
                     per_call_us(lambda: microscale.quantize(t_small, mode="nvfp4"), r)))
        t_bf16 = t_small.to(torch.bfloat16)
        rows.append(("quantize 16x64 nvfp4: microscale.quantize (torch bfloat16)",
                     per_call_us(lambda: microscale.quantize(t_bf16, mode="nvfp4"), r)))
        twq, tws = torch.from_numpy(wq), torch.from_numpy(ws)
        txv = torch.from_numpy(xv)
        rows.append(("GEMV 1x4096 @ 4096x4096^T nvfp4: microscale.quantized_matmul (torch)",
                     per_call_us(lambda: microscale.quantized_matmul(txv, twq, tws, mode="nvfp4"), r)))
        try:
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.prototype.mx_formats.mx_tensor import MXTensor
            from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
        except ImportError:
            print("# torchao not installed: torchao rows skipped")
        else:
            rows.append(("quantize 16x64 nvfp4: torchao NVFP4Tensor.to_nvfp4 (torch)",
                         per_call_us(lambda: NVFP4Tensor.to_nvfp4(t_small), r)))
            rows.append(("quantize 16x64 mxfp4: microscale.quantize (torch)",
                         per_call_us(lambda: microscale.quantize(t_small, mode="mxfp4"), r)))
            rows.append(("quantize 16x64 mxfp4: torchao MXTensor.to_mx RCEIL (torch)",
                         per_call_us(lambda: MXTensor.to_mx(t_small, torch.float4_e2m1fn_x2, 32,
                                                            scaling_mode=ScaleCalculationMode.RCEIL), r)))
            tw = torch.from_numpy(w)
            rows.append(("quantize 4096x4096 nvfp4: microscale.quantize (torch)",
                         per_call_us(lambda: microscale.quantize(tw, mode="nvfp4"), max(5, r // 20))))
            rows.append(("quantize 4096x4096 nvfp4: torchao NVFP4Tensor.to_nvfp4 (torch)",
                         per_call_us(lambda: NVFP4Tensor.to_nvfp4(tw), max(5, r // 20))))

    width = max(len(name) for name, _ in rows)
    print(f"{'case':<{width}}  {'median us':>10}  {'min us':>10}")
    for name, (median, best) in rows:
        print(f"{name:<{width}}  {median:10.2f}  {best:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
