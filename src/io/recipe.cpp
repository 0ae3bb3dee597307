// Per-layer formats (docs/checkpoints.md, "Recipes"): the "FORMAT[,key=value...]" text of --layer,
// --candidate and recipe files, and the recipe file itself.
#include <string_view>

#include "io/detail.hpp"
#include "microscale/checkpoint.hpp"

namespace microscale::io {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

int small_int(const std::string& v, const std::string& key, const std::string& what) {
  if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos)
    throw Error(what + ": " + key + "=" + v + " is not a small positive integer");
  return std::stoi(v);
}

}  // namespace

LayerFormat parse_layer_format(const std::string& text, const std::string& what) {
  const std::vector<std::string> parts = split(text, ',');
  const std::string& f = parts.front();
  LayerFormat out;
  out.text = text;
  if (f == "keep") {
    if (parts.size() > 1) throw Error(what + ": 'keep' takes no options (" + detail::quote(text) + ")");
    return out;
  }
  QuantSpec s;
  if (f.starts_with("affine") && f.size() == 7 && f[6] >= '2' && f[6] <= '8' && f[6] != '7') {
    s.mode = Mode::affine;
    s.bits = f[6] - '0';
  } else if (f == "nvfp4" || f == "mxfp4" || f == "mxfp8") {
    s.mode = mode_from_name(f);
  } else {
    throw Error(what + ": unknown format " + detail::quote(f) +
                " (expected nvfp4, mxfp4, mxfp8, affine2 to affine8, or keep)");
  }
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::size_t eq = parts[i].find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(what + ": option " + detail::quote(parts[i]) + " of " + detail::quote(text) + " is not key=value");
    const std::string key = parts[i].substr(0, eq), v = parts[i].substr(eq + 1);
    try {
      if (key == "scale_search") {
        s.scale_search = scale_search_from_name(v);
      } else if (key == "scale_rule") {
        s.scale_rule = scale_rule_from_name(v);
        out.scale_rule_set = true;
      } else if (key == "group_size") {
        s.group_size = small_int(v, key, what);
      } else if (key == "elem") {
        s.elem = elem_from_name(v);
      } else if (key == "scale_2d") {
        if (v != "true" && v != "false") throw Error("scale_2d takes true or false, not " + detail::quote(v));
        s.scale_2d = v == "true";
      } else if (key == "levels") {
        if (s.mode != Mode::nvfp4) throw Error("levels is an nvfp4 option");
        if (v != "2" && v != "3") throw Error("levels takes 2 or 3, not " + detail::quote(v));
        out.levels = v[0] - '0';
      } else {
        throw Error("unknown option " + detail::quote(key) +
                    " (expected scale_search, scale_rule, group_size, elem, scale_2d or levels)");
      }
    } catch (const Error& e) {
      const std::string m = e.what();
      throw Error(m.starts_with(what) ? m : what + ": " + detail::quote(text) + ": " + m);
    }
  }
  try {
    (void)resolve(s);
  } catch (const Error& e) {
    throw Error(what + ": " + detail::quote(text) + ": " + e.what());
  }
  out.spec = s;
  return out;
}

std::vector<RecipeRule> read_recipe(const std::filesystem::path& path) {
  const std::string source = path.string();
  const std::string expected = "a recipe, a JSON object {\"rules\": [{\"match\": GLOB, \"format\": FORMAT}, ...]}";
  const detail::Json j = detail::parse_json(detail::read_text_file(path, expected, 16u << 20), source, "recipe", 8);
  if (!j.is_object() || !j.contains("rules")) detail::fail(source, "expected " + expected);
  for (const auto& [k, v] : j.items())
    if (k != "rules") detail::fail(source, "unknown key " + detail::quote(k) + " (a recipe holds \"rules\")");
  const detail::Json& rules = j["rules"];
  if (!rules.is_array() || rules.empty()) detail::fail(source, "\"rules\" must be a non-empty array");
  std::vector<RecipeRule> out;
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const detail::Json& r = rules[i];
    const std::string what = "rule " + std::to_string(i + 1);
    if (!r.is_object()) detail::fail(source, what + " is not an object");
    RecipeRule rule;
    std::string text;
    for (const auto& [k, v] : r.items()) {
      if (k == "match") {
        if (!v.is_string() || v.get<std::string>().empty()) detail::fail(source, what + ": \"match\" must be a glob");
        rule.pattern = v.get<std::string>();
      } else if (k == "format") {
        if (!v.is_string()) detail::fail(source, what + ": \"format\" must be a string");
        text = v.get<std::string>() + text;
      } else {
        const std::string value = v.is_string()                             ? v.get<std::string>()
                                  : v.is_boolean() || v.is_number_integer() ? v.dump()
                                                                            : std::string();
        if (value.empty()) detail::fail(source, what + ": option " + detail::quote(k) + " must be a string or number");
        text += "," + k + "=" + value;
      }
    }
    if (rule.pattern.empty()) detail::fail(source, what + " has no \"match\"");
    if (text.empty() || text.front() == ',') detail::fail(source, what + " has no \"format\"");
    try {
      rule.format = parse_layer_format(text, what);
    } catch (const Error& e) {
      detail::fail(source, e.what());
    }
    out.push_back(std::move(rule));
  }
  return out;
}

}  // namespace microscale::io
