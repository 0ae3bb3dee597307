#!/usr/bin/env python3
"""Cross-checks microscale's GGUF tokenizer keys (gguf_vocab_dump) against what the reference
`tokenizers` and `sentencepiece` packages read from the same files (installed with pip when
missing), for every fixture that has a tokenizer:

- tokens by id, padding "[PAD<id>]", token types (added special -> control, SentencePiece's own
  piece kinds), scores (SentencePiece), merges as tokenizers itself re-serializes them;
- special ids: tokenizer_config.json's token text looked up by tokenizers, else config.json;
- add_bos/add_eos: whether tokenizers' encoding of a text starts with bos / ends with eos;
- the chat template, the pre-tokenizer name each family's real models get from llama.cpp.
When transformers is installed, its AutoTokenizer must load each fixture and agree on bos/eos.

usage: check_gguf_vocab.py GGUF_VOCAB_DUMP FIXTURES_DIR
Prints "N passed, 0 failed" and exits 0 on success.
"""
import json
import os
import struct
import subprocess
import sys


def ensure_packages():
    try:
        import sentencepiece  # noqa: F401
        import tokenizers  # noqa: F401
        return
    except ImportError:
        pass
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # Plain install first; externally managed interpreters (PEP 668) need the user site.
    for extra in ([], ["--user", "--break-system-packages"]):
        if subprocess.call(base + extra + ["tokenizers", "sentencepiece"]) == 0:
            break
    import importlib
    import site
    importlib.invalidate_caches()
    if site.ENABLE_USER_SITE and site.getusersitepackages() not in sys.path:
        sys.path.append(site.getusersitepackages())


ensure_packages()
import sentencepiece  # noqa: E402
import tokenizers  # noqa: E402

DUMP, FIXTURES = sys.argv[1], sys.argv[2]
# The pre-tokenizer llama.cpp's converter names for each family's real tokenizer.
FAMILIES = {"llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2", "qwen3_moe": "qwen2",
            "mistral": None, "phi3": None, "gemma2": None, "gemma3": None}
ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id",
           "sep": "seperator_token_id", "mask": "mask_token_id"}
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def looks_special(t):
    return t in ("<pad>", "<mask>") or (t.startswith("<|") and t.endswith("|>"))


def expected(arch, d):
    config = load(os.path.join(d, "config.json"))
    n = config["vocab_size"]
    tc = load(os.path.join(d, "tokenizer_config.json"))
    tok = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    added = tok.get_added_tokens_decoder()  # {id: AddedToken}
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [5] * n
    kvs = {}
    if FAMILIES[arch] is None:  # SentencePiece
        sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
        scores = [-10000.0] * n
        for i in range(sp.vocab_size()):
            tokens[i], scores[i] = sp.id_to_piece(i), f32(sp.get_score(i))
            types[i] = (2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i)
                        else 6 if sp.is_byte(i) else 1)
        for key, a in tc.get("added_tokens_decoder", {}).items():
            i = int(key)
            tokens[i], scores[i] = a["content"], -1000.0
            types[i] = 3 if a["special"] or (arch != "phi3" and looks_special(a["content"])) else 4
        if arch == "phi3":
            for i, a in added.items():
                tokens[i], scores[i], types[i] = a.content, -1000.0, 3 if a.special else 4
        kvs["tokenizer.ggml.model"] = "llama"
        kvs["tokenizer.ggml.pre"] = "default"
        kvs["tokenizer.ggml.scores"] = scores
    else:
        for text, i in tok.get_vocab(with_added_tokens=True).items():
            tokens[i] = text
            types[i] = 1 if i not in added else 3 if added[i].special or looks_special(text) else 4
        merges = json.loads(tok.to_str())["model"]["merges"]
        kvs["tokenizer.ggml.model"] = "gpt2"
        kvs["tokenizer.ggml.pre"] = FAMILIES[arch]
        kvs["tokenizer.ggml.merges"] = [" ".join(p.replace(" ", "\u0120") for p in m) for m in merges]
    kvs["tokenizer.ggml.tokens"] = tokens
    kvs["tokenizer.ggml.token_type"] = types
    ids = {}
    added_ids = {a.content: i for i, a in sorted(added.items())}
    for typ in ("bos", "eos", "unk", "sep", "pad", "mask"):
        text = tc.get(f"{typ}_token")
        if isinstance(text, str) and text in added_ids:
            ids[typ] = added_ids[text]
        elif isinstance(config.get(f"{typ}_token_id"), int) and 0 <= config[f"{typ}_token_id"] < n:
            ids[typ] = config[f"{typ}_token_id"]
    for typ, i in ids.items():
        kvs["tokenizer.ggml." + ID_KEYS[typ]] = i
    enc = tok.encode("Hello world").ids
    kvs["tokenizer.ggml.add_bos_token"] = "bos" in ids and enc[0] == ids["bos"]
    kvs["tokenizer.ggml.add_eos_token"] = "eos" in ids and enc[-1] == ids["eos"]
    if "TemplateProcessing" in json.dumps(json.loads(tok.to_str())["post_processor"]):
        kvs["tokenizer.ggml.add_sep_token"] = False  # no fixture puts a separator between pairs
    template = tc.get("chat_template")
    if template is None:
        with open(os.path.join(d, "chat_template.jinja"), encoding="utf-8") as f:
            template = f.read()
    kvs["tokenizer.chat_template"] = template
    if arch.startswith("gemma"):
        kvs["tokenizer.ggml.add_space_prefix"] = False
    return kvs, ids


for arch in sorted(FAMILIES):
    d = os.path.join(FIXTURES, arch)
    out = subprocess.run([DUMP, d], capture_output=True, text=True)
    check(out.returncode == 0, f"{arch}: gguf_vocab_dump failed: {out.stderr}")
    if out.returncode != 0:
        continue
    got = {k: v["value"] for k, v in json.loads(out.stdout)["kvs"].items()}
    want, ids = expected(arch, d)
    check(sorted(got) == sorted(want), f"{arch}: keys {sorted(set(got) ^ set(want))} differ")
    for key, value in want.items():
        check(got.get(key) == value, f"{arch}: {key}: got {str(got.get(key))[:200]}, want {str(value)[:200]}")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        continue
    hf = AutoTokenizer.from_pretrained(d)
    for typ in ("bos", "eos"):
        check(getattr(hf, f"{typ}_token_id") == ids.get(typ), f"{arch}: transformers' {typ} id differs")
    vocab = hf.get_vocab()
    check(all(got["tokenizer.ggml.tokens"][i] == t for t, i in vocab.items() if " " not in t),
          f"{arch}: transformers' vocabulary differs")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
