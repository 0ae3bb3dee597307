// safetensors reader and writer on valid files: every dtype, metadata, layout, streaming, views.
#include <sys/resource.h>

#include <csignal>
#include <cstring>

#include "io_support.hpp"

namespace {

using namespace microscale;
using namespace microscale::io;
using namespace iot;

const std::vector<StDType> kAll = [] {
  std::vector<StDType> v;
  for (std::size_t i = 0; i < kStDTypeCount; ++i) v.push_back(static_cast<StDType>(i));
  return v;
}();

TEST(StDType, TableMatchesTheFormat) {
  // Spelling and widths as the safetensors specification defines them.
  const std::vector<std::pair<const char*, int>> expect = {
      {"BOOL", 8},    {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6},     {"U8", 8},          {"I8", 8},
      {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
      {"U16", 16},    {"F16", 16},    {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
      {"C64", 64},    {"F64", 64},    {"I64", 64},    {"U64", 64}};
  ASSERT_EQ(expect.size(), kStDTypeCount);
  for (std::size_t i = 0; i < kAll.size(); ++i) {
    EXPECT_STREQ(st_dtype_name(kAll[i]), expect[i].first);
    EXPECT_EQ(st_dtype_bits(kAll[i]), expect[i].second);
    EXPECT_EQ(st_dtype_from_name(expect[i].first), kAll[i]);
  }
  EXPECT_FALSE(st_dtype_from_name("f32"));
  EXPECT_FALSE(st_dtype_from_name("F8_E4M3FN"));
  EXPECT_FALSE(st_dtype_from_name(""));
}

TEST(StDType, MapsToMicroscaleDTypes) {
  const std::vector<std::pair<StDType, DType>> pairs = {
      {StDType::f32, DType::float32}, {StDType::f16, DType::float16}, {StDType::bf16, DType::bfloat16},
      {StDType::u8, DType::uint8},    {StDType::u32, DType::uint32},  {StDType::i32, DType::int32},
      {StDType::i64, DType::int64}};
  std::size_t mapped = 0;
  for (StDType t : kAll) {
    if (auto d = to_dtype(t)) {
      ++mapped;
      EXPECT_EQ(to_st_dtype(*d), t);
      EXPECT_EQ(dtype_size(*d) * 8, static_cast<std::size_t>(st_dtype_bits(t)));
    }
  }
  EXPECT_EQ(mapped, pairs.size());
  for (auto [s, d] : pairs) EXPECT_EQ(to_dtype(s), d);
}

TEST(StDType, ByteSizes) {
  EXPECT_EQ(st_nbytes(StDType::f32, {2, 3}), 24u);
  EXPECT_EQ(st_nbytes(StDType::f32, {}), 4u);  // scalar
  EXPECT_EQ(st_nbytes(StDType::bf16, {0, 7}), 0u);
  EXPECT_EQ(st_nbytes(StDType::f4, {3, 2}), 3u);
  EXPECT_EQ(st_nbytes(StDType::f6_e2m3, {4}), 3u);
  expect_error([] { (void)st_nbytes(StDType::f4, {3}); }, {"3 elements of F4", "whole bytes"});
  expect_error([] { (void)st_nbytes(StDType::f6_e3m2, {2}); }, {"F6_E3M2"});
  expect_error([] { (void)st_nbytes(StDType::u8, {-1}); }, {"negative"});
  expect_error([] { (void)st_nbytes(StDType::u8, {1ll << 32, 1ll << 32}); }, {"2^63"});
  expect_error([] { (void)st_nbytes(StDType::f64, {1ll << 62}); }, {"overflows"});
  EXPECT_EQ(st_nbytes(StDType::u8, {1ll << 62, 0, 1ll << 62}), 0u);  // zero dim: no overflow
}

// A shape with n elements that is legal for every dtype (F6 needs numel % 4 == 0).
Shape shape_for(int i) { return i % 3 == 0 ? Shape{2, 4} : i % 3 == 1 ? Shape{8} : Shape{2, 2, 2}; }

TEST(Safetensors, RoundTripEveryDType) {
  TempDir dir;
  std::vector<StTensorData> in;
  std::vector<Bytes> data;
  data.reserve(kAll.size());
  for (std::size_t i = 0; i < kAll.size(); ++i) {
    Shape s = shape_for(static_cast<int>(i));
    data.push_back(pattern(st_nbytes(kAll[i], s), static_cast<unsigned>(i)));
    in.push_back({std::string("t.") + st_dtype_name(kAll[i]), kAll[i], s, data.back()});
  }
  const fs::path p = dir / "all.safetensors";
  save_safetensors(p, in);
  SafetensorsFile f = SafetensorsFile::open(p);
  ASSERT_EQ(f.size(), kAll.size());
  for (std::size_t i = 0; i < kAll.size(); ++i) {
    const StTensor& t = f.tensors()[i];  // written order is file order
    EXPECT_EQ(t.name, in[i].name);
    EXPECT_EQ(t.dtype, kAll[i]);
    EXPECT_STREQ(t.dtype_name(), st_dtype_name(kAll[i]));
    EXPECT_EQ(t.shape, in[i].shape);
    EXPECT_EQ(to_bytes(t.data), data[i]) << t.name;
    EXPECT_EQ(&f.tensor(in[i].name), &t);
    EXPECT_EQ(t.microscale_dtype(), to_dtype(kAll[i]));
  }
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.file_bytes(), fs::file_size(p));
  EXPECT_EQ(dir.list(), std::vector<std::string>{"all.safetensors"});  // no temp file left
}

TEST(Safetensors, MetadataPreserved) {
  TempDir dir;
  Metadata md = {
      {"format", "pt"}, {"empty", ""}, {"quote\"s", "line\nbreak \xC3\xA9 \\ tab\t"}, {"json", "{\"a\": [1, 2]}"}};
  Bytes d = pattern(4);
  save_safetensors(dir / "m.safetensors", {{"x", StDType::f32, {1}, d}}, md);
  SafetensorsFile f = SafetensorsFile::open(dir / "m.safetensors");
  EXPECT_EQ(f.metadata(), md);
  // Also when there are no tensors at all.
  save_safetensors(dir / "only.safetensors", {}, md);
  SafetensorsFile g = SafetensorsFile::open(dir / "only.safetensors");
  EXPECT_EQ(g.size(), 0u);
  EXPECT_EQ(g.metadata(), md);
}

TEST(Safetensors, HeaderLayout) {
  TempDir dir;
  Bytes a = pattern(6), b = pattern(16);
  // Declared out of alphabetical order: the file keeps the given order.
  save_safetensors(dir / "l.safetensors", {{"zeta", StDType::u16, {3}, a}, {"alpha", StDType::f64, {2}, b}},
                   {{"k", "v"}});
  Bytes raw = read_bytes(dir / "l.safetensors");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(raw[static_cast<std::size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(raw.size(), 8 + n + 22);
  std::string header(reinterpret_cast<const char*>(raw.data() + 8), n);
  const std::string expect = R"({"__metadata__":{"k":"v"},"zeta":{"dtype":"U16","shape":[3],"data_offsets":[0,6]},)"
                             R"("alpha":{"dtype":"F64","shape":[2],"data_offsets":[6,22]}})";
  EXPECT_EQ(header.substr(0, expect.size()), expect);
  EXPECT_EQ(header.find_first_not_of(' ', expect.size()), std::string::npos);  // space padding
  EXPECT_LT(header.size() - expect.size(), 8u);
  EXPECT_EQ(
      Bytes(raw.begin() + 8 + static_cast<std::ptrdiff_t>(n), raw.begin() + 8 + static_cast<std::ptrdiff_t>(n) + 6), a);
  SafetensorsFile f = SafetensorsFile::open(dir / "l.safetensors");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"zeta", "alpha"}));
  EXPECT_EQ(f.header_bytes(), n);
}

TEST(Safetensors, ReadsHandBuiltFileInOffsetOrder) {
  // Header order differs from data order, header unpadded (length 146, not a multiple of 8), and
  // extra keys in an entry are ignored as by the reference implementation.
  Bytes data = pattern(4 + 8 + 2);
  const std::string h = R"({"b":{"dtype":"I32","shape":[2],"data_offsets":[4,12],"extra":{"x":[1]}},)"
                        R"("e":{"dtype":"BF16","shape":[0,3],"data_offsets":[12,12]},)"
                        R"("a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"__metadata__":null,)"
                        R"("c":{"dtype":"U8","shape":[1,2],"data_offsets":[12,14]}})";
  Bytes raw = raw_file(h, data);
  SafetensorsFile f = SafetensorsFile::open_memory(raw.data(), raw.size(), "hand");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "e", "c"}));
  EXPECT_EQ(f.tensor("b").begin, 4u);
  EXPECT_EQ(to_bytes(f.tensor("b").data), Bytes(data.begin() + 4, data.begin() + 12));
  EXPECT_EQ(f.tensor("e").data.size(), 0u);
  EXPECT_EQ(f.tensor("a").shape, Shape{});
  EXPECT_EQ(f.tensor("a").numel(), 1);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_FALSE(f.contains("d"));
  EXPECT_EQ(f.find("d"), nullptr);
  expect_error([&] { (void)f.tensor("d"); }, {"hand", "no tensor named \"d\""});
  // Same bytes through the mmap path.
  TempDir dir;
  write_bytes(dir / "h.safetensors", raw);
  SafetensorsFile g = SafetensorsFile::open(dir / "h.safetensors");
  EXPECT_EQ(g.names(), f.names());
  EXPECT_EQ(to_bytes(g.tensor("c").data), to_bytes(f.tensor("c").data));
}

TEST(Safetensors, ViewAndCopy) {
  TempDir dir;
  std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};
  Bytes fb(v.size() * 4);
  std::memcpy(fb.data(), v.data(), fb.size());
  Bytes e4 = pattern(6);
  save_safetensors(dir / "v.safetensors", {{"w", StDType::f32, {2, 3}, fb}, {"s", StDType::f8_e4m3, {6}, e4}});
  SafetensorsFile f = SafetensorsFile::open(dir / "v.safetensors");
  TensorView tv = f.tensor("w").view();
  EXPECT_EQ(tv.dtype, DType::float32);
  EXPECT_EQ(tv.shape, (Shape{2, 3}));
  EXPECT_TRUE(tv.is_contiguous());
  EXPECT_EQ(tv.data, f.tensor("w").data.data());  // zero-copy: points into the mapping
  EXPECT_EQ(static_cast<const float*>(tv.data)[2], 3.25f);
  Tensor c = f.tensor("w").copy();
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(c.bytes(), v.data(), fb.size()), 0);
  expect_error([&] { (void)f.tensor("s").view(); }, {"\"s\"", "F8_E4M3"});
  expect_error([&] { (void)f.tensor("s").copy(); }, {"F8_E4M3"});

  // A foreign file whose data area is misaligned for f32: view() refuses, copy() works.
  const std::string h = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + h.size()) % 4, 0u);
  Bytes raw = raw_file(h, Bytes(fb.begin(), fb.begin() + 8));
  Bytes buf(raw.size() + 8);
  std::byte* aligned = buf.data() + (8 - reinterpret_cast<std::uintptr_t>(buf.data()) % 8) % 8;
  std::memcpy(aligned, raw.data(), raw.size());
  SafetensorsFile m = SafetensorsFile::open_memory(aligned, raw.size());
  expect_error([&] { (void)m.tensor("w").view(); }, {"aligned", "copy()"});
  Tensor mc = m.tensor("w").copy();
  EXPECT_EQ(mc.data<float>()[0], 1.5f);
  EXPECT_EQ(mc.data<float>()[1], -2.0f);
}

TEST(Safetensors, MovedFileKeepsDataValid) {
  TempDir dir;
  Bytes d = pattern(32);
  save_safetensors(dir / "mv.safetensors", {{"x", StDType::u8, {32}, d}});
  std::span<const std::byte> span;
  std::vector<SafetensorsFile> v;
  {
    SafetensorsFile f = SafetensorsFile::open(dir / "mv.safetensors");
    span = f.tensor("x").data;
    v.push_back(std::move(f));
  }
  fs::remove(dir / "mv.safetensors");  // the mapping outlives the directory entry
  EXPECT_EQ(to_bytes(span), d);
  EXPECT_EQ(v[0].tensor("x").data.data(), span.data());
}

TEST(SafetensorsWriter, StreamsInChunks) {
  TempDir dir;
  Bytes a = pattern(40, 3), b = pattern(12, 4);
  const fs::path p = dir / "s.safetensors";
  {
    SafetensorsWriter w(p, {{"a", StDType::f32, {10}}, {"empty", StDType::f16, {0}}, {"b", StDType::i8, {3, 4}}},
                        {{"producer", "test"}});
    EXPECT_EQ(w.entries().size(), 3u);
    // While streaming only the temporary file exists.
    EXPECT_EQ(dir.list(), std::vector<std::string>{"s.safetensors.tmp." + std::to_string(::getpid())});
    std::span<const std::byte> as(a);
    w.write("a", as.subspan(0, 7));
    w.write("a", as.subspan(7, 0));
    w.write("a", as.subspan(7));
    w.write("empty", {});
    w.write("b", b);
    w.finish();
    expect_error([&] { w.write("b", {}); }, {"already finished"});
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{"s.safetensors"});
  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(to_bytes(f.tensor("a").data), a);
  EXPECT_EQ(to_bytes(f.tensor("b").data), b);
  EXPECT_EQ(f.tensor("empty").data.size(), 0u);
  EXPECT_EQ(f.metadata().at("producer"), "test");
}

TEST(SafetensorsWriter, WritesTensors) {
  TempDir dir;
  Tensor t(DType::bfloat16, {2, 2});
  for (int i = 0; i < 4; ++i) t.data<std::uint16_t>()[i] = static_cast<std::uint16_t>(0x3F80 + i);
  SafetensorsWriter w(dir / "t.safetensors", {{"t", StDType::bf16, {2, 2}}, {"u", StDType::u8, {4}}});
  w.write_tensor("t", t);
  expect_error([&] { w.write_tensor("u", Tensor(DType::uint8, {2, 2})); }, {"declared U8 (4,)", "given uint8 (2, 2)"});
  EXPECT_TRUE(dir.list().empty());  // misuse abandons the file
}

TEST(SafetensorsWriter, ErrorsLeaveNothingBehind) {
  TempDir dir;
  const fs::path p = dir / "e.safetensors";
  Bytes old = pattern(5);
  write_bytes(p, old);  // an existing target must survive every failure
  Bytes d = pattern(8);
  auto entries = [] { return std::vector<StEntry>{{"a", StDType::u8, {8}}, {"b", StDType::u8, {8}}}; };
  {
    SafetensorsWriter w(p, entries());
    expect_error([&] { w.write("b", d); }, {p.string(), "expected data for tensor \"a\"", "got tensor \"b\""});
    expect_error([&] { w.write("a", d); }, {"failed earlier"});
    expect_error([&] { w.finish(); }, {"failed earlier"});
  }
  {
    SafetensorsWriter w(p, entries());
    Bytes big = pattern(9);
    expect_error([&] { w.write("a", big); }, {"given 9 bytes, 8 remain"});
  }
  {
    SafetensorsWriter w(p, entries());
    w.write("a", std::span<const std::byte>(d).subspan(0, 3));
    expect_error([&] { w.write("b", d); }, {"(3 of 8 bytes written)"});
  }
  {
    SafetensorsWriter w(p, entries());
    w.write("a", d);
    expect_error([&] { w.finish(); }, {"tensor \"b\" incomplete (0 of 8 bytes)"});
  }
  {
    SafetensorsWriter w(p, entries());
    w.write("a", d);
    w.write("b", d);
    expect_error([&] { w.write("c", d); }, {"after all declared tensors"});
  }
  {
    SafetensorsWriter w(p, entries());
    w.write("a", d);  // destroyed unfinished
  }
  EXPECT_EQ(dir.list(), std::vector<std::string>{"e.safetensors"});
  EXPECT_EQ(read_bytes(p), old);

  // Bad declarations fail before any file is created.
  expect_error(
      [&] {
        SafetensorsWriter w(p, {{"a", StDType::u8, {1}}, {"a", StDType::u8, {1}}});
      },
      {"\"a\" declared twice"});
  expect_error([&] { SafetensorsWriter w(p, {{"__metadata__", StDType::u8, {1}}}); }, {"__metadata__"});
  expect_error([&] { SafetensorsWriter w(p, {{"x", StDType::f4, {5}}}); }, {"\"x\"", "whole bytes"});
  expect_error([&] { SafetensorsWriter w(p, {{"x", StDType::u8, {-2}}}); }, {"negative"});
  expect_error([&] { SafetensorsWriter w(p, {{"bad\xFF", StDType::u8, {1}}}); }, {"UTF-8"});
  expect_error([&] { SafetensorsWriter w(p, {}, {{"k", "\xC3"}}); }, {"UTF-8"});
  expect_error([&] { SafetensorsWriter w(dir / "no" / "such" / "dir.safetensors", {}); }, {"temporary file"});
  EXPECT_EQ(dir.list(), std::vector<std::string>{"e.safetensors"});
  EXPECT_EQ(read_bytes(p), old);

  // A successful write replaces the old file.
  save_safetensors(p, {{"a", StDType::u8, {8}, d}});
  EXPECT_EQ(to_bytes(SafetensorsFile::open(p).tensor("a").data), d);
}

TEST(SafetensorsWriter, IoErrorRemovesTemporaryFile) {
  // A file size limit makes write() fail with EFBIG midway (SIGXFSZ ignored meanwhile).
  TempDir dir;
  const fs::path p = dir / "big.safetensors";
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  Bytes d = pattern(8192);
  expect_error([&] { save_safetensors(p, {{"x", StDType::u8, {8192}, d}}); }, {"write failed", "File too large"});
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(dir.list().empty());
}

TEST(SafetensorsWriter, ConcurrentWriterOfSamePathIsRefused) {
  TempDir dir;
  SafetensorsWriter a(dir / "x.safetensors", {});
  expect_error([&] { SafetensorsWriter b(dir / "x.safetensors", {}); }, {".tmp.", "File exists"});
  a.finish();
  EXPECT_EQ(dir.list(), std::vector<std::string>{"x.safetensors"});
}

TEST(Safetensors, OpenErrors) {
  TempDir dir;
  expect_error([&] { (void)SafetensorsFile::open(dir / "missing.safetensors"); },
               {"missing.safetensors", "cannot open"});
  expect_error([&] { (void)SafetensorsFile::open(dir.path()); }, {"not a regular file"});
  write_bytes(dir / "empty.safetensors", {});
  expect_error([&] { (void)SafetensorsFile::open(dir / "empty.safetensors"); }, {"0 bytes, too short"});
}

}  // namespace
