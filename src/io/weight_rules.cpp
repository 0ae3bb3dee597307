// The rules that pick the weights to quantize and the ignore list of what stays in high precision.
#include <algorithm>

#include "io/layout.hpp"
#include "io/model_dir.hpp"
#include "io/weight_rules.hpp"

namespace microscale::io {

std::string why_kept(std::string_view name, const Shape& shape, StDType dtype) {
  return ck::keep_text(ck::default_keep(name, shape, dtype), shape, dtype);
}

std::vector<std::string> conv1d_weights(const std::filesystem::path& model) {
  const ck::Input in = ck::open_input(model);
  std::vector<std::string> found;
  for (const std::string& n : in.ck.names()) {
    const StTensor& t = in.ck.tensor(n);
    if (ck::default_keep(n, t.shape, t.dtype) == ck::Keep::quantize && ck::conv1d_weight(in.config, ck::module_of(n)))
      found.push_back(n);
  }
  return found;
}

namespace ck {

Keep default_keep(std::string_view name, const Shape& shape, StDType dtype) {
  if (!name.ends_with(".weight")) return Keep::not_weight;
  if (shape.size() != 2) return Keep::rank;
  if (dtype != StDType::f32 && dtype != StDType::bf16 && dtype != StDType::f16) return Keep::dtype;
  const std::string m = module_of(name);
  const std::string last = m.substr(m.rfind('.') + 1);
  if (last == "lm_head") return Keep::lm_head;
  if (m.find("embed") != std::string::npos || last == "wte" || last == "wpe") return Keep::embedding;
  if (m.find("norm") != std::string::npos || last.rfind("ln", 0) == 0) return Keep::norm;
  // MoE routers: tiny, and every runtime keeps them in high precision.
  if (last == "gate" || last == "router" || last == "shared_expert_gate") return Keep::router;
  return Keep::quantize;
}

std::string keep_text(Keep k, const Shape& shape, StDType dtype, int group) {
  switch (k) {
    case Keep::quantize: return "";
    case Keep::not_weight: return "not a .weight";
    case Keep::rank: return std::to_string(shape.size()) + "-D";
    case Keep::dtype: return std::string("dtype ") + st_dtype_name(dtype);
    case Keep::lm_head: return "lm_head";
    case Keep::embedding: return "embedding";
    case Keep::norm: return "norm";
    case Keep::router: return "router";
    case Keep::excluded: return "excluded";
    case Keep::recipe: return "kept by the recipe";
    case Keep::budget: return "kept by --budget";
    case Keep::group:
      if (shape[1] == 0) return "K = 0: no input features to group";
      return "K = " + std::to_string(shape[1]) + " is not a multiple of the group size " + std::to_string(group);
  }
  return "";
}

bool by_name(Keep k) { return k == Keep::lm_head || k == Keep::embedding || k == Keep::router || k == Keep::norm; }

bool stacked_experts(std::string_view name, const Shape& shape) {
  return shape.size() >= 3 && name.find("experts") != std::string_view::npos;
}

bool looks_like_weight(std::string_view name, const Shape& shape) {
  return (name.ends_with(".weight") && shape.size() >= 2) || stacked_experts(name, shape);
}

std::string owner_module(const std::string& name) {
  if (name.ends_with(".weight")) return module_of(name);
  const std::size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// Names alone are not enough (GPT-BigCode uses the same names for Linear layers), so the config
// decides when it names the model type.
bool conv1d_weight(const Json& config, const std::string& module) {
  const std::string last = module.substr(module.rfind('.') + 1);
  if (last != "c_attn" && last != "c_fc" && last != "c_proj" && last != "q_attn") return false;
  if (!config.is_object()) return true;
  if (auto a = config.find("architectures"); a != config.end() && a->is_array())
    for (const Json& arch : *a)
      if (arch.is_string())
        for (const char* p : {"GPT2", "OpenAIGPT", "ImageGPT", "DecisionTransformer"})
          if (arch.get<std::string>().rfind(p, 0) == 0) return true;
  const auto t = config.find("model_type");
  if (t == config.end() || !t->is_string()) return true;
  const std::string type = t->get<std::string>();
  return type == "gpt2" || type == "openai-gpt" || type == "imagegpt" || type == "decision_transformer";
}

bool is_embedding(const std::string& module) {
  return default_keep(module + ".weight", Shape{1, 1}, StDType::bf16) == Keep::embedding;
}

void add_ignored(std::vector<std::string>& ignore, const std::string& module, Keep k) {
  if (k == Keep::norm) return;
  if (std::find(ignore.begin(), ignore.end(), module) == ignore.end()) ignore.push_back(module);
}

void add_tied_lm_head(std::vector<std::string>& ignore, const detail::Json& config,
                      const std::vector<std::string>& quantized) {
  auto ties = [](const Json& c) {
    const auto it = c.find("tie_word_embeddings");
    return it != c.end() && it->is_boolean() && it->get<bool>();
  };
  if (!config.is_object()) return;
  const auto text = config.find("text_config");
  if (!ties(config) && !(text != config.end() && text->is_object() && ties(*text))) return;
  if (std::find(quantized.begin(), quantized.end(), "lm_head") != quantized.end()) return;
  add_ignored(ignore, "lm_head", Keep::lm_head);
}

void add_ignored_tensor(std::vector<std::string>& ignore, const std::string& name, const Shape& shape, StDType dtype) {
  if (looks_like_weight(name, shape)) add_ignored(ignore, owner_module(name), default_keep(name, shape, dtype));
}

}  // namespace ck
}  // namespace microscale::io
