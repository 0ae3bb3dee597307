// load_checkpoint / save_checkpoint: quantized layers and the other tensors of a checkpoint in
// memory (the Python API).
#include <algorithm>
#include <limits>
#include <span>
#include <vector>

#include "io/layout.hpp"
#include "io/staging.hpp"
#include "io/weight_rules.hpp"

namespace microscale::io {

namespace {

using namespace ck;

// A layer over `q`'s buffers, after checking that they are what `q.spec` and `q.shape` say.
Layer checked_layer(const std::string& m, const Quantized& q, const std::optional<float>& input_amax) {
  const QuantSpec s = resolve(q.spec);
  // [experts, N, K]: stacked experts (MLX's SwitchLinear), quantized per row like [experts * N, K].
  if (q.shape.size() != 2 && q.shape.size() != 3)
    throw Error("layer " + detail::quote(m) + ": only 2-D weights and 3-D stacked experts, got " +
                shape_str(q.shape, ShapeStyle::list));
  const bool stacked = q.shape.size() == 3;
  const std::int64_t k = q.shape.back(), experts = stacked ? q.shape[0] : 0;
  // Bounds before any shape arithmetic: k * bits must not wrap, nor experts * N.
  for (std::int64_t d : q.shape)
    if (d < 0 || d > std::numeric_limits<std::int32_t>::max())
      throw Error("layer " + detail::quote(m) + ": shape " + shape_str(q.shape, ShapeStyle::list) + " is out of range");
  if (stacked && experts == 0) throw Error("layer " + detail::quote(m) + ": stacked experts of 0 experts");
  const std::int64_t n = stacked ? q.shape[0] * q.shape[1] : q.shape[0];
  if (k % s.group_size != 0) throw Error("layer " + detail::quote(m) + ": K is not a multiple of the group size");
  auto as_stored = [&](std::int64_t cols) { return stacked ? Shape{experts, q.shape[1], cols} : Shape{n, cols}; };
  const Shape ps = as_stored(k * s.bits / 8), ss = as_stored(k / s.group_size);
  const DType sd = s.mode == Mode::affine ? q.scales.dtype() : DType::uint8;
  if (q.packed.dtype() != DType::uint8 || q.packed.shape() != ps)
    throw Error("layer " + detail::quote(m) + ": packed must be uint8 " + shape_str(ps, ShapeStyle::list) + ", got " +
                dtype_name(q.packed.dtype()) + " " + shape_str(q.packed.shape(), ShapeStyle::list));
  if (q.scales.shape() != ss || q.scales.dtype() != sd || (s.mode == Mode::affine && !is_float(sd)))
    throw Error("layer " + detail::quote(m) + ": scales must be " + dtype_name(sd) + " " +
                shape_str(ss, ShapeStyle::list) + ", got " + dtype_name(q.scales.dtype()) + " " +
                shape_str(q.scales.shape(), ShapeStyle::list));
  if (s.mode == Mode::affine && (q.biases.shape() != ss || q.biases.dtype() != sd))
    throw Error("layer " + detail::quote(m) + ": biases must match the scales");
  if (s.layout != Layout::compact) throw Error("layer " + detail::quote(m) + ": checkpoints store compact scales");
  Layer l = Layer::of(m, s, {n, k});
  l.experts = experts;
  if (input_amax) {
    check_activation_amax(*input_amax, "layer " + detail::quote(m) + ": input_amax");
    l.act = Global::of_amax(*input_amax);
  }
  l.point_at(q);
  if (s.mode == Mode::affine) l.float_dtype = to_st_dtype(sd);
  return l;
}

// The bytes of a mapped tensor, copied in chunks whose mapped pages are dropped once copied, so
// that a large tensor (a 128k-token embedding) is never resident twice.
std::vector<std::byte> copy_releasing(std::span<const std::byte> bytes) {
  constexpr std::size_t kChunk = std::size_t{32} << 20;
  std::vector<std::byte> out(bytes.size());
  for (std::size_t at = 0; at < bytes.size(); at += kChunk) {
    const std::span<const std::byte> chunk = bytes.subspan(at, std::min(kChunk, bytes.size() - at));
    std::copy(chunk.begin(), chunk.end(), out.begin() + static_cast<std::ptrdiff_t>(at));
    release(chunk);
  }
  return out;
}

}  // namespace

CheckpointData load_checkpoint(const fs::path& path) {
  const Input in = open_complete(path);
  const Detected det = detect(in.ck, in.config);
  check_unsupported(det);
  if (det.sources.kind)
    throw Error(path.string() + " is a quantized source (" + std::string(name(*det.sources.kind)) +
                "), which load_checkpoint does not hold in memory; use dequantize_checkpoint for float weights or "
                "quantize_checkpoint to re-quantize it");
  CheckpointData data;
  data.convention = det.convention_name();
  // Each tensor's mapped pages are dropped once copied, so the model is held once, not twice
  // (the mapping's pages count as resident until then).
  for (const Layer& l : det.layers) {
    QuantizedLayer ql;
    ql.module = l.module;
    ql.weight = to_quantized(l);
    if (l.act) ql.input_amax = l.act->to_amax();
    data.layers.push_back(std::move(ql));
    release_sources(in.ck, l);
  }
  for (const std::string& n : in.ck.names()) {
    if (det.consumed.count(n)) continue;
    const StTensor& t = in.ck.tensor(n);
    data.tensors.push_back({n, t.dtype, t.shape, copy_releasing(t.data)});
  }
  if (!in.config.is_null()) data.config_json = in.config.dump(2);
  in.ck.check_unchanged();  // a shard truncated under us read as zeros
  return data;
}

void save_checkpoint(const fs::path& out, const CheckpointData& data, Convention to, bool force) {
  const LayoutOps& lay = layout(to);
  if (!is_model_directory(to)) {  // a file format of its own (GGUF)
    std::string dirs;
    for (const LayoutOps* l : layouts())
      if (is_model_directory(l->convention)) dirs += (dirs.empty() ? "" : ", ") + std::string(l->name);
    throw Error("save_checkpoint: unknown export '" + std::string(lay.name) +
                "' for a model directory (expected one of " + dirs + "); microscale quantize or convert --to " +
                lay.name + " writes " + lay.title);
  }
  std::vector<Layer> layers;
  for (const QuantizedLayer& ql : data.layers) layers.push_back(checked_layer(ql.module, ql.weight, ql.input_amax));
  if (layers.empty()) throw Error("save_checkpoint: no quantized layers given");
  // Activation scales are written for every layer or refused; never dropped.
  const auto with_act = static_cast<std::size_t>(
      std::count_if(layers.begin(), layers.end(), [](const Layer& l) { return l.act.has_value(); }));
  if (with_act != 0 &&
      (!lay.activation_scales || with_act != layers.size() ||
       std::any_of(layers.begin(), layers.end(), [](const Layer& l) { return l.format.mode != Mode::nvfp4; })))
    throw Error("save_checkpoint: " + std::to_string(with_act) + " of " + std::to_string(layers.size()) +
                " layers have an input_amax; static activation scales (W4A4) are written only for nvfp4 layers in "
                "the " +
                layouts_with(&LayoutOps::activation_scales, true) + " layout, with one on every layer");
  const bool w4a4 = with_act != 0;
  std::vector<StTensorData> all;
  std::vector<std::vector<Out>> keep;
  QuantMeta meta;
  meta.w4a4 = w4a4;
  for (Layer& l : layers) {
    if (!w4a4) l.act.reset();
    keep.push_back(emit(l, to));
    meta.layers.push_back(&l);
  }
  std::vector<OutputTensor> names;
  for (std::size_t i = 0; i < keep.size(); ++i)
    for (const Out& o : keep[i]) {
      all.push_back({o.entry.name, o.entry.dtype, o.entry.shape, o.bytes()});
      names.push_back({o.entry.name, layers[i].module, layers[i].module});
    }
  for (const RawTensor& t : data.tensors) {
    if (st_nbytes(t.dtype, t.shape) != t.data.size())
      throw Error("tensor " + detail::quote(t.name) + ": " + std::to_string(t.data.size()) + " bytes for " +
                  st_dtype_name(t.dtype) + " " + shape_str(t.shape, ShapeStyle::list));
    all.push_back({t.name, t.dtype, t.shape, t.data});
    names.push_back({t.name, {}, t.name});
    add_ignored_tensor(meta.ignore, t.name, t.shape, t.dtype);
  }
  check_output_names(names);
  Json config =
      data.config_json.empty() ? Json::object() : detail::parse_json(data.config_json, "config_json", "config", 256);
  Staging st(RunInputs{}, out, force);
  save_safetensors(st.dir() / "model.safetensors", all,
                   Metadata{{"format", lay.shard_format ? lay.shard_format : "pt"}});
  Json hf = apply_config(config, to, meta);
  if (!hf.is_null()) write_text_atomic(st.dir() / "hf_quant_config.json", hf.dump(2) + "\n");
  write_text_atomic(st.dir() / "config.json", config.dump(2) + "\n");
  st.commit();
}

}  // namespace microscale::io
