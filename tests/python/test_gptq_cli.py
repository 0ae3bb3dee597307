"""`microscale quantize --hessians FILE`: GPTQ for the layers the file covers (bytes equal to
microscale.gptq's), round to nearest for the others, the choice recorded in the config's producer
block and shown by `inspect`, and the file's mistakes refused. Uses the CLI the other checkpoint
tests use (build/src/cli/microscale or $MICROSCALE_CLI)."""

import json
import os
import re
import subprocess

import numpy as np
import pytest

import microscale
from ckpt_support import CLI, ROOT, load_all, make_tensors, skip_without_cli, write_model

pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402

skip_without_cli()
if "--hessians" not in subprocess.run([CLI, "quantize", "--help"], capture_output=True, text=True).stdout:
    pytest.skip(f"{CLI} predates --hessians: rebuild it", allow_module_level=True)

Q = "model.layers.0.self_attn.q_proj"
DOWN = "model.layers.0.mlp.down_proj"
K_PROJ = "model.layers.0.self_attn.k_proj"


def run(*args, ok=True):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, errors="replace", timeout=300)
    if ok:
        assert r.returncode == 0, f"{args}: {r.stderr}"
    return r


def hessian(rng, k):
    x = (rng.standard_normal((512, k)) @ (rng.standard_normal((k, k)) / np.sqrt(k))).astype(np.float32)
    return microscale.accumulate_hessian(x)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    t = make_tensors(layers=1)
    write_model(str(d), t, shards=1)
    rng = np.random.default_rng(0)
    # One by module name (float64), one by weight name (float32).
    hs = {Q: hessian(rng, 128), DOWN + ".weight": hessian(rng, 256).astype(np.float32)}
    path = d / "hessians.safetensors"
    save_file(hs, str(path))
    return d, t, path, hs


def test_hessian_layers_get_gptq_bytes_and_the_rest_round_to_nearest(model, tmp_path):
    src, t, path, hs = model
    out = tmp_path / "out"
    r = run("quantize", src, "-o", out, "--format", "nvfp4", "--separate-fused-scales", "--hessians", path)
    assert "GPTQ for 2 of" in r.stdout
    got = load_all(str(out))
    for module, h in [(Q, hs[Q]), (DOWN, hs[DOWN + ".weight"]), (K_PROJ, None)]:
        w = t[module + ".weight"]
        gs = microscale.global_scale(w)
        if h is None:
            want = microscale.quantize(w, mode="nvfp4", global_scale=gs)
        else:
            want = microscale.gptq(w, h, mode="nvfp4", global_scale=gs)
            assert not np.array_equal(want[0], microscale.quantize(w, mode="nvfp4", global_scale=gs)[0])
        assert np.array_equal(got[module + ".weight_packed"], want[0]), module
        assert np.array_equal(got[module + ".weight_scale"].view(np.uint8), want[1]), module
    cfg = json.loads((out / "config.json").read_text())
    gptq = cfg["quantization_config"]["producer"]["gptq"]
    assert gptq == {"layers": 2, "damp": 0.01, "block_size": 128}
    shown = run("inspect", out).stdout
    assert "gptq" in shown and '"layers":2' in shown


def test_without_hessians_nothing_is_recorded(model, tmp_path):
    src, _, _, _ = model
    out = tmp_path / "out"
    run("quantize", src, "-o", out, "--format", "mxfp4")
    cfg = json.loads((out / "config.json").read_text())
    assert "gptq" not in cfg["quantization_config"].get("producer", {})


def test_affine_mlx_export_with_hessians(model, tmp_path):
    src, t, path, hs = model
    out = tmp_path / "out"
    run("quantize", src, "-o", out, "--format", "affine4", "--hessians", path, "--gptq-damp", "0.05")
    got = load_all(str(out))
    w = t[Q + ".weight"]
    want = microscale.gptq(w, hs[Q], mode="affine", bits=4, group_size=64, damp=0.05)
    assert np.array_equal(got[Q + ".weight"].view(np.uint8).reshape(want[0].shape), want[0])
    assert np.array_equal(got[Q + ".scales"].view(np.uint16), want[1].view(np.uint16))
    assert np.array_equal(got[Q + ".biases"].view(np.uint16), want[2].view(np.uint16))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["producer"]["gptq"]["damp"] == 0.05


@pytest.mark.parametrize("tensors,extra,message", [
    ({"model.layers.0.self_attn.qproj": np.eye(128)}, [], "names no module of this checkpoint"),
    ({Q: np.eye(64)}, [], r"has shape 64x64, expected \[K, K\] = \[128, 128\]"),
    ({Q: np.eye(128, dtype=np.float16)}, [], "expected F32 or F64"),
    ({Q: np.eye(128), Q + ".weight": np.eye(128)}, [], "two Hessians"),
    ({"lm_head": np.eye(128)}, [], "not quantized"),
    ({Q: np.eye(128)}, ["--scale-search", "mse"], "does not combine with --scale-search"),
    ({Q: np.eye(128)}, ["--scale-2d"], "does not combine with --scale-2d"),
    ({Q: -np.eye(128)}, [], "not positive definite"),
])
def test_bad_hessians_are_refused(model, tmp_path, tensors, extra, message):
    src, _, _, _ = model
    path = tmp_path / "h.safetensors"
    save_file(tensors, str(path))
    out = tmp_path / "out"
    r = run("quantize", src, "-o", out, "--format", "nvfp4", "--hessians", path, *extra, ok=False)
    assert r.returncode != 0
    assert re.search(message, r.stderr), r.stderr
    assert not out.exists()


def test_hessian_for_an_expert_that_mlx_stacks_is_refused(tmp_path):
    """The MLX export stacks Qwen3-MoE's per-expert weights into one switch_mlp layer, so a
    per-expert Hessian has no layer to apply to: refused by name, nothing written."""
    src = os.path.join(ROOT, "tests", "fixtures", "qwen3_moe")
    path = tmp_path / "h.safetensors"
    save_file({"model.layers.0.mlp.experts.0.gate_proj": np.eye(64)}, str(path))
    out = tmp_path / "out"
    r = run("quantize", src, "-o", out, "--format", "nvfp4", "--export", "mlx", "--hessians", path, ok=False)
    assert r.returncode != 0
    assert "experts.0.gate_proj" in r.stderr and "inside a stack of experts" in r.stderr, r.stderr
    assert not out.exists()
    # The per-expert export takes the same file.
    run("quantize", src, "-o", tmp_path / "ct", "--format", "nvfp4", "--export", "compressed-tensors",
        "--hessians", path)
