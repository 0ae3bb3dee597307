// compressed-tensors' config groups (docs/checkpoints.md, "Mixed config groups"): a checkpoint's
// quantization_config.config_groups each name a scheme and the modules it applies to (`targets`),
// and `ignore` lists modules left in high precision. Checkpoints that mix schemes (FP8 attention
// with NVFP4 MLPs, say) are read by matching each quantized weight to its group as
// compressed-tensors does.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "io/layer.hpp"

namespace microscale::io::ck {

// What a group's weights are stored as.
enum class CtFormat { float_quantized, nvfp4_pack, mxfp4_pack, mxfp8, other };

struct CtGroup {
  std::string name;    // its key in config_groups: "group_0"
  std::string format;  // as the config names it ("float-quantized"), or inferred from its weights
  CtFormat kind = CtFormat::other;
  std::string strategy;  // weights.strategy: "tensor", "channel", "block", "group", "tensor_group"
  // The weight elements one scale covers for a "block" or "group" strategy, rows x columns.
  std::optional<std::array<std::int64_t, 2>> block;
  std::vector<std::string> targets;
  Json config;  // the group as written, for outputs that keep it
};

// A target of a group or of `ignore`: an exact module name, a "re:" pattern matched from the
// start of the name (Python's re.match), or a class name. Only "Linear" can be told from the
// tensors: every quantized weight is one.
struct CtTarget {
  enum class Kind { name, regex, class_name };  // in compressed-tensors' order of precedence
  Kind kind;
  std::string text;
  std::optional<std::regex> pattern;
  bool matches(const std::string& module) const;
};

struct CtGroups {
  std::vector<CtGroup> groups;
  std::vector<std::vector<CtTarget>> targets;  // per group
  std::vector<CtTarget> ignore;

  bool empty() const { return groups.empty(); }
  // The group that quantized `module`, or null when it is ignored or no group targets it. Like
  // compressed-tensors, an exact name beats a pattern, which beats a class name; two groups that
  // claim it at the same precedence are refused, naming both and `tensor`.
  const CtGroup* claim(const std::string& module, const std::string& tensor) const;
  bool ignored(const std::string& module) const;
};

// The groups of config.json's quantization_config; empty unless quant_method is
// "compressed-tensors" with config_groups. Throws naming the field on a malformed group.
CtGroups ct_groups(const Json& config);

// [rows, cols] of a two-element array of positive integers (weight_block_size, block_structure);
// throws naming `what` otherwise.
std::array<std::int64_t, 2> config_block_pair(const Json& v, const std::string& what);

// The format a group must have for a weight stored as `kind`.
const char* name(CtFormat kind);  // "float-quantized", "nvfp4-pack-quantized", "mxfp8-quantized", ...

}  // namespace microscale::io::ck
