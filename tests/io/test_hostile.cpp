// Hostile and malformed safetensors files: each must fail with an Error that names the file and
// the problem, never crash, through both the memory and the mmap entry points.
#include <time.h>

#include "io_support.hpp"

namespace {

using namespace microscale;
using namespace microscale::io;
using namespace iot;

// Header for one tensor "t".
std::string one(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"t":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
}

Bytes small_valid_file(const TempDir& dir) {
  Bytes a = pattern(12), b = pattern(3);
  save_safetensors(dir / "valid.safetensors", {{"a", StDType::f32, {3}, a}, {"b", StDType::u8, {3}, b}}, {{"k", "v"}});
  return read_bytes(dir / "valid.safetensors");
}

TEST(Hostile, TruncatedAtEveryByte) {
  TempDir dir;
  const Bytes full = small_valid_file(dir);
  ASSERT_NO_THROW((void)SafetensorsFile::open_memory(full.data(), full.size()));
  for (std::size_t n = 0; n < full.size(); ++n) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " bytes");
    Bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    // The exact complaint depends on where the cut falls; every one must be a clean Error.
    expect_error([&] { (void)SafetensorsFile::open_memory(cut.data(), cut.size(), "cut.st"); }, {"cut.st: "});
    write_bytes(dir / "cut.safetensors", cut);
    expect_error([&] { (void)SafetensorsFile::open(dir / "cut.safetensors"); }, {"cut.safetensors: "});
  }
}

TEST(Hostile, EveryByteFlipped) {
  // Any single-byte corruption parses to a valid file or fails cleanly.
  TempDir dir;
  const Bytes full = small_valid_file(dir);
  std::size_t rejected = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    for (unsigned x : {0x01u, 0x20u, 0x80u, 0xFFu}) {
      Bytes m = full;
      m[i] ^= std::byte(x);
      try {
        SafetensorsFile f = SafetensorsFile::open_memory(m.data(), m.size());
        for (const StTensor& t : f.tensors()) {
          ASSERT_GE(t.data.data(), m.data());
          ASSERT_LE(t.data.data() + t.data.size(), m.data() + m.size());
        }
      } catch (const Error&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, full.size());  // most header corruptions are caught
}

TEST(Hostile, HeaderLength) {
  TempDir dir;
  expect_rejected(dir, {}, {"0 bytes, too short"});
  expect_rejected(dir, Bytes(7), {"7 bytes, too short"});
  expect_rejected(dir, le64(kMaxHeaderBytes + 1), {"header length 100000001 exceeds the limit"});
  expect_rejected(dir, le64(~0ull), {"header length 18446744073709551615 exceeds"});
  Bytes b = raw_file("{}");
  b[0] = std::byte(1);  // claims 1 byte: "{"
  expect_rejected(dir, b, {"not valid JSON"});
  b[0] = std::byte(10);
  expect_rejected(dir, b, {"header length 10 runs past the end of the file (10 bytes)"});
  expect_rejected(dir, le64(1000), {"header length 1000 runs past the end"});
  expect_rejected(dir, le64(0), {"not valid JSON"});  // empty header
}

TEST(Hostile, InvalidJson) {
  TempDir dir;
  for (const char* h : {"{", "{\"t\":}", "not json", "{\"a\":1,}", "{} {}", "\xEF\xBB\xBF{}", "{'a':1}"})
    expect_rejected(dir, raw_file(h), {"header is not valid JSON"});
  expect_rejected(dir, raw_file("{\"\xFF\":1}"), {"not valid JSON"});  // not UTF-8
  expect_rejected(dir, raw_file("[]"), {"not an object"});
  expect_rejected(dir, raw_file("\"x\""), {"not an object"});
  expect_rejected(dir, raw_file("null"), {"not an object"});
  std::string deep = std::string(5000, '[') + std::string(5000, ']');
  expect_rejected(dir, raw_file("{\"x\":" + deep + "}"), {"nests deeper than"});
  // Padding is whitespace only; a NUL is not JSON.
  expect_rejected(dir, raw_file(std::string("{}\0\0", 4)), {"not valid JSON", "NUL byte at offset 2"});
  expect_rejected(dir, raw_file(std::string("{}\0{\"a\"", 7)), {"NUL byte"});
  Bytes ok = raw_file("{}      ");
  EXPECT_NO_THROW((void)SafetensorsFile::open_memory(ok.data(), ok.size()));
}

TEST(Hostile, Entries) {
  TempDir dir;
  Bytes d4 = pattern(4);
  expect_rejected(dir, raw_file(R"({"t":[1]})", d4), {"tensor \"t\" is not an object"});
  expect_rejected(dir, raw_file(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", d4), {"\"t\" has no \"dtype\""});
  expect_rejected(dir, raw_file(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", d4), {"has no \"shape\""});
  expect_rejected(dir, raw_file(R"({"t":{"dtype":"F32","shape":[1]}})", d4), {"has no \"data_offsets\""});
  expect_rejected(dir, raw_file(one("F33", "[1]", "[0,4]"), d4), {"unknown dtype \"F33\""});
  expect_rejected(dir, raw_file(one("f32", "[1]", "[0,4]"), d4), {"unknown dtype \"f32\""});
  expect_rejected(dir, raw_file(R"({"t":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", d4),
                  {"dtype is not a string"});
  expect_rejected(dir, raw_file(one("F32", "4", "[0,4]"), d4), {"shape is not an array"});
  expect_rejected(dir, raw_file(one("F32", "[\"4\"]", "[0,4]"), d4), {"dimension \"4\" is not an integer"});
  expect_rejected(dir, raw_file(one("F32", "[1.0]", "[0,4]"), d4), {"dimension 1.0 is not an integer"});
  expect_rejected(dir, raw_file(one("F32", "[1]", "[0]"), d4), {"not a [begin, end] pair"});
  expect_rejected(dir, raw_file(one("F32", "[1]", "[0,4,4]"), d4), {"not a [begin, end] pair"});
  expect_rejected(dir, raw_file(one("F32", "[1]", "{\"a\":0}"), d4), {"not a [begin, end] pair"});
  expect_rejected(dir, raw_file(one("F32", "[1]", "[-4,0]"), d4), {"not integers"});
  expect_rejected(dir, raw_file(one("F32", "[1]", "[0,4.5]"), d4), {"not integers"});
  expect_rejected(dir, raw_file(one("F32", "[1]", "[4,0]"), d4), {"end before they begin"});
  expect_rejected(dir, raw_file(one("F32", "[1]", "[0,8]"), d4), {"run past the data area (4 bytes)"});
  expect_rejected(dir, raw_file(one("F32", "[1]", "[0,18446744073709551615]"), d4), {"not integers"});
}

TEST(Hostile, ShapeTimesDTypeMismatch) {
  TempDir dir;
  Bytes d8 = pattern(8);
  expect_rejected(dir, raw_file(one("F32", "[3]", "[0,8]"), d8),
                  {"tensor \"t\"", "8 bytes in data_offsets but shape (3,) of F32 needs 12"});
  expect_rejected(dir, raw_file(one("F16", "[2]", "[0,8]"), d8), {"F16 needs 4"});
  expect_rejected(dir, raw_file(one("F4", "[3]", "[0,2]"), pattern(2)), {"3 elements of F4", "whole bytes"});
  expect_rejected(dir, raw_file(one("F32", "[]", "[0,8]"), d8), {"shape () of F32 needs 4"});
}

TEST(Hostile, NegativeAndHugeDims) {
  TempDir dir;
  Bytes d8 = pattern(8);
  expect_rejected(dir, raw_file(one("U8", "[-8]", "[0,8]"), d8), {"dimension -8 is not an integer in [0, 2^63)"});
  expect_rejected(dir, raw_file(one("U8", "[9223372036854775808]", "[0,8]"), d8), {"not an integer in [0, 2^63)"});
  expect_rejected(dir, raw_file(one("U8", "[1e30]", "[0,8]"), d8), {"not an integer"});
  expect_rejected(dir, raw_file(one("U8", "[99999999999999999999999]", "[0,8]"), d8), {"not an integer"});
  // Products that wrap 64 bits to the right byte count must still be caught.
  expect_rejected(dir, raw_file(one("U8", "[4294967296,4294967296,8]", "[0,8]"), d8), {"more than 2^63 elements"});
  expect_rejected(dir, raw_file(one("F64", "[2305843009213693952]", "[0,8]"), d8), {"overflows the byte size"});
  expect_rejected(dir, raw_file(one("I16", "[9223372036854775807]", "[0,8]"), d8), {"overflows"});
  // A zero dimension makes any other dimension harmless.
  Bytes ok = raw_file(one("U8", "[9223372036854775807,0]", "[0,0]"));
  EXPECT_EQ(SafetensorsFile::open_memory(ok.data(), ok.size()).tensor("t").data.size(), 0u);
}

TEST(Hostile, OverlapsHolesTrailing) {
  TempDir dir;
  Bytes d8 = pattern(8);
  auto two = [](const std::string& a, const std::string& b) {
    return R"({"a":{"dtype":"U8","shape":[4],"data_offsets":)" + a +
           R"(},"b":{"dtype":"U8","shape":[4],"data_offsets":)" + b + "}}";
  };
  expect_rejected(dir, raw_file(two("[0,4]", "[2,6]"), d8), {"tensor \"b\" at bytes [2, 6) overlaps tensor \"a\""});
  expect_rejected(dir, raw_file(two("[0,4]", "[0,4]"), pattern(4)), {"overlaps"});
  expect_rejected(dir, raw_file(two("[0,4]", "[5,9]"), pattern(9)), {"data bytes [4, 5) before tensor \"b\"", "hole"});
  expect_rejected(dir, raw_file(two("[4,8]", "[8,12]"), pattern(12)), {"data bytes [0, 4)", "hole"});
  expect_rejected(dir, raw_file(two("[0,4]", "[4,8]"), pattern(9)), {"1 trailing bytes after the last tensor"});
  expect_rejected(dir, raw_file("{}", pattern(3)), {"3 trailing bytes"});
  expect_rejected(dir, raw_file(R"({"__metadata__":{}})", pattern(1)), {"1 trailing bytes"});
  // A zero-length tensor inside another one is an overlap too; at a boundary it is fine.
  const std::string z =
      R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"z":{"dtype":"U8","shape":[0],"data_offsets":)";
  expect_rejected(dir, raw_file(z + "[4,4]}}", d8), {"tensor \"z\"", "overlaps tensor \"a\""});
  Bytes ok = raw_file(z + "[8,8]}}", d8);
  EXPECT_EQ(SafetensorsFile::open_memory(ok.data(), ok.size()).names(), (std::vector<std::string>{"a", "z"}));
}

TEST(Hostile, Metadata) {
  TempDir dir;
  expect_rejected(dir, raw_file(R"({"__metadata__":{"a":"x","n":1}})"),
                  {"__metadata__ value of \"n\" is not a string (number)"});
  expect_rejected(dir, raw_file(R"({"__metadata__":{"a":null}})"), {"value of \"a\" is not a string (null)"});
  expect_rejected(dir, raw_file(R"({"__metadata__":{"a":{"b":"c"}}})"), {"not a string (object)"});
  expect_rejected(dir, raw_file(R"({"__metadata__":["a"]})"), {"__metadata__ is not an object"});
  expect_rejected(dir, raw_file(R"({"__metadata__":"a"})"), {"__metadata__ is not an object"});
}

TEST(Hostile, DuplicateNames) {
  TempDir dir;
  Bytes d8 = pattern(8);
  expect_rejected(dir,
                  raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                           d8),
                  {"header has duplicate key \"a\""});
  expect_rejected(dir, raw_file(R"({"__metadata__":{},"__metadata__":{}})"), {"duplicate key \"__metadata__\""});
  expect_rejected(dir, raw_file(R"({"__metadata__":{"k":"1","k":"2"}})"), {"duplicate key \"k\""});
  expect_rejected(dir, raw_file(R"({"a":{"dtype":"U8","dtype":"I8","shape":[8],"data_offsets":[0,8]}})", d8),
                  {"duplicate key \"dtype\""});
  // Names differing only in escapes are the same key after decoding.
  expect_rejected(dir, raw_file(R"({"__metadata__":{"a":"1","\u0061":"2"}})"), {"duplicate key \"a\""});
}

TEST(Hostile, HostileNamesAreQuotedInMessages) {
  TempDir dir;
  std::string name = "evil\\n\\u0000" + std::string(300, 'x');
  Bytes b = raw_file(R"({")" + name + R"(":{"dtype":"BAD","shape":[],"data_offsets":[0,0]}})");
  try {
    (void)SafetensorsFile::open_memory(b.data(), b.size());
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("\"evil\\n\\u0000xxx"), std::string::npos) << msg;
    EXPECT_NE(msg.find("... (306 bytes)"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 300u);
  }
}

// CPU seconds this thread has used: unlike wall time, not inflated by other processes.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Objects of many keys (a header's __metadata__ or tensors, an index's weight_map) are written and
// read in linear time. With keys inserted by a linear search for them, as nlohmann's ordered_json
// does, an object of 100k keys costs 5e9 comparisons of ~75-byte strings: this test took 214 CPU
// seconds that way. Linear, it takes under one (3 under ASan). The bound, 20 CPU seconds, leaves
// room for slow machines and is still missed by the quadratic code ten times over.
TEST(Hostile, ManyKeysAreReadAndWrittenInLinearTime) {
  TempDir dir;
  constexpr std::size_t kKeys = 100000;
  // Long names differing only at their end, as real tensor names often do.
  auto key = [](std::size_t i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%07zu", i);
    return "model.language_model.layers.mlp.experts.gate_up_proj.calibration." + std::string(buf);
  };
  const double t0 = thread_cpu_seconds();
  Metadata md;
  for (std::size_t i = 0; i < kKeys; ++i) md.emplace(key(i), "1");
  save_safetensors(dir / "model.safetensors", {}, md);
  EXPECT_EQ(SafetensorsFile::open(dir / "model.safetensors").metadata(), md);
  // An index listing its tensors backwards: names() keeps that order.
  std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
  for (std::size_t i = kKeys; i-- > 0;) index.append("\"").append(key(i)).append("\": \"model.safetensors\",");
  index.back() = '}';
  index += '}';
  write_bytes(dir / "model.safetensors.index.json", bytes_of(index));
  const Checkpoint ck = Checkpoint::open(dir / "model.safetensors.index.json");
  ASSERT_EQ(ck.names().size(), kKeys);
  EXPECT_EQ(ck.names().front(), key(kKeys - 1));
  EXPECT_EQ(ck.names().back(), key(0));
  const double seconds = thread_cpu_seconds() - t0;
  EXPECT_LT(seconds, 20.0) << "writing and reading " << kKeys << " keys per object took " << seconds
                           << " CPU seconds: quadratic?";
  // A duplicate far from its twin is still found.
  std::string header = R"({"__metadata__":{)";
  for (std::size_t i = 0; i <= kKeys; ++i) header.append("\"").append(key(i == kKeys ? 7 : i)).append("\":\"1\",");
  header.back() = '}';
  header += '}';
  const Bytes b = raw_file(header);
  expect_error([&] { (void)SafetensorsFile::open_memory(b.data(), b.size(), "dup.st"); },
               {"dup.st: header has duplicate key \"" + key(7) + "\""});
}

}  // namespace
