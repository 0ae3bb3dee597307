// Quality table in the shape of the NVFP4 tables of MLX pull request 3558: for each synthetic
// weight matrix and each format, bits per value, relative error of dequantize(quantize(W)),
// relative error of quantized_matmul against the float32 product with Gaussian activations, and
// the stored size. Deterministic (fixed seeds); prints a Markdown table.
//
//   build/bench/microscale_quality [--rows-of-x M]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "microscale/microscale.hpp"
#include "synthetic_weights.hpp"

namespace ms = microscale;

namespace {

struct Matrix {
  std::string name, description;
  std::int64_t rows, cols;
  std::vector<float> values;
};

Matrix make(const std::string& name, std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Matrix m{name, "", rows, cols, {}};
  if (name == "normal") {
    m.description = "Gaussian, sigma 0.02";
    m.values = ms::cli::synthetic_weights(ms::cli::WeightKind::gaussian, rows, cols, seed);
  } else if (name == "heavy-tailed") {
    m.description = "Student-t, 3 degrees of freedom";
    m.values = ms::cli::synthetic_weights(ms::cli::WeightKind::student_t, rows, cols, seed, 3.0f);
  } else if (name == "channel-outliers") {
    m.description = "Gaussian with " + std::to_string(cols / 512) + " random input channels (columns) scaled x30";
    m.values = ms::cli::synthetic_weights(ms::cli::WeightKind::outliers, rows, cols, seed);
  } else {  // extreme tail
    m.description = "Student-t, 1.5 degrees of freedom (infinite variance)";
    m.values = ms::cli::synthetic_weights(ms::cli::WeightKind::student_t, rows, cols, seed, 1.5f);
  }
  return m;
}

struct Row {
  std::string label;
  ms::QuantSpec spec;
  bool three_level = false;
};

double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0, r = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    r += want[i] * want[i];
  }
  return std::sqrt(e / r);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t M = 8;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--rows-of-x") == 0) M = std::stoll(argv[i + 1]);

  auto spec = [](ms::Mode mode, int group = 0, int bits = 0, ms::ScaleSearch search = ms::ScaleSearch::none) {
    ms::QuantSpec s;
    s.mode = mode;
    s.group_size = group;
    s.bits = bits;
    s.scale_search = search;
    return s;
  };
  using SS = ms::ScaleSearch;
  const std::vector<Row> rows = {
      {"nvfp4 two-level", spec(ms::Mode::nvfp4)},
      {"nvfp4 three-level", spec(ms::Mode::nvfp4), true},
      {"nvfp4 two-level, scale search 4over6", spec(ms::Mode::nvfp4, 0, 0, SS::four_over_six)},
      {"nvfp4 two-level, scale search mse", spec(ms::Mode::nvfp4, 0, 0, SS::mse)},
      {"nvfp4 three-level, scale search 4over6", spec(ms::Mode::nvfp4, 0, 0, SS::four_over_six), true},
      {"nvfp4 three-level, scale search mse", spec(ms::Mode::nvfp4, 0, 0, SS::mse), true},
      {"mxfp4", spec(ms::Mode::mxfp4)},
      {"mxfp4, scale search mse", spec(ms::Mode::mxfp4, 0, 0, SS::mse)},
      {"mxfp8 (e4m3)", spec(ms::Mode::mxfp8)},
      {"affine int4 g32", spec(ms::Mode::affine, 32, 4)},
      {"affine int4 g64", spec(ms::Mode::affine, 64, 4)},
      {"affine int8 g128", spec(ms::Mode::affine, 128, 8)},
  };
  const std::vector<Matrix> matrices = {make("normal", 128, 256, 1), make("heavy-tailed", 14336, 4096, 2),
                                        make("channel-outliers", 4096, 8192, 3), make("extreme-tail", 512, 2048, 4)};

  std::printf("| matrix | format | bits/value | rel. error dequantize | rel. error quantized_matmul | size (MB) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Matrix& w : matrices) {
    const ms::TensorView wv(w.values.data(), ms::DType::float32, {w.rows, w.cols});
    std::mt19937_64 rng(99);
    std::normal_distribution<float> z;
    std::vector<float> x(static_cast<std::size_t>(M * w.cols));
    for (float& v : x) v = z(rng);
    const ms::TensorView xv(x.data(), ms::DType::float32, {M, w.cols});
    // Float32 product as the baseline, accumulated in float64 so only the weights' error shows.
    std::vector<double> y_ref(static_cast<std::size_t>(M * w.rows));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < w.rows; ++n) {
        double acc = 0;
        for (std::int64_t k = 0; k < w.cols; ++k)
          acc +=
              double(x[static_cast<std::size_t>(m * w.cols + k)]) * w.values[static_cast<std::size_t>(n * w.cols + k)];
        y_ref[static_cast<std::size_t>(m * w.rows + n)] = acc;
      }
    const std::vector<double> w64(w.values.begin(), w.values.end());
    std::printf("| %s %s (%s) | float32 | 32 | 0 | 0 | %.2f |\n", w.name.c_str(),
                ms::shape_str({w.rows, w.cols}, ms::ShapeStyle::dims).c_str(), w.description.c_str(),
                double(w.rows * w.cols) * 4 / 1e6);
    for (const Row& r : rows) {
      ms::QuantSpec s = r.spec;
      if (r.three_level) s.global_scale = ms::global_scale(wv);
      const ms::Quantized q = ms::quantize(wv, s);
      const ms::Tensor d = ms::dequantize(q, ms::DType::float32);
      const double e_dq = rel_err(std::vector<float>(d.data<float>(), d.data<float>() + d.numel()), w64);
      const ms::Tensor y = ms::quantized_matmul(xv, q, true);
      const double e_mm = rel_err(std::vector<float>(y.data<float>(), y.data<float>() + y.numel()), y_ref);
      const double bytes = double(q.packed.nbytes() + q.scales.nbytes() + q.biases.nbytes()) + (r.three_level ? 4 : 0);
      // Affine scales and biases are stored in the input dtype; the table assumes a bfloat16 model.
      const double bpv = ms::bits_per_value(q.spec, 16);
      const double mb = s.mode == ms::Mode::affine ? double(w.rows * w.cols) * bpv / 8 / 1e6 : bytes / 1e6;
      std::printf("| | %s | %.2f | %.4f | %.4f | %.2f |\n", r.label.c_str(), bpv, e_dq, e_mm, mb);
      std::fflush(stdout);
    }
  }
  return 0;
}
