#!/usr/bin/env python3
"""MLX CPU peer benchmark for microscale: quantize, dequantize and quantized_matmul.

Same problem as bench/bench_matmul.cpp: a float32 weight of N x K = 14336 x 4096 (rows of
K = 4096, the reduction dimension), quantized along K, multiplied as y = x @ w.T with x of M
rows. Every timed call is forced with mx.eval; only the op is timed (inputs are evaluated
before the clock starts). Reports the median and the minimum over repetitions.

    python bench/peers/mlx_bench.py                       # everything, about 2-3 minutes idle
    python bench/peers/mlx_bench.py --only quantize,qmm   # subsets: quantize, dequantize, qmm, qmm512
    python bench/peers/mlx_bench.py --modes nvfp4,mxfp4 --json /tmp/mlx.json

Rates: quantize / dequantize in G elements/s (of the 14336 x 4096 weight); quantized_matmul in
GFLOP/s (2 * M * N * K) and, for M = 1, GB/s of weight bytes (packed + scales + biases).
MLX's CPU backend runs these ops on one thread.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone

import mlx.core as mx

N, K = 14336, 4096
MODES = {
    # mode: (group_size, bits)
    "nvfp4": (16, 4),
    "mxfp4": (32, 4),
    "mxfp8": (32, 8),
    "affine": (64, 4),
}
SECTIONS = ("quantize", "dequantize", "qmm", "qmm512")


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def evaluate(out) -> None:
    if isinstance(out, (tuple, list)):
        mx.eval(*[o for o in out if o is not None])
    else:
        mx.eval(out)


def time_op(fn, budget_s: float, min_reps: int, max_reps: int, warmup: bool, keep: list | None = None) -> list[float]:
    """Runs fn() (returning MLX arrays) and returns per-call seconds, each call forced by mx.eval.

    One warmup call (not reported; its time picks the repetition count so that a case takes
    about budget_s), then at least min_reps and at most max_reps timed calls. If keep is a list,
    the last call's output is appended to it.
    """
    probe = None
    if warmup:
        t0 = time.perf_counter()
        evaluate(fn())
        probe = time.perf_counter() - t0
    reps = min_reps if probe is None else max(min_reps, min(max_reps, int(budget_s / max(probe, 1e-6))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        evaluate(out)
        times.append(time.perf_counter() - t0)
        if keep is not None and len(times) == reps:
            keep.append(out)
        del out
    return times


def weight_bytes(q) -> int:
    return sum(a.nbytes for a in q if a is not None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of sections: {','.join(SECTIONS)}")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of modes: nvfp4,mxfp4,mxfp8,affine")
    ap.add_argument("--qmm512-modes", default="nvfp4,mxfp4", help="modes for the M = 512 GEMM (slow: ~12 s a call)")
    ap.add_argument("--budget", type=float, default=4.0, help="target seconds of timed calls per case")
    ap.add_argument("--min-reps", type=int, default=2)
    ap.add_argument("--max-reps", type=int, default=50)
    ap.add_argument("--slow-reps", type=int, default=2, help="timed calls for M = 512 (no warmup)")
    ap.add_argument("--nvfp4-global-scale", action="store_true",
                    help="also time nvfp4 quantize with a supplied global_scale (three-level)")
    ap.add_argument("--json", metavar="FILE", help="write results as JSON")
    args = ap.parse_args()

    only = [s for s in args.only.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    for s in only:
        if s not in SECTIONS:
            ap.error(f"unknown section {s!r}")
    for m in modes + args.qmm512_modes.split(","):
        if m and m not in MODES:
            ap.error(f"unknown mode {m!r}")

    mx.set_default_device(mx.cpu)
    meta = {
        "mlx": mx.__version__,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "loadavg_start": loadavg(),
        "shape": {"N": N, "K": K},
    }
    print(f"# MLX {meta['mlx']} CPU, weight {N} x {K} float32, {meta['date']}, loadavg {meta['loadavg_start']}")

    mx.random.seed(7)
    w = mx.random.normal((N, K), dtype=mx.float32) * 0.02
    mx.eval(w)
    # MLX's nvfp4 global_scale is the tensor amax (f32 scalar); the encode factor is 2688 / amax.
    gscale = mx.max(mx.abs(w)).astype(mx.float32)
    mx.eval(gscale)

    results = []
    qcache: dict[str, tuple] = {}

    def quantized(mode: str):
        if mode not in qcache:
            gs, bits = MODES[mode]
            q = mx.quantize(w, group_size=gs, bits=bits, mode=mode)
            evaluate(q)
            qcache[mode] = tuple(q) if len(q) == 3 else (q[0], q[1], None)
        return qcache[mode]

    def record(section, name, times, rate, unit, extra=None):
        med = statistics.median(times)
        r = {
            "section": section,
            "case": name,
            "reps": len(times),
            "median_ms": med * 1e3,
            "min_ms": min(times) * 1e3,
            "times_ms": [t * 1e3 for t in times],
            "rate": rate(med),
            "unit": unit,
            "loadavg": loadavg(),
        }
        if extra:
            r.update(extra)
        results.append(r)
        extra_s = ""
        if extra and "weight_GBps" in extra:
            extra_s = f"  {extra['weight_GBps']:8.2f} GB/s"
        print(f"{section:10s} {name:34s} {r['reps']:4d} {r['median_ms']:11.3f} {r['min_ms']:11.3f}"
              f"  {r['rate']:9.4g} {unit}{extra_s}", flush=True)

    def failed(section, name, e):
        results.append({"section": section, "case": name, "error": str(e)})
        print(f"{section:10s} {name:34s} ERROR {e}", flush=True)

    print(f"{'section':10s} {'case':34s} {'reps':>4s} {'median ms':>11s} {'min ms':>11s}  {'rate':>9s}")
    el = N * K
    tk = dict(budget_s=args.budget, min_reps=args.min_reps, max_reps=args.max_reps, warmup=True)

    if "quantize" in only:
        cases = [(m, None) for m in modes]
        if args.nvfp4_global_scale and "nvfp4" in modes:
            cases.append(("nvfp4", gscale))
        for mode, g in cases:
            gs, bits = MODES[mode]
            name = f"f32->{mode}" + (f" g{gs}" if mode == "affine" else "") + (" +global_scale" if g is not None else "")
            kw = {"global_scale": g} if g is not None else {}
            try:
                kept: list = []
                times = time_op(lambda: mx.quantize(w, group_size=gs, bits=bits, mode=mode, **kw), keep=kept, **tk)
                record("quantize", name, times, lambda t: el / t / 1e9, "Gel/s")
                if g is None and mode not in qcache:  # reuse for dequantize / qmm
                    q = kept[0]
                    qcache[mode] = tuple(q) if len(q) == 3 else (q[0], q[1], None)
            except Exception as e:  # noqa: BLE001 - report and continue
                failed("quantize", name, e)

    if "dequantize" in only:
        for mode in modes:
            gs, bits = MODES[mode]
            for dt, dn in ((mx.float32, "f32"), (mx.bfloat16, "bf16")):
                name = f"{mode}->{dn}"
                try:
                    wq, sc, bi = quantized(mode)
                    times = time_op(lambda: mx.dequantize(wq, sc, bi, group_size=gs, bits=bits, mode=mode, dtype=dt), **tk)
                    record("dequantize", name, times, lambda t: el / t / 1e9, "Gel/s")
                except Exception as e:  # noqa: BLE001
                    failed("dequantize", name, e)

    def qmm_case(section, mode, M, xdt, xn, timing):
        gs, bits = MODES[mode]
        name = f"{mode} M={M} x={xn}"
        try:
            wq, sc, bi = quantized(mode)
            x = mx.random.normal((M, K), dtype=mx.float32).astype(xdt)
            mx.eval(x)
            times = time_op(lambda: mx.quantized_matmul(x, wq, sc, bi, transpose=True, group_size=gs,
                                                        bits=bits, mode=mode), **timing)
            wb = weight_bytes((wq, sc, bi))
            med = statistics.median(times)
            extra = {"M": M, "weight_bytes": wb}
            if M == 1:  # GEMV: the weight bytes are the traffic
                extra["weight_GBps"] = wb / med / 1e9
            record(section, name, times, lambda t: 2.0 * M * N * K / t / 1e9, "GFLOP/s", extra)
        except Exception as e:  # noqa: BLE001
            failed(section, name, e)

    if "qmm" in only:
        for mode in modes:
            for xdt, xn in ((mx.float32, "f32"), (mx.bfloat16, "bf16")):
                qmm_case("qmm", mode, 1, xdt, xn, tk)

    if "qmm512" in only:
        slow = dict(budget_s=0.0, min_reps=args.slow_reps, max_reps=args.slow_reps, warmup=False)
        for mode in [m for m in args.qmm512_modes.split(",") if m]:
            qmm_case("qmm512", mode, 512, mx.float32, "f32", slow)

    meta["loadavg_end"] = loadavg()
    print(f"# loadavg at end {meta['loadavg_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
