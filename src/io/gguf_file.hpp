// GGUF (llama.cpp's model file, version 3): typed key/value metadata, tensor infos in ggml
// order, and data aligned to `general.alignment` (32 by default). GgufWriter streams a file whose
// whole layout is known up front; GgufFile maps one for reading. docs/gguf.md has the layout.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/detail.hpp"

namespace microscale::io::gguf {

using detail::Json;

// ggml's tensor types that microscale reads or writes (ids as in ggml.h).
enum class GgmlType : std::uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30, mxfp4 = 39, nvfp4 = 40 };
const char* name(GgmlType t);  // "F32", "NVFP4", ... as gguf-py names them
// Elements per block and bytes per block (1 and the element size for the float types).
std::int64_t block_values(GgmlType t);
std::int64_t block_bytes(GgmlType t);
// A known type id, or nullopt (a reader names the unknown id in its error).
std::optional<GgmlType> ggml_type_from_id(std::uint32_t id);
// Bytes of a tensor of `ne` (ggml order: ne[0] contiguous); throws naming `tensor` when ne[0] is
// not a multiple of the block or the size overflows.
std::uint64_t tensor_bytes(GgmlType t, std::span<const std::int64_t> ne, std::string_view tensor);

// Metadata value types (gguf_type in ggml's gguf.h).
enum class ValueType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12
};

// One key/value: the value is a JSON number, bool, string, or array of those; `type` (and, for
// arrays, `elem`) says how it is stored.
struct Kv {
  std::string key;
  ValueType type = ValueType::u32;
  Json value;
  ValueType elem = ValueType::u8;  // arrays only
};
Kv kv_u32(std::string key, std::uint32_t v);
Kv kv_i32(std::string key, std::int32_t v);
Kv kv_u64(std::string key, std::uint64_t v);
Kv kv_f32(std::string key, float v);
Kv kv_bool(std::string key, bool v);
Kv kv_str(std::string key, std::string v);
Kv kv_array(std::string key, ValueType elem, Json values);  // values: a JSON array

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::f32;
  std::vector<std::int64_t> ne;  // ggml order: ne[0] is the contiguous axis (K of a weight)
};

// Writes `<path>.tmp.<pid>` with the header of `kvs` and `tensors` (data offsets assigned in
// order, each aligned), then accepts data for any tensor at any offset in any order (pwrite), and
// finish() checks that every byte of every tensor arrived exactly once, fsyncs and renames onto
// `path`. An error, or destruction before finish(), removes the temporary file.
// Refuses (Error naming the key or tensor) duplicate keys or tensor names, names longer than
// GGUF's 64 bytes for tensors, and sizes that are not whole blocks.
class GgufWriter {
 public:
  GgufWriter(std::filesystem::path path, std::vector<Kv> kvs, std::vector<TensorInfo> tensors,
             std::uint32_t alignment = 32);
  GgufWriter(GgufWriter&&) noexcept;
  GgufWriter& operator=(GgufWriter&&) noexcept;
  ~GgufWriter();

  // Bytes [offset, offset + bytes.size()) of tensor `index` (into the constructor's list).
  void write(std::size_t index, std::uint64_t offset, std::span<const std::byte> bytes);
  void finish();

  const std::vector<TensorInfo>& tensors() const;
  std::uint64_t tensor_size(std::size_t index) const;
  std::uint64_t file_size() const;  // header + padded data, known from the constructor

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A GGUF file opened read-only (mapped through FileMapping, so truncation under us is an Error).
// Every header field is checked against the file's size before use: counts, string lengths,
// array lengths, dims (1 to 4, none negative), types, offsets (aligned, in range, not overlapping).
// Errors name the file and the key or tensor.
struct GgufTensor {
  TensorInfo info;
  std::uint64_t offset = 0;  // from the start of the data section
  std::span<const std::byte> data;
};
class GgufFile {
 public:
  static GgufFile open(const std::filesystem::path& path);
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::filesystem::path& path() const;
  std::uint32_t version() const;
  const std::vector<Kv>& kvs() const;
  const Kv* find(std::string_view key) const;
  const std::vector<GgufTensor>& tensors() const;
  const GgufTensor* tensor(std::string_view name) const;
  void check_unchanged() const;

 private:
  GgufFile();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// llama.cpp's split files: "<stem>-00001-of-00003.gguf" for split 0 of 3 when `path` names
// "<stem>.gguf".
std::filesystem::path split_path(const std::filesystem::path& path, int index, int count);

}  // namespace microscale::io::gguf
