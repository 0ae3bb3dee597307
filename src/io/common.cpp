// Element types, size arithmetic, strict JSON parsing and header layout shared by reader and writer.
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <sstream>
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

std::string read_text_file(const std::filesystem::path& path, const std::string& expected, std::uintmax_t max_bytes) {
  require_regular_file(path, expected);
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(path.string(), "cannot read: " + ec.message());
  if (size > max_bytes)
    fail(path.string(),
         std::to_string(size) + " bytes exceed the limit of " + std::to_string(max_bytes) + " for " + expected);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (!in || !(text << in.rdbuf())) fail(path.string(), "cannot read " + expected);
  return text.str();
}

std::string quote(std::string_view s) {
  constexpr std::size_t kMax = 120;
  std::string cut(s.substr(0, kMax));
  // The error handler replaces bytes that are not UTF-8 instead of throwing: messages must not fail.
  std::string q = Json(cut).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > kMax) q += "... (" + std::to_string(s.size()) + " bytes)";
  return q;
}

namespace {

// The document parse_json returns, built from nlohmann's SAX events. nlohmann's own DOM parser
// inserts every key into an ordered_json object with a linear search for it, which is quadratic
// in the keys of one object (minutes for a header within kMaxHeaderBytes). Here each open
// object's members are collected in a vector, duplicates refused as they come (nlohmann would keep
// the last one silently), and moved into the object when it closes: linear, in the text's order.
class StrictDocument {
 public:
  StrictDocument(const std::string& source, const char* what, int max_depth)
      : source_(source), what_(what), max_depth_(static_cast<std::size_t>(max_depth)) {}

  Json take() { return std::move(root_); }
  const std::string& error() const { return error_; }

  bool null() { return add(nullptr); }
  bool boolean(bool v) { return add(v); }
  bool number_integer(Json::number_integer_t v) { return add(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return add(v); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return add(v); }
  bool string(Json::string_t& v) { return add(std::move(v)); }
  bool binary(Json::binary_t& v) { return add(std::move(v)); }  // never produced from JSON text
  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_object() {
    Open& o = open_.back();
    auto& object = o.value->get_ref<Json::object_t&>();
    object.reserve(o.members.size());  // its pairs have const keys: growing would copy them
    for (auto& [k, v] : o.members) object.emplace_back(std::move(k), std::move(v));
    open_.pop_back();
    return true;
  }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  bool key(Json::string_t& k) {
    check_depth();
    Open& o = open_.back();
    o.members.emplace_back(std::move(k), nullptr);
    if (!o.last_key_is_new()) fail(source_, what_ + " has duplicate key " + quote(o.members.back().first));
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const Json::exception& e) {
    error_ = e.what();
    return false;
  }

 private:
  using Members = std::vector<std::pair<std::string, Json>>;
  // An open array, or an open object with its members so far. The keys of an object are compared
  // one by one while it has few (most objects: a tensor's dtype, shape and offsets), and through a
  // hash set of their positions beyond that.
  struct Open {
    static constexpr std::size_t kScanned = 8;
    struct KeyHash {
      const Members* members;
      std::size_t operator()(std::size_t i) const { return std::hash<std::string>{}((*members)[i].first); }
    };
    struct KeyEqual {
      const Members* members;
      bool operator()(std::size_t a, std::size_t b) const { return (*members)[a].first == (*members)[b].first; }
    };

    Json* value;
    Members members{};
    std::unordered_set<std::size_t, KeyHash, KeyEqual> positions{};

    bool last_key_is_new() {
      const std::size_t last = members.size() - 1;
      if (members.size() <= kScanned) {
        for (std::size_t i = 0; i < last; ++i)
          if (members[i].first == members[last].first) return false;
        return true;
      }
      if (positions.empty()) {  // the set refers to `members`, which stays where it is (open_ is a deque)
        positions = decltype(positions)(4 * kScanned, KeyHash{&members}, KeyEqual{&members});
        for (std::size_t i = 0; i < last; ++i) positions.insert(i);
      }
      return positions.insert(last).second;
    }
  };

  // Same limit as nlohmann's depth for parse callbacks: the containers open around an event.
  void check_depth() const {
    if (open_.size() > max_depth_)
      fail(source_, what_ + " nests deeper than " + std::to_string(max_depth_) + " levels");
  }
  // Puts `v` where the grammar places the next value: the root, the end of the open array, or the
  // member of the key just read. Only the innermost container grows, so the pointers that open_
  // holds to the outer ones stay valid.
  Json* place(Json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Open& parent = open_.back();
    if (parent.value->is_array()) {
      auto& items = parent.value->get_ref<Json::array_t&>();
      items.push_back(std::move(v));
      return &items.back();
    }
    parent.members.back().second = std::move(v);
    return &parent.members.back().second;
  }
  bool add(Json&& v) {
    check_depth();
    place(std::move(v));
    return true;
  }
  bool open(Json&& container) {
    check_depth();
    open_.push_back({place(std::move(container))});
    return true;
  }

  const std::string& source_;
  const std::string what_;
  const std::size_t max_depth_;
  Json root_;
  std::deque<Open> open_;
  std::string error_;
};

}  // namespace

Json parse_json(std::string_view text, const std::string& source, const char* what, int max_depth) {
  // nlohmann skips a leading UTF-8 byte order mark; JSON texts must not have one (RFC 8259).
  if (text.starts_with("\xEF\xBB\xBF"))
    fail(source, std::string(what) + " is not valid JSON: it starts with a byte order mark");
  // nlohmann also takes a NUL byte as the end of input, so "{}\0garbage" would parse.
  if (auto z = text.find('\0'); z != std::string_view::npos)
    fail(source, std::string(what) + " is not valid JSON: NUL byte at offset " + std::to_string(z));
  StrictDocument doc(source, what, max_depth);
  if (!Json::sax_parse(text.begin(), text.end(), &doc)) {
    // nlohmann's message quotes the offending bytes raw; keep only printable ASCII of it.
    std::string msg = doc.error();
    for (char& c : msg)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7E) c = '?';
    fail(source, std::string(what) + " is not valid JSON: " + msg);
  }
  return doc.take();
}

Json& append_new_key(Json& object, std::string key, Json value) {
  auto& members = object.get_ref<Json::object_t&>();
  members.emplace_back(std::move(key), std::move(value));
  return members.back().second;
}

Json object_with_room(std::size_t n) {
  Json object = Json::object();
  object.get_ref<Json::object_t&>().reserve(n);
  return object;
}

std::string build_header(const std::vector<StEntry>& entries, const Metadata& metadata, const std::string& source,
                         std::vector<std::uint64_t>* sizes) {
  Json h = object_with_room(entries.size() + 1);
  if (!metadata.empty()) {
    Json m = object_with_room(metadata.size());
    for (const auto& [k, v] : metadata) append_new_key(m, k, v);
    append_new_key(h, "__metadata__", std::move(m));
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
    append_new_key(h, e.name,
                   Json{{"dtype", st_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + n}}});
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
