// Where the write pipeline's items put their tensors: a safetensors shard, or a GGUF file that
// renames and lays them out as llama.cpp does (gguf_export.cpp). Items write each declared tensor
// in declaration order, whole or in chunks.
#pragma once

#include <span>
#include <string_view>

#include "microscale/io.hpp"

namespace microscale::io::ck {

class TensorSink {
 public:
  virtual ~TensorSink() = default;
  // Appends bytes to tensor `name`, the first declared tensor not yet complete.
  virtual void write(std::string_view name, std::span<const std::byte> bytes) = 0;
  // The whole tensor from an owning buffer (its dtype and shape as declared).
  virtual void write_tensor(std::string_view name, const Tensor& t) { write(name, {t.bytes(), t.nbytes()}); }
};

class SafetensorsSink final : public TensorSink {
 public:
  explicit SafetensorsSink(SafetensorsWriter& w) : w_(w) {}
  void write(std::string_view name, std::span<const std::byte> bytes) override { w_.write(name, bytes); }
  void write_tensor(std::string_view name, const Tensor& t) override { w_.write_tensor(name, t); }

 private:
  SafetensorsWriter& w_;
};

}  // namespace microscale::io::ck
