"""GPTQ against round to nearest (and scale search) on synthetic calibrated data, for BENCHMARKS.md.

    PYTHONPATH=<built package> python bench/quality_gptq.py [--speed]

A weight W [1024, 1024] (Gaussian, std 0.02) and correlated Gaussian activations x = z @ M with
M = (G1, row i scaled by 1 / (1 + 0.05 i)) @ G2 / K and 4 outlier channels scaled by 12 (the
construction of tests/python/test_gptq.py): H from 8192 calibration rows, errors on 4096 held-out
rows. Prints a markdown table of the relative weight error ||W - Wq|| / ||W|| and the relative
output error ||x W^T - x Wq^T|| / ||x W^T||. --speed also times accumulate_hessian and gptq on a
4096 x 4096 weight.
"""

import argparse
import time

import numpy as np

import microscale


def calibrated_case(seed, n_out, k, n_cal, n_test):
    rng = np.random.default_rng(seed)
    mixing = (rng.standard_normal((k, k)) / (1 + 0.05 * np.arange(k))[:, None]) @ rng.standard_normal((k, k)) / k
    outliers = rng.choice(k, 4, replace=False)

    def activations(n):
        x = rng.standard_normal((n, k)) @ mixing
        x[:, outliers] *= 12.0
        return x.astype(np.float32)

    w = (rng.standard_normal((n_out, k)) * 0.02).astype(np.float32)
    return w, activations(n_cal), activations(n_test)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--speed", action="store_true", help="also time GPTQ on a 4096 x 4096 weight")
    args = ap.parse_args()

    w, x_cal, x_test = calibrated_case(0, 1024, 1024, 8192, 4096)
    h = microscale.accumulate_hessian(x_cal)
    y = x_test.astype(np.float64) @ w.astype(np.float64).T
    gs = microscale.global_scale(w)
    formats = [("nvfp4 (three-level)", {"mode": "nvfp4", "global_scale": gs}, True),
               ("mxfp4", {"mode": "mxfp4"}, True),
               ("affine int4 g64", {"mode": "affine", "bits": 4, "group_size": 64}, False)]
    print("| format | method | weight rel. error | output rel. error (held-out) |")
    print("|---|---|---|---|")
    for label, kw, has_mse in formats:
        runs = [("round to nearest", microscale.quantize(w, **kw))]
        if has_mse:
            runs.append(("mse scale search", microscale.quantize(w, scale_search="mse", **kw)))
        runs.append(("GPTQ", microscale.gptq(w, h, **kw)))
        for method, parts in runs:
            dkw = dict(kw)
            if kw["mode"] == "nvfp4" and len(parts) == 3:  # the searched global scale
                dkw["global_scale"] = parts[2]
                parts = parts[:2]
            wq = microscale.dequantize(*parts, **dkw) if kw["mode"] == "affine" else \
                microscale.dequantize(parts[0], parts[1], **dkw)
            out = x_test.astype(np.float64) @ wq.astype(np.float64).T
            print(f"| {label} | {method} | {rel(w, wq):.4f} | {rel(y, out):.4f} |")

    if args.speed:
        rng = np.random.default_rng(1)
        k = 4096
        x = rng.standard_normal((4096, k)).astype(np.float32)
        t = time.perf_counter()
        h = microscale.accumulate_hessian(x)
        t_acc = time.perf_counter() - t
        w = (rng.standard_normal((k, k)) * 0.02).astype(np.float32)
        t = time.perf_counter()
        microscale.gptq(w, h, mode="nvfp4")
        t_gptq = time.perf_counter() - t
        t = time.perf_counter()
        microscale.quantize(w, mode="nvfp4")
        t_rtn = time.perf_counter() - t
        print(f"\n4096 x 4096, {microscale.num_threads()} threads: accumulate_hessian of 4096 rows "
              f"{t_acc:.1f} s, gptq (nvfp4) {t_gptq:.1f} s, round to nearest {t_rtn * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
