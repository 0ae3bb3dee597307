"""How much of three-level mse's per-block search a byte-preserving skip could save in the SIMD layout.

A numpy model (float64, so a statistics tool, not the spec) of docs/numerics.md's search: for each
candidate global scale, each block tries the E4M3 codes s0, s0-1, s0+1, s0-2, s0+2 and 4over6's s4.
The CPU kernels evaluate 16 blocks at once (one per AVX-512 lane), so a candidate can only be
skipped where, at some checkpoint, the running sum of its squared errors already reaches the best
error found so far in every lane. Prints which code wins how often and the share of element
evaluations such checkpoints would leave.

    build/venv/bin/python bench/mse_pruning_model.py [--dist normal|t3] [--every 4]
"""

import argparse

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E4M3 = np.array([(c & 7) / 8 * 2.0**-6 if c < 8 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7) for c in range(0x7F)])
GLOBAL_MULTIPLIERS = (1.0, 1.03125, 1.0625, 1.09375, 1.75)
LANES, GROUP = 16, 16


def nearest(grid, v):
    return np.abs(v[..., None] - grid).argmin(-1)


def running_errors(mags, multiplier, amax):
    """Cumulative squared error per candidate, block and element: shape (6, blocks, 16)."""
    g = amax * multiplier
    base = mags.max(1) * (2688.0 / g) / 6.0
    s0 = nearest(E4M3, base)
    codes = [s0, s0 - 1, s0 + 1, s0 - 2, s0 + 2, nearest(E4M3, base * 1.5)]
    out = []
    for c in codes:
        dec = E4M3[np.clip(c, 0, 0x7E)] * g / 2688.0
        scaled = np.minimum(mags / np.maximum(dec, 1e-30)[:, None], 6.0)
        d = E2M1[nearest(E2M1, scaled)] * dec[:, None] - mags
        out.append(np.cumsum(d * d, 1))
    return np.array(out)


def evaluated_share(errs, every):
    """Element evaluations left when candidates are dropped at checkpoints every `every` elements."""
    done = 0
    for t in range(errs.shape[1] // LANES):
        tile = errs[:, t * LANES : (t + 1) * LANES, :]
        best = np.full(LANES, np.inf)
        for cand in tile:
            for stop in range(every, GROUP + 1, every):
                done += every
                if stop < GROUP and np.all(cand[:, stop - 1] >= best):
                    break
            else:
                best = np.minimum(best, cand[:, -1])
    return done / (errs.shape[1] // LANES * errs.shape[0] * GROUP)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dist", choices=("normal", "t3"), default="normal")
    ap.add_argument("--every", type=int, default=4, help="elements between checkpoints")
    ap.add_argument("--rows", type=int, default=512)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    shape = (args.rows, 4096)
    w = rng.standard_normal(shape) if args.dist == "normal" else rng.standard_t(3, shape)
    mags = np.abs(w).reshape(-1, GROUP)
    print("multiplier  wins s0 s0-1 s0+1 s0-2 s0+2 s4        evaluations left")
    for m in GLOBAL_MULTIPLIERS:
        errs = running_errors(mags, m, mags.max())
        wins = np.bincount(errs[:, :, -1].argmin(0), minlength=6) / mags.shape[0]
        print(f"{m:<10}  " + " ".join(f"{x:.3f}" for x in wins) + f"   {evaluated_share(errs, args.every):.4f}")


if __name__ == "__main__":
    main()
