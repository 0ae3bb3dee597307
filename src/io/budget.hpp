// The automatic choice behind `quantize --budget BITS` (docs/numerics.md, "Formats under a size
// budget"): each layer's candidate formats with what they cost and the error they cause, the
// assignment of minimum total error within the budget, the error estimate, and the CSV that
// reports the table and the choice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace microscale::io::ck {

// One candidate for one layer.
struct BudgetOption {
  std::string format;        // as reported: "nvfp4", "mxfp8", "keep"
  std::int64_t stored_bits;  // the layer's whole storage, scales and any global scale included
  double error;              // estimated output error (layer_output_error), finite and >= 0
};

struct BudgetLayer {
  std::string tensor;
  std::int64_t numel;  // the weights the layer counts for in the budget's average
  std::vector<BudgetOption> options;
};

struct BudgetChoice {
  std::vector<std::size_t> chosen;  // the option index per layer
  std::int64_t stored_bits;         // their sum
  double error;                     // their errors summed in layer order (float64)
};

// The assignment of one option per layer that minimises the total error, summed in float64 in
// layer order, subject to sum(stored_bits) <= bits_per_weight * sum(numel) (exactly, in integers).
// Exact for that objective: the result's error equals the minimum over all assignments. Among
// assignments of equal total error it takes the fewest bits, then the lexicographically smallest
// option indices in layer order, so the result is unique. Throws Error for empty `layers`, a
// layer without options, a numel or stored_bits below 1, an error that is negative or not finite,
// a bits_per_weight that is not positive and finite, and a budget below the cheapest assignment
// (the message gives the minimum bits per weight).
BudgetChoice choose_under_budget(std::span<const BudgetLayer> layers, double bits_per_weight);

// The output error of replacing the weight w [rows, cols] (row-major) by wq:
// trace(dW H dW^T) with dW = wq - w and `hessian` H [cols, cols] row-major (a GPTQ Hessian X^T X;
// H's symmetric part is what counts), or sum(dW^2) when `hessian` is empty. Float64 throughout,
// every sum in a fixed order: the same result for any thread count (with H, the products use
// fused multiply-adds where the SIMD target has them, so the last bits may differ between
// targets). Cost with H: about rows * cols^2 / 2 multiply-adds (6 GFMA/s per core measured: 5 s for
// 4096 x 4096 on one core), parallel over threads; without: rows * cols.
// Throws Error when a span's size does not match the shape.
double layer_output_error(std::span<const float> w, std::span<const float> wq, std::int64_t rows, std::int64_t cols,
                          std::span<const double> hessian = {});

// The CSV text: the header `tensor,format,bits,error,chosen`, then one row per layer and option in
// order: bits per weight (stored_bits / numel) and the error printed with 17 significant digits,
// `chosen` 1 on the chosen option's row and 0 on the others. A field holding a comma, quote or
// line break is quoted (RFC 4180). Throws Error when `choice` does not fit `layers`.
std::string budget_csv(std::span<const BudgetLayer> layers, const BudgetChoice& choice);
// Writes budget_csv's text to `path` atomically (a temporary file renamed into place); errors name
// `path`.
void write_budget_csv(const std::filesystem::path& path, std::span<const BudgetLayer> layers,
                      const BudgetChoice& choice);

}  // namespace microscale::io::ck
