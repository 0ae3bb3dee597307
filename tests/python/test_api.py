"""Python API behaviour: argument forms, dtypes, ownership of returned arrays."""

import gc

import ml_dtypes
import numpy as np
import pytest

import microscale
import spec_oracle as O
from conftest import BF16, assert_same_bits


def test_public_names_and_docstrings():
    for name in microscale.__all__:
        f = getattr(microscale, name)
        assert callable(f) and f.__doc__ and len(f.__doc__) > 25, name
    assert microscale.__doc__


def test_default_mode_and_returns(rng):
    w = rng.standard_normal((4, 64)).astype(np.float32)
    out = microscale.quantize(w)
    assert len(out) == 2  # nvfp4 by default
    assert out[0].shape == (4, 32) and out[1].shape == (4, 4)
    y = microscale.dequantize(*out)
    assert y.dtype == np.float32 and y.shape == w.shape
    assert np.abs(y - w).max() <= np.abs(w).max() / 3


@pytest.mark.parametrize("g", [lambda v: float(v), lambda v: np.float32(v), lambda v: np.float64(v),
                               lambda v: np.array(v, np.float32), lambda v: np.array([v], np.float32),
                               lambda v: np.array([[v]], np.float64),
                               lambda v: np.array([v], np.float32).astype(BF16).astype(np.float32)])
def test_global_scale_argument_forms(g, rng):
    w = rng.standard_normal((8, 64)).astype(np.float32)
    amax = microscale.global_scale(w)
    amax = np.float32(np.float32(amax).astype(BF16))  # exact in every form above
    ref = microscale.quantize(w, mode="nvfp4", global_scale=float(amax))
    got = microscale.quantize(w, mode="nvfp4", global_scale=g(amax))
    for a, b in zip(got, ref):
        assert_same_bits(a, b)
    y = microscale.dequantize(*got, mode="nvfp4", global_scale=g(amax))
    assert_same_bits(y, microscale.dequantize(*ref, mode="nvfp4", global_scale=float(amax)))


def test_global_scale_python_float_is_rounded_to_f32(rng):
    w = rng.standard_normal((2, 32)).astype(np.float32)
    g64 = 0.1  # not a float32 value
    a = microscale.quantize(w, mode="nvfp4", global_scale=g64)
    b = microscale.quantize(w, mode="nvfp4", global_scale=np.float32(g64))
    for x, y in zip(a, b):
        assert_same_bits(x, y)
    want = O.quantize(w, mode="nvfp4", global_scale=np.float32(g64))
    for x, y in zip(a, want):
        assert_same_bits(x, y)


@pytest.mark.parametrize("dtype,want", [("float32", np.float32), ("float16", np.float16),
                                        ("bfloat16", BF16), (np.float32, np.float32),
                                        (np.dtype(np.float16), np.float16), (ml_dtypes.bfloat16, BF16),
                                        (BF16, BF16)])
def test_output_dtype_forms(dtype, want, rng):
    w = rng.standard_normal((2, 64)).astype(np.float32)
    for mode in ("nvfp4", "mxfp4", "mxfp8", "affine"):
        parts = microscale.quantize(w, mode=mode)
        y = microscale.dequantize(*parts, mode=mode, dtype=dtype)
        assert y.dtype == np.dtype(want)
        y32 = microscale.dequantize(*parts, mode=mode)
        assert_same_bits(y, O.rn(y32, np.dtype(want)))


def test_bfloat16_in_and_out(rng):
    w = rng.standard_normal((3, 128)).astype(BF16)
    p, s, b = microscale.quantize(w, mode="affine", group_size=128, bits=8)
    assert s.dtype == BF16 and b.dtype == BF16
    y = microscale.dequantize(p, s, b, mode="affine", group_size=128, bits=8, dtype="bfloat16")
    assert y.dtype == BF16
    assert np.abs(y.astype(np.float32) - w.astype(np.float32)).max() < 0.05


def test_ml_dtypes_scale_arrays_are_read_by_bytes(rng):
    w = rng.standard_normal((4, 64)).astype(np.float32)
    p, s = microscale.quantize(w, mode="nvfp4")
    y = microscale.dequantize(p, s, mode="nvfp4")
    assert_same_bits(microscale.dequantize(p, s.view(ml_dtypes.float8_e4m3fn), mode="nvfp4"), y)
    p, s = microscale.quantize(w, mode="mxfp8")
    y = microscale.dequantize(p, s, mode="mxfp8")
    assert_same_bits(microscale.dequantize(p, s.view(ml_dtypes.float8_e8m0fnu), mode="mxfp8"), y)
    # E4M3 element bytes are ml_dtypes' float8_e4m3fn values
    vals = p.view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(4, 2, 32)
    assert_same_bits((vals * O.decode_e8m0(s)[..., None]).reshape(4, 64), y)


def test_uint32_packed_input(rng):
    w = rng.standard_normal((2, 3, 256)).astype(np.float32)
    for mode, kw in [("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}), ("affine", {"bits": 3}),
                     ("affine", {"bits": 6, "group_size": 32})]:
        parts = microscale.quantize(w, mode=mode, **kw)
        words = parts[0].view("<u4")
        assert words.shape == (2, 3, parts[0].shape[-1] // 4)
        assert_same_bits(microscale.dequantize(words, *parts[1:], mode=mode, **kw),
                         microscale.dequantize(*parts, mode=mode, **kw))
        # non-contiguous uint32 words are accepted too
        wt = np.swapaxes(np.ascontiguousarray(np.swapaxes(words, 0, 1)), 0, 1)
        assert_same_bits(microscale.dequantize(wt, *parts[1:], mode=mode, **kw),
                         microscale.dequantize(*parts, mode=mode, **kw))


def test_non_contiguous_parts_in_dequantize(rng):
    w = rng.standard_normal((6, 256)).astype(np.float32)
    p, s, b = microscale.quantize(w, mode="affine", group_size=32)
    pf, sf, bf = (np.asfortranarray(a) for a in (p, s, b))
    assert not pf.flags.c_contiguous
    assert_same_bits(microscale.dequantize(pf, sf, bf, mode="affine", group_size=32),
                     microscale.dequantize(p, s, b, mode="affine", group_size=32))
    big = np.zeros((6, 2 * p.shape[1]), np.uint8)
    big[:, ::2] = p
    assert_same_bits(microscale.dequantize(big[:, ::2], s, b, mode="affine", group_size=32),
                     microscale.dequantize(p, s, b, mode="affine", group_size=32))


def test_read_only_byteswapped_and_fortran_inputs(rng):
    w = rng.standard_normal((5, 64)).astype(np.float32)
    ref = microscale.quantize(w, mode="mxfp8")
    ro = w.copy()
    ro.flags.writeable = False
    for v in (ro, w.astype(">f4"), np.asfortranarray(w), np.frombuffer(w.tobytes(), np.float32).reshape(5, 64)):
        got = microscale.quantize(v, mode="mxfp8")
        for a, b in zip(got, ref):
            assert_same_bits(a, b)
    assert microscale.global_scale(ro) == microscale.global_scale(w)


def test_returned_arrays_own_their_memory(rng):
    w = rng.standard_normal((64, 1024)).astype(np.float32)
    p, s = microscale.quantize(w, mode="mxfp4")
    keep = p[3].copy()
    view = p[3]
    del p, s
    gc.collect()
    _ = [microscale.quantize(w, mode="mxfp4") for _ in range(3)]
    assert np.array_equal(view, keep)
    y = microscale.dequantize(*microscale.quantize(w, mode="mxfp4"), mode="mxfp4")
    assert y.flags.writeable and y.flags.c_contiguous
    y[0, 0] = 1.0  # writable


def test_group_and_bits_accept_numpy_ints(rng):
    w = rng.standard_normal((2, 128)).astype(np.float32)
    a = microscale.quantize(w, mode="affine", group_size=np.int64(32), bits=np.int32(5))
    b = microscale.quantize(w, mode="affine", group_size=32, bits=5)
    for x, y in zip(a, b):
        assert_same_bits(x, y)


def test_swizzle_round_trip_shapes(rng):
    s = rng.integers(0, 256, size=(3, 70, 9), dtype=np.uint8)
    sw = microscale.swizzle_scales(s)
    assert sw.shape == (256, 12)
    assert_same_bits(microscale.unswizzle_scales(sw, 210, 9), s.reshape(210, 9))
    assert_same_bits(microscale.swizzle_scales(s.view(ml_dtypes.float8_e8m0fnu)), sw)
    with pytest.raises(TypeError):
        microscale.swizzle_scales(s.astype(np.float32))


def test_quantize_is_deterministic_and_thread_safe(rng):
    import threading
    w = rng.standard_normal((256, 1024)).astype(np.float32)
    ref = microscale.quantize(w, mode="nvfp4")
    results = []

    def run():
        results.append(microscale.quantize(w, mode="nvfp4"))

    ts = [threading.Thread(target=run) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for r in results:
        for a, b in zip(r, ref):
            assert_same_bits(a, b)


def test_misaligned_input_buffer(rng):
    w = rng.standard_normal((7, 96)).astype(np.float32)
    buf = bytearray(w.nbytes + 1)
    buf[1:] = w.tobytes()
    mis = np.frombuffer(buf, dtype=np.float32, offset=1).reshape(7, 96)
    assert mis.ctypes.data % 4 != 0
    for mode in ("nvfp4", "mxfp8", "affine"):
        kw = {"group_size": 32} if mode == "affine" else {}
        for a, b in zip(microscale.quantize(mis, mode=mode, **kw), microscale.quantize(w, mode=mode, **kw)):
            assert_same_bits(a, b)


def test_module_docstring_examples():
    import doctest
    res = doctest.testmod(microscale, verbose=False)
    assert res.attempted >= 5 and res.failed == 0


def test_readme_python_examples_run():
    import os
    import re
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    # The model-running section needs a checkpoint: test_pretrained.py runs it on a fixture's.
    text = re.sub(r"## Run a quantized model\n.*?(?=\n## )", "", text, flags=re.S)
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README.md has no python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})


def test_installed_command_and_python_m(tmp_path):
    """The package installs the `microscale` command (an entry point that runs the C++ command
    shipped in microscale/bin) and `python -m microscale` runs the same command."""
    import os
    import subprocess
    import sys
    import sysconfig

    script = os.path.join(sysconfig.get_path("scripts"), "microscale")
    runs = {"entry point": [script], "python -m": [sys.executable, "-m", "microscale"]}
    for how, cmd in runs.items():
        version = subprocess.run(cmd + ["--version"], capture_output=True, text=True, cwd=tmp_path)
        assert version.returncode == 0 and version.stdout.strip() == f"microscale {microscale.__version__}", \
            (how, version.stderr)
        # A real command through it: inspect of a missing directory is a clear error, non-zero exit.
        bad = subprocess.run(cmd + ["inspect", str(tmp_path / "absent")], capture_output=True, text=True,
                             cwd=tmp_path)
        assert bad.returncode != 0 and bad.stderr.startswith("microscale: error:") \
            and "absent" in bad.stderr, (how, bad.stderr)


def test_version_has_one_source():
    """The package metadata (pyproject reads CMakeLists.txt), microscale.__version__ (compiled into
    _core) and the project version in CMakeLists.txt are one number."""
    import importlib.metadata
    import os
    import re
    cmake = os.path.join(os.path.dirname(__file__), "..", "..", "CMakeLists.txt")
    with open(cmake, encoding="utf-8") as f:
        project = re.search(r"project\(microscale VERSION ([0-9.]+)", f.read()).group(1)
    assert microscale.__version__ == microscale._core.__version__ == project
    assert importlib.metadata.version("microscale") == project


def test_core_reads_dtypes_from_the_arrays():
    """Arrays cross into _core as they are, ml_dtypes.bfloat16 and float8 codes included, and
    come back in their dtype: no dtype names travel with them."""
    core = microscale._core
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 64)).astype(BF16)
    spec = core.QuantSpec(mode=core.Mode.affine, group_size=32, bits=4)
    q = core.quantize(x, spec)
    assert isinstance(q, core.Quantized) and q.shape == [4, 64]
    assert q.spec.mode == core.Mode.affine and q.spec.group_size == 32 and q.spec.bits == 4
    assert q.packed.dtype == np.uint8 and q.scales.dtype == BF16 and q.biases.dtype == BF16
    y = core.dequantize(q.packed, q.scales, q.biases, q.spec, core.DType.bfloat16)
    assert y.dtype == BF16
    assert_same_bits(y, microscale.dequantize(*microscale.quantize(x, mode="affine", group_size=32),
                                              mode="affine", group_size=32, dtype=BF16))
    nv = core.quantize(x.astype(np.float32), core.QuantSpec(global_scale=2.5))
    assert nv.biases is None and nv.spec.global_scale == 2.5 and nv.spec.group_size == 16
    codes = nv.scales.view(ml_dtypes.float8_e4m3fn)  # E4M3 codes in their ml_dtypes type
    assert_same_bits(core.dequantize(nv.packed, codes, None, nv.spec, core.DType.float32),
                     core.dequantize(nv.packed, nv.scales, None, nv.spec, core.DType.float32))
    assert core.global_scale(x) == microscale.global_scale(x)
    with pytest.raises(ValueError, match="mode"):
        core.Mode.from_name("nvfp5")
    # A dtype the C++ API has no type for is refused at the boundary.
    with pytest.raises(TypeError):
        core.global_scale(np.zeros(4, np.float64))

def test_layers_take_mode_defaults_from_the_library():
    """The layers' default group size and bits come from the C++ table (core/numerics.hpp), which
    must agree with the oracle's FORMATS.md values; a name that is no mode gives None."""
    for mode, (g, b) in O.MODE_DEFAULTS.items():
        assert microscale._core.mode_defaults(mode) == (g, b), mode
        q = microscale.QuantizedLinear.from_linear(np.ones((2, 2 * g), np.float32), mode=mode, group_size=g, bits=b)
        layer = microscale.QuantizedLinear(q.weight, q.scales, q.biases, mode=mode, global_scale=q.global_scale)
        assert (layer.group_size, layer.bits) == (g, b), mode
        np.testing.assert_array_equal(layer(np.ones((1, 2 * g), np.float32)), q(np.ones((1, 2 * g), np.float32)))
    assert microscale._core.mode_defaults("int4") is None
