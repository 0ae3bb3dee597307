"""compressed-tensors checkpoints with several config groups through the microscale CLI: FP8
(float-quantized) attention beside NVFP4 (nvfp4-pack-quantized) MLPs, and NVFP4 beside layers the
config's `ignore` keeps in bf16. The `compressed_tensors` package is not installed here, so the
checkpoints are built by hand with numpy and ml_dtypes to its documented layout: per-group
`format`, `targets` matched as it matches them (an exact name before a "re:" pattern before the
class name "Linear"), the top-level format "mixed-precision", and the tensors
<m>.weight F8_E4M3 + <m>.weight_scale (FP8) and <m>.weight_packed / weight_scale /
weight_global_scale / input_global_scale (NVFP4). ml_dtypes is the oracle for every decoded value."""

import json

import numpy as np
import pytest

from ckpt_support import load_all, run, skip_without_cli
from test_quantized_sources import BF16, E4M3, FP4_VALUES, write_dir

skip_without_cli()

H, KV, INTER, VOCAB = 160, 64, 288, 48
SHAPES = {"self_attn.q_proj": (H, H), "self_attn.k_proj": (KV, H), "self_attn.v_proj": (KV, H),
          "self_attn.o_proj": (H, H), "mlp.gate_proj": (INTER, H), "mlp.up_proj": (INTER, H),
          "mlp.down_proj": (H, INTER)}
GS = np.float32(512.0)  # the NVFP4 global scale (2688/amax): a power of two keeps every product exact

# The FP8 groups, one per scale strategy, with precedence at work: layer 0's q/k/v by pattern,
# its o_proj by exact name, layer 1's attention by another pattern; every other Linear (the
# MLPs) by class name into the NVFP4 group; lm_head ignored.
FP8_GROUPS = {
    "group_0": ("channel", None, [r"re:model\.layers\.0\.self_attn\.[qkv]_proj$"]),
    "group_1": ("block", [128, 128], ["model.layers.0.self_attn.o_proj"]),
    "group_2": ("tensor", None, [r"re:model\.layers\.1\.self_attn\..*"]),
}


def fp8_args(strategy, block):
    return {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False,
            "group_size": None, "block_structure": block, "observer": "minmax", "actorder": None}


def nvfp4_group(targets):
    args = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
            "dynamic": False, "observer": "static_minmax", "scale_dtype": "torch.float8_e4m3fn"}
    return {"format": "nvfp4-pack-quantized", "targets": targets, "weights": args,
            "input_activations": {**args, "dynamic": "local"}, "output_activations": None}


def quantization_config(groups, ignore):
    return {"quant_method": "compressed-tensors", "format": "mixed-precision", "quantization_status": "compressed",
            "config_groups": groups, "ignore": ignore, "kv_cache_scheme": None, "global_compression_ratio": None,
            "sparsity_config": {}, "transform_config": {}, "version": "0.12.2"}


def nvfp4_layer(m, shape, rng, tensors, oracle):
    n, k = shape
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    scales = rng.choice(np.array([0.25, 0.5, 1.0, 1.5, 3.0, 6.0, 13.0, 448.0], np.float32), size=(n, k // 16))
    scales = scales.astype(E4M3)
    tensors[m + ".weight_packed"] = codes[:, 0::2] | (codes[:, 1::2] << 4)  # element 2j in the low nibble
    tensors[m + ".weight_scale"] = scales
    tensors[m + ".weight_global_scale"] = np.array([GS], np.float32)
    tensors[m + ".input_global_scale"] = np.array([GS * 2], np.float32)
    oracle[m + ".weight"] = FP4_VALUES[codes] * (np.repeat(scales.astype(np.float32), 16, 1) / GS)


def mxfp4_layer(m, shape, rng, tensors, oracle):
    n, k = shape
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    exps = rng.integers(120, 131, size=(n, k // 32), dtype=np.uint8)  # E8M0: 2^(e - 127)
    tensors[m + ".weight_packed"] = codes[:, 0::2] | (codes[:, 1::2] << 4)
    tensors[m + ".weight_scale"] = exps
    oracle[m + ".weight"] = FP4_VALUES[codes] * np.repeat(np.exp2(exps.astype(np.float32) - 127), 32, 1)


def fp8_layer(m, shape, strategy, block, rng, tensors, oracle):
    w = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    w[:, :5] *= 20
    n, k = shape
    if strategy == "channel":
        s = (np.abs(w).max(1, keepdims=True) / 448).astype(BF16)
        full = np.broadcast_to(s.astype(np.float32), shape)
    elif strategy == "tensor":
        s = (np.abs(w).max() / 448).reshape(1).astype(np.float32)
        full = np.full(shape, s[0], np.float32)
    else:
        br, bc = block
        s = np.array([[np.abs(w[i:i + br, j:j + bc]).max() / 448 for j in range(0, k, bc)]
                      for i in range(0, n, br)], np.float32)
        full = np.repeat(np.repeat(s, br, 0), bc, 1)[:n, :k]
    q = np.clip(w / full, -448, 448).astype(E4M3)
    tensors[m + ".weight"], tensors[m + ".weight_scale"] = q, s
    if strategy == "tensor":
        tensors[m + ".input_scale"] = np.array([0.03], np.float32)  # static activations
    oracle[m + ".weight"] = q.astype(np.float32) * full  # one float32 multiplication


def plain(rng):
    return {"model.embed_tokens.weight": (rng.standard_normal((VOCAB, H)) * 0.02).astype(BF16),
            "model.norm.weight": np.ones(H, BF16),
            "lm_head.weight": (rng.standard_normal((VOCAB, H)) * 0.02).astype(BF16)}


def mxfp4_group(targets):
    args = {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": True,
            "dynamic": False, "scale_dtype": "torch.uint8"}
    return {"format": "mxfp4-pack-quantized", "targets": targets, "weights": args, "input_activations": None,
            "output_activations": None}


def make_fp8_nvfp4(d, fp4="nvfp4"):
    """FP8 attention (three groups) + NVFP4 (or MXFP4) MLPs; returns the tensors and the float32 oracle."""
    rng = np.random.default_rng(0)
    tensors, oracle = plain(rng), {}
    for layer in range(2):
        for proj, shape in SHAPES.items():
            m = f"model.layers.{layer}.{proj}"
            if proj.startswith("mlp"):
                (nvfp4_layer if fp4 == "nvfp4" else mxfp4_layer)(m, shape, rng, tensors, oracle)
            else:
                group = ("group_2" if layer == 1 else "group_1" if proj.endswith("o_proj") else "group_0")
                strategy, block, _ = FP8_GROUPS[group]
                fp8_layer(m, shape, strategy, block, rng, tensors, oracle)
    groups = {g: {"format": "float-quantized", "targets": targets, "weights": fp8_args(strategy, block),
                  "input_activations": None, "output_activations": None}
              for g, (strategy, block, targets) in FP8_GROUPS.items()}
    groups["group_3"] = (nvfp4_group if fp4 == "nvfp4" else mxfp4_group)(["Linear"])
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "quantization_config": quantization_config(groups, ["lm_head"])}
    write_dir(d, tensors, config)
    return tensors, oracle, config


def make_nvfp4_kept(d):
    """NVFP4 MLPs; attention and lm_head kept in bf16 through `ignore`."""
    rng = np.random.default_rng(1)
    tensors, oracle = plain(rng), {}
    for layer in range(2):
        for proj, shape in SHAPES.items():
            m = f"model.layers.{layer}.{proj}"
            if proj.startswith("mlp"):
                nvfp4_layer(m, shape, rng, tensors, oracle)
            else:
                tensors[m + ".weight"] = (rng.standard_normal(shape) * 0.02).astype(BF16)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "quantization_config": quantization_config({"group_0": nvfp4_group(["Linear"])},
                                                         ["lm_head", r"re:.*self_attn.*"])}
    config["quantization_config"]["format"] = "nvfp4-pack-quantized"
    write_dir(d, tensors, config)
    return tensors, oracle, config


def row(stdout, name):
    return next(line for line in stdout.splitlines() if line.startswith(name + " "))


def test_fp8_nvfp4_inspect(tmp_path):
    make_fp8_nvfp4(tmp_path)
    out = run("inspect", tmp_path)
    assert out.returncode == 0, out.stderr
    s = out.stdout
    assert "config group \"group_0\" (float-quantized): 3 fp8 layers" in s, s
    assert "config group \"group_1\" (float-quantized): 1 fp8 layers" in s, s
    assert "config group \"group_2\" (float-quantized): 4 fp8 layers" in s, s
    assert "config group \"group_3\" (nvfp4-pack-quantized): 6 nvfp4 layers" in s, s
    q = row(s, "model.layers.0.self_attn.q_proj.weight")
    assert "per output channel" in q and "group_0" in q, q
    assert "per 128x128 block" in row(s, "model.layers.0.self_attn.o_proj.weight")
    assert "per tensor" in row(s, "model.layers.1.self_attn.k_proj.weight")
    up = row(s, "model.layers.1.mlp.up_proj.weight_packed")
    assert "nvfp4 packed" in up and "group_3" in up, up


@pytest.mark.parametrize("fp4", ["nvfp4", "mxfp4"])
def test_fp8_fp4_dequantize(tmp_path, fp4):
    src, out = tmp_path / "src", tmp_path / "dq"
    tensors, oracle, _ = make_fp8_nvfp4(src, fp4)
    r = run("dequantize", src, "-o", out)
    assert r.returncode == 0, r.stderr
    got = load_all(str(out))
    assert set(got) == set(oracle) | {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for name, want in oracle.items():
        assert got[name].dtype == BF16, name
        assert np.array_equal(got[name].view(np.uint16), want.astype(BF16).view(np.uint16)), name
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg


@pytest.mark.parametrize("fp4", ["nvfp4", "mxfp4"])
def test_fp8_fp4_convert_to_compressed_tensors_keeps_every_byte(tmp_path, fp4):
    src, out = tmp_path / "src", tmp_path / "ct"
    tensors, _, config = make_fp8_nvfp4(src, fp4)
    r = run("convert", src, "-o", out, "--to", "compressed-tensors")
    assert r.returncode == 0, r.stderr
    got = load_all(str(out))
    assert set(got) == set(tensors)
    for name, a in tensors.items():
        assert got[name].dtype.itemsize == a.dtype.itemsize and got[name].shape == a.shape, name
        assert got[name].tobytes() == np.ascontiguousarray(a).tobytes(), name
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    want = config["quantization_config"]["config_groups"]
    for g in FP8_GROUPS:
        assert qc["config_groups"][g] == want[g], g
    assert qc["config_groups"]["group_3"]["format"] == f"{fp4}-pack-quantized"
    assert qc["config_groups"]["group_3"]["targets"] == ["Linear"]
    assert qc["format"] == "mixed-precision"
    # The output reads back with the same groups.
    again = run("inspect", out)
    assert again.returncode == 0, again.stderr
    assert "config group \"group_2\" (float-quantized): 4 fp8 layers" in again.stdout
    assert f"config group \"group_3\" ({fp4}-pack-quantized): 6 {fp4} layers" in again.stdout


# MLX's nvfp4 is two-level: it takes compressed-tensors' MXFP4 bytes, not its three-level NVFP4.
@pytest.mark.parametrize("to,fp4", [("modelopt", "nvfp4"), ("mlx", "mxfp4")])
def test_fp8_fp4_convert_to_layouts_without_fp8_writes_floats(tmp_path, to, fp4):
    src, out = tmp_path / "src", tmp_path / to
    tensors, oracle, _ = make_fp8_nvfp4(src, fp4)
    r = run("convert", src, "-o", out, "--to", to)
    assert r.returncode == 0, r.stderr
    got = load_all(str(out))
    # Each FP8 weight is reported with its group: "kept 6 weights (FP8 group group_0: mlx has ...): a, b".
    kept = {}
    for line in r.stdout.splitlines():
        if line.startswith("kept "):
            why, names = line.split(" (", 1)[1].rsplit("): ", 1)
            kept.update({n: why for n in names.split(", ")})
    for name, want in oracle.items():
        m = name[: -len(".weight")]
        if "self_attn" in name:
            assert np.array_equal(got[name].view(np.uint16), want.astype(BF16).view(np.uint16)), name
            assert m + ".weight_scale" not in got and m + ".input_scale" not in got
            group = "group_2" if ".layers.1." in name else "group_1" if "o_proj" in name else "group_0"
            assert kept[name] == f"FP8 group {group}: {to} has no FP8 form here", r.stdout
        else:
            assert name not in kept and got[name].dtype in (np.uint8, np.uint32), name  # packed FP4 codes
    assert len(kept) == 8, r.stdout
    if to == "modelopt":
        hf = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
        assert "model.layers.0.self_attn.q_proj" in hf["exclude_modules"], hf


def test_nvfp4_kept_bf16(tmp_path):
    src = tmp_path / "src"
    tensors, oracle, _ = make_nvfp4_kept(src)
    s = run("inspect", src).stdout
    assert "config group \"group_0\" (nvfp4-pack-quantized): 6 nvfp4 layers" in s, s
    assert "9 weights kept in high precision by the config's ignore list" in s, s

    r = run("dequantize", src, "-o", tmp_path / "dq")
    assert r.returncode == 0, r.stderr
    got = load_all(str(tmp_path / "dq"))
    for name, want in oracle.items():
        assert np.array_equal(got[name].view(np.uint16), want.astype(BF16).view(np.uint16)), name
    for name, a in tensors.items():
        if name.endswith(".weight"):
            assert got[name].tobytes() == a.tobytes(), name

    r = run("convert", src, "-o", tmp_path / "ct", "--to", "compressed-tensors")
    assert r.returncode == 0, r.stderr
    got = load_all(str(tmp_path / "ct"))
    assert set(got) == set(tensors)
    for name, a in tensors.items():
        assert got[name].tobytes() == a.tobytes(), name
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert list(qc["config_groups"]) == ["group_0"] and qc["format"] == "nvfp4-pack-quantized"
    assert "model.layers.1.self_attn.v_proj" in qc["ignore"] and "lm_head" in qc["ignore"]


def conflicting(tmp_path, edit):
    src = tmp_path / "src"
    tensors, _, config = make_fp8_nvfp4(src)
    edit(config["quantization_config"])
    write_dir(src, tensors, config)
    return src


@pytest.mark.parametrize("cmd", [["inspect"], ["dequantize", "-o", "OUT"], ["convert", "-o", "OUT", "--to", "ct"]])
def test_two_groups_claiming_a_tensor_are_refused(tmp_path, cmd):
    # group_0's pattern now also matches layer 1's q/k/v, which group_2's pattern claims.
    src = conflicting(tmp_path, lambda qc: qc["config_groups"]["group_0"].update(
        targets=[r"re:model\.layers\.\d\.self_attn\.[qkv]_proj$"]))
    r = run(*[tmp_path / "out" if a == "OUT" else a for a in cmd[:1] + [src] + cmd[1:]])
    assert r.returncode != 0
    assert "model.layers.1.self_attn.q_proj.weight" in r.stderr and "\"group_0\"" in r.stderr and \
        "\"group_2\"" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_two_class_targets_are_refused(tmp_path):
    src = conflicting(tmp_path, lambda qc: qc["config_groups"]["group_2"].update(targets=["Linear"]))
    r = run("inspect", src)
    assert r.returncode != 0
    assert "model.layers.1." in r.stderr and "\"group_2\" (target \"Linear\")" in r.stderr and \
        "\"group_3\" (target \"Linear\")" in r.stderr, r.stderr


def test_fp8_weight_in_an_nvfp4_group_is_refused(tmp_path):
    src = conflicting(tmp_path, lambda qc: qc["config_groups"]["group_3"].update(
        targets=["Linear", "model.layers.0.self_attn.o_proj"]))  # group_1's exact name too: a tie
    r = run("inspect", src)
    assert r.returncode != 0 and "model.layers.0.self_attn.o_proj.weight" in r.stderr, r.stderr
    src = conflicting(tmp_path, lambda qc: qc["config_groups"]["group_2"].update(
        targets=[r"re:model\.layers\.1\.self_attn\..*", r"re:model\.layers\.1\.mlp\.up_proj"]))
    r = run("dequantize", src, "-o", tmp_path / "out")
    assert r.returncode != 0
    assert "model.layers.1.mlp.up_proj.weight_packed" in r.stderr and "\"group_2\"" in r.stderr and \
        "float-quantized" in r.stderr, r.stderr
    src = conflicting(tmp_path, lambda qc: qc["config_groups"]["group_3"].update(
        targets=["Linear", r"re:model\.layers\.0\.self_attn\.k_proj"]))  # a pattern ties with group_0's
    r = run("dequantize", src, "-o", tmp_path / "out")
    assert r.returncode != 0 and "model.layers.0.self_attn.k_proj.weight" in r.stderr, r.stderr
    src = conflicting(tmp_path, lambda qc: qc["config_groups"]["group_0"].update(format="nvfp4-pack-quantized"))
    r = run("inspect", src)
    assert r.returncode != 0
    assert "model.layers.0.self_attn.q_proj.weight" in r.stderr and "\"group_0\"" in r.stderr and \
        "nvfp4-pack-quantized" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_fp8_scale_shape_follows_its_group(tmp_path):
    # group_0 (per channel) said per tensor: q_proj's [160, 1] scales no longer fit it, though
    # another group's strategy would take them.
    src = conflicting(tmp_path, lambda qc: qc["config_groups"]["group_0"]["weights"].update(strategy="tensor"))
    r = run("inspect", src)
    assert r.returncode != 0
    assert "model.layers.0.self_attn.q_proj.weight_scale" in r.stderr and "[160, 1]" in r.stderr, r.stderr
