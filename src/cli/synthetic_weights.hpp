// Synthetic weight matrices, deterministic for a seed: the inputs of `microscale eval` and of the
// quality table (bench/quality_table.cpp), so both tables can be regenerated exactly.
#pragma once

#include <cstdint>
#include <vector>

namespace microscale::cli {

enum class WeightKind {
  gaussian,   // normal, sigma 0.02
  student_t,  // Student-t times 0.02: heavy tails (infinite variance for dof <= 2)
  outliers,   // gaussian with max(1, cols / 512) input channels (columns picked at random) 30x
              // larger, as activation-outlier channels leave in weights
};

// rows x cols float32 values, row-major; `dof` is the degrees of freedom of student_t.
std::vector<float> synthetic_weights(WeightKind kind, std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                                     float dof = 3.0f);

}  // namespace microscale::cli
