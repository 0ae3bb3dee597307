"""The byte-identity guard's runs: every export, conversion and dequantization the CLI offers, on
every fixture and on the quantized source forms (FP8, gpt-oss MXFP4, mixed compressed-tensors
groups), each output file hashed with sha256. test_export_bytes.py compares a fresh run with
export_hashes.json, which this script writes from the current binary:

    MICROSCALE_CLI=build/src/cli/microscale python tests/python/export_bytes.py --write

Regenerate it only for a change that is meant to change output bytes, and say so in the commit.
One output holds a version string: the ModelOpt exports' hf_quant_config.json and config.json
record the producer "microscale-<version>", so a version bump changes their hashes.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ckpt_support import CLI, ROOT, load_all, make_tensors, write_model  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "export_hashes.json")

# quantize --format F --export E, by output name.
QUANTIZE = {"ct-nvfp4": ("nvfp4", "compressed-tensors"), "ct-mxfp4": ("mxfp4", "compressed-tensors"),
            "modelopt-nvfp4": ("nvfp4", "modelopt"), "mlx-nvfp4": ("nvfp4", "mlx"), "mlx-mxfp4": ("mxfp4", "mlx"),
            "mlx-mxfp8": ("mxfp8", "mlx"), "mlx-affine4": ("affine4", "mlx")}
GGUF = {"gguf-nvfp4": "nvfp4", "gguf-mxfp4": "mxfp4"}  # fixtures with a tokenizer
# convert --to T of an output above, and dequantize of some.
# (Three-level nvfp4 has no MLX form unless every global scale is 1: those conversions are refused.)
CONVERT = {"ct-nvfp4": ["modelopt", "gguf"], "ct-mxfp4": ["mlx", "gguf"], "modelopt-nvfp4": ["compressed-tensors"],
           "mlx-nvfp4": ["compressed-tensors", "modelopt", "gguf"], "mlx-mxfp4": ["compressed-tensors"],
           "gguf-nvfp4": ["compressed-tensors", "modelopt"], "gguf-mxfp4": ["compressed-tensors", "mlx"]}
DEQUANTIZE = ["ct-nvfp4", "modelopt-nvfp4", "mlx-mxfp8", "mlx-affine4", "gguf-nvfp4"]


class Step:
    """One CLI run writing `out` (a directory, or a .gguf file and its split siblings)."""

    def __init__(self, name, args, out, after=None):
        self.name, self.args, self.out, self.after = name, args, out, after


def has_tokenizer(d):
    return any(os.path.exists(os.path.join(d, f)) for f in ("tokenizer.json", "tokenizer.model"))


def out_path(tmp, name, kind):
    return os.path.join(tmp, name + (".gguf" if kind.startswith("gguf") else ""))


def chain(steps, tmp, src, prefix, tokenizer):
    """quantize, then convert and dequantize of what it wrote."""
    made = {}
    exports = dict(QUANTIZE)
    if tokenizer:
        exports.update({q: (fmt, "gguf") for q, fmt in GGUF.items()})
    for q, (fmt, export) in exports.items():
        made[q] = Step(f"{prefix}/{q}", ["quantize", src, "--format", fmt, "--export", export],
                       out_path(tmp, f"{prefix}.{q}", q))
    steps += made.values()
    for q, targets in CONVERT.items():
        if q not in made:
            continue
        for to in targets:
            if to == "gguf" and not tokenizer:
                continue
            name = f"{q}.to-{to}"
            steps.append(Step(f"{prefix}/{name}", ["convert", made[q].out, "--to", to],
                              out_path(tmp, f"{prefix}.{name}", to), after=made[q]))
    for q in DEQUANTIZE:
        if q in made:
            steps.append(Step(f"{prefix}/{q}.dequantize", ["dequantize", made[q].out],
                              out_path(tmp, f"{prefix}.{q}.deq", "dir"), after=made[q]))


def option_runs(steps, tmp, inputs):
    """The options that shape quantize's plan: scale search, GPTQ, activation scales, fused
    scales, include/exclude, 2-D scales, scale rules, group sizes, split files, split runs."""
    llama = os.path.join(FIXTURES, "llama")
    moe = os.path.join(FIXTURES, "qwen3_moe")
    runs = {
        "llama/mse": [llama, "--scale-search", "mse"],
        "llama/4over6-modelopt": [llama, "--scale-search", "4over6", "--export", "modelopt"],
        "llama/scale-2d": [llama, "--scale-2d"],
        "llama/separate-fused": [llama, "--separate-fused-scales"],
        "llama/exclude-include": [llama, "--exclude", "down_proj", "--include", "lm_head"],
        "llama/gptq": [llama, "--hessians", inputs["hessians"], "--gptq-block-size", "32"],
        "llama/w4a4-ct": [llama, "--activation-amax", inputs["amax"]],
        "llama/w4a4-modelopt": [llama, "--activation-amax", inputs["amax"], "--export", "modelopt"],
        "llama/mlx-mxfp4-floor": [llama, "--format", "mxfp4", "--export", "mlx", "--scale-rule", "floor"],
        "llama/mlx-affine4-g32": [llama, "--format", "affine4", "--group-size", "32"],
        "llama/mlx-affine8": [llama, "--format", "affine8"],
        "llama/gguf-include-lm-head": [llama, "--export", "gguf", "--include", "lm_head"],
        "llama/gguf-split": [llama, "--export", "gguf", "--split-max-size", "40000"],
        "qwen3_moe/mlx-exclude-experts": [moe, "--export", "mlx", "--exclude", "experts.*"],
        "qwen3_moe/gguf-mse": [moe, "--export", "gguf", "--scale-search", "mse"],
    }
    for name, args in runs.items():
        gguf = "gguf" in args
        steps.append(Step(name, ["quantize", *args], out_path(tmp, name.replace("/", "."), "gguf" if gguf else "dir")))
    sep = next(s for s in steps if s.name == "llama/separate-fused")
    steps.append(Step("llama/separate-fused.to-modelopt-unified", ["convert", sep.out, "--to", "modelopt",
                                                                   "--unify-fused-scales"],
                      out_path(tmp, "llama.unified", "dir"), after=sep))


def gptoss_fixture_mxfp4(seed=12):
    """The gpt-oss fixture with its expert stacks as MXFP4 blocks and scales (as
    test_gptoss_convert.make_source builds it, in a fixed order so that the bytes repeat)."""
    t = load_all(os.path.join(FIXTURES, "gpt_oss"))
    with open(os.path.join(FIXTURES, "gpt_oss", "config.json")) as f:
        cfg = json.load(f)
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(t):
        if name.endswith(("gate_up_proj", "down_proj")) and t[name].ndim == 3:
            e, k, n = t[name].shape
            out[name + "_blocks"] = rng.integers(0, 256, (e, n, k // 32, 16), dtype=np.uint8)
            out[name + "_scales"] = rng.integers(118, 136, (e, n, k // 32), dtype=np.uint8)
        elif name.endswith("_bias") and "experts" in name:
            out[name] = (rng.standard_normal(t[name].shape) * 0.01).astype(t[name].dtype)
        else:
            out[name] = t[name]
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    return out, cfg


def make_inputs(tmp):
    """The generated sources: FP8 releases, gpt-oss MXFP4, mixed compressed-tensors groups, a
    sharded float model, and the side files of the option runs."""
    import test_mixed_groups as mixed
    import test_quantized_sources as qs

    srcs = {}
    for kind in ("fp8-block", "ct-channel", "ct-tensor", "modelopt"):
        tensors, config, hf, _ = qs.make_fp8(kind)
        d = os.path.join(tmp, "src." + kind)
        qs.write_dir(d, tensors, config, hf)
        srcs["fp8-" + kind] = d
    tensors, config = qs.make_gptoss()
    d = os.path.join(tmp, "src.gptoss-small")
    qs.write_dir(d, tensors, config)
    srcs["gptoss-small"] = d
    d = os.path.join(tmp, "src.gptoss-fixture")
    qs.write_dir(d, *gptoss_fixture_mxfp4())
    srcs["gptoss-fixture"] = d
    for name, make in {"mixed-fp8-nvfp4": lambda d: mixed.make_fp8_nvfp4(d),
                       "mixed-fp8-mxfp4": lambda d: mixed.make_fp8_nvfp4(d, "mxfp4"),
                       "nvfp4-kept": mixed.make_nvfp4_kept}.items():
        d = os.path.join(tmp, "src." + name)
        make(d)
        srcs[name] = d
    d = os.path.join(tmp, "src.sharded")
    write_model(d, make_tensors(), shards=2)
    srcs["sharded"] = d

    # --activation-amax for every llama projection, and --hessians for two of them.
    with open(os.path.join(FIXTURES, "llama", "config.json")) as f:
        layers = json.load(f)["num_hidden_layers"]
    projs = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj"]
    amax = {f"model.layers.{i}.{p}": 1.0 + 0.25 * j for i in range(layers) for j, p in enumerate(projs)}
    srcs["amax"] = os.path.join(tmp, "amax.json")
    with open(srcs["amax"], "w") as f:
        json.dump(amax, f)
    rng = np.random.default_rng(5)
    hess = {}
    for m, k in (("model.layers.0.self_attn.q_proj", 64), ("model.layers.1.mlp.down_proj", 128)):
        x = rng.standard_normal((256, k)).astype(np.float32)
        hess[m] = x.T @ x
    srcs["hessians"] = os.path.join(tmp, "hessians.safetensors")
    qs.save(srcs["hessians"], hess)
    return srcs


def source_runs(steps, tmp, srcs):
    for kind in ("fp8-block", "ct-channel", "ct-tensor", "modelopt"):
        src = srcs["fp8-" + kind]
        for q in ("ct-nvfp4", "modelopt-nvfp4", "mlx-mxfp4"):
            fmt, export = QUANTIZE[q]
            steps.append(Step(f"fp8-{kind}/{q}", ["quantize", src, "--format", fmt, "--export", export],
                              out_path(tmp, f"fp8-{kind}.{q}", "dir")))
        steps.append(Step(f"fp8-{kind}/exclude-q", ["quantize", src, "--exclude", "q_proj"],
                          out_path(tmp, f"fp8-{kind}.exclude", "dir")))
        steps.append(Step(f"fp8-{kind}/dequantize", ["dequantize", src], out_path(tmp, f"fp8-{kind}.deq", "dir")))
    for g in ("gptoss-small", "gptoss-fixture"):
        for to in ("mlx", "compressed-tensors", "modelopt", "gguf"):
            steps.append(Step(f"{g}/to-{to}", ["convert", srcs[g], "--to", to], out_path(tmp, f"{g}.{to}", to)))
        steps.append(Step(f"{g}/dequantize", ["dequantize", srcs[g]], out_path(tmp, f"{g}.deq", "dir")))
    for m in ("mixed-fp8-nvfp4", "mixed-fp8-mxfp4", "nvfp4-kept"):
        for to in ("compressed-tensors", "modelopt", "mlx"):
            steps.append(Step(f"{m}/to-{to}", ["convert", srcs[m], "--to", to], out_path(tmp, f"{m}.{to}", to)))
        steps.append(Step(f"{m}/dequantize", ["dequantize", srcs[m]], out_path(tmp, f"{m}.deq", "dir")))
    # A sharded model, whole and as a run split over two parts.
    for export in ("compressed-tensors", "mlx"):
        steps.append(Step(f"sharded/{export}", ["quantize", srcs["sharded"], "--export", export],
                          out_path(tmp, f"sharded.{export}", "dir")))
        parts = out_path(tmp, f"sharded.{export}.parts", "dir")
        p0 = Step(f"sharded/{export}-part0", ["quantize", srcs["sharded"], "--export", export, "--part", "0/2"], parts)
        steps.append(p0)
        steps.append(Step(f"sharded/{export}-parts", ["quantize", srcs["sharded"], "--export", export, "--part", "1/2"],
                          parts, after=p0))


def hashes(path):
    """{relative file: sha256} of a directory, or of a .gguf file and its split siblings."""
    files = []
    if os.path.isdir(path):
        for d, _, names in os.walk(path):
            files += [os.path.join(d, n) for n in names]
        base = path
    else:
        base = os.path.dirname(path)
        stem = os.path.basename(path)[:-len(".gguf")]
        files = [os.path.join(base, n) for n in os.listdir(base)
                 if n == stem + ".gguf" or (n.startswith(stem + "-0") and n.endswith(".gguf"))]
    out = {}
    for f in sorted(files):
        with open(f, "rb") as fh:
            out[os.path.relpath(f, base)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def run_step(step):
    args = [CLI, *map(str, step.args), "-o", step.out]
    if step.after is not None and step.after.out == step.out:  # the second part of a split run
        args.append("-f")
    r = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=300)
    if r.returncode != 0:
        return {"refused": True}
    return hashes(step.out) if os.path.exists(step.out) else {}


def collect(tmp):
    """{step: {file: sha256} or {"refused": true}} and {source file: sha256} of the inputs."""
    srcs = make_inputs(tmp)
    steps = []
    for fx in sorted(os.listdir(FIXTURES)):
        d = os.path.join(FIXTURES, fx)
        if os.path.isdir(d):
            chain(steps, tmp, d, fx, has_tokenizer(d))
    option_runs(steps, tmp, srcs)
    source_runs(steps, tmp, srcs)
    names = [s.name for s in steps]
    assert len(set(names)) == len(names), "duplicate step names"
    results = {}
    # Steps run in waves: each wave's inputs were written by an earlier one.
    pending = list(steps)
    done = set()
    with ThreadPoolExecutor(max_workers=2) as pool:
        while pending:
            wave = [s for s in pending if s.after is None or s.after.name in done]
            for s, r in zip(wave, pool.map(run_step, wave)):
                results[s.name] = r
                done.add(s.name)
            pending = [s for s in pending if s.name not in done]
    # A split run's first part publishes nothing; only the finished output is pinned.
    for s in steps:
        if s.name.endswith("-part0"):
            del results[s.name]
    inputs = {}
    for k, p in srcs.items():
        for f, h in hashes(p).items() if os.path.isdir(p) else [(os.path.basename(p), sha_file(p))]:
            inputs[f"{k}/{f}"] = h
    return {"inputs": inputs, "outputs": results}


def sha_file(p):
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        got = collect(tmp)
    if "--write" in sys.argv[1:]:
        with open(MANIFEST, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        n = sum(len(v) for v in got["outputs"].values())
        print(f"wrote {MANIFEST}: {len(got['outputs'])} runs, {n} files")
    else:
        print(json.dumps(got, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
