"""Every backend and SIMD target, and thread counts, against the spec oracle: the cpu kernels
must give the same bytes as the reference backend (FORMATS.md is the contract for both)."""

import os
import subprocess
import sys
import textwrap

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


def _run_python(code, **env):
    """Runs `code` in a fresh interpreter (the runtime reads the environment once per process)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCALE_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env=full_env)


def test_bad_cpu_target_does_not_break_fork():
    """A bad MICROSCALE_CPU_TARGET is a ValueError naming it, and forked children (multiprocessing
    pools, DataLoader workers) start and exit normally: the settings' fork handler used to rerun
    the failing constructor in every child, which died of SIGABRT."""
    r = _run_python("""
        import multiprocessing, os
        import numpy as np
        import microscale

        for _ in range(2):
            try:
                microscale.num_threads()
                raise SystemExit("the bad target was accepted")
            except ValueError as e:
                assert "MICROSCALE_CPU_TARGET" in str(e), e
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status

        def work(i):
            try:
                microscale.quantize(np.ones((1, 16), np.float32))
            except ValueError as e:
                return "MICROSCALE_CPU_TARGET" in str(e)
            return False

        with multiprocessing.get_context("fork").Pool(2) as pool:
            assert pool.map(work, range(4)) == [True] * 4
        print("ok")
        """, MICROSCALE_CPU_TARGET="avx9000")
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize("var,value", [("MICROSCALE_BACKEND", "typo"), ("MICROSCALE_BACKEND", "CPU"),
                                       ("MICROSCALE_NUM_THREADS", "1e3"), ("MICROSCALE_NUM_THREADS", "4x"),
                                       ("MICROSCALE_NUM_THREADS", "-1"),
                                       ("MICROSCALE_CPU_TARGET", "avx9000")])
def test_bad_environment_values_are_errors_naming_the_variable(var, value):
    """Not silently the CPU kernels (a backend typo) or one thread (1e3 read as 1)."""
    r = _run_python(f"""
        import numpy as np
        import microscale
        try:
            microscale.quantize(np.ones((2, 32), np.float32))
        except ValueError as e:
            print(e)
        """, **{var: value})
    assert r.returncode == 0, r.stderr
    assert var in r.stdout and repr(value)[1:-1] in r.stdout, r.stdout


def test_thread_counts_are_clamped(runtime):
    for n in (1025, 999999, 2**31, 10**30):
        microscale.set_num_threads(n)
        assert microscale.num_threads() == 1024, n
    microscale.set_num_threads(-10**30)
    assert 1 <= microscale.num_threads() <= 1024
    r = _run_python("import microscale; print(microscale.num_threads())", MICROSCALE_NUM_THREADS="5000")
    assert r.returncode == 0 and r.stdout.strip() == "1024", (r.stdout, r.stderr)
