"""Small Hugging Face style checkpoints for the checkpoint tests, written with the reference
`safetensors` package (not with microscale, so reader and converter are checked against it).

Run as a script to make one by hand: ``python ckpt_support.py OUT_DIR [--hidden 4096]``
(with ``--hidden 4096`` the MLP weights are 4096 x 8192 bf16: 64 MiB each, for peak-memory runs).
"""

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The command the CLI tests run: the one built in build/ (scripts/test.sh builds it first) or
# $MICROSCALE_CLI. Test modules that need it call skip_without_cli() first.
CLI = os.environ.get("MICROSCALE_CLI") or os.path.join(ROOT, "build", "src", "cli", "microscale")


def run(*args):
    """`microscale ARGS...`, captured; a hung command fails after 5 minutes."""
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, errors="replace", timeout=300)


def ok(*args):
    """run(*args), asserting that it succeeded (the message carries its stderr)."""
    r = run(*args)
    assert r.returncode == 0, f"{args}: {r.stderr}"
    return r


def skip_without_cli():
    """Skips the calling test module (at import) when there is no command at CLI."""
    if not os.access(CLI, os.X_OK):
        import pytest

        pytest.skip(f"no microscale command at {CLI} (build it, or set MICROSCALE_CLI)", allow_module_level=True)


def u8(a):
    """The bytes of array `a` (for byte-identity checks whatever its dtype)."""
    return np.ascontiguousarray(a).view(np.uint8)


# Llama-like: q/k/v/o + gate/up/down per layer, norms, embeddings and an untied lm_head.
PROJECTIONS = {
    "self_attn.q_proj": ("h", "h"),
    "self_attn.k_proj": ("kv", "h"),
    "self_attn.v_proj": ("kv", "h"),
    "self_attn.o_proj": ("h", "h"),
    "mlp.gate_proj": ("i", "h"),
    "mlp.up_proj": ("i", "h"),
    "mlp.down_proj": ("h", "i"),
}


def make_tensors(layers=2, hidden=128, inter=256, kv=64, vocab=96, dtype=BF16, seed=0):
    rng = np.random.default_rng(seed)
    dims = {"h": hidden, "i": inter, "kv": kv}
    t = {"model.embed_tokens.weight": rng.standard_normal((vocab, hidden)).astype(np.float32) * 0.02}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
        for j, (name, (o, i)) in enumerate(PROJECTIONS.items()):
            # Different scales per projection, so fused groups have different amaxes.
            scale = 0.02 * (1 + 0.5 * (j % 4))
            t[p + name + ".weight"] = rng.standard_normal((dims[o], dims[i])).astype(np.float32) * scale
        t[p + "self_attn.o_proj.bias"] = rng.standard_normal(hidden).astype(np.float32) * 0.01
    t["model.norm.weight"] = np.ones(hidden, np.float32)
    t["lm_head.weight"] = rng.standard_normal((vocab, hidden)).astype(np.float32) * 0.02
    return {k: v.astype(dtype) for k, v in t.items()}


def write_model(out, tensors, shards=2, config_extra=None):
    """Writes config.json, tokenizer files and `shards` safetensors shards (with an index when
    more than one), splitting the tensors in order."""
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    names = list(tensors)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "hidden_size": int(tensors["model.norm.weight"].shape[0])}
    config.update(config_extra or {})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "BPE"}}, f)
    os.makedirs(os.path.join(out, "extra"), exist_ok=True)
    with open(os.path.join(out, "extra", "notes.txt"), "w") as f:
        f.write("copied along\n")
    if shards == 1:
        save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        return
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, os.path.join(out, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(v.nbytes for v in tensors.values())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# safetensors dtype names -> numpy (8-bit floats through ml_dtypes: numpy has none).
ST_NP = {"F32": np.float32, "F16": np.float16, "BF16": BF16, "F64": np.float64, "U8": np.uint8, "I8": np.int8,
         "U16": np.uint16, "I16": np.int16, "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64,
         "BOOL": np.bool_, "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
         "F8_E8M0": ml_dtypes.float8_e8m0fnu}


def load_file(path):
    """{name: numpy array} of one file through the reference package's framework-free
    `deserialize` (its numpy loader cannot make 8-bit float arrays)."""
    import safetensors

    with open(path, "rb") as f:
        items = safetensors.deserialize(f.read())
    return {n: np.frombuffer(bytes(d["data"]), dtype=ST_NP[d["dtype"]]).reshape(d["shape"]) for n, d in items}


def load_all(path):
    """{name: numpy array} of a file or a model directory (index or single file), via safetensors."""
    if os.path.isfile(path):
        return load_file(path)
    idx = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        out.update(load_file(os.path.join(path, fn)))
    return out


def header(path):
    """The raw safetensors header of a file: {name: {dtype, shape, data_offsets}}."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


if __name__ == "__main__":
    hidden = int(sys.argv[sys.argv.index("--hidden") + 1]) if "--hidden" in sys.argv else 128
    write_model(sys.argv[1], make_tensors(layers=2, hidden=hidden, inter=2 * hidden, kv=hidden // 2), shards=2)
