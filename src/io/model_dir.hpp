// The model directory around the safetensors files of a checkpoint.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "io/detail.hpp"
#include "microscale/checkpoint.hpp"

namespace microscale::io::ck {

namespace fs = std::filesystem;
using detail::Json;

struct Input {
  fs::path dir;  // directory holding config.json and the shards
  Checkpoint ck;
  Json config;                      // null when there is no config.json
  bool indexed = false;             // a model.safetensors.index.json was given or found
  fs::path index_name;              // its file name
  std::vector<fs::path> shard_rel;  // each shard relative to dir
  RunInputs inputs;                 // every file the run reads, refused as an output
};
Input open_input(const fs::path& path);

// Copies every other file of `in_dir` (tokenizer, generation config, subfolders ...) into `out`
// (the converters' staging directory), skipping checkpoint files (*.safetensors, the index,
// config.json, hf_quant_config.json) and other weight formats, which would be stale; returns
// notes about what was skipped.
std::vector<std::string> copy_other_files(const fs::path& in_dir, const fs::path& out);
void write_text_atomic(const fs::path& path, const std::string& text);

// Glob patterns over module names; a pattern also matches any dotted suffix of the name.
bool matches(const std::vector<std::string>& patterns, const std::string& module);

}  // namespace microscale::io::ck
