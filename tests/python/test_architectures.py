"""The `microscale` command on the architecture fixtures of tests/fixtures/ (written by
transformers' own model classes: scripts/make_fixtures.py): quantize, inspect, convert and
dequantize each one in every export.

What must be quantized is stated here from the ecosystems' defaults, not taken from microscale:
the linear projections are, while embeddings, norms, biases, `lm_head` (ModelOpt disables
`*lm_head*`, llm-compressor's recipes ignore `lm_head`) and MoE routers (ModelOpt's
`*block_sparse_moe.gate*`, `*mlp.gate.*`, `*router*`; llm-compressor's `re:.*mlp.gate$`) stay in
high precision. Every stored code is decoded independently (spec_oracle, numpy + ml_dtypes) and
compared bit for bit with `microscale dequantize`. numpy only: no torch at test time.
"""

import csv
import io
import json
import os
import re
import shutil

import numpy as np
import pytest

import spec_oracle as so
from ckpt_support import BF16, CLI, ROOT, header, load_all, ok, run, skip_without_cli, u8

pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
skip_without_cli()

ARCHS = sorted(d for d in os.listdir(FIXTURES) if os.path.exists(os.path.join(FIXTURES, d, "config.json")))
LINEAR_ARCHS = [a for a in ARCHS if a != "gpt2"]  # GPT-2's Conv1D weights are refused (test below)
MODES = [("nvfp4", "compressed-tensors"), ("mxfp4", "compressed-tensors"), ("nvfp4", "modelopt"), ("nvfp4", "mlx"),
         ("mxfp4", "mlx"), ("mxfp8", "mlx"), ("affine4", "mlx")]
MODE_IDS = [f"{f}-{e}" for f, e in MODES]

# The Linear projections of the fixture architectures (llama-style attention and MLP, Mixtral's
# experts, Phi-3's fused ones, DeepSeek's MLA): the last name component of every module the
# ecosystems quantize.
PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3",
               "qkv_proj", "gate_up_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"}
ROUTERS = {"gate", "router"}  # Qwen3-MoE / DeepSeek mlp.gate, Mixtral block_sparse_moe.gate, gpt-oss mlp.router


def source(arch):
    return load_all(os.path.join(FIXTURES, arch))


# mlx-lm's sanitize renames Mixtral's expert weights into its SwitchGLU (gate, up, down).
MLX_SWITCH = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def model_type(arch):
    with open(os.path.join(FIXTURES, arch, "config.json")) as f:
        return json.load(f)["model_type"]


def mlx_moe(arch):
    """The experts of a fixture as mlx-lm's models hold them (their sanitize's names and shapes):
    ({stacked module: [E, N, K]}, {stacked module: the source tensors in expert order, or the
    gpt-oss stack and its column slice}, source tensors they replace, {float tensor: array}
    renamed or split (gpt-oss's expert biases))."""
    src = source(arch)
    shapes, parts, replaced, extra = {}, {}, set(), {}
    groups = {}
    for name, w in src.items():
        m = re.fullmatch(r"(.*)\.experts\.(\d+)\.(\w+)\.weight", name)
        if m and w.ndim == 2 and m.group(3) in PROJECTIONS:
            groups.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = name
    for (prefix, proj), members in groups.items():
        module = f"{prefix}.switch_mlp.{MLX_SWITCH.get(proj, proj)}"
        shapes[module] = [len(members), *src[members[0]].shape]
        parts[module] = [members[e] for e in range(len(members))]
        replaced |= set(members.values())
    if model_type(arch) == "gpt_oss":  # transformers' GptOssExperts: [E, in, out], gate/up interleaved
        for name, w in src.items():
            p = name.rpartition(".")[0] + "."
            if name.endswith(".experts.gate_up_proj"):
                for proj, cols in (("gate_proj", slice(0, None, 2)), ("up_proj", slice(1, None, 2))):
                    shapes[p + proj] = [w.shape[0], w.shape[2] // 2, w.shape[1]]
                    parts[p + proj] = (name, cols)
            elif name.endswith(".experts.down_proj"):
                shapes[p + "down_proj"] = [w.shape[0], w.shape[2], w.shape[1]]
                parts[p + "down_proj"] = (name, slice(None))
            elif name.endswith(".experts.gate_up_proj_bias"):
                extra[p + "gate_proj.bias"], extra[p + "up_proj.bias"] = w[:, ::2], w[:, 1::2]
            elif name.endswith(".experts.down_proj_bias"):
                extra[p + "down_proj.bias"] = w
            else:
                continue
            replaced.add(name)
    return shapes, parts, replaced, extra


def source_weights(arch, module, value):
    """{source tensor: array} that a stacked module's [E, N, K] `value` stands for."""
    part = mlx_moe(arch)[1][module]
    if isinstance(part, list):
        return {name: value[e] for e, name in enumerate(part)}
    return {part[0]: value.transpose(0, 2, 1)}  # one column slice of a gpt-oss stack


def expectation(arch, export=None):
    """(quantized modules {module: [N, K] or [E, N, K]}, kept weight-like tensors {name: reason
    word}, modules the ignore list must name) of a fixture, from the names alone. MLX holds the
    experts stacked, as mlx-lm's SwitchGLU does (mlx_moe)."""
    quantized, kept, ignored = {}, {}, set()
    for name, w in source(arch).items():
        module, _, leaf = name.rpartition(".")
        last = module.rpartition(".")[2]
        if leaf == "weight" and w.ndim == 2 and last in PROJECTIONS:
            quantized[module] = list(w.shape)
        elif leaf == "weight" and w.ndim == 2 and last == "lm_head":
            kept[name] = "lm_head"
            ignored.add(module)
        elif leaf == "weight" and w.ndim == 2 and "embed" in module:
            kept[name] = "embedding"
        elif leaf == "weight" and w.ndim == 2 and last in ROUTERS:
            kept[name] = "router"
            ignored.add(module)
        elif w.ndim == 3 and ".experts." in name:  # gpt-oss: [experts, in, out] stacks
            kept[name] = "3-D"
            ignored.add(name.rpartition(".")[0])
        else:
            # Norms, biases (gpt-oss's stacked expert biases are 2-D), sinks: no weights.
            assert w.ndim == 1 or leaf.endswith("bias"), f"{arch}: {name} {w.shape} is neither a projection nor kept"
    # Tied embeddings store no lm_head weight, but loaders still build an lm_head Linear (tied to
    # the embedding), which compressed-tensors would take for quantized unless the list names it.
    with open(os.path.join(FIXTURES, arch, "config.json")) as f:
        if json.load(f).get("tie_word_embeddings") and "lm_head.weight" not in kept:
            ignored.add("lm_head")
    if export == "mlx":
        shapes, _, replaced, _ = mlx_moe(arch)
        quantized = {m: s for m, s in quantized.items() if m + ".weight" not in replaced}
        quantized.update(shapes)
        kept = {n: why for n, why in kept.items() if n not in replaced}
    return quantized, kept, ignored


def layer_tensors(module, shape, fmt, export):
    """{tensor: (dtype, shape)} a quantized module must become (docs/checkpoints.md); stacked
    experts [E, N, K] keep the leading experts axis."""
    *lead, n, k = shape
    mode = "affine" if fmt.startswith("affine") else fmt
    bits = 8 if fmt in ("mxfp8", "affine8") else 4
    g = {"nvfp4": 16, "mxfp4": 32, "mxfp8": 32, "affine": 64}[mode]
    if export == "compressed-tensors":
        out = {"weight_packed": ("U8", [n, k // 2]), "weight_scale": ("F8_E4M3" if mode == "nvfp4" else "U8", [n, k // g])}
        if mode == "nvfp4":
            out["weight_global_scale"] = ("F32", [1])
    elif export == "modelopt":
        out = {"weight": ("U8", [n, k // 2]), "weight_scale": ("F8_E4M3", [n, k // 16]), "weight_scale_2": ("F32", [])}
    else:
        out = {"weight": ("U32", [n, k * bits // 32]), "scales": ("BF16" if mode == "affine" else "U8", [n, k // g])}
        if mode == "affine":
            out["biases"] = ("BF16", [n, k // g])
    return {f"{module}.{s}": (dt, lead + dims) for s, (dt, dims) in out.items()}


def tensor_headers(d):
    out = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            out.update({k: (v["dtype"], v["shape"]) for k, v in header(os.path.join(d, f)).items() if k != "__metadata__"})
    return out


def decode(d):
    """{module: bfloat16 weight} of every quantized layer of checkpoint `d`, decoded from the
    stored codes with the section-2 rules of numerics.md (spec_oracle), whatever the layout."""
    t = load_all(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    out = {}
    for name in t:
        if name.endswith(".weight_packed"):  # compressed-tensors: stores the encode factor 2688/amax
            m = name[: -len(".weight_packed")]
            s = t[m + ".weight_scale"]
            if s.dtype == np.uint8:
                out[m] = so.dequantize(t[name], s, mode="mxfp4", dtype="bfloat16")
            else:
                amax = np.float32(2688) / t[m + ".weight_global_scale"].reshape(-1)[0]
                out[m] = so.dequantize(t[name], u8(s), mode="nvfp4", global_scale=amax, dtype="bfloat16")
        elif name.endswith(".weight_scale_2"):  # ModelOpt: stores the decode factor amax/2688
            m = name[: -len(".weight_scale_2")]
            amax = t[name].reshape(-1)[0] * np.float32(2688)
            out[m] = so.dequantize(t[m + ".weight"], u8(t[m + ".weight_scale"]), mode="nvfp4", global_scale=amax,
                                   dtype="bfloat16")
        elif name.endswith(".scales"):  # MLX: uint32 words of the same bytes, no global scale
            m = name[: -len(".scales")]
            q = {**cfg["quantization"], **cfg["quantization"].get(m, {})}
            packed = u8(t[m + ".weight"])  # [..., N, K * bits / 8]: stacked experts keep their axis
            if q["mode"] == "affine":
                out[m] = so.dequantize(packed, t[name], t[m + ".biases"], mode="affine", group_size=q["group_size"],
                                       bits=q["bits"], dtype="bfloat16")
            else:
                out[m] = so.dequantize(packed, t[name], mode=q["mode"], dtype="bfloat16")
    return out


def kept_report(csv_path):
    """{tensor or module: reason} of the weights left in high precision, from --errors-csv."""
    rows = list(csv.DictReader(io.StringIO(open(csv_path).read())))
    return {r["layer"]: r["kept"] for r in rows if r["kept"]}, {r["layer"] for r in rows if not r["kept"]}


def ignore_lists(d, export):
    cfg = json.load(open(os.path.join(d, "config.json")))
    if export == "compressed-tensors":
        return [cfg["quantization_config"]["ignore"]]
    if export == "modelopt":
        hf = json.load(open(os.path.join(d, "hf_quant_config.json")))
        q = cfg["quantization_config"]
        return [q["ignore"], hf["quantization"]["exclude_modules"]]
    return []


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """quantize (with --errors-csv) and dequantize once per (arch, mode)."""
    cache = {}

    def get(arch, fmt, export):
        if (arch, fmt, export) not in cache:
            d = tmp_path_factory.mktemp(f"{arch}-{fmt}-{export}")
            out, back, report = d / "q", d / "back", d / "errors.csv"
            r = ok("quantize", os.path.join(FIXTURES, arch), "-o", out, "--format", fmt, "--export", export,
                   "--errors-csv", report)
            ok("dequantize", out, "-o", back)
            cache[arch, fmt, export] = (str(out), str(back), str(report), r.stdout)
        return cache[arch, fmt, export]

    return get


@pytest.mark.parametrize("fmt,export", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("arch", LINEAR_ARCHS)
def test_quantizes_exactly_the_projections(quantized, arch, fmt, export):
    out, _, report, stdout = quantized(arch, fmt, export)
    want_q, want_kept, _ = expectation(arch, export)
    src = source(arch)
    _, _, replaced, extra = mlx_moe(arch) if export == "mlx" else ({}, {}, set(), {})
    want = {}
    for module, shape in want_q.items():
        want.update(layer_tensors(module, shape, fmt, export))
    copied = {n for n in src if n not in replaced and not (n.endswith(".weight") and n[: -len(".weight")] in want_q)}
    for name in copied:
        want[name] = ("BF16", list(src[name].shape))
    want.update({name: ("BF16", list(w.shape)) for name, w in extra.items()})
    assert tensor_headers(out) == want
    # Everything not quantized (norms, biases, embeddings, lm_head, routers, 3-D experts,
    # DeepSeek's e_score_correction_bias, gpt-oss's sinks) is copied byte for byte; gpt-oss's
    # expert biases are split into gate and up in MLX.
    got = load_all(out)
    for name in copied:
        assert got[name].tobytes() == src[name].tobytes(), name
    for name, w in extra.items():
        assert got[name].tobytes() == np.ascontiguousarray(w).tobytes(), name
    # Each weight left in high precision is reported with its reason, each projection quantized.
    kept, done = kept_report(report)
    assert set(kept) == set(want_kept)
    for name, word in want_kept.items():
        assert word in kept[name], (name, kept[name])
        assert name in stdout
    assert done == set(want_q)


@pytest.mark.parametrize("fmt,export", [m for m in MODES if m[1] != "mlx"], ids=[i for i in MODE_IDS if "mlx" not in i])
@pytest.mark.parametrize("arch", LINEAR_ARCHS)
def test_ignore_list_is_what_was_left(quantized, arch, fmt, export):
    out, _, _, _ = quantized(arch, fmt, export)
    _, _, want = expectation(arch)
    embeddings = {n.rpartition(".")[0] for n, why in expectation(arch)[1].items() if why == "embedding"}
    for ignore in ignore_lists(out, export):
        assert len(ignore) == len(set(ignore))
        # ModelOpt's own export also names the (unquantized) embedding; nothing else may differ.
        assert set(ignore) - (embeddings if export == "modelopt" else set()) == want


@pytest.mark.parametrize("fmt,export", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("arch", LINEAR_ARCHS)
def test_dequantize_equals_an_independent_decode(quantized, arch, fmt, export):
    out, back, _, _ = quantized(arch, fmt, export)
    want_q, _, _ = expectation(arch, export)
    ref = decode(out)
    assert set(ref) == set(want_q)
    # Dequantize gives back transformers' form: stacked experts per expert again (gpt-oss: its
    # [E, in, out] stacks), each equal to the independent decode of that expert's codes.
    assert set(load_all(back)) == set(source(arch))
    check_dequantized(arch, ref, back)
    cfg = json.load(open(os.path.join(back, "config.json")))
    assert "quantization_config" not in cfg and "quantization" not in cfg


def dequantized_form(arch, ref):
    """{source tensor: bf16 array} that dequantize must write for the decoded modules `ref`."""
    src = source(arch)
    out = {}
    for module, value in ref.items():
        if value.ndim == 2:
            out[module + ".weight"] = value
            continue
        for name, v in source_weights(arch, module, value).items():
            if name in src and src[name].ndim == 3:  # gpt-oss: this module's columns of the stack
                col = mlx_moe(arch)[1][module][1]
                stack = out.setdefault(name, np.zeros(src[name].shape, BF16))
                stack[..., col] = v
            else:
                out[name] = v
    return out


def check_dequantized(arch, ref, back):
    got, src = load_all(back), source(arch)
    want = dequantized_form(arch, ref)
    for name, w in src.items():
        assert got[name].dtype == BF16 and got[name].shape == w.shape, name
        if name in want:
            assert u8(got[name]).tobytes() == u8(want[name]).tobytes(), name
        else:
            assert got[name].tobytes() == w.tobytes(), name


@pytest.mark.parametrize("fmt,export", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("arch", LINEAR_ARCHS)
def test_inspect_names_the_layout_and_every_layer(quantized, arch, fmt, export):
    out, _, _, _ = quantized(arch, fmt, export)
    want_q, _, _ = expectation(arch, export)
    text = ok("inspect", out).stdout
    assert text.splitlines()[0].endswith(f"layout {export}")
    listed = {line.split()[0] for line in text.splitlines()[1:] if line.strip()}
    for module in want_q:
        assert any(t.startswith(module + ".") for t in listed), module


# (from, to) pairs convert supports; nvfp4 from compressed-tensors / ModelOpt is three-level, which
# MLX cannot hold (test below).
CONVERSIONS = [(("nvfp4", "compressed-tensors"), "modelopt"), (("nvfp4", "modelopt"), "compressed-tensors"),
               (("mxfp4", "compressed-tensors"), "mlx"), (("mxfp4", "mlx"), "compressed-tensors"),
               (("nvfp4", "mlx"), "compressed-tensors"), (("nvfp4", "mlx"), "modelopt")]


def codes(d):
    """{module: (packed bytes, block-scale bytes)} whatever the layout."""
    t = load_all(d)
    out = {}
    for name in t:
        for suffix, packed in ((".weight_packed", ".weight_packed"), (".weight_scale_2", ".weight"),
                               (".scales", ".weight")):
            if name.endswith(suffix):
                m = name[: -len(suffix)]
                scale = t[m + (".scales" if suffix == ".scales" else ".weight_scale")]
                out[m] = (u8(t[m + packed]).tobytes(), u8(scale).tobytes())
    return out


def per_expert_codes(arch, c):
    """`codes` with every stacked MLX module split into its experts' modules (their source names)."""
    parts = mlx_moe(arch)[1]
    out = {}
    for m, (packed, scale) in c.items():
        if isinstance(parts.get(m), list):
            n = len(parts[m])
            for e, name in enumerate(parts[m]):
                p, s = len(packed) // n, len(scale) // n
                out[name.rpartition(".")[0]] = (packed[e * p:(e + 1) * p], scale[e * s:(e + 1) * s])
        else:
            out[m] = (packed, scale)
    return out


@pytest.mark.parametrize("src_mode,to", CONVERSIONS, ids=[f"{f}-{e}-to-{t}" for (f, e), t in CONVERSIONS])
@pytest.mark.parametrize("arch", LINEAR_ARCHS)
def test_convert_keeps_the_codes(quantized, tmp_path, arch, src_mode, to):
    out, _, _, _ = quantized(arch, *src_mode)
    conv = tmp_path / "conv"
    if model_type(arch) == "gpt_oss" and src_mode[1] == "mlx" and to != "mlx":
        # gpt-oss's split experts have no compressed-tensors or ModelOpt form: refused, nothing written.
        r = run("convert", out, "-o", conv, "--to", to)
        assert r.returncode != 0 and "stacked experts" in r.stderr and ".mlp.experts." in r.stderr
        assert not conv.exists()
        return
    ok("convert", out, "-o", conv, "--to", to)
    # The same codes, per expert or stacked as the target holds them (MLX: mlx-lm's SwitchGLU).
    assert set(per_expert_codes(arch, codes(str(conv)))) == set(expectation(arch)[0])
    assert per_expert_codes(arch, codes(str(conv))) == per_expert_codes(arch, codes(out))
    if to == "mlx" and model_type(arch) != "gpt_oss":
        assert set(codes(str(conv))) == set(expectation(arch, "mlx")[0])
    # Dequantizing the converted checkpoint still equals the independent decode of its codes;
    # an MLX source is two-level, so the values do not change either.
    back = tmp_path / "back"
    ok("dequantize", conv, "-o", back)
    ref = decode(str(conv))
    check_dequantized(arch, ref, str(back))
    if src_mode[1] == "mlx":
        before, after = dequantized_form(arch, decode(out)), dequantized_form(arch, ref)
        assert set(before) == set(after)
        assert all(u8(after[n]).tobytes() == u8(before[n]).tobytes() for n in after)
    _, kept, want = expectation(arch)
    embeddings = {n.rpartition(".")[0] for n, why in kept.items() if why == "embedding"}
    for ignore in ignore_lists(str(conv), to):
        assert set(ignore) - (embeddings if to == "modelopt" else set()) == want


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_three_level_nvfp4_into_mlx_is_refused(quantized, tmp_path, arch):
    out, _, _, _ = quantized(arch, "nvfp4", "compressed-tensors")
    r = run("convert", out, "-o", tmp_path / "conv", "--to", "mlx")
    assert r.returncode != 0 and "dequantize" in r.stderr
    assert not (tmp_path / "conv").exists()


def test_gpt2_conv1d_is_refused_naming_the_weights(tmp_path):
    out = tmp_path / "out"
    r = run("quantize", os.path.join(FIXTURES, "gpt2"), "-o", out)
    assert r.returncode != 0
    assert "Conv1D" in r.stderr and "transformer.h.0.attn.c_attn.weight" in r.stderr
    assert "--exclude c_attn" in r.stderr
    assert not out.exists()
    # Excluding them leaves only embeddings: nothing to quantize, each candidate named with its reason.
    r = run("quantize", os.path.join(FIXTURES, "gpt2"), "-o", out, "--exclude", "c_attn", "--exclude", "c_fc",
            "--exclude", "c_proj")
    assert r.returncode != 0
    assert '"transformer.h.1.mlp.c_fc.weight" (excluded)' in r.stderr
    assert '"transformer.wte.weight" (embedding)' in r.stderr
    assert not out.exists()


# Sibling projections vLLM runs as one GEMM with one global scale, so both ecosystems export them
# with a common one: llm-compressor's fused layer names (q/k/v, gate/up, w1/w3 and DeepSeek MLA's
# q_a_proj + kv_a_proj_with_mqa, vLLM's fused_qkv_a_proj); ModelOpt fuses linears that share an input.
FUSED = [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3"), ("q_a_proj", "kv_a_proj_with_mqa")]


@pytest.mark.parametrize("export", ["compressed-tensors", "modelopt"])
@pytest.mark.parametrize("arch", LINEAR_ARCHS)
def test_fused_projections_share_one_global_scale(quantized, arch, export):
    out, _, _, _ = quantized(arch, "nvfp4", export)
    src, got = source(arch), load_all(out)
    key = ".weight_global_scale" if export == "compressed-tensors" else ".weight_scale_2"
    want_q, _, _ = expectation(arch)
    groups = {}
    for module in want_q:
        parent, _, last = module.rpartition(".")
        for i, names in enumerate(FUSED):
            if last in names:
                groups.setdefault((parent, i), []).append(module)
    fused = {m for members in groups.values() if len(members) > 1 for m in members}
    for module in want_q:
        members = next((g for g in groups.values() if module in g and len(g) > 1), [module])
        amax = max(np.float32(np.abs(src[m + ".weight"].astype(np.float32)).max()) for m in members)
        want = np.float32(2688) / amax if export == "compressed-tensors" else amax / np.float32(2688)
        assert got[module + key].reshape(-1)[0] == want, (module, members)
    if arch == "deepseek_v3":
        assert "model.layers.0.self_attn.kv_a_proj_with_mqa" in fused


# Tensor names a layer takes in one layout or another beyond its `.weight` (docs/checkpoints.md).
LAYER_PARTS = ["weight_global_scale", "input_global_scale", "input_scale", "biases"]


@pytest.mark.parametrize("fmt,export", MODES, ids=MODE_IDS)
def test_tensor_named_like_a_part_of_an_exported_layer_is_refused(tmp_path, fmt, export):
    """Every export of a model that also holds a float tensor named like a part of a layer it
    writes: that output used to be refused by inspect, dequantize and convert (or its tensor read as
    the layer's activation scale, or the export failed when writing a file); the export refuses it
    before writing anything, naming both tensors. Without the extra tensor the export reads back
    (the tests above)."""
    module = "model.layers.0.self_attn.q_proj"
    src = tmp_path / "src"
    shutil.copytree(os.path.join(FIXTURES, "llama"), src)
    t = load_all(src)
    for part in LAYER_PARTS:
        extra = f"{module}.{part}"
        save_file({**t, extra: np.ones([1], np.float32)}, str(src / "model.safetensors"))
        out = tmp_path / part
        r = run("quantize", src, "-o", out, "--format", fmt, "--export", export)
        assert r.returncode == 1, (part, r.stdout)
        assert f'"{extra}"' in r.stderr and f'quantized layer "{module}"' in r.stderr, r.stderr
        assert not out.exists()


def test_two_layers_of_one_name_are_refused(tmp_path):
    """mlx-lm's SwitchGLU name for stacked experts, also held as a float weight of its own: both
    would be written as one tensor (the export used to fail only when writing the file)."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(FIXTURES, "qwen3_moe"), src)
    t = load_all(src)
    expert = "model.layers.0.mlp.experts.0.gate_proj.weight"
    stacked = "model.layers.0.mlp.switch_mlp.gate_proj"
    save_file({**t, stacked + ".weight": t[expert]}, str(src / "model.safetensors"))
    r = run("quantize", src, "-o", tmp_path / "out", "--format", "mxfp4", "--export", "mlx")
    assert r.returncode == 1
    assert f'output tensor "{stacked}.weight" would be written twice' in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
