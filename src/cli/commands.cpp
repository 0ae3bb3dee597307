#include "commands.hpp"

#include <signal.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "microscale/checkpoint.hpp"
#include "output_files.hpp"
#include "progress.hpp"

namespace microscale::cli {

namespace {

namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void print_summary(const char* verb, const io::Report& r, const fs::path& out, double secs) {
  std::map<std::string, std::size_t> by_action;
  for (const io::TensorReport& t : r.tensors) ++by_action[io::name(t.action)];
  std::string parts;
  for (const auto& [a, n] : by_action) parts += (parts.empty() ? "" : ", ") + std::to_string(n) + " " + a;
  std::printf("%s %s: %zu shard%s, %s; %s -> %s in %.1f s\n", verb, out.string().c_str(), r.shards,
              r.shards == 1 ? "" : "s", parts.c_str(), ProgressBar::human(static_cast<double>(r.bytes_in)).c_str(),
              ProgressBar::human(static_cast<double>(r.bytes_out)).c_str(), secs);
  for (const std::string& n : r.notes) std::printf("note: %s\n", n.c_str());
}

// Every weight left in high precision (or, converting, written as floats), by reason.
void print_kept(const io::Report& r) {
  // Weights left in high precision, and (convert) layers the target's blocks cannot hold.
  std::map<std::pair<io::TensorAction, std::string>, std::vector<std::string>> kept;
  for (const io::TensorReport& t : r.tensors)
    if (t.action == io::TensorAction::kept || (t.action == io::TensorAction::dequantized && !t.reason.empty()))
      kept[{t.action, t.reason}].push_back(t.name);
  for (const auto& [why, names] : kept) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    std::printf("%s %zu weight%s (%s): %s\n", io::name(why.first), names.size(), names.size() == 1 ? "" : "s",
                why.second.c_str(), list.c_str());
  }
}

// One warning per tensor holding NaN/Inf values (quantized from, or dequantized to), saying what
// was done with them.
void warn_nonfinite(const io::Report& r, const std::string& done) {
  for (const io::TensorReport& t : r.tensors)
    if (t.nonfinite)
      std::fprintf(stderr, "microscale: warning: %s has %lld non-finite values (NaN/Inf) of %lld, %s\n", t.name.c_str(),
                   static_cast<long long>(t.nonfinite), static_cast<long long>(numel(t.shape)), done.c_str());
}

// SIGINT / SIGTERM stop a run at the next tensor: the progress callback throws, the library
// unwinds and removes its staging directory, then the process dies of the same signal. A second
// signal kills at once (SA_RESETHAND); the next run removes what that leaves.
volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void remember_signal(int sig) { g_stop_signal = sig; }

struct Interrupted {
  int sig;
};

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = remember_signal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM}) ::sigaction(sig, &sa, nullptr);
}

io::ProgressFn interruptible(io::ProgressFn inner) {
  return [inner = std::move(inner)](const io::Progress& p) {
    if (g_stop_signal) throw Interrupted{g_stop_signal};
    inner(p);
  };
}

// Runs a streaming command with the handlers in place; dies of the signal that stopped it.
template <class F>
void run_interruptible(const std::string& out, F&& body) {
  catch_stop_signals();
  try {
    body();
  } catch (const Interrupted& i) {
    std::fprintf(stderr, "microscale: interrupted; %s left as it was\n", out.c_str());
    std::signal(i.sig, SIG_DFL);
    std::raise(i.sig);
  }
}

// Format names of the issue: nvfp4, mxfp4, mxfp8, affine4, affine8 (and affine2..6).
QuantSpec spec_from_format(const std::string& f) {
  QuantSpec s;
  if (f.starts_with("affine")) {
    s.mode = Mode::affine;
    const std::string b = f.substr(6);
    if (b.empty() || b.size() > 1 || b[0] < '2' || b[0] > '8')
      throw Error("--format " + f + ": affine takes 2, 3, 4, 5, 6 or 8 bits (affine4, affine8, ...)");
    s.bits = b[0] - '0';
    return s;
  }
  if (f != "nvfp4" && f != "mxfp4" && f != "mxfp8")
    throw Error("unknown --format '" + f + "' (expected nvfp4, mxfp4, mxfp8, affine4 or affine8)");
  s.mode = mode_from_name(f);
  return s;
}

// "compressed-tensors, modelopt, mlx or gguf": the layouts' names, as the library lists them.
std::string layout_names() {
  const std::vector<io::Convention> all = io::conventions();
  std::string out;
  for (std::size_t i = 0; i < all.size(); ++i)
    out += (i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + std::string(io::name(all[i]));
  return out;
}

// --split-max-size: bytes, or a number with K, M or G (powers of 1000, as llama.cpp's gguf-split).
std::uint64_t size_from_text(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() ? 1 : unit == "K" ? 1e3 : unit == "M" ? 1e6 : unit == "G" ? 1e9 : 0;
  if (used == 0 || scale == 0 || !(v * scale >= 1) || v * scale > 1e18)
    throw Error("--split-max-size " + text + ": expected a size such as 2G, 500M or 1000000 (bytes)");
  return static_cast<std::uint64_t>(v * scale);
}

// What a run on `model` reads, to check report paths against before the run starts. A model the
// run cannot open is left to it: it refuses that with its own message before writing any report.
io::RunInputs inputs_of(const std::string& model) {
  try {
    return io::RunInputs(model);
  } catch (const Error&) {
    return {};
  }
}

// A part as given, before its range is checked: 64-bit, so that no value of the text or the
// environment can overflow on the way.
struct PartNumbers {
  std::int64_t index = 0, count = 0;
};

std::optional<std::int64_t> parse_int(std::string_view s) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// "I/N": part I (from 0) of N.
std::optional<PartNumbers> parse_part(std::string_view text) {
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const auto i = parse_int(text.substr(0, slash)), n = parse_int(text.substr(slash + 1));
  if (!i || !n) return std::nullopt;
  return PartNumbers{*i, *n};
}

// A launcher's variable: unset, or a rank, size or task id, an integer 0 to INT_MAX (refused
// otherwise, naming the variable).
std::optional<std::int64_t> launcher_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  const std::optional<std::int64_t> x = parse_int(v);
  if (!x || *x < 0 || *x > std::numeric_limits<int>::max())
    throw Error(std::string("--part auto: ") + name + "='" + v + "' is not a rank, size or task id (an integer 0 to " +
                std::to_string(std::numeric_limits<int>::max()) + "); give --part I/N");
  return x;
}

// The rank and size a launcher gives each process: Open MPI's mpirun, MPICH-style PMI (Intel MPI,
// srun --mpi=pmi2), srun's tasks, then a Slurm job array's tasks.
PartNumbers part_from_launcher() {
  auto read = [](const char* rank, const char* size, std::int64_t offset = 0) -> std::optional<PartNumbers> {
    const std::optional<std::int64_t> r = launcher_int(rank), n = launcher_int(size);
    if (!r && !n) return std::nullopt;
    if (!r || !n)
      throw Error(std::string("--part auto: ") + (r ? rank : size) + " is set but " + (r ? size : rank) +
                  " is not; give --part I/N");
    return PartNumbers{*r - offset, *n};
  };
  if (auto p = read("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")) return *p;
  if (auto p = read("PMI_RANK", "PMI_SIZE")) return *p;
  const char* ntasks = std::getenv("SLURM_NTASKS");
  if (ntasks && std::string_view(ntasks) != "1")
    if (auto p = read("SLURM_PROCID", "SLURM_NTASKS")) return *p;
  if (std::getenv("SLURM_ARRAY_TASK_ID")) {
    const std::int64_t min = launcher_int("SLURM_ARRAY_TASK_MIN").value_or(0);
    if (auto p = read("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", min)) return *p;
  }
  if (auto p = read("SLURM_PROCID", "SLURM_NTASKS")) return *p;
  throw Error(
      "--part auto: no launcher rank in the environment (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, "
      "SLURM_PROCID/NTASKS or SLURM_ARRAY_TASK_ID/COUNT); run under mpirun or srun, or give --part I/N");
}

io::Part part_option(const std::string& text) {
  const std::optional<PartNumbers> p = text == "auto" ? part_from_launcher() : parse_part(text);
  const std::string what = text == "auto" ? "--part auto (from the launcher: " : "--part " + text + " (";
  if (!p)
    throw Error("--part " + text +
                ": expected I/N, this process's part (from 0) and the number of parts, e.g. 0/4, or auto");
  const std::string part = "part " + std::to_string(p->index) + " of " + std::to_string(p->count) + "): ";
  if (p->count < 1 || p->count > std::numeric_limits<int>::max())
    throw Error(what + part + "the number of parts must be at least 1 and at most " +
                std::to_string(std::numeric_limits<int>::max()));
  if (p->index < 0 || p->index >= p->count)
    throw Error(what + part + "the part must be 0 to " + std::to_string(p->count - 1) +
                (text == "auto" ? "; a Slurm array must be contiguous (--array=0-N or 1-N)" : ""));
  return io::Part{static_cast<int>(p->index), static_cast<int>(p->count)};
}

}  // namespace

std::vector<Command> add_checkpoint_commands(CLI::App& app) {
  std::vector<Command> cmds;

  // ---- quantize
  {
    struct O {
      std::string in, out, format = "nvfp4", to, scale_rule, nonfinite = "propagate", amax_file, errors_csv, part,
                           split_size;
      std::string scale_search = "none", hessians, recipe, budget_csv;
      std::vector<std::string> layer_rules, candidates;
      std::optional<double> budget;
      double gptq_damp = 0.01;
      int gptq_block_size = 128;
      std::vector<std::string> exclude, include;
      std::optional<int> group;
      bool force = false, w4a4 = false, errors = false, separate = false, scale_2d = false;
      std::vector<const CLI::Option*> gptq_options;  // meaningful with --hessians only
    };
    auto o = std::make_shared<O>();
    CLI::App* c = app.add_subcommand("quantize", "quantize the projection weights of a Hugging Face style checkpoint");
    c->add_option("MODEL_DIR", o->in, "model directory (config.json + safetensors) or a .safetensors file")->required();
    c->add_option("-o,--output", o->out, "output directory (a .gguf file for --export gguf)")->required();
    c->add_option("--format", o->format, "nvfp4, mxfp4, mxfp8, affine4 or affine8")->capture_default_str();
    c->add_option("--export", o->to,
                  layout_names() +
                      " (default: "
                      "compressed-tensors for nvfp4/mxfp4, mlx otherwise)");
    c->add_option("--split-max-size", o->split_size,
                  "gguf: split the file into llama.cpp's NAME-0000i-of-0000n.gguf files of at most this size "
                  "(2G, 500M, bytes)");
    c->add_option("--exclude", o->exclude,
                  "keep modules matching this glob (repeatable; 'down_proj' matches any "
                  "'*.down_proj')");
    c->add_option("--include", o->include,
                  "also quantize these 2-D weights kept by default (lm_head, embeddings, "
                  "routers; repeatable glob)");
    c->add_option("--group-size", o->group, "group size (affine: 32, 64 or 128; fp modes have fixed groups)");
    c->add_option("--recipe", o->recipe,
                  "JSON file of per-layer formats: {\"rules\": [{\"match\": GLOB, \"format\": \"mxfp8\"}, ...]}, "
                  "first match wins, others take --format (docs/checkpoints.md, \"Recipes\")");
    c->add_option("--layer", o->layer_rules,
                  "GLOB=FORMAT[,key=value...]: one recipe rule, tried after --recipe's (repeatable; FORMAT nvfp4, "
                  "mxfp4, mxfp8, affine2..affine8 or keep; keys scale_search, scale_rule, group_size, elem, "
                  "scale_2d, levels)");
    c->add_option("--budget", o->budget,
                  "average bits per weight, scales included: each layer no rule pins takes the candidate that "
                  "minimises the summed estimated error within it (exact; with --hessians, trace(dW H dW^T))");
    c->add_option("--candidate", o->candidates,
                  "a format --budget may choose (repeatable; default nvfp4,scale_search=mse, mxfp8 and keep)");
    c->add_option("--budget-csv", o->budget_csv,
                  "write --budget's table: tensor,format,bits,error,chosen, one row per layer and candidate");
    c->add_option("--scale-rule", o->scale_rule,
                  "E8M0 rule for mx modes: ceil, floor, even, nearest (default: even "
                  "for compressed-tensors mxfp4 as llm-compressor, else ceil)");
    c->add_option("--scale-search", o->scale_search,
                  "fp4 block scales: none (round to nearest), 4over6 (nvfp4) or mse (nvfp4, mxfp4); "
                  "standard bytes either way (docs/numerics.md)")
        ->capture_default_str();
    c->add_option("--hessians", o->hessians,
                  "safetensors file of H = X^T X per layer ([K, K] F32/F64, named by module or weight name): "
                  "GPTQ for those layers, round to nearest for the others (docs/numerics.md)");
    o->gptq_options = {
        c->add_option("--gptq-damp", o->gptq_damp, "GPTQ dampening, a fraction of H's mean diagonal (with --hessians)")
            ->capture_default_str(),
        c->add_option("--gptq-block-size", o->gptq_block_size,
                      "GPTQ columns per lazy batch, a multiple of the group size (with --hessians)")
            ->capture_default_str()};
    c->add_flag("--scale-2d", o->scale_2d,
                "nvfp4: one block scale per 16x16 weight tile (the training recipe's 2D scaling); standard bytes");
    c->add_option("--nonfinite", o->nonfinite,
                  "NaN/Inf weights: propagate (warn, and keep them in the blocks they "
                  "hit), error (fail naming the tensor) or saturate")
        ->capture_default_str();
    c->add_option("--activation-amax", o->amax_file,
                  "JSON {module: activation amax} from your calibration: "
                  "writes a W4A4 nvfp4 config with input scales");
    c->add_flag("--w4a4", o->w4a4, "demand a W4A4 config (refused unless --activation-amax covers every layer)");
    c->add_flag("--separate-fused-scales", o->separate, "do not share one global scale across q/k/v and gate/up");
    c->add_flag("--errors", o->errors, "measure and print each layer's relative error and SQNR");
    c->add_option("--errors-csv", o->errors_csv,
                  "also write the per-layer errors to this CSV (implies --errors); refused when it is a file the "
                  "run reads or lies in the model directory");
    c->add_flag("-f,--force", o->force, "write into a non-empty output directory");
    c->add_option("--part", o->part,
                  "I/N: this process writes every N-th output shard (I from 0) of a run split over N processes, "
                  "which may run anywhere that sees OUT's directory; the last to finish publishes OUT. auto: I and N "
                  "from mpirun or Slurm (srun tasks or an array job)");
    cmds.push_back(
        {c, [o] {
           run_interruptible(o->out, [&] {
             if (!o->errors_csv.empty()) {  // before anything is read: a report never replaces an input
               io::RunInputs inputs = inputs_of(o->in);
               if (!o->hessians.empty()) inputs.add("--hessians", o->hessians);
               if (!o->amax_file.empty()) inputs.add("--activation-amax", o->amax_file);
               check_report_paths({{"--errors-csv", o->errors_csv}}, inputs, o->out);
             }
             if (!o->budget_csv.empty()) {
               io::RunInputs inputs = inputs_of(o->in);
               if (!o->hessians.empty()) inputs.add("--hessians", o->hessians);
               if (!o->recipe.empty()) inputs.add("--recipe", o->recipe);
               check_report_paths({{"--budget-csv", o->budget_csv}}, inputs, o->out);
               if (!o->budget) throw Error("--budget-csv writes --budget's table; give --budget too");
             }
             if (!o->candidates.empty() && !o->budget)
               throw Error("--candidate lists the formats --budget chooses from; give --budget too");
             io::QuantizeOptions opt;
             if (!o->part.empty()) opt.part = part_option(o->part);
             opt.spec = spec_from_format(o->format);
             if (o->group) {
               if (*o->group < 1)
                 throw Error("--group-size " + std::to_string(*o->group) +
                             " is no group size (affine: 32, 64 or 128; nvfp4: 16; mxfp4, mxfp8: 32); leave the "
                             "option out for the format's default");
               opt.spec.group_size = *o->group;
             }
             if (!o->scale_rule.empty()) {
               opt.spec.scale_rule = scale_rule_from_name(o->scale_rule);
               opt.scale_rule_set = true;
             }
             opt.spec.nonfinite = nonfinite_from_name(o->nonfinite);
             opt.spec.scale_search = scale_search_from_name(o->scale_search);
             if (!o->recipe.empty()) opt.recipe = io::read_recipe(o->recipe);
             for (const std::string& r : o->layer_rules) {
               const std::size_t eq = r.rfind('=', r.find(','));
               if (eq == std::string::npos || eq == 0)
                 throw Error("--layer " + r + ": expected GLOB=FORMAT (for example '*.down_proj=mxfp8')");
               opt.recipe.push_back({r.substr(0, eq), io::parse_layer_format(r.substr(eq + 1), "--layer " + r)});
             }
             opt.budget_bits = o->budget;
             for (const std::string& cnd : o->candidates)
               opt.candidates.push_back(io::parse_layer_format(cnd, "--candidate " + cnd));
             opt.budget_csv = o->budget_csv;
             for (const CLI::Option* g : o->gptq_options)
               if (g->count() > 0 && o->hessians.empty())
                 throw Error(g->get_name() + " tunes GPTQ, which only --hessians turns on; give --hessians too");
             opt.hessians = o->hessians;
             opt.gptq = GptqOptions{o->gptq_damp, o->gptq_block_size};
             opt.spec.scale_2d = o->scale_2d;
             opt.to = o->to.empty() ? io::default_convention(opt.spec.mode) : io::convention_from_name(o->to);
             if (!o->split_size.empty()) opt.split_bytes = size_from_text(o->split_size);
             opt.exclude = o->exclude;
             opt.include = o->include;
             opt.share_fused_scales = !o->separate;
             opt.w4a4 = o->w4a4;
             if (!o->amax_file.empty()) opt.activation_amax = io::read_activation_amax(o->amax_file);
             opt.measure_error = o->errors || !o->errors_csv.empty();
             opt.force = o->force;
             ProgressBar bar("quantize");
             opt.progress = interruptible(bar.callback());
             const auto t0 = std::chrono::steady_clock::now();
             const io::Report r = io::quantize_checkpoint(o->in, o->out, opt);
             bar.finish();
             char budget_text[48];
             std::snprintf(budget_text, sizeof budget_text, "--budget %g", o->budget.value_or(0));
             const std::string what = opt.budget_bits ? budget_text : opt.recipe.empty() ? o->format : "recipe";
             std::printf("%s %s -> %s (%s)\n", what.c_str(), o->in.c_str(), o->out.c_str(), io::name(opt.to));
             print_summary(r.published ? "wrote" : "wrote part of", r, o->out, seconds_since(t0));
             print_kept(r);
             if (!r.budget.empty()) {
               std::size_t w = 5;
               for (const io::BudgetReport& b : r.budget) w = std::max(w, b.layers.size());
               std::printf("\n--budget %g: the choice per layer\n%-*s %-24s %8s %12s\n", *o->budget,
                           static_cast<int>(w), "layer", "format", "bits", "error");
               for (const io::BudgetReport& b : r.budget)
                 std::printf("%-*s %-24s %8.4f %12.5g\n", static_cast<int>(w), b.layers.c_str(), b.format.c_str(),
                             b.bits, b.error);
             }
             warn_nonfinite(r, "quantized with --nonfinite " + o->nonfinite);
             if (!opt.measure_error) return;
             std::size_t w = 5;
             for (const io::TensorReport& t : r.tensors) w = std::max(w, t.name.size());
             std::printf("\n%-*s %12s %11s %8s %9s\n", static_cast<int>(w), "layer", "shape", "rel.error", "SQNR dB",
                         "nonfinite");
             for (const io::TensorReport& t : r.tensors)
               if (t.action == io::TensorAction::quantized)
                 std::printf("%-*s %12s %11.3e %8.2f %9lld\n", static_cast<int>(w), t.name.c_str(),
                             shape_str(t.shape, ShapeStyle::dims).c_str(), t.rel_error.value_or(NAN),
                             t.sqnr_db.value_or(NAN), static_cast<long long>(t.nonfinite));
               else if (t.action == io::TensorAction::kept)
                 std::printf("%-*s %12s kept: %s\n", static_cast<int>(w), t.name.c_str(),
                             shape_str(t.shape, ShapeStyle::dims).c_str(), t.reason.c_str());
             if (!o->errors_csv.empty()) {
               // Kept weights have empty errors and their reason; quoted, as reasons hold commas.
               std::ostringstream f;
               f << "layer,shape,format,rel_error,sqnr_db,nonfinite,kept\n";
               for (const io::TensorReport& t : r.tensors)
                 if (t.action == io::TensorAction::quantized)
                   f << t.name << ',' << shape_str(t.shape, ShapeStyle::dims) << ',' << t.format << ','
                     << t.rel_error.value_or(NAN) << ',' << t.sqnr_db.value_or(NAN) << ',' << t.nonfinite << ",\n";
                 else if (t.action == io::TensorAction::kept)
                   f << t.name << ',' << shape_str(t.shape, ShapeStyle::dims) << ',' << t.format << ",,,,\"" << t.reason
                     << "\"\n";
               write_outputs({{"--errors-csv", o->errors_csv, f.str()}});
             }
           });
         }});
  }

  // ---- dequantize
  {
    struct O {
      std::string in, out, dtype, nonfinite = "propagate";
      bool force = false;
    };
    auto o = std::make_shared<O>();
    CLI::App* c = app.add_subcommand("dequantize", "turn a quantized checkpoint back into float weights");
    c->add_option("MODEL_DIR", o->in, "quantized model directory or .safetensors file")->required();
    c->add_option("-o,--output", o->out, "output directory")->required();
    c->add_option("--dtype", o->dtype,
                  "bfloat16, float32 or float16 (default: the dtype the checkpoint was "
                  "quantized from, its config's torch_dtype)");
    c->add_option("--nonfinite", o->nonfinite,
                  "NaN/Inf in the values written (NaN scale codes, float16 overflow): propagate (warn, naming "
                  "each tensor) or error (fail naming the tensor; nothing is written)")
        ->capture_default_str();
    c->add_flag("-f,--force", o->force, "write into a non-empty output directory");
    cmds.push_back({c, [o] {
                      run_interruptible(o->out, [&] {
                        io::DequantizeOptions opt;
                        if (!o->dtype.empty()) opt.dtype = dtype_from_name(o->dtype);
                        opt.nonfinite = nonfinite_from_name(o->nonfinite);
                        opt.force = o->force;
                        ProgressBar bar("dequantize");
                        opt.progress = interruptible(bar.callback());
                        const auto t0 = std::chrono::steady_clock::now();
                        const io::Report r = io::dequantize_checkpoint(o->in, o->out, opt);
                        bar.finish();
                        print_summary("wrote", r, o->out, seconds_since(t0));
                        warn_nonfinite(r, "written as they are (--nonfinite propagate)");
                      });
                    }});
  }

  // ---- convert
  {
    struct O {
      std::string in, out, to, split_size;
      bool force = false, unify = false;
    };
    auto o = std::make_shared<O>();
    CLI::App* c = app.add_subcommand("convert",
                                     "re-layout a quantized checkpoint for another ecosystem "
                                     "(same quantized bytes)");
    c->add_option("MODEL_DIR", o->in, "quantized model directory or .safetensors file")->required();
    c->add_option("-o,--output", o->out, "output directory (a .gguf file for --to gguf)")->required();
    c->add_option("--to", o->to, layout_names())->required();
    c->add_option("--split-max-size", o->split_size,
                  "gguf: split the file into llama.cpp's NAME-0000i-of-0000n.gguf files of at most this size "
                  "(2G, 500M, bytes)");
    c->add_flag("--unify-fused-scales", o->unify,
                "re-quantize fused groups (q/k/v, gate/up) whose global scales "
                "differ to their common max (lossy for those layers)");
    c->add_flag("-f,--force", o->force, "write into a non-empty output directory");
    cmds.push_back({c, [o] {
                      run_interruptible(o->out, [&] {
                        io::ConvertOptions opt;
                        opt.to = io::convention_from_name(o->to);
                        opt.unify_fused_scales = o->unify;
                        if (!o->split_size.empty()) opt.split_bytes = size_from_text(o->split_size);
                        opt.force = o->force;
                        ProgressBar bar("convert");
                        opt.progress = interruptible(bar.callback());
                        const auto t0 = std::chrono::steady_clock::now();
                        const io::Report r = io::convert_checkpoint(o->in, o->out, opt);
                        bar.finish();
                        print_summary("wrote", r, o->out, seconds_since(t0));
                        print_kept(r);
                      });
                    }});
  }

  // ---- inspect
  {
    struct O {
      std::string path;
      bool no_stats = false;
    };
    auto o = std::make_shared<O>();
    CLI::App* c = app.add_subcommand("inspect",
                                     "list tensors with dtype, shape, detected format, global-scale "
                                     "convention and statistics");
    c->add_option("PATH", o->path, "model directory, index .json or .safetensors file")->required();
    c->add_flag("--no-stats", o->no_stats, "skip per-tensor statistics (reads headers only)");
    cmds.push_back(
        {c, [o] {
           ProgressBar bar("inspect");
           const io::InspectResult r = io::inspect_checkpoint(o->path, !o->no_stats, bar.callback());
           bar.finish();
           std::printf("%s: layout %s\n", o->path.c_str(), r.convention.c_str());
           if (!r.config.empty()) {
             std::string c2 = r.config;
             if (c2.size() > 300) c2 = c2.substr(0, 297) + "...";
             std::printf("config: %s\n", c2.c_str());
           }
           std::size_t w = 6, fw = 6;
           for (const io::InspectRow& row : r.rows) {
             w = std::max(w, row.name.size());
             fw = std::max(fw, row.format.size());
           }
           std::printf("\n%-*s %-8s %-12s %-*s %11s %11s %11s %11s %6s  %s\n", static_cast<int>(w), "tensor", "dtype",
                       "shape", static_cast<int>(fw), "format", "min", "max", "mean", "std", "nonfin", "detail");
           for (const io::InspectRow& row : r.rows) {
             std::printf("%-*s %-8s %-12s %-*s ", static_cast<int>(w), row.name.c_str(), row.dtype.c_str(),
                         shape_str(row.shape, ShapeStyle::dims).c_str(), static_cast<int>(fw), row.format.c_str());
             if (row.stats.valid)
               std::printf("%11.4g %11.4g %11.4g %11.4g %6lld", row.stats.min, row.stats.max, row.stats.mean,
                           row.stats.std, static_cast<long long>(row.stats.nonfinite));
             else
               std::printf("%11s %11s %11s %11s %6s", "-", "-", "-", "-", "-");
             std::printf("  %s\n", row.detail.c_str());
           }
           for (const std::string& n : r.notes) std::printf("note: %s\n", n.c_str());
         }});
  }
  return cmds;
}

}  // namespace microscale::cli
