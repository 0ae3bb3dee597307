// GGUF: the writer and reader against each other and against hand-built bytes, hostile headers,
// and ggml's nvfp4/mxfp4 blocks against a decoder written here from ggml's definitions.
#include <cmath>
#include <cstring>
#include <random>

#include "io/gguf_blocks.hpp"
#include "io/gguf_file.hpp"
#include "io_support.hpp"
#include "microscale/quantize.hpp"

namespace {

using namespace microscale;
using namespace microscale::io::gguf;
using namespace iot;
using microscale::io::detail::Json;

// ---- the container ----

std::vector<Kv> every_kv() {
  return {
      kv_str("general.architecture", "llama"),
      {"t.u8", ValueType::u8, 200},
      {"t.i8", ValueType::i8, -100},
      {"t.u16", ValueType::u16, 60000},
      {"t.i16", ValueType::i16, -30000},
      kv_u32("t.u32", 4000000000u),
      kv_i32("t.i32", -2000000000),
      kv_f32("t.f32", 0.1f),
      kv_bool("t.bool", true),
      kv_str("t.str", "caf\xc3\xa9 \x01 bytes"),
      kv_u64("t.u64", 18446744073709551557ull),
      {"t.i64", ValueType::i64, std::int64_t{-9223372036854775807} - 1},
      {"t.f64", ValueType::f64, 1.0 / 3.0},
      kv_array("t.arr.str", ValueType::string, Json::array({"a", "", "<|end|>"})),
      kv_array("t.arr.i32", ValueType::i32, Json::array({1, -2, 3})),
      kv_array("t.arr.f32", ValueType::f32, Json::array({0.5, -1.25})),
      kv_array("t.arr.u8", ValueType::u8, Json::array({0, 255})),
      kv_array("t.arr.bool", ValueType::boolean, Json::array({true, false})),
      kv_array("t.arr.u64", ValueType::u64, Json::array({std::uint64_t{1} << 63})),
      kv_array("t.arr.empty", ValueType::i64, Json::array()),
  };
}

std::vector<TensorInfo> every_tensor() {
  return {
      {"f32", GgmlType::f32, {3, 2}},      {"f16", GgmlType::f16, {5}},
      {"q8_0", GgmlType::q8_0, {64, 2}},   {"bf16", GgmlType::bf16, {4, 1, 2}},
      {"mxfp4", GgmlType::mxfp4, {32, 3}}, {"nvfp4", GgmlType::nvfp4, {128, 2, 1, 2}},
      {"empty", GgmlType::nvfp4, {64, 0}},
  };
}

// Each tensor's bytes, distinct per tensor.
std::vector<Bytes> tensor_data(const std::vector<TensorInfo>& ts) {
  std::vector<Bytes> out;
  for (std::size_t i = 0; i < ts.size(); ++i)
    out.push_back(pattern(tensor_bytes(ts[i].type, ts[i].ne, ts[i].name), static_cast<unsigned>(i + 3)));
  return out;
}

// Writes every tensor back to front, each in chunks of up to 7 bytes, last chunk first.
void write_backwards(GgufWriter& w, const std::vector<Bytes>& data) {
  for (std::size_t i = data.size(); i-- > 0;) {
    const Bytes& d = data[i];
    std::vector<std::size_t> starts;
    for (std::size_t s = 0; s < d.size(); s += 7) starts.push_back(s);
    for (std::size_t j = starts.size(); j-- > 0;) {
      const std::size_t n = std::min<std::size_t>(7, d.size() - starts[j]);
      w.write(i, starts[j], std::span(d).subspan(starts[j], n));
    }
  }
}

void expect_same_kv(const Kv& got, const Kv& want) {
  SCOPED_TRACE(want.key);
  EXPECT_EQ(got.key, want.key);
  EXPECT_EQ(got.type, want.type);
  if (want.type == ValueType::array) {
    EXPECT_EQ(got.elem, want.elem);
  }
  EXPECT_EQ(got.value, want.value) << got.value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

TEST(Gguf, RoundTripEveryKvAndTensorType) {
  for (std::uint32_t alignment : {32u, 64u, 1u}) {
    SCOPED_TRACE("alignment " + std::to_string(alignment));
    TempDir dir;
    const auto path = dir / "m.gguf";
    const auto kvs = every_kv();
    const auto ts = every_tensor();
    const auto data = tensor_data(ts);
    GgufWriter w(path, kvs, ts, alignment);
    write_backwards(w, data);
    w.finish();
    EXPECT_EQ(dir.list(), std::vector<std::string>{"m.gguf"});
    EXPECT_EQ(fs::file_size(path), w.file_size());
    EXPECT_EQ(w.tensor_size(4), 51u);
    expect_error([&] { (void)w.tensor_size(ts.size()); }, {"m.gguf", "index 7"});

    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.version(), 3u);
    // general.alignment is written only when it is not the default, as llama.cpp does.
    ASSERT_EQ(f.kvs().size(), kvs.size() + (alignment != 32 ? 1 : 0));
    for (std::size_t i = 0; i < kvs.size(); ++i) expect_same_kv(f.kvs()[i], kvs[i]);
    if (alignment != 32) expect_same_kv(*f.find("general.alignment"), kv_u32("general.alignment", alignment));
    EXPECT_EQ(f.find("t.nope"), nullptr);
    ASSERT_EQ(f.tensors().size(), ts.size());
    for (std::size_t i = 0; i < ts.size(); ++i) {
      SCOPED_TRACE(ts[i].name);
      const GgufTensor& t = f.tensors()[i];
      EXPECT_EQ(t.info.name, ts[i].name);
      EXPECT_EQ(t.info.type, ts[i].type);
      EXPECT_EQ(t.info.ne, ts[i].ne);
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_EQ(to_bytes(t.data), data[i]);
      EXPECT_EQ(f.tensor(ts[i].name), &t);
    }
    // The layout ggml reads: tensors back to back in order, each padded to the alignment.
    for (std::size_t i = 1; i < ts.size(); ++i) {
      const std::uint64_t prev_end = f.tensors()[i - 1].offset + data[i - 1].size();
      EXPECT_EQ(f.tensors()[i].offset, (prev_end + alignment - 1) / alignment * alignment);
    }
  }
}

TEST(Gguf, HeaderBytes) {
  // The fixed fields, read by hand: magic, version 3, then the counts as 64-bit integers, then the
  // first key as a 64-bit length and its bytes, its type as u32.
  TempDir dir;
  GgufWriter w(dir / "h.gguf", {kv_u32("a", 7)}, {{"t", GgmlType::f32, {1}}});
  const float one = 1.0f;
  w.write(0, 0, std::as_bytes(std::span(&one, 1)));
  w.finish();
  const Bytes b = read_bytes(dir / "h.gguf");
  auto u64_at = [&](std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  auto u32_at = [&](std::size_t at) {
    std::uint32_t v;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  ASSERT_EQ(b.size(), 128u);  // 74 header bytes padded to 96, then 4 data bytes padded to 32
  EXPECT_EQ(std::memcmp(b.data(), "GGUF", 4), 0);
  EXPECT_EQ(u32_at(4), 3u);
  EXPECT_EQ(u64_at(8), 1u);   // tensors
  EXPECT_EQ(u64_at(16), 1u);  // kvs
  EXPECT_EQ(u64_at(24), 1u);  // key length
  EXPECT_EQ(char(b[32]), 'a');
  EXPECT_EQ(u32_at(33), 4u);  // u32
  EXPECT_EQ(u32_at(37), 7u);
  EXPECT_EQ(u64_at(41), 1u);  // name length
  EXPECT_EQ(char(b[49]), 't');
  EXPECT_EQ(u32_at(50), 1u);  // n_dims
  EXPECT_EQ(u64_at(54), 1u);  // ne[0]
  EXPECT_EQ(u32_at(62), 0u);  // F32
  EXPECT_EQ(u64_at(66), 0u);  // offset
  float got;
  std::memcpy(&got, b.data() + 96, 4);
  EXPECT_EQ(got, 1.0f);
}

TEST(Gguf, FinishRefusesIncompleteWritesAndLeavesNothing) {
  const auto ts = every_tensor();
  const auto data = tensor_data(ts);
  const auto fresh = [&](const TempDir& dir) { return GgufWriter(dir / "m.gguf", {}, ts); };
  {
    TempDir dir;  // one tensor missing
    GgufWriter w = fresh(dir);
    for (std::size_t i = 1; i < ts.size(); ++i) w.write(i, 0, data[i]);
    expect_error([&] { w.finish(); }, {(dir / "m.gguf").string(), "\"f32\"", "0 of its 24 bytes"});
    EXPECT_TRUE(dir.list().empty());
  }
  {
    TempDir dir;  // one byte short
    GgufWriter w = fresh(dir);
    for (std::size_t i = 0; i < ts.size(); ++i)
      w.write(i, 0, std::span(data[i]).first(data[i].size() - (i == 4 ? 1 : 0)));
    expect_error([&] { w.finish(); }, {"m.gguf", "\"mxfp4\"", "50 of its 51 bytes"});
    EXPECT_TRUE(dir.list().empty());
  }
  {
    TempDir dir;  // overlapping and duplicate writes fail at once
    GgufWriter w = fresh(dir);
    w.write(0, 4, std::span(data[0]).subspan(4, 8));
    expect_error([&] { w.write(0, 0, std::span(data[0]).first(5)); }, {"m.gguf", "\"f32\"", "overlap"});
    EXPECT_TRUE(dir.list().empty());
    expect_error([&] { w.finish(); }, {"m.gguf"});
    EXPECT_TRUE(dir.list().empty());
  }
  {
    TempDir dir;
    GgufWriter w = fresh(dir);
    w.write(0, 0, data[0]);
    expect_error([&] { w.write(0, 0, data[0]); }, {"m.gguf", "overlap"});
    EXPECT_TRUE(dir.list().empty());
  }
  {
    TempDir dir;  // past the end of the tensor, and a tensor that does not exist
    GgufWriter w = fresh(dir);
    expect_error([&] { w.write(1, 8, std::span(data[1]).first(3)); }, {"\"f16\"", "outside its 10 bytes"});
    EXPECT_TRUE(dir.list().empty());
    GgufWriter w2 = fresh(dir);
    expect_error([&] { w2.write(ts.size(), 0, data[0]); }, {"m.gguf", "index 7"});
    EXPECT_TRUE(dir.list().empty());
  }
  {
    TempDir dir;  // the destructor removes an unfinished file
    {
      GgufWriter w = fresh(dir);
      w.write(0, 0, data[0]);
      EXPECT_EQ(dir.list(), std::vector<std::string>{"m.gguf.tmp." + std::to_string(::getpid())});
      GgufWriter moved = std::move(w);
    }
    EXPECT_TRUE(dir.list().empty());
  }
}

TEST(Gguf, WriterRefusesBadDeclarations) {
  TempDir dir;
  const auto p = dir / "w.gguf";
  const auto refuse = [&](std::vector<Kv> kvs, std::vector<TensorInfo> ts, std::initializer_list<std::string> parts,
                          std::uint32_t alignment = 32) {
    expect_error([&] { GgufWriter w(p, kvs, ts, alignment); }, parts);
    EXPECT_TRUE(dir.list().empty());
  };
  refuse({kv_u32("a", 1), kv_str("a", "x")}, {}, {"w.gguf", "\"a\" appears twice"});
  refuse({{"a", ValueType::u8, 256}}, {}, {"\"a\"", "256 is not a u8"});
  refuse({{"a", ValueType::i32, "1"}}, {}, {"\"a\"", "not a i32"});
  refuse({kv_array("a", ValueType::array, Json::array())}, {}, {"\"a\"", "arrays of arrays"});
  refuse({kv_array("a", ValueType::string, Json::array({1}))}, {}, {"\"a\"", "not a string"});
  refuse({kv_u32("general.alignment", 64)}, {}, {"general.alignment", "32"});
  refuse({}, {{"t", GgmlType::f32, {1}}, {"t", GgmlType::f32, {1}}}, {"\"t\" appears twice"});
  refuse({}, {{std::string(64, 'n'), GgmlType::f32, {1}}}, {"64 bytes", "at most 63"});
  refuse({}, {{"t", GgmlType::nvfp4, {32}}}, {"\"t\"", "not a multiple of NVFP4's block of 64"});
  refuse({}, {{"t", GgmlType::f32, {1, 1, 1, 1, 1}}}, {"\"t\"", "5 dimensions"});
  refuse({}, {{"t", GgmlType::f32, {1, -1}}}, {"\"t\"", "negative"});
  refuse({}, {{"t", GgmlType::f32, {std::int64_t{1} << 40, std::int64_t{1} << 40}}}, {"\"t\"", "overflow"});
  refuse({}, {}, {"alignment 48 is not a power of two"}, 48);
  // A 63-byte name is the longest ggml accepts.
  GgufWriter ok(p, {}, {{std::string(63, 'n'), GgmlType::f32, {0}}});
  ok.finish();
  EXPECT_EQ(GgufFile::open(p).tensors().at(0).info.name, std::string(63, 'n'));
}

TEST(Gguf, TypeFactsAndSplitPaths) {
  EXPECT_STREQ(name(GgmlType::nvfp4), "NVFP4");
  EXPECT_STREQ(name(GgmlType::q8_0), "Q8_0");
  EXPECT_EQ(block_values(GgmlType::nvfp4), 64);
  EXPECT_EQ(block_bytes(GgmlType::nvfp4), 36);
  EXPECT_EQ(block_bytes(GgmlType::mxfp4), 17);
  EXPECT_EQ(block_bytes(GgmlType::q8_0), 34);
  EXPECT_EQ(block_bytes(GgmlType::bf16), 2);
  EXPECT_EQ(ggml_type_from_id(40), GgmlType::nvfp4);
  EXPECT_EQ(ggml_type_from_id(39), GgmlType::mxfp4);
  EXPECT_EQ(ggml_type_from_id(30), GgmlType::bf16);
  EXPECT_EQ(ggml_type_from_id(2), std::nullopt);
  const std::int64_t ne[] = {128, 3, 2};
  EXPECT_EQ(tensor_bytes(GgmlType::nvfp4, ne, "t"), 2u * 36u * 6u);
  EXPECT_EQ(tensor_bytes(GgmlType::mxfp4, ne, "t"), 4u * 17u * 6u);
  EXPECT_EQ(split_path("/d/model.gguf", 0, 3), fs::path("/d/model-00001-of-00003.gguf"));
  EXPECT_EQ(split_path("out", 11, 12), fs::path("out-00012-of-00012.gguf"));
  expect_error([] { (void)split_path("m.gguf", 3, 3); }, {"m.gguf", "split 3 of 3"});
}

// ---- hostile files ----

// GGUF bytes built by hand, independent of the writer.
class Raw {
 public:
  Raw& magic(const char* m = "GGUF") { return append(m, 4); }
  template <class T>
  Raw& put(T v) {
    return append(&v, sizeof(T));
  }
  Raw& str(std::string_view s) {
    put<std::uint64_t>(s.size());
    return append(s.data(), s.size());
  }
  Raw& header(std::int64_t n_tensors, std::int64_t n_kv, std::uint32_t version = 3) {
    return magic().put(version).put(n_tensors).put(n_kv);
  }
  Raw& kv_u32(std::string_view key, std::uint32_t v) { return str(key).put<std::uint32_t>(4).put(v); }
  Raw& tensor(std::string_view name, std::vector<std::int64_t> ne, std::uint32_t type, std::uint64_t offset) {
    str(name).put(static_cast<std::uint32_t>(ne.size()));
    for (auto n : ne) put(n);
    return put(type).put(offset);
  }
  Raw& pad_to(std::size_t alignment) {
    while (b_.size() % alignment) b_.push_back(std::byte{0});
    return *this;
  }
  Raw& zeros(std::size_t n) {
    b_.resize(b_.size() + n);
    return *this;
  }
  const Bytes& bytes() const { return b_; }

 private:
  Raw& append(const void* p, std::size_t n) {
    const auto* c = static_cast<const std::byte*>(p);
    b_.insert(b_.end(), c, c + n);
    return *this;
  }
  Bytes b_;
};

void expect_refused(const TempDir& dir, const Raw& raw, std::initializer_list<std::string> parts) {
  const auto p = dir / "hostile.gguf";
  write_bytes(p, raw.bytes());
  expect_error([&] { (void)GgufFile::open(p); }, {p.string() + ": "});
  expect_error([&] { (void)GgufFile::open(p); }, parts);
}

TEST(GgufHostile, TruncatedAtEveryByte) {
  TempDir dir;
  const auto path = dir / "valid.gguf";
  // The last tensor ends on the alignment, so every proper prefix cuts something the reader needs.
  const std::vector<TensorInfo> ts = {{"a", GgmlType::f32, {3}}, {"b", GgmlType::nvfp4, {64, 8}}};
  GgufWriter w(path, {kv_str("general.name", "x"), kv_array("k", ValueType::string, Json::array({"ab", "c"}))}, ts);
  const auto data = tensor_data(ts);
  for (std::size_t i = 0; i < ts.size(); ++i) w.write(i, 0, data[i]);
  w.finish();
  const Bytes full = read_bytes(path);
  ASSERT_EQ(full.size() % 32, 0u);
  ASSERT_EQ(GgufFile::open(path).tensors().size(), 2u);
  const auto cut_path = dir / "cut.gguf";
  for (std::size_t n = 0; n < full.size(); ++n) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " bytes");
    write_bytes(cut_path, Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)));
    expect_error([&] { (void)GgufFile::open(cut_path); }, {cut_path.string() + ": "});
  }
}

TEST(GgufHostile, EveryHeaderByteFlipped) {
  // Any single corrupted header byte gives a file that opens or a clean Error naming it.
  TempDir dir;
  const auto path = dir / "valid.gguf";
  const std::vector<TensorInfo> ts = {{"a", GgmlType::f32, {3}}, {"b", GgmlType::mxfp4, {32, 2}}};
  GgufWriter w(path, {kv_array("k", ValueType::string, Json::array({"ab", "c"})), kv_u32("n", 3)}, ts);
  const auto data = tensor_data(ts);
  for (std::size_t i = 0; i < ts.size(); ++i) w.write(i, 0, data[i]);
  w.finish();
  const Bytes full = read_bytes(path);
  const std::size_t header_end = full.size() - 32 - 64;  // less the two tensors' padded data
  const auto bad_path = dir / "flipped.gguf";
  for (std::size_t at = 0; at < header_end; ++at) {
    SCOPED_TRACE("byte " + std::to_string(at));
    Bytes b = full;
    b[at] ^= std::byte{0xFF};
    write_bytes(bad_path, b);
    try {
      (void)GgufFile::open(bad_path);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(bad_path.string() + ": ", 0), 0u) << e.what();
    }
  }
}

TEST(GgufHostile, Header) {
  TempDir dir;
  expect_refused(dir, Raw().magic("GGUD").put<std::uint32_t>(3).zeros(16), {"not a GGUF file"});
  expect_refused(dir, Raw().header(0, 0, 1), {"version 1 is not supported"});
  expect_refused(dir, Raw().header(0, 0, 4), {"version 4"});
  expect_refused(dir, Raw().header(0, 0, 0x03000000), {"big-endian"});
  expect_refused(dir, Raw().header(0, std::int64_t{1} << 62), {"key/value count 4611686018427387904"});
  expect_refused(dir, Raw().header(0, -1), {"key/value count -1"});
  expect_refused(dir, Raw().header(std::int64_t{1} << 40, 0), {"tensor count"});
  // A version-2 file has the same layout and is read.
  const auto p = dir / "v2.gguf";
  write_bytes(p, Raw().header(0, 1, 2).kv_u32("a", 5).bytes());
  EXPECT_EQ(GgufFile::open(p).version(), 2u);
  EXPECT_EQ(GgufFile::open(p).find("a")->value, 5);
}

TEST(GgufHostile, KeysAndValues) {
  TempDir dir;
  expect_refused(dir, Raw().header(0, 1).put<std::uint64_t>(std::uint64_t{1} << 60).zeros(16),
                 {"key/value 0", "truncated"});
  expect_refused(dir, Raw().header(0, 1).str("").put<std::uint32_t>(4).put<std::uint32_t>(1), {"key is empty"});
  expect_refused(dir, Raw().header(0, 1).str("k").put<std::uint32_t>(13).put<std::uint32_t>(1),
                 {"key \"k\"", "unknown value type 13"});
  expect_refused(dir, Raw().header(0, 1).str("k").put<std::uint32_t>(7).put<std::uint8_t>(2), {"\"k\"", "bool"});
  // Array lengths are bounded by the bytes left before anything is reserved.
  expect_refused(dir,
                 Raw().header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(4).put<std::uint64_t>(
                     std::uint64_t{1} << 61),
                 {"\"k\"", "does not fit"});
  expect_refused(dir,
                 Raw().header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(8).put<std::uint64_t>(3).str("a"),
                 {"\"k\"", "does not fit"});
  expect_refused(
      dir,
      Raw().header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(8).put<std::uint64_t>(1).put<std::uint64_t>(
          ~std::uint64_t{0}),
      {"\"k\"", "truncated"});
  expect_refused(
      dir, Raw().header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(9).put<std::uint32_t>(4).zeros(16),
      {"\"k\"", "arrays of arrays"});
  expect_refused(dir, Raw().header(0, 2).kv_u32("k", 1).kv_u32("k", 2), {"\"k\"", "appears twice"});
  expect_refused(dir, Raw().header(0, 1).str("general.alignment").put<std::uint32_t>(10).put<std::uint64_t>(64),
                 {"general.alignment", "not a u32"});
  expect_refused(dir, Raw().header(0, 1).kv_u32("general.alignment", 24), {"general.alignment", "power of two"});
}

TEST(GgufHostile, Tensors) {
  TempDir dir;
  const auto one = [](std::string_view name, std::vector<std::int64_t> ne, std::uint32_t type, std::uint64_t offset,
                      std::size_t data) {
    return Raw().header(1, 0).tensor(name, std::move(ne), type, offset).pad_to(32).zeros(data);
  };
  expect_refused(dir, one("w", {64}, 2, 0, 64), {"tensor \"w\"", "ggml type id 2", "NVFP4"});
  expect_refused(dir, one("w", {64}, 999, 0, 64), {"tensor \"w\"", "ggml type id 999"});
  expect_refused(dir, one("w", {}, 0, 0, 64), {"tensor \"w\"", "0 dimensions"});
  expect_refused(dir, one("w", {1, 1, 1, 1, 1}, 0, 0, 64), {"tensor \"w\"", "5 dimensions"});
  expect_refused(dir, one("w", {4, -2}, 0, 0, 64), {"tensor \"w\"", "ne[1] = -2 is negative"});
  expect_refused(dir, one("w", {32}, 40, 0, 64), {"tensor \"w\"", "not a multiple of NVFP4's block of 64"});
  expect_refused(dir, one("w", {std::int64_t{1} << 62, 1 << 20}, 0, 0, 64), {"tensor \"w\"", "overflows"});
  expect_refused(dir, one("w", {4}, 0, 8, 64), {"tensor \"w\"", "offset 8 is not a multiple of the alignment 32"});
  expect_refused(dir, one("w", {17}, 0, 0, 64), {"tensor \"w\"", "runs past the end"});
  expect_refused(dir, one("w", {4}, 0, std::uint64_t{1} << 63, 64), {"tensor \"w\"", "runs past the end"});
  expect_refused(dir, one(std::string(64, 'n'), {4}, 0, 0, 64), {"at most 63"});
  expect_refused(dir, Raw().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {4}, 0, 32).pad_to(32).zeros(64),
                 {"tensor \"b\"", "overlaps", "tensor \"a\""});
  expect_refused(dir, Raw().header(2, 0).tensor("a", {4}, 0, 0).tensor("a", {4}, 0, 32).pad_to(32).zeros(64),
                 {"tensor \"a\"", "appears twice"});
  // A file that is cut inside the data section, and one whose data section would begin past its end.
  expect_refused(dir, Raw().header(1, 0).tensor("w", {4}, 0, 0), {"data section"});
  // Out-of-order offsets that do not overlap are read (ggml's own reader wants them in order; the
  // writer writes them so).
  const auto p = dir / "swapped.gguf";
  write_bytes(p, Raw().header(2, 0).tensor("a", {4}, 0, 32).tensor("b", {8}, 0, 0).pad_to(32).zeros(64).bytes());
  const GgufFile f = GgufFile::open(p);
  EXPECT_EQ(f.tensor("a")->offset, 32u);
  EXPECT_EQ(f.tensor("b")->data.size(), 32u);
}

// ---- ggml's blocks ----

// ggml's decoding, written from ggml-common.h / ggml-impl.h: doubled E2M1 values, UE4M3 scales
// without the sign bit and with 0x7F read as 0, E8M0 as 2^(e-127); each scale times 0.5.
constexpr int kKvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float ggml_ue4m3_half(std::uint8_t d) {
  if (d == 0 || d == 0x7F) return 0.0f;
  const int exp = (d >> 3) & 0xF, man = d & 7;
  const float raw =
      exp == 0 ? std::ldexp(static_cast<float>(man), -9) : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return raw * 0.5f;
}
// 2^(e-127) * 0.5 as one power of two, as ggml builds it: e = 255 gives 2^127, not infinity.
float ggml_e8m0_half(std::uint8_t e) { return std::ldexp(1.0f, e - 128); }

// One row of ggml blocks to floats.
std::vector<float> ggml_decode_row(Mode mode, const std::uint8_t* q, std::int64_t k) {
  std::vector<float> y(static_cast<std::size_t>(k));
  if (mode == Mode::nvfp4) {
    for (std::int64_t b = 0; b < k / 64; ++b, q += 36)
      for (int s = 0; s < 4; ++s) {
        const float d = ggml_ue4m3_half(q[s]);
        for (int j = 0; j < 8; ++j) {
          const std::uint8_t byte = q[4 + 8 * s + j];
          y[static_cast<std::size_t>(64 * b + 16 * s + j)] = static_cast<float>(kKvalues[byte & 15]) * d;
          y[static_cast<std::size_t>(64 * b + 16 * s + j + 8)] = static_cast<float>(kKvalues[byte >> 4]) * d;
        }
      }
  } else {
    for (std::int64_t b = 0; b < k / 32; ++b, q += 17) {
      const float d = ggml_e8m0_half(q[0]);
      for (int j = 0; j < 16; ++j) {
        y[static_cast<std::size_t>(32 * b + j)] = static_cast<float>(kKvalues[q[1 + j] & 15]) * d;
        y[static_cast<std::size_t>(32 * b + j + 16)] = static_cast<float>(kKvalues[q[1 + j] >> 4]) * d;
      }
    }
  }
  return y;
}

std::span<const std::byte> span_of(const Tensor& t) { return {t.bytes(), t.nbytes()}; }

// Same value, or NaN on both sides (zeros of either sign are equal: ggml's code 8 is +0).
bool same_value(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// ggml's decoding of the blocks made from (packed, scales) against microscale's dequantize.
// Returns the indexes of the scale groups where some value differs.
std::vector<std::int64_t> groups_decoded_differently(Mode mode, const Tensor& packed, const Tensor& scales,
                                                     std::int64_t rows, std::int64_t k) {
  QuantSpec spec;
  spec.mode = mode;
  const QuantSpec resolved = resolve(spec);
  const Tensor ours = dequantize(packed.view(), scales.view(), nullptr, resolved, DType::float32);
  const std::int64_t row_bytes = ggml_row_bytes(mode, k);
  Bytes blocks(static_cast<std::size_t>(rows * row_bytes));
  to_ggml_blocks(mode, rows, k, span_of(packed), span_of(scales), blocks);
  std::vector<std::int64_t> differing;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto theirs = ggml_decode_row(mode, reinterpret_cast<const std::uint8_t*>(blocks.data()) + r * row_bytes, k);
    for (std::int64_t g = 0; g < k / resolved.group_size; ++g)
      for (std::int64_t i = g * resolved.group_size; i < (g + 1) * resolved.group_size; ++i)
        if (!same_value(theirs[static_cast<std::size_t>(i)], ours.data<float>()[r * k + i])) {
          differing.push_back(r * (k / resolved.group_size) + g);
          break;
        }
  }
  return differing;
}

TEST(GgufBlocks, RoundTripIsExact) {
  for (Mode mode : {Mode::nvfp4, Mode::mxfp4}) {
    SCOPED_TRACE(name(mode));
    const std::int64_t rows = 5, k = 192, group = mode == Mode::nvfp4 ? 16 : 32;
    const Bytes codes = pattern(static_cast<std::size_t>(rows * k / 2), 11);
    const Bytes scales = pattern(static_cast<std::size_t>(rows * k / group), 12);
    Bytes blocks(static_cast<std::size_t>(rows * ggml_row_bytes(mode, k)));
    to_ggml_blocks(mode, rows, k, codes, scales, blocks);
    Bytes codes2(codes.size()), scales2(scales.size());
    from_ggml_blocks(mode, rows, k, blocks, codes2, scales2);
    EXPECT_EQ(codes2, codes);
    EXPECT_EQ(scales2, scales);
    // And the other way: every block byte pattern is some compact pair.
    const Bytes any = pattern(blocks.size(), 13);
    from_ggml_blocks(mode, rows, k, any, codes2, scales2);
    Bytes again(any.size());
    to_ggml_blocks(mode, rows, k, codes2, scales2, again);
    EXPECT_EQ(again, any);
  }
}

TEST(GgufBlocks, SizesAreChecked) {
  EXPECT_EQ(ggml_row_bytes(Mode::nvfp4, 128), 72);
  EXPECT_EQ(ggml_row_bytes(Mode::mxfp4, 96), 51);
  expect_error([] { (void)ggml_row_bytes(Mode::nvfp4, 32); }, {"nvfp4", "multiple of 64", "32"});
  expect_error([] { (void)ggml_row_bytes(Mode::mxfp8, 32); }, {"mxfp8"});
  Bytes codes(32), scales(4), out(36);
  expect_error([&] { to_ggml_blocks(Mode::nvfp4, 1, 64, codes, std::span(scales).first(3), out); }, {"scales", "3"});
  expect_error([&] { from_ggml_blocks(Mode::nvfp4, 1, 64, std::span(out).first(35), codes, scales); }, {"blocks"});
  expect_error([&] { to_ggml_blocks(Mode::nvfp4, std::int64_t{1} << 60, 64, codes, scales, out); }, {"overflow"});
}

TEST(GgufBlocks, GgmlDecodesMicroscaleQuantizationAlike) {
  // Rows of very different magnitudes reach subnormal, normal and large E4M3 / E8M0 scales.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const std::int64_t rows = 48, k = 256;
  std::vector<float> x(static_cast<std::size_t>(rows * k));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r) - 30);
    for (std::int64_t i = 0; i < k; ++i) x[static_cast<std::size_t>(r * k + i)] = normal(rng) * magnitude;
  }
  for (Mode mode : {Mode::nvfp4, Mode::mxfp4}) {
    SCOPED_TRACE(name(mode));
    QuantSpec spec;
    spec.mode = mode;
    const Quantized q = quantize(TensorView(x.data(), DType::float32, {rows, k}), spec);
    EXPECT_TRUE(groups_decoded_differently(mode, q.packed, q.scales, rows, k).empty());
    EXPECT_EQ(ggml_scale_differences(mode, span_of(q.scales)).total(), 0);
  }
}

TEST(GgufBlocks, EveryScaleByteAndCode) {
  // One group per scale byte, holding all 16 codes: each value ggml can decode, and
  // ggml_scale_differences flags exactly the scale bytes it decodes differently.
  for (Mode mode : {Mode::nvfp4, Mode::mxfp4}) {
    SCOPED_TRACE(name(mode));
    const std::int64_t group = mode == Mode::nvfp4 ? 16 : 32;
    const std::int64_t k = 64, groups_per_row = k / group, rows = 256 / groups_per_row;
    Tensor packed(DType::uint8, {rows, k / 2}), scales(DType::uint8, {rows, groups_per_row});
    for (std::int64_t g = 0; g < 256; ++g) {
      scales.data<std::uint8_t>()[g] = static_cast<std::uint8_t>(g);
      for (std::int64_t i = 0; i < group; i += 2)  // codes 0..15 (again, for mxfp4's 32)
        packed.data<std::uint8_t>()[g * group / 2 + i / 2] = static_cast<std::uint8_t>((i % 16) | ((i + 1) % 16) << 4);
    }
    const std::vector<std::int64_t> differing = groups_decoded_differently(mode, packed, scales, rows, k);
    for (std::int64_t s = 0; s < 256; ++s) {
      const std::byte b{static_cast<unsigned char>(s)};
      const bool flagged = ggml_scale_differences(mode, std::span(&b, 1)).total() == 1;
      EXPECT_EQ(flagged, std::find(differing.begin(), differing.end(), s) != differing.end()) << "scale byte " << s;
    }
    const ScaleDifferences d = ggml_scale_differences(mode, span_of(scales));
    EXPECT_EQ(d.total(), static_cast<std::int64_t>(differing.size()));
    EXPECT_EQ(d.nan, mode == Mode::nvfp4 ? 2 : 1);
    EXPECT_EQ(d.negative, mode == Mode::nvfp4 ? 126 : 0);
  }
}

}  // namespace
