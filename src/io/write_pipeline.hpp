// The streaming write pipeline of quantize / convert / dequantize. Each operation first plans:
// every output shard gets the items (a tensor, or a quantized layer) whose primary input tensor
// lives in the same input shard, with the entries they will write, so that a conversion that
// cannot happen fails before anything is written. Then shards are written one at a time, an item
// at a time, releasing input pages as it goes, into a staging directory that replaces the output
// only once everything is written (Staging).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/layout.hpp"
#include "io/staging.hpp"

namespace microscale::io::ck {

struct Item {
  std::size_t shard = 0;
  std::uint64_t order = 0;  // data offset of its primary tensor in that shard
  std::vector<StEntry> entries;
  std::uint64_t in_bytes = 0;
  std::string label;
  std::function<void(SafetensorsWriter&)> run;
};

// An item for input tensor `tensor` (quantize) or for layer `l` (convert, dequantize): its place,
// input bytes and label; entries and run are the caller's.
Item tensor_item(const Input& in, const std::string& tensor, std::string label);
Item layer_item(const Input& in, const Layer& l);

// A tensor written unchanged, reported as "copied", or as "kept" with the reason a weight was not
// quantized.
Item passthrough(const Input& in, const std::string& name, Report& report,
                 std::optional<std::string> kept_reason = std::nullopt);

// Writes `outs` (emit's tensors), adding their bytes to `r`.
void write_emitted(SafetensorsWriter& w, const std::vector<Out>& outs, TensorReport& r);
std::vector<StEntry> entries_of(const std::vector<Out>& outs);

// Writes every shard (same relative names as the input, metadata "format" set to `shard_format`
// when given) and the index when the input had one.
void execute(const Input& in, const fs::path& out, std::vector<Item>& items, const char* shard_format,
             const ProgressFn& progress, Report& report);

// The rest of the output in the staging directory: the input's other files, hf_quant_config.json,
// then config.json last. With `dtype`, the config's torch_dtype says what the weights now are.
void finish_dir(const Input& in, const Staging& st, std::optional<Convention> to, const QuantMeta& meta, Report& report,
                std::optional<DType> dtype = std::nullopt);

// The whole tail of an operation: Staging next to `out`, execute, finish_dir, commit.
void write_output(const Input& in, const fs::path& out, bool force, std::vector<Item>& items, const char* shard_format,
                  std::optional<Convention> to, const QuantMeta& meta, const ProgressFn& progress, Report& report,
                  std::optional<DType> dtype = std::nullopt);

// glibc raises its mmap threshold after large frees, so per-tensor buffers of a few MB end up on
// the heap and stay resident after being freed; hand them back so the peak stays near one tensor.
void trim_heap();

}  // namespace microscale::io::ck
