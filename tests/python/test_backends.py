"""Every backend and SIMD target, and thread counts, against the spec oracle: the cpu kernels
must give the same bytes as the reference backend (FORMATS.md is the contract for both)."""

import numpy as np
import pytest

import microscale
import spec_oracle as O
from conftest import FLOAT_DTYPES, assert_same_bits
from test_oracle import ALL_CONFIGS, check_roundtrip, group_of, make_input

TARGETS = [("reference", None)] + [("cpu", t) for t in microscale.available_cpu_targets()]


@pytest.fixture
def runtime():
    """Restores the default backend, target and threads after the test."""
    yield
    microscale.set_backend("cpu")
    microscale.set_cpu_target("auto")
    microscale.set_num_threads(0)


def select(backend, target):
    microscale.set_backend(backend)
    if target is not None:
        microscale.set_cpu_target(target)
        assert microscale.cpu_target() == target
    assert microscale.backend() == backend


def test_runtime_settings(runtime):
    assert microscale.backend() in ("cpu", "reference")
    targets = microscale.available_cpu_targets()
    assert targets and all(isinstance(t, str) for t in targets)
    with pytest.raises(ValueError):
        microscale.set_backend("gpu")
    with pytest.raises(ValueError):
        microscale.set_cpu_target("neon_sve9")
    microscale.set_num_threads(1)
    assert microscale.num_threads() == 1
    microscale.set_num_threads(0)
    assert microscale.num_threads() >= 1


@pytest.mark.parametrize("backend,target", TARGETS, ids=[t or b for b, t in TARGETS])
def test_every_target_matches_oracle(backend, target, runtime):
    select(backend, target)
    rng = np.random.default_rng(4242)
    for i, (mode, kw) in enumerate(ALL_CONFIGS):
        g = group_of(mode, kw)
        dtype = FLOAT_DTYPES[i % 3]
        for shape in [(37, 4 * 128 + 2 * g), (2, 3, 5 * g), (g,)]:
            x = make_input(rng, shape, dtype, g, nonfinite=(i % 4 == 1))
            nonfinite = ["propagate", "saturate"][i % 2]
            check_roundtrip(x, mode, kw, out_dtypes=(["float32", "float16", "bfloat16"][i % 3],),
                            nonfinite=nonfinite)
        # strided input
        x = make_input(rng, (3 * g, 20), dtype, g).T
        check_roundtrip(x, mode, kw, out_dtypes=("float32",))


@pytest.mark.parametrize("backend,target", TARGETS, ids=[t or b for b, t in TARGETS])
def test_every_target_codecs_and_layouts(backend, target, runtime):
    select(backend, target)
    rng = np.random.default_rng(99)
    s = rng.integers(0, 256, size=(300, 37), dtype=np.uint8)
    assert_same_bits(microscale.swizzle_scales(s), O.swizzle(s))
    x = rng.integers(0, 2**32, size=300_001, dtype=np.uint32).view(np.float32)
    for fmt in ("e2m1", "e4m3", "e5m2"):
        assert np.array_equal(microscale.encode(x, fmt), O.rn_sat_code(x, fmt))
    assert np.array_equal(microscale.encode(x, "e8m0"), O.encode_e8m0_standalone(x))
    assert microscale.global_scale(x) == O.global_scale(x)


@pytest.mark.parametrize("cfg", [("nvfp4", {}), ("nvfp4", {"global_scale": "amax"}),
                                 ("mxfp4", {}), ("mxfp8", {}), ("mxfp8", {"elem": "e5m2"}),
                                 ("affine", {"bits": 4}), ("affine", {"bits": 3, "group_size": 32})],
                         ids=lambda c: c[0] + "".join(str(v) for v in c[1].values()))
def test_large_tensor_threads(cfg, runtime):
    """A tensor large enough to be split across threads: 1 and 2 threads give the oracle's bytes."""
    mode, kw = cfg
    rng = np.random.default_rng(7)
    g = group_of(mode, kw)
    x = make_input(rng, (509, 2048 + 2 * g), np.float32, g, nonfinite=True)
    outs = []
    for n in (1, 2):
        microscale.set_num_threads(n)
        outs.append(check_roundtrip(x, mode, kw, out_dtypes=("bfloat16",)))
    for a, b in zip(*outs):
        assert_same_bits(a, b, "1 vs 2 threads")


@pytest.mark.parametrize("backend,target", TARGETS, ids=[t or b for b, t in TARGETS])
def test_every_target_dequantizes_arbitrary_bytes(backend, target, runtime):
    """All codes (NaN/Inf codes, E8M0 0x00/0xFF, E4M3 0x7F scales) on every target."""
    select(backend, target)
    rng = np.random.default_rng(31)
    for mode, kw in [("nvfp4", {}), ("nvfp4", {"global_scale": 0.75}), ("mxfp4", {}),
                     ("mxfp8", {}), ("mxfp8", {"elem": "e5m2"})]:
        g, b = O.MODE_DEFAULTS[mode]
        K = 9 * g
        packed = rng.integers(0, 256, size=(67, K * b // 8), dtype=np.uint8)
        scales = rng.integers(0, 256, size=(67, K // g), dtype=np.uint8)
        for dt in ("float32", "float16", "bfloat16"):
            y = microscale.dequantize(packed, scales, mode=mode, dtype=dt, **kw)
            assert_same_bits(y, O.dequantize(packed, scales, mode=mode, dtype=dt, **kw),
                             f"{mode} {kw} -> {dt}")
    for bits in (2, 3, 4, 5, 6, 8):
        K = 5 * 32
        packed = rng.integers(0, 256, size=(33, K * bits // 8), dtype=np.uint8)
        for sdt in FLOAT_DTYPES:
            s = (rng.standard_normal((33, 5)) * 0.1).astype(np.float32).astype(sdt)
            bb = rng.standard_normal((33, 5)).astype(np.float32).astype(sdt)
            for dt in ("float32", "bfloat16"):
                y = microscale.dequantize(packed, s, bb, mode="affine", group_size=32, bits=bits, dtype=dt)
                want = O.dequantize(packed, s, bb, mode="affine", group_size=32, bits=bits, dtype=dt)
                assert_same_bits(y, want, f"affine bits={bits} {sdt} -> {dt}")
