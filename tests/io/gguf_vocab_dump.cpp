// Test tool for check_gguf_vocab.py: prints the tokenizer keys microscale would write into a GGUF
// file for a model directory, as JSON {"source", "notes", "kvs": {key: {type, elem, value}}}.
//
//   gguf_vocab_dump MODEL_DIR [VOCAB_SIZE]     VOCAB_SIZE defaults to config.json's vocab_size
#include <fstream>
#include <iostream>
#include <sstream>

#include "io/gguf_vocab.hpp"

int main(int argc, char** argv) {
  using namespace microscale::io::gguf;
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: gguf_vocab_dump MODEL_DIR [VOCAB_SIZE]\n";
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::ifstream in(dir / "config.json");
    std::stringstream text;
    text << in.rdbuf();
    const Json config = Json::parse(text.str());
    const std::int64_t vocab_size = argc == 3 ? std::stoll(argv[2]) : config.at("vocab_size").get<std::int64_t>();
    const Vocab v = read_vocab(dir, config, vocab_size);
    Json kvs = Json::object();
    for (const Kv& kv : v.kvs) {
      Json entry{{"type", static_cast<std::uint32_t>(kv.type)}, {"value", kv.value}};
      if (kv.type == ValueType::array) entry["elem"] = static_cast<std::uint32_t>(kv.elem);
      kvs[kv.key] = std::move(entry);
    }
    std::cout << Json{{"source", v.source}, {"notes", v.notes}, {"kvs", kvs}}.dump(1) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
