// gpt-oss's MXFP4 experts (source_gptoss.hpp): the source form, its split for the layouts and
// its merge back for dequantize.
#include "io/source_gptoss.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include "io/model_dir.hpp"
#include "io/write_pipeline.hpp"
#include "microscale/codecs.hpp"

namespace microscale::io::ck {

// ---- the source form

// gpt-oss experts: "<m>_blocks" U8 [E, N, K/32, 16] with "<m>_scales" U8 [E, N, K/32].
SourceWeight read_gptoss(const Checkpoint& ck, const std::string& n) {
  SourceWeight w;
  w.module = n.substr(0, n.size() - std::string_view("_blocks").size());
  w.data = n;
  w.scale = w.module + "_scales";
  w.output = w.module;
  const StTensor& b = ck.tensor(n);
  const StTensor* s = ck.contains(w.scale) ? &ck.tensor(w.scale) : nullptr;
  if (!s) throw Error("gpt-oss MXFP4 tensor " + detail::quote(n) + " has no scales " + detail::quote(w.scale));
  if (b.shape.size() != 4 || b.shape[3] != 16)
    throw Error("gpt-oss MXFP4 tensor " + detail::quote(n) + " has shape " + shape_str(b.shape, ShapeStyle::list) +
                "; expected [experts, out, in/32, 16] (16 bytes hold a block of 32 FP4 values)");
  const Shape scale_shape(b.shape.begin(), b.shape.begin() + 3);
  if ((s->dtype != StDType::u8 && s->dtype != StDType::f8_e8m0) || s->shape != scale_shape)
    throw Error("tensor " + detail::quote(w.scale) + " is " + st_dtype_name(s->dtype) + " " +
                shape_str(s->shape, ShapeStyle::list) + ", expected U8 " + shape_str(scale_shape, ShapeStyle::list) +
                " (one E8M0 exponent per block of " + detail::quote(n) + ")");
  const std::int64_t k = mul(w.module, b.shape[2], 32, "inputs of " + shape_str(b.shape, ShapeStyle::list));
  (void)mul(w.module, mul(w.module, b.shape[0], b.shape[1], "experts x outputs"), k, "elements");
  w.shape = {b.shape[0], k, b.shape[1]};
  w.block_rows = 1;
  w.block_cols = 32;
  return w;
}

Tensor decode_gptoss(const Checkpoint& ck, const SourceWeight& w, DType dt) {
  const StTensor& b = ck.tensor(w.data);
  const StTensor& s = ck.tensor(w.scale);
  const std::int64_t experts = b.shape[0], rows = b.shape[1], groups = b.shape[2], cols = w.shape[1];
  std::array<float, 16> e2m1;
  for (int c = 0; c < 16; ++c) e2m1[static_cast<std::size_t>(c)] = decode_e2m1(static_cast<std::uint8_t>(c));
  Tensor out(dt, w.shape);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(b.data.data());
  const auto* exps = reinterpret_cast<const std::uint8_t*>(s.data.data());
  for (std::int64_t e = 0; e < experts; ++e)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t g = 0; g < groups; ++g) {
        const std::int64_t block = (e * rows + r) * groups + g;
        const std::uint8_t x = exps[block];
        if (x == 0xFF)
          throw Error("tensor " + detail::quote(w.scale) + " holds the E8M0 NaN code 0xFF at [" + std::to_string(e) +
                      ", " + std::to_string(r) + ", " + std::to_string(g) + "]; the block it scales cannot be decoded");
        const int exponent = static_cast<int>(x) - 127;
        for (std::int64_t i = 0; i < 16; ++i) {
          const std::uint8_t byte = bytes[block * 16 + i];
          // The even element sits in the low nibble; the output is transposed to [E, in, out].
          const std::int64_t k = g * 32 + 2 * i;
          put(out.bytes(), dt, static_cast<std::size_t>((e * cols + k) * rows + r),
              std::ldexp(e2m1[byte & 0xF], exponent));
          put(out.bytes(), dt, static_cast<std::size_t>((e * cols + k + 1) * rows + r),
              std::ldexp(e2m1[byte >> 4], exponent));
        }
      }
  release(b.data);
  release(s.data);
  return out;
}

// ---- its experts split for the layouts

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

// ---- back to the stacks

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

// gpt-oss's expert biases as the split experts' modules name them (mlx-lm then skips its own
// sanitize, which would otherwise split them): gate_up_proj_bias [E, 2N] becomes gate_proj.bias and
// up_proj.bias (even and odd columns), down_proj_bias down_proj.bias; [E, N] each in mlx-lm's
// stacked form, or `per_expert` [N] for each expert as llm-compressor's linearized model holds them.
std::vector<Item> gptoss_bias_items(const Input& in, const std::string& name, Report& report, bool per_expert) {
  std::vector<Item> items;
  const StTensor& t = in.ck.tensor(name);
  if (t.shape.size() != 2)
    throw Error("gpt-oss expert bias " + detail::quote(name) + " is " + shape_str(t.shape, ShapeStyle::list) +
                ", expected [experts, columns]");
  const std::int64_t experts = t.shape[0];
  auto add = [&](const BiasPart& part, const std::string& out_name, std::int64_t first, std::int64_t count) {
    const std::int64_t cols = (t.shape[1] - part.col_start + part.col_step - 1) / part.col_step;
    const Shape shape = per_expert ? Shape{cols} : Shape{count, cols};
    Item it = tensor_item(in, name, out_name);
    it.entries = {{out_name, t.dtype, shape}};
    it.run = [&in, &report, name, part, out_name, first, count, cols, shape](TensorSink& w) {
      const StTensor& src = in.ck.tensor(name);
      const std::size_t size = st_nbytes(src.dtype, {1});
      std::vector<std::byte> out(static_cast<std::size_t>(count * cols) * size);
      for (std::int64_t e = 0; e < count; ++e)
        for (std::int64_t c = 0; c < cols; ++c)
          std::memcpy(
              out.data() + static_cast<std::size_t>(e * cols + c) * size,
              src.data.data() +
                  static_cast<std::size_t>((first + e) * src.shape[1] + part.col_start + c * part.col_step) * size,
              size);
      w.write(out_name, out);
      TensorReport r;
      r.name = out_name;
      r.action = TensorAction::copied;
      r.format = src.dtype_name();
      r.shape = shape;
      r.bytes_in = static_cast<std::size_t>(count * src.shape[1]) * size;
      r.bytes_out = out.size();
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  };
  if (per_expert)
    for (std::int64_t e = 0; e < experts; ++e)
      for (const BiasPart& part : gptoss_bias_parts(name)) add(part, gptoss_expert_name(part.name, e), e, 1);
  else
    for (const BiasPart& part : gptoss_bias_parts(name)) add(part, part.name, 0, experts);
  return items;
}

// A split gpt-oss expert layer (gate, up or down) made of its MXFP4 source's bytes: expert e's
// row r is row col_start + r * col_step of expert first_expert + e in `<m>_blocks` [E, C, K/32, 16]
// and `<m>_scales` [E, C, K/32]. Those bytes are what an mxfp4 layer holds (two E2M1 codes a byte,
// the even element in the low nibble; one E8M0 exponent per 32 inputs), so convert copies them
// instead of decoding and quantizing again, which could pick another scale for a block whose
// largest code is below 4.
CodeBytes gptoss_codes(const Checkpoint& ck, const SourceWeight& w, const ExpertRows& rows) {
  const StTensor& b = ck.tensor(w.data);
  const StTensor& s = ck.tensor(w.scale);
  const std::int64_t src_rows = b.shape[1], groups = b.shape[2];
  const auto row_bytes = static_cast<std::size_t>(groups) * 16, row_scales = static_cast<std::size_t>(groups);
  const auto n = static_cast<std::size_t>(rows.experts * rows.rows);
  CodeBytes out;
  out.packed.resize(n * row_bytes);
  out.scales.resize(n * row_scales);
  for (std::int64_t e = 0; e < rows.experts; ++e)
    for (std::int64_t r = 0; r < rows.rows; ++r) {
      const std::int64_t src_expert = rows.first_expert + e, src_row = rows.col_start + r * rows.col_step;
      const auto from = static_cast<std::size_t>(src_expert * src_rows + src_row),
                 to = static_cast<std::size_t>(e * rows.rows + r);
      const std::byte* exps = s.data.data() + from * row_scales;
      for (std::size_t g = 0; g < row_scales; ++g)
        if (exps[g] == std::byte{0xFF})
          throw Error("tensor " + detail::quote(w.scale) + " holds the E8M0 NaN code 0xFF at [" +
                      std::to_string(src_expert) + ", " + std::to_string(src_row) + ", " + std::to_string(g) +
                      "]; the block it scales has no value to convert");
      std::memcpy(out.scales.data() + to * row_scales, exps, row_scales);
      std::memcpy(out.packed.data() + to * row_bytes, b.data.data() + from * row_bytes, row_bytes);
    }
  return out;
}

// (Stacks of no experts are refused when selected.)
std::span<const std::byte> expert_bytes(const StTensor& t, std::int64_t first, std::int64_t count) {
  const std::size_t per = t.data.size() / static_cast<std::size_t>(t.shape[0]);
  return t.data.subspan(static_cast<std::size_t>(first) * per, static_cast<std::size_t>(count) * per);
}

GptossMerge gptoss_merge(const Input& in, const Detected& det) {
  GptossMerge g;
  if (!is_gptoss(in.config)) return g;
  for (const Layer& l : det.layers)
    if (const auto m = gptoss_merged(l.module); m && l.experts) {
      auto& parts = g.layers[m->name];
      parts.resize(static_cast<std::size_t>(m->parts));
      parts[static_cast<std::size_t>(m->part)] = &l;
    }
  for (const auto& [name, parts] : g.layers)
    for (const Layer* p : parts)
      if (!p || p->shape != parts.front()->shape || p->experts != parts.front()->experts)
        throw Error("gpt-oss experts " + detail::quote(name) +
                    ": the split gate_proj and up_proj layers it is made of are not both present with one shape");
  for (const std::string& n : in.ck.names())
    if (const auto m = gptoss_merged(n); m && n.ends_with(".bias") && !det.consumed.count(n)) {
      const std::string weight = m->name.substr(0, m->name.size() - std::string_view("_bias").size());
      if (!g.layers.count(weight)) continue;
      auto& parts = g.biases[m->name];
      parts.resize(static_cast<std::size_t>(m->parts));
      parts[static_cast<std::size_t>(m->part)] = n;
    }
  for (const auto& [name, parts] : g.biases)
    for (const std::string& p : parts)
      if (p.empty() || in.ck.tensor(p).shape != in.ck.tensor(parts.front()).shape ||
          in.ck.tensor(p).dtype != in.ck.tensor(parts.front()).dtype || in.ck.tensor(p).shape.size() != 2)
        throw Error("gpt-oss expert bias " + detail::quote(name) +
                    ": the split gate_proj.bias and up_proj.bias it is made of are not both present, 2-D, "
                    "with one shape and dtype");
  // Each part holds one bias per output row of its layer, for each of the layer's experts.
  for (const auto& [name, parts] : g.biases) {
    const Layer& l = *g.layers.at(name.substr(0, name.size() - std::string_view("_bias").size())).front();
    const Shape want = {l.experts, l.rows() / l.experts};
    for (const std::string& p : parts)
      if (in.ck.tensor(p).shape != want)
        throw Error("gpt-oss expert bias " + detail::quote(p) + " is " +
                    shape_str(in.ck.tensor(p).shape, ShapeStyle::list) + ", expected " +
                    shape_str(want, ShapeStyle::list) + ": one bias per output row of layer " +
                    detail::quote(l.module) + " for each of its experts");
  }
  return g;
}

void gptoss_items(const Input& in, const GptossMerge& g, DType dtype, NonFinite nonfinite, std::vector<Item>& items,
                  Report& report) {
  // Named copies, not structured bindings: the lambdas below capture them (C++20 allows capturing
  // a binding, but the clang that builds the fuzzers does not).
  for (const auto& layer : g.layers) {
    const std::string& name = layer.first;
    const auto& parts = layer.second;
    const Layer& first = *parts.front();
    const std::int64_t e = first.experts, n = first.rows() / e, k = first.cols();
    Item it = layer_item(in, first);
    for (std::size_t p = 1; p < parts.size(); ++p)
      for (const Source& s : parts[p]->sources) {
        it.inputs.push_back(in.ck.tensor(s.tensor).data);
        it.in_bytes += in.ck.tensor(s.tensor).data.size();
      }
    it.label = name;
    it.entries = {{name, to_st_dtype(dtype), {e, k, n * static_cast<std::int64_t>(parts.size())}}};
    it.run = [&in, &report, name, parts, dtype, nonfinite, e, n, k, bytes = it.in_bytes](TensorSink& w) {
      std::vector<Tensor> ys;
      std::vector<std::span<const std::byte>> spans;
      for (const Layer* l : parts) {
        ys.push_back(dequantize_layer(*l, dtype));
        spans.emplace_back(ys.back().bytes(), ys.back().nbytes());
        release_sources(in.ck, *l);
      }
      const std::vector<std::byte> out = merge_columns(spans, e, n, k, dtype_size(dtype));
      TensorReport r = layer_report(*parts.front(), TensorAction::dequantized, bytes);
      check_nonfinite(out, dtype, name, nonfinite, r);
      w.write(name, out);
      r.name = name;
      r.shape = {e, k, n * static_cast<std::int64_t>(parts.size())};
      r.bytes_out = out.size();
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }
  for (const auto& bias : g.biases) {
    const std::string& name = bias.first;
    const auto& parts = bias.second;
    const StTensor& t = in.ck.tensor(parts.front());
    Item it = tensor_item(in, parts.front(), name);
    for (std::size_t p = 1; p < parts.size(); ++p) {
      it.inputs.push_back(in.ck.tensor(parts[p]).data);
      it.in_bytes += in.ck.tensor(parts[p]).data.size();
    }
    const Shape shape = {t.shape[0], t.shape[1] * static_cast<std::int64_t>(parts.size())};
    it.entries = {{name, t.dtype, shape}};
    it.run = [&in, &report, name, parts, shape](TensorSink& w) {
      const StTensor& first = in.ck.tensor(parts.front());
      std::vector<std::span<const std::byte>> spans;
      for (const std::string& p : parts) spans.push_back(in.ck.tensor(p).data);
      const std::vector<std::byte> out =
          merge_columns(spans, first.shape[0], first.shape[1], 1, st_nbytes(first.dtype, {1}));
      w.write(name, out);
      TensorReport r;
      r.name = name;
      r.action = TensorAction::copied;
      r.format = first.dtype_name();
      r.shape = shape;
      r.bytes_in = r.bytes_out = out.size();
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }
}

}  // namespace microscale::io::ck
