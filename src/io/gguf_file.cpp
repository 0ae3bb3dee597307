// GGUF file writer and reader (docs/gguf.md, "The file and the blocks"). Little-endian only:
// big-endian GGUF files exist but llama.cpp's tools do not write them by default.
#include "io/gguf_file.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "microscale/io.hpp"

namespace microscale::io::gguf {

using detail::fail;
using detail::quote;

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr std::uint32_t kVersion = 3;
constexpr std::uint32_t kDefaultAlignment = 32;
constexpr std::string_view kAlignmentKey = "general.alignment";
constexpr std::size_t kMaxTensorName = 63;  // ggml's GGML_MAX_NAME (64) less the terminating NUL
constexpr std::size_t kMaxDims = 4;
// Smallest encodings, to bound counts by the file size before reserving anything: a kv is a
// key (length + 1 byte), a type and at least one value byte; a tensor info is a name (length +
// 1 byte), n_dims, one ne, the type and the offset.
constexpr std::uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr std::uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;

struct TypeFacts {
  GgmlType type;
  const char* name;
  std::int64_t values;
  std::int64_t bytes;
};
constexpr TypeFacts kTypes[] = {
    {GgmlType::f32, "F32", 1, 4},   {GgmlType::f16, "F16", 1, 2},       {GgmlType::q8_0, "Q8_0", 32, 34},
    {GgmlType::bf16, "BF16", 1, 2}, {GgmlType::mxfp4, "MXFP4", 32, 17}, {GgmlType::nvfp4, "NVFP4", 64, 36},
};

const TypeFacts& facts(GgmlType t) {
  for (const TypeFacts& f : kTypes)
    if (f.type == t) return f;
  throw Error("ggml type id " + std::to_string(static_cast<std::uint32_t>(t)) + " is not one microscale knows");
}

std::string known_types() {
  std::string s;
  for (const TypeFacts& f : kTypes) s += std::string(s.empty() ? "" : ", ") + f.name;
  return s;
}

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::u8: return "u8";
    case ValueType::i8: return "i8";
    case ValueType::u16: return "u16";
    case ValueType::i16: return "i16";
    case ValueType::u32: return "u32";
    case ValueType::i32: return "i32";
    case ValueType::f32: return "f32";
    case ValueType::boolean: return "bool";
    case ValueType::string: return "string";
    case ValueType::array: return "array";
    case ValueType::u64: return "u64";
    case ValueType::i64: return "i64";
    case ValueType::f64: return "f64";
  }
  return "?";
}

bool known_value_type(std::uint32_t id) { return id <= static_cast<std::uint32_t>(ValueType::f64); }

// Bytes of one value of a fixed-size type; 0 for string and array.
std::uint64_t value_size(ValueType t) {
  switch (t) {
    case ValueType::u8:
    case ValueType::i8:
    case ValueType::boolean: return 1;
    case ValueType::u16:
    case ValueType::i16: return 2;
    case ValueType::u32:
    case ValueType::i32:
    case ValueType::f32: return 4;
    case ValueType::u64:
    case ValueType::i64:
    case ValueType::f64: return 8;
    case ValueType::string:
    case ValueType::array: return 0;
  }
  return 0;
}

std::uint64_t align_up(std::uint64_t x, std::uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

bool is_power_of_two(std::uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

std::string tensor_label(const std::string& name) { return "tensor " + quote(name); }
std::string key_label(const std::string& key) { return "key " + quote(key); }

// ---- writing ----

class HeaderOut {
 public:
  template <class T>
  void put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    buf_.append(b, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<std::uint64_t>(s.size());
    buf_.append(s);
  }
  std::string& bytes() { return buf_; }

 private:
  std::string buf_;
};

template <class T>
T integer_value(const Json& v, const std::string& source, const std::string& key, ValueType t) {
  if (v.is_number_unsigned()) {
    const auto x = v.get<std::uint64_t>();
    if (std::in_range<T>(x)) return static_cast<T>(x);
  } else if (v.is_number_integer()) {
    const auto x = v.get<std::int64_t>();
    if (std::in_range<T>(x)) return static_cast<T>(x);
  }
  fail(source, key_label(key) + ": " + v.dump(-1, ' ', false, Json::error_handler_t::replace) + " is not a " +
                   value_type_name(t) + " value");
}

void put_value(HeaderOut& out, ValueType t, const Json& v, const std::string& source, const std::string& key) {
  const auto wrong = [&]() {
    fail(source, key_label(key) + ": " + v.dump(-1, ' ', false, Json::error_handler_t::replace) + " is not a " +
                     value_type_name(t) + " value");
  };
  switch (t) {
    case ValueType::u8: out.put(integer_value<std::uint8_t>(v, source, key, t)); return;
    case ValueType::i8: out.put(integer_value<std::int8_t>(v, source, key, t)); return;
    case ValueType::u16: out.put(integer_value<std::uint16_t>(v, source, key, t)); return;
    case ValueType::i16: out.put(integer_value<std::int16_t>(v, source, key, t)); return;
    case ValueType::u32: out.put(integer_value<std::uint32_t>(v, source, key, t)); return;
    case ValueType::i32: out.put(integer_value<std::int32_t>(v, source, key, t)); return;
    case ValueType::u64: out.put(integer_value<std::uint64_t>(v, source, key, t)); return;
    case ValueType::i64: out.put(integer_value<std::int64_t>(v, source, key, t)); return;
    case ValueType::f32:
      if (!v.is_number()) wrong();
      out.put(static_cast<float>(v.get<double>()));
      return;
    case ValueType::f64:
      if (!v.is_number()) wrong();
      out.put(v.get<double>());
      return;
    case ValueType::boolean:
      if (!v.is_boolean()) wrong();
      out.put<std::uint8_t>(v.get<bool>() ? 1 : 0);
      return;
    case ValueType::string:
      if (!v.is_string()) wrong();
      out.put_string(v.get_ref<const std::string&>());
      return;
    case ValueType::array: break;
  }
  wrong();
}

void put_kv(HeaderOut& out, const Kv& kv, const std::string& source) {
  out.put_string(kv.key);
  out.put(static_cast<std::uint32_t>(kv.type));
  if (kv.type != ValueType::array) {
    put_value(out, kv.type, kv.value, source, kv.key);
    return;
  }
  if (kv.elem == ValueType::array) fail(source, key_label(kv.key) + ": arrays of arrays are not supported");
  if (!kv.value.is_array()) fail(source, key_label(kv.key) + ": an array value must be a JSON array");
  out.put(static_cast<std::uint32_t>(kv.elem));
  out.put<std::uint64_t>(kv.value.size());
  for (const Json& v : kv.value) put_value(out, kv.elem, v, source, kv.key);
}

// ---- reading ----

// Reads a mapped header front to back; every read is checked against the file's size, and
// errors name the file and what was being read (`context`).
class HeaderIn {
 public:
  HeaderIn(const std::byte* data, std::uint64_t size, std::string source)
      : data_(data), size_(size), source_(std::move(source)) {}

  std::string context = "header";

  [[noreturn]] void fail_here(const std::string& what) const { fail(source_, context + ": " + what); }

  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return size_ - pos_; }

  void need(std::uint64_t n) const {
    if (n > left())
      fail_here("the file ends at byte " + std::to_string(size_) + ", " + std::to_string(n) +
                " bytes are needed at offset " + std::to_string(pos_) + " (truncated or not a GGUF file)");
  }

  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string get_string() {
    const auto n = get<std::uint64_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<std::size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const std::byte* data_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
  std::string source_;
};

Json get_value(HeaderIn& in, ValueType t) {
  switch (t) {
    case ValueType::u8: return static_cast<unsigned>(in.get<std::uint8_t>());
    case ValueType::i8: return static_cast<int>(in.get<std::int8_t>());
    case ValueType::u16: return static_cast<unsigned>(in.get<std::uint16_t>());
    case ValueType::i16: return static_cast<int>(in.get<std::int16_t>());
    case ValueType::u32: return in.get<std::uint32_t>();
    case ValueType::i32: return in.get<std::int32_t>();
    case ValueType::u64: return in.get<std::uint64_t>();
    case ValueType::i64: return in.get<std::int64_t>();
    case ValueType::f32: return static_cast<double>(in.get<float>());
    case ValueType::f64: return in.get<double>();
    case ValueType::boolean: {
      const auto b = in.get<std::uint8_t>();
      if (b > 1) in.fail_here("bool value " + std::to_string(b) + " is neither 0 nor 1");
      return b == 1;
    }
    case ValueType::string: return in.get_string();
    case ValueType::array: break;
  }
  in.fail_here("arrays of arrays are not supported");
}

ValueType get_value_type(HeaderIn& in) {
  const auto id = in.get<std::uint32_t>();
  if (!known_value_type(id)) in.fail_here("unknown value type " + std::to_string(id));
  return static_cast<ValueType>(id);
}

Kv get_kv(HeaderIn& in) {
  Kv kv;
  kv.key = in.get_string();
  if (kv.key.empty()) in.fail_here("the key is empty");
  in.context = key_label(kv.key);
  kv.type = get_value_type(in);
  if (kv.type != ValueType::array) {
    kv.value = get_value(in, kv.type);
    return kv;
  }
  kv.elem = get_value_type(in);
  if (kv.elem == ValueType::array) in.fail_here("arrays of arrays are not supported");
  const auto n = in.get<std::uint64_t>();
  // Each element takes at least its fixed size, or a string's 8-byte length.
  const std::uint64_t min_bytes = kv.elem == ValueType::string ? 8 : value_size(kv.elem);
  if (n > in.left() / min_bytes)
    in.fail_here("array of " + std::to_string(n) + " " + value_type_name(kv.elem) + " values does not fit in the " +
                 std::to_string(in.left()) + " bytes left in the file");
  kv.value = Json::array();
  kv.value.get_ref<Json::array_t&>().reserve(static_cast<std::size_t>(n));
  for (std::uint64_t i = 0; i < n; ++i) kv.value.push_back(get_value(in, kv.elem));
  return kv;
}

}  // namespace

const char* name(GgmlType t) { return facts(t).name; }
std::int64_t block_values(GgmlType t) { return facts(t).values; }
std::int64_t block_bytes(GgmlType t) { return facts(t).bytes; }

std::optional<GgmlType> ggml_type_from_id(std::uint32_t id) {
  for (const TypeFacts& f : kTypes)
    if (static_cast<std::uint32_t>(f.type) == id) return f.type;
  return std::nullopt;
}

std::uint64_t tensor_bytes(GgmlType t, std::span<const std::int64_t> ne, std::string_view tensor) {
  const TypeFacts& f = facts(t);
  const auto bad = [&](const std::string& what) -> std::uint64_t {
    throw Error(tensor_label(std::string(tensor)) + ": " + what);
  };
  if (ne.empty()) return bad("has no dimensions");
  std::uint64_t count = 1;
  for (std::size_t i = 0; i < ne.size(); ++i) {
    if (ne[i] < 0) return bad("ne[" + std::to_string(i) + "] = " + std::to_string(ne[i]) + " is negative");
    // Counts stay below 2^63, as ggml's int64 element counts do.
    if (ne[i] != 0 && count > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) /
                                  static_cast<std::uint64_t>(ne[i]))
      return bad("the element count overflows");
    count *= static_cast<std::uint64_t>(ne[i]);
  }
  if (ne[0] % f.values != 0)
    return bad("ne[0] = " + std::to_string(ne[0]) + " is not a multiple of " + f.name + "'s block of " +
               std::to_string(f.values) + " values");
  const std::uint64_t blocks = count / static_cast<std::uint64_t>(f.values);
  if (blocks > std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(f.bytes))
    return bad("the byte size overflows");
  return blocks * static_cast<std::uint64_t>(f.bytes);
}

Kv kv_u32(std::string key, std::uint32_t v) { return {std::move(key), ValueType::u32, v}; }
Kv kv_i32(std::string key, std::int32_t v) { return {std::move(key), ValueType::i32, v}; }
Kv kv_u64(std::string key, std::uint64_t v) { return {std::move(key), ValueType::u64, v}; }
Kv kv_f32(std::string key, float v) { return {std::move(key), ValueType::f32, static_cast<double>(v)}; }
Kv kv_bool(std::string key, bool v) { return {std::move(key), ValueType::boolean, v}; }
Kv kv_str(std::string key, std::string v) { return {std::move(key), ValueType::string, std::move(v)}; }
Kv kv_array(std::string key, ValueType elem, Json values) {
  return {std::move(key), ValueType::array, std::move(values), elem};
}

// ---- GgufWriter ----

struct GgufWriter::Impl {
  std::filesystem::path path;
  std::vector<TensorInfo> tensors;
  std::vector<std::uint64_t> sizes;
  std::vector<std::uint64_t> offsets;  // from the start of the data section
  std::uint64_t data_start = 0;
  std::uint64_t file_size = 0;
  std::uint32_t alignment = kDefaultAlignment;
  std::unique_ptr<detail::AtomicFile> file;  // null once finished or failed
  // Per tensor, the byte ranges written so far as start -> end, adjacent ranges merged: a whole
  // tensor ends as the single range {0, size}.
  std::vector<std::map<std::uint64_t, std::uint64_t>> written;
  std::mutex mutex;  // writes may come from several threads

  [[noreturn]] void abort_with(const std::string& what) {
    file.reset();
    fail(path.string(), what);
  }
};

GgufWriter::GgufWriter(std::filesystem::path path, std::vector<Kv> kvs, std::vector<TensorInfo> tensors,
                       std::uint32_t alignment)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = std::move(path);
  const std::string source = m.path.string();
  if (!is_power_of_two(alignment)) fail(source, "alignment " + std::to_string(alignment) + " is not a power of two");
  m.alignment = alignment;

  // llama.cpp writes general.alignment only when it is not the default; a caller's own entry
  // must agree with `alignment`.
  bool has_alignment_kv = false;
  std::unordered_set<std::string> keys;
  for (const Kv& kv : kvs) {
    if (kv.key.empty()) fail(source, "a metadata key is empty");
    if (!keys.insert(kv.key).second) fail(source, key_label(kv.key) + " appears twice");
    if (kv.key == kAlignmentKey) {
      if (kv.type != ValueType::u32 || kv.value != Json(alignment))
        fail(source, key_label(kv.key) + " must be the u32 " + std::to_string(alignment) + " the file is written with");
      has_alignment_kv = true;
    }
  }
  if (!has_alignment_kv && alignment != kDefaultAlignment) kvs.push_back(kv_u32(std::string(kAlignmentKey), alignment));

  std::unordered_set<std::string> names;
  std::uint64_t data_size = 0;
  for (const TensorInfo& t : tensors) {
    if (t.name.size() > kMaxTensorName)
      fail(source, tensor_label(t.name) + ": the name has " + std::to_string(t.name.size()) +
                       " bytes, GGUF allows at most " + std::to_string(kMaxTensorName));
    if (!names.insert(t.name).second) fail(source, tensor_label(t.name) + " appears twice");
    if (t.ne.empty() || t.ne.size() > kMaxDims)
      fail(source, tensor_label(t.name) + ": " + std::to_string(t.ne.size()) + " dimensions, GGUF allows 1 to 4");
    std::uint64_t bytes = 0;
    try {
      bytes = tensor_bytes(t.type, t.ne, t.name);
    } catch (const Error& e) {
      fail(source, e.what());
    }
    if (bytes > std::numeric_limits<std::uint64_t>::max() / 2 - data_size)
      fail(source, tensor_label(t.name) + ": the file would exceed 2^63 bytes");
    m.offsets.push_back(data_size);
    m.sizes.push_back(bytes);
    data_size += align_up(bytes, alignment);
  }

  HeaderOut out;
  out.bytes().append(kMagic, sizeof(kMagic));
  out.put(kVersion);
  out.put<std::int64_t>(static_cast<std::int64_t>(tensors.size()));
  out.put<std::int64_t>(static_cast<std::int64_t>(kvs.size()));
  for (const Kv& kv : kvs) put_kv(out, kv, source);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    out.put_string(t.name);
    out.put(static_cast<std::uint32_t>(t.ne.size()));
    for (std::int64_t n : t.ne) out.put(n);
    out.put(static_cast<std::uint32_t>(t.type));
    out.put(m.offsets[i]);
  }
  // ggml aligns the data section only when there are tensors.
  m.data_start = tensors.empty() ? out.bytes().size() : align_up(out.bytes().size(), alignment);
  out.bytes().resize(static_cast<std::size_t>(m.data_start), '\0');
  m.file_size = m.data_start + data_size;
  m.tensors = std::move(tensors);
  m.written.resize(m.tensors.size());

  m.file = std::make_unique<detail::AtomicFile>(m.path);
  m.file->write(out.bytes());
}

GgufWriter::GgufWriter(GgufWriter&&) noexcept = default;
GgufWriter& GgufWriter::operator=(GgufWriter&&) noexcept = default;
GgufWriter::~GgufWriter() = default;

void GgufWriter::write(std::size_t index, std::uint64_t offset, std::span<const std::byte> bytes) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  if (!m.file) fail(m.path.string(), "write after finish() or an error");
  if (index >= m.tensors.size())
    m.abort_with("tensor index " + std::to_string(index) + " is out of range (" + std::to_string(m.tensors.size()) +
                 " tensors)");
  const std::string& tname = m.tensors[index].name;
  const std::uint64_t size = m.sizes[index];
  if (offset > size || bytes.size() > size - offset)
    m.abort_with(tensor_label(tname) + ": bytes [" + std::to_string(offset) + ", " +
                 std::to_string(offset + bytes.size()) + ") lie outside its " + std::to_string(size) + " bytes");
  if (bytes.empty()) return;
  const std::uint64_t end = offset + bytes.size();
  auto& ranges = m.written[index];
  auto next = ranges.upper_bound(offset);
  auto prev = next == ranges.begin() ? ranges.end() : std::prev(next);
  if ((prev != ranges.end() && prev->second > offset) || (next != ranges.end() && next->first < end))
    m.abort_with(tensor_label(tname) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(end) +
                 ") overlap bytes written before");
  m.file->write_at(m.data_start + m.offsets[index] + offset, bytes);
  std::uint64_t start = offset, stop = end;
  if (prev != ranges.end() && prev->second == offset) {
    start = prev->first;
    ranges.erase(prev);
  }
  if (next != ranges.end() && next->first == end) {
    stop = next->second;
    ranges.erase(next);
  }
  ranges.emplace(start, stop);
}

void GgufWriter::finish() {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  if (!m.file) fail(m.path.string(), "finish() after finish() or an error");
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    const auto& ranges = m.written[i];
    const std::uint64_t size = m.sizes[i];
    if (size == 0) continue;
    if (ranges.size() != 1 || ranges.begin()->first != 0 || ranges.begin()->second != size) {
      std::uint64_t got = 0;
      for (const auto& [s, e] : ranges) got += e - s;
      m.abort_with(tensor_label(m.tensors[i].name) + ": " + std::to_string(got) + " of its " + std::to_string(size) +
                   " bytes were written");
    }
  }
  // Zero padding after each tensor, so the file ends where ggml expects it.
  const std::vector<std::byte> zeros(std::min<std::size_t>(m.alignment, std::size_t{1} << 16));
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    std::uint64_t at = m.data_start + m.offsets[i] + m.sizes[i];
    std::uint64_t pad = align_up(m.sizes[i], m.alignment) - m.sizes[i];
    while (pad > 0) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(pad, zeros.size()));
      m.file->write_at(at, std::span(zeros).first(n));
      at += n;
      pad -= n;
    }
  }
  m.file->commit();
  m.file.reset();
}

const std::vector<TensorInfo>& GgufWriter::tensors() const { return impl_->tensors; }
std::uint64_t GgufWriter::tensor_size(std::size_t index) const {
  if (index >= impl_->sizes.size())
    fail(impl_->path.string(), "tensor index " + std::to_string(index) + " is out of range (" +
                                   std::to_string(impl_->sizes.size()) + " tensors)");
  return impl_->sizes[index];
}
std::uint64_t GgufWriter::file_size() const { return impl_->file_size; }

// ---- GgufFile ----

struct GgufFile::Impl {
  std::filesystem::path path;
  std::unique_ptr<detail::FileMapping> mapping;
  std::uint32_t version = 0;
  std::vector<Kv> kvs;
  std::vector<GgufTensor> tensors;
  std::unordered_map<std::string, std::size_t> kv_index, tensor_index;
};

GgufFile::GgufFile() : impl_(std::make_unique<Impl>()) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile f;
  Impl& m = *f.impl_;
  m.path = path;
  const std::string source = path.string();
  detail::require_regular_file(path, "a .gguf file");
  m.mapping = std::make_unique<detail::FileMapping>(path, source);
  const std::byte* data = m.mapping->data();
  const std::uint64_t size = m.mapping->size();
  HeaderIn in(data, size, source);

  if (size < sizeof(kMagic) || std::memcmp(data, kMagic, sizeof(kMagic)) != 0)
    fail(source, "not a GGUF file (it does not start with \"GGUF\")");
  in.get<std::uint32_t>();
  m.version = in.get<std::uint32_t>();
  if (m.version == 0x02000000u || m.version == 0x03000000u)
    fail(source, "a big-endian GGUF file; microscale reads little-endian ones");
  if (m.version != 2 && m.version != 3)
    fail(source, "GGUF version " + std::to_string(m.version) + " is not supported (versions 2 and 3 are)");
  const auto n_tensors = in.get<std::int64_t>();
  const auto n_kv = in.get<std::int64_t>();
  if (n_kv < 0 || static_cast<std::uint64_t>(n_kv) > in.left() / kMinKvBytes)
    fail(source, "header: the key/value count " + std::to_string(n_kv) + " is impossible in a file of " +
                     std::to_string(size) + " bytes");
  if (n_tensors < 0 || static_cast<std::uint64_t>(n_tensors) > in.left() / kMinTensorInfoBytes)
    fail(source, "header: the tensor count " + std::to_string(n_tensors) + " is impossible in a file of " +
                     std::to_string(size) + " bytes");

  m.kvs.reserve(static_cast<std::size_t>(n_kv));
  for (std::int64_t i = 0; i < n_kv; ++i) {
    in.context = "key/value " + std::to_string(i);
    Kv kv = get_kv(in);
    if (!m.kv_index.emplace(kv.key, m.kvs.size()).second) in.fail_here("the key appears twice");
    m.kvs.push_back(std::move(kv));
  }

  std::uint64_t alignment = kDefaultAlignment;
  if (const Kv* a = f.find(kAlignmentKey)) {
    if (a->type != ValueType::u32)
      fail(source, key_label(a->key) + " is a " + value_type_name(a->type) + ", not a u32");
    alignment = a->value.get<std::uint32_t>();
    if (!is_power_of_two(alignment))
      fail(source, key_label(a->key) + ": " + std::to_string(alignment) + " is not a power of two");
  }

  m.tensors.reserve(static_cast<std::size_t>(n_tensors));
  for (std::int64_t i = 0; i < n_tensors; ++i) {
    in.context = "tensor " + std::to_string(i);
    GgufTensor t;
    t.info.name = in.get_string();
    in.context = tensor_label(t.info.name);
    if (t.info.name.size() > kMaxTensorName)
      in.fail_here("the name has " + std::to_string(t.info.name.size()) + " bytes, GGUF allows at most " +
                   std::to_string(kMaxTensorName));
    if (!m.tensor_index.emplace(t.info.name, m.tensors.size()).second) in.fail_here("the name appears twice");
    const auto n_dims = in.get<std::uint32_t>();
    if (n_dims < 1 || n_dims > kMaxDims)
      in.fail_here(std::to_string(n_dims) + " dimensions, GGUF allows 1 to " + std::to_string(kMaxDims));
    for (std::uint32_t d = 0; d < n_dims; ++d) t.info.ne.push_back(in.get<std::int64_t>());
    const auto type_id = in.get<std::uint32_t>();
    const std::optional<GgmlType> type = ggml_type_from_id(type_id);
    if (!type)
      in.fail_here("ggml type id " + std::to_string(type_id) + " is not one microscale reads (" + known_types() + ")");
    t.info.type = *type;
    t.offset = in.get<std::uint64_t>();
    m.tensors.push_back(std::move(t));
  }

  const std::uint64_t data_start = n_tensors == 0 ? in.pos() : align_up(in.pos(), alignment);
  if (data_start > size)
    fail(source, "the data section would start at byte " + std::to_string(data_start) + ", past the end of the file (" +
                     std::to_string(size) + " bytes)");
  const std::uint64_t data_size = size - data_start;
  std::vector<std::uint64_t> sizes;
  for (GgufTensor& t : m.tensors) {
    std::uint64_t bytes = 0;
    try {
      bytes = tensor_bytes(t.info.type, t.info.ne, t.info.name);
    } catch (const Error& e) {
      fail(source, e.what());
    }
    if (t.offset % alignment != 0)
      fail(source, tensor_label(t.info.name) + ": data offset " + std::to_string(t.offset) +
                       " is not a multiple of the alignment " + std::to_string(alignment));
    if (t.offset > data_size || bytes > data_size - t.offset)
      fail(source, tensor_label(t.info.name) + ": data [" + std::to_string(t.offset) + ", +" + std::to_string(bytes) +
                       ") runs past the end of the file (the data section has " + std::to_string(data_size) +
                       " bytes)");
    t.data = std::span(data + data_start + t.offset, static_cast<std::size_t>(bytes));
    sizes.push_back(bytes);
  }
  std::vector<std::size_t> order(m.tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return m.tensors[a].offset < m.tensors[b].offset; });
  // Empty tensors occupy nothing; among the others each must end before the next begins.
  const GgufTensor* last = nullptr;
  std::uint64_t last_end = 0;
  for (std::size_t i : order) {
    if (sizes[i] == 0) continue;
    const GgufTensor& t = m.tensors[i];
    if (last && t.offset < last_end)
      fail(source, tensor_label(t.info.name) + ": its data overlaps that of " + tensor_label(last->info.name));
    last = &t;
    last_end = t.offset + sizes[i];
  }
  // The header was read from the mapping: a file cut meanwhile read as zeros there.
  m.mapping->check_unchanged();
  return f;
}

const std::filesystem::path& GgufFile::path() const { return impl_->path; }
std::uint32_t GgufFile::version() const { return impl_->version; }
const std::vector<Kv>& GgufFile::kvs() const { return impl_->kvs; }
const Kv* GgufFile::find(std::string_view key) const {
  auto it = impl_->kv_index.find(std::string(key));
  return it == impl_->kv_index.end() ? nullptr : &impl_->kvs[it->second];
}
const std::vector<GgufTensor>& GgufFile::tensors() const { return impl_->tensors; }
const GgufTensor* GgufFile::tensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(std::string(name));
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}
void GgufFile::check_unchanged() const { impl_->mapping->check_unchanged(); }

std::filesystem::path split_path(const std::filesystem::path& path, int index, int count) {
  if (count < 1 || count > 99999 || index < 0 || index >= count)
    fail(path.string(), "split " + std::to_string(index) + " of " + std::to_string(count) + " is out of range");
  const std::string stem = path.extension() == ".gguf" ? path.stem().string() : path.filename().string();
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "-%05d-of-%05d.gguf", index + 1, count);
  return path.parent_path() / (stem + suffix);
}

}  // namespace microscale::io::gguf
