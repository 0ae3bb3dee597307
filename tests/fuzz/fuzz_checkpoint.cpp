// libFuzzer target for the whole-checkpoint layer (built and run by tests/fuzz/run.sh).
//
// Each input describes a model directory: config.json, and safetensors tensors whose names,
// dtypes and shapes come from tables of quantized-layer names and hostile dimensions (0, 2^32,
// 2^40, 2^62, ...), in one file or in two shards behind an index that may disagree with them.
// The directory is written to a scratch folder and run through inspect, load, dequantize,
// convert and quantize. Bad input must only ever throw (a std::exception); a crash, a sanitizer
// report or a broken invariant on accepted input is a finding. Beside the weights it may hold side
// files that are symbolic links out of the model directory (whose target must never reach an
// output), a private file (whose mode an output must keep) and an earlier output in a subfolder
// (never copied); and every input file, by any name, must be refused as a report path.
//
// Input bytes, read from the front (missing bytes read as 0):
//   flags   bits 0-2 config kind, bit 3 sharded, bits 4-5 index damage, bit 6 stats, bit 7 quantize to MLX
//   group bits mode   indexes into kConfigInts, kConfigInts, kModes (config kinds 2-4)
//   [len text]        config kind 6 only: raw config.json text
//   count             number of tensors (mod 9)
//   per tensor: module suffix dtype rank place dim0 dim1 dim2 [dim3 for rank 4] (dims: kDims index, or
//               small value; place: bit 0 shard, bits 1-7 an index into kEdgeValues, whose value fills
//               an F32 tensor: global and activation scales at the edges)
//   side              side files: bit 0 a relative link out, bit 1 an absolute one, bit 2 a link
//                     inside, bit 3 a 0600 file, bit 4 a dangling link, bit 5 an earlier output in
//                     a subfolder; bits 6-7 the report path checked (a shard, config.json, a hard
//                     link to a shard, a symbolic link to the index or model.safetensors)
//   the rest          tensor data, taken in order and repeated as needed
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "microscale/checkpoint.hpp"
#include "microscale/io.hpp"

using namespace microscale;
using namespace microscale::io;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr std::int64_t kDims[] = {0,
                                  1,
                                  2,
                                  3,
                                  4,
                                  8,
                                  16,
                                  32,
                                  64,
                                  128,
                                  4096,
                                  (1ll << 31) - 1,
                                  1ll << 31,
                                  1ll << 32,
                                  (1ll << 32) + 4,
                                  1ll << 40,
                                  1ll << 43,
                                  1ll << 58,
                                  1ll << 60,
                                  1ll << 61,
                                  1ll << 62,
                                  0x7fffffffffffffffll};
constexpr std::int64_t kConfigInts[] = {0,
                                        2,
                                        3,
                                        4,
                                        5,
                                        6,
                                        8,
                                        16,
                                        32,
                                        64,
                                        128,
                                        -1,
                                        -4,
                                        1,
                                        7,
                                        9,
                                        256,
                                        (1ll << 32) + 4,
                                        (1ll << 32) + 32,
                                        1ll << 40,
                                        0x7fffffffffffffffll};
const char* const kModes[] = {nullptr, "affine", "nvfp4", "mxfp4", "mxfp8", "bogus"};
const char* const kModules[] = {"m", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                                "model.layers.0.mlp.gate_proj", "lm_head", "model.embed_tokens", "model.norm", "x",
                                // hostile: empty, dots, glob characters, non-ASCII, a control byte
                                "", ".", "a..b", "layers.*.q_proj", "\xc3\xa9.q_proj", "m\n", "__metadata__"};
const char* const kSuffixes[] = {".weight", ".weight_packed", ".weight_scale", ".weight_global_scale",
                                 ".weight_scale_2", ".input_scale", ".input_global_scale", ".scales", ".biases",
                                 ".weight_zero_point", ".bias", "",
                                 // quantized sources: DeepSeek FP8 scales, gpt-oss MXFP4 experts
                                 ".weight_scale_inv", "_blocks", "_scales"};
// Values that scales (weight_scale_2, weight_global_scale, input scales) read as F32 take at the
// edges of their conventions: zeros, denormals, overflowing reciprocals, non-finite and negative
// values, and the ordinary 1 and 2688. Index 0: no fill (the data pool).
constexpr float kEdgeValues[] = {0.0f,
                                 0.0f,
                                 -0.0f,
                                 1e-40f,
                                 std::numeric_limits<float>::denorm_min(),
                                 std::numeric_limits<float>::min(),
                                 std::numeric_limits<float>::max(),
                                 std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN(),
                                 -1.0f,
                                 1.0f,
                                 2688.0f,
                                 1.0f / 2688.0f,
                                 7.9e-36f,
                                 1e38f};
constexpr StDType kLikely[] = {StDType::u8,   StDType::u32, StDType::f8_e4m3, StDType::f16,
                               StDType::bf16, StDType::f32, StDType::f8_e8m0, StDType::u8};
constexpr std::uint64_t kMaxTensorBytes = 1 << 16;

template <class T, std::size_t N>
const T& pick(const T (&table)[N], std::uint8_t b) {
  return table[b % N];
}

class Reader {
 public:
  Reader(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  std::uint8_t byte() { return i_ < n_ ? p_[i_++] : 0; }
  std::string text(std::size_t len) {
    std::string s;
    while (len-- && i_ < n_) s.push_back(static_cast<char>(p_[i_++]));
    return s;
  }
  // What is left becomes the data pool.
  std::vector<std::byte> rest() {
    std::vector<std::byte> out;
    for (; i_ < n_; ++i_) out.push_back(static_cast<std::byte>(p_[i_]));
    return out;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_, i_ = 0;
};

struct TensorSpec {
  std::string name;
  StDType dtype;
  Shape shape;
  std::uint64_t nbytes;
  int shard;
  std::size_t edge;  // an index into kEdgeValues: fills an F32 tensor with that value (0: no fill)
};

std::int64_t dim(std::uint8_t b) {
  constexpr std::size_t n = std::size(kDims);
  return b < n ? kDims[b] : static_cast<std::int64_t>(b - n);
}

std::string make_config(std::uint8_t kind, Reader& in, const std::string& module) {
  const std::int64_t group = pick(kConfigInts, in.byte()), bits = pick(kConfigInts, in.byte());
  const char* mode = pick(kModes, in.byte());
  Json q = {{"group_size", group}, {"bits", bits}};
  if (mode) q["mode"] = mode;
  switch (kind) {
    case 0: return "";
    case 1: return "{}";
    case 2: return Json{{"quantization", q}}.dump();
    case 3: {
      Json o = q;
      o["bits"] = 8;
      Json with = q;
      with[module] = o;
      return Json{{"quantization", with}, {"quantization_config", q}}.dump();
    }
    case 4: {
      Json c = q;
      c["quant_method"] = "compressed-tensors";
      return Json{{"quantization_config", c}}.dump();
    }
    case 5: return R"({"quantization_config":{"quant_method":"modelopt","quant_algo":"NVFP4"}})";
    case 6: return in.text(in.byte());
    default: return R"({"quantization": 4, "quantization_config": [1]})";
  }
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// A valid safetensors file of these tensors (data cycled from the pool).
void write_shard(const fs::path& p, const std::vector<const TensorSpec*>& ts, const std::vector<std::byte>& pool,
                 std::size_t& pos) {
  Json h = Json::object();
  std::uint64_t off = 0;
  for (const TensorSpec* t : ts) {
    h[t->name] = {{"dtype", st_dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + t->nbytes}}};
    off += t->nbytes;
  }
  std::string text = h.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  out += text;
  for (const TensorSpec* t : ts)
    for (std::uint64_t i = 0; i < t->nbytes; ++i) {
      const float v = kEdgeValues[t->edge];
      out.push_back(t->edge && t->dtype == StDType::f32 ? reinterpret_cast<const char*>(&v)[i % 4]
                    : pool.empty()                      ? '\0'
                                                        : static_cast<char>(pool[pos++ % pool.size()]));
    }
  write_file(p, out);
}

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

// Accepted quantized layers are self-consistent: packed bytes hold rows x K elements of `bits`.
void check_loaded(const CheckpointData& d) {
  for (const QuantizedLayer& l : d.layers) {
    const Quantized& q = l.weight;
    require(q.shape.size() == 2, "loaded layer is 2-D");
    const auto rows = static_cast<unsigned __int128>(q.shape[0]), cols = static_cast<unsigned __int128>(q.shape[1]);
    require(static_cast<unsigned __int128>(q.packed.nbytes()) * 8 == rows * cols * static_cast<unsigned>(q.spec.bits),
            "packed bytes match the logical shape");
    require(q.spec.group_size > 0 && q.shape[1] % q.spec.group_size == 0, "group divides K");
    const Tensor y = dequantize(q, DType::float32);
    require(y.numel() == q.shape[0] * q.shape[1], "dequantized size");
  }
}

// What convert writes decodes to the values it read: bit for bit, or, where a global scale crossed
// conventions through its amax, with an amax at most one float32 ulp away (docs/checkpoints.md).
void check_same_values(const CheckpointData& before, const CheckpointData& after) {
  for (const QuantizedLayer& a : before.layers)
    for (const QuantizedLayer& b : after.layers) {
      if (b.module != a.module) continue;  // stacked or split experts are renamed
      const Tensor ya = dequantize(a.weight, DType::float32), yb = dequantize(b.weight, DType::float32);
      if (ya.nbytes() == yb.nbytes() && std::memcmp(ya.bytes(), yb.bytes(), ya.nbytes()) == 0) continue;
      // A two-level layer stands for amax 2688 (decode factor 1).
      const float ga = a.weight.spec.global_scale.value_or(2688.0f), gb = b.weight.spec.global_scale.value_or(2688.0f);
      require(ga > 0 && (gb == std::nextafter(ga, INFINITY) || gb == std::nextafter(ga, 0.0f)),
              "a converted layer decodes to the values it was read as");
    }
}

template <class F>
bool attempt(F&& f) {
  try {
    f();
    return true;
  } catch (const std::exception&) {
    return false;  // a clean rejection
  }
}

constexpr std::string_view kSecret = "outside the model: must never be copied\n";

// What an output must show of the side files (`side`, the input byte): neither the links out nor
// any other side file holding the secret they led to (weights and config.json come from the
// input bytes, which may hold its text), the private file with its mode, no earlier output.
void check_side_files(const fs::path& out, std::uint8_t side) {
  for (const char* link : {"tokenizer_config.json", "special_tokens_map.json", "dangling.txt"})
    require(!fs::exists(fs::symlink_status(out / link)), "a link out of the model directory was copied");
  for (const auto& e : fs::recursive_directory_iterator(out)) {
    require(!e.is_symlink(), "outputs hold no symbolic links");
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name.find(".safetensors") != std::string::npos || name == "config.json" ||
        name == "hf_quant_config.json")
      continue;
    std::ifstream f(e.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    require(text.find(kSecret) == std::string::npos, "a link out of the model directory was followed");
  }
  if (side & 8)
    require(fs::status(out / "private.txt").permissions() == (fs::perms::owner_read | fs::perms::owner_write),
            "a copied side file keeps its mode");
  if (side & 4) require(fs::is_regular_file(out / "vocab.txt"), "a link inside the model directory is copied");
  if (side & 32) require(!fs::exists(out / "q"), "an earlier output in the model directory is not copied");
}

// Side files of the model directory (`side`, the input byte), beside a secret outside it.
void write_side_files(const fs::path& root, const fs::path& model, std::uint8_t side) {
  write_file(root / "secret", std::string(kSecret));
  if (side & 1) fs::create_symlink("../secret", model / "tokenizer_config.json");
  if (side & 2) fs::create_symlink(root / "secret", model / "special_tokens_map.json");
  if (side & 4) {
    write_file(model / "tokenizer.json", "{}");
    fs::create_symlink("tokenizer.json", model / "vocab.txt");
  }
  if (side & 8) {
    write_file(model / "private.txt", "mine\n");
    fs::permissions(model / "private.txt", fs::perms::owner_read | fs::perms::owner_write);
  }
  if (side & 16) fs::create_symlink("nothing", model / "dangling.txt");
  if (side & 32) {
    fs::create_directories(model / "q");
    write_file(model / "q" / "config.json", "{}");
    write_file(model / "q" / "model.safetensors", "");
  }
}

// Every input file is refused as a report path, by its own name or another: a path inside the
// model directory, a hard link or a symbolic link elsewhere. A new file outside is accepted.
void check_report_paths(const fs::path& root, const fs::path& model, std::uint8_t side) {
  RunInputs inputs;
  fs::path shard;  // one the run reads (a shard file the index leaves out is not read)
  try {
    inputs = RunInputs(model);
    const Checkpoint ck = Checkpoint::open(model);
    if (ck.shards().empty()) return;
    shard = ck.shards().front();
  } catch (const std::exception&) {
    return;  // no checkpoint to protect: every run refuses it
  }
  const bool indexed = fs::exists(model / "model.safetensors.index.json");
  fs::path target;
  switch (side >> 6) {
    case 0: target = shard; break;
    case 1: target = model / (fs::exists(model / "config.json") ? "config.json" : "report.csv"); break;
    case 2:
      target = root / "hard-link";
      fs::create_hard_link(shard, target);
      break;
    default:
      target = root / "soft-link";
      fs::create_symlink(indexed ? model / "model.safetensors.index.json" : shard, target);
  }
  require(!attempt([&] { inputs.check_output_file("--report", target); }), "a report path on an input is refused");
  require(attempt([&] { inputs.check_output_file("--report", root / "report.csv"); }),
          "a report path outside the model is accepted");
  require(!attempt([&] { inputs.check_output_dir(model); }), "the model directory is refused as the output");
  require(!attempt([&] { inputs.check_output_dir(root); }), "an output holding the model is refused");
}

// The scratch folder of this process, removed at exit (an aborting finding leaves it for study).
struct Scratch {
  fs::path root = fs::temp_directory_path() / ("microscale_fuzz_ckpt_" + std::to_string(::getpid()));
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Scratch scratch;
  const fs::path& root = scratch.root;
  const fs::path model = root / "model", out = root / "out";
  fs::remove_all(root);
  fs::create_directories(model);

  Reader in(data, size);
  const std::uint8_t flags = in.byte();
  const std::uint8_t module0 = in.byte();
  const std::string config = make_config(flags & 7, in, pick(kModules, module0));
  if (!config.empty()) write_file(model / "config.json", config);

  std::vector<TensorSpec> tensors;
  const int count = in.byte() % 9;
  for (int i = 0; i < count; ++i) {
    TensorSpec t;
    // Two statements: the operands of + may be evaluated in either order (GCC reads the suffix first).
    const std::string module = i == 0 ? pick(kModules, module0) : pick(kModules, in.byte());
    t.name = module + pick(kSuffixes, in.byte());
    const std::uint8_t d = in.byte();
    t.dtype = d < 128 ? pick(kLikely, d) : static_cast<StDType>(d % kStDTypeCount);
    const int rank = pick({2, 2, 2, 1, 0, 3, 4}, in.byte());  // 4: gpt-oss expert blocks
    const std::uint8_t place = in.byte();
    t.shard = place & 1;
    t.edge = (place >> 1) % std::size(kEdgeValues);
    for (int r = 0; r < std::max(rank, 3); ++r) {
      const std::int64_t v = dim(in.byte());
      if (r < rank) t.shape.push_back(v);
    }
    // Huge tensors stay hostile but empty: a zero leading dimension.
    try {
      t.nbytes = st_nbytes(t.dtype, t.shape);
      if (t.nbytes > kMaxTensorBytes && rank > 0) {
        t.shape[0] = 0;
        t.nbytes = st_nbytes(t.dtype, t.shape);
      }
    } catch (const Error&) {
      continue;  // not a valid safetensors entry; the safetensors fuzzer covers those
    }
    if (t.nbytes > kMaxTensorBytes) continue;
    bool dup = false;
    for (const TensorSpec& o : tensors) dup |= o.name == t.name;
    if (!dup) tensors.push_back(std::move(t));
  }
  const std::uint8_t side = in.byte();
  const std::vector<std::byte> pool = in.rest();
  std::size_t pos = 0;

  if (flags & 8) {
    const char* files[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    Json wm = Json::object();
    for (int s = 0; s < 2; ++s) {
      std::vector<const TensorSpec*> ts;
      for (const TensorSpec& t : tensors)
        if (t.shard == s) ts.push_back(&t);
      write_shard(model / files[s], ts, pool, pos);
    }
    for (const TensorSpec& t : tensors) wm[t.name] = files[t.shard];
    switch ((flags >> 4) & 3) {  // an index that disagrees with its shards
      case 1:
        if (!tensors.empty()) wm.erase(tensors[0].name);
        break;
      case 2: wm["ghost.weight"] = files[1]; break;
      case 3:
        if (!tensors.empty()) wm[tensors[0].name] = files[1 - tensors[0].shard];
        break;
      default: break;
    }
    write_file(model / "model.safetensors.index.json", Json{{"metadata", Json::object()}, {"weight_map", wm}}.dump());
  } else {
    std::vector<const TensorSpec*> ts;
    for (const TensorSpec& t : tensors) ts.push_back(&t);
    write_shard(model / "model.safetensors", ts, pool, pos);
  }

  write_side_files(root, model, side);
  check_report_paths(root, model, side);

  attempt([&] { (void)inspect_checkpoint(model, (flags & 64) != 0); });
  std::optional<CheckpointData> loaded;
  attempt([&] {
    loaded = load_checkpoint(model);
    check_loaded(*loaded);
  });
  DequantizeOptions dq;
  dq.force = true;
  if (attempt([&] { dequantize_checkpoint(model, out / "dq", dq); })) check_side_files(out / "dq", side);
  for (Convention to : {Convention::compressed_tensors, Convention::modelopt, Convention::mlx}) {
    ConvertOptions co;
    co.to = to;
    co.force = true;
    if (!attempt([&] { convert_checkpoint(model, out / "cv", co); })) continue;
    check_side_files(out / "cv", side);
    try {  // what convert writes must load back, holding the same values
      const CheckpointData back = load_checkpoint(out / "cv");
      check_loaded(back);
      if (loaded) check_same_values(*loaded, back);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "invariant violated: checkpoint converted to %s does not load back: %s\n", name(to),
                   e.what());
      std::abort();
    }
  }
  QuantizeOptions qo;
  qo.to = flags & 128 ? Convention::mlx : Convention::compressed_tensors;
  qo.spec.mode = flags & 128 ? Mode::affine : Mode::nvfp4;
  qo.force = true;
  if (!attempt([&] { quantize_checkpoint(model, out / "q", qo); })) return 0;
  check_side_files(out / "q", side);
  try {  // so must what quantize writes (a float tensor named like a part of a layer it writes)
    check_loaded(load_checkpoint(out / "q"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "invariant violated: quantized checkpoint does not load back: %s\n", e.what());
    std::abort();
  }
  return 0;
}
