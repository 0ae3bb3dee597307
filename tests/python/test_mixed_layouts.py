"""Checkpoints whose layers have different formats, written by microscale in each layout: MLX's
per-module quantization entries, compressed-tensors' config groups (one per format, targets naming
the layers) and ModelOpt's MIXED_PRECISION with `quantized_layers`.

The mixed MLX checkpoint is made from two of microscale's own uniform quantizations of the llama
fixture (the attention projections from one, the MLPs from the other) with a per-module entry for
each taken layer, so every later step runs through the CLI's convert, dequantize and inspect:
- every layer keeps its bytes through MLX -> compressed-tensors / ModelOpt -> MLX and through
  a convert into the layout a checkpoint is already in;
- the configs say each layer's format (checked field by field);
- with compressed-tensors installed (the venv of scripts/test-ecosystem.sh, or any with
  `compressed_tensors`), transformers' from_pretrained decompresses the compressed-tensors export
  through ModelCompressor to exactly the weights `microscale dequantize` writes, and a forward pass
  gives the same logits bit for bit.
"""

import json
import os

import numpy as np
import pytest

from ckpt_support import ROOT, ok, run, skip_without_cli

skip_without_cli()

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "llama")
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
MODES = {"nvfp4": (16, 4), "mxfp4": (32, 4), "mxfp8": (32, 8)}


def raw(d):
    """{name: (dtype, shape, bytes)} of a model directory's tensors, read from the files."""
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                h = json.loads(fh.read(n))
                data = fh.read()
            for k, v in h.items():
                if k != "__metadata__":
                    lo, hi = v["data_offsets"]
                    out[k] = (v["dtype"], v["shape"], data[lo:hi])
    return out


def cfg(d, name="config.json"):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def write_st(path, tensors):
    """A safetensors file of (dtype, shape, bytes) entries, sorted by name."""
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        dt, shape, b = tensors[k]
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def mixed_mlx(tmp_path, attn_mode, mlp_mode):
    """The llama fixture in MLX with its attention in `attn_mode` and its MLPs in `mlp_mode`."""
    parts = {}
    for mode in {attn_mode, mlp_mode}:
        parts[mode] = tmp_path / f"uniform-{mode}"
        ok("quantize", FIXTURE, "-o", parts[mode], "--format", mode, "--export", "mlx")
    out = tmp_path / f"mixed-{attn_mode}-{mlp_mode}"
    os.makedirs(out)
    tensors = raw(parts[mlp_mode])
    config = cfg(parts[mlp_mode])
    for name, t in raw(parts[attn_mode]).items():
        module = name.rsplit(".", 1)[0]
        if module.rsplit(".", 1)[-1] in ATTN:
            tensors[name] = t
            group, bits = MODES[attn_mode]
            entry = {"group_size": group, "bits": bits, "mode": attn_mode}
            config["quantization"][module] = config["quantization_config"][module] = entry
    write_st(out / "model.safetensors", tensors)
    with open(out / "config.json", "w") as f:
        json.dump(config, f)
    for f in os.listdir(FIXTURE):
        if f.startswith("tokenizer"):
            with open(os.path.join(FIXTURE, f), "rb") as src, open(out / f, "wb") as dst:
                dst.write(src.read())
    return out


def mlx_formats(d):
    """{module: (mode, group_size, bits)} that an MLX config gives each quantized layer (its own
    entry, else the global one: which is the global one is the writer's choice)."""
    q = cfg(d)["quantization"]
    mods = {k.rsplit(".", 1)[0] for k in raw(d) if k.endswith(".scales")}
    return {m: tuple(q.get(m, q)[f] for f in ("mode", "group_size", "bits")) for m in mods}


def modules_of(tensors, names):
    return sorted({k.rsplit(".", 1)[0] for k in tensors if k.rsplit(".", 1)[0].rsplit(".", 1)[-1] in names})


def layer_bytes(tensors, module):
    """A layer's packed data and scales as bytes, whatever the layout calls them."""
    got = {}
    for suffix, role in ((".weight_packed", "data"), (".weight", "data"), (".weight_scale", "scales"),
                         (".scales", "scales")):
        if module + suffix in tensors and role not in got:
            got[role] = tensors[module + suffix][2]
    return got


PAIRS = [("mxfp8", "nvfp4"), ("mxfp8", "mxfp4"), ("nvfp4", "mxfp8")]


@pytest.mark.parametrize("attn,mlp", PAIRS)
def test_compressed_tensors_groups_name_each_layer_and_keep_the_bytes(tmp_path, attn, mlp):
    mlx = mixed_mlx(tmp_path, attn, mlp)
    ct = tmp_path / "ct"
    ok("convert", mlx, "-o", ct, "--to", "compressed-tensors")
    src, got = raw(mlx), raw(ct)
    qc = cfg(ct)["quantization_config"]
    assert qc["format"] == "mixed-precision"
    formats = {"nvfp4": "nvfp4-pack-quantized", "mxfp4": "mxfp4-pack-quantized", "mxfp8": "mxfp8-quantized"}
    by_format = {g["format"]: g for g in qc["config_groups"].values()}
    assert set(by_format) == {formats[attn], formats[mlp]}
    for mode, names in ((attn, ATTN), (mlp, MLP)):
        g = by_format[formats[mode]]
        assert g["targets"] == modules_of(src, names)
        group, bits = MODES[mode]
        w = g["weights"]
        assert (w["num_bits"], w["group_size"], w["type"]) == (bits, group, "float")
        assert (w["strategy"], w["scale_dtype"]) == (("tensor_group", "torch.float8_e4m3fn") if mode == "nvfp4"
                                                      else ("group", "torch.uint8"))
        for m in g["targets"]:
            if mode == "mxfp8":
                assert got[m + ".weight"][:2] == ("F8_E4M3", src[m + ".weight"][1][:1] + [src[m + ".weight"][1][1] * 4])
                assert got[m + ".weight_scale"][0] == "U8"
            else:
                assert got[m + ".weight_packed"][0] == "U8"
            if mode == "nvfp4":  # MLX's two-level nvfp4: the encode factor 1
                assert np.frombuffer(got[m + ".weight_global_scale"][2], np.float32).tolist() == [1.0]
            assert layer_bytes(got, m) == layer_bytes(src, m), m
    # inspect names each layer's group; convert into the same layout and back to MLX keeps every byte.
    listing = ok("inspect", ct).stdout
    for name, g in qc["config_groups"].items():
        assert f'config group "{name}" ({g["format"]}): {len(g["targets"])} ' in listing
    again = tmp_path / "ct-again"
    ok("convert", ct, "-o", again, "--to", "compressed-tensors")
    assert raw(again) == got
    assert cfg(again)["quantization_config"] == qc
    back = tmp_path / "mlx-back"
    ok("convert", ct, "-o", back, "--to", "mlx")
    assert raw(back) == src
    assert mlx_formats(back) == mlx_formats(mlx)
    # The dequantized weights do not depend on the layout.
    d1, d2 = tmp_path / "dq-mlx", tmp_path / "dq-ct"
    ok("dequantize", mlx, "-o", d1)
    ok("dequantize", ct, "-o", d2)
    assert raw(d1) == raw(d2)


def test_modelopt_mixed_precision_lists_each_layer_and_keeps_the_bytes(tmp_path):
    mlx = mixed_mlx(tmp_path, "mxfp8", "nvfp4")
    mo = tmp_path / "modelopt"
    ok("convert", mlx, "-o", mo, "--to", "modelopt")
    src, got = raw(mlx), raw(mo)
    attn, mlp = modules_of(src, ATTN), modules_of(src, MLP)
    layers = {**{m: {"quant_algo": "MXFP8", "group_size": 32} for m in attn},
              **{m: {"quant_algo": "W4A16_NVFP4", "group_size": 16} for m in mlp}}
    hq = cfg(mo, "hf_quant_config.json")["quantization"]
    assert hq["quant_algo"] == "MIXED_PRECISION" and hq["quantized_layers"] == layers
    assert hq["kv_cache_quant_algo"] is None
    qc = cfg(mo)["quantization_config"]
    assert (qc["quant_method"], qc["quant_algo"], qc["quantized_layers"]) == ("modelopt", "MIXED_PRECISION", layers)
    assert qc["ignore"] == hq["exclude_modules"] == sorted(hq["exclude_modules"])
    fp8 = {"dynamic": False, "num_bits": 8, "type": "float", "group_size": 32}
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    # One group per distinct entry, in the order the sorted modules first use it.
    first = "MXFP8" if min(attn) < min(mlp) else "W4A16_NVFP4"
    groups = {"MXFP8": {"input_activations": fp8, "weights": fp8, "targets": attn},
              "W4A16_NVFP4": {"weights": fp4, "targets": mlp}}
    order = [first] + [a for a in groups if a != first]
    assert qc["config_groups"] == {f"group_{i}": groups[a] for i, a in enumerate(order)}
    for m in attn:
        assert got[m + ".weight"][0] == "F8_E4M3" and got[m + ".weight_scale"][0] == "U8"
        assert m + ".weight_scale_2" not in got
    for m in mlp:
        assert np.frombuffer(got[m + ".weight_scale_2"][2], np.float32).tolist() == [1.0]
    for m in attn + mlp:
        assert layer_bytes(got, m) == layer_bytes(src, m), m
    again = tmp_path / "modelopt-again"
    ok("convert", mo, "-o", again, "--to", "modelopt")
    assert raw(again) == got and cfg(again)["quantization_config"] == qc
    back = tmp_path / "mlx-back"
    ok("convert", mo, "-o", back, "--to", "mlx")
    assert raw(back) == src
    d1, d2 = tmp_path / "dq-mlx", tmp_path / "dq-mo"
    ok("dequantize", mlx, "-o", d1)
    ok("dequantize", mo, "-o", d2)
    assert raw(d1) == raw(d2)


@pytest.mark.parametrize("attn,mlp", PAIRS)
def test_compressed_tensors_decompresses_mixed_exports_as_microscale_dequantizes(tmp_path, attn, mlp):
    """compressed-tensors matches each module to its config group (apply_quantization_config) and
    decompresses its tensors with that group's compressor: every weight equals microscale's
    dequantized one bit for bit, so the model holding them gives the same logits.
    transformers' from_pretrained of such an export is checked by scripts/ecosystem_check.py."""
    pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed "
                        "(scripts/test-ecosystem.sh's venv has it)")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from compressed_tensors.compressors import BaseCompressor, ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from safetensors.torch import load_file
    from transformers.utils.quantization_config import CompressedTensorsConfig

    ct, dq = tmp_path / "ct", tmp_path / "dq"
    ok("convert", mixed_mlx(tmp_path, attn, mlp), "-o", ct, "--to", "compressed-tensors")
    ok("dequantize", ct, "-o", dq)
    qc = cfg(ct)["quantization_config"]
    parsed = QuantizationConfig.model_validate(qc)
    assert parsed.format == "mixed-precision"
    assert ModelCompressor.from_compression_config(CompressedTensorsConfig.from_dict(qc)) is not None
    tensors = load_file(str(ct / "model.safetensors"))
    ids = torch.tensor([[(7 * i + 3) % 128 for i in range(16)]])
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(dq, dtype=torch.bfloat16).eval()
        dec = transformers.AutoModelForCausalLM.from_pretrained(dq, dtype=torch.bfloat16).eval()
        apply_quantization_config(dec, parsed, show_progress=False)
        formats, decoded = {}, {}
        for name, module in dec.named_modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None or scheme.weights is None:
                continue
            local = {k[len(name) + 1:]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == name}
            state = BaseCompressor.get_value_from_registry(scheme.format).decompress(local, scheme)
            w = state["weight"].to(torch.bfloat16)
            assert torch.equal(w.view(torch.int16), ref.get_submodule(name).weight.view(torch.int16)), name
            formats[name] = scheme.format
            decoded[name] = w
        want = {m: g["format"] for g in qc["config_groups"].values() for m in g["targets"]}
        assert formats == want
        # A plain model (no quantization hooks) with compressed-tensors' weights in place.
        plain = transformers.AutoModelForCausalLM.from_pretrained(dq, dtype=torch.bfloat16).eval()
        for name, w in decoded.items():
            plain.get_submodule(name).weight.data = w
        assert torch.equal(plain(ids).logits, ref(ids).logits)


def test_w4a4_nvfp4_beside_mxfp8_keeps_its_activation_scales(tmp_path):
    """MXFP8 layers store no activation scale; the nvfp4 layers' scales (W4A4) are kept beside them
    and each layout's config says which layers have static activations."""
    mlp_modules = modules_of(raw(FIXTURE), MLP)
    amax = tmp_path / "amax.json"
    amax.write_text(json.dumps({m: 3.0 for m in modules_of(raw(FIXTURE), ATTN + MLP)}))
    nv, fp8 = tmp_path / "nv", tmp_path / "fp8"
    ok("quantize", FIXTURE, "-o", nv, "--format", "nvfp4", "--export", "compressed-tensors", "--activation-amax", amax)
    ok("quantize", FIXTURE, "-o", fp8, "--format", "mxfp8", "--export", "compressed-tensors")
    # The MLPs from the W4A4 export, the attention from the MXFP8 one; a config naming only the
    # method (no groups), as the reader needs no more.
    mixed = tmp_path / "mixed"
    os.makedirs(mixed)
    tensors = {k: v for k, v in raw(fp8).items() if k.rsplit(".", 1)[0] not in mlp_modules}
    tensors.update({k: v for k, v in raw(nv).items() if k.rsplit(".", 1)[0] in mlp_modules})
    write_st(mixed / "model.safetensors", tensors)
    config = cfg(nv)
    config["quantization_config"] = {"quant_method": "compressed-tensors"}
    (mixed / "config.json").write_text(json.dumps(config))
    ct, mo = tmp_path / "ct", tmp_path / "mo"
    r = ok("convert", mixed, "-o", ct, "--to", "compressed-tensors")
    assert "dropped" not in r.stdout + r.stderr
    ok("convert", ct, "-o", mo, "--to", "modelopt")
    groups = {g["format"]: g for g in cfg(ct)["quantization_config"]["config_groups"].values()}
    assert groups["nvfp4-pack-quantized"]["input_activations"]["dynamic"] == "local"
    assert groups["mxfp8-quantized"]["input_activations"] is None
    layers = cfg(mo, "hf_quant_config.json")["quantization"]["quantized_layers"]
    assert {m for m, e in layers.items() if e["quant_algo"] == "NVFP4"} == set(mlp_modules)
    assert {e["quant_algo"] for m, e in layers.items() if m not in mlp_modules} == {"MXFP8"}
    got_ct, got_mo = raw(ct), raw(mo)
    for m in mlp_modules:
        assert got_ct[m + ".input_global_scale"] == tensors[m + ".input_global_scale"]
        assert m + ".input_scale" in got_mo
    assert raw(tmp_path / "mixed") == tensors


def test_modelopt_quantized_layers_must_name_the_stored_format(tmp_path):
    mo = tmp_path / "modelopt"
    ok("convert", mixed_mlx(tmp_path, "mxfp8", "nvfp4"), "-o", mo, "--to", "modelopt")
    config = cfg(mo)
    layers = config["quantization_config"]["quantized_layers"]
    fp8 = next(m for m, e in layers.items() if e["quant_algo"] == "MXFP8")
    nv = next(m for m, e in layers.items() if e["quant_algo"] != "MXFP8")
    for edit, module, message in ((lambda q: q.update({fp8: {"quant_algo": "NVFP4", "group_size": 16}}), fp8,
                                   "stored as MXFP8, but config.json's quantization_config.quantized_layers gives"),
                                  (lambda q: q.pop(nv), nv, "does not list it")):
        bad = tmp_path / f"bad-{module}"
        os.makedirs(bad)
        for f in os.listdir(mo):
            with open(mo / f, "rb") as src, open(bad / f, "wb") as dst:
                dst.write(src.read())
        c = json.loads(json.dumps(config))
        edit(c["quantization_config"]["quantized_layers"])
        (bad / "config.json").write_text(json.dumps(c))
        for cmd in (["inspect", bad], ["dequantize", bad, "-o", tmp_path / "dq"]):
            r = run(*cmd)
            assert r.returncode != 0 and f'"{module}"' in r.stderr and message in r.stderr, r.stderr
        assert not os.path.exists(tmp_path / "dq")
