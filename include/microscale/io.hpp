// Checkpoint I/O: safetensors files (memory-mapped reader, streaming atomic writer) and sharded
// checkpoints described by a `model.safetensors.index.json`.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// and a data area whose byte ranges [b, e) the tensors tile exactly. The reader validates all of
// it strictly (see SafetensorsFile::open) and throws microscale::Error naming the file and the
// problem; nothing it returns can point outside the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "microscale/dtype.hpp"
#include "microscale/tensor.hpp"

namespace microscale::io {

// Every element type the safetensors format defines (safetensors 0.8), with the file's spelling
// given by st_dtype_name. Kept apart from microscale::DType, which only lists what the kernels take.
enum class StDType : std::uint8_t {
  boolean,      // BOOL, one byte
  f4,           // F4: E2M1, two per byte (shape counts 4-bit elements)
  f6_e2m3,      // F6_E2M3, 6 bits
  f6_e3m2,      // F6_E3M2, 6 bits
  u8,           // U8
  i8,           // I8
  f8_e5m2,      // F8_E5M2
  f8_e4m3,      // F8_E4M3 (OCP "fn")
  f8_e8m0,      // F8_E8M0
  f8_e4m3fnuz,  // F8_E4M3FNUZ
  f8_e5m2fnuz,  // F8_E5M2FNUZ
  i16,          // I16
  u16,          // U16
  f16,          // F16
  bf16,         // BF16
  i32,          // I32
  u32,          // U32
  f32,          // F32
  c64,          // C64: two f32
  f64,          // F64
  i64,          // I64
  u64,          // U64
};

inline constexpr std::size_t kStDTypeCount = 22;

int st_dtype_bits(StDType t);          // element size in bits: 4, 6, 8, 16, 32 or 64
const char* st_dtype_name(StDType t);  // "F32", "BF16", "F8_E4M3", ...
std::optional<StDType> st_dtype_from_name(std::string_view name);
// F32, F16, BF16, U8, U32, I32, I64 have a microscale::DType; the others do not.
std::optional<DType> to_dtype(StDType t);
StDType to_st_dtype(DType t);
// Bytes of a tensor: numel * bits / 8. Throws Error on a negative dimension, on overflow of 64-bit
// arithmetic, or when sub-byte elements do not fill whole bytes (e.g. an odd number of F4).
std::uint64_t st_nbytes(StDType t, const Shape& shape);

// Free-form string annotations stored under "__metadata__".
using Metadata = std::map<std::string, std::string>;

// The safetensors reference limit on the JSON header; larger headers are rejected on read and write.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

// One tensor of an open file. `data` points into the file's mapping (or the caller's buffer for
// open_memory) and stays valid as long as the SafetensorsFile, or any moved-to copy, lives.
struct StTensor {
  std::string name;
  StDType dtype = StDType::u8;
  Shape shape;
  std::span<const std::byte> data;
  std::uint64_t begin = 0;  // data_offsets as in the header, relative to the data area

  const char* dtype_name() const { return st_dtype_name(dtype); }
  std::optional<DType> microscale_dtype() const { return to_dtype(dtype); }
  std::int64_t numel() const { return microscale::numel(shape); }
  // Zero-copy view. Throws Error when the dtype has no microscale::DType, or when the data is not
  // aligned to the element size (possible in files whose header length is not a multiple of 8;
  // copy() works for those).
  TensorView view() const;
  // Owning copy, any alignment. Throws Error when the dtype has no microscale::DType.
  Tensor copy() const;
};

class SafetensorsFile {
 public:
  // Memory-maps `path` read-only and validates it:
  //   - header length field <= kMaxHeaderBytes and within the file;
  //   - header is UTF-8 JSON, an object, with no duplicate keys at any level;
  //   - "__metadata__", if present, is an object of strings (or null);
  //   - every other entry is an object with "dtype" (a known name), "shape" (array of
  //     non-negative integers) and "data_offsets" ([begin, end], begin <= end <= data size);
  //     other keys are ignored, as the reference implementation does;
  //   - numel * element bits is exact whole bytes, computed without overflow, and equals end - begin;
  //   - the ranges do not overlap and cover the data area exactly: no holes, no trailing bytes.
  // Should another program truncate or rewrite the file while it is open, reading its tensors
  // finds zeros where the bytes are gone (instead of dying of SIGBUS) and check_unchanged() throws.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Same validation over caller memory, which must outlive the returned object (no copy is made).
  // `label` stands for the file name in error messages.
  static SafetensorsFile open_memory(const void* data, std::size_t size, std::string label = "<memory>");

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& source() const { return source_; }  // path or label
  // Tensors in file order (ascending data offset; header order among equal offsets).
  const std::vector<StTensor>& tensors() const { return tensors_; }
  std::vector<std::string> names() const;
  std::size_t size() const { return tensors_.size(); }
  const StTensor* find(std::string_view name) const;  // nullptr when absent
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const StTensor& tensor(std::string_view name) const;  // throws Error naming file and tensor
  const Metadata& metadata() const { return metadata_; }
  std::uint64_t header_bytes() const { return header_bytes_; }  // the length field N
  std::uint64_t file_bytes() const { return file_bytes_; }
  // Throws an Error naming the file when it changed since open(): a read found it truncated, or
  // its size or modification time differ. Call it after reading tensor data, before trusting
  // anything computed from it. Nothing to check for open_memory.
  void check_unchanged() const;

 private:
  struct Mapping;
  SafetensorsFile() = default;
  void parse();

  std::shared_ptr<const Mapping> map_;
  std::string source_;
  std::vector<StTensor> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
  Metadata metadata_;
  std::uint64_t header_bytes_ = 0;
  std::uint64_t file_bytes_ = 0;
};

// What a writer is told about a tensor before any data: enough to lay out the header.
struct StEntry {
  std::string name;
  StDType dtype = StDType::u8;
  Shape shape;
};

// Streams one safetensors file to disk, a tensor (or a chunk of one) at a time, so a converter's
// peak memory stays near one tensor. All entries are declared up front: the constructor writes the
// header to `<path>.tmp.<pid>` in the same directory; write() appends data in declaration order;
// finish() checks every byte arrived, fsyncs and renames onto `path`. Any error (I/O or misuse)
// removes the temporary file and leaves `path` untouched; so does destroying an unfinished writer.
// The header JSON lists "__metadata__" first (when non-empty) and then the tensors in the order
// given, padded with spaces to a multiple of 8 bytes so every tensor's data is 8-byte aligned
// relative to the file start when each tensor size is a multiple of 8.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::filesystem::path path, std::vector<StEntry> entries, Metadata metadata = {});
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;
  ~SafetensorsWriter();

  // Appends bytes to tensor `name`, which must be the first declared tensor not yet complete;
  // a tensor may arrive in several chunks and completes when its byte count is reached. Every
  // tensor is named at least once (zero-byte ones with an empty span).
  void write(std::string_view name, std::span<const std::byte> bytes);
  // Whole tensor from an owning buffer: dtype and shape must match the declaration.
  void write_tensor(std::string_view name, const Tensor& t);
  // Publishes the file; throws if a tensor is incomplete.
  void finish();

  const std::filesystem::path& path() const;
  const std::vector<StEntry>& entries() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One-shot write of in-memory tensors (same layout and atomicity as SafetensorsWriter).
struct StTensorData {
  std::string name;
  StDType dtype = StDType::u8;
  Shape shape;
  std::span<const std::byte> data;
};
void save_safetensors(const std::filesystem::path& path, const std::vector<StTensorData>& tensors,
                      const Metadata& metadata = {});

// A checkpoint: one .safetensors file, or shards listed by a `model.safetensors.index.json`
// ({"metadata": {"total_size": N, ...}, "weight_map": {tensor: shard file}}). Shards open lazily,
// each at most once, on first access; access is thread-safe.
class Checkpoint {
 public:
  // `path` is a .safetensors file, an index .json, or a directory holding
  // model.safetensors.index.json (preferred) or model.safetensors. For an index, every shard file
  // must exist (checked here, without opening it) and be a relative path that stays inside the
  // index's directory.
  static Checkpoint open(const std::filesystem::path& path);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  // Tensor names in index order (file order for a single file).
  const std::vector<std::string>& names() const;
  bool contains(std::string_view name) const;
  // Shard files (absolute or relative to the working directory as given to open()).
  const std::vector<std::filesystem::path>& shards() const;
  const std::filesystem::path& shard_of(std::string_view name) const;  // throws if unknown
  // Opens the tensor's shard if needed; throws if the name is unknown or the shard lacks it.
  const StTensor& tensor(std::string_view name) const;
  const SafetensorsFile& shard(std::size_t i) const;
  // "total_size" of the index metadata, when given.
  std::optional<std::uint64_t> total_size() const;
  // The index's other metadata entries (non-string values as JSON text); a single file's
  // __metadata__.
  const Metadata& metadata() const;
  // Opens every shard and checks that each holds exactly the tensors the index maps to it.
  void validate() const;
  // SafetensorsFile::check_unchanged() of every shard opened so far.
  void check_unchanged() const;

 private:
  struct Impl;
  Checkpoint() = default;
  std::unique_ptr<Impl> impl_;
};

// "model-00001-of-00003.safetensors" for i = 0, n = 3 (the Hugging Face shard naming).
std::string shard_file_name(std::size_t i, std::size_t n);

// Writes an index atomically for finished shard files: each shard is opened and validated, its
// tensors are mapped to its path relative to the index's directory (shards must lie inside it),
// a tensor name in two shards is an error, metadata.total_size is the sum of tensor bytes, and
// `extra` adds string entries to "metadata". The weight map is sorted by name.
void write_index(const std::filesystem::path& index_path, const std::vector<std::filesystem::path>& shards,
                 const Metadata& extra = {});

}  // namespace microscale::io
