// `microscale eval`: quantization error, throughput and size of every mode on synthetic weights
// or on the projection weights of a model directory; printed, saved as CSV and plotted as SVG.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "microscale/microscale.hpp"

namespace microscale::cli {

// One row of the mode table: a display name and the spec it stands for. `global` marks
// three-level nvfp4, whose global_scale is the matrix's amax (computed per matrix).
struct EvalMode {
  std::string name;
  QuantSpec spec;
  bool global = false;
};

struct EvalOptions {
  std::int64_t rows = 1024;
  std::int64_t cols = 4096;
  std::vector<std::string> modes;     // empty: all of eval_modes()
  std::vector<std::string> matrices;  // empty: all of eval_matrices()
  DType dtype = DType::bfloat16;      // input dtype the synthetic weights are stored in
  DType out = DType::float32;         // dequantize output dtype
  int repeats = 3;                    // timed runs per op; the median is reported
  std::uint64_t seed = 1234;
  std::string csv;        // also write the table here when not empty
  std::string svg;        // plot relative error against bits per value here when not empty
  std::string model_dir;  // evaluate this checkpoint's projection weights instead
};

// One table row: a mode on one matrix, or on all of them ("all": errors pooled over every matrix,
// sizes summed; for a model directory, over every projection weight).
struct EvalRow {
  std::string matrix, mode;
  double bits_per_value = 0, rel_error = 0, sqnr_db = 0;
  double quant_gelems = 0, dequant_gelems = 0;  // G elements per second, median run
  double size_bytes = 0;                        // quantized size: packed values, scales, biases, global scale
  std::int64_t elements = 0;
  std::int64_t nonfinite_values = 0;  // NaN or Inf weight values; then rel_error and sqnr_db are NaN
};

// Relative rms error and SQNR (dB) from a summed squared error and the summed energy of the
// weights. A NaN or Inf in either stays NaN (or Inf) instead of reading as a perfect score.
struct ErrorStats {
  double rel_error = 0, sqnr_db = 0;
};
ErrorStats error_stats(double squared_error, double energy);

const std::vector<EvalMode>& eval_modes();
const std::vector<std::string>& eval_matrices();

// Checks the options (mode and matrix names, sizes, group divisibility, that the --csv and --svg
// files can be written); throws microscale::Error.
void validate(const EvalOptions& opt);
// Runs the evaluation, printing the aligned table to stdout as rows complete, then writes the
// CSV and SVG files the options name (atomically, both or neither). Returns every row, the "all"
// summary rows last.
std::vector<EvalRow> run_eval(const EvalOptions& opt);

}  // namespace microscale::cli
