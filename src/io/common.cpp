// Element types, size arithmetic, strict JSON parsing and header layout shared by reader and writer.
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "io/detail.hpp"

namespace microscale::io {

namespace {

struct StInfo {
  StDType type;
  const char* name;
  int bits;
};

// Same order as the enum, so the table doubles as its index.
constexpr std::array<StInfo, kStDTypeCount> kTable{{
    {StDType::boolean, "BOOL", 8},
    {StDType::f4, "F4", 4},
    {StDType::f6_e2m3, "F6_E2M3", 6},
    {StDType::f6_e3m2, "F6_E3M2", 6},
    {StDType::u8, "U8", 8},
    {StDType::i8, "I8", 8},
    {StDType::f8_e5m2, "F8_E5M2", 8},
    {StDType::f8_e4m3, "F8_E4M3", 8},
    {StDType::f8_e8m0, "F8_E8M0", 8},
    {StDType::f8_e4m3fnuz, "F8_E4M3FNUZ", 8},
    {StDType::f8_e5m2fnuz, "F8_E5M2FNUZ", 8},
    {StDType::i16, "I16", 16},
    {StDType::u16, "U16", 16},
    {StDType::f16, "F16", 16},
    {StDType::bf16, "BF16", 16},
    {StDType::i32, "I32", 32},
    {StDType::u32, "U32", 32},
    {StDType::f32, "F32", 32},
    {StDType::c64, "C64", 64},
    {StDType::f64, "F64", 64},
    {StDType::i64, "I64", 64},
    {StDType::u64, "U64", 64},
}};

const StInfo& info(StDType t) {
  auto i = static_cast<std::size_t>(t);
  if (i >= kTable.size()) throw Error("invalid safetensors dtype value " + std::to_string(i));
  return kTable[i];
}

}  // namespace

int st_dtype_bits(StDType t) { return info(t).bits; }
const char* st_dtype_name(StDType t) { return info(t).name; }

std::optional<StDType> st_dtype_from_name(std::string_view name) {
  for (const StInfo& e : kTable)
    if (name == e.name) return e.type;
  return std::nullopt;
}

std::optional<DType> to_dtype(StDType t) {
  switch (t) {
    case StDType::f32: return DType::float32;
    case StDType::f16: return DType::float16;
    case StDType::bf16: return DType::bfloat16;
    case StDType::u8: return DType::uint8;
    case StDType::u32: return DType::uint32;
    case StDType::i32: return DType::int32;
    case StDType::i64: return DType::int64;
    default: return std::nullopt;
  }
}

StDType to_st_dtype(DType t) {
  switch (t) {
    case DType::float32: return StDType::f32;
    case DType::float16: return StDType::f16;
    case DType::bfloat16: return StDType::bf16;
    case DType::uint8: return StDType::u8;
    case DType::uint32: return StDType::u32;
    case DType::int32: return StDType::i32;
    case DType::int64: return StDType::i64;
  }
  throw Error("unknown dtype");
}

std::uint64_t st_nbytes(StDType t, const Shape& shape) {
  // Products are bounded by int64 (our Shape type) and then by bits in u64, so both the element
  // count and the bit count are representable; the check must not itself overflow.
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw Error("negative dimension in shape " + shape_str(shape));
    auto ud = static_cast<std::uint64_t>(d);
    if (ud != 0 && n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / ud)
      throw Error("shape " + shape_str(shape) + " has more than 2^63 elements");
    n *= ud;
  }
  auto bits = static_cast<std::uint64_t>(st_dtype_bits(t));
  if (n > std::numeric_limits<std::uint64_t>::max() / bits)
    throw Error("shape " + shape_str(shape) + " of " + st_dtype_name(t) + " overflows the byte size");
  if ((n * bits) % 8 != 0)
    throw Error(std::to_string(n) + " elements of " + st_dtype_name(t) + " do not fill whole bytes (shape " +
                shape_str(shape) + ")");
  return n * bits / 8;
}

namespace detail {

void fail(const std::string& source, const std::string& what) { throw Error(source + ": " + what); }

void require_regular_file(const std::filesystem::path& path, const std::string& expected) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail(path.string(), std::string("cannot open: ") + std::strerror(errno) + "; expected " + expected);
  if (S_ISREG(st.st_mode)) return;
  const char* what = S_ISDIR(st.st_mode)                          ? "a directory"
                     : S_ISFIFO(st.st_mode)                       ? "a FIFO (named pipe)"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                     : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                  : "not a regular file";
  fail(path.string(), std::string("is ") + what + ", not a regular file; expected " + expected);
}

std::string quote(std::string_view s) {
  constexpr std::size_t kMax = 120;
  std::string cut(s.substr(0, kMax));
  // The error handler replaces bytes that are not UTF-8 instead of throwing: messages must not fail.
  std::string q = Json(cut).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > kMax) q += "... (" + std::to_string(s.size()) + " bytes)";
  return q;
}

Json parse_json(std::string_view text, const std::string& source, const char* what, int max_depth) {
  // nlohmann keeps the last of duplicate keys silently; track the keys of every open object.
  std::vector<std::unordered_set<std::string>> open;
  auto check = [&](int depth, Json::parse_event_t ev, Json& parsed) {
    if (depth > max_depth)
      fail(source, std::string(what) + " nests deeper than " + std::to_string(max_depth) + " levels");
    switch (ev) {
      case Json::parse_event_t::object_start: open.emplace_back(); break;
      case Json::parse_event_t::object_end: open.pop_back(); break;
      case Json::parse_event_t::key:
        if (!open.back().insert(parsed.get<std::string>()).second)
          fail(source, std::string(what) + " has duplicate key " + quote(parsed.get<std::string>()));
        break;
      default: break;
    }
    return true;
  };
  // nlohmann skips a leading UTF-8 byte order mark; JSON texts must not have one (RFC 8259).
  if (text.starts_with("\xEF\xBB\xBF"))
    fail(source, std::string(what) + " is not valid JSON: it starts with a byte order mark");
  // nlohmann also takes a NUL byte as the end of input, so "{}\0garbage" would parse.
  if (auto z = text.find('\0'); z != std::string_view::npos)
    fail(source, std::string(what) + " is not valid JSON: NUL byte at offset " + std::to_string(z));
  try {
    return Json::parse(text.begin(), text.end(), check);
  } catch (const Json::exception& e) {
    // nlohmann's message quotes the offending bytes raw; keep only printable ASCII of it.
    std::string msg = e.what();
    for (char& c : msg)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7E) c = '?';
    fail(source, std::string(what) + " is not valid JSON: " + msg);
  }
}

std::string build_header(const std::vector<StEntry>& entries, const Metadata& metadata, const std::string& source,
                         std::vector<std::uint64_t>* sizes) {
  Json h = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  std::unordered_set<std::string_view> seen;
  std::uint64_t offset = 0;
  if (sizes) sizes->clear();
  for (const StEntry& e : entries) {
    if (e.name == "__metadata__") fail(source, "a tensor cannot be named \"__metadata__\"");
    if (!seen.insert(e.name).second) fail(source, "tensor " + quote(e.name) + " declared twice");
    std::uint64_t n;
    try {
      n = st_nbytes(e.dtype, e.shape);
    } catch (const Error& err) {
      fail(source, "tensor " + quote(e.name) + ": " + err.what());
    }
    if (n > std::numeric_limits<std::uint64_t>::max() - offset) fail(source, "total tensor bytes overflow 64 bits");
    h[e.name] = Json{{"dtype", st_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    if (sizes) sizes->push_back(n);
  }
  // Names and metadata may hold arbitrary bytes; refuse to write a header that is not UTF-8
  // (strict readers, ours included, would reject it).
  std::string text;
  try {
    text = h.dump();
  } catch (const Json::exception& e) {
    fail(source, std::string("a tensor name or metadata string is not valid UTF-8: ") + e.what());
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');
  if (text.size() > kMaxHeaderBytes)
    fail(source,
         "header of " + std::to_string(text.size()) + " bytes exceeds the limit of " + std::to_string(kMaxHeaderBytes));
  return text;
}

}  // namespace detail
}  // namespace microscale::io
