// quantize / dequantize / convert / inspect of whole checkpoints, and in-memory load / save.
//
// Every streaming operation first plans: each output shard gets the items (a tensor, or a
// quantized layer) whose primary input tensor lives in the same input shard, with the entries
// they will write, so that a conversion that cannot happen fails before anything is written.
// Then shards are written one at a time, an item at a time, releasing input pages as it goes,
// into a staging directory that replaces the output only once everything is written (Staging).
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "io/ckpt_detail.hpp"
#include "microscale/codecs.hpp"

namespace microscale::io {

namespace {

using namespace ck;

// ---- values

bool has_values(StDType t) {
  switch (t) {
    case StDType::f32: case StDType::f16: case StDType::bf16: case StDType::f64:
    case StDType::f8_e4m3: case StDType::f8_e5m2: case StDType::f8_e8m0: return true;
    default: return false;
  }
}

double load(const std::byte* p, StDType t, std::size_t i) {
  switch (t) {
    case StDType::f32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case StDType::f64: { double v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case StDType::f16: { std::uint16_t h; std::memcpy(&h, p + 2 * i, 2); return decode_f16(h); }
    case StDType::bf16: { std::uint16_t h; std::memcpy(&h, p + 2 * i, 2); return decode_bf16(h); }
    case StDType::f8_e4m3: return decode_e4m3(static_cast<std::uint8_t>(p[i]));
    case StDType::f8_e5m2: return decode_e5m2(static_cast<std::uint8_t>(p[i]));
    case StDType::f8_e8m0: case StDType::u8: return decode_e8m0(static_cast<std::uint8_t>(p[i]));
    default: return NAN;
  }
}

TensorStats stats_of(std::span<const std::byte> data, StDType t, std::size_t n) {
  TensorStats s;
  if (!has_values(t) && t != StDType::u8) return s;
  s.valid = true;
  double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
  std::int64_t finite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = load(data.data(), t, i);
    if (!std::isfinite(v)) {
      ++s.nonfinite;
      continue;
    }
    ++finite;
    s.zeros += v == 0;
    sum += v;
    sq += v * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (finite) {
    s.min = lo;
    s.max = hi;
    s.mean = sum / static_cast<double>(finite);
    s.std = std::sqrt(std::max(0.0, sq / static_cast<double>(finite) - s.mean * s.mean));
    s.amax = std::max(std::fabs(lo), std::fabs(hi));
  }
  return s;
}

// NaN and Inf are the values with every exponent bit set, in each float format.
template <class Bits>
std::int64_t count_exponent_all_ones(std::span<const std::byte> data, Bits mask) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i + sizeof(Bits) <= data.size(); i += sizeof(Bits)) {
    Bits v;
    std::memcpy(&v, data.data() + i, sizeof(Bits));
    n += (v & mask) == mask;
  }
  return n;
}

std::int64_t count_nonfinite(std::span<const std::byte> data, StDType t) {
  switch (t) {
    case StDType::f32: return count_exponent_all_ones<std::uint32_t>(data, 0x7F800000u);
    case StDType::bf16: return count_exponent_all_ones<std::uint16_t>(data, 0x7F80u);
    case StDType::f16: return count_exponent_all_ones<std::uint16_t>(data, 0x7C00u);
    default: return 0;
  }
}

// A float view of a tensor's bytes; copies when the mapping is not aligned for the dtype.
TensorView view_of(std::span<const std::byte> data, StDType st, const Shape& shape, Tensor& storage) {
  const DType dt = *to_dtype(st);
  if (reinterpret_cast<std::uintptr_t>(data.data()) % dtype_size(dt) == 0) return TensorView(data.data(), dt, shape);
  storage = Tensor(dt, shape);
  std::memcpy(storage.bytes(), data.data(), data.size());
  return storage.view();
}

Tensor dequantize_layer(const Layer& l, DType dt) {
  Tensor sp, bp;
  const TensorView packed(l.packed.data(), DType::uint8, {l.rows(), l.cols() * l.bits / 8});
  const Shape sshape = {l.rows(), l.cols() / l.group};
  const TensorView scales = l.mode == Mode::affine ? view_of(l.scales, l.float_dtype, sshape, sp)
                                                   : TensorView(l.scales.data(), DType::uint8, sshape);
  TensorView biases;
  if (l.mode == Mode::affine) biases = view_of(l.biases, l.float_dtype, sshape, bp);
  try {
    return dequantize(packed, scales, l.mode == Mode::affine ? &biases : nullptr, l.spec(), dt);
  } catch (const Error& e) {
    throw Error("layer " + detail::quote(l.module) + ": " + e.what());
  }
}

void release_sources(const Checkpoint& ck, const Layer& l) {
  for (const std::string& s : l.sources) release(ck.tensor(s).data);
}

// ---- the output directory

// Present in a staging directory until it is complete: microscale refuses a directory holding it.
constexpr const char* kIncomplete = ".microscale-incomplete";

// The name Staging gives its directory: `.<name>.tmp.<pid>`, or with ".old" while it holds the
// output being replaced.
bool staging_name(const std::string& f) {
  const std::size_t t = f.find(".tmp.");
  return !f.empty() && f[0] == '.' && t != std::string::npos && t + 5 < f.size() && std::isdigit(static_cast<unsigned char>(f[t + 5]));
}

// Like open_input, but refuses the leftovers of a killed run: a staging directory (by its name,
// whatever state the kill left it in) or a directory holding the marker.
Input open_complete(const fs::path& path) {
  std::error_code ec;
  fs::path dir = fs::absolute(fs::is_directory(path, ec) ? path : path.parent_path().empty() ? fs::path(".") : path.parent_path());
  dir = dir.lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  if (staging_name(dir.filename().string()) || fs::exists(dir / kIncomplete, ec))
    throw Error(dir.string() + " is an unfinished microscale output (the run writing it was stopped); delete it "
                "and run the command again");
  return open_input(path);
}

bool process_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH); }

// The whole output is built in a hidden sibling `.<name>.tmp.<pid>` and moved into place at the
// end, swapped atomically with an existing directory (--force). A kill, a full disk or any error
// therefore leaves either the old result or the new one at `out`, never a mix; the staging
// directory is removed on errors (the CLI turns SIGINT/SIGTERM into one) and, after SIGKILL, by the
// next run. microscale refuses a leftover (by its name, and by a marker kept inside until commit);
// config.json is written last and deleted first, so loaders (which need it) find a leftover
// either complete or unloadable.
class Staging {
 public:
  Staging(const fs::path& in_dir, const fs::path& out, bool force) {
    std::error_code ec;
    out_ = fs::absolute(out).lexically_normal();
    if (out_.filename().empty()) out_ = out_.parent_path();  // "out/" names "out"
    if (fs::is_symlink(out_, ec)) {  // replace the target, keep the link
      out_ = fs::canonical(out_, ec);
      if (ec) throw Error("output " + out.string() + " is a symbolic link to nothing: " + ec.message());
    }
    if (out_.filename().empty()) throw Error("output directory " + out.string() + " is a file system root; choose another");
    if (fs::exists(out_, ec)) {
      if (!fs::is_directory(out_, ec)) throw Error("output " + out.string() + " exists and is not a directory");
      if (!in_dir.empty() && fs::equivalent(in_dir, out_, ec))
        throw Error("output directory " + out.string() + " is the input directory; choose another");
      if (!fs::is_empty(out_, ec)) {
        if (!force) throw Error("output directory " + out.string() + " is not empty (use --force to overwrite)");
        // The whole directory is replaced: only ever a model directory, never a home or a project.
        if (!holds_checkpoint(out_))
          throw Error("output directory " + out.string() + " is not empty and holds no checkpoint (no config.json or "
                      ".safetensors file); --force replaces only a previous output: choose a new directory");
      }
      replace_ = true;
    }
    const fs::path parent = out_.parent_path();
    fs::create_directories(parent, ec);
    if (ec) throw Error("cannot create output directory " + out.string() + ": " + ec.message());
    remove_dead_runs();
    tmp_ = parent / (prefix() + std::to_string(::getpid()));
    fs::remove_all(tmp_, ec);
    if (!fs::create_directory(tmp_, ec) || ec)
      throw Error("cannot create output directory " + tmp_.string() + ": " + (ec ? ec.message() : "it exists"));
    write_text_atomic(tmp_ / kIncomplete, "microscale is writing " + out_.string() + "\n");
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    std::error_code ec;
    if (!committed_) fs::remove_all(tmp_, ec);
  }

  const fs::path& dir() const { return tmp_; }
  const fs::path& out() const { return out_; }

  // Moves the finished output into place: files of the old directory that are not part of a
  // checkpoint (the user's own) are carried over, then the two directories are swapped.
  void commit() {
    if (replace_) {
      carry_over(out_, tmp_, true);
      std::error_code ec;
      fs::permissions(tmp_, fs::status(out_).permissions(), ec);
    }
    fs::remove(tmp_ / kIncomplete);
    if (!replace_) {
      if (::rename(tmp_.c_str(), out_.c_str()) != 0) throw Error(move_error(errno));
    } else if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, out_.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL && errno != ENOSYS) throw Error(move_error(errno));
      // No atomic exchange on this file system: move the old one aside first (the output is
      // briefly absent, never mixed).
      const fs::path aside = tmp_.string() + ".old";
      if (::rename(out_.c_str(), aside.c_str()) != 0) throw Error(move_error(errno));
      if (::rename(tmp_.c_str(), out_.c_str()) != 0) {
        const int err = errno;
        (void)::rename(aside.c_str(), out_.c_str());
        throw Error(move_error(err));
      }
      committed_ = true;
      std::error_code ec;
      fs::remove(aside / "config.json", ec);
      fs::remove_all(aside, ec);
      return;
    }
    committed_ = true;
    // After the exchange the staging directory holds the old output: its config.json goes first,
    // so that a kill while deleting the rest leaves nothing loadable.
    std::error_code ec;
    fs::remove(tmp_ / "config.json", ec);
    fs::remove_all(tmp_, ec);
  }

 private:
  std::string prefix() const { return "." + out_.filename().string() + ".tmp."; }

  std::string move_error(int err) const {
    return "cannot move the finished output " + tmp_.string() + " to " + out_.string() + ": " + std::strerror(err);
  }

  // Staging directories of runs that were killed (their process is gone).
  void remove_dead_runs() const {
    std::error_code ec;
    const std::string pre = prefix();
    for (const auto& e : fs::directory_iterator(out_.parent_path(), ec)) {
      const std::string f = e.path().filename().string();
      if (f.rfind(pre, 0) != 0) continue;
      char* end = nullptr;
      const long pid = std::strtol(f.c_str() + pre.size(), &end, 10);
      if (end != f.c_str() + pre.size() && !process_alive(pid)) fs::remove_all(e.path(), ec);
    }
  }

  static bool holds_checkpoint(const fs::path& dir) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename() == "config.json" || ends_with(e.path().filename().string(), ".safetensors")) return true;
    return false;
  }

  static bool is_checkpoint_file(const fs::path& name) {
    const std::string f = name.string();
    return ends_with(f, ".safetensors") || ends_with(f, ".safetensors.index.json") || f == "config.json" ||
           f == "hf_quant_config.json" || f == kIncomplete;
  }

  // Hard links (copies where links fail) of what `from` has and `to` lacks; at the top level,
  // checkpoint files of the old output are left behind, as are temporary files anywhere.
  static void carry_over(const fs::path& from, const fs::path& to, bool top) {
    for (const auto& e : fs::directory_iterator(from)) {
      const fs::path name = e.path().filename();
      const fs::path dst = to / name;
      if ((top && is_checkpoint_file(name)) || name.string().find(".tmp.") != std::string::npos) continue;
      if (e.is_directory() && !e.is_symlink()) {
        fs::create_directories(dst);
        carry_over(e.path(), dst, false);
        continue;
      }
      std::error_code ec;
      if (fs::exists(fs::symlink_status(dst))) continue;  // written by this run
      if (e.is_symlink()) {
        fs::copy_symlink(e.path(), dst);
        continue;
      }
      fs::create_hard_link(e.path(), dst, ec);
      if (ec) fs::copy_file(e.path(), dst);
    }
  }

  fs::path out_, tmp_;
  bool replace_ = false, committed_ = false;
};

// ---- the streaming pipeline

// glibc raises its mmap threshold after large frees, so per-tensor buffers of a few MB end up on
// the heap and stay resident after being freed; hand them back so the peak stays near one tensor.
void trim_heap() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

struct Item {
  std::size_t shard = 0;
  std::uint64_t order = 0;  // data offset of its primary tensor in that shard
  std::vector<StEntry> entries;
  std::uint64_t in_bytes = 0;
  std::string label;
  std::function<void(SafetensorsWriter&)> run;
};

std::size_t shard_no(const Input& in, const std::string& tensor) {
  const fs::path& p = in.ck.shard_of(tensor);
  const auto& all = in.ck.shards();
  return static_cast<std::size_t>(std::find(all.begin(), all.end(), p) - all.begin());
}

// A tensor written unchanged, reported as `action` ("copied", or "kept" with the reason a weight
// was not quantized).
Item passthrough(const Input& in, const std::string& name, Report& report, const char* action = "copied",
                 std::string reason = {}) {
  const StTensor& t = in.ck.tensor(name);
  Item it;
  it.shard = shard_no(in, name);
  it.order = t.begin;
  it.entries = {{name, t.dtype, t.shape}};
  it.in_bytes = t.data.size();
  it.label = name;
  it.run = [&in, name, action, reason = std::move(reason), &report](SafetensorsWriter& w) {
    const StTensor& src = in.ck.tensor(name);
    w.write(name, src.data);
    release(src.data);
    TensorReport r;
    r.name = name;
    r.action = action;
    r.format = src.dtype_name();
    r.shape = src.shape;
    r.bytes_in = r.bytes_out = src.data.size();
    r.reason = reason;
    report.tensors.push_back(std::move(r));
  };
  return it;
}

void write_emitted(SafetensorsWriter& w, const std::vector<Out>& outs, TensorReport* r) {
  for (const Out& o : outs) {
    w.write(o.entry.name, o.bytes());
    if (r) r->bytes_out += o.bytes().size();
  }
}

std::vector<StEntry> entries_of(const std::vector<Out>& outs) {
  std::vector<StEntry> e;
  for (const Out& o : outs) e.push_back(o.entry);
  return e;
}

// Writes every shard (same relative names as the input) and the index when the input had one.
void execute(const Input& in, const fs::path& out, std::vector<Item>& items, bool mlx,
                           const ProgressFn& progress, Report& report) {
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return std::tie(a.shard, a.order) < std::tie(b.shard, b.order); });
  Progress pr;
  pr.total = items.size();
  for (const Item& it : items) pr.bytes_total += it.in_bytes;
  std::vector<fs::path> shards;
  std::size_t next = 0;
  for (std::size_t s = 0; s < in.shard_rel.size(); ++s) {
    const std::size_t first = next;
    while (next < items.size() && items[next].shard == s) ++next;
    if (first == next && in.indexed) continue;  // every tensor of this shard moved elsewhere
    std::vector<StEntry> entries;
    for (std::size_t i = first; i < next; ++i)
      entries.insert(entries.end(), items[i].entries.begin(), items[i].entries.end());
    Metadata md = in.ck.shard(s).metadata();
    if (mlx) md["format"] = "mlx";  // what mlx.core.save_safetensors writes
    const fs::path path = out / in.shard_rel[s];
    fs::create_directories(path.parent_path());
    SafetensorsWriter w(path, std::move(entries), md);
    for (std::size_t i = first; i < next; ++i) {
      items[i].run(w);
      trim_heap();
      ++pr.done;
      pr.bytes_done += items[i].in_bytes;
      pr.current = items[i].label;
      if (progress) progress(pr);
    }
    w.finish();
    shards.push_back(path);
    report.bytes_out += fs::file_size(path);
  }
  report.shards = shards.size();
  report.bytes_in = pr.bytes_total;
  if (in.indexed) write_index(out / in.index_name, shards, in.ck.metadata());
}

// The rest of the output in the staging directory: the input's other files, hf_quant_config.json,
// then config.json last. With `dtype`, the config's torch_dtype says what the weights now are.
void finish_dir(const Input& in, const Staging& st, std::optional<Convention> to, const QuantMeta& meta,
                Report& report, std::optional<DType> dtype = std::nullopt) {
  for (std::string& n : copy_other_files(in.dir, st.dir())) report.notes.push_back(std::move(n));
  // An output inside the input directory: its old files and other runs' staging directories
  // are not part of the model.
  std::error_code ec;
  const fs::path in_abs = fs::absolute(in.dir).lexically_normal();
  const fs::path rel = st.out().lexically_relative(in_abs);
  if (!rel.empty() && *rel.begin() != "..") fs::remove_all(st.dir() / rel, ec);
  for (const auto& e : fs::directory_iterator(st.dir(), ec))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) fs::remove_all(e.path(), ec);

  Json config = in.config;
  if (config.is_null() && to) report.notes.push_back("the input has no config.json; wrote one holding only the quantization block");
  if (config.is_null() && !to) return;
  Json hf = apply_config(config, to, meta);
  if (dtype)
    for (const char* k : {"torch_dtype", "dtype"})
      if (k == std::string("torch_dtype") || config.contains(k)) config[k] = dtype_name(*dtype);
  if (!hf.is_null()) write_text_atomic(st.dir() / "hf_quant_config.json", hf.dump(2) + "\n");
  write_text_atomic(st.dir() / "config.json", config.dump(2) + "\n");
}

// Weights left in high precision that the configs' ignore lists name: every kind of Linear weight
// (embeddings and norms are not Linear layers, so no loader looks them up).
bool ignorable(const std::string& reason) { return reason != "embedding" && reason != "norm"; }

// Stacked expert tensors ([experts, ...], all experts of a layer in one tensor).
bool stacked_experts(std::string_view name, const Shape& shape) {
  return shape.size() >= 3 && name.find("experts") != std::string_view::npos;
}

// What a user takes for a weight: every `.weight` of two or more dimensions, and stacked experts.
// Each one left unquantized is reported with its reason.
bool looks_like_weight(std::string_view name, const Shape& shape) {
  return (ends_with(name, ".weight") && shape.size() >= 2) || stacked_experts(name, shape);
}

// The module a weight-like tensor belongs to (stacked experts are parameters of their module).
std::string owner_module(const std::string& name) {
  if (ends_with(name, ".weight")) return module_of(name);
  const std::size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// GPT-2's Conv1D layers store their weight [in, out], transposed from Linear's [out, in]:
// quantized as stored, groups would run along the output axis. Names alone are not enough
// (GPT-BigCode uses the same names for Linear layers), so the config decides when it names the
// model type.
bool conv1d_weight(const Json& config, const std::string& module) {
  const std::string last = module.substr(module.rfind('.') + 1);
  if (last != "c_attn" && last != "c_fc" && last != "c_proj" && last != "q_attn") return false;
  if (!config.is_object()) return true;
  if (auto a = config.find("architectures"); a != config.end() && a->is_array())
    for (const Json& arch : *a)
      if (arch.is_string())
        for (const char* p : {"GPT2", "OpenAIGPT", "ImageGPT", "DecisionTransformer"})
          if (arch.get<std::string>().rfind(p, 0) == 0) return true;
  const auto t = config.find("model_type");
  if (t == config.end() || !t->is_string()) return true;
  const std::string type = t->get<std::string>();
  return type == "gpt2" || type == "openai-gpt" || type == "imagegpt" || type == "decision_transformer";
}

// Adds the module of a tensor left in high precision to the configs' ignore list, when loaders
// would otherwise take it for a quantized Linear.
void add_ignored(std::vector<std::string>& ignore, const std::string& name, const Shape& shape, StDType dtype) {
  if (!looks_like_weight(name, shape) || !ignorable(why_kept(name, shape, dtype))) return;
  const std::string m = owner_module(name);
  if (std::find(ignore.begin(), ignore.end(), m) == ignore.end()) ignore.push_back(m);
}

// "a (why), b (why), ..." for an error message, at most `limit` entries.
std::string list_reasons(const std::vector<std::pair<std::string, std::string>>& items, std::size_t limit = 40) {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < limit; ++i)
    out += (i ? ", " : "") + detail::quote(items[i].first) + (items[i].second.empty() ? "" : " (" + items[i].second + ")");
  if (items.size() > limit) out += ", and " + std::to_string(items.size() - limit) + " more";
  return out;
}

void check_unsupported(const Detected& d) {
  if (!d.strays.empty()) {
    const std::string& n = d.strays[0];
    throw Error("tensor " + detail::quote(n) + " is named like a part of quantized layer " +
                detail::quote(module_of(n)) + ", but the " + d.convention +
                " layout does not use it (a mix of layouts?); remove or rename it" +
                (d.strays.size() > 1 ? " (and " + std::to_string(d.strays.size() - 1) + " more like it)" : ""));
  }
  if (d.unsupported.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < d.unsupported.size() && i < 3; ++i) list += (i ? ", " : "") + detail::quote(d.unsupported[i]);
  throw Error("checkpoint holds quantized tensors microscale cannot read (e.g. " + list +
              "); supported: compressed-tensors nvfp4/mxfp4-pack-quantized, ModelOpt NVFP4, MLX");
}

double rel_error(const TensorView& w, const Tensor& y, double* sqnr) {
  const auto n = static_cast<std::size_t>(w.numel());
  const StDType st = to_st_dtype(w.dtype);
  const auto* p = static_cast<const std::byte*>(w.data);
  double err = 0, energy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double a = load(p, st, i), b = y.data<float>()[i];
    if (!std::isfinite(a) || !std::isfinite(b)) continue;
    err += (a - b) * (a - b);
    energy += a * a;
  }
  *sqnr = err > 0 ? 10 * std::log10(energy / err) : INFINITY;
  return energy > 0 ? std::sqrt(err / energy) : 0.0;
}

}  // namespace

// ---- quantize

Report quantize_checkpoint(const fs::path& in_path, const fs::path& out, const QuantizeOptions& opt) {
  const Input in = open_complete(in_path);
  const Detected det = detect(in.ck, in.config);
  if (!det.layers.empty())
    throw Error(in_path.string() + " is already quantized (" + det.convention +
                "); use microscale convert or microscale dequantize");
  if (!det.unsupported.empty()) {  // e.g. an FP8 release: convert and dequantize cannot read it either
    std::string list;
    for (std::size_t i = 0; i < det.unsupported.size() && i < 3; ++i) {
      const std::string& n = det.unsupported[i];
      list += (i ? ", " : "") + detail::quote(n) + " " + st_dtype_name(in.ck.tensor(n).dtype);
    }
    throw Error(in_path.string() + " holds weights already quantized in a format microscale does not read (" + list +
                "; FP8 and other quantized sources are not supported yet). Start from the model's float "
                "(bfloat16/float16/float32) release, or dequantize this one to float with its own tools first");
  }

  QuantSpec base = opt.spec;
  base.global_scale.reset();
  base.layout = Layout::compact;  // every checkpoint layout stores compact scales
  if (opt.to == Convention::compressed_tensors && base.mode == Mode::mxfp4 && !opt.scale_rule_set)
    base.scale_rule = ScaleRule::even;  // llm-compressor's rule: same bytes as its own export
  base = resolve(base);
  if (opt.to == Convention::mlx && base.mode == Mode::mxfp8 && base.elem != Elem::e4m3)
    throw Error("MLX mxfp8 is E4M3; E5M2 elements have no MLX layout");
  // CT and ModelOpt store a global scale (three-level); mlx-lm's nvfp4 is two-level.
  const bool three = base.mode == Mode::nvfp4 && opt.to != Convention::mlx;

  Report report;
  // Select, and plan the layers as skeletons (shapes, no data) to validate the layout up front.
  struct Sel {
    std::string name, module;
    Layer skel;
  };
  std::vector<Sel> chosen;
  std::vector<std::string> ignore;
  std::map<std::string, std::string> kept;  // weight-like tensor -> why it stays in high precision
  std::vector<std::pair<std::string, std::string>> kept_list;  // the same, in checkpoint order
  std::map<std::string, std::string> weight_modules;  // module -> why kept ("" when quantized)
  std::vector<std::string> conv1d;
  std::set<std::string> all_modules;
  for (const std::string& n : in.ck.names()) {
    const StTensor& t = in.ck.tensor(n);
    all_modules.insert(module_of(n));
    if (!looks_like_weight(n, t.shape)) continue;  // biases, norms, buffers: copied
    std::string reason = why_kept(n, t.shape, t.dtype);
    const std::string m = owner_module(n);
    if (t.shape.size() != 2)
      reason = std::to_string(t.shape.size()) + "-D" + (stacked_experts(n, t.shape) ? " stacked experts" : "") +
               ": the exported layouts quantize 2-D Linear weights only";
    else if (reason.rfind("dtype", 0) == 0)
      reason += ": only float32, float16 and bfloat16 weights are quantized";
    const bool semantic = reason == "lm_head" || reason == "embedding" || reason == "router" || reason == "norm";
    if (semantic && matches(opt.include, m)) reason.clear();
    if (reason.empty() && matches(opt.exclude, m)) reason = "excluded";
    if (reason.empty() && t.shape[1] % base.group_size != 0)
      reason = "K = " + std::to_string(t.shape[1]) + " is not a multiple of the group size " + std::to_string(base.group_size);
    if (!weight_modules.count(m) || !reason.empty()) weight_modules[m] = reason;
    if (!reason.empty()) {
      kept[n] = reason;
      kept_list.emplace_back(n, reason);
      if (ignorable(reason) && std::find(ignore.begin(), ignore.end(), m) == ignore.end()) ignore.push_back(m);
      continue;
    }
    if (conv1d_weight(in.config, m)) conv1d.push_back(n);
    Layer l;
    l.module = m;
    l.mode = base.mode;
    l.group = base.group_size;
    l.bits = base.bits;
    l.shape = t.shape;
    l.float_dtype = t.dtype;
    if (three) l.global = {Global::amax, 1.0f};
    chosen.push_back({n, m, std::move(l)});
  }

  // Patterns and module names that select nothing are typos: refuse them.
  auto example = [&] {
    return weight_modules.empty() ? std::string("this checkpoint has no weights")
                                  : "modules are named like " + detail::quote(weight_modules.begin()->first);
  };
  for (const std::string& p : opt.exclude)
    if (std::none_of(all_modules.begin(), all_modules.end(), [&](const std::string& m) { return matches({p}, m); }))
      throw Error("--exclude " + detail::quote(p) + " matches no module (" + example() + ")");
  for (const std::string& p : opt.include) {
    std::vector<std::pair<std::string, std::string>> hit;
    bool used = false;
    for (const auto& [m, why] : weight_modules)
      if (matches({p}, m)) {
        used = used || why.empty();
        hit.emplace_back(m, why);
      }
    if (hit.empty()) throw Error("--include " + detail::quote(p) + " matches no weight (" + example() + ")");
    if (!used) throw Error("--include " + detail::quote(p) + " selects nothing that can be quantized: " + list_reasons(hit));
  }
  for (const auto& [m, amax] : opt.activation_amax) {
    const auto w = weight_modules.find(m);
    if (w == weight_modules.end())
      throw Error("--activation-amax names " + detail::quote(m) + ", which is no module of this checkpoint (" + example() + ")");
    if (!w->second.empty())
      throw Error("--activation-amax names " + detail::quote(m) + ", which is not quantized (" + w->second + ")");
  }
  if (!conv1d.empty()) {
    std::vector<std::pair<std::string, std::string>> names;
    for (const std::string& n : conv1d) names.emplace_back(n, "");
    throw Error("GPT-2 style Conv1D weights are stored [in, out], transposed from Linear's [out, in], and microscale "
                "does not quantize them yet (groups would run along the wrong axis): " + list_reasons(names, 6) +
                ". Keep them in high precision with --exclude c_attn --exclude c_fc --exclude c_proj");
  }
  if (chosen.empty())
    throw Error("no weights to quantize in " + in_path.string() +
                (kept_list.empty() ? std::string(": it has no 2-D .weight tensors") : ": " + list_reasons(kept_list)));

  // Activation scales: only from the user's calibration; refuse W4A4 without them.
  const bool w4a4 = opt.w4a4 || !opt.activation_amax.empty();
  if (w4a4) {
    if (base.mode != Mode::nvfp4 || opt.to == Convention::mlx)
      throw Error("static activation scales (W4A4) exist for nvfp4 with --export compressed-tensors or modelopt only");
    for (Sel& s : chosen) {
      auto it = opt.activation_amax.find(s.module);
      if (it == opt.activation_amax.end())
        throw Error("W4A4 needs a static activation amax for every quantized layer (microscale does not calibrate); "
                    "missing for " + detail::quote(s.module) +
                    ". Supply them all with --activation-amax, or drop --w4a4 for a weight-only (NVFP4A16) export");
      if (!std::isfinite(it->second) || it->second < 0)
        throw Error("activation amax of " + detail::quote(s.module) + " is not a finite non-negative number");
      s.skel.act = Global{Global::amax, it->second};
    }
  }
  QuantMeta meta;
  meta.w4a4 = w4a4;
  meta.ignore = ignore;
  for (const Sel& s : chosen) {
    (void)emit(s.skel, opt.to);  // throws if the layout cannot hold this mode
    meta.layers.push_back(&s.skel);
  }

  // Fused groups share the largest amax of their members (vLLM keeps one scale per fused GEMM).
  std::map<std::string, float> shared;
  if (three && opt.share_fused_scales) {
    std::vector<std::string> mods;
    std::map<std::string, const std::string*> tensor_of;
    for (const Sel& s : chosen) {
      mods.push_back(s.module);
      tensor_of[s.module] = &s.name;
    }
    const auto groups = fused_groups(mods);
    for (const auto& g : groups) {
      float mx = 0;
      for (const std::string& m : g) {
        const StTensor& t = in.ck.tensor(*tensor_of[m]);
        Tensor storage;
        mx = std::max(mx, global_scale(view_of(t.data, t.dtype, t.shape, storage)));
        release(t.data);
      }
      for (const std::string& m : g) shared[m] = mx;
    }
    if (!groups.empty())
      report.notes.push_back(std::to_string(groups.size()) +
                             " fused groups (q/k/v, gate/up, ...) share one global scale each: the largest amax of "
                             "their members, as ModelOpt and llm-compressor export them");
  }

  std::vector<Item> items;
  std::map<std::string, const Sel*> by_name;
  for (const Sel& s : chosen) by_name[s.name] = &s;
  for (const std::string& n : in.ck.names()) {
    auto sel = by_name.find(n);
    if (sel == by_name.end()) {
      const auto k = kept.find(n);
      items.push_back(k == kept.end() ? passthrough(in, n, report) : passthrough(in, n, report, "kept", k->second));
      continue;
    }
    const Sel& s = *sel->second;
    const StTensor& t = in.ck.tensor(n);
    Item it;
    it.shard = shard_no(in, n);
    it.order = t.begin;
    it.entries = entries_of(emit(s.skel, opt.to));
    it.in_bytes = t.data.size();
    it.label = s.module;
    it.run = [&, sp = &s](SafetensorsWriter& w) {
      const StTensor& src = in.ck.tensor(sp->name);
      const std::int64_t nonfinite = count_nonfinite(src.data, src.dtype);
      if (nonfinite && base.nonfinite == NonFinite::error)
        throw Error("tensor " + detail::quote(sp->name) + " has " + std::to_string(nonfinite) + " non-finite values (NaN/Inf) of " +
                    std::to_string(src.numel()) + "; repair the checkpoint, or pass --nonfinite propagate (NaN/Inf stay "
                    "in the blocks they hit) or saturate");
      Tensor storage;
      const TensorView x = view_of(src.data, src.dtype, src.shape, storage);
      QuantSpec spec = base;
      if (three) {
        auto sh = shared.find(sp->module);
        spec.global_scale = sh != shared.end() ? sh->second : global_scale(x);
      }
      Quantized q;
      try {
        q = quantize(x, spec);
      } catch (const Error& e) {
        throw Error("tensor " + detail::quote(sp->name) + ": " + e.what());
      }
      Layer l = sp->skel;
      l.packed = {q.packed.bytes(), q.packed.nbytes()};
      l.scales = {q.scales.bytes(), q.scales.nbytes()};
      if (q.spec.mode == Mode::affine) l.biases = {q.biases.bytes(), q.biases.nbytes()};
      l.global = three ? Global{Global::amax, *q.spec.global_scale} : Global{};
      TensorReport r;
      r.name = sp->module;
      r.action = "quantized";
      r.format = name(q.spec.mode);
      r.shape = src.shape;
      r.bytes_in = src.data.size();
      r.nonfinite = nonfinite;
      write_emitted(w, emit(l, opt.to), &r);
      if (opt.measure_error) r.rel_error = rel_error(x, dequantize(q, DType::float32), &r.sqnr_db);
      release(src.data);
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }

  Staging st(in.dir, out, opt.force);
  execute(in, st.dir(), items, opt.to == Convention::mlx, opt.progress, report);
  finish_dir(in, st, opt.to, meta, report);
  st.commit();
  return report;
}

// ---- dequantize

namespace {

// The float dtype the quantized checkpoint was made from: config.json's torch_dtype (or dtype,
// its newer name), else the dtype of MLX affine scales, else bfloat16 (with a note).
DType source_dtype(const Input& in, const Detected& det, Report& report) {
  if (in.config.is_object())
    for (const char* k : {"torch_dtype", "dtype"})
      if (auto it = in.config.find(k); it != in.config.end() && it->is_string()) {
        const std::string v = it->get<std::string>();
        for (DType d : {DType::float32, DType::float16, DType::bfloat16})
          if (v == dtype_name(d)) return d;
      }
  for (const Layer& l : det.layers)
    if (l.mode == Mode::affine)
      if (const auto d = to_dtype(l.float_dtype); d && is_float(*d)) return *d;
  report.notes.push_back("the source dtype is not recorded (no torch_dtype in config.json): wrote bfloat16; choose "
                         "another with --dtype");
  return DType::bfloat16;
}

}  // namespace

Report dequantize_checkpoint(const fs::path& in_path, const fs::path& out, const DequantizeOptions& opt) {
  if (opt.dtype && !is_float(*opt.dtype))
    throw Error(std::string("dequantize: output dtype must be a float type, got ") + dtype_name(*opt.dtype));
  const Input in = open_complete(in_path);
  const Detected det = detect(in.ck, in.config);
  check_unsupported(det);
  if (det.layers.empty()) throw Error(in_path.string() + " holds no quantized layers; nothing to dequantize");
  Report report;
  const DType dtype = opt.dtype ? *opt.dtype : source_dtype(in, det, report);
  std::vector<Item> items;
  std::size_t acts = 0;
  for (const Layer& l : det.layers) {
    Item it;
    it.shard = shard_no(in, l.sources[0]);
    it.order = in.ck.tensor(l.sources[0]).begin;
    it.entries = {{l.module + ".weight", to_st_dtype(dtype), l.shape}};
    for (const std::string& s : l.sources) it.in_bytes += in.ck.tensor(s).data.size();
    it.label = l.module;
    acts += l.act.has_value();
    it.run = [&, lp = &l, bytes = it.in_bytes](SafetensorsWriter& w) {
      const Tensor y = dequantize_layer(*lp, dtype);
      w.write_tensor(lp->module + ".weight", y);
      release_sources(in.ck, *lp);
      TensorReport r;
      r.name = lp->module;
      r.action = "dequantized";
      r.format = name(lp->mode);
      r.shape = lp->shape;
      r.bytes_in = bytes;
      r.bytes_out = y.nbytes();
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }
  for (const std::string& n : in.ck.names())
    if (!det.consumed.count(n)) items.push_back(passthrough(in, n, report));
  if (acts) report.notes.push_back(std::to_string(acts) + " activation scales dropped (the output is not quantized)");

  Staging st(in.dir, out, opt.force);
  execute(in, st.dir(), items, false, opt.progress, report);
  finish_dir(in, st, std::nullopt, {}, report, dtype);
  st.commit();
  return report;
}

// ---- convert

Report convert_checkpoint(const fs::path& in_path, const fs::path& out, const ConvertOptions& opt) {
  const Input in = open_complete(in_path);
  Detected det = detect(in.ck, in.config);
  check_unsupported(det);
  if (det.layers.empty()) throw Error(in_path.string() + " holds no quantized layers to convert");
  Report report;

  // Activation scales survive only when every layer has one and the target stores them.
  const std::size_t acts = static_cast<std::size_t>(
      std::count_if(det.layers.begin(), det.layers.end(), [](const Layer& l) { return l.act.has_value(); }));
  const bool w4a4 = acts == det.layers.size() && opt.to != Convention::mlx;
  if (acts && !w4a4) {
    report.notes.push_back(std::to_string(acts) + " activation scales dropped: " +
                           (opt.to == Convention::mlx ? std::string("MLX is weight-only")
                                                      : "only some layers have one, so the export is weight-only"));
    for (Layer& l : det.layers) l.act.reset();
  }

  // Fused groups whose global scales differ: never merged silently.
  std::map<std::string, float> unify;  // module -> common amax to re-quantize with
  {
    std::vector<std::string> mods;
    std::map<std::string, const Layer*> by;
    for (const Layer& l : det.layers)
      if (l.mode == Mode::nvfp4 && l.global.kind != Global::none) {
        mods.push_back(l.module);
        by[l.module] = &l;
      }
    for (const auto& g : fused_groups(mods)) {
      float lo = INFINITY, hi = 0;
      std::string list;
      for (const std::string& m : g) {
        const float a = by[m]->global.to_amax();
        lo = std::min(lo, a);
        hi = std::max(hi, a);
        list += (list.empty() ? "" : ", ") + m + " " + fmt_float(a);
      }
      if (lo == hi) continue;
      if (opt.unify_fused_scales) {
        for (const std::string& m : g) unify[m] = hi;
        report.notes.push_back("re-quantized fused group to its common max amax " + fmt_float(hi) + ": " + list);
      } else {
        report.notes.push_back("fused group with differing global scales kept per shard (amax " + list +
                               "); vLLM merges them with max() and mis-scales the others: pass "
                               "--unify-fused-scales to re-quantize the group to one scale");
      }
    }
  }

  QuantMeta meta;
  meta.w4a4 = w4a4;
  for (const Layer& l : det.layers) {
    Layer probe = l;
    if (unify.count(l.module)) probe.global = {Global::amax, unify[l.module]};
    (void)emit(probe, opt.to);  // all-or-nothing: throws before any file is written
    meta.layers.push_back(&l);
  }
  for (const std::string& n : in.ck.names()) {
    if (det.consumed.count(n)) continue;
    const StTensor& t = in.ck.tensor(n);
    add_ignored(meta.ignore, n, t.shape, t.dtype);
  }

  std::vector<Item> items;
  for (const Layer& l : det.layers) {
    Item it;
    it.shard = shard_no(in, l.sources[0]);
    it.order = in.ck.tensor(l.sources[0]).begin;
    Layer probe = l;
    if (unify.count(l.module)) probe.global = {Global::amax, unify[l.module]};
    it.entries = entries_of(emit(probe, opt.to));
    for (const std::string& s : l.sources) it.in_bytes += in.ck.tensor(s).data.size();
    it.label = l.module;
    it.run = [&, lp = &l, bytes = it.in_bytes](SafetensorsWriter& w) {
      TensorReport r;
      r.name = lp->module;
      r.action = "converted";
      r.format = name(lp->mode);
      r.shape = lp->shape;
      r.bytes_in = bytes;
      if (auto u = unify.find(lp->module); u != unify.end()) {
        const Tensor y = dequantize_layer(*lp, DType::float32);
        QuantSpec spec = lp->spec();
        spec.global_scale = u->second;
        const Quantized q = quantize(y.view(), spec);
        Layer l2 = *lp;
        l2.packed = {q.packed.bytes(), q.packed.nbytes()};
        l2.scales = {q.scales.bytes(), q.scales.nbytes()};
        l2.global = {Global::amax, u->second};
        write_emitted(w, emit(l2, opt.to), &r);
        r.action = "re-quantized";
      } else {
        write_emitted(w, emit(*lp, opt.to), &r);
      }
      release_sources(in.ck, *lp);
      report.tensors.push_back(std::move(r));
    };
    items.push_back(std::move(it));
  }
  for (const std::string& n : in.ck.names())
    if (!det.consumed.count(n)) items.push_back(passthrough(in, n, report));

  Staging st(in.dir, out, opt.force);
  execute(in, st.dir(), items, opt.to == Convention::mlx, opt.progress, report);
  finish_dir(in, st, opt.to, meta, report);
  st.commit();
  return report;
}

// ---- inspect

InspectResult inspect_checkpoint(const fs::path& path, bool stats, const ProgressFn& progress) {
  const Input in = open_complete(path);
  const Detected det = detect(in.ck, in.config);
  InspectResult res;
  res.convention = det.convention;
  if (in.config.is_object())
    for (const char* k : {"quantization_config", "quantization"})
      if (auto it = in.config.find(k); it != in.config.end()) {
        res.config = std::string(k) + " " + it->dump();
        break;
      }
  if (std::error_code ec; fs::exists(in.dir / "hf_quant_config.json", ec)) res.config += (res.config.empty() ? "" : "; ") + std::string("hf_quant_config.json present");

  // tensor -> (layer, role)
  std::map<std::string, std::pair<const Layer*, std::string>> role;
  for (const Layer& l : det.layers)
    for (std::size_t i = 0; i < l.sources.size(); ++i) {
      const std::string& s = l.sources[i];
      std::string r = i == 0 ? "packed" : i == 1 ? "scales" : ends_with(s, ".biases") ? "biases"
                    : (ends_with(s, "input_global_scale") || ends_with(s, "input_scale")) ? "act" : "global";
      role[s] = {&l, r};
    }
  std::set<std::string> unsupported(det.unsupported.begin(), det.unsupported.end());
  Progress pr;
  pr.total = in.ck.names().size();
  for (const std::string& n : in.ck.names()) {
    const StTensor& t = in.ck.tensor(n);
    InspectRow row;
    row.name = n;
    row.dtype = t.dtype_name();
    row.shape = t.shape;
    if (auto it = role.find(n); it != role.end()) {
      const Layer& l = *it->second.first;
      const std::string& r = it->second.second;
      const std::string mode = name(l.mode);
      if (r == "packed") {
        row.format = mode + " packed";
        row.detail = "logical " + fmt_shape(l.shape) + ", group " + std::to_string(l.group) + ", " +
                     std::to_string(l.bits) + " bits" + (l.mode == Mode::nvfp4 ? ", " + l.global.describe() : "");
        if (stats) {
          const Tensor y = dequantize_layer(l, DType::float32);
          row.stats = stats_of({y.bytes(), y.nbytes()}, StDType::f32, static_cast<std::size_t>(y.numel()));
        }
      } else if (r == "scales") {
        const StDType code = l.mode == Mode::affine ? l.float_dtype
                             : l.mode == Mode::nvfp4 ? StDType::f8_e4m3 : StDType::f8_e8m0;
        row.format = mode + " scales" + (l.mode == Mode::affine ? "" : l.mode == Mode::nvfp4 ? " E4M3" : " E8M0");
        if (stats) row.stats = stats_of(t.data, code, static_cast<std::size_t>(t.numel()));
        if (stats && l.mode == Mode::nvfp4) {
          // Subnormal E4M3 scales (< 2^-6) keep fewer bits: typical of two-level (MLX) nvfp4.
          std::int64_t sub = 0;
          for (std::byte b : t.data) sub += (static_cast<unsigned>(b) & 0x78u) == 0 && (static_cast<unsigned>(b) & 7u) != 0;
          row.detail = std::to_string(sub) + " subnormal";
        }
      } else if (r == "biases") {
        row.format = mode + " biases";
        if (stats) row.stats = stats_of(t.data, t.dtype, static_cast<std::size_t>(t.numel()));
      } else if (r == "global") {
        row.format = mode + " global scale";
        row.detail = l.global.describe();
      } else {
        row.format = "activation scale";
        row.detail = l.act ? l.act->describe() : "";
        for (const char* from : {"weight_global_scale", "weight_scale_2"})
          if (auto p = row.detail.find(from); p != std::string::npos) row.detail.replace(p, std::strlen(from), ends_with(n, "input_scale") ? "input_scale" : "input_global_scale");
      }
    } else if (unsupported.count(n)) {
      row.format = "unsupported quantized";
    } else if (std::find(det.strays.begin(), det.strays.end(), n) != det.strays.end()) {
      row.format = "stray";
      row.detail = "named like a part of layer " + detail::quote(module_of(n)) + ", unused by " + det.convention;
    } else {
      row.format = "plain";
      const std::string why = why_kept(n, t.shape, t.dtype);
      row.detail = why.empty() ? "projection weight" : why == "not a .weight" ? "" : why;
      if (stats && has_values(t.dtype)) row.stats = stats_of(t.data, t.dtype, static_cast<std::size_t>(t.numel()));
    }
    release(t.data);
    trim_heap();
    res.rows.push_back(std::move(row));
    ++pr.done;
    pr.current = n;
    if (progress) progress(pr);
  }
  res.notes = det.notes;
  if (!det.layers.empty())
    res.notes.push_back(std::to_string(det.layers.size()) + " quantized layers (" + det.convention + ")");
  std::vector<std::string> mods;
  std::map<std::string, float> amax;
  for (const Layer& l : det.layers)
    if (l.mode == Mode::nvfp4 && l.global.kind != Global::none) {
      mods.push_back(l.module);
      amax[l.module] = l.global.to_amax();
    }
  std::size_t differing = 0;
  for (const auto& g : fused_groups(mods)) {
    bool same = true;
    for (const std::string& m : g) same = same && amax[m] == amax[g[0]];
    differing += !same;
  }
  if (differing)
    res.notes.push_back(std::to_string(differing) +
                        " fused groups (q/k/v, gate/up, ...) have differing global scales; vLLM would merge them with "
                        "max() (see microscale convert --unify-fused-scales)");
  return res;
}

// ---- in memory

CheckpointData load_checkpoint(const fs::path& path) {
  const Input in = open_complete(path);
  const Detected det = detect(in.ck, in.config);
  check_unsupported(det);
  CheckpointData data;
  data.convention = det.convention;
  for (const Layer& l : det.layers) {
    QuantizedLayer ql;
    ql.module = l.module;
    Quantized& q = ql.weight;
    q.spec = l.spec();
    q.shape = l.shape;
    q.packed = Tensor(DType::uint8, {l.rows(), l.cols() * l.bits / 8});
    std::memcpy(q.packed.bytes(), l.packed.data(), l.packed.size());
    const Shape ss = {l.rows(), l.cols() / l.group};
    q.scales = Tensor(l.mode == Mode::affine ? *to_dtype(l.float_dtype) : DType::uint8, ss);
    std::memcpy(q.scales.bytes(), l.scales.data(), l.scales.size());
    if (l.mode == Mode::affine) {
      q.biases = Tensor(*to_dtype(l.float_dtype), ss);
      std::memcpy(q.biases.bytes(), l.biases.data(), l.biases.size());
    }
    if (l.act) ql.input_amax = l.act->to_amax();
    data.layers.push_back(std::move(ql));
  }
  for (const std::string& n : in.ck.names()) {
    if (det.consumed.count(n)) continue;
    const StTensor& t = in.ck.tensor(n);
    data.tensors.push_back({n, t.dtype, t.shape, std::vector<std::byte>(t.data.begin(), t.data.end())});
  }
  if (!in.config.is_null()) data.config_json = in.config.dump(2);
  return data;
}

void save_checkpoint(const fs::path& out, const CheckpointData& data, Convention to, bool force) {
  std::vector<Layer> layers;
  for (const QuantizedLayer& ql : data.layers) {
    const Quantized& q = ql.weight;
    const std::string& m = ql.module;
    const QuantSpec s = resolve(q.spec);
    if (q.shape.size() != 2) throw Error("layer " + detail::quote(m) + ": only 2-D weights, got " + fmt_shape(q.shape));
    const std::int64_t n = q.shape[0], k = q.shape[1];
    // Bounds before any shape arithmetic: k * bits must not wrap.
    if (n < 0 || k < 0 || k > std::numeric_limits<std::int64_t>::max() / 64)
      throw Error("layer " + detail::quote(m) + ": shape " + fmt_shape(q.shape) + " is out of range");
    if (k % s.group_size != 0) throw Error("layer " + detail::quote(m) + ": K is not a multiple of the group size");
    const Shape ps = {n, k * s.bits / 8}, ss = {n, k / s.group_size};
    const DType sd = s.mode == Mode::affine ? q.scales.dtype() : DType::uint8;
    if (q.packed.dtype() != DType::uint8 || q.packed.shape() != ps)
      throw Error("layer " + detail::quote(m) + ": packed must be uint8 " + fmt_shape(ps) + ", got " + dtype_name(q.packed.dtype()) + " " + fmt_shape(q.packed.shape()));
    if (q.scales.shape() != ss || q.scales.dtype() != sd || (s.mode == Mode::affine && !is_float(sd)))
      throw Error("layer " + detail::quote(m) + ": scales must be " + dtype_name(sd) + " " + fmt_shape(ss) + ", got " + dtype_name(q.scales.dtype()) + " " + fmt_shape(q.scales.shape()));
    if (s.mode == Mode::affine && (q.biases.shape() != ss || q.biases.dtype() != sd))
      throw Error("layer " + detail::quote(m) + ": biases must match the scales");
    if (s.layout != Layout::compact) throw Error("layer " + detail::quote(m) + ": checkpoints store compact scales");
    Layer l;
    l.module = m;
    l.mode = s.mode;
    l.group = s.group_size;
    l.bits = s.bits;
    l.shape = q.shape;
    if (s.global_scale) l.global = {Global::amax, *s.global_scale};
    if (ql.input_amax) l.act = Global{Global::amax, *ql.input_amax};
    l.packed = {q.packed.bytes(), q.packed.nbytes()};
    l.scales = {q.scales.bytes(), q.scales.nbytes()};
    if (s.mode == Mode::affine) {
      l.float_dtype = to_st_dtype(sd);
      l.biases = {q.biases.bytes(), q.biases.nbytes()};
    }
    layers.push_back(std::move(l));
  }
  if (layers.empty()) throw Error("save_checkpoint: no quantized layers given");
  // Activation scales are written for every layer or refused; never dropped.
  const auto with_act = static_cast<std::size_t>(
      std::count_if(layers.begin(), layers.end(), [](const Layer& l) { return l.act.has_value(); }));
  if (with_act != 0 && (to == Convention::mlx || with_act != layers.size() ||
                        std::any_of(layers.begin(), layers.end(), [](const Layer& l) { return l.mode != Mode::nvfp4; })))
    throw Error("save_checkpoint: " + std::to_string(with_act) + " of " + std::to_string(layers.size()) +
                " layers have an input_amax; static activation scales (W4A4) are written only for nvfp4 layers in "
                "the compressed-tensors or ModelOpt layout, with one on every layer");
  const bool w4a4 = with_act != 0;
  std::vector<StTensorData> all;
  std::vector<std::vector<Out>> keep;
  QuantMeta meta;
  meta.w4a4 = w4a4;
  for (Layer& l : layers) {
    if (!w4a4) l.act.reset();
    keep.push_back(emit(l, to));
    meta.layers.push_back(&l);
  }
  for (const auto& outs : keep)
    for (const Out& o : outs) all.push_back({o.entry.name, o.entry.dtype, o.entry.shape, o.bytes()});
  for (const RawTensor& t : data.tensors) {
    if (st_nbytes(t.dtype, t.shape) != t.data.size())
      throw Error("tensor " + detail::quote(t.name) + ": " + std::to_string(t.data.size()) + " bytes for " + st_dtype_name(t.dtype) + " " + fmt_shape(t.shape));
    all.push_back({t.name, t.dtype, t.shape, t.data});
    add_ignored(meta.ignore, t.name, t.shape, t.dtype);
  }
  Json config = data.config_json.empty() ? Json::object()
                                         : detail::parse_json(data.config_json, "config_json", "config", 256);
  Staging st({}, out, force);
  save_safetensors(st.dir() / "model.safetensors", all, to == Convention::mlx ? Metadata{{"format", "mlx"}} : Metadata{{"format", "pt"}});
  Json hf = apply_config(config, to, meta);
  if (!hf.is_null()) write_text_atomic(st.dir() / "hf_quant_config.json", hf.dump(2) + "\n");
  write_text_atomic(st.dir() / "config.json", config.dump(2) + "\n");
  st.commit();
}

}  // namespace microscale::io
