"""ModelOpt MIXED_PRECISION checkpoints whose `quantized_layers` mix NVFP4 layers with per-tensor
FP8 layers, as ModelOpt's AutoQuantize writes them, through the microscale CLI. The checkpoints
are built by hand with numpy and ml_dtypes to ModelOpt's layout (not with microscale):
- NVFP4: <m>.weight U8 [N, K/2] (element 2j in the low nibble), <m>.weight_scale F8_E4M3
  [N, K/16], <m>.weight_scale_2 F32 [] (the decode factor), <m>.input_scale F32 [] (W4A4);
- FP8: <m>.weight F8_E4M3 [N, K], <m>.weight_scale F32 [], <m>.input_scale F32 [];
- hf_quant_config.json `quantization: {quant_algo: MIXED_PRECISION, quantized_layers}` with
  {"quant_algo": "FP8"} for the FP8 layers, and config.json's quantization_config as ModelOpt's
  convert_hf_quant_config_format makes it (one config group per distinct entry, the FP8 group
  without a group size, `quantized_layers` kept).
ml_dtypes is the oracle for every decoded value."""

import json
import os
import shutil

import numpy as np
import pytest

from ckpt_support import ROOT, load_all, run, skip_without_cli
from test_mixed_layouts import raw, write_st
from test_quantized_sources import BF16, E4M3, FP4_VALUES, ST_NAME

skip_without_cli()

# The llama fixture's shapes, config and tokenizer, so that GGUF (which needs a whole model) takes it.
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "llama")
H, KV, INTER, VOCAB = 64, 32, 128, 128
SHAPES = {"self_attn.q_proj": (H, H), "self_attn.k_proj": (KV, H), "self_attn.v_proj": (KV, H),
          "self_attn.o_proj": (H, H), "mlp.gate_proj": (INTER, H), "mlp.up_proj": (INTER, H),
          "mlp.down_proj": (H, INTER)}
# AutoQuantize's choice: layer 0's attention and layer 1's down_proj in FP8, the rest NVFP4.
FP8 = {f"model.layers.0.{p}" for p in SHAPES if p.startswith("self_attn")} | {"model.layers.1.mlp.down_proj"}
MODULES = sorted(f"model.layers.{i}.{p}" for i in range(2) for p in SHAPES)
NVFP4 = [m for m in MODULES if m not in FP8]
NORMS = tuple(f"model.layers.{i}.{n}.weight" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm"))
PLAIN = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight") + NORMS
F8 = {"dynamic": False, "num_bits": 8, "type": "float"}


def nvfp4_layer(m, shape, ws2, w4a4, rng, tensors, oracle):
    n, k = shape
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    scales = rng.choice(np.array([0.25, 0.5, 1.0, 1.5, 3.0, 6.0, 13.0, 448.0], np.float32), size=(n, k // 16))
    scales = scales.astype(E4M3)
    tensors[m + ".weight"] = codes[:, 0::2] | (codes[:, 1::2] << 4)
    tensors[m + ".weight_scale"] = scales
    tensors[m + ".weight_scale_2"] = np.array(ws2, np.float32)
    if w4a4:
        tensors[m + ".input_scale"] = np.array(ws2 * 4, np.float32)
    # ws2 is a power of two: every product is exact in float32, whatever the order.
    oracle[m + ".weight"] = FP4_VALUES[codes] * np.repeat(scales.astype(np.float32), 16, 1) * np.float32(ws2)


def fp8_layer(m, shape, per_channel, rng, tensors, oracle):
    """Per tensor (FP8): weight_scale F32 []; per channel (FP8_PER_CHANNEL_PER_TOKEN): F32 [N]."""
    w = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    w[:, :3] *= 20
    s = (np.abs(w).max(axis=1) if per_channel else np.abs(w).max()) / np.float32(448)
    s = np.asarray(s, np.float32)
    full = np.broadcast_to(s.reshape(-1, 1) if per_channel else s, shape)
    q = np.clip(w / full, -448, 448).astype(E4M3)
    tensors[m + ".weight"], tensors[m + ".weight_scale"] = q, s
    tensors[m + ".input_scale"] = np.array(0.02, np.float32)
    oracle[m + ".weight"] = q.astype(np.float32) * full  # one float32 multiplication


def expected_configs(layers):
    """hf_quant_config.json and config.json's quantization_config as ModelOpt 0.47 writes them."""
    producer = {"name": "modelopt", "version": "0.47.0"}
    fp4 = {**F8, "num_bits": 4, "group_size": 16}
    groups, order = {}, []
    for m, entry in layers.items():  # one group per distinct entry, in first-use order
        key = entry["quant_algo"]
        if key not in order:
            order.append(key)
            if key == "FP8":
                groups[key] = {"input_activations": F8, "weights": F8, "targets": []}
            elif key == "FP8_PER_CHANNEL_PER_TOKEN":
                groups[key] = {"input_activations": F8, "weights": {**F8, "strategy": "channel"}, "targets": []}
            elif key == "NVFP4":
                groups[key] = {"input_activations": fp4, "weights": fp4, "targets": []}
            else:
                groups[key] = {"weights": fp4, "targets": []}
        groups[key]["targets"].append(m)
    qc = {"config_groups": {f"group_{i}": groups[k] for i, k in enumerate(order)}, "quantized_layers": layers,
          "ignore": [], "quant_algo": "MIXED_PRECISION", "producer": producer, "quant_method": "modelopt"}
    hf = {"producer": producer,
          "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "quantized_layers": layers}}
    return hf, qc


def make_mixed(d, nvfp4_algo="NVFP4", ws2=2.0 ** -9, edit=None, per_channel=()):
    """The checkpoint in `d`; returns its tensors, the float32 oracle and its quantized_layers.
    `edit(layers)` changes the listing written into both configs; the FP8 modules in
    `per_channel` have one scale per output channel."""
    rng = np.random.default_rng(0)
    tensors = {"model.embed_tokens.weight": (rng.standard_normal((VOCAB, H)) * 0.02).astype(BF16),
               "lm_head.weight": (rng.standard_normal((VOCAB, H)) * 0.02).astype(BF16),
               **{n: np.ones(H, BF16) for n in NORMS + ("model.norm.weight",)}}
    oracle, layers = {}, {}
    for m in MODULES:
        shape = SHAPES[m.split(".", 3)[3]]
        if m in FP8:
            fp8_layer(m, shape, m in per_channel, rng, tensors, oracle)
            layers[m] = {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN" if m in per_channel else "FP8"}
        else:
            nvfp4_layer(m, shape, ws2, nvfp4_algo == "NVFP4", rng, tensors, oracle)
            layers[m] = {"quant_algo": nvfp4_algo, "group_size": 16}
    hf, qc = expected_configs(layers)
    if edit:
        edit(qc["quantized_layers"])
        hf["quantization"]["quantized_layers"] = qc["quantized_layers"]
    config = {**cfg(FIXTURE), "torch_dtype": "bfloat16", "quantization_config": qc}
    write_dir(d, tensors, config, hf)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(FIXTURE, f), os.path.join(d, f))
    return tensors, oracle, layers


def write_dir(d, tensors, config, hf_quant_config):
    """The checkpoint's files; scalars keep their shape [] (ModelOpt's weight_scale_2 and input_scale)."""
    os.makedirs(d, exist_ok=True)
    write_st(os.path.join(d, "model.safetensors"),
             {k: (ST_NAME[a.dtype], list(a.shape), np.ascontiguousarray(a).tobytes()) for k, a in tensors.items()})
    for name, content in (("config.json", config), ("hf_quant_config.json", hf_quant_config)):
        with open(os.path.join(d, name), "w") as f:
            json.dump(content, f)


def cfg(d, name="config.json"):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def kept_reasons(stdout):
    """{tensor: reason} of the report's "kept N weights (reason): a, b" lines."""
    kept = {}
    for line in stdout.splitlines():
        if line.startswith("kept "):
            why, names = line.split(" (", 1)[1].rsplit("): ", 1)
            kept.update({n: why for n in names.split(", ")})
    return kept


def test_inspect_lists_nvfp4_layers_and_fp8_weights(tmp_path):
    make_mixed(tmp_path)
    r = run("inspect", tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {line.split(" ", 1)[0]: line for line in r.stdout.splitlines() if line.startswith("model.")}
    for m in FP8:
        assert "modelopt fp8 weight" in rows[m + ".weight"] and "per tensor" in rows[m + ".weight"], rows[m + ".weight"]
        assert "modelopt fp8 scales" in rows[m + ".weight_scale"], rows[m + ".weight_scale"]
    for m in NVFP4:
        assert "nvfp4" in rows[m + ".weight"] and "fp8" not in rows[m + ".weight"], rows[m + ".weight"]
    assert f"{len(NVFP4)} quantized layers (modelopt)" in r.stdout, r.stdout
    assert f"{len(FP8)} quantized source weights (modelopt fp8)" in r.stdout, r.stdout


CHANNEL = ("model.layers.0.self_attn.o_proj",)


@pytest.mark.parametrize("nvfp4_algo,per_channel", [("NVFP4", ()), ("W4A16_NVFP4", CHANNEL)])
def test_dequantize_decodes_both_kinds(tmp_path, nvfp4_algo, per_channel):
    src, out = tmp_path / "src", tmp_path / "dq"
    tensors, oracle, _ = make_mixed(src, nvfp4_algo, per_channel=per_channel)
    r = run("dequantize", src, "-o", out)
    assert r.returncode == 0, r.stderr
    got = load_all(str(out))
    assert set(got) == set(oracle) | set(PLAIN)
    for name, want in oracle.items():
        assert got[name].dtype == BF16, name
        assert np.array_equal(got[name].view(np.uint16), want.astype(BF16).view(np.uint16)), name
    for name in PLAIN:
        assert got[name].tobytes() == tensors[name].tobytes(), name
    assert "quantization_config" not in cfg(out) and not (out / "hf_quant_config.json").exists()
    # float32 too: the FP8 values are the exact float32 products.
    r = run("dequantize", src, "-o", tmp_path / "dq32", "--dtype", "float32")
    assert r.returncode == 0, r.stderr
    got = load_all(str(tmp_path / "dq32"))
    for name, want in oracle.items():
        assert np.array_equal(got[name].view(np.uint32), want.view(np.uint32)), name


@pytest.mark.parametrize("nvfp4_algo,per_channel", [("NVFP4", ()), ("W4A16_NVFP4", ()), ("NVFP4", CHANNEL)])
def test_convert_to_modelopt_keeps_every_byte_and_the_listing(tmp_path, nvfp4_algo, per_channel):
    src, out = tmp_path / "src", tmp_path / "mo"
    _, _, layers = make_mixed(src, nvfp4_algo, per_channel=per_channel)
    r = run("convert", src, "-o", out, "--to", "modelopt")
    assert r.returncode == 0, r.stderr
    assert raw(out) == raw(src)  # every tensor: FP8 weights, weight_scale and input_scale included
    hf, qc = cfg(out, "hf_quant_config.json")["quantization"], cfg(out)["quantization_config"]
    _, want_qc = expected_configs(layers)
    assert hf["quant_algo"] == "MIXED_PRECISION" and hf["kv_cache_quant_algo"] is None
    assert hf["quantized_layers"] == layers and list(hf["quantized_layers"]) == MODULES
    for key in ("config_groups", "quantized_layers", "quant_algo", "quant_method"):
        assert qc[key] == want_qc[key], key
    assert qc["ignore"] == hf["exclude_modules"] and "lm_head" in qc["ignore"]
    assert not FP8 & set(qc["ignore"])
    # And again: the output converts to itself, configs included, byte for byte.
    again = tmp_path / "mo-again"
    assert run("convert", out, "-o", again, "--to", "modelopt").returncode == 0
    assert raw(again) == raw(out)
    for name in ("config.json", "hf_quant_config.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


@pytest.mark.parametrize("to,ws2", [("compressed-tensors", 2.0 ** -9), ("mlx", 1.0)])
def test_convert_to_other_layouts_writes_fp8_as_floats(tmp_path, to, ws2):
    """MLX's nvfp4 is two-level: it takes NVFP4 layers whose decode factor is 1."""
    src, out, dq = tmp_path / "src", tmp_path / to, tmp_path / "dq"
    tensors, _, _ = make_mixed(src, "NVFP4" if to != "mlx" else "W4A16_NVFP4", ws2=ws2)
    assert run("dequantize", src, "-o", dq).returncode == 0
    floats = load_all(str(dq))
    r = run("convert", src, "-o", out, "--to", to)
    assert r.returncode == 0, r.stderr
    got, got_raw = load_all(str(out)), raw(out)
    kept = kept_reasons(r.stdout)
    assert set(kept) == {m + ".weight" for m in FP8}, r.stdout
    assert set(kept.values()) == {f"ModelOpt FP8 layer: {to} has no FP8 form here"}, r.stdout
    assert f"{len(FP8)} FP8 weights (modelopt fp8) written as bfloat16 floats" in r.stdout + r.stderr, r.stdout
    for m in FP8:
        assert got[m + ".weight"].dtype == BF16
        assert got[m + ".weight"].tobytes() == floats[m + ".weight"].tobytes(), m
        assert m + ".weight_scale" not in got and m + ".input_scale" not in got
    for m in NVFP4:
        packed = got_raw[m + (".weight_packed" if to != "mlx" else ".weight")]
        scales = got_raw[m + (".weight_scale" if to != "mlx" else ".scales")]
        if to == "mlx":  # MLX packs eight codes per U32, in the same nibble order
            assert packed[0] == "U32"
        assert packed[2] == tensors[m + ".weight"].tobytes(), m
        assert scales[2] == tensors[m + ".weight_scale"].tobytes(), m
        if to != "mlx":  # the encode factor 1 / decode factor
            assert np.frombuffer(got_raw[m + ".weight_global_scale"][2], np.float32).tolist() == [1 / ws2]
    qc = cfg(out)["quantization_config" if to != "mlx" else "quantization"]
    if to == "compressed-tensors":
        assert FP8 <= set(qc["ignore"]), qc["ignore"]
        (g,) = qc["config_groups"].values()
        assert g["targets"] == ["Linear"] and g["format"] == "nvfp4-pack-quantized"  # all but the ignored
    else:
        assert not any(m in qc for m in FP8), qc
    # Dequantizing the output gives the same floats as dequantizing the input.
    dq2 = tmp_path / "dq2"
    assert run("dequantize", out, "-o", dq2).returncode == 0
    again = load_all(str(dq2))
    assert set(again) == set(floats)
    for name, a in floats.items():
        assert again[name].tobytes() == a.tobytes(), name


def test_convert_to_gguf_writes_fp8_as_floats(tmp_path):
    gguf = pytest.importorskip("gguf")
    src, out = tmp_path / "src", tmp_path / "model.gguf"
    make_mixed(src)
    assert run("dequantize", src, "-o", tmp_path / "dq").returncode == 0
    floats = load_all(str(tmp_path / "dq"))
    r = run("convert", src, "-o", out, "--to", "gguf")
    assert r.returncode == 0, r.stderr
    kept = kept_reasons(r.stdout)
    assert kept == {m + ".weight": "ModelOpt FP8 layer: gguf has no FP8 form here" for m in FP8}, r.stdout
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(out).tensors}
    gguf_name = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for m in MODULES:
        _, _, layer, proj = m.split(".", 3)
        want = gguf.GGMLQuantizationType.BF16 if m in FP8 else gguf.GGMLQuantizationType.NVFP4
        assert types[f"blk.{layer}.{gguf_name[proj]}.weight"] == want, m
    # Its values are the source's: dequantizing the GGUF gives the same floats.
    assert run("dequantize", out, "-o", tmp_path / "dq2").returncode == 0
    again = load_all(str(tmp_path / "dq2"))
    for m in MODULES:
        assert again[m + ".weight"].tobytes() == floats[m + ".weight"].tobytes(), m


def refused(tmp_path, edit, module, message):
    make_mixed(tmp_path / "good")  # the control: the checkpoint as written is read
    assert run("inspect", tmp_path / "good").returncode == 0
    src = tmp_path / "src"
    make_mixed(src, edit=edit)
    before = raw(src)
    for cmd in (["inspect", src], ["dequantize", src, "-o", tmp_path / "out"],
                ["convert", src, "-o", tmp_path / "out", "--to", "modelopt"]):
        r = run(*cmd)
        assert r.returncode != 0 and f'"{module}"' in r.stderr and message in r.stderr, (cmd, r.stderr)
        assert not (tmp_path / "out").exists()
    assert raw(src) == before


def test_fp8_weight_missing_from_quantized_layers_is_refused(tmp_path):
    m = "model.layers.1.mlp.down_proj"
    refused(tmp_path, lambda q: q.pop(m), m,
            "stored quantized (FP8), but config.json's quantization_config.quantized_layers does not list it")


def test_fp8_weight_listed_as_nvfp4_is_refused(tmp_path):
    m = "model.layers.0.self_attn.k_proj"
    refused(tmp_path, lambda q: q.update({m: {"quant_algo": "NVFP4", "group_size": 16}}), m,
            "stored as FP8, but config.json's quantization_config.quantized_layers gives it")


def test_per_channel_fp8_weight_listed_as_per_tensor_is_refused(tmp_path):
    m = CHANNEL[0]
    src = tmp_path / "src"
    make_mixed(src, per_channel=CHANNEL, edit=lambda q: q.update({m: {"quant_algo": "FP8"}}))
    r = run("inspect", src)
    assert r.returncode != 0 and f'"{m}"' in r.stderr, r.stderr
    assert "stored as FP8_PER_CHANNEL_PER_TOKEN, but config.json's quantization_config.quantized_layers gives it " \
        '{"quant_algo":"FP8"}' in r.stderr, r.stderr


def test_nvfp4_layer_listed_as_fp8_is_refused(tmp_path):
    m = "model.layers.1.self_attn.q_proj"
    refused(tmp_path, lambda q: q.update({m: {"quant_algo": "FP8"}}), m,
            "stored as NVFP4 or W4A16_NVFP4, but config.json's quantization_config.quantized_layers gives it "
            '{"quant_algo":"FP8"}')
