// What a run reads is never what it writes (RunInputs), and the files copied beside the weights
// stay the model's own: links out of the model directory are skipped, permission bits are kept.
// (The CLI's report paths over every input: tests/python/test_cli_paths.py.)
#include <sys/stat.h>

#include "io_support.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/codecs.hpp"

namespace {

using namespace microscale;
using namespace microscale::io;
using namespace iot;

// A two-shard model with an index, config.json and a tokenizer.
fs::path write_model(const TempDir& dir) {
  const fs::path in = dir / "model";
  fs::create_directories(in);
  std::vector<std::uint16_t> w(64 * 64);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = encode_bf16(static_cast<float>(i % 17) * 0.01f);
  std::vector<fs::path> paths;
  for (const char* m : {"model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"}) {
    paths.push_back(in / shard_file_name(paths.size(), 2));
    save_safetensors(paths.back(),
                     {{std::string(m) + ".weight", StDType::bf16, {64, 64}, std::as_bytes(std::span(w))}});
  }
  write_index(in / "model.safetensors.index.json", paths);
  write_bytes(in / "config.json", bytes_of(R"({"model_type": "llama"})"));
  write_bytes(in / "tokenizer.json", bytes_of("{}"));
  return in;
}

TEST(RunInputs, EveryInputIsRefusedAsAReportByAnyName) {
  TempDir dir;
  const fs::path in = write_model(dir);
  write_bytes(dir / "h.safetensors", bytes_of("H"));
  RunInputs inputs(in);
  inputs.add("--hessians", dir / "h.safetensors");
  fs::create_hard_link(in / "model-00002-of-00002.safetensors", dir / "hard");
  fs::create_symlink(in / "config.json", dir / "soft");
  for (const auto& [path, what] : std::vector<std::pair<fs::path, std::string>>{
           {in / "model-00001-of-00002.safetensors", "shard"},
           {dir / "hard", "shard"},
           {dir / "soft", "config.json"},
           {in / "model.safetensors.index.json", "index"},
           {dir / "h.safetensors", "--hessians file"},
           {in / "tokenizer.json", "inside the model directory"},
           {in / "new.csv", "inside the model directory"},
           {dir / "x" / ".." / "model" / "new.csv", "inside the model directory"}})
    expect_error([&] { inputs.check_output_file("--report", path); }, {"--report", path.string(), what});
  inputs.check_output_file("--report", dir / "report.csv");  // beside the model: fine

  expect_error([&] { inputs.check_output_dir(in); }, {"is the input directory"});
  expect_error([&] { inputs.check_output_dir(dir.path()); }, {"holds the model directory"});
  fs::create_directories(dir / "prev");
  fs::rename(dir / "h.safetensors", dir / "prev" / "h.safetensors");
  RunInputs moved(in);
  moved.add("--hessians", dir / "prev" / "h.safetensors");
  expect_error([&] { moved.check_output_dir(dir / "prev"); }, {"holds the --hessians file"});
  moved.check_output_dir(dir / "other");
}

TEST(RunInputs, ASingleFileClaimsOnlyTheFilesItReads) {
  TempDir dir;
  const fs::path in = write_model(dir);
  const RunInputs inputs(in / "model-00001-of-00002.safetensors");
  expect_error([&] { inputs.check_output_file("--csv", in / "model-00001-of-00002.safetensors"); }, {"shard"});
  expect_error([&] { inputs.check_output_file("--csv", in / "config.json"); }, {"config.json"});
  inputs.check_output_file("--csv", in / "eval.csv");
}

TEST(SideFiles, LinksOutOfTheModelAreSkippedAndModesKept) {
  TempDir dir;
  const fs::path in = write_model(dir);
  write_bytes(dir / "secret", bytes_of("private key"));
  fs::create_symlink("../secret", in / "tokenizer_config.json");
  fs::create_symlink(dir / "secret", in / "special_tokens_map.json");
  fs::create_symlink("tokenizer.json", in / "vocab.json");
  fs::permissions(in / "tokenizer.json", fs::perms::owner_read | fs::perms::owner_write);
  const Report r = quantize_checkpoint(in, dir / "q", QuantizeOptions{});
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir / "q" / "tokenizer_config.json")));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir / "q" / "special_tokens_map.json")));
  EXPECT_EQ(read_bytes(dir / "q" / "vocab.json"), bytes_of("{}"));
  EXPECT_EQ(fs::status(dir / "q" / "tokenizer.json").permissions(), fs::perms::owner_read | fs::perms::owner_write);
  std::string notes;
  for (const std::string& n : r.notes) notes += n + "\n";
  EXPECT_NE(notes.find("tokenizer_config.json -> ../secret"), std::string::npos) << notes;
  EXPECT_NE(notes.find("special_tokens_map.json -> " + (dir / "secret").string()), std::string::npos) << notes;
}

}  // namespace
