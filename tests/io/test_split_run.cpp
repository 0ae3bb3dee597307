// quantize_checkpoint split across processes (QuantizeOptions::part): the parts' output equals a
// single-process run's byte for byte, it is published only once every part is done, and parts
// that disagree are refused. (The CLI, launchers and killed parts: tests/python/test_checkpoint_parts.py.)
#include <limits>
#include <map>
#include <random>

#include "io_support.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/codecs.hpp"

namespace {

using namespace microscale;
using namespace microscale::io;
using namespace iot;

// Four shards of one layer's projections; q_proj and k_proj, and gate_proj and up_proj, are in
// shards that two parts split between them, so those fused groups' shared scale spans parts.
fs::path write_model(const TempDir& dir) {
  const fs::path in = dir / "in";
  fs::create_directories(in);
  const std::vector<std::vector<std::pair<std::string, Shape>>> shards = {
      {{"model.embed_tokens.weight", {32, 64}}, {"model.layers.0.self_attn.q_proj.weight", {64, 64}}},
      {{"model.layers.0.self_attn.k_proj.weight", {32, 64}},
       {"model.layers.0.self_attn.v_proj.weight", {32, 64}},
       {"model.layers.0.mlp.gate_proj.weight", {128, 64}}},
      {{"model.layers.0.mlp.up_proj.weight", {128, 64}}, {"model.layers.0.self_attn.o_proj.weight", {64, 64}}},
      {{"model.layers.0.mlp.down_proj.weight", {64, 128}}, {"model.norm.weight", {64}}}};
  std::mt19937 rng(7);
  std::vector<std::vector<std::uint16_t>> data;  // alive until saved
  std::vector<fs::path> paths;
  float scale = 0.01f;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    std::vector<StTensorData> tensors;
    for (const auto& [name, shape] : shards[s]) {
      std::normal_distribution<float> d(0.0f, scale += 0.01f);  // every amax differs
      auto& v = data.emplace_back(static_cast<std::size_t>(numel(shape)));
      for (auto& x : v) x = encode_bf16(d(rng));
      tensors.push_back({name, StDType::bf16, shape, std::as_bytes(std::span(v))});
    }
    paths.push_back(in / shard_file_name(s, shards.size()));
    save_safetensors(paths.back(), tensors, {{"format", "pt"}});
  }
  write_index(in / "model.safetensors.index.json", paths);
  write_bytes(in / "config.json", bytes_of(R"({"model_type": "llama"})"));
  write_bytes(in / "tokenizer.json", bytes_of("{}"));
  return in;
}

std::map<std::string, Bytes> tree(const fs::path& dir) {
  std::map<std::string, Bytes> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().lexically_relative(dir).string()] = read_bytes(e.path());
  return out;
}

TEST(SplitRun, PartsEqualASingleRunAndPublishOnlyOnceAllAreDone) {
  TempDir dir;
  const fs::path in = write_model(dir);
  QuantizeOptions opt;
  quantize_checkpoint(in, dir / "single", opt);
  const fs::path out = dir / "split";
  for (const int i : {1, 2}) {
    opt.part = {i, 3};
    EXPECT_FALSE(quantize_checkpoint(in, out, opt).published);
    EXPECT_FALSE(fs::exists(out));
  }
  QuantizeOptions whole;
  expect_error([&] { quantize_checkpoint(in, out, whole); }, {"unfinished", "parts 1, 2 of 3 are done"});
  opt.part = {0, 3};
  const Report r = quantize_checkpoint(in, out, opt);
  EXPECT_TRUE(r.published);
  EXPECT_EQ(r.shards, 2u);  // shards 0 and 3 of 4
  EXPECT_EQ(tree(out), tree(dir / "single"));
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"in", "single", "split"}));
}

TEST(SplitRun, PartsThatDisagreeAreRefused) {
  TempDir dir;
  const fs::path in = write_model(dir);
  QuantizeOptions opt;
  opt.part = {0, 2};
  quantize_checkpoint(in, dir / "out", opt);
  QuantizeOptions other = opt;
  other.part = {1, 3};
  expect_error([&] { quantize_checkpoint(in, dir / "out", other); }, {"started with --part .../2"});
  other = opt;
  other.part = {1, 2};
  other.spec.mode = Mode::mxfp4;
  expect_error([&] { quantize_checkpoint(in, dir / "out", other); }, {"other options"});
  other.spec.mode = Mode::nvfp4;
  other.share_fused_scales = false;
  expect_error([&] { quantize_checkpoint(in, dir / "out", other); }, {"other options"});
  for (const Part bad : {Part{0, 0}, Part{2, 2}, Part{-1, 2}}) {
    other = opt;
    other.part = bad;
    expect_error([&] { quantize_checkpoint(in, dir / "out", other); }, {"the number of parts must be at least 1"});
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
  opt.part = {1, 2};
  EXPECT_TRUE(quantize_checkpoint(in, dir / "out", opt).published);
}

// A part count far above the shard count (a typo, INT_MAX) costs a directory listing per command,
// not a lookup per part: 2^31 - 1 parts used to mean 2^31 stat calls for every later run.
TEST(SplitRun, AHugePartCountCostsWhatExists) {
  TempDir dir;
  const fs::path in = write_model(dir);
  const int n = std::numeric_limits<int>::max();
  QuantizeOptions opt;
  opt.part = {n - 1, n};
  EXPECT_FALSE(quantize_checkpoint(in, dir / "out", opt).published);
  opt.part = {0, n};
  EXPECT_FALSE(quantize_checkpoint(in, dir / "out", opt).published);
  const QuantizeOptions whole;
  expect_error([&] { quantize_checkpoint(in, dir / "out", whole); },
               {"unfinished", "parts 0, " + std::to_string(n - 1) + " of " + std::to_string(n) + " are done"});
}

}  // namespace
