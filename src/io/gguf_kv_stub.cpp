// TEMPORARY until gguf_file.cpp lands: the Kv constructors gguf_arch.cpp uses.
#include "io/gguf_file.hpp"

namespace microscale::io::gguf {

Kv kv_u32(std::string key, std::uint32_t v) { return {std::move(key), ValueType::u32, Json(v)}; }
Kv kv_f32(std::string key, float v) { return {std::move(key), ValueType::f32, Json(v)}; }
Kv kv_bool(std::string key, bool v) { return {std::move(key), ValueType::boolean, Json(v)}; }
Kv kv_str(std::string key, std::string v) { return {std::move(key), ValueType::string, Json(std::move(v))}; }

}  // namespace microscale::io::gguf
