#include "synthetic_weights.hpp"

#include <algorithm>
#include <random>

namespace microscale::cli {

std::vector<float> synthetic_weights(WeightKind kind, std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                                     float dof) {
  std::mt19937_64 rng(seed);
  std::vector<float> w(static_cast<std::size_t>(rows * cols));
  if (kind == WeightKind::student_t) {
    std::student_t_distribution<float> t(dof);
    for (float& v : w) v = 0.02f * t(rng);
    return w;
  }
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& v : w) v = normal(rng);
  if (kind == WeightKind::outliers) {
    std::uniform_int_distribution<std::int64_t> col(0, cols - 1);
    const int n = static_cast<int>(std::max<std::int64_t>(1, cols / 512));
    for (int j = 0; j < n; ++j) {
      const std::int64_t c = col(rng);
      for (std::int64_t r = 0; r < rows; ++r) w[static_cast<std::size_t>(r * cols + c)] *= 30.0f;
    }
  }
  return w;
}

}  // namespace microscale::cli
