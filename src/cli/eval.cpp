#include "eval.hpp"

#include "microscale/checkpoint.hpp"
#include "microscale/runtime.hpp"
#include "output_files.hpp"
#include "plot.hpp"
#include "progress.hpp"
#include "synthetic_weights.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

namespace microscale::cli {

namespace {

namespace fs = std::filesystem;

QuantSpec make(Mode mode, int group = 0, int bits = 0, Elem elem = Elem::e4m3) {
  QuantSpec s;
  s.mode = mode;
  s.group_size = group;
  s.bits = bits;
  s.elem = elem;
  return s;
}

// The kind of generated weights each name of --matrices stands for.
WeightKind weight_kind(const std::string& matrix) {
  if (matrix == "student-t3") return WeightKind::student_t;
  return matrix == "outliers" ? WeightKind::outliers : WeightKind::gaussian;
}

// The matrix stored in `dtype` (raw bytes) and its exact f32 values.
struct Stored {
  std::vector<std::byte> bytes;
  std::vector<float> values;
};
Stored store(const std::vector<float>& w, DType dtype) {
  Stored s;
  s.values.resize(w.size());
  s.bytes.resize(w.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (dtype == DType::float32) {
      s.values[i] = w[i];
      std::memcpy(&s.bytes[i * 4], &w[i], 4);
    } else {
      const std::uint16_t h = dtype == DType::bfloat16 ? encode_bf16(w[i]) : encode_f16(w[i]);
      s.values[i] = dtype == DType::bfloat16 ? decode_bf16(h) : decode_f16(h);
      std::memcpy(&s.bytes[i * 2], &h, 2);
    }
  }
  return s;
}

float value_at(const Tensor& t, std::size_t i) {
  switch (t.dtype()) {
    case DType::float32: return t.data<float>()[i];
    case DType::bfloat16: return decode_bf16(t.data<std::uint16_t>()[i]);
    case DType::float16: return decode_f16(t.data<std::uint16_t>()[i]);
    default: throw Error("eval: unexpected output dtype");
  }
}

// After one untimed call: the first call of a process also pays for page faults of fresh
// allocations and for starting the thread pool.
template <class F>
double median_seconds(int repeats, F&& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<std::string> selected(const std::vector<std::string>& chosen, const std::vector<std::string>& all) {
  return chosen.empty() ? all : chosen;
}
std::vector<std::string> mode_names() {
  std::vector<std::string> n;
  for (const EvalMode& m : eval_modes()) n.push_back(m.name);
  return n;
}
const EvalMode* find_mode(const std::string& name) {
  for (const EvalMode& m : eval_modes())
    if (m.name == name) return &m;
  return nullptr;
}
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

const char* kHeader = "%-11s %-12s %8s %11s %9s %12s %12s %10s\n";
const char* kRow = "%-11s %-12s %8.3f %11.3e %9.2f %12.3f %12.3f %10.3f\n";

// Sums over the matrices (or tensors) one mode ran on.
struct Acc {
  double err = 0, energy = 0, tq = 0, td = 0, bytes = 0, bit_sum = 0;
  std::int64_t n = 0, nonfinite = 0;
  void add(const Acc& o) {
    err += o.err;
    energy += o.energy;
    tq += o.tq;
    td += o.td;
    bytes += o.bytes;
    bit_sum += o.bit_sum;
    n += o.n;
    nonfinite += o.nonfinite;
  }
};

// Quantizes and dequantizes `x` (exact values `values`, energy sum v^2) with one mode, timed.
Acc measure(const EvalMode& m, const TensorView& x, const std::vector<float>& values, double energy,
            const EvalOptions& opt) {
  QuantSpec spec = m.spec;
  if (m.global) spec.global_scale = global_scale(x);
  Quantized q;
  Acc a;
  // The previous result is released first, as a caller reusing the name would: keeping it alive
  // during the call would time fresh page faults for every output instead of the op.
  a.tq = median_seconds(opt.repeats, [&] {
    q = Quantized();
    q = quantize(x, spec);
  });
  Tensor y;
  a.td = median_seconds(opt.repeats, [&] {
    y = Tensor();
    y = dequantize(q, opt.out);
  });
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double d = static_cast<double>(values[i]) - value_at(y, i);
    a.err += d * d;
    a.nonfinite += std::isfinite(values[i]) ? 0 : 1;
  }
  a.energy = energy;
  a.n = x.numel();
  a.bytes = static_cast<double>(q.packed.nbytes() + q.scales.nbytes() +
                                (q.spec.mode == Mode::affine ? q.biases.nbytes() : 0)) +
            (m.global ? 4 : 0);
  a.bit_sum = bits_per_value(q.spec, x.dtype == DType::float32 ? 32 : 16) * static_cast<double>(a.n);
  return a;
}

EvalRow row_of(const std::string& matrix, const std::string& mode, const Acc& a) {
  EvalRow r;
  r.matrix = matrix;
  r.mode = mode;
  const double n = static_cast<double>(a.n);
  r.bits_per_value = a.n ? a.bit_sum / n : 0;
  const ErrorStats e = error_stats(a.err, a.energy);
  r.rel_error = e.rel_error;
  r.sqnr_db = e.sqnr_db;
  r.quant_gelems = a.tq > 0 ? n / a.tq / 1e9 : 0;
  r.dequant_gelems = a.td > 0 ? n / a.td / 1e9 : 0;
  r.size_bytes = a.bytes;
  r.elements = a.n;
  r.nonfinite_values = a.nonfinite;
  return r;
}

void print_row(const EvalRow& r) {
  std::printf(kRow, r.matrix.c_str(), r.mode.c_str(), r.bits_per_value, r.rel_error, r.sqnr_db, r.quant_gelems,
              r.dequant_gelems, r.size_bytes / 1e6);
  std::fflush(stdout);
}

// Exact f32 values of a float tensor view (contiguous).
std::vector<float> values_of(const TensorView& x) {
  std::vector<float> v(static_cast<std::size_t>(x.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto* p = static_cast<const std::byte*>(x.data);
    if (x.dtype == DType::float32) {
      std::memcpy(&v[i], p + 4 * i, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      v[i] = x.dtype == DType::bfloat16 ? decode_bf16(h) : decode_f16(h);
    }
  }
  return v;
}

double energy_of(const std::vector<float>& v) {
  double e = 0;
  for (float x : v) e += static_cast<double>(x) * x;
  return e;
}

std::string where_text() {
  return backend() == Backend::reference
             ? std::string("reference backend (scalar)")
             : "cpu backend, target " + cpu_target() + ", " + std::to_string(num_threads()) + " thread(s)";
}

// Says which weights hold NaN or Inf: their blocks dequantize to NaN (the propagate policy), so
// the pooled errors of every mode are NaN rather than a number that hides them.
void print_nonfinite_note(std::int64_t count, const std::vector<std::string>& tensors) {
  if (count == 0) return;
  std::printf(
      "note: %lld weight value%s NaN or Inf (in %s); blocks holding one dequantize to NaN, so rel.error "
      "and SQNR are nan (the CSV counts them in nonfinite_values)\n",
      static_cast<long long>(count), count == 1 ? " is" : "s are", join(tensors).c_str());
}

void print_table_header() {
  std::printf(kHeader, "matrix", "mode", "bits/val", "rel.error", "SQNR dB", "quant Gel/s", "deq Gel/s", "size MB");
  std::fflush(stdout);
}

// A 2-D float matrix, transposed: a GPT-2 Conv1D weight [in, out] as a Linear one [out, in].
Tensor transposed(const TensorView& x) {
  const auto rows = static_cast<std::size_t>(x.shape[0]), cols = static_cast<std::size_t>(x.shape[1]);
  const std::size_t size = dtype_size(x.dtype);
  Tensor t = Tensor::uninitialized(x.dtype, {x.shape[1], x.shape[0]});
  const auto* from = static_cast<const std::byte*>(x.data);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      std::memcpy(t.bytes() + (c * rows + r) * size, from + (r * cols + c) * size, size);
  return t;
}

// The projection weights of a model directory, one tensor at a time, each with its groups along
// its input dimension (quantize's rule: GPT-2 Conv1D weights, stored [in, out], are transposed).
std::vector<EvalRow> eval_model(const EvalOptions& opt, const std::vector<std::string>& modes) {
  const io::Checkpoint ck = io::Checkpoint::open(opt.model_dir);
  const std::vector<std::string> conv1d = io::conv1d_weights(opt.model_dir);
  std::vector<std::string> names;
  std::uint64_t bytes = 0;
  std::int64_t total = 0;
  for (const std::string& n : ck.names()) {
    const io::StTensor& t = ck.tensor(n);
    if (!io::why_kept(n, t.shape, t.dtype).empty()) continue;
    names.push_back(n);
    bytes += t.data.size();
    total += t.numel();
  }
  if (names.empty()) throw Error(opt.model_dir + ": no projection weights (2-D float *.weight) to evaluate");
  std::printf(
      "microscale eval: %zu projection weights of %s (%.2f M values, %.1f MB), dequantize to %s, median of %d "
      "runs, %s\n",
      names.size(), opt.model_dir.c_str(), static_cast<double>(total) / 1e6, static_cast<double>(bytes) / 1e6,
      dtype_name(opt.out), opt.repeats, where_text().c_str());
  std::printf(
      "errors pooled over all weights (sqrt of summed squared error over summed energy); size = all quantized "
      "weights.\n\n");
  std::map<std::string, Acc> acc;
  std::map<std::string, std::size_t> skipped;
  std::int64_t nonfinite = 0;
  std::vector<std::string> nonfinite_tensors;
  ProgressBar bar("eval");
  io::Progress pr;
  pr.total = names.size();
  pr.bytes_total = bytes;
  for (const std::string& n : names) {
    const io::StTensor& t = ck.tensor(n);
    Tensor storage;
    TensorView x;
    try {
      x = t.view();
    } catch (const Error&) {  // unaligned in its file
      storage = t.copy();
      x = storage.view();
    }
    if (std::find(conv1d.begin(), conv1d.end(), n) != conv1d.end()) {
      storage = transposed(x);
      x = storage.view();
    }
    const std::vector<float> v = values_of(x);
    const double energy = energy_of(v);
    if (const auto k = std::count_if(v.begin(), v.end(), [](float f) { return !std::isfinite(f); }); k > 0) {
      nonfinite += k;
      nonfinite_tensors.push_back(n);
    }
    for (const std::string& name : modes) {
      const EvalMode& m = *find_mode(name);
      if (x.shape[1] % resolve(m.spec).group_size != 0) {
        ++skipped[name];
        continue;
      }
      acc[name].add(measure(m, x, v, energy, opt));
    }
    ++pr.done;
    pr.bytes_done += t.data.size();
    pr.current = n;
    bar.update(pr);
  }
  bar.finish();
  ck.check_unchanged();  // a shard truncated under us read as zeros
  print_table_header();
  std::vector<EvalRow> rows;
  for (const std::string& name : modes) {
    rows.push_back(row_of("model", name, acc[name]));
    print_row(rows.back());
  }
  for (const auto& [name, k] : skipped)
    std::printf("note: %s skipped %zu weight(s) whose K is not a multiple of its group size\n", name.c_str(), k);
  print_nonfinite_note(nonfinite, nonfinite_tensors);
  if (!conv1d.empty())
    std::printf("note: %zu GPT-2 Conv1D weight(s) stored [in, out] (%s, ...) scored along their input dimension\n",
                conv1d.size(), conv1d.front().c_str());
  return rows;
}

}  // namespace

const std::vector<EvalMode>& eval_modes() {
  static const std::vector<EvalMode> modes = [] {
    std::vector<EvalMode> m;
    m.push_back({"nvfp4", make(Mode::nvfp4), false});
    m.push_back({"nvfp4-gs", make(Mode::nvfp4), true});
    m.push_back({"mxfp4", make(Mode::mxfp4), false});
    m.push_back({"mxfp8-e4m3", make(Mode::mxfp8, 0, 0, Elem::e4m3), false});
    m.push_back({"mxfp8-e5m2", make(Mode::mxfp8, 0, 0, Elem::e5m2), false});
    for (int g : {32, 64, 128}) m.push_back({"affine4-g" + std::to_string(g), make(Mode::affine, g, 4), false});
    m.push_back({"affine8-g64", make(Mode::affine, 64, 8), false});
    for (int b : {2, 3, 5, 6}) m.push_back({"affine" + std::to_string(b) + "-g64", make(Mode::affine, 64, b), false});
    return m;
  }();
  return modes;
}

const std::vector<std::string>& eval_matrices() {
  static const std::vector<std::string> m = {"gaussian", "student-t3", "outliers"};
  return m;
}

ErrorStats error_stats(double squared_error, double energy) {
  if (squared_error == 0) return {0.0, INFINITY};  // exact, all-zero weights included
  // NaN stays NaN; zero energy with an error gives an infinite relative error and -inf dB.
  return {std::sqrt(squared_error / energy), 10.0 * std::log10(energy / squared_error)};
}

void validate(const EvalOptions& opt) {
  if (opt.rows < 1) throw Error("--rows must be at least 1, got " + std::to_string(opt.rows));
  if (opt.cols < 1) throw Error("--cols must be at least 1, got " + std::to_string(opt.cols));
  if (opt.repeats < 1) throw Error("--repeats must be at least 1, got " + std::to_string(opt.repeats));
  if (!is_float(opt.dtype)) throw Error(std::string("--dtype must be a float type, got ") + dtype_name(opt.dtype));
  if (!is_float(opt.out)) throw Error(std::string("--out must be a float type, got ") + dtype_name(opt.out));
  std::vector<ReportPath> reports;
  if (!opt.csv.empty()) reports.push_back({"--csv", opt.csv});
  if (!opt.svg.empty()) reports.push_back({"--svg", opt.svg});
  if (!reports.empty())
    check_report_paths(reports, opt.model_dir.empty() ? io::RunInputs() : io::RunInputs(opt.model_dir));
  for (const std::string& name : opt.modes) {
    if (!find_mode(name)) throw Error("unknown mode '" + name + "'; modes: " + join(mode_names()));
    if (std::count(opt.modes.begin(), opt.modes.end(), name) > 1) throw Error("mode '" + name + "' is listed twice");
  }
  if (!opt.model_dir.empty()) return;  // a model's weights are checked one by one
  for (const std::string& name : opt.modes) {
    const EvalMode* m = find_mode(name);
    const QuantSpec s = resolve(m->spec);
    if (opt.cols % s.group_size != 0)
      throw Error("--cols " + std::to_string(opt.cols) + " is not a multiple of the group size " +
                  std::to_string(s.group_size) + " of mode " + name);
  }
  if (opt.modes.empty())
    for (const EvalMode& m : eval_modes())
      if (opt.cols % resolve(m.spec).group_size != 0)
        throw Error("--cols " + std::to_string(opt.cols) + " is not a multiple of the group size " +
                    std::to_string(resolve(m.spec).group_size) + " of mode " + m.name +
                    " (choose a multiple of 128, or pick --modes)");
  for (const std::string& name : opt.matrices)
    if (std::find(eval_matrices().begin(), eval_matrices().end(), name) == eval_matrices().end())
      throw Error("unknown matrix '" + name + "'; matrices: " + join(eval_matrices()));
}

std::vector<EvalRow> run_eval(const EvalOptions& opt) {
  validate(opt);
  const std::vector<std::string> modes = selected(opt.modes, mode_names());
  std::vector<EvalRow> rows, summary;
  if (!opt.model_dir.empty()) {
    rows = eval_model(opt, modes);
    summary = rows;
  } else {
    const std::vector<std::string> matrices = selected(opt.matrices, eval_matrices());
    const Shape shape = {opt.rows, opt.cols};
    std::printf("microscale eval: %lld x %lld %s weights, dequantize to %s, median of %d runs, %s\n",
                static_cast<long long>(opt.rows), static_cast<long long>(opt.cols), dtype_name(opt.dtype),
                dtype_name(opt.out), opt.repeats, where_text().c_str());
    std::printf(
        "bits/value counts scales (and affine biases) in the weights' dtype; nvfp4-gs is three-level\n"
        "nvfp4 with global_scale = amax (its 32-bit tensor scale is not counted); size is one matrix.\n\n");
    print_table_header();
    std::map<std::string, Acc> all;
    std::uint64_t seed = opt.seed;
    bool warm = false;
    for (const std::string& matrix : matrices) {
      const Stored w = store(synthetic_weights(weight_kind(matrix), opt.rows, opt.cols, seed++), opt.dtype);
      const TensorView x(w.bytes.data(), opt.dtype, shape);
      const double energy = energy_of(w.values);
      // Untimed work for a quarter second before the first measurement: the process's first
      // calls run several times slower (thread start-up, page faults, clock ramp).
      for (const auto start = std::chrono::steady_clock::now();
           !warm && std::chrono::steady_clock::now() - start < std::chrono::milliseconds(250);)
        dequantize(quantize(x, find_mode(modes.front())->spec), opt.out);
      warm = true;
      for (const std::string& name : modes) {
        const Acc a = measure(*find_mode(name), x, w.values, energy, opt);
        all[name].add(a);
        rows.push_back(row_of(matrix, name, a));
        print_row(rows.back());
      }
    }
    // One point per format: errors pooled over every matrix.
    std::printf("\n");
    for (const std::string& name : modes) {
      summary.push_back(row_of("all", name, all[name]));
      print_row(summary.back());
      rows.push_back(summary.back());
    }
  }

  std::vector<OutputFile> files;
  if (!opt.csv.empty()) {
    std::ostringstream f;
    f << "matrix,mode,elements,dtype,bits_per_value,rel_error,sqnr_db,quant_gelem_per_s,dequant_gelem_per_s,"
         "size_bytes,nonfinite_values\n";
    for (const EvalRow& r : rows)
      f << r.matrix << ',' << r.mode << ',' << r.elements << ','
        << (opt.model_dir.empty() ? dtype_name(opt.dtype) : "model") << ',' << r.bits_per_value << ',' << r.rel_error
        << ',' << r.sqnr_db << ',' << r.quant_gelems << ',' << r.dequant_gelems << ',' << r.size_bytes << ','
        << r.nonfinite_values << '\n';
    files.push_back({"--csv", opt.csv, f.str()});
  }
  if (!opt.svg.empty()) {
    std::vector<PlotPoint> pts;
    std::vector<std::string> unplotted;
    for (const EvalRow& r : summary) {
      pts.push_back({r.bits_per_value, r.rel_error, r.mode});
      if (!(r.rel_error > 0 && std::isfinite(r.rel_error))) unplotted.push_back(r.mode);
    }
    const std::string what = opt.model_dir.empty() ? "synthetic weights" : fs::path(opt.model_dir).filename().string();
    files.push_back({"--svg", opt.svg,
                     scatter_svg("relative error vs bits per value (" + what + ")", "bits per value (scales included)",
                                 "relative error (rms, log scale)", pts)});
    if (!unplotted.empty())
      std::printf("note: not plotted (rel.error zero, nan or inf on a log axis): %s\n", join(unplotted).c_str());
  }
  write_outputs(files);
  for (std::size_t i = 0; i < files.size(); ++i) std::printf("%swrote %s\n", i == 0 ? "\n" : "", files[i].path.c_str());
  return rows;
}

}  // namespace microscale::cli
