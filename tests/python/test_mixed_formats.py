"""One checkpoint, several formats (docs/checkpoints.md, "Recipes" and "Choosing formats under a
budget"): recipes from a file, from --layer and from Python; the budget's choice checked against
an independent brute-force search over its own table, its bits against the bytes written and its
errors against numpy and MLX dequantizations of the output."""

import csv
import io
import itertools
import json
import os

import numpy as np
import pytest

import microscale as ms
from ckpt_support import BF16, load_all, make_tensors, ok, run, skip_without_cli, write_model

skip_without_cli()
mx = pytest.importorskip("mlx.core")

PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj"]
FUSED = [("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixed") / "model"
    tensors = make_tensors(layers=2, hidden=128, inter=256, kv=64)
    # One layer with heavy tails, so that formats differ in error by more than their bits suggest.
    rng = np.random.default_rng(7)
    w = rng.standard_t(2, size=(256, 128)).astype(np.float32) * 0.02
    tensors["model.layers.1.mlp.gate_proj.weight"] = w.astype(BF16)
    write_model(d, tensors, shards=1)
    return d, tensors


def mlx_weights(out):
    """{module: float32 weight} of an MLX export, dequantized by MLX itself with the per-module
    quantization entries of its config."""
    cfg = json.load(open(out / "config.json"))["quantization"]
    t = load_all(str(out))
    w = {}
    for name in t:
        if not name.endswith(".scales"):
            continue
        m = name[:-len(".scales")]
        q = dict(cfg)
        q.update(cfg.get(m, {}))
        biases = t.get(m + ".biases")
        w[m] = np.array(mx.dequantize(mx.array(t[m + ".weight"]), mx.array(t[name]),
                                      None if biases is None else mx.array(biases), group_size=q["group_size"],
                                      bits=q["bits"], mode=q["mode"], dtype=mx.float32))
    return w, cfg


def modes_of(cfg):
    return {m: v["mode"] + str(v["bits"]) for m, v in cfg.items() if isinstance(v, dict)}


# ---- recipes

def test_layer_rules_give_each_layer_its_format_in_mlx(model, tmp_path):
    src, tensors = model
    out = tmp_path / "out"
    r = ok("quantize", src, "-o", out, "--format", "nvfp4", "--export", "mlx", "--layer", "*.o_proj=keep",
           "--layer", "*.down_proj=mxfp8", "--layer", "model.layers.0.self_attn.*=affine8,group_size=32")
    assert "recipe" in r.stdout
    w, cfg = mlx_weights(out)
    assert cfg["mode"] == "nvfp4"
    for layer in range(2):
        p = f"model.layers.{layer}."
        assert p + "self_attn.o_proj" not in w  # kept
        assert out.joinpath("config.json").exists()
        assert (cfg.get(p + "mlp.down_proj") or {}).get("mode") == "mxfp8"
    assert cfg["model.layers.0.self_attn.q_proj"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    assert "model.layers.1.self_attn.q_proj" not in cfg  # the default format: no override
    # Each layer holds the bytes of microscale's quantization in its own format, and MLX decodes
    # them to values close to the weight.
    t = load_all(str(out))
    for m, got in w.items():
        x = tensors[m + ".weight"]
        mode = "mxfp8" if m.endswith("down_proj") else "affine" if m.startswith("model.layers.0.self_attn") \
            else "nvfp4"
        kw = {"group_size": 32, "bits": 8} if mode == "affine" else {}
        parts = ms.quantize(x, mode=mode, **kw)
        for name, want in zip([".weight", ".scales", ".biases"], parts):
            assert t[m + name].tobytes() == np.ascontiguousarray(want).tobytes(), m + name
        x = x.astype(np.float32)
        assert np.abs(got - x).max() < 0.2 * np.abs(x).max(), m
    kept = t["model.layers.0.self_attn.o_proj.weight"]
    np.testing.assert_array_equal(kept.view(np.uint16), tensors["model.layers.0.self_attn.o_proj.weight"].view(np.uint16))


def test_recipe_file_equals_the_same_layer_rules(model, tmp_path):
    src, _ = model
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"rules": [
        {"match": "*.down_proj", "format": "mxfp8"},
        {"match": "*.up_proj", "format": "nvfp4", "scale_search": "mse"},
        {"match": "*.o_proj", "format": "keep"}]}))
    ok("quantize", src, "-o", tmp_path / "a", "--export", "mlx", "--recipe", recipe)
    ok("quantize", src, "-o", tmp_path / "b", "--export", "mlx", "--layer", "*.down_proj=mxfp8",
       "--layer", "*.up_proj=nvfp4,scale_search=mse", "--layer", "*.o_proj=keep")
    a, b = load_all(str(tmp_path / "a")), load_all(str(tmp_path / "b"))
    assert sorted(a) == sorted(b)
    for n in a:
        assert a[n].tobytes() == b[n].tobytes(), n
    # mse search changed the up_proj bytes against round to nearest
    c = tmp_path / "c"
    ok("quantize", src, "-o", c, "--export", "mlx", "--layer", "*.down_proj=mxfp8", "--layer", "*.o_proj=keep")
    assert load_all(str(c))["model.layers.0.mlp.up_proj.scales"].tobytes() != \
        a["model.layers.0.mlp.up_proj.scales"].tobytes()


def test_first_matching_rule_wins(model, tmp_path):
    src, _ = model
    ok("quantize", src, "-o", tmp_path / "o", "--export", "mlx", "--layer", "model.layers.1.mlp.down_proj=keep",
       "--layer", "*.down_proj=mxfp8")
    _, cfg = mlx_weights(tmp_path / "o")
    assert cfg["model.layers.0.mlp.down_proj"]["mode"] == "mxfp8"
    assert "model.layers.1.mlp.down_proj.weight" in load_all(str(tmp_path / "o"))
    assert "model.layers.1.mlp.down_proj" not in cfg


@pytest.mark.parametrize("args, message", [
    (["--layer", "*.nothing=mxfp8"], "matches no weight"),
    (["--layer", "*.down_proj=keep", "--layer", "model.layers.0.mlp.down_proj=mxfp8"], "matches no layer left"),
    (["--layer", "lm_head=mxfp8"], "matches no layer left"),
    (["--layer", "*.down_proj=mxfp9"], "unknown format"),
    (["--layer", "*.down_proj=mxfp8,levels=2"], "levels is an nvfp4 option"),
    (["--layer", "*.down_proj=nvfp4,levels=3"], "levels=3 needs a stored global scale"),
    (["--layer", "*.down_proj=mxfp8,color=red"], "unknown option"),
    (["--layer", "down_proj"], "GLOB=FORMAT"),
    (["--candidate", "mxfp8"], "give --budget too"),
])
def test_bad_rules_are_refused_naming_them(model, tmp_path, args, message):
    src, _ = model
    r = run("quantize", src, "-o", tmp_path / "o", "--export", "mlx", *args)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_recipe_file_errors_name_the_file_and_rule(model, tmp_path):
    src, _ = model
    for body, message in [("[]", "expected a recipe"), ('{"rules": []}', "non-empty array"),
                          ('{"rules": [{"match": "x"}]}', "rule 1 has no \"format\""),
                          ('{"rules": [{"format": "mxfp8"}]}', "rule 1 has no \"match\""),
                          ('{"rules": [{"match": "*", "format": "mxfp8", "elem": "e9m9"}]}', "rule 1"),
                          ('{"rulez": []}', "expected a recipe")]:
        f = tmp_path / "r.json"
        f.write_text(body)
        r = run("quantize", src, "-o", tmp_path / "o", "--export", "mlx", "--recipe", f)
        assert r.returncode != 0 and str(f) in r.stderr and message in r.stderr, (body, r.stderr)


def test_a_split_fused_group_is_refused_where_vllm_fuses_it(model, tmp_path):
    src, _ = model
    r = run("quantize", src, "-o", tmp_path / "o", "--export", "compressed-tensors", "--layer", "*.k_proj=mxfp4")
    assert r.returncode != 0 and "one GEMM" in r.stderr and "k_proj" in r.stderr, r.stderr
    # MLX does not fuse: the same recipe is fine there.
    ok("quantize", src, "-o", tmp_path / "m", "--export", "mlx", "--layer", "*.k_proj=mxfp4")


def test_python_recipe_matches_the_cli(model, tmp_path):
    src, _ = model
    rep = ms.quantize_checkpoint(src, tmp_path / "py", export="mlx",
                                 recipe={"*.down_proj": "mxfp8", "*.o_proj": "keep"})
    ok("quantize", src, "-o", tmp_path / "cli", "--export", "mlx", "--layer", "*.down_proj=mxfp8",
       "--layer", "*.o_proj=keep")
    a, b = load_all(str(tmp_path / "py")), load_all(str(tmp_path / "cli"))
    assert sorted(a) == sorted(b) and all(a[n].tobytes() == b[n].tobytes() for n in a)
    f = rep.formats()
    assert f["model.layers.0.mlp.down_proj"] == "mxfp8" and f["model.layers.0.mlp.up_proj"] == "nvfp4"
    assert "model.layers.0.self_attn.o_proj" not in f
    with pytest.raises(TypeError, match="recipe entry 0"):
        ms.quantize_checkpoint(src, tmp_path / "x", recipe=[("*.down_proj",)])
    with pytest.raises(ValueError, match="matches no weight"):
        ms.quantize_checkpoint(src, tmp_path / "x", export="mlx", recipe=[("nothing", "mxfp8")])


# ---- the budget

def read_table(path):
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert list(rows[0]) == ["tensor", "format", "bits", "error", "chosen"]
    return rows


def brute_force(rows, budget):
    """The least summed error of one option per tensor with the average bits within budget,
    enumerating every assignment (independent of microscale's search)."""
    by = {}
    for r in rows:
        by.setdefault(r["tensor"], []).append(r)
    tensors = list(by)
    numel = {t: numel_of(t) for t in tensors}
    total = sum(numel.values())
    best = None
    for pick in itertools.product(*(range(len(by[t])) for t in tensors)):
        bits = sum(float(by[t][i]["bits"]) * numel[t] for t, i in zip(tensors, pick))
        if bits > budget * total * (1 + 1e-12):
            continue
        err = sum(float(by[t][i]["error"]) for t, i in zip(tensors, pick))
        if best is None or err < best:
            best = err
    return best


SHAPES = {"q_proj": (128, 128), "k_proj": (64, 128), "v_proj": (64, 128), "o_proj": (128, 128),
          "gate_proj": (256, 128), "up_proj": (256, 128), "down_proj": (128, 256)}


def numel_of(tensor):
    return sum(int(np.prod(SHAPES[m.rsplit(".", 1)[1]])) for m in tensor.split("+"))


@pytest.mark.parametrize("budget", [5.0, 6.0, 9.0])
def test_mlx_budget_is_optimal_and_within_bits(model, tmp_path, budget):
    src, tensors = model
    out, table = tmp_path / "out", tmp_path / "t.csv"
    # Layer 0 only, so that the brute force enumerates 3^7 assignments.
    r = ok("quantize", src, "-o", out, "--export", "mlx", "--budget", budget, "--budget-csv", table,
           "--exclude", "model.layers.1.*")
    assert "--budget" in r.stdout
    rows = read_table(table)
    chosen = [x for x in rows if x["chosen"] == "1"]
    assert len(chosen) == 7 and len(rows) == 21
    assert {x["format"] for x in rows} == {"nvfp4,scale_search=mse", "mxfp8", "keep"}
    total = sum(numel_of(x["tensor"]) for x in chosen)
    used = sum(float(x["bits"]) * numel_of(x["tensor"]) for x in chosen)
    assert used <= budget * total
    best = brute_force(rows, budget)
    assert sum(float(x["error"]) for x in chosen) == pytest.approx(best, rel=1e-12, abs=0)
    # The output holds what was chosen, at the bits the table says, and the table's errors are
    # the weight errors of the values MLX decodes from it.
    w, cfg = mlx_weights(out)
    t = load_all(str(out))
    for x in chosen:
        m = x["tensor"]
        if x["format"] == "keep":
            assert m not in w and t[m + ".weight"].dtype == BF16
            assert float(x["bits"]) == 16 and float(x["error"]) == 0
            continue
        parts = [m + s for s in (".weight", ".scales", ".biases") if m + s in t]
        assert float(x["bits"]) == pytest.approx(sum(t[n].nbytes for n in parts) * 8 / numel_of(m), rel=1e-15)
        assert (cfg.get(m) or cfg)["mode"] == x["format"].split(",")[0]
        dw = w[m].astype(np.float64) - tensors[m + ".weight"].astype(np.float64)
        assert float(x["error"]) == pytest.approx(float((dw * dw).sum()), rel=1e-12)


def test_budgets_trade_bits_for_error(model, tmp_path):
    src, _ = model
    err = {}
    for b in (4.6, 6.0, 8.3, 12.0):
        table = tmp_path / f"{b}.csv"
        ok("quantize", src, "-o", tmp_path / str(b), "--export", "mlx", "--budget", b, "--budget-csv", table)
        err[b] = sum(float(x["error"]) for x in read_table(table) if x["chosen"] == "1")
    assert err[4.6] > err[6.0] > err[8.3] > err[12.0] > 0
    # A budget that keeps every layer quantizes nothing: refused, with nothing written.
    r = run("quantize", src, "-o", tmp_path / "all", "--export", "mlx", "--budget", 16, "--budget-csv",
            tmp_path / "all.csv")
    assert r.returncode != 0 and "high precision" in r.stderr, r.stderr
    assert not (tmp_path / "all").exists() and not (tmp_path / "all.csv").exists()


def test_budget_below_the_cheapest_assignment_is_refused(model, tmp_path):
    src, _ = model
    r = run("quantize", src, "-o", tmp_path / "o", "--export", "mlx", "--budget", "4", "--candidate", "nvfp4",
            "--candidate", "mxfp8")
    assert r.returncode != 0 and "4.5" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_compressed_tensors_budget_chooses_fused_groups_whole(model, tmp_path):
    src, _ = model
    table = tmp_path / "t.csv"
    ok("quantize", src, "-o", tmp_path / "o", "--export", "compressed-tensors", "--budget", "6", "--budget-csv", table,
       "--candidate", "nvfp4", "--candidate", "mxfp4", "--candidate", "keep")
    rows = read_table(table)
    names = {frozenset(x["tensor"].split("+")) for x in rows}
    for layer in range(2):
        p = f"model.layers.{layer}."
        for group in FUSED:
            assert frozenset(p + m for m in group) in names
    assert len(names) == 8  # per layer: q/k/v, o, gate/up, down
    chosen = [x for x in rows if x["chosen"] == "1"]
    assert sum(float(x["error"]) for x in chosen) == pytest.approx(brute_force(rows, 6.0), rel=1e-12, abs=0)
    # nvfp4 rows count the 32-bit global scale of each member
    for x in rows:
        if x["format"] == "nvfp4":
            members = x["tensor"].split("+")
            assert float(x["bits"]) == pytest.approx(4.5 + 32 * len(members) / numel_of(x["tensor"]), rel=1e-15)


def test_hessians_weigh_the_budget_error(model, tmp_path):
    src, tensors = model
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    h = {}
    for m in PROJ:
        name = f"model.layers.0.{m}"
        k = tensors[name + ".weight"].shape[1]
        x = rng.standard_normal((64, k)).astype(np.float32) * (1 + np.arange(k) % 5)
        h[name] = (x.T @ x).astype(np.float32)
    save_file(h, str(tmp_path / "h.safetensors"))
    table = tmp_path / "t.csv"
    ok("quantize", src, "-o", tmp_path / "o", "--export", "mlx", "--budget", "6", "--budget-csv", table,
       "--hessians", tmp_path / "h.safetensors", "--exclude", "model.layers.1.*")
    w, _ = mlx_weights(tmp_path / "o")
    rows = read_table(table)
    for x in rows:
        if x["chosen"] == "1" and x["format"] != "keep":
            m = x["tensor"]
            dw = w[m].astype(np.float64) - tensors[m + ".weight"].astype(np.float64)
            want = float(np.einsum("ij,jk,ik->", dw, h[m].astype(np.float64), dw))
            assert float(x["error"]) == pytest.approx(want, rel=1e-9)
    assert sum(float(x["error"]) for x in rows if x["chosen"] == "1") == pytest.approx(brute_force(rows, 6.0),
                                                                                         rel=1e-12, abs=0)
    # A Hessian missing for a layer the budget chooses is refused.
    del h["model.layers.0.mlp.down_proj"]
    save_file(h, str(tmp_path / "h2.safetensors"))
    r = run("quantize", src, "-o", tmp_path / "o2", "--export", "mlx", "--budget", "6", "--hessians",
            tmp_path / "h2.safetensors", "--exclude", "model.layers.1.*")
    assert r.returncode != 0 and "down_proj" in r.stderr, r.stderr


def test_python_budget(model, tmp_path):
    src, _ = model
    rep = ms.quantize_checkpoint(src, tmp_path / "o", export="mlx", budget=6.0, budget_csv=tmp_path / "t.csv",
                                 recipe={"*.o_proj": "mxfp8"})
    rows = read_table(tmp_path / "t.csv")
    o_rows = [x for x in rows if x["tensor"].endswith("o_proj")]
    assert {x["format"] for x in o_rows} == {"mxfp8"} and all(x["chosen"] == "1" for x in o_rows)
    assert len(rep.budget) == 14
    assert {b.layers: b.format for b in rep.budget} == {x["tensor"]: x["format"] for x in rows if x["chosen"] == "1"}
    with pytest.raises(ValueError, match="give budget too"):
        ms.quantize_checkpoint(src, tmp_path / "x", candidates=["mxfp8"])
    with pytest.raises(TypeError, match="budget"):
        ms.quantize_checkpoint(src, tmp_path / "x", budget="6")


@pytest.mark.parametrize("export", ["compressed-tensors", "modelopt"])
def test_recipe_exports_mixed_configs_that_convert_keeping_every_byte(model, tmp_path, export):
    """nvfp4 attention (three-level) beside mxfp8 MLPs: the config says each layer's format, the
    mxfp8 bytes are those of the MLX export, and convert between the layouts keeps every byte."""
    src, tensors = model
    out = tmp_path / "out"
    ok("quantize", src, "-o", out, "--export", export, "--layer", "*.mlp.*=mxfp8")
    ok("quantize", src, "-o", tmp_path / "mlx", "--export", "mlx", "--layer", "*.mlp.*=mxfp8")
    cfg = json.load(open(out / "config.json"))["quantization_config"]
    mlp = sorted(f"model.layers.{i}.{p}" for i in range(2) for p in PROJ if p.startswith("mlp"))
    attn = sorted(f"model.layers.{i}.{p}" for i in range(2) for p in PROJ if p.startswith("self_attn"))
    if export == "compressed-tensors":
        assert cfg["format"] == "mixed-precision"
        groups = {g["format"]: sorted(g["targets"]) for g in cfg["config_groups"].values()}
        assert groups == {"mxfp8-quantized": mlp, "nvfp4-pack-quantized": attn}
    else:
        layers = cfg["quantized_layers"]
        assert cfg["quant_algo"] == "MIXED_PRECISION"
        assert {m for m, v in layers.items() if v["quant_algo"] == "MXFP8"} == set(mlp)
        assert {m for m, v in layers.items() if v["quant_algo"] == "W4A16_NVFP4"} == set(attn)
    t, m = load_all(str(out)), load_all(str(tmp_path / "mlx"))
    for name in mlp:
        assert t[name + ".weight"].tobytes() == m[name + ".weight"].tobytes(), name
        assert t[name + ".weight_scale"].tobytes() == m[name + ".scales"].tobytes(), name
    other = "modelopt" if export == "compressed-tensors" else "compressed-tensors"
    ok("convert", out, "-o", tmp_path / "other", "--to", other)
    ok("convert", tmp_path / "other", "-o", tmp_path / "back", "--to", export)
    back = load_all(str(tmp_path / "back"))
    assert sorted(back) == sorted(t) and all(back[n].tobytes() == t[n].tobytes() for n in t)
    ok("dequantize", out, "-o", tmp_path / "dq1")
    ok("dequantize", tmp_path / "other", "-o", tmp_path / "dq2")
    a, b = load_all(str(tmp_path / "dq1")), load_all(str(tmp_path / "dq2"))
    assert all(a[n].tobytes() == b[n].tobytes() for n in a)
    r = ok("inspect", out)
    assert "mxfp8" in r.stdout and "nvfp4" in r.stdout


def same_choice_by_recipe(src, out, table, export, *extra):
    """The recipe that gives each layer --budget's choice from its table, exported alongside."""
    rules = []
    for x in read_table(table):
        if x["chosen"] == "1":
            for m in x["tensor"].split("+"):
                rules += ["--layer", f"{m}={x['format']}"]
    ok("quantize", src, "-o", out, "--export", export, *rules, *extra)


@pytest.mark.parametrize("export", ["mlx", "compressed-tensors", "modelopt"])
def test_budget_writes_the_bytes_of_the_same_choice_by_recipe(model, tmp_path, export):
    """Each chosen layer is written with the quantization the table measured (spilled, not redone),
    which is the quantization a recipe giving the same formats writes: global scales shared in
    fused groups and mse searches included."""
    src, _ = model
    table = tmp_path / "t.csv"
    r = ok("quantize", src, "-o", tmp_path / "b", "--export", export, "--budget", "6", "--budget-csv", table)
    rows = read_table(table)
    chosen = {x["format"] for x in rows if x["chosen"] == "1"}
    assert len(chosen) > 1, chosen  # a mix, or the comparison below proves little
    quantized = sum(len(x["tensor"].split("+")) for x in rows if x["chosen"] == "1" and x["format"] != "keep")
    assert f"--budget: {quantized} layers written from the error table's quantizations" in r.stdout, r.stdout
    same_choice_by_recipe(src, tmp_path / "r", table, export)
    a, b = load_all(str(tmp_path / "b")), load_all(str(tmp_path / "r"))
    assert sorted(a) == sorted(b)
    for n in a:
        assert a[n].tobytes() == b[n].tobytes(), n
    for f in ("config.json", "hf_quant_config.json"):
        if (tmp_path / "r" / f).exists():
            qa = json.load(open(tmp_path / "b" / f))
            qb = json.load(open(tmp_path / "r" / f))
            assert qa == qb, f
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".microscale-budget")]
