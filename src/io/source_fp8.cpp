// FP8 source checkpoints (source_fp8.hpp): DeepSeek / Qwen block FP8, compressed-tensors FP8 and
// ModelOpt FP8 weights, their scales checked against the config, decoded one tensor at a time.
#include "io/source_fp8.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "io/tensor_values.hpp"
#include "microscale/codecs.hpp"

namespace microscale::io::ck {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); }

// ModelOpt exports before quantization_config moved into config.json wrote only hf_quant_config.json.
bool modelopt_hf_config(const Checkpoint& ck) {
  if (ck.shards().empty()) return false;
  const fs::path p = ck.shards().front().parent_path() / "hf_quant_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return false;
  std::ifstream f(p);
  std::stringstream text;
  text << f.rdbuf();
  try {
    const Json j = detail::parse_json(text.str(), p.string(), "config", 16);
    const auto q = j.is_object() ? j.find("quantization") : j.end();
    return q != j.end() && q->is_object() && q->contains("quant_algo");
  } catch (const Error&) {
    return false;  // not ModelOpt's file: the weights are refused below for want of a config
  }
}

bool scale_dtype_ok(SourceKind k, StDType t, const std::string& scale_fmt) {
  switch (t) {
    case StDType::f32:
    case StDType::bf16:
    case StDType::f16: return true;
    case StDType::f8_e8m0: return k == SourceKind::fp8_block;
    case StDType::u8: return k == SourceKind::fp8_block && scale_fmt == "ue8m0";  // E8M0 stored as bytes
    default: return false;
  }
}

// The FP8 scale values as floats, refusing NaN and infinity.
std::vector<float> fp8_scales(const StTensor& s) {
  const auto n = static_cast<std::size_t>(s.numel());
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(element_value(s.data.data(), s.dtype == StDType::u8 ? StDType::f8_e8m0 : s.dtype, i));
    if (!std::isfinite(v[i]))
      throw Error("tensor " + detail::quote(s.name) + " holds a non-finite scale (" + fmt_float(v[i]) +
                  ") at flat index " + std::to_string(i) + "; the weights it scales cannot be decoded");
  }
  return v;
}

}  // namespace

Fp8Config fp8_config(const Checkpoint& ck, const Json& config) {
  Fp8Config c;
  const Json* qc = quantization_config(config);
  c.method = lower_field(qc, "quant_method");
  c.scale_fmt = lower_field(qc, "scale_fmt");
  if (qc && c.method == "fp8")
    if (auto b = qc->find("weight_block_size"); b != qc->end() && !b->is_null())
      c.block = config_block_pair(*b, "quantization_config.weight_block_size");
  c.ct = ct_groups(config);
  if (c.method.empty()) c.modelopt_file = modelopt_hf_config(ck);
  return c;
}

// The FP8 weight `n` ("<m>.weight", E4M3) with its scale, checked against the config.
SourceWeight read_fp8(const Checkpoint& ck, const Fp8Config& cfg, const std::string& n, SourceKind& kind) {
  SourceWeight w;
  w.module = n.substr(0, n.size() - std::string_view(".weight").size());
  w.data = n;
  w.output = n;
  const StTensor& q = ck.tensor(n);
  if (q.shape.size() != 2)
    throw Error("tensor " + detail::quote(n) + " is F8_E4M3 of shape " + shape_str(q.shape, ShapeStyle::list) +
                "; only 2-D FP8 weights are read");
  w.shape = q.shape;
  const std::int64_t rows = q.shape[0], cols = q.shape[1];
  const std::string inv = w.module + ".weight_scale_inv", plain = w.module + ".weight_scale";
  if (ck.contains(inv)) {
    kind = SourceKind::fp8_block;
    w.scale = inv;
    if (!cfg.method.empty() && cfg.method != "fp8")
      throw Error("tensor " + detail::quote(inv) +
                  " is a DeepSeek-style FP8 scale, but config.json's "
                  "quantization_config names quant_method \"" +
                  cfg.method + "\" (expected \"fp8\")");
  } else if (ck.contains(plain)) {
    w.scale = plain;
    if (cfg.method == "fp8")  // transformers' FP8 embeddings: one weight_scale per table
      kind = SourceKind::fp8_block;
    else if (cfg.method == "compressed-tensors")
      kind = SourceKind::ct_fp8;
    else if (cfg.method == "modelopt" || (cfg.method.empty() && cfg.modelopt_file))
      kind = SourceKind::modelopt_fp8;
    else
      throw Error("FP8 weight " + detail::quote(n) + " has a weight_scale, but config.json's quantization_config " +
                  (cfg.method.empty() ? std::string("does not name its producer")
                                      : "names quant_method \"" + cfg.method + "\"") +
                  " (expected \"compressed-tensors\" or \"modelopt\", which define how the scale applies, or \"fp8\")");
  } else {
    throw Error("FP8 weight " + detail::quote(n) + " has no scale: expected " + detail::quote(inv) +
                " (DeepSeek / Qwen FP8) or " + detail::quote(plain) + " (compressed-tensors, ModelOpt)");
  }
  const StTensor& s = ck.tensor(w.scale);
  if (!scale_dtype_ok(kind, s.dtype, cfg.scale_fmt))
    throw Error("tensor " + detail::quote(w.scale) + " is " + st_dtype_name(s.dtype) + "; the scales of " + name(kind) +
                " weights are F32, BF16 or F16" +
                (kind == SourceKind::fp8_block ? " (or E8M0 with scale_fmt \"ue8m0\")" : ""));

  // Which elements each scale covers: the whole tensor, a row, or a block.
  const std::int64_t all_rows = std::max<std::int64_t>(rows, 1), all_cols = std::max<std::int64_t>(cols, 1);
  std::vector<std::pair<std::array<std::int64_t, 2>, Shape>> allowed;  // block, the scale shape it needs
  auto allow = [&](std::int64_t br, std::int64_t bc, Shape shape) { allowed.push_back({{br, bc}, std::move(shape)}); };
  if (kind == SourceKind::fp8_block && cfg.block && w.scale == inv) {
    const auto [br, bc] = *cfg.block;
    allow(br, bc, {ceil_div(rows, br), ceil_div(cols, bc)});
  } else if (kind == SourceKind::fp8_block) {
    if (s.numel() == 1) allow(all_rows, all_cols, s.shape);
  } else {
    // compressed-tensors: the strategy of the weight's own config group says which form the scale
    // has; without one, any form a group of the checkpoint describes.
    const CtGroup* group = kind == SourceKind::ct_fp8 ? cfg.ct.claim(w.module, n) : nullptr;
    if (kind == SourceKind::ct_fp8 && !group && cfg.ct.ignored(w.module))
      throw Error("FP8 weight " + detail::quote(n) +
                  " is stored quantized, but config.json's "
                  "quantization_config.ignore lists its module as left in high precision");
    if (group && group->kind != CtFormat::float_quantized && group->kind != CtFormat::other)
      throw Error("FP8 weight " + detail::quote(n) + " belongs to config group " + detail::quote(group->name) +
                  " of config.json, whose format is " + group->format + ", not float-quantized (FP8)");
    const std::string strategy = group ? group->strategy : "";
    const bool any = strategy != "tensor" && strategy != "channel" && strategy != "block" && strategy != "group";
    if ((any || strategy == "tensor") && s.numel() == 1) allow(all_rows, all_cols, s.shape);
    if (any || strategy == "channel") {
      allow(1, all_cols, {rows, 1});
      allow(1, all_cols, {rows});
    }
    for (std::size_t g = 0; g < cfg.ct.groups.size(); ++g)
      if (const auto& b = cfg.ct.groups[g].block; b && (any ? !group : &cfg.ct.groups[g] == group))
        allow((*b)[0], (*b)[1], {ceil_div(rows, (*b)[0]), ceil_div(cols, (*b)[1])});
  }
  const auto match = std::find_if(allowed.begin(), allowed.end(), [&](const auto& a) { return a.second == s.shape; });
  if (match == allowed.end()) {
    std::string expect;
    for (std::size_t i = 0; i < allowed.size(); ++i)
      expect += (i ? " or " : "") + shape_str(allowed[i].second, ShapeStyle::list);
    throw Error("tensor " + detail::quote(w.scale) + " has shape " + shape_str(s.shape, ShapeStyle::list) +
                " for weight " + shape_str(q.shape, ShapeStyle::list) + "; expected " +
                (expect.empty() ? std::string("one element (no weight_block_size in the config)") : expect));
  }
  w.block_rows = match->first[0];
  w.block_cols = match->first[1];
  (void)fp8_scales(s);  // refuse bad scales before anything is written
  release(s.data);
  return w;
}

namespace {

// Row by row, one run of columns per scale, so the inner loop is a table lookup and a multiply.
template <DType D>
void decode_fp8_into(std::byte* out, const std::uint8_t* codes, const std::vector<float>& scales,
                     const SourceWeight& w) {
  std::array<float, 256> e4m3;
  for (int c = 0; c < 256; ++c) e4m3[static_cast<std::size_t>(c)] = decode_e4m3(static_cast<std::uint8_t>(c));
  const std::int64_t rows = w.shape[0], cols = w.shape[1];
  const std::int64_t scale_cols = cols == 0 ? 0 : ceil_div(cols, w.block_cols);
  for (std::int64_t i = 0; i < rows; ++i) {
    const float* row_scales = scales.data() + (i / w.block_rows) * scale_cols;
    for (std::int64_t j = 0; j < cols;) {
      const float scale = row_scales[j / w.block_cols];
      const std::int64_t end = j + std::min(cols - j, w.block_cols - j % w.block_cols);
      for (; j < end; ++j) {
        const auto at = static_cast<std::size_t>(i * cols + j);
        store<D>(out, at, e4m3[codes[at]] * scale);  // one float32 multiplication
      }
    }
  }
}

}  // namespace

Tensor decode_fp8(const Checkpoint& ck, const SourceWeight& w, DType dt) {
  const StTensor& q = ck.tensor(w.data);
  const StTensor& s = ck.tensor(w.scale);
  const std::vector<float> scales = fp8_scales(s);
  Tensor out(dt, w.shape);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(q.data.data());
  switch (dt) {
    case DType::float32: decode_fp8_into<DType::float32>(out.bytes(), codes, scales, w); break;
    case DType::bfloat16: decode_fp8_into<DType::bfloat16>(out.bytes(), codes, scales, w); break;
    case DType::float16: decode_fp8_into<DType::float16>(out.bytes(), codes, scales, w); break;
    default: throw Error(std::string("sources decode to float dtypes only, not ") + dtype_name(dt));
  }
  release(q.data);
  release(s.data);
  return out;
}

}  // namespace microscale::io::ck
