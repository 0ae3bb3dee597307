// Quantized source checkpoints (source.hpp): finding their weights and dispatching to the source
// forms' modules, FP8 (source_fp8.cpp) and gpt-oss MXFP4 (source_gptoss.cpp), which check them
// against the config and decode them one tensor at a time.
#include "io/source.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "io/ct_groups.hpp"
#include "io/source_fp8.hpp"
#include "io/source_gptoss.hpp"
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

const Json* quantization_config(const Json& config) {
  if (!config.is_object()) return nullptr;
  const auto it = config.find("quantization_config");
  return it != config.end() && it->is_object() ? &*it : nullptr;
}

std::string lower_field(const Json* obj, const char* key) {
  if (!obj) return "";
  const auto it = obj->find(key);
  if (it == obj->end() || !it->is_string()) return "";
  std::string s = it->get<std::string>();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

void put(std::byte* out, DType dt, std::size_t i, float v) {
  switch (dt) {
    case DType::float32: return store<DType::float32>(out, i, v);
    case DType::bfloat16: return store<DType::bfloat16>(out, i, v);
    case DType::float16: return store<DType::float16>(out, i, v);
    default: throw Error(std::string("sources decode to float dtypes only, not ") + dtype_name(dt));
  }
}

Sources scan_sources(const Checkpoint& ck, const Json& config, const std::set<std::string>& consumed) {
  Sources src;
  std::optional<Fp8Config> cfg;  // parsed on the first FP8 weight
  const std::string method = lower_field(quantization_config(config), "quant_method");
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
  it.run = [&in, &w, dt, &report, action, reason = std::move(reason), nonfinite, bytes = it.in_bytes](TensorSink& wr) {
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
