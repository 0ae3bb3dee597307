"""Quantized source checkpoints through the microscale CLI: DeepSeek / Qwen block FP8,
compressed-tensors FP8, ModelOpt FP8 and gpt-oss MXFP4, built here to their published layouts with
numpy and ml_dtypes (not with microscale). ml_dtypes is the oracle for every decoded value:
dequantize must match it bit for bit, and quantize from an FP8 source must write the same bytes
as quantizing the ml_dtypes-decoded float32 weights directly."""

import json
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

from ckpt_support import CLI, load_all, skip_without_cli

skip_without_cli()

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
ST_NAME = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", BF16: "BF16", E4M3: "F8_E4M3",
           np.dtype(np.uint8): "U8"}
FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def run(*args, ok=True):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, errors="replace", timeout=300)
    if ok:
        assert r.returncode == 0, f"{args}: {r.stderr}"
    return r


def save(path, tensors):
    """A safetensors file written by hand (the reference package's numpy writer has no FP8)."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        header[name] = {"dtype": ST_NAME[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a.tobytes())
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def write_dir(d, tensors, config, hf_quant_config=None):
    os.makedirs(d, exist_ok=True)
    save(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    if hf_quant_config is not None:
        with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
            json.dump(hf_quant_config, f)


# ---- FP8 sources

# [out, in] of the projections: 200 x 288 gives 128 x 128 blocks with partial edge blocks.
SHAPES = {"self_attn.q_proj": (200, 288), "self_attn.k_proj": (64, 288), "mlp.down_proj": (288, 160)}


def float_weights(seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        w = rng.standard_normal(shape).astype(np.float32) * 0.02 * (1 + i)
        w[:, :7] *= 30  # outliers, so scales differ between blocks
        out[f"model.layers.0.{name}.weight"] = w
    return out


def plain_tensors(seed=1):
    rng = np.random.default_rng(seed)
    return {"model.embed_tokens.weight": (rng.standard_normal((48, 288)) * 0.02).astype(BF16),
            "model.norm.weight": np.ones(288, BF16),
            "lm_head.weight": (rng.standard_normal((48, 288)) * 0.02).astype(BF16)}


def to_e4m3(w, scale):
    """E4M3 codes of w / scale, scale broadcast over w (as the FP8 exporters quantize)."""
    return np.clip(w / scale, -448, 448).astype(E4M3)


def block_fp8(w, block, scale_dtype):
    """DeepSeek / Qwen: one scale_inv per block x block tile, partial tiles at the edges."""
    n, k = w.shape
    rows, cols = -(-n // block), -(-k // block)
    s = np.zeros((rows, cols), np.float32)
    for i in range(rows):
        for j in range(cols):
            s[i, j] = np.abs(w[i * block:(i + 1) * block, j * block:(j + 1) * block]).max() / 448
    s = s.astype(scale_dtype)
    full = np.repeat(np.repeat(s.astype(np.float32), block, 0), block, 1)[:n, :k]
    return to_e4m3(w, full), s, full


def make_fp8(kind, scale_dtype=np.float32):
    """{tensor: array}, config, hf_quant_config and the oracle {weight: float32 values}."""
    tensors, oracle = dict(plain_tensors()), {}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16"}
    hf = None
    for name, w in float_weights().items():
        m = name[:-len(".weight")]
        if kind == "fp8-block":
            q, s, full = block_fp8(w, 128, scale_dtype)
            tensors[name], tensors[m + ".weight_scale_inv"] = q, s
        elif kind in ("ct-channel", "ct-tensor"):
            s = (np.abs(w).max(axis=1, keepdims=True) if kind == "ct-channel" else np.abs(w).max().reshape(1)) / 448
            s = s.astype(scale_dtype)
            full = np.broadcast_to(s.astype(np.float32).reshape(-1, 1) if s.size > 1 else s.astype(np.float32), w.shape)
            q = to_e4m3(w, full)
            tensors[name], tensors[m + ".weight_scale"] = q, s
            tensors[m + ".input_scale"] = np.array([0.05], scale_dtype)  # static activations: dropped
        else:  # modelopt
            s = np.float32(np.abs(w).max() / 448)
            q = to_e4m3(w, s)
            full = np.full(w.shape, s, np.float32)
            tensors[name], tensors[m + ".weight_scale"] = q, np.array(s, np.float32)
            tensors[m + ".input_scale"] = np.array(0.05, np.float32)
        # The oracle: E4M3 value times its scale in one float32 multiplication.
        oracle[name] = q.astype(np.float32) * full
    if kind == "fp8-block":
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                         "activation_scheme": "dynamic"}
    elif kind.startswith("ct"):
        strategy = kind[3:]
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {"group_0": {
                "targets": ["Linear"], "format": "float-quantized",
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True,
                                      "dynamic": False}}}}
    else:
        tensors["model.layers.0.self_attn.k_proj.k_scale"] = np.array(1.0, np.float32)  # FP8 KV cache: dropped
        tensors["model.layers.0.self_attn.v_proj.v_scale"] = np.array(1.0, np.float32)
        hf = {"producer": {"name": "modelopt", "version": "0.29.0"},
              "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
        if kind == "modelopt":
            config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8",
                                             "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
                                             "ignore": ["lm_head"], "producer": hf["producer"]}
    return tensors, config, hf, oracle


FP8_KINDS = [("fp8-block", np.float32, "fp8-block"), ("fp8-block", BF16, "fp8-block"),
             ("ct-channel", BF16, "compressed-tensors fp8"), ("ct-tensor", np.float32, "compressed-tensors fp8"),
             ("modelopt", np.float32, "modelopt fp8"), ("modelopt-hf-file-only", np.float32, "modelopt fp8")]
IDS = [f"{k}-{np.dtype(d).name}" for k, d, _ in FP8_KINDS]


@pytest.mark.parametrize("kind,scale_dtype,layout", FP8_KINDS, ids=IDS)
def test_fp8_inspect_and_dequantize(tmp_path, kind, scale_dtype, layout):
    tensors, config, hf, oracle = make_fp8(kind, np.dtype(scale_dtype))
    src = tmp_path / "src"
    write_dir(src, tensors, config, hf)

    r = run("inspect", src)
    assert f"layout {layout}\n" in r.stdout, r.stdout
    q = next(line for line in r.stdout.splitlines() if line.startswith("model.layers.0.self_attn.q_proj.weight "))
    assert f"{layout} weight" in q
    assert ("per 128x128 block" if kind == "fp8-block" else
            "per output channel" if kind == "ct-channel" else "per tensor") in q, q

    for dtype in ("bfloat16", "float32"):
        out = tmp_path / f"dq-{dtype}"
        args = ["dequantize", src, "-o", out] + ([] if dtype == "bfloat16" else ["--dtype", dtype])
        run(*args)
        got = load_all(str(out))
        for name, want in oracle.items():
            want = want.astype(BF16) if dtype == "bfloat16" else want
            assert got[name].dtype == want.dtype, name
            assert np.array_equal(got[name].view(np.uint8), want.view(np.uint8)), name
        # Scales, activation and KV-cache scales are gone; everything else is byte-identical.
        assert set(got) == set(oracle) | set(plain_tensors()), sorted(set(got))
        for name, a in plain_tensors().items():
            assert np.array_equal(got[name].view(np.uint8), a.view(np.uint8)), name
        with open(out / "config.json") as f:
            cfg = json.load(f)
        assert "quantization_config" not in cfg and cfg["torch_dtype"] == dtype
        assert not (out / "hf_quant_config.json").exists()


@pytest.mark.parametrize("kind,scale_dtype,layout", FP8_KINDS[::2], ids=IDS[::2])
@pytest.mark.parametrize("fmt,export", [("nvfp4", "compressed-tensors"), ("nvfp4", "modelopt"), ("mxfp4", "mlx"),
                                        ("affine4", "mlx")])
def test_quantize_from_fp8_equals_quantizing_the_decoded_weights(tmp_path, kind, scale_dtype, layout, fmt, export):
    tensors, config, hf, oracle = make_fp8(kind, np.dtype(scale_dtype))
    src, ref = tmp_path / "src", tmp_path / "ref"
    write_dir(src, tensors, config, hf)
    # The reference: the same model with the ml_dtypes-decoded float32 weights and no quantization.
    plain_config = {k: v for k, v in config.items() if k != "quantization_config"}
    write_dir(ref, {**plain_tensors(), **oracle}, plain_config)

    opts = ["--format", fmt, "--export", export] + (["--group-size", "32"] if fmt == "affine4" else [])
    r = run("quantize", src, "-o", tmp_path / "a", *opts)
    if kind != "fp8-block":
        assert "dropped" in r.stdout + r.stderr
    run("quantize", ref, "-o", tmp_path / "b", *opts)
    a, b = load_all(str(tmp_path / "a")), load_all(str(tmp_path / "b"))
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name
    with open(tmp_path / "a" / "config.json") as f, open(tmp_path / "b" / "config.json") as g:
        ca, cb = json.load(f), json.load(g)
    for key in ("quantization_config", "quantization"):
        assert ca.get(key) == cb.get(key), key


def test_fp8_scales_in_another_shard(tmp_path):
    """An index may put a weight and its scale in different shards: both are still read together."""
    tensors, config, hf, oracle = make_fp8("fp8-block")
    src = tmp_path / "src"
    write_dir(src, {}, config, hf)
    os.remove(src / "model.safetensors")
    scales = {n: a for n, a in tensors.items() if n.endswith("_scale_inv")}
    rest = {n: a for n, a in tensors.items() if n not in scales}
    files = {"model-00001-of-00002.safetensors": rest, "model-00002-of-00002.safetensors": scales}
    for fname, part in files.items():
        save(src / fname, part)
    with open(src / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": {n: fn for fn, part in files.items() for n in part}}, f)
    run("dequantize", src, "-o", tmp_path / "dq", "--dtype", "float32")
    got = load_all(str(tmp_path / "dq"))
    for name, want in oracle.items():
        assert np.array_equal(got[name], want), name
    assert not any(n.endswith("_scale_inv") for n in got)
    run("quantize", src, "-o", tmp_path / "q", "--format", "nvfp4")
    assert "model.layers.0.mlp.down_proj.weight_packed" in load_all(str(tmp_path / "q"))


def test_fp8_embedding_with_a_per_table_weight_scale(tmp_path):
    """transformers' FP8 embeddings keep one `weight_scale` per table next to block-scaled Linears."""
    tensors, config, hf, oracle = make_fp8("fp8-block")
    emb = plain_tensors()["model.embed_tokens.weight"].astype(np.float32)
    s = np.array([np.abs(emb).max() / 448], np.float32)
    tensors["model.embed_tokens.weight"] = to_e4m3(emb, s)
    tensors["model.embed_tokens.weight_scale"] = s
    write_dir(tmp_path / "src", tensors, config, hf)
    want = tensors["model.embed_tokens.weight"].astype(np.float32) * s
    run("dequantize", tmp_path / "src", "-o", tmp_path / "dq", "--dtype", "float32")
    assert np.array_equal(load_all(str(tmp_path / "dq"))["model.embed_tokens.weight"], want)
    r = run("quantize", tmp_path / "src", "-o", tmp_path / "q", "--format", "nvfp4")
    got = load_all(str(tmp_path / "q"))
    assert np.array_equal(got["model.embed_tokens.weight"], want)  # kept (an embedding), as its float32 values
    assert "model.embed_tokens.weight_scale" not in got
    assert "model.layers.0.mlp.down_proj.weight_packed" in got, r.stdout


def test_quantize_from_fp8_keeps_excluded_fp8_weights_as_float32(tmp_path):
    tensors, config, hf, oracle = make_fp8("fp8-block")
    write_dir(tmp_path / "src", tensors, config, hf)
    run("quantize", tmp_path / "src", "-o", tmp_path / "out", "--format", "nvfp4", "--exclude", "down_proj")
    got = load_all(str(tmp_path / "out"))
    name = "model.layers.0.mlp.down_proj.weight"
    assert got[name].dtype == np.float32 and np.array_equal(got[name], oracle[name])
    assert "model.layers.0.mlp.down_proj.weight_scale_inv" not in got
    assert "model.layers.0.self_attn.q_proj.weight_packed" in got


def test_convert_from_fp8_is_refused_pointing_to_quantize(tmp_path):
    tensors, config, hf, _ = make_fp8("fp8-block")
    write_dir(tmp_path / "src", tensors, config, hf)
    r = run("convert", tmp_path / "src", "-o", tmp_path / "out", "--to", "mlx", ok=False)
    assert r.returncode != 0 and "microscale quantize" in r.stderr and "fp8-block" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def damage(kind, what):
    tensors, config, hf, _ = make_fp8(kind)
    m = "model.layers.0.self_attn.q_proj"
    scale = m + (".weight_scale_inv" if kind == "fp8-block" else ".weight_scale")
    if what == "missing scale":
        del tensors[scale]
        return tensors, config, hf, ["q_proj.weight", "no scale"]
    if what == "wrong scale shape":
        tensors[scale] = np.ones((3, 3), np.float32)
        return tensors, config, hf, [scale, "[3, 3]", "expected"]
    if what == "nan scale":
        tensors[scale] = tensors[scale].astype(np.float32).copy()
        tensors[scale].reshape(-1)[-1] = np.nan
        return tensors, config, hf, [scale, "non-finite scale"]
    if what == "no block size":
        del config["quantization_config"]["weight_block_size"]
        return tensors, config, hf, [scale, "weight_block_size"]
    assert what == "no producer"
    del config["quantization_config"]
    return tensors, config, hf, ["q_proj.weight", "does not name its producer"]


HOSTILE = [("fp8-block", "missing scale"), ("fp8-block", "wrong scale shape"), ("fp8-block", "nan scale"),
           ("fp8-block", "no block size"), ("ct-channel", "wrong scale shape"), ("ct-channel", "nan scale"),
           ("modelopt", "missing scale"), ("ct-tensor", "no producer")]


@pytest.mark.parametrize("kind,what", HOSTILE, ids=[f"{k}-{w.replace(' ', '-')}" for k, w in HOSTILE])
def test_damaged_fp8_sources_give_clear_errors(tmp_path, kind, what):
    tensors, config, hf, parts = damage(kind, what)
    write_dir(tmp_path / "src", tensors, config, hf)
    for args in (["inspect", tmp_path / "src"], ["dequantize", tmp_path / "src", "-o", tmp_path / "dq"],
                 ["quantize", tmp_path / "src", "-o", tmp_path / "q", "--format", "nvfp4"]):
        r = run(*args, ok=False)
        assert r.returncode != 0, args
        for p in parts:
            assert p in r.stderr, (args, p, r.stderr)
    assert not (tmp_path / "dq").exists() and not (tmp_path / "q").exists()


def test_dequantize_reports_nan_and_inf_and_refuses_them_on_request(tmp_path):
    """E4M3 NaN codes (0x7F) in an FP8 weight, and values past float16's 65504: dequantize used to
    write them silently. It warns per tensor, and --nonfinite error refuses them, writing nothing."""
    tensors, config, hf, _ = make_fp8("fp8-block")
    q, k = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"
    tensors[q + ".weight"].view(np.uint8)[3, 5:7] = 0x7F
    tensors[k + ".weight_scale_inv"] = tensors[k + ".weight_scale_inv"] * np.float32(1e6)  # values up to ~1e6
    write_dir(tmp_path / "src", tensors, config, hf)
    run("dequantize", tmp_path / "src", "-o", tmp_path / "f32", "--dtype", "float32")
    f32 = load_all(tmp_path / "f32")
    big = int(np.sum(np.abs(f32[k + ".weight"]) >= 65520))  # those round to float16 infinity
    assert big > 0 and np.isnan(f32[q + ".weight"]).sum() == 2
    r = run("dequantize", tmp_path / "src", "-o", tmp_path / "dq", "--dtype", "float16")
    assert f"{q}.weight has 2 non-finite values" in r.stderr, r.stderr
    assert f"{k}.weight has {big} non-finite values" in r.stderr, r.stderr
    got = load_all(tmp_path / "dq")
    assert np.isnan(got[q + ".weight"]).sum() == 2 and np.isinf(got[k + ".weight"]).sum() == big
    # float32 holds the large values: only the NaN are left to refuse.
    r = run("dequantize", tmp_path / "src", "-o", tmp_path / "refused", "--dtype", "float32", "--nonfinite", "error",
            ok=False)
    assert r.returncode == 1 and f'tensor "{q}.weight" dequantizes to 2 NaN' in r.stderr, r.stderr
    assert not (tmp_path / "refused").exists()
    tensors[q + ".weight"].view(np.uint8)[3, 5:7] = 0
    write_dir(tmp_path / "src", tensors, config, hf)
    r = run("dequantize", tmp_path / "src", "-o", tmp_path / "refused", "--dtype", "float16", "--nonfinite", "error",
            ok=False)
    assert r.returncode == 1 and f'tensor "{k}.weight" dequantizes to {big} infinite' in r.stderr, r.stderr
    assert "65504" in r.stderr and not (tmp_path / "refused").exists()


# ---- gpt-oss MXFP4

E, HIDDEN, INTER = 2, 64, 32  # gate_up: [E, 2 * INTER, HIDDEN / 32, 16]; down: [E, HIDDEN, INTER / 32, 16]


def make_gptoss(seed=0):
    rng = np.random.default_rng(seed)
    tensors = {"model.embed_tokens.weight": (rng.standard_normal((40, HIDDEN)) * 0.02).astype(BF16),
               "model.layers.0.self_attn.q_proj.weight": (rng.standard_normal((HIDDEN, HIDDEN)) * 0.02).astype(BF16),
               "model.layers.0.mlp.router.weight": (rng.standard_normal((E, HIDDEN)) * 0.02).astype(BF16),
               "model.layers.0.mlp.experts.gate_up_proj_bias": np.zeros((E, 2 * INTER), BF16)}
    for proj, (out, k) in {"gate_up_proj": (2 * INTER, HIDDEN), "down_proj": (HIDDEN, INTER)}.items():
        p = f"model.layers.0.mlp.experts.{proj}"
        tensors[p + "_blocks"] = rng.integers(0, 256, (E, out, k // 32, 16), dtype=np.uint8)
        tensors[p + "_scales"] = rng.integers(110, 135, (E, out, k // 32), dtype=np.uint8)
    config = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                  "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
    return tensors, config


def gptoss_oracle(blocks, scales):
    """[E, out, in/32, 16] codes (even element in the low nibble) x 2^(scale - 127), as [E, in, out]."""
    lo, hi = FP4_VALUES[blocks & 0x0F], FP4_VALUES[blocks >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * np.exp2(scales.astype(np.float64) - 127)[..., None]
    e, out = blocks.shape[:2]
    return vals.reshape(e, out, -1).transpose(0, 2, 1).astype(np.float32)


def test_gptoss_inspect_dequantize_and_refusals(tmp_path):
    tensors, config = make_gptoss()
    src = tmp_path / "src"
    write_dir(src, tensors, config)
    r = run("inspect", src)
    assert "layout gpt-oss mxfp4\n" in r.stdout, r.stdout
    assert "gpt-oss mxfp4 blocks" in r.stdout and "gpt-oss mxfp4 scales" in r.stdout

    run("dequantize", src, "-o", tmp_path / "dq")
    got = load_all(str(tmp_path / "dq"))
    for proj in ("gate_up_proj", "down_proj"):
        p = f"model.layers.0.mlp.experts.{proj}"
        want = gptoss_oracle(tensors[p + "_blocks"], tensors[p + "_scales"]).astype(BF16)
        assert got[p].dtype == BF16 and got[p].shape == want.shape, (p, got[p].shape)
        assert np.array_equal(got[p].view(np.uint16), want.view(np.uint16)), p
        assert p + "_blocks" not in got and p + "_scales" not in got
    for name in ("model.layers.0.mlp.router.weight", "model.layers.0.mlp.experts.gate_up_proj_bias"):
        assert np.array_equal(got[name].view(np.uint16), tensors[name].view(np.uint16))
    with open(tmp_path / "dq" / "config.json") as f:
        assert "quantization_config" not in json.load(f)

    r = run("convert", src, "-o", tmp_path / "cv", "--to", "modelopt", ok=False)
    assert r.returncode != 0 and "gate_up_proj_blocks" in r.stderr and "dequantize" in r.stderr, r.stderr
    r = run("quantize", src, "-o", tmp_path / "q", "--format", "mxfp4", ok=False)
    assert r.returncode != 0 and "gpt-oss" in r.stderr and "dequantize" in r.stderr, r.stderr
    assert not (tmp_path / "cv").exists() and not (tmp_path / "q").exists()


def test_gptoss_dequantize_matches_transformers(tmp_path):
    """transformers' own gpt-oss decoder, where torch and transformers are installed."""
    torch = pytest.importorskip("torch")
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    tensors, config = make_gptoss(seed=3)
    write_dir(tmp_path / "src", tensors, config)
    run("dequantize", tmp_path / "src", "-o", tmp_path / "dq")
    got = load_all(str(tmp_path / "dq"))
    for proj in ("gate_up_proj", "down_proj"):
        p = f"model.layers.0.mlp.experts.{proj}"
        want = mxfp4.convert_moe_packed_tensors(torch.from_numpy(tensors[p + "_blocks"]),
                                                torch.from_numpy(tensors[p + "_scales"]), dtype=torch.bfloat16)
        assert tuple(want.shape) == got[p].shape
        assert np.array_equal(want.view(torch.int16).numpy().view(np.uint16), got[p].view(np.uint16)), p


@pytest.mark.parametrize("what", ["nan scale", "missing scales", "wrong scale shape", "not 4-D"])
def test_damaged_gptoss_sources_give_clear_errors(tmp_path, what):
    tensors, config = make_gptoss()
    p = "model.layers.0.mlp.experts.down_proj"
    if what == "nan scale":
        tensors[p + "_scales"][1, 3, 0] = 0xFF
        parts = [p + "_scales", "0xFF"]
    elif what == "missing scales":
        del tensors[p + "_scales"]
        parts = [p + "_blocks", "no scales"]
    elif what == "wrong scale shape":
        tensors[p + "_scales"] = tensors[p + "_scales"][:, :-1]
        parts = [p + "_scales", "expected U8"]
    else:
        tensors[p + "_blocks"] = tensors[p + "_blocks"].reshape(E, HIDDEN, 16)
        parts = [p + "_blocks", "[experts, out, in/32, 16]"]
    write_dir(tmp_path / "src", tensors, config)
    r = run("dequantize", tmp_path / "src", "-o", tmp_path / "dq", ok=False)
    assert r.returncode != 0
    for part in parts:
        assert part in r.stderr, (part, r.stderr)
    assert not (tmp_path / "dq").exists()


@pytest.mark.parametrize("kind", ["fp8-block", "ct-channel"])
def test_fp8_dequantize_matches_the_ecosystems_decoders(tmp_path, kind):
    """transformers' block-FP8 decoder and compressed-tensors' dequantize, where they are installed."""
    torch = pytest.importorskip("torch")
    tensors, config, hf, _ = make_fp8(kind, np.dtype(np.float32 if kind == "fp8-block" else BF16))
    write_dir(tmp_path / "src", tensors, config, hf)
    run("dequantize", tmp_path / "src", "-o", tmp_path / "dq", "--dtype", "bfloat16")
    got = load_all(str(tmp_path / "dq"))
    if kind == "fp8-block":
        fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
        decode = getattr(fp8, "_dequantize_fp8_weight", None) or pytest.skip("transformers lacks _dequantize_fp8_weight")
    else:
        ct = pytest.importorskip("compressed_tensors.quantization")
        from compressed_tensors.quantization.lifecycle.forward import dequantize
        args = ct.QuantizationArgs(num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False)
    for name in float_weights():
        q = torch.from_numpy(tensors[name].view(np.uint8)).view(torch.float8_e4m3fn)
        if kind == "fp8-block":
            s = torch.from_numpy(tensors[name + "_scale_inv"])
            want = decode(q, s, [128, 128], torch.float32).to(torch.bfloat16)
        else:
            s = torch.from_numpy(tensors[name + "_scale"].astype(np.float32)).to(torch.bfloat16)
            want = dequantize(q, s, args=args)
        assert want.dtype == torch.bfloat16
        assert np.array_equal(want.view(torch.int16).numpy().view(np.uint16), got[name].view(np.uint16)), name


def test_gptoss_dequantized_checkpoint_loads_in_transformers(tmp_path):
    """A tiny gpt-oss from transformers' own class, its experts replaced by MXFP4 blocks and scales
    under the published names: the dequantized checkpoint loads into GptOssForCausalLM with no
    missing or unexpected weights, and its experts hold transformers' own decode of the blocks."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    cfg = transformers.GptOssConfig(vocab_size=64, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_local_experts=2,
                                    num_experts_per_tok=1, layer_types=["full_attention"])
    model = transformers.GptOssForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16", safe_serialization=True)
    tensors = load_all(str(tmp_path / "bf16"))
    rng = np.random.default_rng(5)
    packed = {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        _, k, n_out = tensors.pop(name).shape  # transformers keeps [E, in, out]
        packed[name + "_blocks"] = rng.integers(0, 256, (cfg.num_local_experts, n_out, k // 32, 16), dtype=np.uint8)
        packed[name + "_scales"] = rng.integers(118, 128, (cfg.num_local_experts, n_out, k // 32), dtype=np.uint8)
    with open(tmp_path / "bf16" / "config.json") as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    write_dir(tmp_path / "src", {**tensors, **packed}, config)
    run("dequantize", tmp_path / "src", "-o", tmp_path / "dq")

    loaded, info = transformers.GptOssForCausalLM.from_pretrained(tmp_path / "dq", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    params = dict(loaded.named_parameters())
    for name in [n[:-len("_blocks")] for n in packed if n.endswith("_blocks")]:
        want = mxfp4.convert_moe_packed_tensors(torch.from_numpy(packed[name + "_blocks"]),
                                                torch.from_numpy(packed[name + "_scales"]), dtype=torch.bfloat16)
        assert torch.equal(params[name].detach().to(torch.bfloat16), want), name
    with torch.no_grad():
        assert torch.isfinite(loaded(torch.tensor([[1, 2, 3]])).logits).all()
