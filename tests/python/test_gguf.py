"""The GGUF export and import (docs/gguf.md) checked with llama.cpp's own reader and decoder: the
`gguf` package from PyPI (llama.cpp's gguf-py) reads every file microscale writes, its NVFP4/MXFP4
dequantize is compared with an independent decode of the compressed-tensors export of the same
model, and the codes and scale bytes are unpacked from ggml's blocks here (from ggml's definition)
and compared byte for byte with that export. Round trips: compressed-tensors -> GGUF -> back, and
MLX -> GGUF. The run with llama.cpp itself is in scripts/test-ecosystem.sh (it builds llama.cpp).
"""

import json
import os
import re
import shutil

import ml_dtypes
import numpy as np
import pytest

from ckpt_support import ROOT, load_all, make_tensors, ok, run, skip_without_cli, write_model

skip_without_cli()
gguf = pytest.importorskip("gguf", reason="pip install gguf==0.19.0 (llama.cpp's gguf-py)")

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
WITH_TOKENIZER = [a for a in sorted(os.listdir(FIXTURES))
                  if os.path.isdir(os.path.join(FIXTURES, a))
                  and any(os.path.exists(os.path.join(FIXTURES, a, f)) for f in ("tokenizer.json", "tokenizer.model"))]
ARCH = {"llama": "LLAMA", "mistral": "LLAMA", "mixtral": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3",
        "qwen3_moe": "QWEN3MOE", "gemma2": "GEMMA2", "gemma3": "GEMMA3", "phi3": "PHI3", "gpt_oss": "GPT_OSS"}
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
GROUP = {"nvfp4": 16, "mxfp4": 32}


def fixture_config(arch):
    with open(os.path.join(FIXTURES, arch, "config.json")) as f:
        return json.load(f)


def unpack_ggml(blocks, fmt):
    """Codes (compact: byte i holds values 2i low, 2i+1 high) and scale bytes of ggml blocks
    [rows, row_bytes], from ggml's block_nvfp4 / block_mxfp4 definitions."""
    blocks = np.asarray(blocks, np.uint8)
    rows = blocks.shape[0]
    if fmt == "nvfp4":  # 36 bytes per 64 values: d[4], then qs[32]; sub-block s: j low, j+8 high
        b = blocks.reshape(rows, -1, 36)
        scales = b[:, :, :4].reshape(rows, -1)
        qs = b[:, :, 4:].reshape(rows, -1, 4, 8)
        vals = np.concatenate([qs & 0xF, qs >> 4], axis=-1)  # [rows, super, 4, 16]
    else:  # 17 bytes per 32 values: e, then qs[16]; j low, j+16 high
        b = blocks.reshape(rows, -1, 17)
        scales = b[:, :, 0]
        qs = b[:, :, 1:]
        vals = np.concatenate([qs & 0xF, qs >> 4], axis=-1)
    vals = vals.reshape(rows, -1)
    codes = (vals[:, 0::2] | (vals[:, 1::2] << 4)).astype(np.uint8)
    return codes, scales


def decode(codes, scales, fmt):
    """Two-level values of compact codes and scale bytes (the factor a global scale adds apart)."""
    v = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(codes.shape[0], -1)
    if fmt == "nvfp4":
        s = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    else:
        s = np.ldexp(np.float32(1), scales.astype(np.int32) - 127).astype(np.float32)
    return E2M1[v] * np.repeat(s, GROUP[fmt], axis=1)


def unpermute(rows, heads):
    """Inverse of llama.cpp's q/k row order: row h*d + j*d/2 + i comes from h*d + 2i + j."""
    n = rows.shape[0]
    d = n // heads
    idx = np.arange(n).reshape(heads, 2, d // 2).swapaxes(1, 2).reshape(-1)
    out = np.empty_like(rows)
    out[idx] = rows
    return out


def gguf_name(arch, hf, cfg=None):
    """The GGUF tensor of a Hugging Face weight, by gguf-py's own mapping; experts of
    "<p>.experts.<e>.<proj>" map to the stacked "<p>.experts.<proj>" (the converter's merge)."""
    cfg = cfg or fixture_config(arch)
    m = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, ARCH[arch]), cfg["num_hidden_layers"])
    expert = re.match(r"(.*)\.experts\.(\d+)\.(\w+)\.weight$", hf)
    if expert:
        return m.get_name(f"{expert[1]}.experts.{expert[3]}.weight", try_suffixes=(".weight",)), int(expert[2])
    return m.get_name(hf, try_suffixes=(".weight",)), None


def heads_of(arch, name, cfg=None):
    if ARCH[arch] != "LLAMA":
        return 0
    cfg = cfg or fixture_config(arch)
    if ".attn_q." in name:
        return cfg["num_attention_heads"]
    if ".attn_k." in name:
        return cfg["num_key_value_heads"]
    return 0


def tensors_of(path):
    r = gguf.GGUFReader(path)
    return r, {t.name: t for t in r.tensors}


def field(reader, key):
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """quantize --export gguf and --export compressed-tensors of every fixture with a tokenizer."""
    base = tmp_path_factory.mktemp("gguf")
    out = {}
    for arch in WITH_TOKENIZER:
        for fmt in ("nvfp4", "mxfp4"):
            g = base / f"{arch}-{fmt}.gguf"
            ct = base / f"{arch}-{fmt}-ct"
            ok("quantize", os.path.join(FIXTURES, arch), "-o", g, "--export", "gguf", "--format", fmt,
               "--scale-rule", "ceil")
            ok("quantize", os.path.join(FIXTURES, arch), "-o", ct, "--export", "compressed-tensors", "--format", fmt,
               "--scale-rule", "ceil")
            out[arch, fmt] = (str(g), str(ct))
    return out


PAIRS = [(a, f) for a in WITH_TOKENIZER for f in ("nvfp4", "mxfp4")]


def test_every_architecture_has_a_fixture_tokenizer():
    # The architectures; gpt-oss and Mixtral fixtures get theirs with llama.cpp's check.
    for arch in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3", "phi3"):
        assert arch in WITH_TOKENIZER


@pytest.mark.parametrize("arch,fmt", PAIRS)
def test_gguf_py_reads_the_export(exports, arch, fmt):
    g, _ = exports[arch, fmt]
    reader, tensors = tensors_of(g)
    assert field(reader, "general.architecture") == gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, ARCH[arch])]
    assert field(reader, "general.file_type") == (39 if fmt == "nvfp4" else 38)
    assert field(reader, "tokenizer.ggml.model") in ("gpt2", "llama")
    assert len(field(reader, "tokenizer.ggml.tokens")) == fixture_config(arch)["vocab_size"]
    # Every tensor name is one gguf-py knows for this architecture.
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[getattr(gguf.MODEL_ARCH, ARCH[arch])]}
    for name in tensors:
        base = name.rsplit(".", 1)[0]
        assert re.sub(r"blk\.\d+\.", "blk.{bid}.", base) in known, name
    qtype = gguf.GGMLQuantizationType.NVFP4 if fmt == "nvfp4" else gguf.GGMLQuantizationType.MXFP4
    assert any(t.tensor_type == qtype for t in tensors.values())


@pytest.mark.parametrize("arch,fmt", PAIRS)
def test_blocks_hold_the_compressed_tensors_bytes_and_decode_alike(exports, arch, fmt):
    """Each quantized layer of the compressed-tensors export is in the GGUF with the same code and
    scale bytes (ggml's order undone here), gguf-py's dequantize gives the same values, and the
    nvfp4 .scale is the decode factor 1/weight_global_scale."""
    assert_same_layers(*exports[arch, fmt], arch, fmt)


def assert_same_layers(g, ct, arch, fmt_of, cfg=None):
    """fmt_of: the layers' format, or a function giving each module's."""
    _, tensors = tensors_of(g)
    ctt = load_all(ct)
    layers = [n[: -len(".weight_packed")] for n in ctt if n.endswith(".weight_packed")]
    assert layers
    for m in layers:
        fmt = fmt_of(m) if callable(fmt_of) else fmt_of
        name, expert = gguf_name(arch, m + ".weight", cfg)
        assert name in tensors, (m, name)
        t = tensors[name]
        assert t.tensor_type == getattr(gguf.GGMLQuantizationType, fmt.upper()), (m, t.tensor_type)
        data = np.asarray(t.data)
        if expert is not None:
            data = data[expert]
        codes, scales = unpack_ggml(data, fmt)
        heads = heads_of(arch, name, cfg)
        if heads:
            codes, scales = unpermute(codes, heads), unpermute(scales, heads)
        want_codes = ctt[m + ".weight_packed"].view(np.uint8)
        want_scales = ctt[m + ".weight_scale"].view(np.uint8)
        assert np.array_equal(codes, want_codes), m
        assert np.array_equal(scales, want_scales), m
        # gguf-py's decoder on the GGUF bytes vs the decode of the compressed-tensors bytes. ggml
        # reads code 8 (-0) as +0: compared as values, where -0 == 0.
        got = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        if expert is not None:
            got = got[expert]
        if heads:
            got = unpermute(got, heads)
        want = decode(want_codes, want_scales, fmt)
        assert np.array_equal(got, want), m
        if fmt == "nvfp4":
            s = np.asarray(tensors[name.replace(".weight", ".scale")].data, np.float32)
            gs = ctt[m + ".weight_global_scale"].astype(np.float32).reshape(-1)[0]
            factor = s[expert] if expert is not None else s[0]
            assert abs(float(factor) * float(gs) - 1) < 2 ** -22, (m, factor, gs)


@pytest.mark.parametrize("arch,fmt", PAIRS)
def test_float_tensors_follow_the_converter(exports, arch, fmt):
    """Norms in F32 (Gemma's stored as w + 1), q/k-free floats byte-identical, embeddings kept."""
    g, _ = exports[arch, fmt]
    _, tensors = tensors_of(g)
    src = load_all(os.path.join(FIXTURES, arch))
    gemma = arch.startswith("gemma")
    for hf, w in src.items():
        name, _ = gguf_name(arch, hf)
        if name is None or name not in tensors or hf.endswith("inv_freq"):
            continue
        t = tensors[name]
        got = np.asarray(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.F32 and w.ndim == 1:
            want = w.astype(np.float32) + (1 if gemma and hf.endswith("norm.weight") else 0)
            assert np.array_equal(got.reshape(-1), want), hf
        elif t.tensor_type == gguf.GGMLQuantizationType.BF16:
            heads = heads_of(arch, name)
            raw = got.view(np.uint16).reshape(w.shape)
            if heads:
                raw = unpermute(raw, heads)
            assert np.array_equal(raw, w.view(np.uint16)), hf


@pytest.mark.parametrize("arch,fmt", [p for p in PAIRS if p[0] in ("llama", "qwen3_moe", "gemma3")])
def test_convert_compressed_tensors_to_gguf_and_back_keeps_the_bytes(exports, tmp_path, arch, fmt):
    g, ct = exports[arch, fmt]
    converted = tmp_path / "c.gguf"
    ok("convert", ct, "--to", "gguf", "-o", converted)
    _, direct = tensors_of(g)
    _, conv = tensors_of(str(converted))
    assert set(direct) == set(conv)
    for name, t in direct.items():
        a, b = np.asarray(t.data), np.asarray(conv[name].data)
        if name.endswith(".scale"):  # from 2688/amax back to amax/2688: within one float32 ulp
            assert np.allclose(a, b, rtol=2 ** -23, atol=0), name
        else:
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), name
    back = tmp_path / "back"
    ok("convert", converted, "--to", "compressed-tensors", "-o", back)
    orig, again = load_all(ct), load_all(str(back))
    for n, w in orig.items():
        if n.endswith((".weight_packed", ".weight_scale")):
            assert np.array_equal(again[n].view(np.uint8), w.view(np.uint8)), n
        elif n.endswith(".weight_global_scale"):
            assert np.allclose(again[n].astype(np.float32), w.astype(np.float32), rtol=2 ** -22, atol=0), n


def test_mlx_to_gguf_keeps_the_codes(exports, tmp_path):
    _, _ = exports["qwen3_moe", "mxfp4"]
    mlx = tmp_path / "mlx"
    ok("quantize", os.path.join(FIXTURES, "qwen3_moe"), "-o", mlx, "--export", "mlx", "--format", "mxfp4",
       "--scale-rule", "ceil")
    converted = tmp_path / "m.gguf"
    ok("convert", mlx, "--to", "gguf", "-o", converted)
    _, direct = tensors_of(exports["qwen3_moe", "mxfp4"][0])
    _, conv = tensors_of(str(converted))
    quantized = [n for n, t in direct.items() if t.tensor_type == gguf.GGMLQuantizationType.MXFP4]
    assert any("exps" in n for n in quantized)
    for n in quantized:
        assert np.array_equal(np.asarray(direct[n].data), np.asarray(conv[n].data)), n


@pytest.mark.parametrize("arch,fmt", [("llama", "nvfp4"), ("qwen3_moe", "mxfp4"), ("gemma2", "nvfp4")])
def test_dequantize_and_inspect_a_gguf(exports, tmp_path, arch, fmt):
    g, ct = exports[arch, fmt]
    a, b = tmp_path / "from-gguf", tmp_path / "from-ct"
    ok("dequantize", g, "-o", a, "--dtype", "float32")
    ok("dequantize", ct, "-o", b, "--dtype", "float32")
    x, y = load_all(str(a)), load_all(str(b))
    for n, w in y.items():
        assert n in x, n
        got = x[n].astype(np.float32)
        # nvfp4: the global factor crossed conventions (2688/amax vs amax/2688): within an ulp or so.
        assert np.allclose(got, w.astype(np.float32), rtol=2 ** -21, atol=0), n
    r = ok("inspect", g)
    assert "gguf" in r.stdout and ("NVFP4" in r.stdout or "MXFP4" in r.stdout)


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_recipe_gives_each_tensor_its_type(tmp_path, arch):
    """A recipe's per-layer formats become per-tensor GGML types holding the compressed-tensors
    export's bytes, which llama.cpp's decoder reads, and the GGUF reads back."""
    fixture = os.path.join(FIXTURES, arch)
    rule = ["--layer", "*down_proj=mxfp4,scale_rule=even"]  # compressed-tensors' default rule, in both
    ok("quantize", fixture, "-o", tmp_path / "m.gguf", "--export", "gguf", *rule)
    ok("quantize", fixture, "-o", tmp_path / "ct", "--export", "compressed-tensors", *rule)
    assert_same_layers(str(tmp_path / "m.gguf"), str(tmp_path / "ct"), arch,
                       lambda m: "mxfp4" if m.endswith("down_proj") else "nvfp4")
    r = ok("inspect", tmp_path / "m.gguf")
    assert "mxfp4" in r.stdout and "nvfp4" in r.stdout
    ok("convert", tmp_path / "m.gguf", "-o", tmp_path / "back", "--to", "compressed-tensors")
    a, b = load_all(str(tmp_path / "back")), load_all(str(tmp_path / "ct"))
    for n in b:
        if n.endswith((".weight_packed", ".weight_scale")):
            assert a[n].tobytes() == b[n].tobytes(), n


def test_budget_into_gguf_chooses_among_the_types_it_has(tmp_path):
    """GGUF has no mxfp8: the default candidates there are nvfp4 (mse) and keep; a named mxfp8
    candidate is refused."""
    fixture = os.path.join(FIXTURES, "llama")
    ok("quantize", fixture, "-o", tmp_path / "m.gguf", "--export", "gguf", "--budget", "8", "--budget-csv",
       tmp_path / "t.csv")
    rows = (tmp_path / "t.csv").read_text().splitlines()
    assert {r.rsplit(",", 3)[0].split(",", 1)[1].strip('"') for r in rows[1:]} == {"nvfp4,scale_search=mse", "keep"}
    _, tensors = tensors_of(str(tmp_path / "m.gguf"))
    projections = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_up.weight",
                   "ffn_gate.weight", "ffn_down.weight")
    types = {t.tensor_type for n, t in tensors.items() if n.endswith(projections)}
    assert types == {gguf.GGMLQuantizationType.NVFP4, gguf.GGMLQuantizationType.BF16}
    r = run("quantize", fixture, "-o", tmp_path / "x.gguf", "--export", "gguf", "--budget", "8", "--candidate",
            "mxfp8")
    assert r.returncode != 0 and "mxfp8" in r.stderr and "GGUF" in r.stderr, r.stderr


def test_budget_writes_what_the_same_recipe_writes(tmp_path):
    """Stacked experts take a global scale per expert, shared across gate/up: --budget measures
    and writes them exactly as a recipe giving its choices writes them."""
    fixture = os.path.join(FIXTURES, "qwen3_moe")
    table = tmp_path / "t.csv"
    ok("quantize", fixture, "-o", tmp_path / "b.gguf", "--export", "gguf", "--budget", "5.5", "--candidate",
       "nvfp4", "--candidate", "mxfp4,scale_rule=even", "--candidate", "keep", "--budget-csv", table)
    import csv
    rules = []
    for x in csv.DictReader(open(table)):
        if x["chosen"] == "1":
            # A stacked layer is named as written (switch_mlp); recipes match the source's experts.
            rules += [a for m in x["tensor"].split("+")
                      for a in ("--layer", f"{m.replace('.switch_mlp.', '.experts.*.')}={x['format']}")]
    assert len({r.split("=", 1)[1] for r in rules[1::2]}) > 1, rules
    ok("quantize", fixture, "-o", tmp_path / "r.gguf", "--export", "gguf", *rules)
    assert (tmp_path / "b.gguf").read_bytes() == (tmp_path / "r.gguf").read_bytes()


def test_split_files_are_llamas(tmp_path):
    out = tmp_path / "m.gguf"
    ok("quantize", os.path.join(FIXTURES, "llama"), "-o", out, "--export", "gguf", "--split-max-size", "20K")
    files = sorted(os.listdir(tmp_path))
    assert len(files) > 1 and all(re.fullmatch(r"m-\d{5}-of-\d{5}\.gguf", f) for f in files), files
    n = len(files)
    total = 0
    for i, f in enumerate(files):
        reader, tensors = tensors_of(str(tmp_path / f))
        assert field(reader, "split.no") == i and field(reader, "split.count") == n
        total += len(tensors)
        assert field(reader, "split.tensors.count") == total if i == n - 1 else True
    assert "general.architecture" in gguf.GGUFReader(str(tmp_path / files[0])).fields


def test_refusals_name_the_problem(tmp_path):
    fx = os.path.join(FIXTURES, "llama")
    r = run("quantize", fx, "-o", tmp_path / "a.gguf", "--export", "gguf", "--format", "mxfp8")
    assert r.returncode != 0 and "GGUF" in r.stderr and "mxfp8" in r.stderr
    no_tok = tmp_path / "notok"
    os.makedirs(no_tok)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(fx, f), no_tok)
    r = run("quantize", no_tok, "-o", tmp_path / "b.gguf", "--export", "gguf")
    assert r.returncode != 0 and "tokenizer" in r.stderr
    assert not os.path.exists(tmp_path / "b.gguf")
    ok("quantize", fx, "-o", tmp_path / "c.gguf", "--export", "gguf")
    r = run("quantize", fx, "-o", tmp_path / "c.gguf", "--export", "gguf")
    assert r.returncode != 0 and "--force" in r.stderr
    ok("quantize", fx, "-o", tmp_path / "c.gguf", "--export", "gguf", "--force")
    # Nothing but the file itself is left behind.
    assert sorted(os.listdir(tmp_path)) == ["c.gguf", "notok"]


def test_rows_that_are_not_whole_ggml_blocks_are_kept(tmp_path):
    """nvfp4 in ggml needs K to be a multiple of 64: a K = 96 projection stays bf16, reported."""
    src = tmp_path / "m"
    write_model(src, make_tensors(layers=1, hidden=64, inter=96, kv=64, vocab=128), shards=1,
                config_extra={"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_attention_heads": 2,
                              "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
                              "rms_norm_eps": 1e-6, "num_hidden_layers": 1, "hidden_size": 64,
                              "intermediate_size": 96})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURES, "llama", f), src)
    r = ok("quantize", src, "-o", tmp_path / "m.gguf", "--export", "gguf")
    assert "down_proj" in r.stdout and "64" in r.stdout
    _, tensors = tensors_of(str(tmp_path / "m.gguf"))
    assert tensors["blk.0.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.BF16
    assert tensors["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.NVFP4


def test_gptoss_mxfp4_experts_move_into_gguf_unchanged(tmp_path):
    """gpt-oss's published MXFP4 experts: convert --to gguf copies their codes and E8M0 scales into
    ggml's blocks (gate and up split from gate_up_proj's rows), nothing re-quantized."""
    from test_gptoss_convert import make_source, split_rows

    src = tmp_path / "src"
    t = make_source(src, seed=5, canonical=False)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURES, "gpt_oss", f), src)
    out = tmp_path / "g.gguf"
    ok("convert", src, "--to", "gguf", "-o", out)
    _, tensors = tensors_of(str(out))
    parts = split_rows(t)
    assert parts
    for module, (blocks, scales) in parts.items():
        name, _ = gguf_name("gpt_oss", module + ".weight")
        g = tensors[name]
        assert g.tensor_type == gguf.GGMLQuantizationType.MXFP4, name
        data = np.asarray(g.data)
        for e in range(blocks.shape[0]):
            codes, sc = unpack_ggml(data[e], "mxfp4")
            assert np.array_equal(codes, blocks[e].reshape(blocks.shape[1], -1)), (name, e)
            assert np.array_equal(sc, scales[e]), (name, e)


def test_mixed_fp8_and_nvfp4_groups_go_to_gguf(tmp_path, monkeypatch):
    """A compressed-tensors checkpoint with FP8 groups and an NVFP4 group: the NVFP4 layers keep
    their bytes, the FP8 weights are written as BF16 (GGUF has no FP8 type; llama.cpp's converter
    also dequantizes them), each reported."""
    import test_mixed_groups as tm

    h, kv, inter = 128, 64, 256  # whole ggml blocks
    monkeypatch.setattr(tm, "H", h)
    monkeypatch.setattr(tm, "SHAPES", {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h),
                                       "self_attn.v_proj": (kv, h), "self_attn.o_proj": (h, h),
                                       "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
                                       "mlp.down_proj": (h, inter)})
    src = tmp_path / "mixed"
    tm.make_fp8_nvfp4(src, "nvfp4")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update({"num_hidden_layers": 2, "hidden_size": h, "intermediate_size": inter, "num_attention_heads": 2,
                "num_key_value_heads": 1, "vocab_size": tm.VOCAB, "rms_norm_eps": 1e-5,
                "max_position_embeddings": 128})
    (src / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURES, "llama", f), src)
    out = tmp_path / "m.gguf"
    r = run("convert", src, "--to", "gguf", "-o", out)
    if tm.VOCAB < 128:  # the fixture's tokenizer is larger than this model's vocabulary: refused, named
        assert r.returncode != 0 and "tokenizer" in r.stderr
        cfg["vocab_size"] = 128
        t = load_all(str(src))
        emb = np.zeros((128, h), t["model.embed_tokens.weight"].dtype)
        emb[: tm.VOCAB] = t["model.embed_tokens.weight"]
        head = np.zeros((128, h), t["lm_head.weight"].dtype)
        head[: tm.VOCAB] = t["lm_head.weight"]
        t["model.embed_tokens.weight"], t["lm_head.weight"] = emb, head
        tm.write_dir(src, t, {k: v for k, v in cfg.items()})
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(FIXTURES, "llama", f), src)
        r = run("convert", src, "--to", "gguf", "-o", out)
    assert r.returncode == 0, r.stderr
    assert "FP8" in r.stdout
    _, tensors = tensors_of(str(out))
    src_t = load_all(str(src))
    layers = [n[: -len(".weight_packed")] for n in src_t if n.endswith(".weight_packed")]
    assert layers
    for m in layers:
        name = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2).get_name(m + ".weight", try_suffixes=(".weight",))
        codes, scales = unpack_ggml(np.asarray(tensors[name].data), "nvfp4")
        assert np.array_equal(codes, src_t[m + ".weight_packed"].view(np.uint8)), m
        assert np.array_equal(scales, src_t[m + ".weight_scale"].view(np.uint8)), m
    fp8 = [n for n, w in src_t.items() if w.dtype == ml_dtypes.float8_e4m3fn and n.endswith(".weight")]
    assert fp8
    for n in fp8:
        name = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2).get_name(n, try_suffixes=(".weight",))
        assert tensors[name].tensor_type == gguf.GGMLQuantizationType.BF16, n


def test_convert_writes_layers_without_whole_blocks_as_floats(tmp_path):
    """A compressed-tensors layer with K = 96 has no ggml NVFP4 form (64-value blocks): convert
    writes its values as F32, reported by name, and keeps every other layer's bytes."""
    src = tmp_path / "m"
    write_model(src, make_tensors(layers=1, hidden=64, inter=96, kv=64, vocab=128), shards=1,
                config_extra={"num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 128,
                              "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "num_hidden_layers": 1,
                              "hidden_size": 64, "intermediate_size": 96})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURES, "llama", f), src)
    ct = tmp_path / "ct"
    ok("quantize", src, "-o", ct, "--export", "compressed-tensors")
    r = ok("convert", ct, "--to", "gguf", "-o", tmp_path / "m.gguf")
    assert "dequantized 1 weight" in r.stdout and "model.layers.0.mlp.down_proj" in r.stdout and "64" in r.stdout
    _, tensors = tensors_of(str(tmp_path / "m.gguf"))
    down = tensors["blk.0.ffn_down.weight"]
    assert down.tensor_type == gguf.GGMLQuantizationType.F32
    deq = tmp_path / "deq"
    ok("dequantize", ct, "-o", deq, "--dtype", "float32")
    want = load_all(str(deq))["model.layers.0.mlp.down_proj.weight"]
    assert np.array_equal(np.asarray(down.data).reshape(want.shape), want)
    assert tensors["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.NVFP4


@pytest.mark.parametrize("split", [None, "30K"])
def test_split_run_parts_give_the_same_file(tmp_path, split):
    """quantize --part I/N: each part quantizes every N-th item, the last assembles the GGUF; the
    result is byte-identical to a one-process run, with or without llama.cpp's split files."""
    fx = os.path.join(FIXTURES, "qwen3_moe")
    extra = ["--split-max-size", split] if split else []
    one, two = tmp_path / "one", tmp_path / "two"
    os.makedirs(one)
    os.makedirs(two)
    ok("quantize", fx, "-o", one / "m.gguf", "--export", "gguf", "--scale-search", "mse", *extra)
    r = ok("quantize", fx, "-o", two / "m.gguf", "--export", "gguf", "--scale-search", "mse", "--part", "1/2", *extra)
    assert "part 1 of 2" in r.stdout and not any(f.endswith(".gguf") for f in os.listdir(two))
    # Another part's options must agree.
    r = run("quantize", fx, "-o", two / "m.gguf", "--export", "gguf", "--part", "0/2", *extra)
    assert r.returncode != 0
    ok("quantize", fx, "-o", two / "m.gguf", "--export", "gguf", "--scale-search", "mse", "--part", "0/2", *extra)
    assert sorted(os.listdir(one)) == sorted(os.listdir(two))
    for f in os.listdir(one):
        with open(one / f, "rb") as a, open(two / f, "rb") as b:
            assert a.read() == b.read(), f


def test_gptq_bytes_are_the_compressed_tensors_ones(tmp_path):
    """--hessians (GPTQ) with the GGUF export: the same codes and scales as with compressed-tensors."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    hs = {}
    for m, k in (("model.layers.0.self_attn.q_proj", 64), ("model.layers.1.mlp.down_proj", 128)):
        x = rng.standard_normal((256, k)).astype(np.float32)
        hs[m] = (x.T @ x).astype(np.float32)
    h = tmp_path / "h.safetensors"
    save_file(hs, str(h))
    fx = os.path.join(FIXTURES, "llama")
    g, ct = tmp_path / "g.gguf", tmp_path / "ct"
    r = ok("quantize", fx, "-o", g, "--export", "gguf", "--hessians", h)
    assert "GPTQ for 2" in r.stdout
    ok("quantize", fx, "-o", ct, "--export", "compressed-tensors", "--hessians", h)
    assert_same_layers(str(g), str(ct), "llama", "nvfp4")


def test_scale_bytes_ggml_reads_otherwise(exports, tmp_path):
    """A block scale with its sign bit set is written with its magnitude and the block's codes
    negated (the same values in ggml); an E4M3 NaN scale (0x7F) keeps its byte, which ggml reads
    as 0, and the report names the tensor."""
    from test_quantized_sources import write_dir

    _, ct = exports["qwen3", "nvfp4"]
    t = load_all(ct)
    m = "model.layers.0.mlp.down_proj"
    scales = t[m + ".weight_scale"].view(np.uint8).copy()
    codes = t[m + ".weight_packed"].view(np.uint8)
    scales[0, 0] |= 0x80  # negative
    scales[1, 2] = 0x7F  # NaN
    t[m + ".weight_scale"] = scales.view(ml_dtypes.float8_e4m3fn)
    src = tmp_path / "src"
    with open(os.path.join(ct, "config.json")) as f:
        write_dir(src, t, json.load(f))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(FIXTURES, "qwen3", f), src)
    r = ok("convert", src, "--to", "gguf", "-o", tmp_path / "m.gguf")
    assert "blk.0.ffn_down.weight" in r.stdout and "NaN" in r.stdout
    _, tensors = tensors_of(str(tmp_path / "m.gguf"))
    g = tensors["blk.0.ffn_down.weight"]
    got_codes, got_scales = unpack_ggml(np.asarray(g.data), "nvfp4")
    assert got_scales[0, 0] == scales[0, 0] & 0x7F and got_scales[1, 2] == 0x7F
    assert np.array_equal(got_codes[0, :8], codes[0, :8] ^ 0x88)
    assert np.array_equal(got_codes[0, 8:], codes[0, 8:]) and np.array_equal(got_codes[1:], codes[1:])
    got = gguf.quants.dequantize(np.asarray(g.data), g.tensor_type)
    want = decode(codes, scales, "nvfp4")
    assert np.array_equal(got[0, :16], want[0, :16])  # the negative scale: same values
    assert np.all(got[1, 32:48] == 0) and np.all(np.isnan(want[1, 32:48]))  # NaN in microscale, 0 in ggml


@pytest.mark.parametrize("dtype", ["float32", "float16", "fp8-block"])
def test_every_source_dtype(tmp_path, dtype):
    """float32, float16 and DeepSeek-style block FP8 sources: the GGUF holds the compressed-tensors
    export's bytes (FP8 weights decoded one at a time, then quantized)."""
    from test_quantized_sources import make_fp8, write_dir

    if dtype == "fp8-block":
        tensors, config, _, _ = make_fp8("fp8-block")
        for n in ("model.embed_tokens.weight", "lm_head.weight"):  # the fixture tokenizer's 128 tokens
            w = tensors[n]
            tensors[n] = np.concatenate([w, np.zeros((128 - w.shape[0], w.shape[1]), w.dtype)])
        config.update({"num_hidden_layers": 1, "hidden_size": 288, "intermediate_size": 160, "num_attention_heads": 4,
                       "num_key_value_heads": 4, "head_dim": 50, "vocab_size": 128, "rms_norm_eps": 1e-5,
                       "max_position_embeddings": 64})
        fmt = "mxfp4"  # K = 288 and 160 are whole MXFP4 blocks, not NVFP4 ones
    else:
        tensors = {n: w.astype(np.float32 if dtype == "float32" else np.float16)
                   for n, w in load_all(os.path.join(FIXTURES, "llama")).items()}
        config = fixture_config("llama")
        config["torch_dtype"] = dtype
        fmt = "nvfp4"
    src = tmp_path / "src"
    write_dir(src, tensors, config)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURES, "llama", f), src)
    g, ct = tmp_path / "g.gguf", tmp_path / "ct"
    ok("quantize", src, "-o", g, "--export", "gguf", "--format", fmt, "--scale-rule", "ceil")
    ok("quantize", src, "-o", ct, "--export", "compressed-tensors", "--format", fmt, "--scale-rule", "ceil")
    assert_same_layers(str(g), str(ct), "llama", fmt, config)
    _, t = tensors_of(str(g))
    want = {"float32": gguf.GGMLQuantizationType.F32, "float16": gguf.GGMLQuantizationType.F16,
            "fp8-block": gguf.GGMLQuantizationType.BF16}[dtype]
    assert t["token_embd.weight"].tensor_type == want


@pytest.mark.parametrize("arch,warned", [("qwen2", True), ("gemma3", True), ("gpt_oss", True), ("llama", False), ("qwen3", False)])
def test_export_warns_where_llama_cpp_drops_the_ffn_scale(tmp_path, arch, warned):
    r = ok("quantize", os.path.join(FIXTURES, arch), "-o", tmp_path / "m.gguf", "--export", "gguf")
    assert ("does not apply the .scale" in r.stdout) == warned
    r = ok("quantize", os.path.join(FIXTURES, arch), "-o", tmp_path / "x.gguf", "--export", "gguf", "--format", "mxfp4")
    assert "does not apply the .scale" not in r.stdout


def test_modelopt_to_gguf_moves_the_bytes(exports, tmp_path):
    """ModelOpt's weight_scale_2 is GGUF's .scale (both amax/2688): copied as it is, and the
    blocks hold ModelOpt's codes and E4M3 scales."""
    mo = tmp_path / "mo"
    ok("quantize", os.path.join(FIXTURES, "qwen3"), "-o", mo, "--export", "modelopt")
    out = tmp_path / "m.gguf"
    ok("convert", mo, "--to", "gguf", "-o", out)
    _, tensors = tensors_of(str(out))
    src = load_all(str(mo))
    layers = [n[: -len(".weight_scale_2")] for n in src if n.endswith(".weight_scale_2")]
    assert layers
    for m in layers:
        name, _ = gguf_name("qwen3", m + ".weight")
        codes, scales = unpack_ggml(np.asarray(tensors[name].data), "nvfp4")
        assert np.array_equal(codes, src[m + ".weight"].view(np.uint8)), m
        assert np.array_equal(scales, src[m + ".weight_scale"].view(np.uint8)), m
        s = np.asarray(tensors[name.replace(".weight", ".scale")].data, np.float32)
        assert s.view(np.uint32)[0] == np.float32(src[m + ".weight_scale_2"]).view(np.uint32), m


def test_gptoss_reads_back(tmp_path):
    """A gpt-oss GGUF: dequantize gives transformers' stacks (gate and up interleaved back into
    gate_up_proj) with the values of the MLX export of the same weights, and convert --to mlx gives
    that export's bytes; --to compressed-tensors writes llm-compressor's per-expert Linears."""
    fx = os.path.join(FIXTURES, "gpt_oss")
    g, mlx = tmp_path / "g.gguf", tmp_path / "mlx"
    ok("quantize", fx, "-o", g, "--export", "gguf", "--format", "mxfp4", "--scale-rule", "ceil")
    ok("quantize", fx, "-o", mlx, "--export", "mlx", "--format", "mxfp4", "--scale-rule", "ceil")
    ok("dequantize", g, "-o", tmp_path / "dg", "--dtype", "float32")
    ok("dequantize", mlx, "-o", tmp_path / "dm", "--dtype", "float32")
    a, b = load_all(str(tmp_path / "dg")), load_all(str(tmp_path / "dm"))
    assert set(a) == set(b) and "model.layers.0.mlp.experts.gate_up_proj" in a
    for n in b:
        assert np.array_equal(a[n].astype(np.float32), b[n].astype(np.float32)), n
    ok("convert", g, "--to", "mlx", "-o", tmp_path / "m2")
    c, d = load_all(str(mlx)), load_all(str(tmp_path / "m2"))
    assert set(c) == set(d)
    for n in c:
        if c[n].dtype == d[n].dtype:
            assert np.array_equal(c[n].view(np.uint8), d[n].view(np.uint8)), n
        else:  # norms and biases come back as GGUF's F32: the same values
            assert np.array_equal(c[n].astype(np.float32), d[n].astype(np.float32)), n
    ok("convert", g, "--to", "compressed-tensors", "-o", tmp_path / "ct")
    e = load_all(str(tmp_path / "ct"))
    assert "model.layers.0.mlp.experts.3.gate_proj.weight_packed" in e
    assert e["model.layers.0.mlp.experts.3.gate_proj.bias"].shape == (64,)
