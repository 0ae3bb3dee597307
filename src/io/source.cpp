// Quantized source checkpoints (source.hpp): finding FP8 and gpt-oss MXFP4 weights, checking
// their scales against the config, and decoding them one tensor at a time.
#include "io/source.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "io/ct_groups.hpp"
#include "io/tensor_values.hpp"
#include "io/write_pipeline.hpp"
#include "microscale/codecs.hpp"

namespace microscale::io::ck {

const char* name(SourceKind k) {
  switch (k) {
    case SourceKind::fp8_block: return "fp8-block";
    case SourceKind::ct_fp8: return "compressed-tensors fp8";
    case SourceKind::modelopt_fp8: return "modelopt fp8";
    case SourceKind::gptoss_mxfp4: return "gpt-oss mxfp4";
  }
  return "?";
}

bool is_fp8(SourceKind k) { return k != SourceKind::gptoss_mxfp4; }

std::string SourceWeight::describe() const {
  const std::string scale_name = scale.substr(module.size() + (scale[module.size()] == '.' ? 1 : 0));
  if (data.ends_with("_blocks"))
    return "MXFP4 experts, E8M0 " + scale_name + " per 32 inputs -> " + detail::quote(output) + " " +
           shape_str(shape, ShapeStyle::list);
  const bool whole =
      block_rows >= std::max<std::int64_t>(shape[0], 1) && block_cols >= std::max<std::int64_t>(shape[1], 1);
  if (whole) return "E4M3, " + scale_name + " per tensor";
  if (block_rows == 1 && block_cols >= shape[1]) return "E4M3, " + scale_name + " per output channel";
  return "E4M3, " + scale_name + " per " + std::to_string(block_rows) + "x" + std::to_string(block_cols) + " block";
}

const SourceWeight* Sources::find(const std::string& tensor, bool scale) const {
  const auto& index = scale ? scale_index_ : data_index_;
  const auto it = index.find(tensor);
  return it == index.end() ? nullptr : &weights[it->second];
}

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); }

const Json* quantization_config(const Json& config) {
  if (!config.is_object()) return nullptr;
  const auto it = config.find("quantization_config");
  return it != config.end() && it->is_object() ? &*it : nullptr;
}

std::string string_field(const Json* obj, const char* key) {
  if (!obj) return "";
  const auto it = obj->find(key);
  if (it == obj->end() || !it->is_string()) return "";
  std::string s = it->get<std::string>();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

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

struct Fp8Config {
  std::string method;                                // quant_method, lower case ("" when absent)
  std::optional<std::array<std::int64_t, 2>> block;  // fp8: weight_block_size
  std::string scale_fmt;                             // fp8: "ue8m0" when the scales are E8M0
  CtGroups ct;                                       // compressed-tensors: its config groups
  bool modelopt_file = false;                        // hf_quant_config.json names a quant_algo
};

Fp8Config fp8_config(const Checkpoint& ck, const Json& config) {
  Fp8Config c;
  const Json* qc = quantization_config(config);
  c.method = string_field(qc, "quant_method");
  c.scale_fmt = string_field(qc, "scale_fmt");
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

template <DType D>
void store(std::byte* out, std::size_t i, float v) {
  if constexpr (D == DType::float32) {
    std::memcpy(out + 4 * i, &v, 4);
  } else {
    const std::uint16_t h = D == DType::bfloat16 ? encode_bf16(v) : encode_f16(v);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void put(std::byte* out, DType dt, std::size_t i, float v) {
  switch (dt) {
    case DType::float32: return store<DType::float32>(out, i, v);
    case DType::bfloat16: return store<DType::bfloat16>(out, i, v);
    case DType::float16: return store<DType::float16>(out, i, v);
    default: throw Error(std::string("sources decode to float dtypes only, not ") + dtype_name(dt));
  }
}

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

}  // namespace

Sources scan_sources(const Checkpoint& ck, const Json& config, const std::set<std::string>& consumed) {
  Sources src;
  std::optional<Fp8Config> cfg;  // parsed on the first FP8 weight
  const std::string method = string_field(quantization_config(config), "quant_method");
  std::set<SourceKind> kinds;
  for (const std::string& n : ck.names()) {
    if (consumed.count(n)) continue;
    const StTensor& t = ck.tensor(n);
    if (t.dtype == StDType::f8_e4m3 && n.ends_with(".weight")) {
      if (!cfg) cfg = fp8_config(ck, config);
      SourceKind kind{};
      src.weights.push_back(read_fp8(ck, *cfg, n, kind));
      kinds.insert(kind);
    } else if (t.dtype == StDType::u8 && n.ends_with("_blocks") &&
               (method == "mxfp4" || ck.contains(n.substr(0, n.size() - 7) + "_scales"))) {
      src.weights.push_back(read_gptoss(ck, n));
      kinds.insert(SourceKind::gptoss_mxfp4);
    }
  }
  if (kinds.empty()) return src;
  if (kinds.size() > 1) {
    std::string all;
    for (SourceKind k : kinds) all += (all.empty() ? "" : ", ") + std::string(name(k));
    throw Error("checkpoint mixes quantized source formats (" + all + ")");
  }
  src.kind = *kinds.begin();
  for (std::size_t i = 0; i < src.weights.size(); ++i) {
    const SourceWeight& w = src.weights[i];
    src.data_index_[w.data] = i;
    src.scale_index_[w.scale] = i;
    src.consumed.insert(w.data);
    src.consumed.insert(w.scale);
  }
  if (is_fp8(*src.kind)) {
    // Static activation scales of the FP8 layers and the KV-cache scales beside them.
    for (const std::string& n : ck.names()) {
      if (consumed.count(n) || src.consumed.count(n)) continue;
      bool drop = n.ends_with(".k_scale") || n.ends_with(".v_scale");
      for (const char* suffix : {".input_scale", ".activation_scale"})
        if (n.ends_with(suffix) && src.find(n.substr(0, n.size() - std::strlen(suffix)) + ".weight")) drop = true;
      if (drop) {
        src.dropped.push_back(n);
        src.consumed.insert(n);
      }
    }
  }
  return src;
}

Tensor decode_source(const Checkpoint& ck, const SourceWeight& w, DType dt) {
  if (!is_float(dt)) throw Error(std::string("sources decode to float dtypes only, not ") + dtype_name(dt));
  return w.data.ends_with("_blocks") ? decode_gptoss(ck, w, dt) : decode_fp8(ck, w, dt);
}

TensorView float_values(const Checkpoint& ck, const Sources& s, const std::string& name, Tensor& storage) {
  if (const SourceWeight* w = s.find(name)) {
    storage = decode_source(ck, *w, DType::float32);
    return storage.view();
  }
  const StTensor& t = ck.tensor(name);
  return view_of(t.data, t.dtype, t.shape, storage);
}

void check_quantizable(const Sources& s, const std::string& input) {
  if (s.kind != SourceKind::gptoss_mxfp4) return;
  const SourceWeight& w = s.weights.front();
  throw Error(input + " is a gpt-oss MXFP4 checkpoint: its experts (e.g. " + detail::quote(w.data) +
              ") are stacked 3-D tensors, which microscale does not re-quantize yet. Run microscale dequantize "
              "first (it writes " +
              detail::quote(w.output) + " as " + shape_str(w.shape, ShapeStyle::list) +
              " floats, the form transformers loads), then quantize the dequantized checkpoint");
}

void note_dropped(const Sources& s, Report& report) {
  if (s.dropped.empty()) return;
  report.notes.push_back(std::to_string(s.dropped.size()) + " activation / KV-cache scales of the " + name(*s.kind) +
                         " source dropped (e.g. " + detail::quote(s.dropped.front()) +
                         "): they describe FP8 activations, not the weights written");
}

void refuse_convert(const Sources& s, const std::string& input, Convention to) {
  const SourceWeight& w = s.weights.front();
  if (s.kind == SourceKind::gptoss_mxfp4)
    throw Error("tensor " + detail::quote(w.data) + " holds gpt-oss MXFP4 stacked experts, which " + layout(to).title +
                " has no form for: vLLM's gpt-oss model reads quantized experts only as these _blocks / _scales "
                "tensors (quant_method \"mxfp4\"), and its " +
                layout(to).title +
                " path reads float stacks. Keep this checkpoint as it is for vLLM, convert it --to mlx or --to "
                "compressed-tensors (the same codes and scales), or dequantize it and quantize the float checkpoint "
                "with this export (its experts then stay in high precision)");
  throw Error(input + " is an FP8 checkpoint (" + name(*s.kind) + ", e.g. " + detail::quote(w.data) + ": " +
              w.describe() +
              "); convert moves microscale's quantized formats between layouts and FP8 is not one "
              "of them. Use microscale quantize to decode the FP8 weights and quantize them (e.g. --mode nvfp4), "
              "or microscale dequantize for float weights");
}

Item source_item(const Input& in, const SourceWeight& w, DType dt, Report& report, TensorAction action,
                 std::string reason, std::optional<NonFinite> nonfinite) {
  Item it = tensor_item(in, w.data, w.output);
  it.in_bytes += in.ck.tensor(w.scale).data.size();
  it.entries = {{w.output, to_st_dtype(dt), w.shape}};
  it.run = [&in, &w, dt, &report, action, reason = std::move(reason), nonfinite,
            bytes = it.in_bytes](TensorSink& wr) {
    const Tensor y = decode_source(in.ck, w, dt);
    TensorReport r;
    if (nonfinite) check_nonfinite({y.bytes(), y.nbytes()}, dt, w.output, *nonfinite, r);
    wr.write_tensor(w.output, y);
    r.name = w.output;
    r.action = action;
    r.format = w.data.ends_with("_blocks") ? "mxfp4" : "fp8";
    r.shape = w.shape;
    r.bytes_in = bytes;
    r.bytes_out = y.nbytes();
    r.reason = reason;
    report.tensors.push_back(std::move(r));
  };
  return it;
}

}  // namespace microscale::io::ck
