// compressed-tensors' config groups and how a module is matched to one (ct_groups.hpp).
#include "io/ct_groups.hpp"

#include <algorithm>

namespace microscale::io::ck {

namespace {

std::int64_t positive_int(const Json& v, const std::string& what) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX) ||
      v.get<std::int64_t>() <= 0)
    throw Error("config.json: " + what + " must be a positive integer, got " + v.dump());
  return v.get<std::int64_t>();
}

std::string lower_string(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return "";
  std::string s = it->get<std::string>();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

CtFormat format_kind(const std::string& f) {
  if (f == "float-quantized") return CtFormat::float_quantized;
  if (f == "nvfp4-pack-quantized") return CtFormat::nvfp4_pack;
  if (f == "mxfp4-pack-quantized") return CtFormat::mxfp4_pack;
  if (f == "mxfp8-quantized") return CtFormat::mxfp8;
  return CtFormat::other;
}

// Older configs name one format for the whole checkpoint and none per group; a mixed one says
// "mixed-precision" there, and then a group without its own is told by its weights.
std::string group_format(const Json& group, const std::string& top) {
  if (std::string f = lower_string(group, "format"); !f.empty()) return f;
  if (!top.empty() && top != "mixed-precision") return top;
  const auto w = group.find("weights");
  if (w == group.end() || !w->is_object()) return "";
  const auto bits = w->find("num_bits");
  const auto group_size = w->find("group_size");
  if (lower_string(*w, "type") != "float" || bits == w->end() || !bits->is_number_integer()) return "";
  // compressed-tensors tells MXFP8 from FP8 the same way: groups of 32 with uint8 (E8M0) scales.
  if (*bits == 8 && group_size != w->end() && *group_size == 32 && lower_string(*w, "scale_dtype") == "torch.uint8")
    return "mxfp8-quantized";
  if (*bits == 8) return "float-quantized";
  if (*bits == 4 && group_size != w->end() && *group_size == 16) return "nvfp4-pack-quantized";
  if (*bits == 4 && group_size != w->end() && *group_size == 32) return "mxfp4-pack-quantized";
  return "";
}

std::vector<CtTarget> parse_targets(const Json& list, const std::string& what) {
  std::vector<CtTarget> out;
  if (list.is_string()) return parse_targets(Json::array({list}), what);
  if (!list.is_array()) throw Error("config.json: " + what + " must be a list of names, got " + list.dump());
  for (const Json& t : list) {
    if (!t.is_string()) throw Error("config.json: " + what + " holds " + t.dump() + ", not a name");
    const std::string s = t.get<std::string>();
    CtTarget target{CtTarget::Kind::name, s, std::nullopt};
    if (s.starts_with("re:")) {
      target.kind = CtTarget::Kind::regex;
      try {
        target.pattern.emplace(s.substr(3), std::regex::ECMAScript | std::regex::optimize);
      } catch (const std::regex_error& e) {
        throw Error("config.json: " + what + " pattern " + detail::quote(s) +
                    " is not a regular expression microscale can read (" + e.what() + ")");
      }
    } else if (!s.empty() && std::isupper(static_cast<unsigned char>(s[0])) && s.find('.') == std::string::npos) {
      target.kind = CtTarget::Kind::class_name;  // "Linear", "Embedding": module names are lower case
    }
    out.push_back(std::move(target));
  }
  return out;
}

}  // namespace

std::array<std::int64_t, 2> config_block_pair(const Json& v, const std::string& what) {
  if (!v.is_array() || v.size() != 2) throw Error("config.json: " + what + " must be [rows, cols], got " + v.dump());
  return {positive_int(v[0], what), positive_int(v[1], what)};
}

const char* name(CtFormat kind) {
  switch (kind) {
    case CtFormat::float_quantized: return "float-quantized";
    case CtFormat::nvfp4_pack: return "nvfp4-pack-quantized";
    case CtFormat::mxfp4_pack: return "mxfp4-pack-quantized";
    case CtFormat::mxfp8: return "mxfp8-quantized";
    case CtFormat::other: break;
  }
  return "?";
}

bool CtTarget::matches(const std::string& module) const {
  switch (kind) {
    case Kind::name: return module == text;
    case Kind::regex: return std::regex_search(module, *pattern, std::regex_constants::match_continuous);
    case Kind::class_name: return text == "Linear";
  }
  return false;
}

bool CtGroups::ignored(const std::string& module) const {
  return std::any_of(ignore.begin(), ignore.end(), [&](const CtTarget& t) { return t.matches(module); });
}

const CtGroup* CtGroups::claim(const std::string& module, const std::string& tensor) const {
  if (ignored(module)) return nullptr;
  std::optional<CtTarget::Kind> best;
  std::vector<std::pair<std::size_t, const CtTarget*>> claims;  // group, its target, at `best`
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (const CtTarget& t : targets[g]) {
      if (!t.matches(module) || (best && t.kind > *best)) continue;
      if (!best || t.kind < *best) claims.clear();
      best = t.kind;
      if (claims.empty() || claims.back().first != g) claims.emplace_back(g, &t);
    }
  if (claims.size() > 1)
    throw Error("tensor " + detail::quote(tensor) +
                " is claimed by two config groups of config.json: " + detail::quote(groups[claims[0].first].name) +
                " (target " + detail::quote(claims[0].second->text) + ") and " +
                detail::quote(groups[claims[1].first].name) + " (target " + detail::quote(claims[1].second->text) +
                "); compressed-tensors cannot tell which scheme it has. Make the targets exclusive (an exact name "
                "or a \"re:\" pattern takes precedence over a class name such as \"Linear\")");
  return claims.empty() ? nullptr : &groups[claims[0].first];
}

CtGroups ct_groups(const Json& config) {
  CtGroups out;
  if (!config.is_object()) return out;
  const auto qc = config.find("quantization_config");
  if (qc == config.end() || !qc->is_object() || lower_string(*qc, "quant_method") != "compressed-tensors") return out;
  const auto groups = qc->find("config_groups");
  if (groups == qc->end() || !groups->is_object()) return out;
  const std::string top = lower_string(*qc, "format");
  for (const auto& [key, g] : groups->items()) {
    if (!g.is_object()) continue;
    const std::string what = "quantization_config.config_groups." + key;
    CtGroup group;
    group.name = key;
    group.format = group_format(g, top);
    group.kind = format_kind(group.format);
    if (const auto w = g.find("weights"); w != g.end() && w->is_object()) {
      group.strategy = lower_string(*w, "strategy");
      if (group.strategy == "block" && w->contains("block_structure"))
        group.block = config_block_pair((*w)["block_structure"], what + ".weights.block_structure");
      if (group.strategy == "group" && w->contains("group_size"))
        group.block = {1, positive_int((*w)["group_size"], what + ".weights.group_size")};
    }
    const auto t = g.find("targets");
    out.targets.push_back(t == g.end() ? std::vector<CtTarget>{} : parse_targets(*t, what + ".targets"));
    for (const CtTarget& target : out.targets.back()) group.targets.push_back(target.text);
    group.config = g;
    out.groups.push_back(std::move(group));
  }
  if (const auto ig = qc->find("ignore"); ig != qc->end() && !ig->is_null())
    out.ignore = parse_targets(*ig, "quantization_config.ignore");
  return out;
}

}  // namespace microscale::io::ck
