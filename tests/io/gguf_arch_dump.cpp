// Test tool for check_gguf_arch.py: prints, for a model directory (config.json and safetensors),
// the GGUF architecture plan (io/gguf_arch.hpp) and every presented tensor's rule as JSON, so that
// gguf-py's own name mapping and key templates can check them.
//
//   gguf_arch_dump MODEL_DIR   {"hf_type", "arch", "vocab_size", "tied_embeddings",
//                               "kvs": [{key, type, value}], "extra_tensors": [{name, count}],
//                               "tensors": [{hf, shape, weight, rule: {name, permute_heads,
//                               plus_one, f32, skip} | null}]}
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gguf_arch_names.hpp"
#include "io/gguf_arch.hpp"

namespace {

using Json = nlohmann::ordered_json;
namespace g = microscale::io::gguf;

const char* type_name(g::ValueType t) {
  switch (t) {
    case g::ValueType::u32: return "UINT32";
    case g::ValueType::f32: return "FLOAT32";
    case g::ValueType::boolean: return "BOOL";
    case g::ValueType::string: return "STRING";
    default: return "OTHER";
  }
}

int run(const std::filesystem::path& dir) {
  std::ifstream in(dir / "config.json");
  std::stringstream text;
  text << in.rdbuf();
  const g::ArchPlan plan = g::arch_plan(Json::parse(text.str()));
  Json out{{"hf_type", plan.hf_type},       {"arch", plan.arch},
           {"vocab_size", plan.vocab_size}, {"tied_embeddings", plan.tied_embeddings},
           {"kvs", Json::array()},          {"extra_tensors", Json::array()},
           {"tensors", Json::array()}};
  for (const g::Kv& kv : plan.kvs)
    out["kvs"].push_back(Json{{"key", kv.key}, {"type", type_name(kv.type)}, {"value", kv.value}});
  for (const g::ExtraTensor& t : plan.extra_tensors)
    out["extra_tensors"].push_back(Json{{"name", t.name}, {"count", t.values.size()}});
  const auto ck = microscale::io::Checkpoint::open(dir);
  for (const auto& p : gguf_arch_test::presented_names(ck)) {
    Json t{{"hf", p.name}, {"shape", p.shape}, {"weight", p.weight}, {"rule", nullptr}};
    if (const auto r = g::tensor_rule(plan, p.name))
      t["rule"] = Json{{"name", r->name},
                       {"permute_heads", r->permute_heads},
                       {"plus_one", r->plus_one},
                       {"f32", r->f32},
                       {"skip", r->skip}};
    out["tensors"].push_back(std::move(t));
  }
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: gguf_arch_dump MODEL_DIR\n";
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "gguf_arch_dump: " << e.what() << "\n";
    return 1;
  }
}
