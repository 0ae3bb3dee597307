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
