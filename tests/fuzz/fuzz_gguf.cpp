// libFuzzer target for GGUF reading and the GGUF export's tokenizer (built and run by
// tests/fuzz/run.sh, seeds in corpus_gguf/ from make_gguf_corpus.py).
//
// The first byte picks the mode; bad input must only ever throw microscale::Error (whose message
// names the file, tensor or key); any other exception, a crash, a sanitizer report or a broken
// invariant is a finding.
//   even: the rest is a GGUF file. It goes through inspect, dequantize and convert to
//         compressed-tensors, modelopt and mlx. The file must be left as it was; a refused run
//         leaves no output; an accepted one leaves config.json and a model.safetensors that opens,
//         and what convert wrote loads back as a checkpoint.
//   odd:  the rest holds tokenizer files for a fixed float Llama (1 layer, hidden 64, vocab 128):
//         per file of kTokenizerFiles a little-endian u16 length, then that many bytes (0xFFFF:
//         the file is absent); bit 1 of the first byte picks mxfp4 over nvfp4, bit 2 split files.
//         quantize exports GGUF; a written file must open with GgufFile and inspect with microscale.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <typeinfo>
#include <vector>

#include "io/gguf_file.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/io.hpp"

using namespace microscale;
using namespace microscale::io;
namespace fs = std::filesystem;

namespace {

const char* const kTokenizerFiles[] = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                       "special_tokens_map.json"};
constexpr std::int64_t kHidden = 64, kVocab = 128;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

// True when f ran; false on a clean refusal (microscale::Error). Any other exception is a finding:
// its message names neither the file nor what was wrong with it.
template <class F>
bool attempt(F&& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    static const bool verbose = std::getenv("FUZZ_GGUF_VERBOSE") != nullptr;  // to study seeds
    if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finding: %s escaped instead of an Error: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, std::string_view s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// An output directory an accepted run leaves: config.json, and a model.safetensors that opens.
void check_output(const fs::path& dir) {
  require(fs::is_regular_file(dir / "config.json"), "an accepted run writes config.json");
  try {
    (void)SafetensorsFile::open(dir / "model.safetensors");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "invariant violated: %s does not open: %s\n", (dir / "model.safetensors").c_str(), e.what());
    std::abort();
  }
}

void run_gguf(const fs::path& root, std::string_view bytes) {
  const fs::path in = root / "model.gguf", out = root / "out";
  write_file(in, bytes);
  attempt([&] { (void)inspect_checkpoint(in, true); });
  DequantizeOptions dq;
  dq.force = true;
  if (attempt([&] { dequantize_checkpoint(in, out / "dq", dq); }))
    check_output(out / "dq");
  else
    require(!fs::exists(out / "dq"), "a refused dequantize leaves no output");
  for (Convention to : {Convention::compressed_tensors, Convention::modelopt, Convention::mlx}) {
    ConvertOptions co;
    co.to = to;
    co.force = true;
    const fs::path cv = out / name(to);
    if (!attempt([&] { convert_checkpoint(in, cv, co); })) {
      require(!fs::exists(cv), "a refused convert leaves no output");
      continue;
    }
    check_output(cv);
    try {
      (void)load_checkpoint(cv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "invariant violated: GGUF converted to %s does not load back: %s\n", name(to), e.what());
      std::abort();
    }
  }
  require(read_file(in) == bytes, "the input GGUF is left as it was");
}

// The fixed float model, written once per process: tokenizer files change per input.
void write_model(const fs::path& dir) {
  fs::create_directories(dir);
  write_file(dir / "config.json", R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,
"intermediate_size":64,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":32,"num_hidden_layers":1,
"max_position_embeddings":128,"rms_norm_eps":1e-6,"rope_theta":10000.0,"vocab_size":128,"bos_token_id":1,
"eos_token_id":2,"tie_word_embeddings":false,"torch_dtype":"float32"})");
  struct Spec {
    std::string name;
    Shape shape;
  };
  const std::string p = "model.layers.0.";
  const std::vector<Spec> specs = {{"model.embed_tokens.weight", {kVocab, kHidden}},
                                   {p + "input_layernorm.weight", {kHidden}},
                                   {p + "post_attention_layernorm.weight", {kHidden}},
                                   {p + "self_attn.q_proj.weight", {kHidden, kHidden}},
                                   {p + "self_attn.k_proj.weight", {32, kHidden}},
                                   {p + "self_attn.v_proj.weight", {32, kHidden}},
                                   {p + "self_attn.o_proj.weight", {kHidden, kHidden}},
                                   {p + "mlp.gate_proj.weight", {64, kHidden}},
                                   {p + "mlp.up_proj.weight", {64, kHidden}},
                                   {p + "mlp.down_proj.weight", {kHidden, 64}},
                                   {"model.norm.weight", {kHidden}},
                                   {"lm_head.weight", {kVocab, kHidden}}};
  std::vector<std::vector<float>> values;
  std::vector<StTensorData> tensors;
  for (const Spec& s : specs) {
    std::int64_t n = 1;
    for (std::int64_t d : s.shape) n *= d;
    std::vector<float>& v = values.emplace_back(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37 + 11) % 97) / 97.0f - 0.5f;
    tensors.push_back({s.name, StDType::f32, s.shape, std::as_bytes(std::span(v))});
  }
  save_safetensors(dir / "model.safetensors", tensors);
}

void run_export(const fs::path& root, std::uint8_t flags, std::string_view rest) {
  static const bool written = (write_model(root / "llama"), true);
  (void)written;
  const fs::path model = root / "llama", out = root / "exported", gguf_out = out / "model.gguf";
  std::size_t pos = 0;
  for (const char* file : kTokenizerFiles) {
    fs::remove(model / file);
    if (pos + 2 > rest.size()) continue;
    const std::size_t len = static_cast<std::uint8_t>(rest[pos]) | static_cast<std::uint8_t>(rest[pos + 1]) << 8;
    pos += 2;
    if (len == 0xFFFF) continue;
    write_file(model / file, rest.substr(pos, len));
    pos = std::min(rest.size(), pos + len);
  }
  fs::remove_all(out);
  fs::create_directories(out);
  QuantizeOptions qo;
  qo.to = Convention::gguf;
  qo.spec.mode = flags & 2 ? Mode::mxfp4 : Mode::nvfp4;
  qo.spec.group_size = flags & 2 ? 32 : 16;
  qo.split_bytes = flags & 4 ? 64 * 1024 : 0;
  qo.force = true;
  if (!attempt([&] { quantize_checkpoint(model, gguf_out, qo); })) {
    require(fs::is_empty(out), "a refused export leaves nothing behind");
    return;
  }
  for (const auto& e : fs::directory_iterator(out)) {
    try {
      (void)gguf::GgufFile::open(e.path());
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "invariant violated: exported %s does not open: %s\n", e.path().c_str(), ex.what());
      std::abort();
    }
  }
  if (!(flags & 4))  // microscale reads back what it wrote (split files are refused by design)
    require(attempt([&] { (void)inspect_checkpoint(gguf_out, false); }), "an exported GGUF inspects");
}

struct Scratch {
  fs::path root = fs::temp_directory_path() / ("microscale_fuzz_gguf_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(root); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Scratch scratch;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  fs::remove_all(scratch.root / "out");
  if (data[0] & 1)
    run_export(scratch.root, data[0], rest);
  else
    run_gguf(scratch.root, rest);
  return 0;
}
