// Sharded checkpoints: index reading with lazy shard opening, validation, and index writing.
#include <atomic>
#include <map>
#include <thread>

#include "io_support.hpp"

namespace {

using namespace microscale;
using namespace microscale::io;
using namespace iot;

// Three shards of two tensors each plus the index, as a converter would write them.
struct Sharded {
  TempDir dir;
  std::map<std::string, Bytes> data;
  std::vector<fs::path> shards;

  Sharded() {
    for (std::size_t s = 0; s < 3; ++s) {
      std::vector<StTensorData> ts;
      for (std::size_t k = 0; k < 2; ++k) {
        std::string name = "layers." + std::to_string(s) + ".w" + std::to_string(k);
        data[name] = pattern(16 * (k + 1), static_cast<unsigned>(s * 2 + k));
        ts.push_back(
            {name, k ? StDType::bf16 : StDType::f32, {k ? 8 : 4, static_cast<std::int64_t>(k + 1)}, data[name]});
      }
      shards.push_back(dir / shard_file_name(s, 3));
      save_safetensors(shards.back(), ts, {{"format", "pt"}});
    }
    write_index(dir / "model.safetensors.index.json", shards, {{"producer", "microscale"}});
  }
  fs::path index() const { return dir / "model.safetensors.index.json"; }
  void write_index_text(const std::string& text) const { write_bytes(index(), bytes_of(text)); }
};

TEST(Checkpoint, ShardFileNames) {
  EXPECT_EQ(shard_file_name(0, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(shard_file_name(11, 12), "model-00012-of-00012.safetensors");
  expect_error([] { (void)shard_file_name(3, 3); }, {"shard 3 of 3"});
}

TEST(Checkpoint, ShardedRoundTrip) {
  Sharded s;
  // The index written is the Hugging Face layout with total_size the sum of tensor bytes.
  std::string text;
  {
    Bytes b = read_bytes(s.index());
    text.assign(reinterpret_cast<const char*>(b.data()), b.size());
  }
  EXPECT_NE(text.find("\"total_size\": 144"), std::string::npos) << text;
  EXPECT_NE(text.find("\"layers.0.w0\": \"model-00001-of-00003.safetensors\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"producer\": \"microscale\""), std::string::npos) << text;

  for (const fs::path& p : {s.dir.path(), s.index()}) {
    Checkpoint c = Checkpoint::open(p);
    EXPECT_EQ(c.total_size(), 144u);
    EXPECT_EQ(c.metadata().at("producer"), "microscale");
    EXPECT_EQ(c.shards().size(), 3u);
    EXPECT_EQ(c.names().size(), 6u);
    EXPECT_TRUE(std::is_sorted(c.names().begin(), c.names().end()));
    for (const auto& [name, bytes] : s.data) {
      ASSERT_TRUE(c.contains(name));
      EXPECT_EQ(to_bytes(c.tensor(name).data), bytes) << name;
      EXPECT_EQ(c.shard_of(name).filename(), shard_file_name(static_cast<std::size_t>(name[7] - '0'), 3));
    }
    EXPECT_EQ(c.tensor("layers.2.w1").dtype, StDType::bf16);
    EXPECT_EQ(c.tensor("layers.2.w1").shape, (Shape{8, 2}));
    EXPECT_EQ(&c.tensor("layers.1.w0"), &c.tensor("layers.1.w0"));  // each shard opened once
    EXPECT_EQ(c.shard(1).metadata().at("format"), "pt");
    EXPECT_FALSE(c.contains("nope"));
    expect_error([&] { (void)c.tensor("nope"); }, {"model.safetensors.index.json", "no tensor named \"nope\""});
    expect_error([&] { (void)c.shard_of("nope"); }, {"no tensor named"});
    EXPECT_NO_THROW(c.validate());
  }
}

TEST(Checkpoint, ShardsOpenLazily) {
  Sharded s;
  Checkpoint c = Checkpoint::open(s.dir.path());
  (void)c.tensor("layers.0.w0");
  fs::remove(s.shards[2]);  // never opened yet: the failure shows on first use, not before
  EXPECT_EQ(to_bytes(c.tensor("layers.0.w1").data), s.data["layers.0.w1"]);
  expect_error([&] { (void)c.tensor("layers.2.w0"); }, {"model-00003-of-00003.safetensors", "cannot open"});
  // Reopening checks existence of every shard up front.
  expect_error([&] { (void)Checkpoint::open(s.dir.path()); },
               {"maps to missing shard file", "model-00003-of-00003.safetensors"});
}

TEST(Checkpoint, IndexMappingDisagreesWithShards) {
  Sharded s;
  // layers.0.w0 mapped to the wrong shard.
  s.write_index_text(R"({"metadata":{"total_size":144},"weight_map":{
      "layers.0.w0":"model-00002-of-00003.safetensors","layers.0.w1":"model-00001-of-00003.safetensors",
      "layers.1.w0":"model-00002-of-00003.safetensors","layers.1.w1":"model-00002-of-00003.safetensors",
      "layers.2.w0":"model-00003-of-00003.safetensors","layers.2.w1":"model-00003-of-00003.safetensors"}})");
  Checkpoint c = Checkpoint::open(s.index());
  EXPECT_EQ(c.names().front(), "layers.0.w0");  // index order
  expect_error([&] { (void)c.tensor("layers.0.w0"); },
               {"shard \"" + s.shards[1].string() + "\" does not contain tensor \"layers.0.w0\""});
  expect_error([&] { c.validate(); }, {"does not contain tensor \"layers.0.w0\""});

  // A tensor in a shard that the index leaves out.
  s.write_index_text(R"({"weight_map":{
      "layers.0.w0":"model-00001-of-00003.safetensors","layers.0.w1":"model-00001-of-00003.safetensors",
      "layers.1.w0":"model-00002-of-00003.safetensors",
      "layers.2.w0":"model-00003-of-00003.safetensors","layers.2.w1":"model-00003-of-00003.safetensors"}})");
  Checkpoint d = Checkpoint::open(s.index());
  EXPECT_FALSE(d.total_size());
  EXPECT_EQ(to_bytes(d.tensor("layers.1.w0").data), s.data["layers.1.w0"]);
  expect_error([&] { d.validate(); }, {"holds tensor \"layers.1.w1\" that the index does not map to it"});
}

TEST(Checkpoint, HostileIndexes) {
  Sharded s;
  auto bad = [&](const std::string& text, std::initializer_list<std::string> parts) {
    s.write_index_text(text);
    expect_error([&] { (void)Checkpoint::open(s.index()); }, parts);
  };
  bad("{", {"model.safetensors.index.json", "index is not valid JSON"});
  bad("[]", {"index is not a JSON object"});
  bad(R"({"metadata":{}})", {"no \"weight_map\" object"});
  bad(R"({"weight_map":[]})", {"no \"weight_map\" object"});
  bad(R"({"weight_map":{"a":1}})", {"weight_map entry for \"a\" is not a file name"});
  bad(R"({"weight_map":{"a":"x","a":"y"}})", {"duplicate key \"a\""});
  bad(R"({"metadata":[],"weight_map":{}})", {"\"metadata\" is not an object"});
  bad(R"({"metadata":{"total_size":-1},"weight_map":{}})", {"total_size -1 is not a non-negative integer"});
  bad(R"({"metadata":{"total_size":"1"},"weight_map":{}})", {"total_size \"1\""});
  bad(R"({"weight_map":{"a":"missing.safetensors"}})", {"\"a\" maps to missing shard file"});
  bad(R"({"weight_map":{"a":"../x.safetensors"}})", {"shard \"../x.safetensors\"", "not a relative path inside"});
  bad(R"({"weight_map":{"a":"sub/../../x.safetensors"}})", {"not a relative path inside"});
  bad(R"({"weight_map":{"a":"/etc/passwd"}})", {"not a relative path inside"});
  bad(R"({"weight_map":{"a":""}})", {"not a relative path inside"});
  bad(R"({"weight_map":{"a":"."}})", {"not a relative path inside"});
  // Unknown metadata is kept as JSON text; an empty map is a valid (empty) checkpoint.
  s.write_index_text(R"({"metadata":{"total_size":0,"n":[1,2],"s":"t"},"weight_map":{}})");
  Checkpoint c = Checkpoint::open(s.index());
  EXPECT_TRUE(c.names().empty());
  EXPECT_EQ(c.metadata().at("n"), "[1,2]");
  EXPECT_EQ(c.metadata().at("s"), "t");
  EXPECT_NO_THROW(c.validate());
}

TEST(Checkpoint, SubdirectoryShards) {
  TempDir dir;
  fs::create_directories(dir / "parts");
  Bytes d = pattern(8);
  save_safetensors(dir / "parts" / "a.safetensors", {{"a", StDType::u8, {8}, d}});
  write_index(dir / "model.safetensors.index.json", {dir / "parts" / "a.safetensors"});
  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.shard_of("a"), dir / "parts" / "a.safetensors");
  EXPECT_EQ(to_bytes(c.tensor("a").data), d);
}

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  Bytes d = pattern(8);
  save_safetensors(dir / "model.safetensors", {{"b", StDType::u8, {8}, d}, {"a", StDType::u8, {0}, {}}}, {{"k", "v"}});
  for (const fs::path& p : {dir.path(), dir / "model.safetensors"}) {
    Checkpoint c = Checkpoint::open(p);
    EXPECT_EQ(c.names(), (std::vector<std::string>{"b", "a"}));
    EXPECT_EQ(c.shards().size(), 1u);
    EXPECT_EQ(c.metadata().at("k"), "v");
    EXPECT_FALSE(c.total_size());
    EXPECT_EQ(to_bytes(c.tensor("b").data), d);
    EXPECT_NO_THROW(c.validate());
  }
  fs::remove(dir / "model.safetensors");
  expect_error([&] { (void)Checkpoint::open(dir.path()); },
               {"neither model.safetensors.index.json nor model.safetensors"});
}

TEST(Checkpoint, WriteIndexErrors) {
  TempDir dir;
  Bytes d = pattern(4);
  save_safetensors(dir / "s1.safetensors", {{"x", StDType::u8, {4}, d}});
  save_safetensors(dir / "s2.safetensors", {{"x", StDType::u8, {4}, d}});
  const fs::path idx = dir / "model.safetensors.index.json";
  expect_error(
      [&] {
        write_index(idx, {dir / "s1.safetensors", dir / "s2.safetensors"});
      },
      {"tensor \"x\" is in both \"s1.safetensors\" and \"s2.safetensors\""});
  expect_error([&] { write_index(idx, {dir / "nope.safetensors"}); }, {"nope.safetensors", "cannot open"});
  expect_error([&] { write_index(idx, {fs::path("/tmp/elsewhere.safetensors")}); }, {"not inside the index directory"});
  expect_error(
      [&] {
        write_index(idx, {dir / "s1.safetensors"}, {{"total_size", "1"}});
      },
      {"cannot override total_size"});
  EXPECT_FALSE(fs::exists(idx));
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"s1.safetensors", "s2.safetensors"}));  // no temp files
}

TEST(Checkpoint, ConcurrentAccess) {
  Sharded s;
  Checkpoint c = Checkpoint::open(s.dir.path());
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (const auto& [name, bytes] : s.data)
        if (to_bytes(c.tensor(name).data) == bytes) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8 * 6);
}

}  // namespace
