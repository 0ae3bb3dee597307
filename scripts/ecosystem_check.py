#!/usr/bin/env python3
"""The ecosystems' own loaders on microscale's exports of the architecture fixtures (run by
scripts/test-ecosystem.sh, which sets up the virtual environments).

    python scripts/ecosystem_check.py main CLI FIXTURES WORK   # transformers, compressed-tensors, ModelOpt, mlx-lm
    python scripts/ecosystem_check.py llmc CLI FIXTURES WORK   # llm-compressor and the compressed-tensors it pins

For each fixture (GPT-2 is skipped: microscale refuses Conv1D weights):
- compressed-tensors exports (nvfp4, mxfp4): compressed-tensors' QuantizationConfig and
  ModelCompressor accept the config, whose group equals compressed-tensors' preset scheme
  (NVFP4A16, NVFP4, MXFP4A16) but for the observer; transformers' from_pretrained decompresses the export and a
  forward pass gives logits equal, bit for bit, to those of the bf16 model from_pretrained loads
  from `microscale dequantize` of the same export.
- ModelOpt export (nvfp4): ModelOpt's convert_hf_quant_config_format (what its export writes into
  config.json) turns our hf_quant_config.json into exactly our config.json quantization_config.
- Mixed exports (`quantize --layer '*attn.*=mxfp8'`: attention mxfp8, other layers nvfp4): ModelOpt's
  conversion of the MIXED_PRECISION hf_quant_config.json gives our config.json, and
  compressed-tensors matches each module to its config group and decompresses it with that
  group's compressor to exactly microscale's dequantized weight.
- MLX exports (nvfp4, mxfp4, mxfp8, affine4, and the mixed one with its per-module
  quantization entries): mlx-lm's load_model builds the model and
  mx.dequantize of every quantized layer (per expert for switch layers) equals microscale's
  dequantized weight bit for bit.
- llm-compressor (its own venv: it pins older torch, transformers and compressed-tensors): that
  compressed-tensors accepts the configs, and its data-free NVFP4A16 oneshot writes the same
  tensors (names, dtypes, shapes), quantization_config and ignore list as microscale's nvfp4 export.
Prints one line per check: PASS, FAIL, KNOWN where the ecosystem fails the same way on its own
outputs or on the unquantized source, or DIFF where llm-compressor's output differs (the reason
or the differences are printed); exits 1 on any FAIL.
"""

import json
import os
import subprocess
import sys
import traceback
import warnings

import numpy as np

warnings.filterwarnings("ignore")  # transformers' notes on configs and passed quantization_config
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def sh(cli, *args):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"microscale {' '.join(map(str, args))}: {r.stderr.strip()}")


def export(cli, fixture, work, fmt, layout):
    """(quantized dir, dequantized dir) of one export, made once."""
    q = os.path.join(work, f"{fmt}-{layout}")
    d = q + "-dequantized"
    if not os.path.exists(os.path.join(d, "config.json")):
        sh(cli, "quantize", fixture, "-o", q, "--format", fmt, "--export", layout, "--force")
        sh(cli, "dequantize", q, "-o", d, "--force")
    return q, d


def mixed_export(cli, fixture, work, layout):
    """(quantized dir, dequantized dir) of a recipe export: attention mxfp8, the rest nvfp4."""
    q = os.path.join(work, f"mixed-{layout}")
    d = q + "-dequantized"
    if not os.path.exists(os.path.join(d, "config.json")):
        sh(cli, "quantize", fixture, "-o", q, "--format", "nvfp4", "--export", layout, "--layer", "*attn.*=mxfp8",
           "--force")
        sh(cli, "dequantize", q, "-o", d, "--force")
    return q, d


class Skipped(Exception):
    """A check that does not apply to a fixture."""


NP_DTYPES = {"F32": "float32", "F16": "float16", "U8": "uint8", "U32": "uint32", "I64": "int64", "F8_E4M3": "uint8"}


def st_raw(d):
    """{name: (dtype, shape, bytes)} of every tensor of a model directory, read from the files
    (numpy has no bfloat16, and the safetensors versions pinned here differ in what they map)."""
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


def st_load(d):
    """{name: numpy array}, bfloat16 through ml_dtypes."""
    import ml_dtypes

    dt = {**NP_DTYPES, "BF16": ml_dtypes.bfloat16}
    return {k: np.frombuffer(b, dtype=dt[t]).reshape(shape) for k, (t, shape, b) in st_raw(d).items()}


def config(d, name="config.json"):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


class Known(Exception):
    """A failure the ecosystem's own outputs show too (reported, not counted as microscale's)."""


# compressed-tensors' preset scheme that each of our formats writes (llm-compressor's scheme names).
CT_PRESETS = {("nvfp4-pack-quantized", False): "NVFP4A16", ("nvfp4-pack-quantized", True): "NVFP4",
              ("mxfp4-pack-quantized", False): "MXFP4A16"}


def check_ct_config(q):
    """compressed-tensors' QuantizationConfig and ModelCompressor parse the config, and its group is
    compressed-tensors' own preset scheme for the format (NVFP4A16, NVFP4 or MXFP4A16) field for field,
    except the observer, which llm-compressor fills in when it calibrates, and a symmetric scheme's
    zero-point dtype."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from transformers.utils.quantization_config import CompressedTensorsConfig

    qc = config(q)["quantization_config"]
    parsed = QuantizationConfig.model_validate(qc)
    assert ModelCompressor.from_compression_config(CompressedTensorsConfig.from_dict(qc)) is not None
    assert sorted(parsed.ignore) == sorted(qc["ignore"])
    got = parsed.config_groups["group_0"]
    preset = CT_PRESETS[(parsed.format, got.input_activations is not None)]
    want = preset_name_to_scheme(preset, ["Linear"])
    assert got.targets == want.targets
    for part in ("weights", "input_activations", "output_activations"):
        w, g = getattr(want, part), getattr(got, part)
        assert (w is None) == (g is None), part
        if w is not None:
            # Symmetric schemes have no zero point: compressed-tensors serializes zp_dtype as null and
            # fills in a default when it parses, so only the other fields can be compared.
            unchecked = {"observer": g.observer, **({"zp_dtype": g.zp_dtype} if g.symmetric else {})}
            assert w.model_copy(update=unchecked) == g, f"{part}: ours {g}, preset {preset} {w}"
    return f"QuantizationConfig and ModelCompressor accept it (format {parsed.format}, preset {preset})"


def bf16_ulps(a, b):
    """Largest distance in bf16 steps between two bf16 tensors (sign-magnitude to ordered ints)."""
    import torch

    def ordered(x):
        i = x.view(torch.int16).to(torch.int32) & 0xFFFF
        return torch.where(i >= 0x8000, 0x8000 - i, i)

    return int((ordered(a) - ordered(b)).abs().max()) if a.numel() else 0


def check_transformers(fixture, q, d):
    """compressed-tensors decodes nvfp4 as q * (sf / gs) in float32, microscale as
    q * ((sf * amax) * (1/2688)) with amax = 2688 / gs (docs/numerics.md 2.1): the two float32
    scales can differ in the last bit, which moves a few bf16 weights by one ulp. So: every weight
    transformers decompresses equals microscale's dequantized one bit for bit (mxfp4) or within one
    bf16 ulp (nvfp4), and the logits are equal bit for bit whenever all weights are."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    vocab = config(fixture)["vocab_size"]
    ids = torch.tensor([[(7 * i + 3) % vocab for i in range(16)]])
    nvfp4 = config(q)["quantization_config"]["format"].startswith("nvfp4")
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
        dec = AutoModelForCausalLM.from_pretrained(q, dtype=torch.bfloat16,
                                                   quantization_config=CompressedTensorsConfig(run_compressed=False))
        want, got = ref.state_dict(), dec.state_dict()
        worst, experts = 0, []
        for k, w in want.items():
            assert k in got, f"transformers' decompressed model has no {k}"
            ulps = bf16_ulps(got[k], w)
            if ulps and w.ndim == 3 and ".experts." in k:
                experts.append(k)  # fused 3-D experts built from per-expert Linears: see below
                continue
            assert ulps <= (1 if nvfp4 else 0), f"{k}: decompressed weight differs by {ulps} bf16 ulps"
            worst = max(worst, ulps)
        a = AutoModelForCausalLM.from_pretrained(q, dtype=torch.bfloat16).eval()(ids).logits
        b = ref(ids).logits
    diff = (a.float() - b.float()).abs().max().item()
    if experts:
        raise Known(f"transformers fuses the per-expert nvfp4 Linears into 3-D experts without their global scale "
                    f"({experts[0]} off by up to x2688; llm-compressor's own NVFP4A16 export loads the same way); "
                    f"other weights within {worst} ulp")
    if worst == 0:
        assert torch.equal(a, b), f"weights equal but logits differ by {diff:g}"
        return f"weights and logits {tuple(a.shape)} equal bit for bit"
    return f"weights within 1 bf16 ulp (decode order), logits max |diff| {diff:.3g}"


def check_modelopt_config(q):
    """ModelOpt's convert_hf_quant_config_format, which its own export uses to write config.json,
    makes exactly our config.json quantization_config from our hf_quant_config.json."""
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

    ours = config(q)["quantization_config"]
    conv = convert_hf_quant_config_format(config(q, "hf_quant_config.json"))
    assert "config_groups" in conv, f"quant_algo {ours.get('quant_algo')} not recognised"
    assert conv == ours, f"ModelOpt's conversion {conv}, ours {ours}"
    return f"convert_hf_quant_config_format gives our config.json form ({conv['quant_algo']}, ignore {len(conv['ignore'])})"


def check_ct_mixed(q, d):
    """compressed-tensors' own module matching (apply_quantization_config) and each group's
    compressor give every quantized weight of the mixed export equal, bit for bit, to microscale's
    dequantized one, and transformers' from_pretrained gives the dequantized model's logits."""
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    qc = config(q)["quantization_config"]
    parsed = QuantizationConfig.model_validate(qc)
    assert parsed.format == "mixed-precision", parsed.format
    tensors = {}
    for f in sorted(os.listdir(q)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(q, f)))
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
        targets = {m for g in qc["config_groups"].values() for m in g["targets"]}
        missing = targets - {name for name, _ in model.named_modules()}
        if missing:
            import transformers

            raise Known(f"transformers {transformers.__version__} builds no module for {len(missing)} of the "
                        f"targets (e.g. {min(missing)}: its MoE experts are fused), so compressed-tensors "
                        "cannot match them")
        apply_quantization_config(model, parsed, show_progress=False)
        formats = {}
        for name, module in model.named_modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None or scheme.weights is None:
                continue
            local = {k[len(name) + 1:]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == name}
            w = BaseCompressor.get_value_from_registry(scheme.format).decompress(local, scheme)["weight"]
            want = ref.get_submodule(name).weight
            assert torch.equal(w.to(torch.bfloat16).view(torch.int16), want.view(torch.int16)), name
            formats[name] = scheme.format
    want = {m: g["format"] for g in qc["config_groups"].values() for m in g["targets"]}
    assert formats == want, "compressed-tensors matched other modules than the groups' targets name"
    # transformers' own load (compressed-tensors decompressing each group's layers) runs the same
    # forward pass as the dequantized model.
    ids = torch.tensor([[(7 * i + 3) % 100 for i in range(16)]])
    with torch.no_grad():
        loaded = AutoModelForCausalLM.from_pretrained(q, dtype=torch.bfloat16)
        assert torch.equal(loaded(ids).logits, ref(ids).logits), "from_pretrained's logits differ"
    counts = {f: sum(v == f for v in formats.values()) for f in sorted(set(formats.values()))}
    return f"{len(formats)} layers decompressed equal to microscale's ({counts}); from_pretrained's logits equal"


# mlx-lm's switch_mlp projection names for the per-expert names of the checkpoints (Mixtral's w1/w2/w3).
EXPERT_NAMES = {"gate_proj": ("gate_proj", "w1"), "down_proj": ("down_proj", "w2"), "up_proj": ("up_proj", "w3")}


def check_mlx(fixture, q, d):
    import ml_dtypes
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model
    from pathlib import Path

    try:
        model, _ = load_model(Path(q))
    except Exception as e:
        try:
            load_model(Path(fixture))
        except Exception:
            raise Known(f"mlx-lm cannot load the bf16 source either: {type(e).__name__}: {e}".splitlines()[0][:200])
        if "biases" in str(e) and "kv_b_proj" in str(e):
            raise Known("mlx-lm's deepseek_v3 sanitize re-quantizes kv_b_proj assuming affine (it pops "
                        "kv_b_proj.biases), so only affine MLA loads")
        raise
    ours = st_load(d)
    modules = dict(tree_flatten(model.leaf_modules(), is_leaf=lambda m: isinstance(m, nn.Module)))
    checked = worst = 0
    for path, m in modules.items():
        # mlx-lm's deepseek_v3 splits kv_b_proj per head and quantizes the halves itself.
        if not hasattr(m, "scales") or path.endswith((".embed_q", ".unembed_out")):
            continue
        w = mx.dequantize(m["weight"], m["scales"], m.get("biases"), group_size=m.group_size, bits=m.bits,
                          mode=m.mode)
        got = np.array(w.astype(mx.float32)).astype(ml_dtypes.bfloat16)
        if got.ndim == 2:
            pairs = [(path, got, None)]
        elif path.endswith((".experts.gate_proj", ".experts.up_proj", ".experts.down_proj")):
            # gpt-oss: microscale dequantizes back to transformers' [experts, in, out] stacks, gate
            # the even columns of gate_up_proj and up the odd ones.
            parent, proj = path.rpartition(".")[0], path.rpartition(".")[2]
            stack = parent + (".down_proj" if proj == "down_proj" else ".gate_up_proj")
            assert stack in ours, f"mlx-lm layer {path}: no {stack} in microscale's output"
            col = {"gate_proj": slice(0, None, 2), "up_proj": slice(1, None, 2)}.get(proj, slice(None))
            ours[path + ".weight"] = np.ascontiguousarray(ours[stack][..., col].transpose(0, 2, 1))
            pairs = [(path, got, None)]
        else:  # a switch layer: [experts, N, K] from the per-expert weights
            assert ".switch_mlp." in path, f"mlx-lm layer {path}: {got.ndim}-D and not a switch layer"
            parent, proj = path.rpartition(".switch_mlp.")[0], path.rpartition(".")[2]
            pairs = []
            for e in range(got.shape[0]):
                names = [f"{parent}.experts.{e}.{p}" for p in EXPERT_NAMES.get(proj, (proj,))]
                pairs.append((next((n for n in names if n + ".weight" in ours), names[0]), got[e], e))
        for name, value, e in pairs:
            assert name + ".weight" in ours, f"mlx-lm layer {path}: no {name}.weight in microscale's output"
            want = ours[name + ".weight"]
            assert value.shape == want.shape, (name, value.shape, want.shape)
            ulps = np_ulps(value, want)
            if ulps and m.mode == "affine":
                # MLX rounds q*s to bf16 before adding the bias, microscale rounds once
                # (docs/mlx-differences.md, section 5): apart by at most half an ulp of q*s plus
                # one ulp of the result, and |q*s| <= |result| + |bias|.
                bias = np.array(m["biases"].astype(mx.float32))
                bias = np.repeat(bias, m.group_size, axis=-1)[e] if got.ndim == 3 else np.repeat(bias, m.group_size, -1)
                res = np.abs(want.astype(np.float32))
                tol = 0.5 * bf16_ulp(res + np.abs(bias)) + bf16_ulp(res)
                over = np.abs(value.astype(np.float32) - want.astype(np.float32)) > tol
                assert not over.any(), f"{name}: mx.dequantize differs from microscale's beyond the affine bound"
                ulps = 1
            assert ulps == 0 or m.mode == "affine", f"{name}: mx.dequantize differs from microscale's by {ulps} bf16 ulps"
            worst = max(worst, ulps)
            checked += 1
    assert checked, "mlx-lm loaded no quantized layer"
    return f"load_model, mx.dequantize {'equal bit for bit' if worst == 0 else 'within the affine bound'} on {checked} weights"


def bf16_ulp(x):
    """The bf16 ulp at |x| (normal range; 8 significand bits)."""
    return np.exp2(np.floor(np.log2(np.maximum(x, np.float32(2.0**-126)))) - 7).astype(np.float32)


def np_ulps(a, b):
    """bf16_ulps for numpy bfloat16 arrays."""
    import torch

    return bf16_ulps(torch.from_numpy(a.view(np.int16)).view(torch.bfloat16),
                     torch.from_numpy(b.view(np.int16)).view(torch.bfloat16))


def check_llmcompressor(fixture, q, work):
    """llm-compressor's data-free NVFP4A16 oneshot on the same fixture, with the ignore list its
    MoE examples use (lm_head, the routers): the same tensors (names, dtypes, shapes), the same
    quantization_config field for field and the same ignore list as microscale's nvfp4
    compressed-tensors export."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    out = os.path.join(work, "llmcompressor-nvfp4a16")
    if not os.path.exists(os.path.join(out, "config.json")):
        model = AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.bfloat16)
        recipe = QuantizationModifier(targets="Linear", scheme="NVFP4A16",
                                      ignore=["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$", "re:.*router$"])
        oneshot(model=model, recipe=recipe)
        model.save_pretrained(out, save_compressed=True)
    a, b = st_raw(q), st_raw(out)
    ig = [sorted(config(d)["quantization_config"]["ignore"]) for d in (q, out)]
    diffs = []
    if set(a) != set(b):
        only = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        diffs.append(f"only ours: {len(only[0])} (e.g. {only[0][:2]}), only llm-compressor's: {len(only[1])} "
                     f"(e.g. {only[1][:2]})")
    typed = [k for k in set(a) & set(b) if a[k][:2] != b[k][:2]]
    if typed:
        diffs.append("dtype/shape: " + ", ".join(f"{k} ours {a[k][0]} theirs {b[k][0]}" for k in sorted(typed)[:3]))
    if ig[0] != ig[1]:
        diffs.append(f"ignore lists: ours {ig[0]}, llm-compressor's {ig[1]}")
    qa, qb = (dict(config(d)["quantization_config"], ignore=None) for d in (q, out))
    if qa != qb:
        fields = sorted(k for k in set(qa) | set(qb) if qa.get(k) != qb.get(k))
        diffs.append(f"quantization_config fields {fields}: ours {[qa.get(k) for k in fields]}, "
                     f"llm-compressor's {[qb.get(k) for k in fields]}")
    if diffs:
        raise Differs("; ".join(diffs))
    same = sum(a[k][2] == b[k][2] for k in a)
    return f"same {len(a)} tensors (names, dtypes, shapes), quantization_config and ignore list; {same} byte-identical"


class Differs(Exception):
    """A comparison with another tool's output that found differences (reported, not a failure)."""


def main():
    part, cli, fixtures, work = sys.argv[1:5]
    archs = sorted(a for a in os.listdir(fixtures) if os.path.exists(os.path.join(fixtures, a, "config.json")))
    if part == "main":
        checks = [("nvfp4", "compressed-tensors", "config", lambda f, q, d: check_ct_config(q)),
                  ("nvfp4", "compressed-tensors", "transformers", check_transformers),
                  ("mxfp4", "compressed-tensors", "config", lambda f, q, d: check_ct_config(q)),
                  ("mxfp4", "compressed-tensors", "transformers", check_transformers),
                  ("nvfp4", "modelopt", "config", lambda f, q, d: check_modelopt_config(q)),
                  ("mixed", "modelopt", "config", lambda f, q, d: check_modelopt_config(q)),
                  ("mixed", "compressed-tensors", "decompress", lambda f, q, d: check_ct_mixed(q, d))]
        checks += [(fmt, "mlx", "mlx-lm", check_mlx)
                   for fmt in ("nvfp4", "mxfp4", "mxfp8", "affine4", "mixed")]
    else:
        checks = [(fmt, "compressed-tensors", "config (llm-compressor's pin)", lambda f, q, d: check_ct_config(q))
                  for fmt in ("nvfp4", "mxfp4")]
        checks.append(("nvfp4", "compressed-tensors", "vs llm-compressor",
                       lambda f, q, d: check_llmcompressor(f, q, os.path.dirname(q))))
    results = {}
    for arch in archs:
        if arch == "gpt2":
            print(f"{arch}: skipped (GPT-2 Conv1D weights are refused by microscale quantize)")
            continue
        fixture = os.path.join(fixtures, arch)
        for fmt, layout, what, fn in checks:
            key = f"{fmt} {layout} {what}"
            try:
                at = os.path.join(work, arch)
                q, d = mixed_export(cli, fixture, at, layout) if fmt == "mixed" else export(cli, fixture, at, fmt, layout)
                msg, status = fn(fixture, q, d), "PASS"
            except Skipped as e:
                print(f"{'SKIP':5} {arch:12} {key}: {e}", flush=True)
                continue
            except Known as e:
                msg, status = str(e), "KNOWN"
            except Differs as e:
                msg, status = str(e), "DIFF"
            except Exception as e:  # report every check, then fail at the end
                msg, status = " ".join(f"{type(e).__name__}: {e}".split())[:300], "FAIL"
                if os.environ.get("ECOSYSTEM_VERBOSE"):
                    traceback.print_exc()
            results[arch, key] = status
            print(f"{status:5} {arch:12} {key}: {msg}", flush=True)
    counts = {s: sum(v == s for v in results.values()) for s in ("PASS", "FAIL", "KNOWN", "DIFF")}
    print(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['KNOWN']} known ecosystem limitations, "
          f"{counts['DIFF']} differences from llm-compressor")
    sys.exit(1 if counts["FAIL"] else 0)


if __name__ == "__main__":
    main()
