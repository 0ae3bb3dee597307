"""scale_search ("4over6", "mse"): the chosen bytes decoded by an independent decoder (ml_dtypes'
float4_e2m1fn, float8_e4m3fn and float8_e8m0fnu) reproduce microscale's dequantize, and mse is
never worse than round-to-nearest per block."""

import ml_dtypes
import numpy as np
import pytest

import microscale as ms


def _unpack_fp4(packed):
    """Codes of the even (low nibble) and odd (high nibble) elements, interleaved back."""
    p = np.asarray(packed, dtype=np.uint8)
    codes = np.empty(p.shape[:-1] + (p.shape[-1] * 2,), dtype=np.uint8)
    codes[..., 0::2] = p & 0xF
    codes[..., 1::2] = p >> 4
    return codes


def independent_decode(mode, packed, scales, global_scale=None):
    codes = _unpack_fp4(packed)
    elems = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    if mode == "nvfp4":
        factor = np.asarray(scales, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        if global_scale is not None:
            factor = factor * np.float64(np.float32(global_scale)) / 2688.0
        group = 16
    else:
        factor = np.asarray(scales, np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
        group = 32
    return elems * np.repeat(factor, group, axis=-1)


def _heavy(rows, cols, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, cols)) * np.exp(rng.standard_normal((rows, cols)))).astype(np.float32)


def _block_err(y, x, group):
    d = (y - x.astype(np.float64)) ** 2
    return d.reshape(d.shape[0], -1, group).sum(axis=-1)


@pytest.mark.parametrize("mode,three_level", [("nvfp4", False), ("nvfp4", True), ("mxfp4", False)])
def test_mse_bytes_decode_independently_and_never_lose_per_block(mode, three_level):
    x = _heavy(64, 512, 1)
    group = 16 if mode == "nvfp4" else 32
    gs = ms.global_scale(x) if three_level else None
    rtn = ms.quantize(x, mode=mode, global_scale=gs)
    out = ms.quantize(x, mode=mode, global_scale=gs, scale_search="mse")
    if three_level:
        packed, scales, g = out
        assert g in [np.float32(gs * m) for m in (1.0, 1.03125, 1.0625, 1.09375, 1.75)]
    else:
        packed, scales = out
        g = None
    y = independent_decode(mode, packed, scales, g)
    lib = ms.dequantize(packed, scales, mode=mode, global_scale=g)
    np.testing.assert_allclose(lib, y, rtol=1e-6, atol=0)
    e_rtn = _block_err(independent_decode(mode, *rtn[:2], gs), x, group)
    e_mse = _block_err(y, x, group)
    if three_level:  # the global scale may move every block; the total cannot get worse
        assert e_mse.sum() <= e_rtn.sum()
    else:
        assert np.all(e_mse <= e_rtn * (1 + 1e-5))
    assert e_mse.sum() < e_rtn.sum()


def test_four_over_six_picks_four_or_six():
    four = np.array([4, 3, 2, 1.5, 1, 0.5, 0, -4, -3, -2, -1.5, -1, -0.5, 0, 4, 2], np.float32)
    six = np.array([6, 3, 1.5, 0.5, 0, 0, 0, 0, -6, -3, -1.5, -0.5, 0, 0, 0, 0], np.float32)
    for x, scale in ((four, 1.0), (six, 1.0)):
        packed, scales = ms.quantize(x, mode="nvfp4", scale_search="4over6")
        assert float(scales.view(ml_dtypes.float8_e4m3fn)[0]) == scale
        np.testing.assert_array_equal(independent_decode("nvfp4", packed, scales), x)
    # Round to nearest maps 4 to 6 there: scale E4M3(4/6) = 0.6875.
    _, scales = ms.quantize(four, mode="nvfp4")
    assert float(scales.view(ml_dtypes.float8_e4m3fn)[0]) == 0.6875


def test_scale_search_argument_errors():
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="4over6' is only defined for nvfp4"):
        ms.quantize(x, mode="mxfp4", scale_search="4over6")
    with pytest.raises(ValueError, match="only defined for nvfp4 and mxfp4"):
        ms.quantize(x, mode="mxfp8", scale_search="mse")
    with pytest.raises(ValueError, match="scale_search"):
        ms.quantize(x, scale_search="best")


def test_checkpoint_records_scale_search(tmp_path):
    """`microscale quantize --scale-search mse` writes standard bytes that decode independently,
    records the search in the config's producer block, and `inspect` prints it."""
    import json
    import os
    import subprocess

    from ckpt_support import load_all, make_tensors, write_model

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cli = os.environ.get("MICROSCALE_CLI") or os.path.join(root, "build", "src", "cli", "microscale")
    if not os.access(cli, os.X_OK):
        pytest.skip(f"no microscale command at {cli}")
    src = tmp_path / "src"
    tensors = make_tensors(layers=1)
    write_model(src, tensors, shards=1)
    for export in ("compressed-tensors", "modelopt"):
        out = tmp_path / export
        r = subprocess.run([cli, "quantize", str(src), "-o", str(out), "--export", export, "--scale-search", "mse"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        config = json.loads((out / "config.json").read_text())
        assert config["quantization_config"]["producer"]["scale_search"] == "mse"
        r = subprocess.run([cli, "inspect", str(out)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "config: scale_search mse; " in r.stdout, r.stdout + r.stderr
        got = load_all(out)
        name = "model.layers.0.mlp.down_proj"
        packed = got[name + (".weight_packed" if export == "compressed-tensors" else ".weight")]
        scales = got[name + ".weight_scale"].view(np.uint8)
        if export == "compressed-tensors":
            amax = 2688.0 / float(got[name + ".weight_global_scale"].reshape(-1)[0])
        else:
            amax = float(got[name + ".weight_scale_2"].reshape(-1)[0]) * 2688.0
        w = np.asarray(tensors[name + ".weight"], np.float32)
        y = independent_decode("nvfp4", packed, scales, amax)
        rtn_packed, rtn_scales = ms.quantize(w, mode="nvfp4")  # two-level baseline
        rel = np.linalg.norm(y - w) / np.linalg.norm(w)
        rel_rtn = np.linalg.norm(independent_decode("nvfp4", rtn_packed, rtn_scales) - w) / np.linalg.norm(w)
        assert rel < rel_rtn * 1.02, (rel, rel_rtn)
    r = subprocess.run([cli, "quantize", str(src), "-o", str(tmp_path / "bad"), "--format", "mxfp8",
                        "--scale-search", "mse"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "only defined for nvfp4 and mxfp4" in r.stderr
    assert not (tmp_path / "bad" / "config.json").exists()
