#!/usr/bin/env python3
"""Writes small deterministic tokenizers into the architecture fixtures (tests/fixtures/<arch>/),
each of the kind its model family ships, with at most the fixture's vocab_size (128) tokens:

- llama: a Llama 3 style byte-level BPE tokenizer.json (its Split regex, ignore_merges, a
  TemplateProcessing post-processor that adds <|begin_of_text|>), merges in the [a, b] form.
- qwen2, qwen3, qwen3_moe: a Qwen2 style byte-level BPE tokenizer.json (its Split regex, ChatML
  special tokens added after the vocabulary); qwen2's merges in the older "a b" form.
- gpt_oss: a BPE tokenizer.json with the o200k pre-tokenizer regex;
- mistral, mixtral, phi3, gemma2, gemma3: a SentencePiece BPE tokenizer.model trained with the
  `sentencepiece` package, plus the tokenizer.json transformers would read (built here from the
  model's pieces, so transformers needs no protobuf); Phi-3's chat tokens are added tokens after
  the SentencePiece vocabulary, Gemma's are user-defined pieces inside it.

Each also gets a tokenizer_config.json with its bos/eos tokens and a short chat template.
Special token ids agree with the fixture's config.json where it names them.

    /work/main/build/venv/bin/python scripts/make_fixture_tokenizers.py [FIXTURES_DIR]

Needs tokenizers and sentencepiece (and transformers to check that each fixture loads).
"""

import io
import json
import os
import sys

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello tokens! How are you today?",
    "Numbers like 123 and 4567 are split into digits.",
    "She said: it's the model's turn; we'll see what they've done.",
    "Quantized weights keep their scales in blocks of sixteen or thirty-two values.",
    "A small vocabulary is enough for a test of the tokenizer files.",
]

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k (GPT-4o, gpt-oss)
O200K_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] }}<|eot_id|>{% endfor %}"
                   "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHATML_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MISTRAL_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
PHI3_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
                  "m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
                  "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def added_tokens_decoder(tokenizer_json):
    """tokenizer_config.json's added_tokens_decoder for tokenizer.json's added tokens."""
    return {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
            for a in tokenizer_json["added_tokens"]}


def byte_level_bpe(regex, vocab_size, leading_specials, trailing_specials, post_processor):
    """A byte-level BPE trained on TEXT: `leading_specials` take the first ids, `trailing_specials`
    come after the trained vocabulary; the whole has at most `vocab_size` tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(trailing_specials), show_progress=False,
                                  special_tokens=[AddedToken(t, special=True, normalized=False)
                                                  for t in leading_specials])
    tok.train_from_iterator(TEXT, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in trailing_specials])
    tok.post_processor = post_processor
    assert tok.get_vocab_size() <= vocab_size
    return json.loads(tok.to_str())


def llama(vocab_size):
    specials = ["<|reserved_special_token_0|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                "<|start_header_id|>", "<|end_header_id|>"]
    post = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", 1)]),
    ])
    tj = byte_level_bpe(LLAMA3_REGEX, vocab_size - 8, specials, [], post)  # 8 ids left as padding
    tj["model"]["ignore_merges"] = True
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
              "eos_token": "<|end_of_text|>", "clean_up_tokenization_spaces": True, "model_max_length": 131072,
              "model_input_names": ["input_ids", "attention_mask"], "chat_template": LLAMA3_TEMPLATE,
              "added_tokens_decoder": added_tokens_decoder(tj)}
    return {"tokenizer.json": tj, "tokenizer_config.json": config}


def qwen(vocab_size, string_merges):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tj = byte_level_bpe(QWEN2_REGEX, vocab_size - 4, [], specials, processors.ByteLevel(trim_offsets=False))
    if string_merges:  # the form tokenizers wrote before 0.20
        tj["model"]["merges"] = [" ".join(m) for m in tj["model"]["merges"]]
    config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": None, "add_prefix_space": False, "errors": "replace",
              "model_max_length": 32768, "split_special_tokens": False,
              "added_tokens_decoder": added_tokens_decoder(tj)}
    # Newer Qwen releases keep the template in chat_template.jinja.
    return {"tokenizer.json": tj, "tokenizer_config.json": config, "chat_template.jinja": CHATML_TEMPLATE}


def gpt_oss(vocab_size):
    specials = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|message|>", "<|end|>"]
    tj = byte_level_bpe(O200K_REGEX, vocab_size - 4, [], specials, processors.ByteLevel(trim_offsets=False))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>",
              "eos_token": "<|return|>", "pad_token": "<|endoftext|>", "model_max_length": 131072,
              "added_tokens_decoder": added_tokens_decoder(tj)}
    return {"tokenizer.json": tj, "tokenizer_config.json": config}


def train_sentencepiece(vocab_size, ids, user_defined, add_dummy_prefix):
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT), model_writer=buf, vocab_size=vocab_size, model_type="bpe", num_threads=1,
        hard_vocab_limit=False, user_defined_symbols=user_defined, normalization_rule_name="identity",
        add_dummy_prefix=add_dummy_prefix, split_digits=True, minloglevel=2, **ids)
    return buf.getvalue()


def sentencepiece_tokenizer_json(model_bytes, added, add_dummy_prefix, bos):
    """The tokenizer.json of a SentencePiece BPE model (as transformers converts one): its pieces
    as the vocabulary, merges ordered by the merged piece's rank, `added` (content, id, special)."""
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    vocab = {sp.id_to_piece(i): i for i in range(sp.vocab_size())}
    merges = []
    for piece, pid in vocab.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((pid, vocab[left], vocab[right], left, right))
    merges.sort()
    unk = sp.id_to_piece(sp.unk_id())
    tok = Tokenizer(models.BPE(vocab, [(m[3], m[4]) for m in merges], unk_token=unk, fuse_unk=True))
    replace = normalizers.Replace(" ", "\u2581")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), replace]) if add_dummy_prefix else replace
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if add_dummy_prefix else []))
    controls = [sp.id_to_piece(i) for i in range(sp.vocab_size()) if sp.is_control(i) or sp.is_unknown(i)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in controls])
    for content, tid, special in added:
        assert tok.get_vocab_size() == tid or content in vocab, (content, tid)
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
                                                       special_tokens=[(bos, vocab[bos])])
    return json.loads(tok.to_str())


def sentencepiece_family(vocab_size, ids, user_defined, added, add_dummy_prefix, names, template, cls):
    model = train_sentencepiece(vocab_size, ids, user_defined, add_dummy_prefix)
    sp_size = spm.SentencePieceProcessor(model_proto=model).vocab_size()
    added = [(t, sp_size + k, special) for k, (t, special) in enumerate(added)]
    tj = sentencepiece_tokenizer_json(model, added, add_dummy_prefix, names["bos_token"])
    config = {"tokenizer_class": cls, **names, "add_bos_token": True, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "legacy": False, "model_max_length": 4096,
              "chat_template": template, "added_tokens_decoder": added_tokens_decoder(tj)}
    return {"tokenizer.model": model, "tokenizer.json": tj, "tokenizer_config.json": config}


def families(vocab_size):
    llama2_ids = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    llama2_names = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    gemma_ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>")
    gemma_names = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"}
    gemma = lambda: sentencepiece_family(vocab_size - 8, gemma_ids, ["<mask>", "<start_of_turn>", "<end_of_turn>"], [],
                                         False, gemma_names, GEMMA_TEMPLATE, "GemmaTokenizer")
    return {
        "llama": lambda: llama(vocab_size),
        "qwen2": lambda: qwen(vocab_size, True),
        "qwen3": lambda: qwen(vocab_size, False),
        "qwen3_moe": lambda: qwen(vocab_size, False),
        "mistral": lambda: sentencepiece_family(vocab_size - 8, llama2_ids, [], [], True, llama2_names,
                                                MISTRAL_TEMPLATE, "LlamaTokenizer"),
        "mixtral": lambda: sentencepiece_family(vocab_size - 8, llama2_ids, [], [], True, llama2_names,
                                                MISTRAL_TEMPLATE, "LlamaTokenizer"),
        "gpt_oss": lambda: gpt_oss(vocab_size),
        "phi3": lambda: sentencepiece_family(
            vocab_size - 16, llama2_ids, [],
            [("<|endoftext|>", True), ("<|assistant|>", True), ("<|user|>", True), ("<|end|>", True),
             ("<|placeholder1|>", True)],
            True, {**llama2_names, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}, PHI3_TEMPLATE,
            "LlamaTokenizer"),
        "gemma2": gemma,
        "gemma3": gemma,
    }


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    for arch, make in families(128).items():
        d = os.path.join(root, arch)
        with open(os.path.join(d, "config.json")) as f:
            vocab_size = json.load(f)["vocab_size"]
        assert vocab_size == 128, (arch, vocab_size)
        for name, content in make().items():
            path = os.path.join(d, name)
            if isinstance(content, bytes):
                with open(path, "wb") as f:
                    f.write(content)
            elif isinstance(content, str):
                with open(path, "w", encoding="utf-8") as f:
                    f.write(content)
            else:
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(content, f, indent=1, ensure_ascii=False)
                    f.write("\n")
        try:
            from transformers import AutoTokenizer
        except ImportError:
            continue
        tok = AutoTokenizer.from_pretrained(d)
        assert len(tok) <= vocab_size, (arch, len(tok))
        print(arch, type(tok).__name__, len(tok), tok("Hello world, 123").input_ids)


if __name__ == "__main__":
    main()
