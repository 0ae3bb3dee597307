"""The configs `microscale quantize` writes, field by field against the forms the ecosystems' own
exporters write (issue 13, item 4):

- compressed-tensors: the `quantization_config` llm-compressor 0.14 (compressed-tensors 0.19.0)
  writes for its NVFP4A16 / NVFP4 / MXFP4A16 presets after a data-free `oneshot`;
- ModelOpt: `hf_quant_config.json` as ModelOpt 0.47's `get_quant_config` builds it, and config.json's
  `quantization_config` as its `convert_hf_quant_config_format` converts that file (what
  `export_hf_checkpoint` writes), with microscale's own producer version.

The expected dicts below are written out by hand from those exporters' outputs (docs/checkpoints.md
gives the same forms); scripts/ecosystem_check.py also parses our configs with the ecosystems' own
parsers. Uses the command built in build/ or $MICROSCALE_CLI; skipped without one.
"""

import json
import os
import re
import subprocess

import pytest

from ckpt_support import CLI, ROOT, header, skip_without_cli

skip_without_cli()

LLAMA = os.path.join(ROOT, "tests", "fixtures", "llama")
PRODUCER_VERSION = re.compile(r"microscale-\d+\.\d+\.\d+")


def projections(fixture):
    names = header(os.path.join(fixture, "model.safetensors"))
    return sorted(n[: -len(".weight")] for n in names if n.endswith("_proj.weight"))


def quantize(tmp_path, fixture, fmt, export, w4a4=False):
    out = tmp_path / f"{fmt}-{export}-{'w4a4' if w4a4 else 'w4a16'}"
    args = [CLI, "quantize", fixture, "-o", str(out), "--format", fmt, "--export", export]
    if w4a4:
        amax = tmp_path / "amax.json"
        amax.write_text(json.dumps({m: 3.5 for m in projections(fixture)}))
        args += ["--activation-amax", str(amax), "--w4a4"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def load(path):
    with open(path) as f:
        return json.load(f)


def ct_args(nv, dynamic, observer):
    """One QuantizationArgs block as compressed-tensors 0.19 serializes it (llm-compressor 0.14)."""
    return {"actorder": None, "block_structure": None, "dynamic": dynamic, "group_size": 16 if nv else 32,
            "num_bits": 4, "observer": observer, "observer_kwargs": {},
            "scale_dtype": "torch.float8_e4m3fn" if nv else "torch.uint8",
            "strategy": "tensor_group" if nv else "group", "symmetric": True, "type": "float", "zp_dtype": None}


def ct_config(nv, w4a4):
    fmt = "nvfp4-pack-quantized" if nv else "mxfp4-pack-quantized"
    return {
        "config_groups": {"group_0": {
            "format": fmt,
            "input_activations": ct_args(nv, "local", "static_minmax") if w4a4 else None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": ct_args(nv, False, "memoryless_minmax")}},
        "format": fmt,
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": "0.19.0",
    }


@pytest.mark.parametrize("fmt,w4a4", [("nvfp4", False), ("nvfp4", True), ("mxfp4", False)],
                         ids=["nvfp4a16", "nvfp4-w4a4", "mxfp4a16"])
def test_compressed_tensors_config_is_llm_compressors(tmp_path, fmt, w4a4):
    q = load(quantize(tmp_path, LLAMA, fmt, "compressed-tensors", w4a4) / "config.json")["quantization_config"]
    want = ct_config(fmt == "nvfp4", w4a4)
    assert sorted(q) == sorted(want)
    for field in want:
        assert q[field] == want[field], field


def modelopt_group(w4a4):
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    group = {"input_activations": fp4} if w4a4 else {}
    return {**group, "weights": fp4, "targets": ["Linear"]}


@pytest.mark.parametrize("w4a4", [False, True], ids=["w4a16", "w4a4"])
def test_modelopt_configs_are_modelopts(tmp_path, w4a4):
    out = quantize(tmp_path, LLAMA, "nvfp4", "modelopt", w4a4)
    algo = "NVFP4" if w4a4 else "W4A16_NVFP4"

    hf = load(out / "hf_quant_config.json")
    assert list(hf) == ["producer", "quantization"]
    assert hf["producer"]["name"] == "modelopt"
    assert PRODUCER_VERSION.fullmatch(hf["producer"]["version"])
    # ModelOpt lists the embedding too (it attaches a disabled quantizer to it), sorted.
    excluded = ["lm_head", "model.embed_tokens"]
    assert hf["quantization"] == {"quant_algo": algo, "kv_cache_quant_algo": None, "group_size": 16,
                                  "exclude_modules": excluded}

    # convert_hf_quant_config_format's output: no group_size / exclude_modules / kv_cache keys at the
    # top level (kv_cache_scheme only when the KV cache is quantized).
    q = load(out / "config.json")["quantization_config"]
    assert q == {"config_groups": {"group_0": modelopt_group(w4a4)}, "ignore": excluded, "quant_algo": algo,
                 "producer": hf["producer"], "quant_method": "modelopt"}


@pytest.mark.parametrize("arch", ["gemma2", "qwen3_moe"])
def test_modelopt_exclude_modules_are_sorted(tmp_path, arch):
    # ModelOpt sorts exclude_modules. gemma2 ties its lm_head (listed although it has no weight),
    # qwen3_moe has routers; both have an embedding.
    fixture = os.path.join(ROOT, "tests", "fixtures", arch)
    out = quantize(tmp_path, fixture, "nvfp4", "modelopt")
    excluded = load(out / "hf_quant_config.json")["quantization"]["exclude_modules"]
    names = header(os.path.join(fixture, "model.safetensors"))
    kept = {n[: -len(".weight")] for n in names if n.endswith(("mlp.gate.weight", "embed_tokens.weight"))}
    assert "model.embed_tokens" in kept
    assert excluded == sorted(["lm_head", *kept])
    assert load(out / "config.json")["quantization_config"]["ignore"] == excluded
