#!/usr/bin/env python3
"""Cross-check microscale's GGUF architecture rules (src/io/gguf_arch.cpp) against llama.cpp's
gguf-py (the `gguf` package, pip-installed when missing).

usage: check_gguf_arch.py GGUF_ARCH_DUMP FIXTURES_DIR

For every fixture, gguf_arch_dump prints the plan and each presented tensor's rule. Then:
1. general.architecture is gguf-py's name for the architecture the converter uses.
2. Every "<arch>.*" key is one of gguf.Keys' templates, and has the value type gguf-py's own
   GGUFWriter.add_* method writes for it.
3. Every tensor's GGUF name is what gguf.get_tensor_name_map(arch, blocks).get_name gives for it,
   and its tensor kind is in gguf.MODEL_TENSORS[arch]. Stacked "<p>.switch_mlp.<proj>" names, which
   gguf-py does not map, must be the arch's FFN_{GATE,UP,DOWN}_EXP names; a "<m>.scale" or
   "<m>.input_scale" is its weight's name with the leaf replaced.
Prints "N passed, 0 failed" and exits 0 on success.
"""
import json
import re
import subprocess
import sys


def ensure_gguf():
    try:
        import gguf  # noqa: F401
        return
    except ImportError:
        pass
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # Plain install first; externally managed interpreters (PEP 668) need the user site.
    for extra in ([], ["--user", "--break-system-packages"]):
        if subprocess.call(base + extra + ["gguf>=0.19.0"]) == 0:
            break
    import importlib
    import site
    importlib.invalidate_caches()
    if site.ENABLE_USER_SITE and site.getusersitepackages() not in sys.path:
        sys.path.append(site.getusersitepackages())


ensure_gguf()
import gguf  # noqa: E402

DUMP, FIXTURES = sys.argv[1], sys.argv[2]
# The converter's model class per fixture (conversion/*.py): Mistral and Mixtral are LlamaModel.
ARCH = {
    "llama": gguf.MODEL_ARCH.LLAMA, "mistral": gguf.MODEL_ARCH.LLAMA, "mixtral": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3, "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "gemma2": gguf.MODEL_ARCH.GEMMA2, "gemma3": gguf.MODEL_ARCH.GEMMA3, "phi3": gguf.MODEL_ARCH.PHI3,
    "gpt_oss": gguf.MODEL_ARCH.GPT_OSS,
}
EXPERTS = {"gate_proj": gguf.MODEL_TENSOR.FFN_GATE_EXP, "up_proj": gguf.MODEL_TENSOR.FFN_UP_EXP,
           "down_proj": gguf.MODEL_TENSOR.FFN_DOWN_EXP}

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def key_types(arch_name):
    """Key -> value type, as gguf-py's writer methods store the keys the converter writes."""
    w = gguf.GGUFWriter(path=None, arch=arch_name)
    calls = [
        ("add_context_length", 1), ("add_embedding_length", 1), ("add_block_count", 1),
        ("add_feed_forward_length", 1), ("add_head_count", 1), ("add_head_count_kv", 1),
        ("add_key_length", 1), ("add_value_length", 1), ("add_layer_norm_rms_eps", 1.0),
        ("add_layer_norm_eps", 1.0), ("add_causal_attention", False), ("add_rope_freq_base", 1.0),
        ("add_rope_freq_base_swa", 1.0), ("add_rope_dimension_count", 1), ("add_expert_count", 1),
        ("add_expert_used_count", 1), ("add_expert_feed_forward_length", 1),
        ("add_expert_shared_feed_forward_length", 1), ("add_sliding_window", 1),
        ("add_attn_logit_softcapping", 1.0), ("add_final_logit_softcapping", 1.0), ("add_vocab_size", 1),
        ("add_rope_scaling_type", gguf.RopeScalingType.YARN), ("add_rope_scaling_factor", 1.0),
        ("add_rope_scaling_orig_ctx_len", 1), ("add_rope_scaling_yarn_ext_factor", 1.0),
        ("add_rope_scaling_yarn_attn_factor", 1.0), ("add_rope_scaling_yarn_beta_fast", 1.0),
        ("add_rope_scaling_yarn_beta_slow", 1.0), ("add_rope_scaling_attn_factors", 1.0),
    ]
    for method, value in calls:
        getattr(w, method)(value)
    return {k: v.type.name for kv in w.kv_data for k, v in kv.items()}


def templates():
    """Every key template gguf.Keys defines ("{arch}.attention.head_count", ...)."""
    out = set()
    stack = [gguf.Keys]
    while stack:
        cls = stack.pop()
        for name, value in vars(cls).items():
            if isinstance(value, str) and not name.startswith("_"):
                out.add(value)
            elif isinstance(value, type):
                stack.append(value)
    return out


TEMPLATES = templates()
for fixture, arch in ARCH.items():
    dump = json.loads(subprocess.check_output([DUMP, f"{FIXTURES}/{fixture}"]))
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    check(dump["arch"] == arch_name, f"{fixture}: arch {dump['arch']} is not gguf-py's {arch_name}")
    types = key_types(arch_name)
    blocks = 0
    for kv in dump["kvs"]:
        key = kv["key"]
        if key == "general.architecture":
            check(kv["value"] == arch_name and kv["type"] == "STRING", f"{fixture}: {kv}")
            continue
        if key.endswith(".block_count"):
            blocks = kv["value"]
        check(key.replace(arch_name + ".", "{arch}.", 1) in TEMPLATES, f"{fixture}: {key} is no gguf.Keys template")
        check(types.get(key) == kv["type"], f"{fixture}: {key} is {kv['type']}, gguf-py writes {types.get(key)}")
    check(blocks > 0, f"{fixture}: no block_count")

    tmap = gguf.get_tensor_name_map(arch, blocks)
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}
    by_hf = {t["hf"]: t for t in dump["tensors"]}
    for t in dump["tensors"]:
        hf, rule = t["hf"], t["rule"]
        check(rule is not None, f"{fixture}: no rule for {hf}")
        if rule is None or rule["skip"]:
            continue
        if t["weight"]:  # a scale tensor: its weight's name, leaf replaced
            weight = by_hf[t["weight"]]["rule"]["name"]
            expected = weight[: -len(".weight")] + hf[hf.rfind("."):]
        elif m := re.fullmatch(r"(.*)\.layers\.(\d+)\..*\.switch_mlp\.(gate_proj|up_proj|down_proj)\.weight", hf):
            kind = EXPERTS[m.group(3)]
            check(kind in gguf.MODEL_TENSORS[arch], f"{fixture}: {arch_name} has no {kind.name}")
            expected = gguf.TENSOR_NAMES[kind].format(bid=int(m.group(2))) + ".weight"
        else:
            # gpt-oss's sinks are a bare parameter the converter names "<...>.sinks.weight".
            name = hf + ".weight" if hf.endswith(".sinks") else hf
            expected = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
            found = tmap.get_type_and_name(name, try_suffixes=(".weight", ".bias"))
            check(found is not None and found[0] in gguf.MODEL_TENSORS[arch],
                  f"{fixture}: {hf} maps to no tensor of {arch_name}")
        check(rule["name"] == expected, f"{fixture}: {hf} -> {rule['name']}, gguf-py: {expected}")
        base = re.sub(r"^blk\.\d+\.", "blk.{bid}.", rule["name"].rsplit(".", 1)[0])
        check(base in allowed, f"{fixture}: {rule['name']} is not a tensor of {arch_name}")
    for extra in dump["extra_tensors"]:
        check(extra["name"].rsplit(".", 1)[0] in allowed, f"{fixture}: {extra['name']} is not a tensor of {arch_name}")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
