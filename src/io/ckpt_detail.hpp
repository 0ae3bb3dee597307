// Internals of the checkpoint converters (checkpoint.hpp): one quantized layer in a
// layout-independent form, how each ecosystem names and types its tensors, and the model
// directory around the safetensors files.
#pragma once

#include <array>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "io/detail.hpp"
#include "microscale/checkpoint.hpp"

namespace microscale::io::ck {

namespace fs = std::filesystem;
using detail::Json;

// A global scale as one convention stores it (docs/checkpoints.md, "Global-scale conventions").
struct Global {
  enum Kind { none, amax, ct_encode, modelopt_decode };
  Kind kind = none;  // none: two-level nvfp4, equivalent to amax 2688 (decode factor 1)
  float value = 0;

  float to_amax() const;
  // The value convention `k` stores: verbatim when it is the stored one (bytes preserved),
  // otherwise through the amax.
  float as(Kind k) const;
  std::string describe() const;  // "weight_global_scale 3584 = 2688/amax -> amax 0.75"
};

// One quantized 2-D weight. The spans point into mapped input files or caller buffers.
struct Layer {
  std::string module;
  Mode mode = Mode::nvfp4;
  int group = 16, bits = 4;
  Shape shape;     // logical [N, K]
  Global global;   // nvfp4 only
  std::optional<Global> act;  // static activation scale (W4A4 checkpoints)
  std::span<const std::byte> packed, scales, biases;
  StDType float_dtype = StDType::bf16;  // dtype of affine scales and biases
  std::vector<std::string> sources;     // tensor names it was read from, the packed one first

  QuantSpec spec() const;  // resolved; global_scale = amax for three-level nvfp4
  std::int64_t rows() const { return shape[0]; }
  std::int64_t cols() const { return shape[1]; }
};

// A tensor to write: the entry, and its bytes (a span, or a 4-byte scalar kept inline).
struct Out {
  StEntry entry;
  std::span<const std::byte> data;
  std::array<std::byte, 4> scalar{};
  bool inline_scalar = false;
  std::span<const std::byte> bytes() const { return inline_scalar ? std::span<const std::byte>(scalar) : data; }
};

// The tensors of `l` in layout `c`, in write order (with empty data when only planning).
// Throws Error naming the layer when `c` cannot hold it.
std::vector<Out> emit(const Layer& l, Convention c);

// Quantized layers found in a checkpoint and the tensors they use.
struct Detected {
  std::string convention = "none";
  std::vector<Layer> layers;
  std::set<std::string> consumed;            // tensor names that belong to a layer
  std::vector<std::string> unsupported;      // quantized tensors of layouts we cannot read
  std::vector<std::string> strays;           // named like a part of a quantized layer its layout does not read
  std::vector<std::string> notes;
};
Detected detect(const Checkpoint& ck, const Json& config);

// Groups of sibling modules that vLLM fuses into one GEMM (q/k/v, gate/up, ...), only groups of
// two or more that are all in `modules`.
std::vector<std::vector<std::string>> fused_groups(const std::vector<std::string>& modules);

// What the config files say about the layers written.
struct QuantMeta {
  std::vector<const Layer*> layers;   // may be skeletons (no data)
  std::vector<std::string> ignore;    // 2-D projection weights left unquantized
  bool w4a4 = false;
};
// Rewrites `config` (an object) for layout `c` and returns hf_quant_config.json (ModelOpt) or
// null. With c unset, removes every quantization block (dequantize).
Json apply_config(Json& config, std::optional<Convention> c, const QuantMeta& meta);

// The model around the safetensors files.
struct Input {
  fs::path dir;            // directory holding config.json and the shards
  Checkpoint ck;
  Json config;             // null when there is no config.json
  bool indexed = false;    // a model.safetensors.index.json was given or found
  fs::path index_name;     // its file name
  std::vector<fs::path> shard_rel;  // each shard relative to dir
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

// Drops the pages of a mapped range from this process (they stay in the page cache), so reading a
// whole checkpoint does not grow the resident set beyond about one tensor.
void release(std::span<const std::byte> bytes);

std::string module_of(std::string_view tensor_name);  // strips ".weight" and friends
bool ends_with(std::string_view s, std::string_view suffix);
std::string fmt_shape(const Shape& s);
std::string fmt_float(double v);

}  // namespace microscale::io::ck
