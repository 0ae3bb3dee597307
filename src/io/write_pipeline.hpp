// The streaming write pipeline of quantize / convert / dequantize. Each operation first plans:
// every output shard gets the items (a tensor, or a quantized layer) whose primary input tensor
// lives in the same input shard, with the entries they will write, so that a conversion that
// cannot happen fails before anything is written. Then shards are written one at a time, an item
// at a time, releasing input pages as it goes, into a staging directory that replaces the output
// only once everything is written (Staging).
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/layout.hpp"
#include "io/staging.hpp"
#include "io/tensor_sink.hpp"

namespace microscale::io::ck {

struct Item {
  std::size_t shard = 0;
  std::uint64_t order = 0;  // data offset of its primary tensor in that shard
  std::vector<StEntry> entries;
  std::uint64_t in_bytes = 0;
  std::vector<std::span<const std::byte>> inputs;  // the mapped bytes it reads, to prefetch
  std::string label;
  std::string layer;  // the quantized layer whose tensors it writes; empty for other tensors
  std::function<void(TensorSink&)> run;
};

// An item for input tensor `tensor` (quantize) or for layer `l` (convert, dequantize): its place,
// input bytes and label; entries and run are the caller's.
Item tensor_item(const Input& in, const std::string& tensor, std::string label);
Item layer_item(const Input& in, const Layer& l);

// A tensor written unchanged, reported as "copied", or as "kept" with the reason a weight was not
// quantized.
Item passthrough(const Input& in, const std::string& name, Report& report,
                 std::optional<std::string> kept_reason = std::nullopt);

// dequantize's NaN and Inf in `values` (of dtype `dt`), written for `name`: counted into `r`, and
// under NonFinite::error an Error naming the tensor (so nothing is published).
void check_nonfinite(std::span<const std::byte> values, DType dt, const std::string& name, NonFinite policy,
                     TensorReport& r);

// The report of layer `l` written with `action` (its name, format and stored shape).
TensorReport layer_report(const Layer& l, TensorAction action, std::uint64_t bytes_in);

// Writes `outs` (emit's tensors), adding their bytes to `r`.
void write_emitted(TensorSink& w, const std::vector<Out>& outs, TensorReport& r);
std::vector<StEntry> entries_of(const std::vector<Out>& outs);

// How an operation's output is written.
struct WriteOptions {
  bool force = false;
  ProgressFn progress;
  std::optional<DType> dtype;     // dequantize: what config.json's torch_dtype says the weights now are
  Part part;                      // a split run's part (count 1: the whole output)
  std::string options;            // the text of the options that shape the bytes, which every part must share
  std::uint64_t split_bytes = 0;  // single-file layouts: the largest file (0: one file)
};

// The whole output of an operation, built in a Staging directory next to `out` and moved into
// place: every shard (same relative names as the input, metadata "format" set to the layout's
// shard_format), the index when the input had one, the input's other files,
// hf_quant_config.json, then config.json last. A layout that writes a file of its own
// (LayoutOps::write_file: GGUF) gets the items instead.
// With `part.count` > 1 only this part's shards are written, into the split run's PartStaging
// directory, and the part that finds every part done writes the rest and publishes `out`.
void write_output(const Input& in, const fs::path& out, std::vector<Item>& items, std::optional<Convention> to,
                  const QuantMeta& meta, const WriteOptions& opt, Report& report);

// Items sorted into input order (shard, then data offset), as every output writes them.
void sort_items(std::vector<Item>& items);
// Runs `item` into `sink`, checking afterwards that the input did not change under it.
void run_item(const Input& in, Item& item, TensorSink& sink);
// Asks the kernel to read `bytes` (mapped input) ahead: the next item's input is read from disk
// while this one is written.
void prefetch(std::span<const std::byte> bytes);

// glibc raises its mmap threshold after large frees, so per-tensor buffers of a few MB end up on
// the heap and stay resident after being freed; hand them back so the peak stays near one tensor.
void trim_heap();

}  // namespace microscale::io::ck
