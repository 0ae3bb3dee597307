"""microscale.load_checkpoint / save_checkpoint: quantized layers in and out of the
compressed-tensors, ModelOpt and MLX layouts, read back by the reference `safetensors` package
and (MLX) by `mlx` itself."""

import json
import os
import re

import numpy as np
import pytest

import microscale
from ckpt_support import BF16, header, load_all, make_tensors, write_model

safetensors = pytest.importorskip("safetensors")


def _layers(tensors, mode, **kw):
    out = {}
    for name, w in tensors.items():
        if name.endswith(".weight") and w.ndim == 2 and "embed" not in name and "lm_head" not in name:
            out[name[: -len(".weight")]] = microscale.QuantizedWeight.from_float(w, mode=mode, **kw)
    return out


def _plain(tensors, layers):
    return {n: t for n, t in tensors.items() if n[: -len(".weight")] not in layers}


CASES = [
    ("compressed-tensors", "nvfp4", dict(global_scale=True)),
    ("compressed-tensors", "mxfp4", {}),
    ("modelopt", "nvfp4", dict(global_scale=True)),
    ("mlx", "nvfp4", {}),
    ("mlx", "mxfp4", {}),
    ("mlx", "mxfp8", {}),
    ("mlx", "affine", dict(bits=4, group_size=64)),
    ("mlx", "affine", dict(bits=8, group_size=32)),
]


@pytest.mark.parametrize("export,mode,kw", CASES, ids=[f"{e}-{m}-{k.get('bits', '')}" for e, m, k in CASES])
def test_save_load_round_trip(tmp_path, export, mode, kw):
    t = make_tensors(layers=1)
    layers = _layers(t, mode, **kw)
    plain = _plain(t, layers)
    cfg = {"model_type": "llama"}
    microscale.save_checkpoint(tmp_path, layers, plain, config=cfg, export=export)

    # The reference package reads every tensor, with the layout's names, dtypes and shapes.
    hdr = header(tmp_path / "model.safetensors")
    got = load_all(str(tmp_path))
    m = "model.layers.0.mlp.down_proj"
    n, k = t[m + ".weight"].shape
    if export == "compressed-tensors":
        assert hdr[m + ".weight_packed"]["dtype"] == "U8" and hdr[m + ".weight_packed"]["shape"] == [n, k // 2]
        g = 16 if mode == "nvfp4" else 32
        assert hdr[m + ".weight_scale"]["dtype"] == ("F8_E4M3" if mode == "nvfp4" else "U8")
        assert hdr[m + ".weight_scale"]["shape"] == [n, k // g]
        if mode == "nvfp4":
            assert hdr[m + ".weight_global_scale"] == {**hdr[m + ".weight_global_scale"], "dtype": "F32", "shape": [1]}
            amax = layers[m].global_scale
            assert got[m + ".weight_global_scale"][0] == np.float32(2688) / np.float32(amax)
        qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
        assert qc["quant_method"] == "compressed-tensors"
        assert qc["format"] == f"{mode}-pack-quantized"
    elif export == "modelopt":
        assert hdr[m + ".weight"]["dtype"] == "U8" and hdr[m + ".weight_scale"]["dtype"] == "F8_E4M3"
        assert hdr[m + ".weight_scale_2"]["shape"] == []
        assert got[m + ".weight_scale_2"] == np.float32(layers[m].global_scale) / np.float32(2688)
        hf = json.loads((tmp_path / "hf_quant_config.json").read_text())
        assert hf["quantization"]["quant_algo"] == "W4A16_NVFP4"
    else:
        q = layers[m]
        assert hdr[m + ".weight"]["dtype"] == "U32" and hdr[m + ".weight"]["shape"] == [n, k * q.bits // 32]
        assert hdr[m + ".scales"]["shape"] == [n, k // q.group_size]
        assert (m + ".biases" in hdr) == (mode == "affine")
        cfg2 = json.loads((tmp_path / "config.json").read_text())
        assert cfg2["quantization"] == {"group_size": q.group_size, "bits": q.bits, "mode": mode}
        assert cfg2["quantization_config"] == cfg2["quantization"]
    for name, arr in plain.items():
        assert got[name].dtype == arr.dtype and np.array_equal(got[name].view(np.uint8), arr.view(np.uint8))

    # And microscale reads back the same layers.
    ck = microscale.load_checkpoint(tmp_path)
    assert ck.format == export
    assert set(ck.layers) == set(layers)
    assert ck.config["model_type"] == "llama"
    for name, q in layers.items():
        r = ck.layers[name]
        assert (r.mode, r.group_size, r.bits, r.shape) == (q.mode, q.group_size, q.bits, q.shape)
        assert np.array_equal(r.packed, q.packed)
        assert np.array_equal(r.scales.view(np.uint8), q.scales.view(np.uint8))
        # A global scale crosses a convention within one float32 ulp.
        if q.global_scale is not None:
            assert abs(r.global_scale - q.global_scale) <= np.spacing(np.float32(q.global_scale))
        np.testing.assert_allclose(r.dequantize(), q.dequantize(), rtol=2e-7, atol=0)


@pytest.mark.parametrize("mode,kw", [("nvfp4", {}), ("mxfp4", {}), ("mxfp8", {}), ("affine", dict(bits=4)),
                                     ("affine", dict(bits=8))])
def test_mlx_export_read_by_mlx(tmp_path, mode, kw):
    mx = pytest.importorskip("mlx.core")
    t = make_tensors(layers=1, dtype=np.float32)
    layers = _layers(t, mode, **kw)
    microscale.save_checkpoint(tmp_path, layers, _plain(t, layers), export="mlx")
    w = mx.load(str(tmp_path / "model.safetensors"))
    for name, q in layers.items():
        wq, s = w[name + ".weight"], w[name + ".scales"]
        assert wq.dtype == mx.uint32
        b = w.get(name + ".biases")
        got = mx.dequantize(wq, s, b, group_size=q.group_size, bits=q.bits, mode=mode, dtype=mx.float32)
        want = q.dequantize("float32")
        # MLX decodes the same codes to the same values (affine: f32 output is bit-exact with MLX).
        np.testing.assert_array_equal(np.array(got), want, err_msg=name)


def test_w4a4_and_errors(tmp_path):
    t = make_tensors(layers=1)
    layers = _layers(t, "nvfp4", global_scale=True)
    for q in layers.values():
        q.input_amax = 7.0
    microscale.save_checkpoint(tmp_path / "a", layers, export="compressed-tensors")
    got = load_all(str(tmp_path / "a"))
    m = next(iter(layers))
    assert got[m + ".input_global_scale"][0] == np.float32(384.0)  # 2688 / 7
    assert microscale.load_checkpoint(tmp_path / "a").layers[m].input_amax == 7.0
    # Refuses a non-empty directory unless forced.
    with pytest.raises(ValueError, match="not empty"):
        microscale.save_checkpoint(tmp_path / "a", layers, export="modelopt")
    microscale.save_checkpoint(tmp_path / "a", layers, export="modelopt", force=True)
    assert os.path.exists(tmp_path / "a" / "hf_quant_config.json")
    # Modes a layout cannot hold, and inconsistent layers, are clear errors.
    aff = _layers(t, "affine", bits=4)
    with pytest.raises(ValueError, match="compressed-tensors has no layout for affine"):
        microscale.save_checkpoint(tmp_path / "b", aff, export="compressed-tensors")
    bad = next(iter(_layers(t, "nvfp4").values()))
    bad.scales = bad.scales[:, :1]
    with pytest.raises(ValueError, match="scales must be"):
        microscale.save_checkpoint(tmp_path / "c", {"x": bad}, export="mlx")
    with pytest.raises(ValueError, match="unknown export"):
        microscale.save_checkpoint(tmp_path / "d", layers, export="gguf")


@pytest.mark.parametrize("export, amaxes, match", [
    ("compressed-tensors", [-5.0, 7.0], r"input_amax is not a finite non-negative float32 number: -5"),
    ("modelopt", [float("nan"), 7.0], r"input_amax is not a finite non-negative float32 number: nan"),
    ("compressed-tensors", [1e39, 7.0], r"input_amax is not a finite non-negative float32 number"),
    ("modelopt", [1e-50, 7.0], r"input_amax is 1e-50, below 2688 x FLT_MIN \(3.1597\d*e-35\)"),
    ("compressed-tensors", [7.0, 1e-40], r"input_amax is 1e-40, below 2688 x FLT_MIN"),
    ("compressed-tensors", [7.0, None], r"W4A4 needs a static activation amax for every quantized layer"),
    ("mlx", [7.0, 7.0], r"exist for nvfp4 with export compressed-tensors or modelopt only, not 'mlx'"),
], ids=["negative", "nan", "overflow", "underflow", "denormal", "partial", "mlx"])
def test_save_refuses_input_amax_it_cannot_write(tmp_path, export, amaxes, match):
    """The CLI's --activation-amax rules: nothing is written, and no input_amax is dropped."""
    layers = _layers(make_tensors(layers=1), "nvfp4", global_scale=True)
    for q, a in zip(layers.values(), amaxes * len(layers)):
        q.input_amax = a
    with pytest.raises(ValueError, match=match):
        microscale.save_checkpoint(tmp_path / "out", layers, export=export)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("export, mode, part", [
    ("mlx", "nvfp4", "weight_global_scale"), ("mlx", "affine", "biases"), ("mlx", "mxfp4", "input_scale"),
    ("compressed-tensors", "nvfp4", "weight_global_scale"), ("compressed-tensors", "nvfp4", "input_global_scale"),
    ("compressed-tensors", "mxfp4", "scales"), ("modelopt", "nvfp4", "input_scale")])
def test_save_refuses_a_tensor_named_like_a_part_of_a_layer(tmp_path, export, mode, part):
    """A tensor beside the layers named like one of a layer's parts, in any layout: written, it made
    a checkpoint load_checkpoint refuses (or whose activation scale it is), or a second tensor of
    one name. Refused naming both, nothing written."""
    t = make_tensors(layers=1, dtype=np.float32)
    layers = _layers(t, mode, **({"global_scale": True} if mode == "nvfp4" and export != "mlx" else {}))
    m = next(iter(layers))
    plain = {**_plain(t, layers), f"{m}.{part}": np.ones([1], np.float32)}
    with pytest.raises(ValueError, match=rf'"{re.escape(m)}\.{part}".*quantized layer "{re.escape(m)}"'):
        microscale.save_checkpoint(tmp_path / "out", layers, plain, export=export)
    assert not os.path.exists(tmp_path / "out")


def test_save_refuses_input_amax_on_other_modes(tmp_path):
    layers = _layers(make_tensors(layers=1), "mxfp4")
    for q in layers.values():
        q.input_amax = 7.0
    with pytest.raises(ValueError, match="exist for nvfp4 only, the layer is mxfp4"):
        microscale.save_checkpoint(tmp_path / "out", layers, export="compressed-tensors")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("arg, value, match", [
    ("config", [1, 2], r"config must be a dict \(config.json's object\) or None, got list"),
    ("config", "{}", r"config must be a dict"),
    ("layers", [], r"layers must be a dict \{module: QuantizedWeight\}, got list"),
    ("tensors", [np.zeros(2)], r"tensors must be a dict \{name: array\} or None, got list"),
])
def test_save_argument_types(tmp_path, arg, value, match):
    kw = dict(layers=_layers(make_tensors(layers=1), "mxfp4"), export="mlx")
    kw[arg] = value
    with pytest.raises(TypeError, match=match):
        microscale.save_checkpoint(tmp_path / "out", **kw)
    assert not os.path.exists(tmp_path / "out")


def test_load_sharded_float_model(tmp_path):
    t = make_tensors(layers=2)
    write_model(str(tmp_path), t, shards=2)
    ck = microscale.load_checkpoint(tmp_path)
    assert ck.format == "none" and not ck.layers
    assert set(ck.tensors) == set(t)
    for n, a in t.items():
        assert ck.tensors[n].dtype == BF16 and np.array_equal(ck.tensors[n].view(np.uint16), a.view(np.uint16))


@pytest.mark.parametrize("damage", ["truncated", "oversized", "corrupted"])
def test_damaged_files_raise(tmp_path, damage):
    t = make_tensors(layers=1)
    write_model(str(tmp_path), t, shards=1)
    p = tmp_path / "model.safetensors"
    b = bytearray(p.read_bytes())
    if damage == "truncated":
        b = b[:-37]
    elif damage == "oversized":
        b[0:8] = (len(b) * 4).to_bytes(8, "little")
    else:
        b[10:14] = b"\xff\xfe{{"
    p.write_bytes(bytes(b))
    with pytest.raises(ValueError, match="model.safetensors"):
        microscale.load_checkpoint(tmp_path)


def test_quantized_weight_keeps_its_element_format():
    """An mxfp8 E5M2 weight decodes as E5M2 (QuantizedWeight used to drop elem and decode E4M3)."""
    w = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    q = microscale.QuantizedWeight.from_float(w, mode="mxfp8", elem="e5m2")
    assert q.elem == "e5m2"
    wq, s = microscale.quantize(w, mode="mxfp8", elem="e5m2")
    np.testing.assert_array_equal(q.dequantize(), microscale.dequantize(wq, s, mode="mxfp8", elem="e5m2"))


def test_layers_are_quantized_weights(tmp_path):
    """A layer is a QuantizedWeight: saved as it is, and a calibrated QQLinear's static activation
    scale is its input_amax (W4A4)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    qq = microscale.QQLinear.from_linear(w).calibrate([rng.standard_normal((2, 64)).astype(np.float32)])
    assert isinstance(qq, microscale.QuantizedWeight) and qq.input_amax == qq.input_global_scale
    assert qq.shape == (32, 64) and qq.packed is qq.weight and qq in {qq}  # hashed by identity
    microscale.save_checkpoint(tmp_path, {"model.layers.0.mlp.up_proj": qq}, export="compressed-tensors")
    got = microscale.load_checkpoint(tmp_path).layers["model.layers.0.mlp.up_proj"]
    np.testing.assert_array_equal(got.packed, qq.weight)
    np.testing.assert_array_equal(got.scales, qq.scales)
    assert got.shape == (32, 64) and got.mode == "nvfp4"
    # The layout stores 2688 / amax: back as the amax to about one float32 ulp.
    assert got.global_scale == pytest.approx(qq.global_scale, rel=1e-6)
    assert got.input_amax == pytest.approx(qq.input_global_scale, rel=1e-6)
