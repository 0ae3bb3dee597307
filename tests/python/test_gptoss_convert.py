"""`microscale convert` of a gpt-oss MXFP4 checkpoint (`*_blocks` / `*_scales`, quant_method
"mxfp4") to MLX and compressed-tensors: the experts' E2M1 codes and E8M0 scales are copied, split
the way mlx-lm's gpt-oss model holds them, or one Linear per expert as llm-compressor linearizes
gpt-oss (docs/checkpoints.md, "Quantized sources"); ModelOpt has no form for the stacks and is
refused.

The sources are built here with numpy from the gpt-oss fixture (transformers' own names and
shapes). Oracles: the source bytes rearranged with numpy (gate the even rows of gate_up_proj, up
the odd ones), microscale's own `quantize --format mxfp4 --export mlx` of the dequantized
checkpoint (the layout convert must match; for compressed-tensors, of the dequantized checkpoint
linearized with numpy), spec_oracle's numpy decoder, mlx-lm's `load_model` with `mx.dequantize`
when mlx-lm is installed, and compressed-tensors' own config parser and MXFP4 decompressor when it
is installed.
"""

import json
import os
import shutil

import numpy as np
import pytest

import spec_oracle as so
from ckpt_support import BF16, CLI, ROOT, load_all, ok, run, skip_without_cli, u8

pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
skip_without_cli()

FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
STACKS = ("gate_up_proj", "down_proj")


def make_source(d, seed, canonical):
    """The gpt-oss fixture with its float expert stacks ([E, in, out]) replaced by MXFP4 blocks
    [E, out, in/32, 16] and E8M0 scales [E, out, in/32] under the published names, non-zero expert
    biases. canonical: every block holds a code of magnitude 6, so its scale is the one an MXFP4
    quantizer picks for its values (otherwise a block whose largest code is below 4 re-quantizes
    to a smaller scale and larger codes, and an all-zero block to any scale: the same values,
    other bytes)."""
    t = load_all(os.path.join(FIXTURES, "gpt_oss"))
    cfg = json.load(open(os.path.join(FIXTURES, "gpt_oss", "config.json")))
    rng = np.random.default_rng(seed)
    for name in [n for n in t if n.endswith(STACKS) and t[n].ndim == 3]:
        e, k, n_out = t.pop(name).shape
        blocks = rng.integers(0, 256, (e, n_out, k // 32, 16), dtype=np.uint8)
        if canonical:
            blocks[..., 0] = (blocks[..., 0] & 0xF0) | rng.choice([7, 15], blocks.shape[:-1])
        else:
            blocks[0, 0, 0] = 0x11  # largest code 0.5: re-quantizing would pick another scale
            blocks[0, 1, 0] = 0x88  # a block of negative zeros
        t[name + "_blocks"] = blocks
        t[name + "_scales"] = rng.integers(118, 136, (e, n_out, k // 32), dtype=np.uint8)
    for name in [n for n in t if n.endswith("_bias") and "experts" in n]:
        t[name] = (rng.standard_normal(t[name].shape) * 0.01).astype(BF16)
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    os.makedirs(d)
    save_file(t, str(d / "model.safetensors"))
    json.dump(cfg, open(d / "config.json", "w"))
    return t


def split_rows(t):
    """{mlx-lm module: (blocks [E, N, in/32, 16], scales [E, N, in/32])} from the source: gate the
    even rows of gate_up_proj, up the odd ones, down_proj as it is."""
    out = {}
    for name in [n for n in t if n.endswith("_blocks")]:
        stack = name[:-len("_blocks")]
        parent = stack.rpartition(".")[0] + "."
        b, s = t[name], t[stack + "_scales"]
        if stack.endswith("gate_up_proj"):
            out[parent + "gate_proj"] = (b[:, 0::2], s[:, 0::2])
            out[parent + "up_proj"] = (b[:, 1::2], s[:, 1::2])
        else:
            out[parent + "down_proj"] = (b, s)
    return out


def decode(blocks, scales):
    """[E, N, in/32, 16] codes (the even element in the low nibble) x 2^(scale - 127): [E, N, in]."""
    vals = np.stack([FP4_VALUES[blocks & 0x0F], FP4_VALUES[blocks >> 4]], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return vals.reshape(*blocks.shape[:2], -1).astype(np.float32)


@pytest.fixture(scope="module")
def canonical(tmp_path_factory):
    d = tmp_path_factory.mktemp("gptoss_mxfp4") / "src"
    return d, make_source(d, seed=11, canonical=True)


@pytest.fixture(scope="module")
def arbitrary(tmp_path_factory):
    d = tmp_path_factory.mktemp("gptoss_mxfp4_any") / "src"
    return d, make_source(d, seed=12, canonical=False)


def test_convert_to_mlx_is_quantize_of_the_dequantized_checkpoint(canonical, tmp_path):
    """Every tensor and the config as `quantize --format mxfp4 --export mlx` writes them for the
    dequantized source; with canonical blocks the re-quantized experts have the source's bytes."""
    src_dir, _ = canonical
    r = ok("convert", src_dir, "-o", tmp_path / "mlx", "--to", "mlx")
    assert "codes and E8M0 scales copied" in r.stdout, r.stdout
    ok("dequantize", src_dir, "-o", tmp_path / "dq")
    ok("quantize", tmp_path / "dq", "-o", tmp_path / "oracle", "--format", "mxfp4", "--export", "mlx")
    got, want = load_all(str(tmp_path / "mlx")), load_all(str(tmp_path / "oracle"))
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert u8(got[name]).tobytes() == u8(want[name]).tobytes(), name
    cfg_got = json.load(open(tmp_path / "mlx" / "config.json"))
    cfg_want = json.load(open(tmp_path / "oracle" / "config.json"))
    # dequantize records the dtype it wrote as torch_dtype (the fixture names it only as "dtype").
    assert cfg_want.pop("torch_dtype") == cfg_got["dtype"] == "bfloat16"
    assert cfg_got == cfg_want
    assert cfg_got["quantization"]["mode"] == "mxfp4" and cfg_got["quantization"]["group_size"] == 32


def test_convert_to_mlx_copies_every_code_and_scale(arbitrary, tmp_path):
    """Any blocks, including those re-quantizing would change: the MLX weight and scales hold the
    source's bytes, and decode to the source's values."""
    src_dir, src = arbitrary
    ok("convert", src_dir, "-o", tmp_path / "mlx", "--to", "mlx")
    got = load_all(str(tmp_path / "mlx"))
    layers = split_rows(src)
    assert len(layers) == 6
    for module, (blocks, scales) in layers.items():
        e, n, groups, _ = blocks.shape
        w, s = got[module + ".weight"], got[module + ".scales"]
        assert w.dtype == np.uint32 and w.shape == (e, n, groups * 4), (module, w.shape)
        assert s.dtype == np.uint8 and s.shape == (e, n, groups), (module, s.shape)
        assert u8(w).tobytes() == np.ascontiguousarray(blocks).tobytes(), module
        assert s.tobytes() == np.ascontiguousarray(scales).tobytes(), module
        dec = so.dequantize(u8(w).reshape(e * n, -1), s.reshape(e * n, -1), mode="mxfp4", dtype="float32")
        assert np.array_equal(dec.reshape(e, n, -1), decode(blocks, scales)), module
    for name, b in src.items():
        p = name.rpartition(".")[0] + "."
        if name.endswith("experts.gate_up_proj_bias"):
            assert got[p + "gate_proj.bias"].tobytes() == np.ascontiguousarray(b[:, ::2]).tobytes()
            assert got[p + "up_proj.bias"].tobytes() == np.ascontiguousarray(b[:, 1::2]).tobytes()
        elif name.endswith("experts.down_proj_bias"):
            assert got[p + "down_proj.bias"].tobytes() == b.tobytes()
    assert not any(n.endswith(("_blocks", "_scales", "gate_up_proj_bias", "down_proj_bias")) for n in got)
    # Back to transformers' form: the same floats dequantize gives for the source itself.
    ok("dequantize", tmp_path / "mlx", "-o", tmp_path / "back")
    ok("dequantize", src_dir, "-o", tmp_path / "dq")
    back, dq = load_all(str(tmp_path / "back")), load_all(str(tmp_path / "dq"))
    assert sorted(back) == sorted(dq)
    for name in dq:
        if "experts" in name or not name.endswith("proj.weight"):  # attention is quantized by convert
            assert u8(back[name]).tobytes() == u8(dq[name]).tobytes(), name


def test_mlx_lm_loads_the_converted_experts(arbitrary, tmp_path):
    """mlx-lm's load_model builds gpt-oss from the converted checkpoint, and mx.dequantize of each
    expert projection equals microscale's dequantize of the MXFP4 source."""
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (scripts/test-ecosystem.sh installs it)")
    import mlx.core as mx
    from mlx_lm.utils import load_model
    from pathlib import Path

    src_dir, _ = arbitrary
    ok("convert", src_dir, "-o", tmp_path / "mlx", "--to", "mlx")
    ok("dequantize", src_dir, "-o", tmp_path / "dq")
    model, _ = load_model(Path(tmp_path / "mlx"))
    dq = load_all(str(tmp_path / "dq"))
    checked = 0
    for i, layer in enumerate(model.model.layers):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            m = getattr(layer.mlp.experts, proj)
            w = mx.dequantize(m.weight, m.scales, group_size=m.group_size, bits=m.bits, mode=m.mode)
            got = np.array(w.astype(mx.float32)).astype(BF16)
            stack = dq[f"model.layers.{i}.mlp.experts.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"]
            col = {"gate_proj": slice(0, None, 2), "up_proj": slice(1, None, 2), "down_proj": slice(None)}[proj]
            want = np.ascontiguousarray(stack[..., col].transpose(0, 2, 1))
            assert u8(got).tobytes() == u8(want).tobytes(), (i, proj)
            checked += 1
    assert checked == 3 * len(model.model.layers) == 6
    logits = model(mx.array([[1, 5, 9, 3]]))
    assert np.isfinite(np.array(logits.astype(mx.float32))).all()


def per_expert(t):
    """{llm-compressor module "<p>.experts.<e>.<proj>": (blocks [N, in/32, 16], scales [N, in/32])},
    the source's bytes rearranged with numpy: gate the even rows of expert e's gate_up_proj, up the
    odd ones, down_proj as it is."""
    out = {}
    for module, (blocks, scales) in split_rows(t).items():
        parent, _, proj = module.rpartition(".")
        for e in range(blocks.shape[0]):
            out[f"{parent}.{e}.{proj}"] = (blocks[e], scales[e])
    return out


def linearized(t):
    """A float gpt-oss checkpoint (dequantize's output) in llm-compressor's linearized form: each
    expert's gate_proj, up_proj and down_proj as a Linear weight [out, in] with its bias."""
    out = {}
    for name, v in t.items():
        parent = name.rpartition(".")[0]
        if name.endswith("experts.gate_up_proj"):
            for e in range(v.shape[0]):
                out[f"{parent}.{e}.gate_proj.weight"] = np.ascontiguousarray(v[e, :, 0::2].T)
                out[f"{parent}.{e}.up_proj.weight"] = np.ascontiguousarray(v[e, :, 1::2].T)
        elif name.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                out[f"{parent}.{e}.down_proj.weight"] = np.ascontiguousarray(v[e].T)
        elif name.endswith("experts.gate_up_proj_bias"):
            for e in range(v.shape[0]):
                out[f"{parent}.{e}.gate_proj.bias"] = np.ascontiguousarray(v[e, 0::2])
                out[f"{parent}.{e}.up_proj.bias"] = np.ascontiguousarray(v[e, 1::2])
        elif name.endswith("experts.down_proj_bias"):
            for e in range(v.shape[0]):
                out[f"{parent}.{e}.down_proj.bias"] = np.ascontiguousarray(v[e])
        else:
            out[name] = v
    return out


def test_convert_to_ct_is_quantize_of_the_linearized_checkpoint(canonical, tmp_path):
    """Every tensor and the config as `quantize --format mxfp4 --export compressed-tensors` writes
    them for the dequantized source with its experts linearized the way llm-compressor does it (one
    Linear per expert and projection, as for a Mixtral or Qwen-MoE model); with canonical blocks the
    re-quantized experts have the source's bytes."""
    src_dir, _ = canonical
    r = ok("convert", src_dir, "-o", tmp_path / "ct", "--to", "compressed-tensors")
    assert "codes and E8M0 scales copied" in r.stdout and "llm-compressor" in r.stdout, r.stdout
    ok("dequantize", src_dir, "-o", tmp_path / "dq")
    lin = tmp_path / "lin"
    os.makedirs(lin)
    save_file(linearized(load_all(str(tmp_path / "dq"))), str(lin / "model.safetensors"))
    cfg_dq = json.load(open(tmp_path / "dq" / "config.json"))
    json.dump(cfg_dq, open(lin / "config.json", "w"))
    ok("quantize", lin, "-o", tmp_path / "oracle", "--format", "mxfp4", "--export", "compressed-tensors")
    got, want = load_all(str(tmp_path / "ct")), load_all(str(tmp_path / "oracle"))
    assert sorted(got) == sorted(want)
    assert "model.layers.1.mlp.experts.3.down_proj.weight_packed" in got
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert u8(got[name]).tobytes() == u8(want[name]).tobytes(), name
    cfg_got = json.load(open(tmp_path / "ct" / "config.json"))
    cfg_want = json.load(open(tmp_path / "oracle" / "config.json"))
    assert cfg_want.pop("torch_dtype") == cfg_got["dtype"] == "bfloat16"
    assert cfg_got == cfg_want
    q = cfg_got["quantization_config"]
    assert q["format"] == "mxfp4-pack-quantized" and "model.layers.0.mlp.router" in q["ignore"]
    assert not any("experts" in m for m in q["ignore"])


def test_convert_to_ct_copies_every_code_and_scale(arbitrary, tmp_path):
    """Any blocks: each expert's weight_packed and weight_scale hold the source's bytes (numpy's
    rearrangement), decode (spec_oracle) to the source's values, and dequantize of the output
    equals dequantize of the source bit for bit; the biases are split per expert."""
    src_dir, src = arbitrary
    ok("convert", src_dir, "-o", tmp_path / "ct", "--to", "compressed-tensors")
    got = load_all(str(tmp_path / "ct"))
    layers = per_expert(src)
    assert len(layers) == 2 * 3 * 4  # layers x projections x experts
    for module, (blocks, scales) in layers.items():
        n, groups, _ = blocks.shape
        w, s = got[module + ".weight_packed"], got[module + ".weight_scale"]
        assert w.dtype == np.uint8 and w.shape == (n, groups * 16), (module, w.shape)
        assert s.dtype == np.uint8 and s.shape == (n, groups), (module, s.shape)
        assert w.tobytes() == np.ascontiguousarray(blocks).tobytes(), module
        assert s.tobytes() == np.ascontiguousarray(scales).tobytes(), module
        dec = so.dequantize(w, s, mode="mxfp4", dtype="float32")
        assert np.array_equal(dec, decode(blocks[None], scales[None])[0]), module
    for name, b in src.items():
        p = name.rpartition(".")[0]
        for e in range(b.shape[0]) if name.endswith("_bias") and "experts" in name else ():
            if name.endswith("gate_up_proj_bias"):
                assert got[f"{p}.{e}.gate_proj.bias"].tobytes() == np.ascontiguousarray(b[e, ::2]).tobytes()
                assert got[f"{p}.{e}.up_proj.bias"].tobytes() == np.ascontiguousarray(b[e, 1::2]).tobytes()
            else:
                assert got[f"{p}.{e}.down_proj.bias"].tobytes() == b[e].tobytes()
    assert not any(n.endswith(("_blocks", "_scales", "gate_up_proj_bias", "down_proj_bias")) for n in got)
    # dequantize of the output: the per-expert floats of dequantize of the source, bit for bit.
    ok("dequantize", tmp_path / "ct", "-o", tmp_path / "back")
    ok("dequantize", src_dir, "-o", tmp_path / "dq")
    back, dq = load_all(str(tmp_path / "back")), linearized(load_all(str(tmp_path / "dq")))
    assert sorted(back) == sorted(dq)
    for name in dq:
        if "experts" in name or not name.endswith("proj.weight"):  # attention is quantized by convert
            assert u8(back[name]).tobytes() == u8(dq[name]).tobytes(), name


def test_compressed_tensors_reads_the_converted_experts(arbitrary, tmp_path):
    """compressed-tensors' QuantizationConfig and ModelCompressor take the config, and its own MXFP4 decompressor
    (its nibble order and E8M0 decoding) gives, for every expert, the values microscale's
    dequantize gives for the source, and those transformers' own gpt-oss MXFP4 decoder gives
    (convert_moe_packed_tensors; gate the even columns, as its GptOssExperts reads them)."""
    pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed")
    pytest.importorskip("transformers.integrations.mxfp4", reason="transformers is not installed")
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    from transformers.utils.quantization_config import CompressedTensorsConfig
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig

    src_dir, src = arbitrary
    ok("convert", src_dir, "-o", tmp_path / "ct", "--to", "compressed-tensors")
    ok("dequantize", src_dir, "-o", tmp_path / "dq")
    cfg = json.load(open(tmp_path / "ct" / "config.json"))
    parsed = QuantizationConfig.model_validate(cfg["quantization_config"])
    assert parsed.format == "mxfp4-pack-quantized"
    assert ModelCompressor.from_compression_config(CompressedTensorsConfig.from_dict(cfg["quantization_config"]))
    scheme = parsed.config_groups["group_0"]
    got, dq = load_all(str(tmp_path / "ct")), linearized(load_all(str(tmp_path / "dq")))
    tf = {}  # transformers' decode of each source stack, [E, in, out]
    for name in [n for n in src if n.endswith("_blocks")]:
        stack = name[:-len("_blocks")]
        tf[stack] = convert_moe_packed_tensors(torch.from_numpy(src[name]), torch.from_numpy(src[stack + "_scales"]),
                                               dtype=torch.bfloat16)
    modules = per_expert(src)
    for module in modules:
        sd = {"weight_packed": torch.from_numpy(got[module + ".weight_packed"].copy()),
              "weight_scale": torch.from_numpy(got[module + ".weight_scale"].copy())}
        w = MXFP4PackedCompressor.decompress(sd, scheme)["weight"]
        assert w.dtype == torch.bfloat16
        want = torch.from_numpy(u8(dq[module + ".weight"]).copy()).view(torch.bfloat16)
        assert torch.equal(w.view(torch.int16), want.view(torch.int16)), module
        parent, e, proj = module.rsplit(".", 2)
        stack = tf[parent + (".down_proj" if proj == "down_proj" else ".gate_up_proj")][int(e)]
        col = {"gate_proj": slice(0, None, 2), "up_proj": slice(1, None, 2), "down_proj": slice(None)}[proj]
        assert torch.equal(w.view(torch.int16), stack[:, col].T.contiguous().view(torch.int16)), module
    assert len(modules) == 24


def test_modelopt_has_no_form_for_the_stacks(canonical, tmp_path):
    src_dir, _ = canonical
    r = run("convert", src_dir, "-o", tmp_path / "out", "--to", "modelopt")
    assert r.returncode == 1, r.stderr
    assert '"model.layers.0.mlp.experts.down_proj_blocks"' in r.stderr or "gate_up_proj_blocks" in r.stderr
    assert "which ModelOpt has no form" in r.stderr and "--to mlx" in r.stderr, r.stderr
    assert "--to compressed-tensors" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_nan_scale_is_refused_naming_the_tensor(tmp_path):
    d = tmp_path / "src"
    t = make_source(d, seed=13, canonical=True)
    name = "model.layers.1.mlp.experts.gate_up_proj_scales"
    t[name][2, 5, 1] = 0xFF
    save_file(t, str(d / "model.safetensors"))
    r = run("convert", d, "-o", tmp_path / "out", "--to", "mlx")
    assert r.returncode == 1
    assert f'"{name}"' in r.stderr and "0xFF at [2, 5, 1]" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_mxfp4_tensor_outside_the_expert_stacks_is_refused(tmp_path):
    """MLX's gpt-oss model has a form only for the two expert stacks; another `_blocks` tensor
    is refused by name rather than copied as raw bytes."""
    d = tmp_path / "src"
    t = make_source(d, seed=14, canonical=True)
    stack = "model.layers.0.mlp.experts.down_proj"
    t["model.layers.0.mlp.shared.down_proj_blocks"] = t.pop(stack + "_blocks")
    t["model.layers.0.mlp.shared.down_proj_scales"] = t.pop(stack + "_scales")
    save_file(t, str(d / "model.safetensors"))
    r = run("convert", d, "-o", tmp_path / "out", "--to", "mlx")
    assert r.returncode == 1
    assert '"model.layers.0.mlp.shared.down_proj_blocks"' in r.stderr and "expert stacks" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("to", ["mlx", "compressed-tensors"])
def test_stacks_without_experts_are_refused(tmp_path, to):
    """A stack of zero experts has no codes to copy: an error naming the tensor, not an empty or
    partial output."""
    d = tmp_path / "src"
    t = make_source(d, seed=15, canonical=True)
    for name in [n for n in t if ".experts." in n]:
        t[name] = t[name][:0]
    save_file(t, str(d / "model.safetensors"))
    r = run("convert", d, "-o", tmp_path / "out", "--to", to)
    assert r.returncode == 1, r.stderr
    assert "_blocks\" holds no experts ([0, " in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def misfit_cases(t, prefix):
    """(description, edit of the tensors {name: array}, tensor the error must name, expected shape
    text) for gpt-oss expert tensors under `prefix` that do not fit together; `t` holds either the
    float stacks [E, in, out] or their MXFP4 `_blocks` [E, out, in/32, 16] and `_scales`."""
    mxfp4 = prefix + "gate_up_proj_blocks" in t
    gu, dn = prefix + "gate_up_proj", prefix + "down_proj"
    if mxfp4:
        e, two_i, groups = t[gu + "_blocks"].shape[:3]
        h = groups * 32
    else:
        e, h, two_i = t[gu].shape

    def odd_gate_up(t):  # one more output column: 2I + 1
        if mxfp4:
            for suffix in ("_blocks", "_scales"):
                t[gu + suffix] = np.concatenate([t[gu + suffix], t[gu + suffix][:, :1]], axis=1)
        else:
            t[gu] = np.concatenate([t[gu], t[gu][..., :1]], axis=2)

    def bias_of_fewer_experts(t):
        t[gu + "_bias"] = t[gu + "_bias"][:-1]

    def bias_of_other_columns(t):
        t[dn + "_bias"] = np.concatenate([t[dn + "_bias"], t[dn + "_bias"]], axis=1)

    stack = gu + ("_blocks" if mxfp4 else "")
    return [("odd gate_up_proj", odd_gate_up, stack, "[experts, hidden, 2 x intermediate]"),
            ("gate_up_proj_bias of fewer experts", bias_of_fewer_experts, gu + "_bias", f"[{e}, {two_i}]"),
            ("down_proj_bias of other columns", bias_of_other_columns, dn + "_bias", f"[{e}, {h}]")]


@pytest.mark.parametrize("to", ["mlx", "compressed-tensors"])
@pytest.mark.parametrize("case", range(3))
def test_convert_refuses_expert_tensors_that_do_not_fit(tmp_path, to, case):
    """A gate_up_proj of 2I + 1 rows used to lose its last row, a bias of other experts or columns
    to be split all the same: refused, naming the tensor and the shape it must have."""
    d = tmp_path / "src"
    t = make_source(d, seed=16, canonical=True)
    what, edit, culprit, want = misfit_cases(t, "model.layers.1.mlp.experts.")[case]
    edit(t)
    save_file(t, str(d / "model.safetensors"))
    r = run("convert", d, "-o", tmp_path / "out", "--to", to)
    assert r.returncode == 1, what
    assert f'"{culprit}"' in r.stderr and f"expected {want}" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", range(3))
def test_quantize_for_mlx_refuses_expert_stacks_that_do_not_fit(tmp_path, case):
    """The same from the float stacks, which quantize --export mlx splits."""
    d = tmp_path / "src"
    shutil.copytree(os.path.join(FIXTURES, "gpt_oss"), d)
    t = load_all(d)
    what, edit, culprit, want = misfit_cases(t, "model.layers.0.mlp.experts.")[case]
    edit(t)
    save_file(t, str(d / "model.safetensors"))
    r = run("quantize", d, "-o", tmp_path / "out", "--format", "mxfp4", "--export", "mlx")
    assert r.returncode == 1, what
    assert f'"{culprit}"' in r.stderr and f"expected {want}" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
