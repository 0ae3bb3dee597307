// The tokenizer as llama.cpp's converter writes it into GGUF ("tokenizer.ggml.*" and
// "tokenizer.chat_template"), read from a model directory: tokenizer.json (BPE: tokens, token
// types, merges and the pre-tokenizer's name), tokenizer.model (SentencePiece: tokens, scores,
// types), tokenizer_config.json / special_tokens_map.json / generation_config.json / config.json
// (special token ids, add_bos/add_eos), chat_template.jinja or tokenizer_config.json's template.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "io/gguf_file.hpp"

namespace microscale::io::gguf {

struct Vocab {
  std::vector<Kv> kvs;             // empty when the directory has no tokenizer
  std::vector<std::string> notes;  // for the report: which files, padding, guesses
  std::string source;              // "tokenizer.json (BPE)", "tokenizer.model (SentencePiece)", ""
};

// `vocab_size` is the embedding's row count: a shorter vocabulary is padded as llama.cpp's
// converter pads it ("[PAD<i>]", type UNUSED); a longer one is an Error naming the file.
// Malformed files are Errors naming the file and what is wrong.
Vocab read_vocab(const std::filesystem::path& dir, const Json& config, std::int64_t vocab_size);

}  // namespace microscale::io::gguf
