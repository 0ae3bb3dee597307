// The `microscale` command.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "eval.hpp"
#include "microscale/runtime.hpp"

#ifndef MICROSCALE_VERSION
#define MICROSCALE_VERSION "unknown"
#endif

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = microscale::cli;
  CLI::App app{"microscale: microscaling block quantization (NVFP4, MXFP4, MXFP8, affine)"};
  app.set_version_flag("--version", std::string("microscale ") + MICROSCALE_VERSION);
  app.require_subcommand(0, 1);

  // eval's options live on the top-level app so that `microscale --rows 64` (eval is the default)
  // and `microscale eval --rows 64` both work; the subcommand passes them through.
  cli::EvalOptions opt;
  std::string modes, matrices, dtype = "bfloat16", out = "float32";
  app.add_option("--rows", opt.rows, "rows of each synthetic matrix")->capture_default_str();
  app.add_option("--cols", opt.cols, "columns (the quantized axis); a multiple of every group size")
      ->capture_default_str();
  std::string mode_help = "comma-separated modes (default: all):";
  for (const cli::EvalMode& m : cli::eval_modes()) mode_help += " " + m.name;
  app.add_option("--modes", modes, mode_help);
  app.add_option("--matrices", matrices, "comma-separated matrices (default: gaussian,student-t3,outliers)");
  app.add_option("--dtype", dtype, "dtype the weights are stored in: float32, bfloat16, float16")->capture_default_str();
  app.add_option("--out", out, "dequantize output dtype: float32, bfloat16, float16")->capture_default_str();
  app.add_option("--repeats", opt.repeats, "timed runs per op (median reported)")->capture_default_str();
  app.add_option("--seed", opt.seed, "seed of the synthetic matrices")->capture_default_str();
  app.add_option("--csv", opt.csv, "also write the table as CSV to this file");
  std::string backend, target;
  int threads = 0;
  app.add_option("--backend", backend, "cpu (SIMD + threads) or reference (scalar executable spec); "
                                       "default: MICROSCALE_BACKEND or cpu");
  app.add_option("--cpu-target", target, "force a SIMD target of the cpu backend (auto, avx512_dl, avx512, avx2, "
                                         "sse4, ssse3, scalar)");
  app.add_option("--threads", threads, "worker threads of the cpu backend (default: MICROSCALE_NUM_THREADS, "
                                       "OMP_NUM_THREADS or all cores)");
  CLI::App* eval = app.add_subcommand("eval", "quantization error and throughput of every mode (the default)");
  eval->fallthrough();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    opt.modes = split_commas(modes);
    opt.matrices = split_commas(matrices);
    opt.dtype = microscale::dtype_from_name(dtype);
    opt.out = microscale::dtype_from_name(out);
    if (!backend.empty()) {
      if (backend == "cpu")
        microscale::set_backend(microscale::Backend::cpu);
      else if (backend == "reference")
        microscale::set_backend(microscale::Backend::reference);
      else
        throw microscale::Error("--backend must be cpu or reference, got '" + backend + "'");
    }
    if (!target.empty()) microscale::set_cpu_target(target);
    if (threads < 0) throw microscale::Error("--threads must be >= 0, got " + std::to_string(threads));
    if (threads > 0) microscale::set_num_threads(threads);
    cli::run_eval(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "microscale: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
