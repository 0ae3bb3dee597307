"""Mixture-of-experts weights through the `microscale` command: experts quantized per expert along
their input dimension and written as each ecosystem's MoE loader reads them (docs/checkpoints.md,
"Mixture-of-experts weights").

The oracles are independent of microscale: transformers' gpt-oss layout as its GptOssExperts
reads it (`x @ gate_up_proj[e]`: [experts, in, out], gate the even output columns, up the odd
ones), spec_oracle's numpy quantizer and decoder, and mlx-lm's own `load_model` and
`mx.dequantize` when mlx-lm is installed.
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


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    """The gpt-oss fixture with non-square experts (hidden 64, intermediate 32, so a transposed
    stack cannot pass for the right one) and non-zero expert biases (the fixture's are zero)."""
    d = tmp_path_factory.mktemp("gptoss")
    t = load_all(os.path.join(FIXTURES, "gpt_oss"))
    cfg = json.load(open(os.path.join(FIXTURES, "gpt_oss", "config.json")))
    cfg["intermediate_size"] = inter = 32
    rng = np.random.default_rng(7)
    for name in list(t):
        e, hidden = 4, 64
        if name.endswith("experts.gate_up_proj"):
            t[name] = (rng.standard_normal((e, hidden, 2 * inter)) * 0.05).astype(BF16)
        elif name.endswith("experts.down_proj"):
            t[name] = (rng.standard_normal((e, inter, hidden)) * 0.05).astype(BF16)
        elif name.endswith("experts.gate_up_proj_bias"):
            t[name] = (rng.standard_normal((e, 2 * inter)) * 0.01).astype(BF16)
        elif name.endswith("experts.down_proj_bias"):
            t[name] = (rng.standard_normal((e, hidden)) * 0.01).astype(BF16)
    save_file(t, str(d / "model.safetensors"))
    json.dump(cfg, open(d / "config.json", "w"))
    return d, t


def gptoss_layers(t):
    """{mlx-lm module: [E, out, in] float weight} of each gpt-oss expert stack, from transformers'
    orientation: gate_up_proj[e] is [in, 2 * intermediate], gate its even columns, up the odd."""
    out = {}
    for name, w in t.items():
        p = name.rpartition(".")[0] + "."
        if name.endswith("experts.gate_up_proj"):
            out[p + "gate_proj"] = w[..., ::2].transpose(0, 2, 1)
            out[p + "up_proj"] = w[..., 1::2].transpose(0, 2, 1)
        elif name.endswith("experts.down_proj"):
            out[p + "down_proj"] = w.transpose(0, 2, 1)
    return out


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "mxfp8"])
def test_gptoss_mlx_quantizes_each_expert_along_its_input(gptoss, tmp_path, fmt):
    src_dir, src = gptoss
    out = tmp_path / "q"
    ok("quantize", src_dir, "-o", out, "--format", fmt, "--export", "mlx")
    got = load_all(str(out))
    layers = gptoss_layers(src)
    assert len(layers) == 6
    for module, w in layers.items():
        e, n, k = w.shape
        # Each expert's [out, in] matrix quantized on its own along `in` (MLX nvfp4 is two-level).
        packed, scales = so.quantize(np.ascontiguousarray(w).reshape(e * n, k), mode=fmt)
        assert got[module + ".weight"].dtype == np.uint32
        assert got[module + ".weight"].shape == (e, n, packed.shape[1] // 4)
        assert got[module + ".scales"].shape == (e, n, scales.shape[1])
        assert u8(got[module + ".weight"]).tobytes() == u8(packed).tobytes(), module
        assert u8(got[module + ".scales"]).tobytes() == u8(scales).tobytes(), module
    # The stacks are gone; the biases are split the way mlx-lm's sanitize splits them.
    assert not any(n.endswith(("gate_up_proj", "gate_up_proj_bias", "down_proj_bias")) for n in got)
    for name, b in src.items():
        p = name.rpartition(".")[0] + "."
        if name.endswith("gate_up_proj_bias"):
            assert got[p + "gate_proj.bias"].tobytes() == np.ascontiguousarray(b[:, ::2]).tobytes()
            assert got[p + "up_proj.bias"].tobytes() == np.ascontiguousarray(b[:, 1::2]).tobytes()
        elif name.endswith("down_proj_bias"):
            assert got[p + "down_proj.bias"].tobytes() == b.tobytes()
    cfg = json.load(open(out / "config.json"))
    assert cfg["quantization"]["mode"] == fmt


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_gptoss_mlx_dequantizes_back_to_the_transformers_stacks(gptoss, tmp_path, fmt):
    src_dir, src = gptoss
    out, back = tmp_path / "q", tmp_path / "back"
    ok("quantize", src_dir, "-o", out, "--format", fmt, "--export", "mlx")
    ok("dequantize", out, "-o", back)
    q, got = load_all(str(out)), load_all(str(back))
    assert set(got) == set(src)
    for name, w in src.items():
        assert got[name].shape == w.shape and got[name].dtype == BF16, name
        p = name.rpartition(".")[0] + "."
        if name.endswith(("gate_up_proj", "down_proj")) and w.ndim == 3:
            # An independent decode of each expert's codes, put back in transformers' [E, in, out].
            parts = ["gate_proj", "up_proj"] if name.endswith("gate_up_proj") else ["down_proj"]
            want = np.zeros(w.shape, BF16)
            for i, part in enumerate(parts):
                dec = so.dequantize(u8(q[p + part + ".weight"]), q[p + part + ".scales"], mode=fmt, dtype="bfloat16")
                want[..., i::len(parts)] = dec.transpose(0, 2, 1)
            assert u8(got[name]).tobytes() == u8(want).tobytes(), name
        elif not name.endswith(".weight") or "proj" not in name:
            assert got[name].tobytes() == w.tobytes(), name  # biases merged back, sinks, norms


@pytest.mark.parametrize("export", ["compressed-tensors", "modelopt"])
def test_gptoss_stacks_stay_float_where_the_layout_has_no_form(gptoss, tmp_path, export):
    src_dir, src = gptoss
    out = tmp_path / "q"
    r = ok("quantize", src_dir, "-o", out, "--format", "nvfp4", "--export", export)
    assert "stacked experts" in r.stdout and "--export mlx quantizes them" in r.stdout
    assert "model.layers.0.mlp.experts.gate_up_proj" in r.stdout
    got = load_all(str(out))
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        assert got[name].tobytes() == src[name].tobytes()
    # Asking for them is refused with the reason, and nothing is written.
    bad = tmp_path / "bad"
    r = run("quantize", src_dir, "-o", bad, "--format", "nvfp4", "--export", export, "--include", "experts")
    assert r.returncode == 1 and "model.layers.0.mlp.experts" in r.stderr and "--export mlx" in r.stderr
    assert not bad.exists()


def test_split_gptoss_experts_do_not_convert_to_compressed_tensors(gptoss, tmp_path):
    src_dir, _ = gptoss
    out = tmp_path / "q"
    ok("quantize", src_dir, "-o", out, "--format", "mxfp4", "--export", "mlx")
    for to in ("compressed-tensors", "modelopt"):
        r = run("convert", out, "-o", tmp_path / to, "--to", to)
        assert r.returncode == 1 and "stacked experts" in r.stderr and "mlp.experts." in r.stderr
        assert not (tmp_path / to).exists()


def test_mlx_refuses_a_partly_quantized_expert_stack(tmp_path):
    out = tmp_path / "q"
    r = run("quantize", os.path.join(FIXTURES, "qwen3_moe"), "-o", out, "--format", "mxfp4", "--export", "mlx",
            "--exclude", "model.layers.0.mlp.experts.2.up_proj")
    assert r.returncode == 1
    assert '"model.layers.0.mlp.experts.2.up_proj.weight"' in r.stderr and "stacked" in r.stderr
    assert "--exclude 'model.layers.0.mlp.experts.*'" in r.stderr
    assert not out.exists()
    # Leaving every expert in high precision is fine: mlx-lm's sanitize stacks float weights itself.
    ok("quantize", os.path.join(FIXTURES, "qwen3_moe"), "-o", out, "--format", "mxfp4", "--export", "mlx",
       "--exclude", "*.experts.*")
    assert "model.layers.0.mlp.experts.2.up_proj.weight" in load_all(str(out))


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "gpt_oss"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_mlx_lm_loads_the_experts_and_dequantizes_them_equally(tmp_path, arch, fmt):
    """mlx-lm's load_model builds its SwitchGLU from the export, and mx.dequantize of every expert
    equals microscale's dequantized weight of that expert bit for bit."""
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (scripts/test-ecosystem.sh installs it)")
    import ml_dtypes
    import mlx.core as mx
    from mlx_lm.utils import load_model
    from pathlib import Path

    out, back = tmp_path / "q", tmp_path / "back"
    ok("quantize", os.path.join(FIXTURES, arch), "-o", out, "--format", fmt, "--export", "mlx")
    ok("dequantize", out, "-o", back)
    model, _ = load_model(Path(out))
    ours = load_all(str(back))
    cfg = json.load(open(os.path.join(FIXTURES, arch, "config.json")))
    checked = 0
    for i, layer in enumerate(model.model.layers):
        moe = layer.block_sparse_moe if arch == "mixtral" else layer.mlp
        switch = moe.experts if arch == "gpt_oss" else moe.switch_mlp
        for proj in ("gate_proj", "up_proj", "down_proj"):
            m = getattr(switch, proj)
            w = mx.dequantize(m.weight, m.scales, group_size=m.group_size, bits=m.bits, mode=m.mode)
            got = np.array(w.astype(mx.float32)).astype(ml_dtypes.bfloat16)
            assert got.shape[0] == cfg.get("num_local_experts", cfg.get("num_experts"))
            prefix = f"model.layers.{i}." + ("block_sparse_moe" if arch == "mixtral" else "mlp")
            if arch == "gpt_oss":
                stack = ours[f"{prefix}.experts.{'down_proj' if proj == 'down_proj' else 'gate_up_proj'}"]
                col = {"gate_proj": slice(0, None, 2), "up_proj": slice(1, None, 2), "down_proj": slice(None)}[proj]
                want = stack[..., col].transpose(0, 2, 1)
            else:
                name = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[proj] if arch == "mixtral" else proj
                want = np.stack([ours[f"{prefix}.experts.{e}.{name}.weight"] for e in range(got.shape[0])])
            assert u8(got).tobytes() == u8(np.ascontiguousarray(want)).tobytes(), (i, proj)
            checked += 1
    assert checked == 3 * len(model.model.layers)
    logits = model(mx.array([[1, 5, 9, 3]]))
    assert np.isfinite(np.array(logits.astype(mx.float32))).all()


def test_python_api_holds_stacked_experts(tmp_path):
    """load_checkpoint gives a stacked MLX layer as [E, N, K]; save_checkpoint writes it back byte
    for byte, and refuses it for compressed-tensors without writing anything."""
    microscale = pytest.importorskip("microscale", reason="the microscale Python package is not built")
    out, back = tmp_path / "q", tmp_path / "back"
    ok("quantize", os.path.join(FIXTURES, "qwen3_moe"), "-o", out, "--format", "mxfp4", "--export", "mlx")
    ok("dequantize", out, "-o", back)
    ck = microscale.load_checkpoint(out)
    w = ck.layers["model.layers.1.mlp.switch_mlp.up_proj"]
    assert tuple(w.shape) == (4, 64, 64)
    got = np.asarray(w.dequantize(dtype="bfloat16"))
    want = load_all(str(back))
    for e in range(4):
        assert u8(got[e]).tobytes() == u8(want[f"model.layers.1.mlp.experts.{e}.up_proj.weight"]).tobytes()
    microscale.save_checkpoint(tmp_path / "saved", ck.layers, ck.tensors, ck.config, export="mlx")
    a, b = load_all(str(out)), load_all(str(tmp_path / "saved"))
    assert set(a) == set(b) and all(a[k].tobytes() == b[k].tobytes() for k in a)
    with pytest.raises(ValueError, match="stacked experts"):
        microscale.save_checkpoint(tmp_path / "ct", ck.layers, ck.tensors, ck.config, export="compressed-tensors")
    assert not (tmp_path / "ct").exists()
