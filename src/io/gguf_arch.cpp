// What llama.cpp's converter writes per architecture (gguf_arch.hpp); docs/gguf.md, "Architectures",
// lists the facts this follows.
#include "io/gguf_arch.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <span>

namespace microscale::io::gguf {
namespace {

enum class Family { llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gptoss };

struct Supported {
  std::string_view hf_type;
  Family family;
  std::string_view arch;
  bool tied_by_default;  // transformers' default for tie_word_embeddings of this config class
};
constexpr Supported kSupported[] = {
    {"llama", Family::llama, "llama", false},   {"mistral", Family::llama, "llama", false},
    {"mixtral", Family::llama, "llama", false}, {"qwen2", Family::qwen2, "qwen2", false},
    {"qwen3", Family::qwen3, "qwen3", false},   {"qwen3_moe", Family::qwen3moe, "qwen3moe", false},
    {"gemma2", Family::gemma2, "gemma2", true}, {"gemma3_text", Family::gemma3, "gemma3", true},
    {"phi3", Family::phi3, "phi3", false},      {"gpt_oss", Family::gptoss, "gpt-oss", false},
};

const Supported* find_supported(std::string_view hf_type) {
  for (const Supported& s : kSupported)
    if (s.hf_type == hf_type) return &s;
  return nullptr;
}

std::string supported_list() {
  std::string out;
  for (const Supported& s : kSupported) out += (out.empty() ? "" : ", ") + std::string(s.hf_type);
  return out;
}

// The config as the converter sees it: a "text_config" is merged into the top level, and a key
// present with a null value counts as present (the converter's find_hparam stops there).
class Hparams {
 public:
  Hparams(const Json& config, std::string model_type) : h_(config), model_type_(std::move(model_type)) {
    if (const auto t = config.find("text_config"); t != config.end() && t->is_object())
      for (const auto& [k, v] : t->items()) h_[k] = v;
  }
  const std::string& model_type() const { return model_type_; }

  // The value of the first of `keys` present (possibly null), or nullptr.
  const Json* first(std::initializer_list<std::string_view> keys) const {
    for (std::string_view k : keys)
      if (const auto it = h_.find(std::string(k)); it != h_.end()) return &*it;
    return nullptr;
  }
  // Like first(), but null reads as absent.
  const Json* get(std::initializer_list<std::string_view> keys) const {
    const Json* v = first(keys);
    return v && !v->is_null() ? v : nullptr;
  }
  const Json& required(std::initializer_list<std::string_view> keys) const {
    if (const Json* v = get(keys)) return *v;
    std::string names;
    for (std::string_view k : keys) names += (names.empty() ? "\"" : " or \"") + std::string(k) + "\"";
    throw Error(model_type_ + " config: " + names + " missing (llama.cpp's converter needs it)");
  }
  const Json& raw() const { return h_; }
  // The config key holding `v` (a value first() returned) for messages; `fallback` for a value
  // found elsewhere (inside rope_parameters).
  std::string_view name_of(const Json& v, std::string_view fallback) const {
    for (auto it = h_.begin(); it != h_.end(); ++it)
      if (&*it == &v) return it.key();
    return fallback;
  }

 private:
  Json h_;
  std::string model_type_;
};

const Json* member(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(std::string(key));
  return it != obj.end() && !it->is_null() ? &*it : nullptr;
}

std::uint32_t as_u32(const Json& v, std::string_view key, const std::string& model_type) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= std::numeric_limits<std::uint32_t>::max())
    return static_cast<std::uint32_t>(v.get<std::uint64_t>());
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0 &&
      v.get<std::int64_t>() <= std::numeric_limits<std::uint32_t>::max())
    return static_cast<std::uint32_t>(v.get<std::int64_t>());
  throw Error(model_type + " config: \"" + std::string(key) + "\" is " + v.dump() +
              ", not an integer from 0 to 2^32-1 (GGUF stores it as uint32)");
}

double as_number(const Json& v, std::string_view key, const std::string& model_type) {
  if (v.is_number()) return v.get<double>();
  throw Error(model_type + " config: \"" + std::string(key) + "\" is " + v.dump() + ", not a number");
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Keys of one architecture, in the order first written; writing a key again replaces its value
// in place, as gguf-py's writer does when a model class overrides its base class's value.
class KvList {
 public:
  KvList(std::string arch, const Hparams& h) : arch_(std::move(arch)), h_(h) {}
  void u32(std::string_view suffix, const Json& v) {
    set(kv_u32(key(suffix), as_u32(v, h_.name_of(v, suffix), h_.model_type())));
  }
  void u32_value(std::string_view suffix, std::uint32_t v) { set(kv_u32(key(suffix), v)); }
  void f32(std::string_view suffix, const Json& v) {
    set(kv_f32(key(suffix), static_cast<float>(as_number(v, h_.name_of(v, suffix), h_.model_type()))));
  }
  void str(std::string_view suffix, std::string v) { set(kv_str(key(suffix), std::move(v))); }
  void boolean(std::string_view suffix, bool v) { set(kv_bool(key(suffix), v)); }
  const Kv* find(std::string_view suffix) const {
    const std::string k = key(suffix);
    for (const Kv& kv : list_)
      if (kv.key == k) return &kv;
    return nullptr;
  }
  std::vector<Kv> take() { return std::move(list_); }

 private:
  std::string key(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }
  void set(Kv kv) {
    for (Kv& k : list_)
      if (k.key == kv.key) {
        k = std::move(kv);
        return;
      }
    list_.push_back(std::move(kv));
  }
  std::string arch_;
  const Hparams& h_;
  std::vector<Kv> list_;
};

// rope_parameters (transformers 5) or rope_scaling (4), with the top-level rope keys of older
// configs copied in when neither per-attention-type entry is there.
Json rope_parameters(const Hparams& h) {
  const Json* given = h.first({"rope_parameters"});
  if (!given) given = h.first({"rope_scaling"});
  Json rope = given && given->is_object() ? *given : Json::object();
  if (rope.contains("full_attention") || rope.contains("sliding_attention")) return rope;
  if (const Json* local =
          h.get({"local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq"}))
    rope["sliding_attention"] = Json{{"rope_theta", *local}};
  const auto mirror = [&](const char* name, const Json* v) {
    if (!rope.contains(name) && v) rope[name] = *v;
  };
  mirror("rope_theta",
         h.get({"global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"}));
  mirror("rope_type", member(rope, "type"));
  mirror("partial_rotary_factor", h.get({"partial_rotary_factor", "rope_pct", "rope_percent"}));
  mirror("original_max_position_embeddings", h.get({"original_max_position_embeddings"}));
  return rope;
}

const Json& full_attention(const Json& rope) {
  const Json* full = member(rope, "full_attention");
  return full ? *full : rope;
}

// The converter's TextModel.set_gguf_parameters, which most architectures start from.
void base_params(const Hparams& h, const Json& rope, KvList& kv) {
  kv.u32("block_count", h.required({"n_layers", "num_hidden_layers", "n_layer", "num_layers"}));
  const auto optional_u32 = [&](std::string_view suffix, std::initializer_list<std::string_view> keys) {
    if (const Json* v = h.first(keys); v && !v->is_null()) kv.u32(suffix, *v);
  };
  optional_u32("context_length", {"max_position_embeddings", "n_ctx", "n_positions", "max_length",
                                  "max_sequence_length", "model_max_length"});
  optional_u32("embedding_length", {"hidden_size", "n_embd", "dim"});
  optional_u32("feed_forward_length", {"prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size",
                                       "n_inner", "hidden_dim"});
  optional_u32("attention.head_count", {"num_attention_heads", "n_head", "n_heads"});
  optional_u32("attention.head_count_kv", {"num_key_value_heads", "n_kv_heads"});
  if (const Json* causal = member(h.raw(), "is_causal"); causal && causal->is_boolean() && !causal->get<bool>())
    kv.boolean("attention.causal", false);

  const Json& full = full_attention(rope);
  if (const Json* type = member(full, "rope_type"); type && type->is_string()) {
    const std::string t = type->get<std::string>();
    const Json* factor = member(full, "factor");
    if (t == "linear" && factor) {
      kv.str("rope.scaling.type", "linear");
      kv.f32("rope.scaling.factor", *factor);
    } else if (t == "yarn" && factor) {
      kv.str("rope.scaling.type", "yarn");
      kv.f32("rope.scaling.factor", *factor);
      const Json* orig = member(full, "original_max_position_embeddings");
      if (!orig)
        throw Error(h.model_type() +
                    " config: yarn rope scaling without \"original_max_position_embeddings\" "
                    "(llama.cpp's converter needs it)");
      kv.u32("rope.scaling.original_context_length", *orig);
      if (const Json* v = member(full, "extrapolation_factor")) kv.f32("rope.scaling.yarn_ext_factor", *v);
      const Json* attn =
          full.contains("attention_factor") ? member(full, "attention_factor") : member(full, "attn_factor");
      if (attn) kv.f32("rope.scaling.yarn_attn_factor", *attn);
      if (const Json* v = member(full, "beta_fast")) kv.f32("rope.scaling.yarn_beta_fast", *v);
      if (const Json* v = member(full, "beta_slow")) kv.f32("rope.scaling.yarn_beta_slow", *v);
    } else if (t == "su" || t == "longrope") {
      kv.str("rope.scaling.type", "longrope");
    }
    // "llama3" becomes the rope_freqs tensor (llama_rope_freqs); "default" and others write nothing.
  }
  if (const Json* theta = member(full, "rope_theta")) kv.f32("rope.freq_base", *theta);
  if (const Json* sliding = member(rope, "sliding_attention"))
    if (const Json* theta = member(*sliding, "rope_theta")) kv.f32("rope.freq_base_swa", *theta);

  if (const Json* v = h.first({"rms_norm_eps", "norm_eps"}); v && !v->is_null())
    kv.f32("attention.layer_norm_rms_epsilon", *v);
  if (const Json* v = h.first({"layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"}); v && !v->is_null())
    kv.f32("attention.layer_norm_epsilon", *v);
  optional_u32("expert_count", {"num_local_experts", "num_experts", "n_routed_experts"});
  optional_u32("expert_used_count", {"num_experts_per_tok", "num_experts_per_token", "top_k_experts"});
  if (const Json* head_dim = h.get({"head_dim"})) {
    kv.u32("attention.key_length", *head_dim);
    kv.u32("attention.value_length", *head_dim);
  }
}

std::uint32_t u32_of(const Hparams& h, std::initializer_list<std::string_view> keys) {
  const Json& v = h.required(keys);
  return as_u32(v, h.name_of(v, *keys.begin()), h.model_type());
}

// Llama's rope dimension: head_dim, or hidden_size / num_attention_heads.
std::uint32_t llama_head_dim(const Hparams& h) {
  if (const Json* d = h.get({"head_dim"})) return as_u32(*d, "head_dim", h.model_type());
  const std::uint32_t heads = u32_of(h, {"num_attention_heads"});
  if (heads == 0) throw Error(h.model_type() + " config: \"num_attention_heads\" is 0");
  return u32_of(h, {"hidden_size"}) / heads;
}

double number_or(const Json& obj, std::string_view key, double fallback, const std::string& model_type) {
  const Json* v = member(obj, key);
  return v ? as_number(*v, key, model_type) : fallback;
}

// Llama 3's per-frequency rope factors (rope_type "llama3"): long wavelengths divided by `factor`,
// short ones kept, a smooth blend between; computed in float32 as the converter's torch code does.
std::vector<float> llama3_rope_freqs(const Hparams& h, const Json& full) {
  const std::string& mt = h.model_type();
  const float base = static_cast<float>(number_or(full, "rope_theta", 10000.0, mt));
  const std::uint32_t dim = llama_head_dim(h);
  const float factor = static_cast<float>(number_or(full, "factor", 8.0, mt));
  const float low = static_cast<float>(number_or(full, "low_freq_factor", 1.0, mt));
  const float high = static_cast<float>(number_or(full, "high_freq_factor", 4.0, mt));
  const float old_ctx = static_cast<float>(number_or(full, "original_max_position_embeddings", 8192.0, mt));
  const float low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  std::vector<float> out;
  for (std::uint32_t i = 0; i < dim; i += 2) {
    const float freq = 1.0f / std::pow(base, static_cast<float>(i) / static_cast<float>(dim));
    const float wavelen = 2.0f * std::numbers::pi_v<float> / freq;
    if (wavelen < high_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      out.push_back(factor);
    } else {
      const float smooth = (old_ctx / wavelen - low) / (high - low);
      out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return out;
}

std::vector<float> float_list(const Json& v, std::string_view key, const std::string& model_type) {
  if (!v.is_array()) throw Error(model_type + " config: \"" + std::string(key) + "\" is not a list");
  std::vector<float> out;
  for (const Json& x : v) out.push_back(static_cast<float>(as_number(x, key, model_type)));
  return out;
}

void phi3_params(const Hparams& h, const Json& rope, KvList& kv, ArchPlan& plan) {
  const std::string& mt = h.model_type();
  const std::uint32_t n_embd = u32_of(h, {"hidden_size", "n_embd"});
  const std::uint32_t n_head = u32_of(h, {"num_attention_heads", "n_head"});
  const Json& n_head_kv = h.required({"num_key_value_heads", "n_head_kv"});
  const Json& rms_eps = h.required({"rms_norm_eps"});
  const Json& max_pos = h.required({"n_positions", "max_position_embeddings"});
  const Json* orig = member(rope, "original_max_position_embeddings");
  if (!orig) throw Error(mt + " config: \"original_max_position_embeddings\" missing (llama.cpp's converter needs it)");
  if (n_head == 0) throw Error(mt + " config: \"num_attention_heads\" is 0");
  const double rot_pct = number_or(rope, "partial_rotary_factor", 1.0, mt);
  const auto rope_dims = static_cast<std::uint32_t>(std::floor(rot_pct * n_embd)) / n_head;

  kv.u32("context_length", max_pos);
  kv.u32("rope.scaling.original_context_length", *orig);
  kv.u32_value("embedding_length", n_embd);
  kv.u32("feed_forward_length", h.required({"intermediate_size"}));
  kv.u32("block_count", h.required({"n_layers", "num_hidden_layers", "n_layer", "num_layers"}));
  kv.u32_value("attention.head_count", n_head);
  kv.u32("attention.head_count_kv", n_head_kv);
  kv.f32("attention.layer_norm_rms_epsilon", rms_eps);
  kv.u32_value("rope.dimension_count", rope_dims);
  const Json* theta = member(full_attention(rope), "rope_theta");
  if (!theta) throw Error(mt + " config: \"rope_theta\" missing (llama.cpp's converter needs it)");
  kv.f32("rope.freq_base", *theta);
  // 0 where the config has none: llama.cpp tells Phi-4 (a window) from Phi-3 by it.
  const Json* window = h.get({"sliding_window"});
  kv.u32_value("attention.sliding_window", window ? as_u32(*window, "sliding_window", mt) : 0);

  // Long-context Phi-3 (longrope): per-frequency factors as two tensors and an attention factor.
  const Json* long_factor = member(rope, "long_factor");
  if (!long_factor || (long_factor->is_array() && long_factor->empty())) return;
  const double scale =
      as_number(max_pos, "max_position_embeddings", mt) / as_number(*orig, "original_max_position_embeddings", mt);
  const Json* type = member(rope, "rope_type");
  const std::string t = type && type->is_string() ? lower(type->get<std::string>()) : "";
  if (t.empty()) throw Error(mt + " config: rope scaling with long_factor but no \"rope_type\"");
  double attn_factor = 1.0;
  if (t == "su" || t == "longrope") {
    if (scale > 1.0)
      attn_factor =
          std::sqrt(1.0 + std::log(scale) / std::log(as_number(*orig, "original_max_position_embeddings", mt)));
  } else if (t == "yarn") {
    if (scale > 1.0) attn_factor = 0.1 * std::log(scale) + 1.0;
  } else {
    throw Error(mt + " config: rope_type \"" + t +
                "\" with long_factor is not one llama.cpp's converter supports "
                "(su, longrope, yarn)");
  }
  kv.f32("rope.scaling.attn_factor", Json(attn_factor));
  const Json* short_factor = member(rope, "short_factor");
  if (!short_factor) throw Error(mt + " config: rope scaling has \"long_factor\" but no \"short_factor\"");
  std::vector<float> longs = float_list(*long_factor, "long_factor", mt);
  std::vector<float> shorts = float_list(*short_factor, "short_factor", mt);
  if (longs.size() != shorts.size() || 2 * longs.size() != rope_dims)
    throw Error(mt + " config: long_factor and short_factor must each hold " + std::to_string(rope_dims / 2) +
                " values (half the rope dimensions), not " + std::to_string(longs.size()) + " and " +
                std::to_string(shorts.size()));
  plan.extra_tensors.push_back({"rope_factors_long.weight", std::move(longs)});
  plan.extra_tensors.push_back({"rope_factors_short.weight", std::move(shorts)});
}

void gemma2_params(const Hparams& h, KvList& kv) {
  kv.u32("context_length", h.required({"max_position_embeddings"}));
  kv.u32("embedding_length", h.required({"hidden_size"}));
  kv.u32("block_count", h.required({"n_layers", "num_hidden_layers", "n_layer", "num_layers"}));
  kv.u32("feed_forward_length", h.required({"intermediate_size"}));
  kv.u32("attention.head_count", h.required({"num_attention_heads"}));
  kv.u32("attention.head_count_kv",
         h.first({"num_key_value_heads"}) ? h.required({"num_key_value_heads"}) : h.required({"num_attention_heads"}));
  kv.f32("attention.layer_norm_rms_epsilon", h.required({"rms_norm_eps"}));
  kv.u32("attention.key_length", h.required({"head_dim"}));
  kv.u32("attention.value_length", h.required({"head_dim"}));
  kv.f32("attn_logit_softcapping", h.required({"attn_logit_softcapping"}));
  kv.f32("final_logit_softcapping", h.required({"final_logit_softcapping"}));
  kv.u32("attention.sliding_window", h.required({"sliding_window"}));
}

// Gemma 3 starts from the base and then fills in Gemma's defaults for keys a config may omit.
void gemma3_params(const Hparams& h, const Json& rope, KvList& kv) {
  base_params(h, rope, kv);
  // A key the config has, or Gemma's default.
  const Json defaults{{"max_position_embeddings", 131072},
                      {"num_attention_heads", 8},
                      {"rms_norm_eps", 1e-6},
                      {"head_dim", 256},
                      {"num_key_value_heads", 4}};
  const auto value_or = [&](const char* key) -> const Json& {
    const Json* v = h.get({key});
    return v ? *v : defaults.at(key);
  };
  kv.u32("context_length", value_or("max_position_embeddings"));
  kv.u32("attention.head_count", value_or("num_attention_heads"));
  kv.f32("attention.layer_norm_rms_epsilon", value_or("rms_norm_eps"));
  kv.u32("attention.key_length", value_or("head_dim"));
  kv.u32("attention.value_length", value_or("head_dim"));
  kv.f32("rope.freq_base", Json(number_or(full_attention(rope), "rope_theta", 1e6, h.model_type())));
  if (h.get({"attn_logit_softcapping"}))
    throw Error(h.model_type() +
                " config: \"attn_logit_softcapping\" is set, but Gemma 3 has none "
                "(llama.cpp's converter refuses it)");
  if (const Json* cap = h.get({"final_logit_softcapping"});
      cap && as_number(*cap, "final_logit_softcapping", h.model_type()) != 0)
    kv.f32("final_logit_softcapping", *cap);
  // The converter writes the window unless every layer is global; llama.cpp's Gemma 3 loader
  // assumes its pattern (5 local layers, then 1 global) when no pattern key is written.
  const Json* pattern = h.get({"sliding_window_pattern"});
  if (!pattern || !(pattern->is_number() && pattern->get<double>() == 1))
    kv.u32("attention.sliding_window", h.required({"sliding_window"}));
  kv.u32("attention.head_count_kv", value_or("num_key_value_heads"));
}

// --- tensors ---

enum class Kind { linear, norm, router, sinks };
struct Entry {
  std::string_view hf;    // module below "model.layers.<N>."
  std::string_view gguf;  // below "blk.<N>."
  Kind kind = Kind::linear;
};

constexpr Entry kLlama[] = {
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"input_layernorm", "attn_norm", Kind::norm},
    {"post_attention_layernorm", "ffn_norm", Kind::norm},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
    // Mixtral
    {"block_sparse_moe.gate", "ffn_gate_inp", Kind::router},
    {"block_sparse_moe.switch_mlp.gate_proj", "ffn_gate_exps"},
    {"block_sparse_moe.switch_mlp.up_proj", "ffn_up_exps"},
    {"block_sparse_moe.switch_mlp.down_proj", "ffn_down_exps"},
};
constexpr Entry kQwen2[] = {
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"input_layernorm", "attn_norm", Kind::norm},
    {"post_attention_layernorm", "ffn_norm", Kind::norm},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};
constexpr Entry kQwen3[] = {
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"self_attn.q_norm", "attn_q_norm", Kind::norm},
    {"self_attn.k_norm", "attn_k_norm", Kind::norm},
    {"input_layernorm", "attn_norm", Kind::norm},
    {"post_attention_layernorm", "ffn_norm", Kind::norm},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};
constexpr Entry kQwen3Moe[] = {
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"self_attn.q_norm", "attn_q_norm", Kind::norm},
    {"self_attn.k_norm", "attn_k_norm", Kind::norm},
    {"input_layernorm", "attn_norm", Kind::norm},
    {"post_attention_layernorm", "ffn_norm", Kind::norm},
    {"mlp.gate", "ffn_gate_inp", Kind::router},
    {"mlp.switch_mlp.gate_proj", "ffn_gate_exps"},
    {"mlp.switch_mlp.up_proj", "ffn_up_exps"},
    {"mlp.switch_mlp.down_proj", "ffn_down_exps"},
};
// Gemma's four norms per layer: around attention and around the MLP.
constexpr Entry kGemma2[] = {
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"input_layernorm", "attn_norm", Kind::norm},
    {"post_attention_layernorm", "post_attention_norm", Kind::norm},
    {"pre_feedforward_layernorm", "ffn_norm", Kind::norm},
    {"post_feedforward_layernorm", "post_ffw_norm", Kind::norm},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};
constexpr Entry kGemma3[] = {
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"self_attn.q_norm", "attn_q_norm", Kind::norm},
    {"self_attn.k_norm", "attn_k_norm", Kind::norm},
    {"input_layernorm", "attn_norm", Kind::norm},
    {"post_attention_layernorm", "post_attention_norm", Kind::norm},
    {"pre_feedforward_layernorm", "ffn_norm", Kind::norm},
    {"post_feedforward_layernorm", "post_ffw_norm", Kind::norm},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};
// Phi-3 keeps q, k, v fused, and gate and up fused under llama.cpp's ffn_up.
constexpr Entry kPhi3[] = {
    {"self_attn.qkv_proj", "attn_qkv"},
    {"self_attn.o_proj", "attn_output"},
    {"input_layernorm", "attn_norm", Kind::norm},
    {"post_attention_layernorm", "ffn_norm", Kind::norm},
    {"mlp.gate_up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};
// gpt-oss: experts split from gate_up_proj by the exporter (gate_proj, up_proj, down_proj, with
// biases), a router with a bias, and per-head attention sinks.
constexpr Entry kGptOss[] = {
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"self_attn.sinks", "attn_sinks", Kind::sinks},
    {"input_layernorm", "attn_norm", Kind::norm},
    {"post_attention_layernorm", "post_attention_norm", Kind::norm},
    {"mlp.router", "ffn_gate_inp", Kind::router},
    {"mlp.experts.gate_proj", "ffn_gate_exps"},
    {"mlp.experts.up_proj", "ffn_up_exps"},
    {"mlp.experts.down_proj", "ffn_down_exps"},
};

std::span<const Entry> entries(Family f) {
  switch (f) {
    case Family::llama: return kLlama;
    case Family::qwen2: return kQwen2;
    case Family::qwen3: return kQwen3;
    case Family::qwen3moe: return kQwen3Moe;
    case Family::gemma2: return kGemma2;
    case Family::gemma3: return kGemma3;
    case Family::phi3: return kPhi3;
    case Family::gptoss: return kGptOss;
  }
  return {};
}

enum class Leaf { weight, bias, scale, input_scale };
constexpr std::pair<std::string_view, Leaf> kLeaves[] = {
    {".weight", Leaf::weight}, {".bias", Leaf::bias}, {".input_scale", Leaf::input_scale}, {".scale", Leaf::scale}};

std::string_view leaf_suffix(Leaf l) {
  for (const auto& [s, leaf] : kLeaves)
    if (leaf == l) return s;
  return {};
}

std::uint32_t kv_value(const ArchPlan& a, std::string_view suffix) {
  const std::string key = a.arch + "." + std::string(suffix);
  for (const Kv& kv : a.kvs)
    if (kv.key == key && kv.value.is_number_unsigned()) return kv.value.get<std::uint32_t>();
  return 0;
}

}  // namespace

ArchPlan arch_plan(const Json& config) {
  if (!config.is_object()) throw Error("config.json is not a JSON object");
  const Json* type = member(config, "model_type");
  const Json* text = member(config, "text_config");
  // A multimodal wrapper's text_config names the text model's type ("gemma3" holds "gemma3_text").
  if (text && member(*text, "model_type")) type = member(*text, "model_type");
  if (!type || !type->is_string())
    throw Error("config.json has no \"model_type\"; GGUF export supports: " + supported_list());
  const std::string model_type = type->get<std::string>();
  const Supported* s = find_supported(model_type);
  if (!s)
    throw Error("model_type \"" + model_type + "\" has no GGUF architecture here; supported: " + supported_list());

  const Hparams h(config, model_type);
  const Json rope = rope_parameters(h);
  ArchPlan plan;
  plan.hf_type = model_type;
  plan.arch = std::string(s->arch);
  KvList kv(plan.arch, h);
  switch (s->family) {
    case Family::llama: {
      base_params(h, rope, kv);
      kv.u32("vocab_size", h.required({"vocab_size"}));
      kv.u32_value("rope.dimension_count", llama_head_dim(h));
      // The q/k permutation needs both head counts.
      h.required({"num_attention_heads", "n_heads"});
      h.required({"num_key_value_heads", "n_kv_heads"});
      const Json& full = full_attention(rope);
      if (const Json* t = member(full, "rope_type"); t && t->is_string() && lower(t->get<std::string>()) == "llama3")
        plan.extra_tensors.push_back({"rope_freqs.weight", llama3_rope_freqs(h, full)});
      break;
    }
    case Family::qwen2:
    case Family::qwen3: base_params(h, rope, kv); break;
    case Family::qwen3moe:
      base_params(h, rope, kv);
      if (const Json* v = h.get({"moe_intermediate_size"})) kv.u32("expert_feed_forward_length", *v);
      if (const Json* v = h.get({"shared_expert_intermediate_size"})) kv.u32("expert_shared_feed_forward_length", *v);
      break;
    case Family::gemma2: gemma2_params(h, kv); break;
    case Family::gemma3: gemma3_params(h, rope, kv); break;
    case Family::phi3: phi3_params(h, rope, kv, plan); break;
    case Family::gptoss:
      base_params(h, rope, kv);
      kv.u32("attention.sliding_window", h.required({"sliding_window"}));
      kv.u32("expert_feed_forward_length", h.required({"intermediate_size"}));
      break;
  }
  plan.kvs.push_back(kv_str("general.architecture", plan.arch));
  for (Kv& k : kv.take()) plan.kvs.push_back(std::move(k));
  if (const Json* v = h.get({"vocab_size"})) plan.vocab_size = as_u32(*v, "vocab_size", model_type);
  const Json* tie = h.get({"tie_word_embeddings"});
  plan.tied_embeddings = tie && tie->is_boolean() ? tie->get<bool>() : s->tied_by_default;
  return plan;
}

std::uint32_t llama_file_type(GgmlType weights) {
  switch (weights) {                  // gguf-py's LlamaFileType
    case GgmlType::f32: return 0;     // ALL_F32
    case GgmlType::f16: return 1;     // MOSTLY_F16
    case GgmlType::q8_0: return 7;    // MOSTLY_Q8_0
    case GgmlType::bf16: return 32;   // MOSTLY_BF16
    case GgmlType::mxfp4: return 38;  // MOSTLY_MXFP4_MOE
    case GgmlType::nvfp4: return 39;  // MOSTLY_NVFP4
  }
  return 1024;  // GUESSED
}

std::optional<TensorRule> tensor_rule(const ArchPlan& a, std::string_view n) {
  const Supported* s = find_supported(a.hf_type);
  if (!s) return std::nullopt;
  // Buffers transformers recomputes; the converter drops them.
  if (n.ends_with(".rotary_emb.inv_freq")) return TensorRule{.name = "", .skip = true};

  std::string_view module = n;
  Leaf leaf = Leaf::weight;
  bool has_leaf = false;
  for (const auto& [suffix, l] : kLeaves)
    if (n.ends_with(suffix)) {
      module = n.substr(0, n.size() - suffix.size());
      leaf = l;
      has_leaf = true;
      break;
    }
  // gpt-oss's sinks are a bare parameter; the converter names them "<...>.sinks.weight".
  if (!has_leaf && !(s->family == Family::gptoss && n.ends_with(".self_attn.sinks"))) return std::nullopt;

  const bool gemma = s->family == Family::gemma2 || s->family == Family::gemma3;
  TensorRule r;
  std::string base;
  Kind kind = Kind::linear;
  if (module == "model.embed_tokens") {
    if (leaf != Leaf::weight) return std::nullopt;
    base = "token_embd";
  } else if (module == "model.norm") {
    base = "output_norm";
    kind = Kind::norm;
  } else if (module == "lm_head") {
    // Gemma 2's head is its embedding; the converter drops a stored copy.
    if (s->family == Family::gemma2) return TensorRule{.name = "", .skip = true};
    if (leaf == Leaf::bias) return std::nullopt;
    base = "output";
  } else {
    constexpr std::string_view kLayers = "model.layers.";
    if (!module.starts_with(kLayers)) return std::nullopt;
    const std::string_view rest = module.substr(kLayers.size());
    const std::size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string_view::npos || dot > 9) return std::nullopt;
    const std::string_view index = rest.substr(0, dot);
    if (!std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
    if (index.size() > 1 && index[0] == '0') return std::nullopt;
    const std::string_view sub = rest.substr(dot + 1);
    const auto table = entries(s->family);
    const auto it = std::find_if(table.begin(), table.end(), [&](const Entry& e) { return e.hf == sub; });
    if (it == table.end()) return std::nullopt;
    base = "blk." + std::string(index) + "." + std::string(it->gguf);
    kind = it->kind;
  }

  switch (kind) {
    case Kind::norm:
      if (leaf != Leaf::weight) return std::nullopt;
      r.plus_one = gemma;  // Gemma's RMSNorm scales by (1 + w); llama.cpp's by the stored value
      r.f32 = true;
      break;
    case Kind::router:  // llama.cpp keeps the expert router in F32
      if (leaf != Leaf::weight && leaf != Leaf::bias) return std::nullopt;
      r.f32 = true;
      break;
    case Kind::sinks:
      if (leaf != Leaf::weight) return std::nullopt;
      r.f32 = true;
      break;
    case Kind::linear:
      r.f32 = leaf != Leaf::weight;  // biases and the F32 scale tensors
      break;
  }
  r.name = base + std::string(leaf_suffix(leaf));

  // Llama's q/k rows go from HF's rotate-half order to llama.cpp's interleaved pairs, per head.
  if (s->family == Family::llama && (leaf == Leaf::weight || leaf == Leaf::bias)) {
    const std::uint32_t heads = kv_value(a, "attention.head_count");
    const std::uint32_t kv_heads = kv_value(a, "attention.head_count_kv");
    // Head counts past int's range would turn negative and leave the rows unpermuted.
    const auto head_count = [&](std::uint32_t v, const char* key) {
      if (v > static_cast<std::uint32_t>(std::numeric_limits<int>::max()))
        throw Error(a.arch + "." + key + " = " + std::to_string(v) + " is not a head count");
      return static_cast<int>(v);
    };
    if (base.ends_with(".attn_q")) r.permute_heads = head_count(heads, "attention.head_count");
    if (base.ends_with(".attn_k"))
      r.permute_heads =
          kv_heads != 0 ? head_count(kv_heads, "attention.head_count_kv") : head_count(heads, "attention.head_count");
  }
  return r;
}

std::vector<std::string> hf_names(const ArchPlan& a, std::int64_t blocks) {
  const Supported* s = find_supported(a.hf_type);
  if (!s) return {};
  std::vector<std::string> modules = {"model.embed_tokens", "model.norm", "lm_head"};
  for (std::int64_t b = 0; b < blocks; ++b)
    for (const Entry& e : entries(s->family))
      modules.push_back("model.layers." + std::to_string(b) + "." + std::string(e.hf));
  std::vector<std::string> names;
  for (const std::string& m : modules) {
    for (const auto& [suffix, leaf] : kLeaves) names.push_back(m + std::string(suffix));
    if (m.ends_with(".self_attn.sinks")) names.push_back(m);
  }
  return names;
}

namespace {

// The rope keys in transformers 5's form (rope_parameters, per attention type when the sliding
// layers have their own theta), inverting base_params: what arch_plan reads back as the same keys.
// Phi-3's original context length is its own top-level key; longrope's factors are tensors, not
// keys, and are not rebuilt.
template <class Find>
Json rope_config(const std::string& a, const Find& find) {
  const auto key = [&](std::string_view suffix) { return find(a + "." + std::string(suffix)); };
  Json out = Json::object();
  Json full{{"rope_type", "default"}};
  if (const Json* theta = key("rope.freq_base")) full["rope_theta"] = *theta;
  const Json* type = key("rope.scaling.type");
  const Json* orig = key("rope.scaling.original_context_length");
  if (type && (*type == "linear" || *type == "yarn")) {
    full["rope_type"] = *type;
    if (const Json* v = key("rope.scaling.factor")) full["factor"] = *v;
  }
  if (type && *type == "yarn") {
    if (orig) full["original_max_position_embeddings"] = *orig;
    static constexpr std::pair<std::string_view, std::string_view> kYarn[] = {
        {"rope.scaling.yarn_ext_factor", "extrapolation_factor"},
        {"rope.scaling.yarn_attn_factor", "attention_factor"},
        {"rope.scaling.yarn_beta_fast", "beta_fast"},
        {"rope.scaling.yarn_beta_slow", "beta_slow"},
    };
    for (const auto& [suffix, name] : kYarn)
      if (const Json* v = key(suffix)) full[std::string(name)] = *v;
  } else if (orig) {
    out["original_max_position_embeddings"] = *orig;
  }
  if (const Json* swa = key("rope.freq_base_swa"))
    out["rope_parameters"] = {{"full_attention", full},
                              {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", *swa}}}};
  else
    out["rope_parameters"] = full;
  return out;
}

}  // namespace

namespace {

// A float32 key's value as the shortest decimal that reads back as the same float32 (1e-06, not
// 9.999999974752427e-07), as the config it came from most likely wrote it.
Json shortest(const Json& v) {
  if (!v.is_number_float()) return v;
  const auto f = static_cast<float>(v.get<double>());
  if (static_cast<double>(f) != v.get<double>()) return v;
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f);
  if (ec != std::errc()) return v;
  return Json(std::strtod(std::string(buf, end).c_str(), nullptr));
}

}  // namespace

Json hf_config(const std::vector<Kv>& kvs, std::int64_t vocab_size, bool has_output) {
  const auto find = [&](std::string_view key) -> const Json* {
    for (const Kv& kv : kvs)
      if (kv.key == key) return &kv.value;
    return nullptr;
  };
  const Json* arch = find("general.architecture");
  if (!arch || !arch->is_string()) throw Error("the GGUF has no general.architecture string");
  const std::string a = arch->get<std::string>();
  // The transformers class that holds each architecture's weights (Mistral's are Llama's).
  static constexpr std::array<std::array<std::string_view, 3>, 8> kClasses = {{
      {"llama", "llama", "LlamaForCausalLM"},
      {"qwen2", "qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "qwen3", "Qwen3ForCausalLM"},
      {"qwen3moe", "qwen3_moe", "Qwen3MoeForCausalLM"},
      {"gemma2", "gemma2", "Gemma2ForCausalLM"},
      {"gemma3", "gemma3_text", "Gemma3ForCausalLM"},
      {"phi3", "phi3", "Phi3ForCausalLM"},
      {"gpt-oss", "gpt_oss", "GptOssForCausalLM"},
  }};
  const auto cls = std::find_if(kClasses.begin(), kClasses.end(), [&](const auto& c) { return c[0] == a; });
  if (cls == kClasses.end())
    throw Error("GGUF architecture \"" + a + "\" has no transformers form here; supported: " + supported_list());
  Json c = Json::object();
  // llama.cpp's "llama" with experts is Mixtral, whose transformers class holds them.
  const bool mixtral = a == "llama" && find("llama.expert_count") != nullptr;
  c["architectures"] = Json::array({mixtral ? std::string("MixtralForCausalLM") : std::string((*cls)[2])});
  c["model_type"] = mixtral ? std::string("mixtral") : std::string((*cls)[1]);
  // GGUF key suffix -> config keys.
  static constexpr std::pair<std::string_view, std::string_view> kKeys[] = {
      {"block_count", "num_hidden_layers"},
      {"context_length", "max_position_embeddings"},
      {"embedding_length", "hidden_size"},
      {"feed_forward_length", "intermediate_size"},
      {"attention.head_count", "num_attention_heads"},
      {"attention.head_count_kv", "num_key_value_heads"},
      {"attention.layer_norm_rms_epsilon", "rms_norm_eps"},
      {"attention.key_length", "head_dim"},
      {"attention.sliding_window", "sliding_window"},
      {"rope.freq_base", "rope_theta"},
      {"expert_count", "num_experts"},
      {"expert_count", "num_local_experts"},
      {"expert_used_count", "num_experts_per_tok"},
      {"attn_logit_softcapping", "attn_logit_softcapping"},
      {"final_logit_softcapping", "final_logit_softcapping"},
  };
  for (const auto& [suffix, key] : kKeys)
    if (const Json* v = find(a + "." + std::string(suffix))) c[std::string(key)] = shortest(*v);
  if (const Json* v = find(a + ".expert_feed_forward_length"))
    c[a == "gpt-oss" ? "intermediate_size" : "moe_intermediate_size"] = *v;
  c.update(rope_config(a, find));
  // Settings GGUF has no key for, as llama.cpp's graphs fix them, so that transformers runs the
  // model llama.cpp runs. Gemma scales attention scores by 1/sqrt(head_dim), by
  // 1/sqrt(hidden / heads) for the 27B sizes (46 layers for Gemma 2, 62 for Gemma 3).
  if (a == "gemma2" || a == "gemma3") {
    const Json* layers = find(a + ".block_count");
    const Json* hidden = find(a + ".embedding_length");
    const Json* heads = find(a + ".attention.head_count");
    const bool is_27b = layers && *layers == (a == "gemma2" ? 46 : 62);
    if (is_27b && hidden && heads && heads->get<std::uint32_t>() != 0)
      c["query_pre_attn_scalar"] = hidden->get<std::uint32_t>() / heads->get<std::uint32_t>();
    else if (const Json* head_dim = find(a + ".attention.key_length"))
      c["query_pre_attn_scalar"] = *head_dim;
  }
  if (a == "qwen3moe") c["norm_topk_prob"] = true;  // llama.cpp always renormalizes the chosen experts
  // Phi-3's window 0 stands for none (the export writes 0 for a null window); transformers takes 0
  // for a window of zero tokens.
  if (const auto it = c.find("sliding_window"); it != c.end() && *it == 0) *it = nullptr;
  // Absent ids are written null: transformers' defaults (Phi-3's pad 32000) may lie outside the vocabulary.
  static constexpr std::pair<std::string_view, std::string_view> kSpecial[] = {
      {"tokenizer.ggml.bos_token_id", "bos_token_id"},
      {"tokenizer.ggml.eos_token_id", "eos_token_id"},
      {"tokenizer.ggml.padding_token_id", "pad_token_id"},
  };
  for (const auto& [key, name] : kSpecial) {
    const Json* v = find(key);
    c[std::string(name)] = v ? *v : Json(nullptr);
  }
  c["vocab_size"] = vocab_size;
  c["tie_word_embeddings"] = !has_output;
  return c;
}

}  // namespace microscale::io::gguf
