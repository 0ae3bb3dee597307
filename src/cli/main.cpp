// The `microscale` command.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <optional>

#include "commands.hpp"
#include "eval.hpp"
#include "microscale/runtime.hpp"

#ifndef MICROSCALE_VERSION
#define MICROSCALE_VERSION "unknown"
#endif

namespace {

// A comma-separated list option: each use takes one argument (a following word stays the
// MODEL_DIR), split by comma_items after parsing. CLI11 does not split it: it drops an argument of
// commas alone and takes the next word (`--modes ,,, --rows 8` read "--rows" as a mode).
CLI::Option* comma_list(CLI::Option* o) { return o->allow_extra_args(false); }

// The items of comma_list option `o`'s arguments: "a,b" and "a, b" give two, empty items are
// dropped; given with none at all (`--modes ""`, `--modes ,`) is refused, naming the option.
std::vector<std::string> comma_items(const CLI::Option* o, const std::vector<std::string>& args) {
  std::vector<std::string> items;
  for (const std::string& arg : args) {
    std::string item;
    for (const char c : arg + ",") {
      if (c != ',') {
        if (c != ' ') item += c;
      } else if (!item.empty()) {
        items.push_back(std::move(item));
        item.clear();
      }
    }
  }
  if (o->count() > 0 && items.empty())
    throw microscale::Error(o->get_name() + " '" + (args.empty() ? "" : args.front()) +
                            "' names nothing; give a comma-separated list, or leave the option out for all");
  return items;
}

// Parses and runs one command; errors other than a command-line one propagate to main.
int run(int argc, char** argv) {
  namespace cli = microscale::cli;
  CLI::App app{"microscale: microscaling block quantization (NVFP4, MXFP4, MXFP8, affine)", "microscale"};
  app.set_version_flag("--version", std::string("microscale ") + MICROSCALE_VERSION);
  app.require_subcommand(0, 1);
  app.footer(
      "Run without arguments, microscale prints this help. `microscale eval` runs the evaluation with its "
      "defaults; `microscale SUBCOMMAND --help` lists a subcommand's options.");

  CLI::App* eval = app.add_subcommand("eval",
                                      "quantization error, throughput and size of every mode on synthetic "
                                      "weight matrices or a model's weights; table, CSV and SVG plot (the default "
                                      "subcommand when the arguments start with an option)");
  cli::EvalOptions opt;
  std::string dtype = "bfloat16", out = "float32";
  eval->add_option("--rows", opt.rows, "rows of each synthetic matrix")->capture_default_str();
  eval->add_option("--cols", opt.cols, "columns (the quantized axis); a multiple of every group size")
      ->capture_default_str();
  std::string mode_help = "comma-separated modes (default: all):";
  for (const cli::EvalMode& m : cli::eval_modes()) mode_help += " " + m.name;
  std::vector<std::string> modes, matrices;
  const CLI::Option* modes_option = comma_list(eval->add_option("--modes", modes, mode_help));
  const CLI::Option* matrices_option = comma_list(
      eval->add_option("--matrices", matrices, "comma-separated matrices (default: gaussian,student-t3,outliers)"));
  eval->add_option("--dtype", dtype, "dtype the weights are stored in: float32, bfloat16, float16")
      ->capture_default_str();
  eval->add_option("--out", out, "dequantize output dtype: float32, bfloat16, float16")->capture_default_str();
  eval->add_option("--repeats", opt.repeats, "timed runs per op (median reported)")->capture_default_str();
  eval->add_option("--seed", opt.seed, "seed of the synthetic matrices")->capture_default_str();
  opt.csv = "microscale-eval.csv";
  opt.svg = "microscale-eval.svg";
  bool no_files = false;
  eval->add_option("--csv", opt.csv, "write the table as CSV to this file (not in MODEL_DIR)")->capture_default_str();
  eval->add_option("--svg", opt.svg,
                   "plot relative error against bits per value (one point per format) to this SVG (not in MODEL_DIR)")
      ->capture_default_str();
  // The plot was a PNG before it became SVG: an old command line gets told what to write instead.
  CLI::Option* png = eval->add_option("--png")->expected(0, 1)->group("");
  eval->add_flag("--no-files", no_files, "print the table only (no CSV, no SVG)");
  eval->add_option("MODEL_DIR", opt.model_dir,
                   "evaluate the projection weights of this checkpoint instead of synthetic matrices");
  const std::vector<cli::Command> commands = cli::add_checkpoint_commands(app);
  std::string backend, target;
  int threads = 0;
  eval->add_option("--backend", backend,
                   "cpu (SIMD + threads) or reference (scalar executable spec); "
                   "default: MICROSCALE_BACKEND or cpu");
  eval->add_option("--cpu-target", target,
                   "force a SIMD target of the cpu backend (auto; x86: avx512_dl, avx512, "
                   "avx2, sse4, ssse3; Arm: sve2_128, sve_256, sve2, sve, neon; scalar)");
  eval->add_option("--threads", threads,
                   "threads per call of the cpu backend (default: MICROSCALE_NUM_THREADS, "
                   "OMP_NUM_THREADS or the CPUs this process may run on)");

  // A bare `microscale` prints this help (exit 0) rather than starting a long run that writes files.
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  // `eval` is the default subcommand: `microscale --rows 64` means `microscale eval --rows 64`.
  const bool top_level_flag = args[0] == "-h" || args[0] == "--help" || args[0] == "--version";
  if (args[0].starts_with('-') && !top_level_flag) args.insert(args.begin(), "eval");
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last-first

  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (png->count() > 0)
    throw microscale::Error("--png was replaced by --svg: eval writes its plot as SVG now; use --svg FILE");
  opt.modes = comma_items(modes_option, modes);
  opt.matrices = comma_items(matrices_option, matrices);
  opt.dtype = microscale::dtype_from_name(dtype);
  opt.out = microscale::dtype_from_name(out);
  if (!backend.empty()) {
    const std::optional<microscale::Backend> b = microscale::backend_from_name(backend);
    if (!b) throw microscale::Error("--backend must be cpu or reference, got '" + backend + "'");
    microscale::set_backend(*b);
  }
  if (!target.empty()) microscale::set_cpu_target(target);
  if (threads < 0) throw microscale::Error("--threads must be >= 0, got " + std::to_string(threads));
  if (threads > 0) microscale::set_num_threads(threads);
  for (const cli::Command& c : commands)
    if (c.app->parsed()) {
      c.run();
      return 0;
    }
  if (no_files) {
    opt.csv.clear();
    opt.svg.clear();
  }
  cli::run_eval(opt);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fputs(
        "microscale: error: out of memory. Try smaller --rows/--cols (eval), fewer --threads, or free memory "
        "by closing other programs.\n",
        stderr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "microscale: error: %s\n", e.what());
  }
  return 1;
}
