// Whole-checkpoint quantize / dequantize / convert / inspect / load / save (checkpoint.hpp):
// names, dtypes, shapes and global-scale conventions of each layout, byte preservation, fused
// groups, atomic output handling and errors on damaged input.
#include <nlohmann/json.hpp>

#include <cfloat>
#include <cmath>
#include <random>

#include "io_support.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/codecs.hpp"
#include "microscale/quantize.hpp"

namespace {

using namespace microscale;
using namespace microscale::io;
using namespace iot;
using Json = nlohmann::json;

std::vector<std::uint16_t> bf16_matrix(std::int64_t n, std::int64_t k, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<std::uint16_t> v(static_cast<std::size_t>(n * k));
  for (auto& x : v) x = encode_bf16(d(rng));
  return v;
}

std::span<const std::byte> bytes_of(const std::vector<std::uint16_t>& v) { return std::as_bytes(std::span(v)); }

Json read_json(const fs::path& p) {
  std::ifstream f(p);
  return Json::parse(f);
}

float f32_at(const StTensor& t) {
  float v;
  std::memcpy(&v, t.data.data(), 4);
  return v;
}

// A tiny Llama-like model: 2 layers of q/k/v/o and gate/up/down, norms, embeddings, lm_head, in
// two shards with an index, a config.json and a tokenizer file. q/k/v and gate/up get different
// scales, so their amaxes differ.
struct Model {
  TempDir dir;  // model in dir/in, outputs beside it
  fs::path in = dir / "in";
  std::map<std::string, std::vector<std::uint16_t>> w;
  std::map<std::string, Shape> shape;

  Model() {
    const std::int64_t h = 64, inter = 128, kv = 32, vocab = 48;
    auto add = [&](const std::string& n, Shape s, float scale) {
      w[n] = bf16_matrix(s[0], s.size() > 1 ? s[1] : 1, scale, static_cast<unsigned>(w.size() + 1));
      shape[n] = std::move(s);
    };
    add("model.embed_tokens.weight", {vocab, h}, 0.02f);
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {h}, 1.0f);
      add(p + "self_attn.q_proj.weight", {h, h}, 0.02f);
      add(p + "self_attn.k_proj.weight", {kv, h}, 0.05f);
      add(p + "self_attn.v_proj.weight", {kv, h}, 0.01f);
      add(p + "self_attn.o_proj.weight", {h, h}, 0.02f);
      add(p + "mlp.gate_proj.weight", {inter, h}, 0.03f);
      add(p + "mlp.up_proj.weight", {inter, h}, 0.02f);
      add(p + "mlp.down_proj.weight", {h, inter}, 0.02f);
    }
    add("model.norm.weight", {h}, 1.0f);
    add("lm_head.weight", {vocab, h}, 0.02f);
    fs::create_directories(in);
    std::vector<fs::path> shards;
    std::vector<StTensorData> part;
    std::size_t i = 0;
    for (const auto& [n, v] : w) {
      part.push_back({n, StDType::bf16, shape[n], bytes_of(v)});
      if (++i == w.size() / 2 || i == w.size()) {
        shards.push_back(in / shard_file_name(shards.size(), 2));
        save_safetensors(shards.back(), part, {{"format", "pt"}});
        part.clear();
      }
    }
    write_index(in / "model.safetensors.index.json", shards);
    write_bytes(in / "config.json", iot::bytes_of(R"({"model_type": "llama", "hidden_size": 64})"));
    write_bytes(in / "tokenizer.json", iot::bytes_of("{}"));
  }
  TensorView view(const std::string& n) const { return TensorView(w.at(n).data(), DType::bfloat16, shape.at(n)); }
};

QuantizeOptions qopt(Mode mode, Convention to, int bits = 0) {
  QuantizeOptions o;
  o.spec.mode = mode;
  o.spec.bits = bits;
  o.to = to;
  return o;
}

const std::string kQ = "model.layers.0.self_attn.q_proj";
const std::string kDown = "model.layers.1.mlp.down_proj";

TEST(Convert, CompressedTensorsNvfp4Layout) {
  Model m;
  QuantizeOptions o = qopt(Mode::nvfp4, Convention::compressed_tensors);
  Progress last;
  o.progress = [&](const Progress& p) { last = p; };
  const Report r = quantize_checkpoint(m.in, m.dir.path() / "ct", o);
  EXPECT_EQ(last.done, last.total);
  EXPECT_EQ(last.bytes_done, last.bytes_total);
  EXPECT_EQ(r.shards, 2u);

  Checkpoint c = Checkpoint::open(m.dir.path() / "ct");
  c.validate();
  const StTensor& p = c.tensor(kQ + ".weight_packed");
  EXPECT_EQ(p.dtype, StDType::u8);
  EXPECT_EQ(p.shape, (Shape{64, 32}));
  const StTensor& s = c.tensor(kQ + ".weight_scale");
  EXPECT_EQ(s.dtype, StDType::f8_e4m3);
  EXPECT_EQ(s.shape, (Shape{64, 4}));
  const StTensor& g = c.tensor(kQ + ".weight_global_scale");
  EXPECT_EQ(g.dtype, StDType::f32);
  EXPECT_EQ(g.shape, (Shape{1}));
  EXPECT_FALSE(c.contains(kQ + ".weight"));
  EXPECT_FALSE(c.contains(kQ + ".input_global_scale"));  // weight-only
  // Kept as they are: embeddings, norms, lm_head.
  EXPECT_EQ(c.tensor("lm_head.weight").dtype, StDType::bf16);
  EXPECT_EQ(c.tensor("model.embed_tokens.weight").dtype, StDType::bf16);
  EXPECT_EQ(c.tensor("model.norm.weight").dtype, StDType::bf16);

  // Fused q/k/v share the encode factor fl(2688 / max amax); o_proj has its own.
  float amax = 0;
  for (const char* n : {"q_proj", "k_proj", "v_proj"})
    amax = std::max(amax, global_scale(m.view("model.layers.0.self_attn." + std::string(n) + ".weight")));
  const float gs = 2688.0f / amax;
  for (const char* n : {"q_proj", "k_proj", "v_proj"})
    EXPECT_EQ(f32_at(c.tensor("model.layers.0.self_attn." + std::string(n) + ".weight_global_scale")), gs) << n;
  const float o_amax = global_scale(m.view("model.layers.0.self_attn.o_proj.weight"));
  EXPECT_EQ(f32_at(c.tensor("model.layers.0.self_attn.o_proj.weight_global_scale")), 2688.0f / o_amax);

  // The bytes are exactly microscale's three-level quantization with that amax.
  QuantSpec spec;
  spec.global_scale = amax;
  const Quantized q = quantize(m.view(kQ + ".weight"), spec);
  EXPECT_EQ(to_bytes(p.data), to_bytes({q.packed.bytes(), q.packed.nbytes()}));
  EXPECT_EQ(to_bytes(s.data), to_bytes({q.scales.bytes(), q.scales.nbytes()}));

  const Json cfg = read_json(m.dir.path() / "ct" / "config.json");
  EXPECT_EQ(cfg["model_type"], "llama");
  const Json& qc = cfg["quantization_config"];
  EXPECT_EQ(qc["quant_method"], "compressed-tensors");
  EXPECT_EQ(qc["format"], "nvfp4-pack-quantized");
  EXPECT_EQ(qc["quantization_status"], "compressed");
  EXPECT_EQ(qc["ignore"], Json::array({"lm_head"}));
  const Json& w = qc["config_groups"]["group_0"]["weights"];
  EXPECT_EQ(w["strategy"], "tensor_group");
  EXPECT_EQ(w["group_size"], 16);
  EXPECT_EQ(w["scale_dtype"], "torch.float8_e4m3fn");
  EXPECT_TRUE(qc["config_groups"]["group_0"]["input_activations"].is_null());
  EXPECT_TRUE(fs::exists(m.dir.path() / "ct" / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(m.dir.path() / "ct" / "hf_quant_config.json"));
}

TEST(Convert, ModelOptAndMlxLayouts) {
  Model m;
  quantize_checkpoint(m.in, m.dir.path() / "mo", qopt(Mode::nvfp4, Convention::modelopt));
  Checkpoint c = Checkpoint::open(m.dir.path() / "mo");
  EXPECT_EQ(c.tensor(kQ + ".weight").dtype, StDType::u8);
  EXPECT_EQ(c.tensor(kQ + ".weight_scale").dtype, StDType::f8_e4m3);
  const StTensor& ws2 = c.tensor(kQ + ".weight_scale_2");
  EXPECT_EQ(ws2.shape, Shape{});
  float amax = 0;
  for (const char* n : {"q_proj", "k_proj", "v_proj"})
    amax = std::max(amax, global_scale(m.view("model.layers.0.self_attn." + std::string(n) + ".weight")));
  EXPECT_EQ(f32_at(ws2), amax / 2688.0f);
  const Json hf = read_json(m.dir.path() / "mo" / "hf_quant_config.json");
  EXPECT_EQ(hf["quantization"]["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(hf["quantization"]["group_size"], 16);
  EXPECT_EQ(read_json(m.dir.path() / "mo" / "config.json")["quantization_config"]["quant_method"], "modelopt");

  for (auto [mode, bits, scale_dt] :
       {std::tuple{Mode::affine, 4, StDType::bf16}, std::tuple{Mode::mxfp8, 0, StDType::u8},
        std::tuple{Mode::nvfp4, 0, StDType::u8}}) {
    const fs::path dst = m.dir.path() / ("mlx_" + std::string(name(mode)));
    quantize_checkpoint(m.in, dst, qopt(mode, Convention::mlx, bits));
    Checkpoint x = Checkpoint::open(dst);
    const int b = mode == Mode::mxfp8 ? 8 : 4, g = mode == Mode::affine ? 64 : mode == Mode::nvfp4 ? 16 : 32;
    EXPECT_EQ(x.tensor(kDown + ".weight").dtype, StDType::u32);
    EXPECT_EQ(x.tensor(kDown + ".weight").shape, (Shape{64, 128 * b / 32}));
    EXPECT_EQ(x.tensor(kDown + ".scales").dtype, scale_dt);
    EXPECT_EQ(x.tensor(kDown + ".scales").shape, (Shape{64, 128 / g}));
    EXPECT_EQ(x.contains(kDown + ".biases"), mode == Mode::affine);
    EXPECT_EQ(x.shard(0).metadata().at("format"), "mlx");
    const Json cfg = read_json(dst / "config.json");
    EXPECT_EQ(cfg["quantization"], (Json{{"group_size", g}, {"bits", b}, {"mode", name(mode)}}));
    EXPECT_EQ(cfg["quantization_config"], cfg["quantization"]);
    // Two-level nvfp4 / plain mx and affine: dequantize gives exactly what quantize+dequantize does.
    const fs::path back = m.dir.path() / ("deq_" + std::string(name(mode)));
    DequantizeOptions dq;
    dq.dtype = DType::float32;
    dequantize_checkpoint(dst, back, dq);
    QuantSpec spec;
    spec.mode = mode;
    spec.bits = bits;
    const Tensor want = dequantize(quantize(m.view(kDown + ".weight"), spec), DType::float32);
    Checkpoint d = Checkpoint::open(back);
    EXPECT_EQ(d.tensor(kDown + ".weight").dtype, StDType::f32);
    EXPECT_EQ(to_bytes(d.tensor(kDown + ".weight").data), to_bytes({want.bytes(), want.nbytes()}));
    EXPECT_FALSE(read_json(back / "config.json").contains("quantization"));
  }
}

TEST(Convert, BytesPreservedAcrossLayouts) {
  Model m;
  quantize_checkpoint(m.in, m.dir.path() / "ct", qopt(Mode::nvfp4, Convention::compressed_tensors));
  ConvertOptions co;
  co.to = Convention::modelopt;
  convert_checkpoint(m.dir.path() / "ct", m.dir.path() / "mo", co);
  co.to = Convention::compressed_tensors;
  convert_checkpoint(m.dir.path() / "mo", m.dir.path() / "ct2", co);
  convert_checkpoint(m.dir.path() / "ct", m.dir.path() / "ct3", co);
  Checkpoint a = Checkpoint::open(m.dir.path() / "ct"), b = Checkpoint::open(m.dir.path() / "mo"),
             c = Checkpoint::open(m.dir.path() / "ct2"), same = Checkpoint::open(m.dir.path() / "ct3");
  for (const std::string& n : a.names()) EXPECT_EQ(to_bytes(a.tensor(n).data), to_bytes(same.tensor(n).data)) << n;
  for (const std::string& mod : {kQ, kDown}) {
    EXPECT_EQ(to_bytes(a.tensor(mod + ".weight_packed").data), to_bytes(b.tensor(mod + ".weight").data));
    EXPECT_EQ(to_bytes(a.tensor(mod + ".weight_scale").data), to_bytes(b.tensor(mod + ".weight_scale").data));
    EXPECT_EQ(to_bytes(a.tensor(mod + ".weight_packed").data), to_bytes(c.tensor(mod + ".weight_packed").data));
    // Conventions: ws2 = amax/2688 with amax = 2688/gs; back to CT within one ulp.
    const float gs = f32_at(a.tensor(mod + ".weight_global_scale"));
    EXPECT_EQ(f32_at(b.tensor(mod + ".weight_scale_2")), (2688.0f / gs) / 2688.0f);
    const float gs2 = f32_at(c.tensor(mod + ".weight_global_scale"));
    EXPECT_LE(std::fabs(gs2 - gs), std::nextafter(gs, INFINITY) - gs);
  }
  // Three-level nvfp4 has no MLX layout: refused before anything is written.
  co.to = Convention::mlx;
  expect_error([&] { convert_checkpoint(m.dir.path() / "ct", m.dir.path() / "mlx", co); },
               {"two-level", "Re-quantize"});
  EXPECT_FALSE(fs::exists(m.dir.path() / "mlx"));

  // MLX two-level nvfp4 converts to CT with global scale 1 (decode factor 1), same bytes.
  quantize_checkpoint(m.in, m.dir.path() / "mlxq", qopt(Mode::nvfp4, Convention::mlx));
  co.to = Convention::compressed_tensors;
  convert_checkpoint(m.dir.path() / "mlxq", m.dir.path() / "from_mlx", co);
  Checkpoint x = Checkpoint::open(m.dir.path() / "mlxq"), y = Checkpoint::open(m.dir.path() / "from_mlx");
  EXPECT_EQ(f32_at(y.tensor(kQ + ".weight_global_scale")), 1.0f);
  EXPECT_EQ(to_bytes(x.tensor(kQ + ".weight").data), to_bytes(y.tensor(kQ + ".weight_packed").data));
  EXPECT_EQ(to_bytes(x.tensor(kQ + ".scales").data), to_bytes(y.tensor(kQ + ".weight_scale").data));
  // Affine has no compressed-tensors layout.
  quantize_checkpoint(m.in, m.dir.path() / "aff", qopt(Mode::affine, Convention::mlx, 8));
  expect_error([&] { convert_checkpoint(m.dir.path() / "aff", m.dir.path() / "aff_ct", co); },
               {"compressed-tensors has no layout"});
}

TEST(Convert, FusedScalesNeverMergedSilently) {
  Model m;
  QuantizeOptions o = qopt(Mode::nvfp4, Convention::compressed_tensors);
  o.share_fused_scales = false;
  quantize_checkpoint(m.in, m.dir.path() / "sep", o);
  Checkpoint s = Checkpoint::open(m.dir.path() / "sep");
  EXPECT_NE(f32_at(s.tensor(kQ + ".weight_global_scale")),
            f32_at(s.tensor("model.layers.0.self_attn.k_proj.weight_global_scale")));
  const InspectResult ir = inspect_checkpoint(m.dir.path() / "sep", false);
  EXPECT_TRUE(std::any_of(ir.notes.begin(), ir.notes.end(),
                          [](auto& n) { return n.find("differing global") != std::string::npos; }));

  ConvertOptions co;
  co.to = Convention::modelopt;
  const Report kept = convert_checkpoint(m.dir.path() / "sep", m.dir.path() / "kept", co);
  EXPECT_TRUE(std::any_of(kept.notes.begin(), kept.notes.end(),
                          [](auto& n) { return n.find("kept per shard") != std::string::npos; }));
  co.unify_fused_scales = true;
  convert_checkpoint(m.dir.path() / "sep", m.dir.path() / "unified", co);
  Checkpoint u = Checkpoint::open(m.dir.path() / "unified");
  const float ws = f32_at(u.tensor(kQ + ".weight_scale_2"));
  EXPECT_EQ(ws, f32_at(u.tensor("model.layers.0.self_attn.k_proj.weight_scale_2")));
  EXPECT_EQ(ws, f32_at(u.tensor("model.layers.0.self_attn.v_proj.weight_scale_2")));
  EXPECT_NE(ws, f32_at(u.tensor("model.layers.0.self_attn.o_proj.weight_scale_2")));
}

TEST(Convert, SelectionActivationsAndForce) {
  Model m;
  QuantizeOptions o = qopt(Mode::mxfp4, Convention::compressed_tensors);
  o.exclude = {"down_proj"};
  o.include = {"lm_head"};
  const Report r = quantize_checkpoint(m.in, m.dir.path() / "a", o);
  Checkpoint c = Checkpoint::open(m.dir.path() / "a");
  EXPECT_EQ(c.tensor(kDown + ".weight").dtype, StDType::bf16);
  EXPECT_EQ(c.tensor("lm_head.weight_packed").dtype, StDType::u8);
  EXPECT_EQ(c.tensor(kQ + ".weight_scale").dtype, StDType::u8);  // E8M0 codes
  EXPECT_EQ(c.tensor(kQ + ".weight_scale").shape, (Shape{64, 2}));
  const Json cfg = read_json(m.dir.path() / "a" / "config.json");
  EXPECT_EQ(cfg["quantization_config"]["format"], "mxfp4-pack-quantized");
  EXPECT_EQ(cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"], "group");
  EXPECT_EQ(cfg["quantization_config"]["ignore"],
            Json::array({"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}));
  // compressed-tensors mxfp4 uses llm-compressor's 'even' E8M0 rule.
  QuantSpec even;
  even.mode = Mode::mxfp4;
  even.scale_rule = ScaleRule::even;
  const Quantized q = quantize(m.view(kQ + ".weight"), even);
  EXPECT_EQ(to_bytes(c.tensor(kQ + ".weight_scale").data), to_bytes({q.scales.bytes(), q.scales.nbytes()}));

  // Refuses to overwrite; --force replaces, and a refused run leaves the directory as it was.
  expect_error([&] { quantize_checkpoint(m.in, m.dir.path() / "a", o); }, {"not empty", "--force"});
  o.force = true;
  quantize_checkpoint(m.in, m.dir.path() / "a", o);
  expect_error([&] { quantize_checkpoint(m.in, m.in, o); }, {"is the input directory"});

  // W4A4 without activation scales is refused; with them, input scales and a W4A4 config.
  QuantizeOptions w = qopt(Mode::nvfp4, Convention::compressed_tensors);
  w.w4a4 = true;
  expect_error([&] { quantize_checkpoint(m.in, m.dir.path() / "w4a4", w); }, {"W4A4", "activation amax"});
  EXPECT_FALSE(fs::exists(m.dir.path() / "w4a4"));
  for (const auto& [n, v] : m.w)
    if (why_kept(n, m.shape.at(n), StDType::bf16).empty()) w.activation_amax[n.substr(0, n.size() - 7)] = 3.5f;
  quantize_checkpoint(m.in, m.dir.path() / "w4a4", w);
  Checkpoint a = Checkpoint::open(m.dir.path() / "w4a4");
  EXPECT_EQ(f32_at(a.tensor(kQ + ".input_global_scale")), 2688.0f / 3.5f);
  EXPECT_EQ(read_json(m.dir.path() / "w4a4" /
                      "config.json")["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"],
            "local");
  ConvertOptions co;
  co.to = Convention::modelopt;
  convert_checkpoint(m.dir.path() / "w4a4", m.dir.path() / "w4a4_mo", co);
  Checkpoint b = Checkpoint::open(m.dir.path() / "w4a4_mo");
  EXPECT_EQ(f32_at(b.tensor(kQ + ".input_scale")), (2688.0f / (2688.0f / 3.5f)) / 2688.0f);
  EXPECT_EQ(read_json(m.dir.path() / "w4a4_mo" / "hf_quant_config.json")["quantization"]["quant_algo"], "NVFP4");
}

std::map<std::string, Bytes> snapshot(const fs::path& dir) {
  std::map<std::string, Bytes> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[e.path().lexically_relative(dir).string()] = read_bytes(e.path());
  return files;
}

TEST(Convert, StoppedOverwriteLeavesTheOldOutput) {
  Model m;
  const fs::path out = m.dir.path() / "out";
  quantize_checkpoint(m.in, out, qopt(Mode::nvfp4, Convention::compressed_tensors));
  write_bytes(out / "README.md", iot::bytes_of("mine"));  // not part of the checkpoint: kept by --force
  const auto old = snapshot(out);
  // A run stopped part-way (the CLI's SIGINT/SIGTERM handling throws from the progress callback).
  QuantizeOptions o = qopt(Mode::mxfp4, Convention::compressed_tensors);
  o.force = true;
  o.progress = [](const Progress& p) {
    if (p.done == 5) throw Error("stop");
  };
  expect_error([&] { quantize_checkpoint(m.in, out, o); }, {"stop"});
  EXPECT_EQ(snapshot(out), old);
  for (const auto& e : fs::directory_iterator(m.dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  // The same run completed replaces the checkpoint files and keeps the user's own.
  o.progress = {};
  quantize_checkpoint(m.in, out, o);
  EXPECT_EQ(read_json(out / "config.json")["quantization_config"]["format"], "mxfp4-pack-quantized");
  EXPECT_EQ(read_bytes(out / "README.md"), iot::bytes_of("mine"));
  // What a SIGKILL leaves is refused, and removed by the next run into the same output.
  const fs::path left = m.dir.path() / ".out.tmp.999999999";
  fs::copy(out, left, fs::copy_options::recursive);
  write_bytes(left / ".microscale-incomplete", {});
  expect_error([&] { (void)inspect_checkpoint(left); }, {"unfinished"});
  expect_error([&] { dequantize_checkpoint(left, m.dir.path() / "dq", {}); }, {"unfinished"});
  // Killed after the marker went (or while deleting the replaced output): refused by its name.
  const fs::path swapped = m.dir.path() / ".out.tmp.999999998.old";
  fs::copy(out, swapped, fs::copy_options::recursive);
  expect_error([&] { (void)inspect_checkpoint(swapped); }, {"unfinished"});
  quantize_checkpoint(m.in, out, o);
  EXPECT_FALSE(fs::exists(left));
  EXPECT_FALSE(fs::exists(swapped));
  // --force replaces a previous output only, never a directory of other things.
  const fs::path other = m.dir.path() / "other";
  fs::create_directories(other);
  write_bytes(other / "notes.txt", iot::bytes_of("x"));
  expect_error([&] { quantize_checkpoint(m.in, other, o); }, {"holds no checkpoint", "choose a new directory"});
  EXPECT_EQ(snapshot(other).size(), 1u);
}

// A single-file model of hand-picked tensors (values from `value(i)`, stored as `dt`) and a config.
struct TinyModel {
  TempDir dir;
  fs::path in = dir / "in";
  std::vector<Bytes> store;
  std::vector<StTensorData> tensors;

  void add(const std::string& name, const Shape& shape, StDType dt, const std::function<double(std::int64_t)>& value) {
    const std::int64_t n = numel(shape);
    Bytes b(static_cast<std::size_t>(st_nbytes(dt, shape)));
    for (std::int64_t i = 0; i < n; ++i) {
      const double v = value(i);
      auto* p = b.data() + static_cast<std::size_t>(i) * (dt == StDType::f64 ? 8 : dt == StDType::f32 ? 4 : 2);
      if (dt == StDType::f64) std::memcpy(p, &v, 8);
      if (dt == StDType::f32) {
        const auto f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
      }
      if (dt == StDType::bf16) {
        const std::uint16_t h = encode_bf16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
      }
    }
    store.push_back(std::move(b));
    tensors.push_back({name, dt, shape, store.back()});
  }
  void add(const std::string& name, const Shape& shape, StDType dt = StDType::bf16) {
    add(name, shape, dt, [](std::int64_t i) { return 0.02 * std::sin(0.37 * static_cast<double>(i)); });
  }
  void write(const std::string& config) {
    fs::create_directories(in);
    save_safetensors(in / "model.safetensors", tensors, {{"format", "pt"}});
    write_bytes(in / "config.json", iot::bytes_of(config));
  }
};

const TensorReport* find_report(const Report& r, const std::string& name) {
  for (const TensorReport& t : r.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// An FP8 release is a quantized source: quantize decodes it (E4M3 x scale in float32) and
// re-quantizes, dequantize writes the decoded values, convert and load_checkpoint refuse it saying
// what works. FP8 formats without a reader (E5M2 weights) are still refused by name.
TEST(Convert, Fp8SourcesAreDecodedNotRefused) {
  TinyModel m;
  const std::string down = "model.layers.0.mlp.down_proj";
  m.add(down + ".weight_scale_inv", {1, 1}, StDType::f32, [](std::int64_t) { return 0.02; });
  m.add("model.norm.weight", {64});
  m.store.emplace_back(64 * 128, std::byte{0x38});  // E4M3 1.0
  m.tensors.push_back({down + ".weight", StDType::f8_e4m3, {64, 128}, m.store.back()});
  m.write(R"({"model_type": "llama", "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8"}})");

  const InspectResult ir = inspect_checkpoint(m.in);
  EXPECT_EQ(ir.convention, "fp8-block");
  const Report q = quantize_checkpoint(m.in, m.dir / "q", qopt(Mode::nvfp4, Convention::compressed_tensors));
  ASSERT_NE(find_report(q, down), nullptr);
  EXPECT_EQ(find_report(q, down)->action, TensorAction::quantized);
  Checkpoint c = Checkpoint::open(m.dir / "q");
  EXPECT_TRUE(c.contains(down + ".weight_packed"));
  EXPECT_FALSE(c.contains(down + ".weight_scale_inv"));

  dequantize_checkpoint(m.in, m.dir / "d", DequantizeOptions());
  Checkpoint d = Checkpoint::open(m.dir / "d");
  const StTensor& w = d.tensor(down + ".weight");
  ASSERT_EQ(w.dtype, StDType::bf16);
  std::uint16_t first;
  std::memcpy(&first, w.data.data(), 2);
  EXPECT_EQ(first, encode_bf16(1.0f * 0.02f));  // 1.0 x the float32 scale, rounded once to bfloat16
  EXPECT_FALSE(d.contains(down + ".weight_scale_inv"));

  ConvertOptions co;
  co.to = Convention::mlx;
  expect_error([&] { convert_checkpoint(m.in, m.dir / "c", co); }, {"fp8-block", "microscale quantize"});
  expect_error([&] { (void)load_checkpoint(m.in); }, {"fp8-block", "dequantize_checkpoint"});
  EXPECT_FALSE(fs::exists(m.dir / "c"));
}

TEST(Convert, Fp8E5m2WeightsAreRefusedByName) {
  TinyModel m;
  m.add("model.norm.weight", {64});
  m.store.emplace_back(64 * 128, std::byte{0x3C});
  m.tensors.push_back({"model.layers.0.mlp.down_proj.weight", StDType::f8_e5m2, {64, 128}, m.store.back()});
  m.write(R"({"model_type": "llama"})");
  expect_error([&] { quantize_checkpoint(m.in, m.dir / "q", qopt(Mode::nvfp4, Convention::compressed_tensors)); },
               {"down_proj.weight\" F8_E5M2", "does not read", "float"});
  try {
    quantize_checkpoint(m.in, m.dir / "q", qopt(Mode::nvfp4, Convention::compressed_tensors));
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("use microscale convert"), std::string::npos) << e.what();
  }
  expect_error([&] { dequantize_checkpoint(m.in, m.dir / "d", DequantizeOptions()); }, {"cannot read", "down_proj"});
  EXPECT_FALSE(fs::exists(m.dir / "q") || fs::exists(m.dir / "d"));
}

TEST(Convert, EveryUnquantizedWeightIsReportedAndIgnored) {
  TinyModel m;
  const std::string p = "model.layers.0.";
  m.add(p + "mlp.experts.gate_up_proj", {4, 64, 128});  // stacked experts (Llama 4, gpt-oss style)
  m.add(p + "mlp.experts.down_proj", {4, 64, 64});
  m.add(p + "self_attn.q_proj.weight", {64, 64}, StDType::f64);
  m.add(p + "self_attn.k_proj.weight", {64, 64});
  m.add(p + "self_attn.o_proj.bias", {64});
  m.write(R"({"model_type": "llama", "torch_dtype": "bfloat16"})");
  const fs::path out = m.dir / "out";
  const Report r = quantize_checkpoint(m.in, out, qopt(Mode::nvfp4, Convention::compressed_tensors));
  for (const char* n : {"mlp.experts.gate_up_proj", "mlp.experts.down_proj", "self_attn.q_proj.weight"}) {
    const TensorReport* t = find_report(r, p + n);
    ASSERT_NE(t, nullptr) << n;
    EXPECT_EQ(t->action, TensorAction::kept) << n;
    EXPECT_NE(t->reason.find(std::string(n).find("experts") != std::string::npos ? "3-D stacked experts" : "dtype F64"),
              std::string::npos)
        << t->reason;
  }
  EXPECT_EQ(find_report(r, p + "self_attn.o_proj.bias")->action, TensorAction::copied);
  EXPECT_EQ(find_report(r, p + "self_attn.k_proj")->action, TensorAction::quantized);
  Checkpoint c = Checkpoint::open(out);
  EXPECT_EQ(c.tensor(p + "self_attn.q_proj.weight").dtype, StDType::f64);
  EXPECT_EQ(c.tensor(p + "mlp.experts.gate_up_proj").shape, (Shape{4, 64, 128}));
  // The config names exactly what stayed in high precision, so loaders do not expect it quantized.
  EXPECT_EQ(read_json(out / "config.json")["quantization_config"]["ignore"],
            Json::array({p + "mlp.experts", p + "self_attn.q_proj"}));
  // Converting keeps that list: the same tensors stay in high precision.
  ConvertOptions co;
  co.to = Convention::modelopt;
  convert_checkpoint(out, m.dir / "mo", co);
  EXPECT_EQ(read_json(m.dir / "mo" / "hf_quant_config.json")["quantization"]["exclude_modules"],
            Json::array({p + "mlp.experts", p + "self_attn.q_proj"}));
  // Asking for the experts is an error that says why, not a silent no-op.
  QuantizeOptions o = qopt(Mode::nvfp4, Convention::compressed_tensors);
  o.include = {"*experts*"};
  expect_error([&] { quantize_checkpoint(m.in, m.dir / "inc", o); },
               {"--include \"*experts*\"", "nothing that can be quantized", "3-D stacked experts"});
  EXPECT_FALSE(fs::exists(m.dir / "inc"));
}

TEST(Convert, WeightsWithoutInputFeaturesAreKept) {
  // K = 0 has no groups: quantized, it became packed codes and scales of width 0, which no reader
  // (microscale's included) can tell the group size from. Found by the checkpoint fuzzer.
  for (const auto& [mode, to] : {std::pair{Mode::affine, Convention::mlx},
                                 {Mode::nvfp4, Convention::compressed_tensors},
                                 {Mode::nvfp4, Convention::modelopt}}) {
    SCOPED_TRACE(name(to));
    TinyModel m;
    const std::string p = "model.layers.0.";
    m.add(p + "self_attn.q_proj.weight", {64, 0});
    m.add(p + "self_attn.k_proj.weight", {0, 0});
    m.add(p + "self_attn.v_proj.weight", {64, 64});
    m.write(R"({"model_type": "llama", "torch_dtype": "bfloat16"})");
    const fs::path out = m.dir / "out";
    const Report r = quantize_checkpoint(m.in, out, qopt(mode, to));
    for (const char* n : {"self_attn.q_proj.weight", "self_attn.k_proj.weight"}) {
      const TensorReport* t = find_report(r, p + n);
      ASSERT_NE(t, nullptr) << n;
      EXPECT_EQ(t->action, TensorAction::kept) << n;
      EXPECT_NE(t->reason.find("K = 0"), std::string::npos) << t->reason;
    }
    EXPECT_EQ(find_report(r, p + "self_attn.v_proj")->action, TensorAction::quantized);
    const CheckpointData back = load_checkpoint(out);
    ASSERT_EQ(back.layers.size(), 1u);
    EXPECT_EQ(back.layers[0].module, p + "self_attn.v_proj");
  }
}

TEST(Convert, SelectionsThatMatchNothingAreErrors) {
  Model m;
  auto refused = [&](QuantizeOptions o, std::initializer_list<std::string> parts) {
    expect_error([&] { quantize_checkpoint(m.in, m.dir / "o", o); }, parts);
    EXPECT_FALSE(fs::exists(m.dir / "o"));
  };
  QuantizeOptions o = qopt(Mode::nvfp4, Convention::compressed_tensors);
  o.exclude = {"down_proj", "down_prj"};
  refused(o, {"--exclude \"down_prj\"", "matches no module"});
  o = qopt(Mode::nvfp4, Convention::compressed_tensors);
  o.include = {"lm_haed"};
  refused(o, {"--include \"lm_haed\"", "matches no weight"});
  o = qopt(Mode::nvfp4, Convention::compressed_tensors);
  o.activation_amax = {{kQ, 2.0f}, {"model.layers.0.self_attn.q_prj", 2.0f}};
  refused(o, {"--activation-amax", "q_prj", "no module"});
  o.activation_amax = {{"lm_head", 2.0f}};
  refused(o, {"--activation-amax", "lm_head", "not quantized (lm_head)"});
  // Nothing left to quantize: every weight with its reason.
  o = qopt(Mode::nvfp4, Convention::compressed_tensors);
  o.exclude = {"*proj"};
  refused(o, {"no weights to quantize", kDown + ".weight\" (excluded)", "\"lm_head.weight\" (lm_head)",
              "\"model.embed_tokens.weight\" (embedding)"});
}

TEST(Convert, ActivationAmaxFilesAreReadStrictly) {
  TempDir dir;
  auto file = [&](const std::string& name, const std::string& text) {
    write_bytes(dir / name, iot::bytes_of(text));
    return dir / name;
  };
  EXPECT_EQ(read_activation_amax(file("ok.json", R"({"a": 2.5, "b": 0, "c": 1e-30, "d": 3})")),
            (std::map<std::string, float>{{"a", 2.5f}, {"b", 0.0f}, {"c", 1e-30f}, {"d", 3.0f}}));
  auto refused = [&](const fs::path& p, std::initializer_list<std::string> parts) {
    expect_error([&] { (void)read_activation_amax(p); }, parts);
  };
  refused(file("dup.json", R"({"a": 1, "b": 2, "a": 2})"),
          {"dup.json: --activation-amax file has duplicate key \"a\""});
  refused(dir.path(), {dir.path().string() + ": is a directory", "--activation-amax file"});
  refused(dir / "missing.json", {"missing.json: cannot open", "--activation-amax file"});
  // 1e-50 is 0 in float32, and 1e-40 a denormal: neither has a float32 scale that gives it back.
  refused(file("tiny.json", R"({"a": 1, "m.q_proj": 1e-50})"),
          {"tiny.json: --activation-amax file: amax of \"m.q_proj\" is 1e-50, below 3.159", "normal float32"});
  refused(file("denormal.json", R"({"m": 1e-40})"), {"denormal.json", "\"m\" is 1e-40, below"});
  refused(file("neg.json", R"({"m": -1})"), {"neg.json", "\"m\" is -1, not a finite non-negative float32"});
  refused(file("big.json", R"({"m": 1e39})"), {"big.json", "\"m\" is 1e+39, not a finite non-negative float32"});
  refused(file("str.json", R"({"m": "3"})"),
          {"str.json: --activation-amax file: amax of \"m\" is not a number (string)"});
  refused(file("bool.json", R"({"m": true})"), {"bool.json", "not a number (boolean)"});
  refused(file("nested.json", R"({"m": {"x": 1}})"), {"nested.json", "not a number (object)"});
  refused(file("deep.json", "{\"m\":" + std::string(100, '[') + std::string(100, ']') + "}"),
          {"deep.json: --activation-amax file nests deeper than"});
  refused(file("list.json", "[1]"),
          {"list.json: --activation-amax file must be a JSON object {module: amax}, not array"});
  refused(file("bad.json", "{\"m\": 1,}"), {"bad.json: --activation-amax file is not valid JSON"});

  // The same bound for amaxes given to quantize_checkpoint directly.
  Model m;
  QuantizeOptions o = qopt(Mode::nvfp4, Convention::compressed_tensors);
  for (const auto& [n, v] : m.w)
    if (why_kept(n, m.shape.at(n), StDType::bf16).empty()) o.activation_amax[n.substr(0, n.size() - 7)] = 3.5f;
  o.activation_amax[kQ] = 1e-36f;
  expect_error([&] { quantize_checkpoint(m.in, m.dir / "tiny", o); },
               {"activation amax of \"" + kQ + "\" is 1e-36, below"});
  EXPECT_FALSE(fs::exists(m.dir / "tiny"));
}

TEST(Convert, NonFiniteWeightsAreReported) {
  TinyModel m;
  const std::string p = "model.layers.0.self_attn.";
  m.add(p + "q_proj.weight", {64, 64}, StDType::bf16, [](std::int64_t i) {
    return i == 5 || i == 700 || i == 4000 ? NAN : i == 9 ? -INFINITY : 0.01 * static_cast<double>(i % 7);
  });
  m.add(p + "k_proj.weight", {64, 64});
  m.add(p + "v_proj.weight", {64, 64}, StDType::f32, [](std::int64_t) { return NAN; });
  m.write(R"({"model_type": "llama"})");
  const Report r = quantize_checkpoint(m.in, m.dir / "out", qopt(Mode::nvfp4, Convention::compressed_tensors));
  EXPECT_EQ(find_report(r, p + "q_proj")->nonfinite, 4);
  EXPECT_EQ(find_report(r, p + "k_proj")->nonfinite, 0);
  EXPECT_EQ(find_report(r, p + "v_proj")->nonfinite, 64 * 64);
  QuantizeOptions o = qopt(Mode::nvfp4, Convention::compressed_tensors);
  o.spec.nonfinite = NonFinite::error;
  o.exclude = {"v_proj"};
  expect_error([&] { quantize_checkpoint(m.in, m.dir / "err", o); },
               {"\"" + p + "q_proj.weight\"", "4 non-finite values (NaN/Inf) of 4096", "--nonfinite"});
  EXPECT_FALSE(fs::exists(m.dir / "err"));
}

TEST(Convert, Gpt2Conv1DWeightsAreRefused) {
  auto model = [](TinyModel& m, const char* config) {
    m.add("transformer.wte.weight", {96, 64});
    m.add("transformer.h.0.attn.c_attn.weight", {64, 192});
    m.add("transformer.h.0.attn.c_proj.weight", {64, 64});
    m.add("transformer.h.0.mlp.c_fc.weight", {64, 256});
    m.add("transformer.h.0.mlp.c_proj.weight", {256, 64});
    m.write(config);
  };
  TinyModel gpt2;
  model(gpt2, R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})");
  expect_error([&] { quantize_checkpoint(gpt2.in, gpt2.dir / "o", qopt(Mode::nvfp4, Convention::compressed_tensors)); },
               {"Conv1D", "[in, out]", "\"transformer.h.0.attn.c_attn.weight\"", "\"transformer.h.0.mlp.c_fc.weight\"",
                "--exclude c_attn"});
  EXPECT_FALSE(fs::exists(gpt2.dir / "o"));
  // GPT-BigCode uses the same names for Linear layers ([out, in]): quantized.
  TinyModel bigcode;
  model(bigcode, R"({"model_type": "gpt_bigcode"})");
  const Report r =
      quantize_checkpoint(bigcode.in, bigcode.dir / "o", qopt(Mode::nvfp4, Convention::compressed_tensors));
  EXPECT_EQ(find_report(r, "transformer.h.0.attn.c_attn")->action, TensorAction::quantized);
}

TEST(Convert, DequantizeDefaultsToTheSourceDtype) {
  TinyModel m;
  m.add("model.layers.0.mlp.up_proj.weight", {64, 64});
  m.add("model.layers.0.mlp.down_proj.weight", {64, 64});
  m.write(R"({"model_type": "llama", "torch_dtype": "float16"})");
  quantize_checkpoint(m.in, m.dir / "q", qopt(Mode::nvfp4, Convention::compressed_tensors));
  dequantize_checkpoint(m.dir / "q", m.dir / "dq", {});
  EXPECT_EQ(Checkpoint::open(m.dir / "dq").tensor("model.layers.0.mlp.up_proj.weight").dtype, StDType::f16);
  EXPECT_EQ(read_json(m.dir / "dq" / "config.json")["torch_dtype"], "float16");
  DequantizeOptions f32;
  f32.dtype = DType::float32;
  dequantize_checkpoint(m.dir / "q", m.dir / "dq32", f32);
  EXPECT_EQ(Checkpoint::open(m.dir / "dq32").tensor("model.layers.0.mlp.up_proj.weight").dtype, StDType::f32);
  EXPECT_EQ(read_json(m.dir / "dq32" / "config.json")["torch_dtype"], "float32");
  // Not recorded: bfloat16, said in a note.
  Json cfg = read_json(m.dir / "q" / "config.json");
  cfg.erase("torch_dtype");
  write_bytes(m.dir / "q" / "config.json", iot::bytes_of(cfg.dump()));
  const Report r = dequantize_checkpoint(m.dir / "q", m.dir / "dqb", {});
  EXPECT_EQ(Checkpoint::open(m.dir / "dqb").tensor("model.layers.0.mlp.up_proj.weight").dtype, StDType::bf16);
  EXPECT_EQ(read_json(m.dir / "dqb" / "config.json")["torch_dtype"], "bfloat16");
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("not recorded"), std::string::npos);
}

TEST(Convert, DamagedInputsGiveClearErrors) {
  Model m;
  const fs::path shard = m.in / shard_file_name(1, 2);
  Bytes good = read_bytes(shard);
  auto quant = [&](const char* dst) {
    quantize_checkpoint(m.in, m.dir.path() / dst, qopt(Mode::nvfp4, Convention::mlx));
  };
  // Truncated data area.
  write_bytes(shard, Bytes(good.begin(), good.end() - 100));
  expect_error([&] { quant("t"); }, {shard.string()});
  // Header length larger than the file (oversized).
  Bytes big = good;
  big[7] = std::byte{0x7F};
  write_bytes(shard, big);
  expect_error([&] { quant("o"); }, {shard.string(), "header"});
  // Corrupted JSON.
  Bytes bad = good;
  bad[9] = std::byte{'#'};
  write_bytes(shard, bad);
  expect_error([&] { quant("c"); }, {shard.string(), "JSON"});
  write_bytes(shard, good);

  // A quantized layer with a missing global scale / inconsistent scales.
  quantize_checkpoint(m.in, m.dir.path() / "ct", qopt(Mode::nvfp4, Convention::compressed_tensors));
  CheckpointData d = load_checkpoint(m.dir.path() / "ct");
  ASSERT_FALSE(d.layers.empty());
  d.layers[0].weight.scales = Tensor(DType::uint8, {3, 3});
  expect_error([&] { save_checkpoint(m.dir.path() / "bad", d, Convention::modelopt); }, {"scales must be uint8"});
  std::vector<StTensorData> t = {{"x.weight_packed", StDType::u8, {4, 8}, {}},
                                 {"x.weight_scale", StDType::f8_e4m3, {4, 1}, {}}};
  Bytes pk(32), sc(4);
  t[0].data = pk;
  t[1].data = sc;
  fs::create_directories(m.dir.path() / "broken");
  save_safetensors(m.dir.path() / "broken" / "model.safetensors", t);
  expect_error([&] { (void)inspect_checkpoint(m.dir.path() / "broken"); }, {"x", "weight_global_scale"});
  expect_error([&] { dequantize_checkpoint(m.in, m.dir.path() / "none", DequantizeOptions()); },
               {"no quantized layers"});
}

// save_checkpoint takes layers built by the caller: shapes are bounded before any arithmetic, and
// activation scales are written for every layer or refused, never dropped.
TEST(Convert, SaveCheckpointRefusesWhatItCannotWrite) {
  Model m;
  quantize_checkpoint(m.in, m.dir.path() / "ct", qopt(Mode::nvfp4, Convention::compressed_tensors));
  const CheckpointData good = load_checkpoint(m.dir.path() / "ct");
  ASSERT_GE(good.layers.size(), 2u);
  CheckpointData d = good;
  d.layers[0].weight.shape = {0, std::int64_t{1} << 62};  // k * bits would wrap int64
  expect_error([&] { save_checkpoint(m.dir.path() / "huge", d, Convention::modelopt); },
               {d.layers[0].module, "out of range"});
  d = good;
  d.layers[0].input_amax = 3.0f;  // one layer of many
  expect_error([&] { save_checkpoint(m.dir.path() / "partial", d, Convention::compressed_tensors); },
               {"1 of", "input_amax", "every layer"});
  for (QuantizedLayer& l : d.layers) l.input_amax = 3.0f;
  expect_error([&] { save_checkpoint(m.dir.path() / "mlx", d, Convention::mlx); }, {"input_amax", "ModelOpt"});
  d.layers[1].input_amax = 1e-36f;  // its input_scale amax/2688 would be a denormal
  expect_error([&] { save_checkpoint(m.dir.path() / "tiny", d, Convention::modelopt); },
               {d.layers[1].module, "input_amax is 1e-36, below"});
  d.layers[1].input_amax = 3.0f;
  EXPECT_FALSE(fs::exists(m.dir.path() / "huge") || fs::exists(m.dir.path() / "partial") ||
               fs::exists(m.dir.path() / "mlx") || fs::exists(m.dir.path() / "tiny"));
  save_checkpoint(m.dir.path() / "w4a4", d, Convention::modelopt);
  for (const QuantizedLayer& l : load_checkpoint(m.dir.path() / "w4a4").layers) {
    ASSERT_TRUE(l.input_amax.has_value()) << l.module;
    EXPECT_NEAR(*l.input_amax, 3.0f, 3e-6f) << l.module;
  }
}

TEST(Convert, InspectAndInMemoryRoundTrip) {
  Model m;
  quantize_checkpoint(m.in, m.dir.path() / "ct", qopt(Mode::nvfp4, Convention::compressed_tensors));
  const InspectResult r = inspect_checkpoint(m.dir.path() / "ct");
  EXPECT_EQ(r.convention, "compressed-tensors");
  bool saw_global = false, saw_packed = false;
  for (const InspectRow& row : r.rows) {
    if (row.name == kQ + ".weight_global_scale") {
      saw_global = true;
      EXPECT_NE(row.detail.find("= 2688/amax -> amax"), std::string::npos) << row.detail;
    }
    if (row.name == kQ + ".weight_packed") {
      saw_packed = true;
      EXPECT_EQ(row.format, "nvfp4 packed");
      ASSERT_TRUE(row.stats.valid);
      EXPECT_GT(row.stats.std, 0.01);
      EXPECT_LT(row.stats.std, 0.03);
    }
  }
  EXPECT_TRUE(saw_global && saw_packed);

  CheckpointData d = load_checkpoint(m.dir.path() / "ct");
  EXPECT_EQ(d.convention, "compressed-tensors");
  EXPECT_EQ(d.layers.size(), 14u);
  EXPECT_EQ(d.tensors.size(), 5u);  // embeddings, lm_head, three norms
  save_checkpoint(m.dir.path() / "mo", d, Convention::modelopt);
  CheckpointData e = load_checkpoint(m.dir.path() / "mo");
  EXPECT_EQ(e.convention, "modelopt");
  for (std::size_t i = 0; i < d.layers.size(); ++i) {
    EXPECT_EQ(d.layers[i].module, e.layers[i].module);
    const Tensor a = dequantize(d.layers[i].weight, DType::float32), b = dequantize(e.layers[i].weight, DType::float32);
    for (std::int64_t k = 0; k < a.numel(); ++k)
      EXPECT_NEAR(a.data<float>()[k], b.data<float>()[k], 1e-6f * std::fabs(a.data<float>()[k])) << d.layers[i].module;
  }
}

}  // namespace
