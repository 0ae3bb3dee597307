// Hostile model directories: quantized layers whose shapes, dtypes or config values would make the
// layout arithmetic divide by zero or overflow, inconsistent indexes, and paths that are not
// checkpoints. Every whole-checkpoint operation must refuse them with an Error naming the culprit.
#include <sys/stat.h>
#include <sys/wait.h>

#include <csignal>

#include "io_support.hpp"
#include "microscale/checkpoint.hpp"

namespace {

using namespace microscale;
using namespace microscale::io;
using namespace iot;

// One tensor entry of a hand-written header (the data offsets are the caller's business).
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  std::uint64_t begin = 0, std::uint64_t end = 0) {
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
  expect_all_refuse(dir, write_model(dir, R"({"quantization": {"group_size": 4294967328, "bits": 4, "mode": "mxfp4"}})",
                                     entry("m.weight", "U32", "[0,8]") + "," + entry("m.scales", "U8", "[0,2]")),
                    {"layer \"m\"", "group_size 4294967328"});
}

TEST(HostileCheckpoint, MlxPackedWidthOverflow) {
  // 2^62 words * 32 bits wraps int64 (it used to report "group_size -512").
  TempDir dir;
  expect_all_refuse(dir,
                    write_model(dir, kMlxAffine4,
                                entry("m.weight", "U32", "[0,4611686018427387904]") + "," +
                                    entry("m.scales", "F16", "[0,1]") + "," + entry("m.biases", "F16", "[0,1]")),
                    {"layer \"m\"", "[0, 4611686018427387904]", "overflow"});
  expect_all_refuse(dir,
                    write_model(dir, "{}",
                                entry("m.weight", "U32", "[0,4611686018427387904]") + "," +
                                    entry("m.scales", "U8", "[0,1]")),
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
  expect_all_refuse(dir,
                    write_model(dir, "{}",
                                entry("m.weight", "U8", "[0,4611686018427387904]") + "," +
                                    entry("m.weight_scale", "F8_E4M3", "[0,1]") + "," +
                                    entry("m.weight_scale_2", "F32", "[]", 0, 4),
                                g),
                    {"layer \"m\"", "[0, 4611686018427387904]", "overflow"});
}

TEST(HostileCheckpoint, HugeEmptyLayersStillWork) {
  // Wide but empty layers within range are not errors: zero rows hold no data.
  TempDir dir;
  const fs::path m = write_model(dir, kMlxAffine4,
                                 entry("m.weight", "U32", "[0,1048576]") + "," + entry("m.scales", "F16", "[0,131072]") +
                                     "," + entry("m.biases", "F16", "[0,131072]"));
  const CheckpointData d = load_checkpoint(m);
  ASSERT_EQ(d.layers.size(), 1u);
  EXPECT_EQ(d.layers[0].weight.shape, (Shape{0, 8388608}));
  EXPECT_EQ(d.layers[0].weight.spec.group_size, 64);
}

}  // namespace
