#!/usr/bin/env python3
"""Cross-check microscale's safetensors reader and writer against the reference `safetensors`
package (installed with pip when missing).

usage: check_with_safetensors.py ST_DUMP

1. Python writes a file holding every dtype it can name, with metadata; microscale (st_dump) must
   read back the same names, dtypes, shapes, bytes and metadata.
2. microscale writes the same tensors in the same order; the file must be byte-identical to the
   one Python wrote (same compact JSON, key order, padding), and Python must read it back.
3. microscale writes every dtype the format defines (F6 too, which Python cannot create), and
   Python's framework-free `deserialize` and numpy loader must read it.
4. Sharded: Python writes shards plus a Hugging Face index by hand; microscale reads the
   checkpoint. microscale writes an index for its own shards; Python loads tensors through it.
Prints "N passed, 0 failed" and exits 0 on success.
"""
import json
import os
import subprocess
import sys
import tempfile


def ensure_packages():
    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
        return
    except ImportError:
        pass
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # Plain install first; externally managed interpreters (PEP 668) need the user site.
    for extra in ([], ["--user", "--break-system-packages"]):
        if subprocess.call(base + extra + ["safetensors", "numpy"]) == 0:
            break
    import site
    import importlib
    importlib.invalidate_caches()
    if site.ENABLE_USER_SITE and site.getusersitepackages() not in sys.path:
        sys.path.append(site.getusersitepackages())


ensure_packages()
import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.numpy  # noqa: E402

ST_DUMP = sys.argv[1]
# Header code -> the constructor-style name the Python bindings take.
PY_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
    "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "F64": "float64",
    "I64": "int64", "U64": "uint64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "C64": "complex64", "F4": "float4_e2m1fn_x2",
}
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
        "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
        "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
         "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32, "F64": np.float64,
         "I64": np.int64, "U64": np.uint64}

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, file=sys.stderr)


def make_tensors(codes):
    rng = np.random.default_rng(7)
    out = []
    for i, code in enumerate(codes):
        shape = [[2, 4], [8], [2, 2, 2], [3, 4], [0, 5]][i % 5]
        if code in ("F6_E2M3", "F6_E3M2"):
            shape = [4, 2]
        numel = int(np.prod(shape))
        data = rng.integers(0, 256, numel * BITS[code] // 8, dtype=np.uint8)
        if code == "BOOL":
            data = data & 1  # only 0/1 are booleans numpy will round-trip
        out.append({"name": f"t{i}.{code.lower()}", "dtype": code, "shape": shape, "data": data})
    return out


def py_serialize_file(tensors, path, metadata):
    """Write with the reference package; handles the TensorSpec API (0.8+) and the dict API."""
    if hasattr(safetensors, "TensorSpec"):
        specs = {}
        for t in tensors:
            shape = list(t["shape"])
            if t["dtype"] == "F4":  # TensorSpec takes the storage shape and doubles the last dim
                shape[-1] //= 2
            specs[t["name"]] = safetensors.TensorSpec(dtype=PY_NAMES[t["dtype"]], shape=shape,
                                                      data_ptr=t["data"].ctypes.data,
                                                      data_len=t["data"].nbytes)
        safetensors.serialize_file(specs, path, metadata=metadata)
    else:
        d = {t["name"]: {"dtype": PY_NAMES[t["dtype"]], "shape": t["shape"], "data": t["data"].tobytes()}
             for t in tensors}
        safetensors.serialize_file(d, path, metadata=metadata)


def py_can_write(code):
    if code not in PY_NAMES:
        return False
    try:
        with tempfile.TemporaryDirectory() as d:
            py_serialize_file(make_tensors([code])[:1], os.path.join(d, "probe.safetensors"), None)
        return True
    except Exception:
        return False


def st_dump(*args):
    out = subprocess.run([ST_DUMP, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def compare_dump(dump, tensors, metadata, what):
    check(dump["metadata"] == (metadata or {}), f"{what}: metadata {dump['metadata']}")
    got = {t["name"]: t for t in dump["tensors"]}
    check(sorted(got) == sorted(t["name"] for t in tensors), f"{what}: names {sorted(got)}")
    for t in tensors:
        g = got.get(t["name"])
        if g is None:
            continue
        check(g["dtype"] == t["dtype"], f"{what}: {t['name']} dtype {g['dtype']}")
        check(g["shape"] == t["shape"], f"{what}: {t['name']} shape {g['shape']}")
        check(g["data"] == t["data"].tobytes().hex(), f"{what}: {t['name']} bytes differ")


def compare_py_read(path, tensors, metadata, what):
    with open(path, "rb") as f:
        items = dict(safetensors.deserialize(f.read()))
    for t in tensors:
        g = items.get(t["name"])
        check(g is not None, f"{what}: python lacks {t['name']}")
        if g is None:
            continue
        check(g["dtype"] == t["dtype"], f"{what}: {t['name']} dtype {g['dtype']}")
        check(list(g["shape"]) == t["shape"], f"{what}: {t['name']} shape {g['shape']}")
        check(bytes(g["data"]) == t["data"].tobytes(), f"{what}: {t['name']} bytes differ")
    with safetensors.safe_open(path, framework="np") as f:
        check((f.metadata() or {}) == (metadata or {}), f"{what}: python metadata {f.metadata()}")
    arrays = safetensors.numpy.load_file(path) if all(t["dtype"] in NUMPY for t in tensors) else {}
    for t in tensors:
        if t["name"] in arrays:
            a = arrays[t["name"]]
            check(a.dtype == NUMPY[t["dtype"]] and list(a.shape) == t["shape"] and
                  a.tobytes() == t["data"].tobytes(), f"{what}: numpy load of {t['name']}")


def write_spec(tensors, metadata, path):
    spec = {"metadata": metadata or {},
            "tensors": [{"name": t["name"], "dtype": t["dtype"], "shape": t["shape"],
                         "data": t["data"].tobytes().hex()} for t in tensors]}
    with open(path, "w") as f:
        json.dump(spec, f)


def main():
    all_codes = list(BITS)
    py_codes = [c for c in all_codes if py_can_write(c)]
    check(set(NUMPY) <= set(py_codes), f"python can write {py_codes}")
    md = {"format": "pt", "note": "caf\u00e9 \"quoted\"\n"}
    with tempfile.TemporaryDirectory() as d:
        # 1. Python writes, microscale reads.
        tensors = make_tensors(py_codes)
        py_file = os.path.join(d, "py.safetensors")
        py_serialize_file(tensors, py_file, md)
        dump = st_dump(py_file)
        compare_dump(dump, tensors, md, "python->microscale")

        # 2. microscale writes the same tensors in Python's order (single metadata key so the
        # map order cannot differ): byte-identical files.
        one_md = {"format": "pt"}
        py_file1 = os.path.join(d, "py1.safetensors")
        py_serialize_file(tensors, py_file1, one_md)
        order = [t["name"] for t in st_dump(py_file1)["tensors"]]
        by_name = {t["name"]: t for t in tensors}
        spec = os.path.join(d, "spec.json")
        write_spec([by_name[n] for n in order], one_md, spec)
        ms_file = os.path.join(d, "ms.safetensors")
        subprocess.run([ST_DUMP, "--write", ms_file, spec], check=True)
        with open(py_file1, "rb") as a, open(ms_file, "rb") as b:
            check(a.read() == b.read(), "microscale file differs from the Python file byte for byte")
        compare_py_read(ms_file, tensors, one_md, "microscale->python")

        # 3. Every dtype, microscale's own order (reverse of the table), read by Python.
        every = make_tensors(all_codes)[::-1]
        write_spec(every, md, spec)
        ms_all = os.path.join(d, "all.safetensors")
        subprocess.run([ST_DUMP, "--write", ms_all, spec], check=True)
        compare_py_read(ms_all, every, md, "microscale(all dtypes)->python")
        compare_dump(st_dump(ms_all), every, md, "microscale->microscale")
        check([t["name"] for t in st_dump(ms_all)["tensors"]] == [t["name"] for t in every],
              "file order is the order given")

        # 4a. Python shards plus a hand-written Hugging Face index, read by microscale.
        sd = os.path.join(d, "py_sharded")
        os.mkdir(sd)
        numeric = [t for t in tensors if t["dtype"] in NUMPY]
        halves = [numeric[::2], numeric[1::2]]
        weight_map, total = {}, 0
        for i, part in enumerate(halves):
            name = f"model-{i + 1:05d}-of-00002.safetensors"
            safetensors.numpy.save_file({t["name"]: t["data"].view(NUMPY[t["dtype"]]).reshape(t["shape"])
                                         for t in part}, os.path.join(sd, name))
            for t in part:
                weight_map[t["name"]] = name
                total += t["data"].nbytes
        with open(os.path.join(sd, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        ck = st_dump("--checkpoint", sd)
        check(ck.get("total_size") == total, f"checkpoint total_size {ck.get('total_size')}")
        compare_dump(ck, numeric, {}, "python shards->microscale checkpoint")

        # 4b. microscale writes the index for shards Python wrote; Python follows it.
        idx = os.path.join(sd, "ms.index.json")
        subprocess.run([ST_DUMP, "--index", idx] + [os.path.join(sd, n) for n in sorted(set(weight_map.values()))],
                       check=True)
        with open(idx) as f:
            index = json.load(f)
        check(index["weight_map"] == dict(sorted(weight_map.items())), "index weight_map")
        check(list(index["weight_map"]) == sorted(weight_map), "index weight_map sorted by name")
        check(index["metadata"] == {"total_size": total}, f"index metadata {index['metadata']}")
        for name, file in index["weight_map"].items():
            with safetensors.safe_open(os.path.join(sd, file), framework="np") as f:
                check(f.get_tensor(name).tobytes() == by_name[name]["data"].tobytes(), f"index -> {name}")

        # A file microscale rejects is rejected by Python too (trailing garbage).
        bad = os.path.join(d, "bad.safetensors")
        with open(py_file, "rb") as a, open(bad, "wb") as b:
            b.write(a.read() + b"\0")
        r = subprocess.run([ST_DUMP, bad], capture_output=True, text=True)
        check(r.returncode == 1 and "trailing bytes" in r.stderr, f"trailing garbage: {r.stderr}")
        try:
            with open(bad, "rb") as f:
                safetensors.deserialize(f.read())
            check(False, "python accepted trailing garbage")
        except Exception:
            check(True, "")

    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}: "
          f"python wrote {len(py_codes)} dtypes, microscale {len(all_codes)}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
