// safetensors reader: one validation path for memory-mapped files and caller buffers.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>

#include "io/detail.hpp"

namespace microscale::io {

using detail::fail;
using detail::Json;
using detail::quote;

// The bytes of an open file: a mapping we own, or caller memory we only borrow.
struct SafetensorsFile::Mapping {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  std::unique_ptr<detail::FileMapping> file;  // null for caller memory
};

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.source_ = path.string();
  if (path.empty()) fail("(empty path)", "no file given; expected a .safetensors file");
  detail::require_regular_file(path, "a .safetensors file");
  auto map = std::make_shared<Mapping>();
  map->file = std::make_unique<detail::FileMapping>(path, f.source_);
  map->data = map->file->data();
  map->size = map->file->size();
  f.map_ = std::move(map);
  f.parse();
  return f;
}

void SafetensorsFile::check_unchanged() const {
  if (map_ && map_->file) map_->file->check_unchanged();
}

SafetensorsFile SafetensorsFile::open_memory(const void* data, std::size_t size, std::string label) {
  SafetensorsFile f;
  f.source_ = std::move(label);
  if (data == nullptr && size != 0) fail(f.source_, "null buffer");
  auto map = std::make_shared<Mapping>();
  map->data = static_cast<const std::byte*>(data);
  map->size = size;
  f.map_ = std::move(map);
  f.parse();
  return f;
}

namespace {

// A JSON number that is a non-negative integer fitting int64 (shape dims and offsets alike:
// nlohmann stores 2^63..2^64-1 as unsigned and larger values as double, so both are refused here).
bool as_index(const Json& v, std::int64_t& out) {
  if (v.is_number_unsigned()) {
    auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return false;
    out = static_cast<std::int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    out = v.get<std::int64_t>();
    return out >= 0;
  }
  return false;
}

}  // namespace

void SafetensorsFile::parse() {
  const std::byte* base = map_->data;
  const std::uint64_t size = map_->size;
  file_bytes_ = size;
  if (size < 8)
    fail(source_, "file is " + std::to_string(size) + " bytes, too short for the 8-byte header length field");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(base[i]);
  if (n > kMaxHeaderBytes)
    fail(source_,
         "header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    fail(source_,
         "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) + " bytes)");
  header_bytes_ = n;
  const std::string_view text(reinterpret_cast<const char*>(base + 8), static_cast<std::size_t>(n));
  // Legitimate headers nest 3 deep (root / tensor / shape); ignored extra keys get some slack.
  Json h = detail::parse_json(text, source_, "header", 16);
  if (!h.is_object()) fail(source_, "header is JSON but not an object");

  const std::uint64_t data_size = size - 8 - n;
  const std::byte* data = base + 8 + n;
  struct Range {
    std::uint64_t begin, end;
    std::size_t idx;
  };
  std::vector<StTensor> tensors;
  std::vector<Range> ranges;
  tensors.reserve(h.size());
  for (auto& [key, val] : h.items()) {
    if (key == "__metadata__") {
      if (val.is_null()) continue;
      if (!val.is_object()) fail(source_, "__metadata__ is not an object");
      for (auto& [mk, mv] : val.items()) {
        if (!mv.is_string())
          fail(source_, "__metadata__ value of " + quote(mk) + " is not a string (" + mv.type_name() + ")");
        metadata_.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    const std::string where = "tensor " + quote(key);
    if (!val.is_object()) fail(source_, where + " is not an object");
    auto dt = val.find("dtype"), sh = val.find("shape"), off = val.find("data_offsets");
    if (dt == val.end()) fail(source_, where + " has no \"dtype\"");
    if (sh == val.end()) fail(source_, where + " has no \"shape\"");
    if (off == val.end()) fail(source_, where + " has no \"data_offsets\"");
    if (!dt->is_string()) fail(source_, where + ": dtype is not a string");
    auto st = st_dtype_from_name(dt->get_ref<const std::string&>());
    if (!st) fail(source_, where + ": unknown dtype " + quote(dt->get_ref<const std::string&>()));
    if (!sh->is_array()) fail(source_, where + ": shape is not an array");
    StTensor t;
    t.name = key;
    t.dtype = *st;
    t.shape.reserve(sh->size());
    for (const Json& d : *sh) {
      std::int64_t v;
      if (!as_index(d, v)) fail(source_, where + ": shape dimension " + d.dump() + " is not an integer in [0, 2^63)");
      t.shape.push_back(v);
    }
    std::uint64_t nbytes;
    try {
      nbytes = st_nbytes(t.dtype, t.shape);
    } catch (const Error& e) {
      fail(source_, where + ": " + e.what());
    }
    if (!off->is_array() || off->size() != 2) fail(source_, where + ": data_offsets is not a [begin, end] pair");
    std::int64_t b, e;
    if (!as_index((*off)[0], b) || !as_index((*off)[1], e))
      fail(source_, where + ": data_offsets " + off->dump() + " are not integers in [0, 2^63)");
    const auto ub = static_cast<std::uint64_t>(b), ue = static_cast<std::uint64_t>(e);
    if (ub > ue) fail(source_, where + ": data_offsets " + off->dump() + " end before they begin");
    if (ue > data_size)
      fail(source_, where + ": data_offsets " + off->dump() + " run past the data area (" + std::to_string(data_size) +
                        " bytes)");
    if (ue - ub != nbytes)
      fail(source_, where + ": " + std::to_string(ue - ub) + " bytes in data_offsets but shape " + shape_str(t.shape) +
                        " of " + st_dtype_name(t.dtype) + " needs " + std::to_string(nbytes));
    t.begin = ub;
    t.data = {data + ub, static_cast<std::size_t>(nbytes)};
    ranges.push_back({ub, ue, tensors.size()});
    tensors.push_back(std::move(t));
  }

  // Ranges must tile [0, data_size): sorted by begin, each starts where the previous ended.
  std::stable_sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t expect = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.begin < expect)
      fail(source_, "tensor " + quote(tensors[r.idx].name) + " at bytes [" + std::to_string(r.begin) + ", " +
                        std::to_string(r.end) + ") overlaps tensor " + quote(tensors[ranges[i - 1].idx].name));
    if (r.begin > expect)
      fail(source_, "data bytes [" + std::to_string(expect) + ", " + std::to_string(r.begin) + ") before tensor " +
                        quote(tensors[r.idx].name) + " belong to no tensor (hole)");
    expect = r.end;
  }
  if (expect != data_size) fail(source_, std::to_string(data_size - expect) + " trailing bytes after the last tensor");

  tensors_.reserve(tensors.size());
  for (const Range& r : ranges) {
    index_.emplace(tensors[r.idx].name, tensors_.size());
    tensors_.push_back(std::move(tensors[r.idx]));
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const StTensor& t : tensors_) out.push_back(t.name);
  return out;
}

const StTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const StTensor& SafetensorsFile::tensor(std::string_view name) const {
  if (const StTensor* t = find(name)) return *t;
  fail(source_, "no tensor named " + quote(name));
}

TensorView StTensor::view() const {
  auto dt = to_dtype(dtype);
  if (!dt)
    throw Error("tensor " + detail::quote(name) + " has dtype " + dtype_name() +
                ", which microscale tensors do not represent");
  const std::size_t align = dtype_size(*dt);
  if (reinterpret_cast<std::uintptr_t>(data.data()) % align != 0)
    throw Error("tensor " + detail::quote(name) + " data is not " + std::to_string(align) +
                "-byte aligned in its file; use copy()");
  return TensorView(data.data(), *dt, shape);
}

Tensor StTensor::copy() const {
  auto dt = to_dtype(dtype);
  if (!dt)
    throw Error("tensor " + detail::quote(name) + " has dtype " + dtype_name() +
                ", which microscale tensors do not represent");
  Tensor t(*dt, shape);
  if (!data.empty()) std::memcpy(t.bytes(), data.data(), data.size());
  return t;
}

}  // namespace microscale::io
