// Hostile model directories: quantized layers whose shapes, dtypes or config values would make the
// layout arithmetic divide by zero or overflow, inconsistent indexes, and paths that are not
// checkpoints. Every whole-checkpoint operation must refuse them with an Error naming the culprit.
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cfloat>
#include <cmath>
#include <csignal>

#include "io_support.hpp"
#include "microscale/checkpoint.hpp"

namespace {

using namespace microscale;
using namespace microscale::io;
using namespace iot;

// One tensor entry of a hand-written header (the data offsets are the caller's business).
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, std::uint64_t begin = 0,
                  std::uint64_t end = 0) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// `dir`/model with config.json and a model.safetensors made of `entries` (a header body) and `data`.
fs::path write_model(const TempDir& dir, const std::string& config, const std::string& entries,
                     const Bytes& data = {}) {
  const fs::path m = dir / "model";
  fs::create_directories(m);
  write_bytes(m / "config.json", bytes_of(config));
  write_bytes(m / "model.safetensors", raw_file("{" + entries + "}", data));
  return m;
}

// inspect, load, dequantize and convert all refuse `model` with a message holding `parts`, and
// leave no output checkpoint behind.
void expect_all_refuse(const TempDir& dir, const fs::path& model, std::initializer_list<std::string> parts) {
  SCOPED_TRACE(model.string());
  expect_error([&] { (void)inspect_checkpoint(model); }, parts);
  expect_error([&] { (void)inspect_checkpoint(model, false); }, parts);
  expect_error([&] { (void)load_checkpoint(model); }, parts);
  expect_error([&] { dequantize_checkpoint(model, dir / "dq", DequantizeOptions()); }, parts);
  for (Convention to : {Convention::compressed_tensors, Convention::modelopt, Convention::mlx}) {
    ConvertOptions o;
    o.to = to;
    o.force = true;
    expect_error([&] { convert_checkpoint(model, dir / "cv", o); }, parts);
  }
  for (const char* out : {"dq", "cv"}) EXPECT_FALSE(fs::exists(dir / out / "model.safetensors")) << out;
}

const std::string kMlxAffine4 = R"({"quantization": {"group_size": 64, "bits": 4}})";

TEST(HostileCheckpoint, MlxEmptyRowsHugeGroupDoesNotDivideByZero) {
  // The reported SIGFPE: K = 2^40 * 32 / 4 over one scale column gives a group of 2^43, which
  // used to be truncated to int 0 and then divided by.
  TempDir dir;
  const fs::path m = write_model(dir, kMlxAffine4,
                                 entry("m.weight", "U32", "[0,1099511627776]") + "," +
                                     entry("m.scales", "F16", "[0,1]") + "," + entry("m.biases", "F16", "[0,1]"));
  expect_all_refuse(dir, m, {"layer \"m\"", "group size 8796093022208"});
}

TEST(HostileCheckpoint, MlxZeroWidthWeightHasNoGroup) {
  // K = 0 with one scale column: a group of 0 elements.
  TempDir dir;
  const fs::path m = write_model(dir, kMlxAffine4,
                                 entry("m.weight", "U32", "[0,0]") + "," + entry("m.scales", "F16", "[0,1]") + "," +
                                     entry("m.biases", "F16", "[0,1]"));
  expect_all_refuse(dir, m, {"layer \"m\"", "group size 0"});
}

TEST(HostileCheckpoint, MlxConfigBitsAndGroupOutOfRange) {
  TempDir dir;
  const std::string w = entry("m.weight", "U32", "[0,8]") + "," + entry("m.scales", "F16", "[0,1]") + "," +
                        entry("m.biases", "F16", "[0,1]");
  // bits 0 divided K; 2^32 + 4 used to truncate to 4.
  expect_all_refuse(dir, write_model(dir, R"({"quantization": {"group_size": 64, "bits": 0}})", w),
                    {"layer \"m\"", "bits 0"});
  expect_all_refuse(dir, write_model(dir, R"({"quantization": {"group_size": 64, "bits": -4}})", w),
                    {"layer \"m\"", "bits -4"});
  expect_all_refuse(dir, write_model(dir, R"({"quantization": {"group_size": 64, "bits": 4294967300}})", w),
                    {"layer \"m\"", "bits 4294967300"});
  expect_all_refuse(dir,
                    write_model(dir, R"({"quantization": {"group_size": 4294967328, "bits": 4, "mode": "mxfp4"}})",
                                entry("m.weight", "U32", "[0,8]") + "," + entry("m.scales", "U8", "[0,2]")),
                    {"layer \"m\"", "group_size 4294967328"});
}

TEST(HostileCheckpoint, MlxAffineBitsThatContradictTheGroupSize) {
  // 8 words of 4-bit codes (K = 64) with one scale column: group 64. Read with bits 8, K becomes
  // 32 and the group 32; the config's group_size 64 used to go unchecked, and dequantize wrote
  // [4, 32] weights.
  TempDir dir;
  const std::string w = entry("m.weight", "U32", "[4,8]", 0, 128) + "," + entry("m.scales", "F16", "[4,1]", 128, 136) +
                        "," + entry("m.biases", "F16", "[4,1]", 136, 144);
  const Bytes d = pattern(144);
  expect_all_refuse(dir, write_model(dir, R"({"quantization": {"group_size": 64, "bits": 8}})", w, d),
                    {"layer \"m\"", "bits 8 and group_size 64", "K = 32", "groups of 32"});
  expect_all_refuse(dir, write_model(dir, R"({"quantization": {"group_size": 64, "bits": 4, "m": {"bits": 2}}})", w, d),
                    {"layer \"m\"", "bits 2 and group_size 64", "groups of 128"});
  // The bits that agree read as they are.
  const CheckpointData ok = load_checkpoint(write_model(dir, kMlxAffine4, w, d));
  EXPECT_EQ(ok.layers.at(0).weight.shape, (Shape{4, 64}));
}

TEST(HostileCheckpoint, MlxConfigBitsAndGroupMustBeIntegers) {
  // "bits": 4.0 used to read as no bits at all: "config.json has no quantization block".
  TempDir dir;
  const std::string w = entry("m.weight", "U32", "[0,8]") + "," + entry("m.scales", "F16", "[0,1]") + "," +
                        entry("m.biases", "F16", "[0,1]");
  expect_all_refuse(dir, write_model(dir, R"({"quantization": {"group_size": 64, "bits": 4.0}})", w),
                    {"layer \"m\"", "config.json gives bits 4.0", "must be an integer"});
  expect_all_refuse(dir, write_model(dir, R"({"quantization": {"group_size": 64, "bits": "4"}})", w),
                    {"layer \"m\"", "config.json gives bits \"4\"", "must be an integer"});
  expect_all_refuse(dir, write_model(dir, R"({"quantization": {"group_size": 64, "bits": 4, "m": {"bits": 8.5}}})", w),
                    {"layer \"m\"", "config.json gives bits 8.5", "must be an integer"});
  expect_all_refuse(dir,
                    write_model(dir, R"({"quantization": {"group_size": 32.0, "bits": 4, "mode": "mxfp4"}})",
                                entry("m.weight", "U32", "[0,8]") + "," + entry("m.scales", "U8", "[0,2]")),
                    {"layer \"m\"", "config.json gives group_size 32.0", "must be an integer"});
}

TEST(HostileCheckpoint, MlxPackedWidthOverflow) {
  // 2^62 words * 32 bits wraps int64 (it used to report "group_size -512").
  TempDir dir;
  expect_all_refuse(dir,
                    write_model(dir, kMlxAffine4,
                                entry("m.weight", "U32", "[0,4611686018427387904]") + "," +
                                    entry("m.scales", "F16", "[0,1]") + "," + entry("m.biases", "F16", "[0,1]")),
                    {"layer \"m\"", "[0, 4611686018427387904]", "overflow"});
  expect_all_refuse(
      dir,
      write_model(dir, "{}",
                  entry("m.weight", "U32", "[0,4611686018427387904]") + "," + entry("m.scales", "U8", "[0,1]")),
      {"layer \"m\"", "overflow"});
}

TEST(HostileCheckpoint, PackedWidthOverflowCompressedTensorsAndModelOpt) {
  // K = 2 * 2^62 wraps to a negative width ("expected F8_E4M3 [0, -576460752303423488]").
  TempDir dir;
  Bytes g(4);
  const float one = 1.0f;
  std::memcpy(g.data(), &one, 4);
  expect_all_refuse(dir,
                    write_model(dir, "{}",
                                entry("m.weight_packed", "U8", "[0,4611686018427387904]") + "," +
                                    entry("m.weight_scale", "F8_E4M3", "[0,1]") + "," +
                                    entry("m.weight_global_scale", "F32", "[1]", 0, 4),
                                g),
                    {"layer \"m\"", "[0, 4611686018427387904]", "overflow"});
  expect_all_refuse(
      dir,
      write_model(dir, "{}",
                  entry("m.weight", "U8", "[0,4611686018427387904]") + "," +
                      entry("m.weight_scale", "F8_E4M3", "[0,1]") + "," + entry("m.weight_scale_2", "F32", "[]", 0, 4),
                  g),
      {"layer \"m\"", "[0, 4611686018427387904]", "overflow"});
}

Bytes f32(float v) {
  Bytes b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

TEST(HostileCheckpoint, GlobalScalesWhoseAmaxIsNotFinite) {
  // 2688 / 1e-40 overflows float: convert used to copy such a layer that load then refused.
  TempDir dir;
  Bytes d = pattern(32 + 4);
  for (std::size_t i = 32; i < 36; ++i) d[i] = std::byte{0x38};  // E4M3 1.0 block scales
  Bytes ct = d, tiny = f32(1e-40f);
  ct.insert(ct.end(), tiny.begin(), tiny.end());
  const std::string layer =
      entry("m.weight_packed", "U8", "[4,8]", 0, 32) + "," + entry("m.weight_scale", "F8_E4M3", "[4,1]", 32, 36) + ",";
  expect_all_refuse(dir, write_model(dir, "{}", layer + entry("m.weight_global_scale", "F32", "[1]", 36, 40), ct),
                    {"layer \"m\"", "invalid global scale"});
  // A NaN activation scale was never looked at.
  Bytes mo = d, one = f32(1.0f), nan = f32(std::nanf(""));
  mo.insert(mo.end(), one.begin(), one.end());
  mo.insert(mo.end(), nan.begin(), nan.end());
  expect_all_refuse(
      dir,
      write_model(dir, "{}",
                  entry("m.weight", "U8", "[4,8]", 0, 32) + "," + entry("m.weight_scale", "F8_E4M3", "[4,1]", 32, 36) +
                      "," + entry("m.weight_scale_2", "F32", "[]", 36, 40) + "," +
                      entry("m.input_scale", "F32", "[]", 40, 44),
                  mo),
      {"layer \"m\"", "invalid activation scale"});
}

// ---- global scales at the edges

// A one-layer three-level nvfp4 model [4, 16] ("m") at dir/model: ModelOpt (weight_scale_2 = `g`,
// the decode factor) or compressed-tensors (weight_global_scale = `g`, the encode factor), every
// block scale byte `scale`.
fs::path nvfp4_layer(const TempDir& dir, bool modelopt, float g, std::uint8_t scale) {
  Bytes d = pattern(32);
  d.insert(d.end(), 4, std::byte{scale});
  const Bytes gb = f32(g);
  d.insert(d.end(), gb.begin(), gb.end());
  const std::string packed = modelopt ? "m.weight" : "m.weight_packed";
  const std::string global =
      modelopt ? entry("m.weight_scale_2", "F32", "[]", 36, 40) : entry("m.weight_global_scale", "F32", "[1]", 36, 40);
  return write_model(
      dir, "{}",
      entry(packed, "U8", "[4,8]", 0, 32) + "," + entry("m.weight_scale", "F8_E4M3", "[4,1]", 32, 36) + "," + global,
      d);
}

// Converts `model` to `to`: either refused naming the layer and the tensor it could not write,
// with nothing written, or converted to a checkpoint whose float32 values are bit for bit those
// of `model`. Returns whether it converted.
bool converts_keeping_values(const TempDir& dir, const fs::path& model, Convention to) {
  SCOPED_TRACE(std::string("to ") + name(to));
  fs::remove_all(dir / "cv");
  ConvertOptions o;
  o.to = to;
  try {
    convert_checkpoint(model, dir / "cv", o);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer \"m\""), std::string::npos) << msg;
    if (to != Convention::mlx) {
      EXPECT_NE(msg.find(to == Convention::modelopt ? "weight_scale_2" : "weight_global_scale"), std::string::npos)
          << msg;
    }
    EXPECT_FALSE(fs::exists(dir / "cv"));
    return false;
  }
  DequantizeOptions dq;
  dq.dtype = DType::float32;
  dq.force = true;
  dequantize_checkpoint(model, dir / "before", dq);
  dequantize_checkpoint(dir / "cv", dir / "after", dq);
  EXPECT_EQ(to_bytes(Checkpoint::open(dir / "before").tensor("m.weight").data),
            to_bytes(Checkpoint::open(dir / "after").tensor("m.weight").data));
  for (const char* d : {"cv", "before", "after"}) fs::remove_all(dir / d);
  return true;
}

TEST(HostileCheckpoint, ConvertKeepsTheValuesOfEdgeGlobalScalesOrRefuses) {
  // ModelOpt's weight_scale_2 multiplies, compressed-tensors' weight_global_scale divides. A
  // weight_scale_2 of 0 or -0 decodes to zeros, which no weight_global_scale gives over nonzero
  // block scales (it used to be written as 1: values up to 2688); a denormal one stands for an
  // amax whose 2688/amax overflows (written as FLT_MAX: values about 3000x larger).
  TempDir dir;
  constexpr std::uint8_t kOne = 0x38, kZero = 0x00;  // E4M3 block scales 1.0 and 0
  for (const float g : {0.0f, -0.0f, 1e-40f, FLT_TRUE_MIN}) {
    SCOPED_TRACE(g);
    const fs::path m = nvfp4_layer(dir, true, g, kOne);
    EXPECT_FALSE(converts_keeping_values(dir, m, Convention::compressed_tensors));
    EXPECT_FALSE(converts_keeping_values(dir, m, Convention::mlx));
    EXPECT_TRUE(converts_keeping_values(dir, m, Convention::modelopt));  // verbatim
  }
  // Over all-zero block scales every factor decodes to the same zeros: written as 1. Not for -0,
  // whose zeros carry the other sign.
  EXPECT_TRUE(converts_keeping_values(dir, nvfp4_layer(dir, true, 0.0f, kZero), Convention::compressed_tensors));
  EXPECT_FALSE(converts_keeping_values(dir, nvfp4_layer(dir, true, -0.0f, kZero), Convention::compressed_tensors));
  // An amax 2688/gs whose amax/2688 float32 holds only as a denormal: refused or kept, never moved.
  for (const std::uint8_t scale : {kOne, kZero})
    (void)converts_keeping_values(dir, nvfp4_layer(dir, false, FLT_MAX, scale), Convention::modelopt);
  // Ordinary scales cross both ways, and decode factor 1 (amax 2688) into MLX's two-level form.
  EXPECT_TRUE(converts_keeping_values(dir, nvfp4_layer(dir, true, 0.5f, kOne), Convention::compressed_tensors));
  EXPECT_TRUE(converts_keeping_values(dir, nvfp4_layer(dir, false, 2.0f, kOne), Convention::modelopt));
  EXPECT_TRUE(converts_keeping_values(dir, nvfp4_layer(dir, true, 1.0f, kOne), Convention::mlx));
  EXPECT_TRUE(converts_keeping_values(dir, nvfp4_layer(dir, false, 1.0f, kOne), Convention::mlx));
  // Values no reader accepts, in either convention: every operation refuses them.
  for (const bool modelopt : {true, false})
    for (const float g : {FLT_MAX, INFINITY, -INFINITY, NAN, -1.0f}) {
      if (!modelopt && g == FLT_MAX) continue;  // a valid encode factor (above)
      SCOPED_TRACE(g);
      expect_all_refuse(dir, nvfp4_layer(dir, modelopt, g, kOne), {"layer \"m\"", "invalid global scale"});
    }
  for (const float g : {0.0f, -0.0f, 1e-40f})  // 2688/gs is no finite amax
    expect_all_refuse(dir, nvfp4_layer(dir, false, g, kOne), {"layer \"m\"", "invalid global scale"});
}

TEST(HostileCheckpoint, SavedGlobalScalesKeepTheirValuesOrAreRefused) {
  // save_checkpoint takes microscale's amax: 0 over nonzero block scales decodes to zeros, which
  // neither layout's stored value gives.
  TempDir dir;
  Quantized q;
  q.spec.mode = Mode::nvfp4;
  q.spec.global_scale = 0.0f;
  q.shape = {4, 16};
  q.packed = Tensor(DType::uint8, {4, 8});
  q.scales = Tensor(DType::uint8, {4, 1});
  std::memset(q.packed.bytes(), 0x72, q.packed.nbytes());
  CheckpointData data;
  data.layers.push_back({"m", q, std::nullopt});
  for (const Convention to : {Convention::compressed_tensors, Convention::modelopt}) {
    std::memset(q.scales.bytes(), 0x38, q.scales.nbytes());
    data.layers[0].weight = q;
    expect_error([&] { save_checkpoint(dir / "s", data, to); }, {"layer \"m\"", "amax 0"});
    EXPECT_FALSE(fs::exists(dir / "s"));
    std::memset(q.scales.bytes(), 0, q.scales.nbytes());
    data.layers[0].weight = q;
    save_checkpoint(dir / "s", data, to, true);
    const Tensor y = dequantize(load_checkpoint(dir / "s").layers[0].weight, DType::float32);
    for (std::int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.data<float>()[i], 0.0f);
    fs::remove_all(dir / "s");
  }
}

TEST(HostileCheckpoint, SavedTensorsNamedLikeAPartOfALayerAreRefused) {
  // Beside layer "m": a tensor the layout writes for it, or one another layout's reader takes for
  // part of it. Written, the first made two tensors of one name, the others a checkpoint that
  // load_checkpoint refuses (or reads as the layer's activation scale).
  TempDir dir;
  Quantized q;
  q.spec.mode = Mode::nvfp4;
  q.spec.global_scale = 1.0f;
  q.shape = {4, 16};
  q.packed = Tensor(DType::uint8, {4, 8});
  q.scales = Tensor(DType::uint8, {4, 1});
  std::memset(q.scales.bytes(), 0x38, q.scales.nbytes());
  const std::pair<Convention, const char*> cases[] = {
      {Convention::mlx, "m.scales"},
      {Convention::mlx, "m.weight_global_scale"},
      {Convention::compressed_tensors, "m.weight_global_scale"},
      {Convention::compressed_tensors, "m.input_global_scale"},
      {Convention::compressed_tensors, "m.biases"},
      {Convention::modelopt, "m.input_scale"},
  };
  for (const auto& [to, extra] : cases) {
    SCOPED_TRACE(extra);
    CheckpointData data;
    data.layers.push_back({"m", q, std::nullopt});
    if (to == Convention::mlx) data.layers[0].weight.spec.global_scale.reset();
    data.tensors.push_back({extra, StDType::f32, {1}, std::vector<std::byte>(4)});
    expect_error([&] { save_checkpoint(dir / "s", data, to); },
                 {"\"" + std::string(extra) + "\"", "quantized layer \"m\""});
    EXPECT_FALSE(fs::exists(dir / "s"));
  }
}

// A compressed-tensors nvfp4 layer "m" [4, 16] with weight_global_scale `gs` and these block scales.
fs::path ct_layer(const TempDir& dir, float gs, std::array<std::uint8_t, 4> scales) {
  Bytes d = pattern(32);
  for (const std::uint8_t s : scales) d.push_back(std::byte{s});
  const Bytes g = f32(gs);
  d.insert(d.end(), g.begin(), g.end());
  return write_model(dir, "{}",
                     entry("m.weight_packed", "U8", "[4,8]", 0, 32) + "," +
                         entry("m.weight_scale", "F8_E4M3", "[4,1]", 32, 36) + "," +
                         entry("m.weight_global_scale", "F32", "[1]", 36, 40),
                     d);
}

std::int64_t reported_nonfinite(const Report& r, const std::string& name) {
  for (const TensorReport& t : r.tensors)
    if (t.name == name) return t.nonfinite;
  ADD_FAILURE() << name << " not reported";
  return -1;
}

TEST(HostileCheckpoint, DequantizeCountsNonFiniteValuesAndRefusesThemOnRequest) {
  TempDir dir;
  DequantizeOptions propagate, error;
  propagate.force = error.force = true;
  error.nonfinite = NonFinite::error;
  // E4M3's NaN code 0x7F as the second row's block scale: its 16 values decode to NaN.
  const fs::path nan = ct_layer(dir, 1.0f, {0x38, 0x7F, 0x38, 0x38});
  for (const DType dt : {DType::float32, DType::bfloat16, DType::float16}) {
    propagate.dtype = error.dtype = dt;
    EXPECT_EQ(reported_nonfinite(dequantize_checkpoint(nan, dir / "dq", propagate), "m"), 16);
    fs::remove_all(dir / "dq");
    expect_error([&] { dequantize_checkpoint(nan, dir / "dq", error); },
                 {"tensor \"m.weight\"", "16 NaN", "of 64", dtype_name(dt), "--nonfinite propagate"});
    EXPECT_FALSE(fs::exists(dir / "dq"));
  }
  // amax 1e6 over block scales of 448: values up to 1e6, past float16's 65504.
  const fs::path big = ct_layer(dir, 2688.0f / 1e6f, {0x7E, 0x7E, 0x7E, 0x7E});
  propagate.dtype = DType::float32;
  dequantize_checkpoint(big, dir / "f32", propagate);
  std::int64_t past_f16 = 0;  // f32 values that round to float16 infinity (65520 and beyond)
  const Checkpoint f32_values = Checkpoint::open(dir / "f32");
  const StTensor& y = f32_values.tensor("m.weight");
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    float v;
    std::memcpy(&v, y.data.data() + 4 * i, 4);
    past_f16 += std::fabs(v) >= 65520.0f;
  }
  ASSERT_GT(past_f16, 0);
  EXPECT_EQ(reported_nonfinite(dequantize_checkpoint(big, dir / "f32", propagate), "m"), 0);
  propagate.dtype = error.dtype = DType::float16;
  EXPECT_EQ(reported_nonfinite(dequantize_checkpoint(big, dir / "dq", propagate), "m"), past_f16);
  fs::remove_all(dir / "dq");
  expect_error([&] { dequantize_checkpoint(big, dir / "dq", error); },
               {"tensor \"m.weight\"", std::to_string(past_f16) + " infinite", "65504", "--dtype bfloat16"});
  EXPECT_FALSE(fs::exists(dir / "dq"));
  // Saturating has no meaning for values already decoded.
  error.nonfinite = NonFinite::saturate;
  expect_error([&] { dequantize_checkpoint(big, dir / "dq", error); }, {"nonfinite", "saturate"});
}

TEST(HostileCheckpoint, TensorsNamedLikeAnotherLayoutsPartOfALayerAreRefused) {
  // A ModelOpt layer beside "m.input_global_scale" (found by the checkpoint fuzzer): converted to
  // compressed-tensors the stray used to be copied through and then read as the layer's
  // activation scale. Same for parts of other layouts beside an MLX or compressed-tensors layer.
  TempDir dir;
  Bytes d = pattern(32 + 4);
  for (std::size_t i = 32; i < 36; ++i) d[i] = std::byte{0x38};
  const Bytes one = f32(1.0f);
  d.insert(d.end(), one.begin(), one.end());
  const std::string modelopt = entry("m.weight", "U8", "[4,8]", 0, 32) + "," +
                               entry("m.weight_scale", "F8_E4M3", "[4,1]", 32, 36) + "," +
                               entry("m.weight_scale_2", "F32", "[]", 36, 40) + ",";
  const std::string ct = entry("m.weight_packed", "U8", "[4,8]", 0, 32) + "," +
                         entry("m.weight_scale", "F8_E4M3", "[4,1]", 32, 36) + "," +
                         entry("m.weight_global_scale", "F32", "[1]", 36, 40) + ",";
  const std::pair<std::string, std::string> cases[] = {
      {modelopt + entry("m.input_global_scale", "F32", "[1]", 40, 44), "m.input_global_scale"},
      {modelopt + entry("m.input_global_scale", "F32", "[0,0,0]", 40, 40), "m.input_global_scale"},
      {modelopt + entry("m.weight_global_scale", "F32", "[1]", 40, 44), "m.weight_global_scale"},
      {ct + entry("m.input_scale", "F32", "[]", 40, 44), "m.input_scale"},
      {ct + entry("m.biases", "F32", "[1]", 40, 44), "m.biases"},
  };
  for (const auto& [entries, stray] : cases) {
    SCOPED_TRACE(stray);
    Bytes data = d;  // every stray but the empty one holds a 4-byte value
    if (entries.find("[0,0,0]") == std::string::npos) data.insert(data.end(), one.begin(), one.end());
    const fs::path m = write_model(dir, "{}", entries, data);
    const std::string part = "tensor \"" + stray + "\" is named like a part of quantized layer \"m\"";
    expect_error([&] { (void)load_checkpoint(m); }, {part, "remove or rename it"});
    expect_error([&] { dequantize_checkpoint(m, dir / "dq", DequantizeOptions()); }, {part});
    for (Convention to : {Convention::compressed_tensors, Convention::modelopt, Convention::mlx}) {
      ConvertOptions o;
      o.to = to;
      o.force = true;
      expect_error([&] { convert_checkpoint(m, dir / "cv", o); }, {part});
    }
    for (const char* out : {"dq", "cv"}) EXPECT_FALSE(fs::exists(dir / out / "model.safetensors")) << out;
    // inspect shows it rather than refusing the whole checkpoint
    bool shown = false;
    for (const InspectRow& r : inspect_checkpoint(m, false).rows)
      if (r.name == stray) shown = r.format == "stray" && r.detail.find("layer \"m\"") != std::string::npos;
    EXPECT_TRUE(shown);
  }
}

TEST(HostileCheckpoint, HugeEmptyLayersStillWork) {
  // Wide but empty layers within range are not errors: zero rows hold no data.
  TempDir dir;
  const fs::path m =
      write_model(dir, kMlxAffine4,
                  entry("m.weight", "U32", "[0,1048576]") + "," + entry("m.scales", "F16", "[0,131072]") + "," +
                      entry("m.biases", "F16", "[0,131072]"));
  const CheckpointData d = load_checkpoint(m);
  ASSERT_EQ(d.layers.size(), 1u);
  EXPECT_EQ(d.layers[0].weight.shape, (Shape{0, 8388608}));
  EXPECT_EQ(d.layers[0].weight.spec.group_size, 64);
}

// ---- index and shards that disagree

// A float model in two shards with the given index text; shard 1 holds a, b, shard 2 holds c.
fs::path sharded_model(const TempDir& dir, const std::string& weight_map) {
  const fs::path m = dir / "sharded";
  fs::create_directories(m);
  write_bytes(m / "config.json", bytes_of("{}"));
  const Bytes d = pattern(4 * 32 * 4);
  save_safetensors(m / "s1.safetensors",
                   {{"l.a.weight", StDType::f32, {4, 32}, d}, {"l.b.weight", StDType::f32, {4, 32}, d}});
  save_safetensors(m / "s2.safetensors", {{"l.c.weight", StDType::f32, {4, 32}, d}});
  write_bytes(m / "model.safetensors.index.json", bytes_of(R"({"metadata":{},"weight_map":{)" + weight_map + "}}"));
  return m;
}

void expect_quantize_refuses(const TempDir& dir, const fs::path& model, std::initializer_list<std::string> parts) {
  QuantizeOptions o;
  o.spec.mode = Mode::nvfp4;
  expect_error([&] { quantize_checkpoint(model, dir / "q", o); }, parts);
  EXPECT_FALSE(fs::exists(dir / "q" / "model.safetensors.index.json"));
}

TEST(HostileCheckpoint, ShardTensorMissingFromIndexIsRefused) {
  // l.b.weight is in s1 but not in the weight_map: it used to vanish from every output.
  TempDir dir;
  const fs::path m = sharded_model(dir, R"("l.a.weight":"s1.safetensors","l.c.weight":"s2.safetensors")");
  expect_all_refuse(dir, m, {"s1.safetensors", "holds tensor \"l.b.weight\"", "does not map"});
  expect_quantize_refuses(dir, m, {"s1.safetensors", "\"l.b.weight\""});
}

TEST(HostileCheckpoint, IndexTensorMissingFromShardIsRefused) {
  TempDir dir;
  const fs::path m = sharded_model(
      dir,
      R"("l.a.weight":"s1.safetensors","l.b.weight":"s1.safetensors","l.c.weight":"s2.safetensors","l.d.weight":"s2.safetensors")");
  expect_all_refuse(dir, m, {"s2.safetensors", "does not contain tensor \"l.d.weight\""});
  expect_quantize_refuses(dir, m, {"s2.safetensors", "\"l.d.weight\""});
  // The consistent index works.
  const fs::path ok = sharded_model(
      dir, R"("l.a.weight":"s1.safetensors","l.b.weight":"s1.safetensors","l.c.weight":"s2.safetensors")");
  EXPECT_EQ(inspect_checkpoint(ok).rows.size(), 3u);
}

// ---- paths that are not checkpoints

TEST(HostileCheckpoint, WrongPathsSayWhatIsExpected) {
  TempDir dir;
  const fs::path m = sharded_model(
      dir, R"("l.a.weight":"s1.safetensors","l.b.weight":"s1.safetensors","l.c.weight":"s2.safetensors")");
  expect_error([&] { (void)inspect_checkpoint(""); }, {"no model path given", "expected a model directory"});
  expect_error([&] { (void)load_checkpoint(dir / "nope"); },
               {"nope: no such file or directory", "expected a model directory"});
  expect_error([&] { (void)inspect_checkpoint(m / "config.json"); },
               {"config.json is the model's configuration, not its weights", "pass the directory"});
  write_bytes(dir / "other.json", bytes_of(R"({"a":1})"));
  expect_error([&] { (void)inspect_checkpoint(dir / "other.json"); },
               {"other.json", "not a checkpoint index", "expected a model directory"});
  expect_error([&] { (void)SafetensorsFile::open(""); }, {"no file given"});
  // A directory without the standard names says what it does hold.
  fs::create_directories(dir / "odd");
  expect_error([&] { (void)inspect_checkpoint(dir / "odd"); },
               {"holds neither model.safetensors.index.json nor model.safetensors", "expected a model directory"});
  save_safetensors(dir / "odd" / "weights.safetensors", {{"x", StDType::f32, {1}, pattern(4)}});
  expect_error([&] { (void)inspect_checkpoint(dir / "odd"); }, {"it has \"weights.safetensors\": pass that file"});
  EXPECT_EQ(inspect_checkpoint(dir / "odd" / "weights.safetensors").rows.size(), 1u);
}

TEST(HostileCheckpoint, NonRegularFilesAreRefusedByName) {
  TempDir dir;
  const fs::path m = dir / "model";
  fs::create_directories(m / "model.safetensors");
  expect_error([&] { (void)inspect_checkpoint(m); },
               {(m / "model.safetensors").string(), "is a directory, not a regular file"});
  expect_error([&] { (void)SafetensorsFile::open("/dev/null"); }, {"/dev/null: is a device"});
  expect_error([&] { (void)inspect_checkpoint("/dev/null"); }, {"/dev/null: is a device"});
}

// A FIFO used to block the open forever: the checks run in a child process that SIGALRM ends
// after 20 s, so the test fails instead of hanging when the refusal is missing.
TEST(HostileCheckpointDeathTest, FifosAreRefusedNotWaitedOn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  const fs::path m = dir / "model", f = m / "model.safetensors";
  fs::create_directories(m);
  ASSERT_EQ(::mkfifo(f.c_str(), 0600), 0);
  const fs::path withcfg = dir / "cfg";
  fs::create_directories(withcfg);
  save_safetensors(withcfg / "model.safetensors", {{"x", StDType::f32, {1}, pattern(4)}});
  ASSERT_EQ(::mkfifo((withcfg / "config.json").c_str(), 0600), 0);
  const fs::path withindex = dir / "idx";
  fs::create_directories(withindex);
  ASSERT_EQ(::mkfifo((withindex / "model.safetensors.index.json").c_str(), 0600), 0);
  EXPECT_EXIT(
      {
        ::alarm(20);
        expect_error([&] { (void)SafetensorsFile::open(f); },
                     {f.string(), "is a FIFO (named pipe), not a regular file"});
        expect_error([&] { (void)Checkpoint::open(m); }, {f.string(), "FIFO"});
        expect_error([&] { (void)inspect_checkpoint(m); }, {f.string(), "FIFO"});
        expect_error([&] { (void)load_checkpoint(f); }, {f.string(), "FIFO"});
        expect_error([&] { (void)inspect_checkpoint(withcfg); }, {"config.json", "FIFO"});
        expect_error([&] { (void)inspect_checkpoint(withindex); }, {"model.safetensors.index.json", "FIFO"});
        // The child made its own TempDir (the threadsafe style reruns the test) and std::exit
        // skips its destructor.
        const int code = ::testing::Test::HasFailure() ? 1 : 0;
        std::error_code ec;
        fs::remove_all(dir.path(), ec);
        std::exit(code);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
