#!/usr/bin/env python3
"""Cross-check microscale's GGUF writer and ggml block layouts against llama.cpp's own Python
reader, the `gguf` package (gguf==0.19.0 is installed with pip when missing).

usage: check_with_gguf.py GGUF_SAMPLE

GGUF_SAMPLE writes sample.gguf (a key of every value type; nvfp4, mxfp4, f32, f16 and bf16
tensors) plus the float data of each tensor and microscale's dequantize of the nvfp4/mxfp4 ones.
gguf.GGUFReader must read every key with its type and value and every tensor with its name, type
and shape; gguf.quants.dequantize must give microscale's values for nvfp4 and mxfp4, bit for bit
except the sign of zero: ggml's table reads code 8 (E2M1 -0) as +0.
Prints "N passed, 0 failed" and exits 0 on success.
"""
import os
import subprocess
import sys
import tempfile

GGUF_VERSION = "0.19.0"


def ensure_packages():
    try:
        import numpy  # noqa: F401
        import gguf  # noqa: F401
        from importlib.metadata import version
        if version("gguf") == GGUF_VERSION:
            return
    except ImportError:
        pass
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # Plain install first; externally managed interpreters (PEP 668) need the user site.
    for extra in ([], ["--user", "--break-system-packages"]):
        if subprocess.call(base + extra + [f"gguf=={GGUF_VERSION}", "numpy"]) == 0:
            break
    import site
    import importlib
    importlib.invalidate_caches()
    if site.ENABLE_USER_SITE and site.getusersitepackages() not in sys.path:
        sys.path.append(site.getusersitepackages())


ensure_packages()
import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGUFValueType as V, GGMLQuantizationType as Q  # noqa: E402

GGUF_SAMPLE = sys.argv[1]

# What gguf_sample writes (keep in step with sample_kvs there): key, type, value, element type.
EXPECTED_KVS = [
    ("general.architecture", V.STRING, "llama", None),
    ("t.u8", V.UINT8, 200, None),
    ("t.i8", V.INT8, -100, None),
    ("t.u16", V.UINT16, 60000, None),
    ("t.i16", V.INT16, -30000, None),
    ("t.u32", V.UINT32, 4000000000, None),
    ("t.i32", V.INT32, -2000000000, None),
    ("t.f32", V.FLOAT32, float(np.float32(0.1)), None),
    ("t.bool", V.BOOL, True, None),
    ("t.bool_false", V.BOOL, False, None),
    ("t.str", V.STRING, "caf\u00e9 <|eot|>", None),
    ("t.u64", V.UINT64, 18446744073709551557, None),
    ("t.i64", V.INT64, -9223372036854775808, None),
    ("t.f64", V.FLOAT64, 1.0 / 3.0, None),
    ("t.arr.str", V.ARRAY, ["a", "", "<|end|>"], V.STRING),
    ("t.arr.i32", V.ARRAY, [1, -2, 3], V.INT32),
    ("t.arr.f32", V.ARRAY, [0.5, -1.25], V.FLOAT32),
    ("t.arr.u8", V.ARRAY, [0, 255], V.UINT8),
    ("t.arr.bool", V.ARRAY, [True, False], V.BOOL),
    ("t.arr.u64", V.ARRAY, [1 << 63], V.UINT64),
    ("t.arr.empty", V.ARRAY, [], V.INT64),
]
# name, type, shape in ggml order (ne[0] first)
EXPECTED_TENSORS = [
    ("blk.0.ffn_up.weight", Q.NVFP4, [128, 4, 3]),
    ("blk.0.attn_q.weight", Q.MXFP4, [96, 5]),
    ("t.f32", Q.F32, [6, 2]),
    ("t.f16", Q.F16, [10]),
    ("t.bf16", Q.BF16, [4, 1, 2]),
]

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, file=sys.stderr)


def floats(path, shape):
    return np.fromfile(path, dtype="<f4").reshape(shape)


def main():
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([GGUF_SAMPLE, d], check=True)
        reader = gguf.GGUFReader(os.path.join(d, "sample.gguf"))

        # Metadata: the reader's own fields ("GGUF.*") first, then ours in order.
        fields = [f for name, f in reader.fields.items() if not name.startswith("GGUF.")]
        check(reader.fields["GGUF.version"].contents() == 3, "version")
        check([f.name for f in fields] == [k for k, _, _, _ in EXPECTED_KVS],
              f"keys {[f.name for f in fields]}")
        for key, vtype, value, elem in EXPECTED_KVS:
            f = reader.fields.get(key)
            if f is None:
                check(False, f"missing key {key}")
                continue
            check(f.types[0] == vtype, f"{key}: type {f.types}")
            if elem is not None:
                # The element type as stored (the reader leaves `types` short for empty arrays).
                check(V(int(f.parts[3][0])) == elem, f"{key}: element type {f.parts[3]}")
            got = f.contents()
            check(got == value and type(got) is type(value), f"{key}: {got!r} != {value!r}")

        check(len(reader.tensors) == len(EXPECTED_TENSORS), f"{len(reader.tensors)} tensors")
        by_name = {t.name: t for t in reader.tensors}
        for name, qtype, shape in EXPECTED_TENSORS:
            t = by_name.get(name)
            if t is None:
                check(False, f"missing tensor {name}")
                continue
            check(t.tensor_type == qtype, f"{name}: type {t.tensor_type!r}")
            check(t.shape.tolist() == shape, f"{name}: shape {t.shape.tolist()}")
            np_shape = tuple(reversed(shape))
            base = os.path.join(d, name)
            decoded = gguf.quants.dequantize(t.data, t.tensor_type).reshape(np_shape)
            check(decoded.dtype == np.float32, f"{name}: dtype {decoded.dtype}")
            x = floats(base + ".input.f32", np_shape)
            if qtype in (Q.NVFP4, Q.MXFP4):
                ours = floats(base + ".dequant.f32", np_shape)
                check(np.array_equal(decoded, ours), f"{name}: values differ at "
                      f"{np.argwhere(decoded != ours)[:5].tolist()}")
                # Bit for bit, except where microscale keeps the sign of a zero code (E2M1 -0).
                bits_differ = decoded.view(np.uint32) != ours.view(np.uint32)
                signed_zero = (ours == 0) & np.signbit(ours) & ~np.signbit(decoded)
                check(not np.any(bits_differ & ~signed_zero), f"{name}: bits differ")
                # The sample is a real quantization: a few nonzero values and bounded error.
                check(np.count_nonzero(ours) > ours.size // 2, f"{name}: mostly zeros")
                err = np.abs(ours - x).max(axis=-1) / np.maximum(np.abs(x).max(axis=-1), 1e-30)
                check(float(err.max()) <= 0.5, f"{name}: relative error {float(err.max())}")
                print(f"{name}: {qtype.name} {shape}, {int(np.count_nonzero(signed_zero))} values where "
                      f"microscale's -0 reads as +0 in ggml")
            else:
                check(np.array_equal(decoded, x), f"{name}: values differ")

    print(f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else GGUF_VERSION}, numpy {np.__version__}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
