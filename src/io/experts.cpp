// Mixture-of-experts weights in mlx-lm's stacked form (experts.hpp).
#include <algorithm>
#include <cstring>
#include <map>

#include "io/experts.hpp"
#include "io/layer.hpp"

namespace microscale::io::ck {

std::optional<ExpertName> per_expert_name(std::string_view n) {
  constexpr std::string_view kExperts = ".experts.", kWeight = ".weight";
  const std::size_t at = n.rfind(kExperts);
  if (at == std::string_view::npos || !n.ends_with(kWeight)) return std::nullopt;
  std::string_view rest = n.substr(at + kExperts.size(), n.size() - at - kExperts.size() - kWeight.size());
  const std::size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 9) return std::nullopt;
  std::int64_t index = 0;
  for (char c : rest.substr(0, dot)) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + (c - '0');
  }
  const std::string_view proj = rest.substr(dot + 1);
  if (proj.empty() || proj.find('.') != std::string_view::npos) return std::nullopt;
  return ExpertName{std::string(n.substr(0, at)), std::string(proj), index};
}

std::string switch_mlp_module(const ExpertName& e) {
  const std::string proj = e.proj == "w1"   ? "gate_proj"
                           : e.proj == "w3" ? "up_proj"
                           : e.proj == "w2" ? "down_proj"
                                            : e.proj;
  return e.prefix + ".switch_mlp." + proj;
}

std::vector<ExpertGroup> expert_groups(const std::vector<std::string>& tensors) {
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<std::int64_t, std::size_t>>> by_proj;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (const auto e = per_expert_name(tensors[i])) by_proj[{e->prefix, e->proj}].emplace_back(e->index, i);
  std::vector<ExpertGroup> out;
  for (auto& [key, members] : by_proj) {
    std::sort(members.begin(), members.end());
    ExpertGroup g{switch_mlp_module({key.first, key.second, 0}), {}};
    for (std::size_t j = 0; j < members.size(); ++j) {
      if (members[j].first != static_cast<std::int64_t>(j))
        throw Error("the experts of " + detail::quote(key.first) + " " + key.second + " are not numbered 0 to " +
                    std::to_string(members.size() - 1) + " (found " + detail::quote(tensors[members[j].second]) +
                    "): mlx-lm stacks experts 0 to E-1 into " + detail::quote(g.module));
      g.members.push_back(members[j].second);
    }
    out.push_back(std::move(g));
  }
  return out;
}

bool is_gptoss(const detail::Json& config) {
  if (!config.is_object()) return false;
  const auto t = config.find("model_type");
  return t != config.end() && t->is_string() && t->get<std::string>() == "gpt_oss";
}

bool gptoss_expert_weight(std::string_view n, const Shape& shape) {
  return shape.size() == 3 && (n.ends_with(".experts.gate_up_proj") || n.ends_with(".experts.down_proj"));
}

std::vector<ExpertRows> gptoss_layers(const std::string& tensor, const Shape& shape) {
  const std::string parent = tensor.substr(0, tensor.rfind('.') + 1);  // "<p>.experts."
  const std::int64_t e = shape[0], k = shape[1], c = shape[2];
  if (tensor.ends_with("down_proj")) return {{parent + "down_proj", {tensor}, 0, 1, e, c, k}};
  // transformers' GptOssExperts: gate = gate_up[..., ::2], up = gate_up[..., 1::2].
  return {{parent + "gate_proj", {tensor}, 0, 2, e, c / 2, k}, {parent + "up_proj", {tensor}, 1, 2, e, c / 2, k}};
}

void check_gptoss_fit(const std::string& parent,
                      const std::function<std::optional<GptossTensor>(const std::string&)>& find) {
  const std::optional<GptossTensor> gate_up = find(parent + "gate_up_proj"), down = find(parent + "down_proj"),
                                    gate_up_bias = find(parent + "gate_up_proj_bias"),
                                    down_bias = find(parent + "down_proj_bias");
  auto refuse = [](const GptossTensor& t, const std::string& want, const std::string& why) {
    throw Error("gpt-oss expert tensor " + detail::quote(t.file_name) + " is " + shape_str(t.shape, ShapeStyle::list) +
                ", expected " + want + ": " + why);
  };
  auto expect = [&](const GptossTensor& t, const Shape& want, const std::string& why) {
    if (t.shape != want) refuse(t, shape_str(want, ShapeStyle::list), why);
  };
  if (gate_up) {
    const Shape& g = gate_up->shape;  // [E, H, 2I]
    if (g.size() != 3 || g[2] % 2 != 0)
      refuse(*gate_up, "[experts, hidden, 2 x intermediate]",
             "gate and up interleave its output columns (gate the even ones, up the odd ones), so their number "
             "must be even");
    if (down)
      expect(*down, {g[0], g[2] / 2, g[1]},
             "[experts, intermediate, hidden] after gate_up_proj " + shape_str(g, ShapeStyle::list));
    if (gate_up_bias)
      expect(*gate_up_bias, {g[0], g[2]},
             "one bias per output column of gate_up_proj " + shape_str(g, ShapeStyle::list));
  }
  if (down && down_bias && down->shape.size() == 3)
    expect(*down_bias, {down->shape[0], down->shape[2]},
           "one bias per output column of down_proj " + shape_str(down->shape, ShapeStyle::list));
  // A bias is split as its stack's columns are: without the stack there is nothing to split by.
  for (const auto& [bias, stack] : {std::pair{&gate_up_bias, "gate_up_proj"}, std::pair{&down_bias, "down_proj"}})
    if (*bias && !find(parent + stack))
      throw Error("gpt-oss expert bias " + detail::quote((*bias)->file_name) + " has no stack " +
                  detail::quote(parent + stack) + " beside it to be split with");
}

std::vector<BiasPart> gptoss_bias_parts(std::string_view n) {
  const std::string parent(n.substr(0, n.rfind('.') + 1));
  if (n.ends_with(".experts.gate_up_proj_bias"))
    return {{parent + "gate_proj.bias", 0, 2}, {parent + "up_proj.bias", 1, 2}};
  if (n.ends_with(".experts.down_proj_bias")) return {{parent + "down_proj.bias", 0, 1}};
  return {};
}

std::string gptoss_expert_name(const std::string& split_name, std::int64_t expert) {
  constexpr std::string_view kExperts = ".experts.";
  const std::size_t at = split_name.rfind(kExperts) + kExperts.size();  // gptoss_layers' and _bias_parts' names
  return split_name.substr(0, at) + std::to_string(expert) + "." + split_name.substr(at);
}

ExpertRows gptoss_expert(const ExpertRows& layer, std::int64_t expert) {
  ExpertRows one = layer;
  one.module = gptoss_expert_name(layer.module, expert);
  one.experts = 1;
  one.first_expert = layer.first_expert + expert;
  return one;
}

std::vector<std::string> per_expert_outputs(const std::string& module, std::int64_t experts,
                                            const detail::Json& config) {
  constexpr std::string_view kSwitch = ".switch_mlp.";
  const std::size_t at = module.rfind(kSwitch);
  if (at == std::string::npos) return {};
  const std::string prefix = module.substr(0, at), proj = module.substr(at + kSwitch.size());
  if (proj.find('.') != std::string::npos) return {};
  const bool mixtral = config.is_object() && config.value("model_type", "") == "mixtral";
  const std::string name = !mixtral              ? proj
                           : proj == "gate_proj" ? "w1"
                           : proj == "up_proj"   ? "w3"
                           : proj == "down_proj" ? "w2"
                                                 : proj;
  std::vector<std::string> out;
  for (std::int64_t e = 0; e < experts; ++e)
    out.push_back(prefix + ".experts." + std::to_string(e) + "." + name + ".weight");
  return out;
}

std::optional<MergedName> gptoss_merged(std::string_view n) {
  constexpr std::string_view kExperts = ".experts.";
  const std::size_t at = n.rfind(kExperts);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string parent(n.substr(0, at + kExperts.size()));
  const std::string_view leaf = n.substr(at + kExperts.size());
  if (leaf == "gate_proj") return MergedName{parent + "gate_up_proj", 0, 2};
  if (leaf == "up_proj") return MergedName{parent + "gate_up_proj", 1, 2};
  if (leaf == "down_proj") return MergedName{parent + "down_proj", 0, 1};
  if (leaf == "gate_proj.bias") return MergedName{parent + "gate_up_proj_bias", 0, 2};
  if (leaf == "up_proj.bias") return MergedName{parent + "gate_up_proj_bias", 1, 2};
  if (leaf == "down_proj.bias") return MergedName{parent + "down_proj_bias", 0, 1};
  return std::nullopt;
}

std::vector<std::byte> merge_columns(const std::vector<std::span<const std::byte>>& parts, std::int64_t experts,
                                     std::int64_t rows, std::int64_t cols, std::size_t size) {
  const auto p_count = static_cast<std::int64_t>(parts.size());
  std::vector<std::byte> out(static_cast<std::size_t>(experts * rows * cols * p_count) * size);
  for (std::int64_t p = 0; p < p_count; ++p)
    for (std::int64_t e = 0; e < experts; ++e)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t k = 0; k < cols; ++k)
          std::memcpy(
              out.data() + static_cast<std::size_t>((e * cols + k) * rows * p_count + p_count * r + p) * size,
              parts[static_cast<std::size_t>(p)].data() + static_cast<std::size_t>((e * rows + r) * cols + k) * size,
              size);
  return out;
}

Tensor gather_rows(const Checkpoint& ck, const Sources& sources, const ExpertRows& r) {
  const std::int64_t e_count = r.experts, n = r.rows, k = r.cols;
  Tensor out;
  if (r.col_step == 0) {  // per-expert [N, K] tensors, concatenated
    for (std::size_t e = 0; e < r.tensors.size(); ++e) {
      Tensor storage;
      const TensorView x = float_values(ck, sources, r.tensors[e], storage);
      const std::size_t bytes = static_cast<std::size_t>(n * k) * dtype_size(x.dtype);
      if (e == 0) out = Tensor(x.dtype, {e_count * n, k});
      std::memcpy(out.bytes() + e * bytes, x.data, bytes);
      release(ck.tensor(r.tensors[e]).data);
    }
    return out;
  }
  // One [E, K, C] stack: row r of expert e is column col_start + r * col_step, read down K.
  Tensor storage;
  const TensorView x = float_values(ck, sources, r.tensors.front(), storage);
  const std::int64_t c = x.shape[2];
  const std::size_t size = dtype_size(x.dtype);
  out = Tensor(x.dtype, {e_count * n, k});
  const auto* src = static_cast<const std::byte*>(x.data);
  std::byte* dst = out.bytes();
  for (std::int64_t e = 0; e < e_count; ++e)
    for (std::int64_t row = 0; row < n; ++row)
      for (std::int64_t i = 0; i < k; ++i)
        std::memcpy(dst + static_cast<std::size_t>((e * n + row) * k + i) * size,
                    src + static_cast<std::size_t>((e * k + i) * c + r.col_start + row * r.col_step) * size, size);
  return out;
}

}  // namespace microscale::io::ck
