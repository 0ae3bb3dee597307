// The tensor names the GGUF exporter presents to tensor_rule (io/gguf_arch.hpp) for a checkpoint:
// per-expert weights stacked into "<p>.switch_mlp.<proj>.weight", gpt-oss's expert stacks and
// biases split into gate/up/down, and for each weight llama.cpp can read a scale of, its "<m>.scale"
// and "<m>.input_scale". Shared by test_gguf_arch.cpp and gguf_arch_dump.cpp.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "io/source_gptoss.hpp"
#include "microscale/io.hpp"

namespace gguf_arch_test {

struct Presented {
  std::string name;
  std::vector<std::int64_t> shape;  // empty for the scale tensors
  std::string weight;               // for a scale tensor: the weight it belongs to
};

// Weights the exporter may quantize, so that they come with scale tensors: 2-D and stacked
// projections, not the embedding or an expert router (llama.cpp reads no scale for those).
inline bool quantizable(const std::string& n, std::size_t rank) {
  if (rank < 2 || !n.ends_with(".weight")) return false;
  for (const char* kept :
       {"embed_tokens.weight", "mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.router.weight"})
    if (n.ends_with(kept)) return false;
  return true;
}

inline std::vector<Presented> presented_names(const microscale::io::Checkpoint& ck) {
  namespace ck_ = microscale::io::ck;
  const std::vector<std::string>& names = ck.names();
  std::vector<Presented> out;
  std::set<std::size_t> stacked;
  for (const ck_::ExpertGroup& g : ck_::expert_groups(names)) {
    const auto& first = ck.tensor(names[g.members.front()]).shape;
    out.push_back({g.module + ".weight", {static_cast<std::int64_t>(g.members.size()), first[0], first[1]}, ""});
    stacked.insert(g.members.begin(), g.members.end());
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (stacked.count(i)) continue;
    const std::string& n = names[i];
    const auto& shape = ck.tensor(n).shape;
    if (ck_::gptoss_expert_weight(n, shape)) {
      for (const ck_::ExpertRows& l : ck_::gptoss_layers(n, shape))
        out.push_back({l.module + ".weight", {l.experts, l.rows, l.cols}, ""});
    } else if (const auto parts = ck_::gptoss_bias_parts(n); !parts.empty()) {
      for (const ck_::BiasPart& p : parts)
        out.push_back({p.name, {shape[0], shape[1] / static_cast<std::int64_t>(parts.size())}, ""});
    } else {
      out.push_back({n, {shape.begin(), shape.end()}, ""});
    }
  }
  const std::size_t tensors = out.size();
  for (std::size_t i = 0; i < tensors; ++i) {
    const Presented p = out[i];
    if (!quantizable(p.name, p.shape.size())) continue;
    const std::string module = p.name.substr(0, p.name.size() - std::string(".weight").size());
    out.push_back({module + ".scale", {}, p.name});
    out.push_back({module + ".input_scale", {}, p.name});
  }
  return out;
}

}  // namespace gguf_arch_test
