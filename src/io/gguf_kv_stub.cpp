// TEMPORARY until gguf_file.cpp lands: the kv_* constructors gguf_vocab.cpp uses, so this branch
// builds on its own. The lead deletes this file at merge.
#include "io/gguf_file.hpp"

namespace microscale::io::gguf {

Kv kv_u32(std::string key, std::uint32_t v) { return {std::move(key), ValueType::u32, Json(v), ValueType::u8}; }
Kv kv_bool(std::string key, bool v) { return {std::move(key), ValueType::boolean, Json(v), ValueType::u8}; }
Kv kv_str(std::string key, std::string v) {
  return {std::move(key), ValueType::string, Json(std::move(v)), ValueType::u8};
}
Kv kv_array(std::string key, ValueType elem, Json values) {
  return {std::move(key), ValueType::array, std::move(values), elem};
}

}  // namespace microscale::io::gguf
