// Public quantize / dequantize entry points: the plan (ops/plan.hpp), then the backend's kernels.
#include "microscale/quantize.hpp"

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include "core/convert.hpp"
#include "core/numerics.hpp"
#include "ops/kernels.hpp"
#include "ops/operand.hpp"
#include "ops/quantize.hpp"
#include "reference/reference.hpp"

namespace microscale {
namespace {

void require(bool ok, const std::string& msg) {
  if (!ok) throw Error(msg);
}

// nonfinite='error': fails naming the first NaN/Inf in row-major order before anything is written.
void check_finite(const ops::Kernels& k, const detail::Rows& x, DType dtype, const Shape& shape) {
  float value = 0.0f;
  const std::int64_t i = k.find_nonfinite(x.data, dtype, x.numel, &value);
  if (i >= 0) ops::throw_nonfinite(i, value, shape);
}

// The candidate mse's global search chooses, where the kernels' block-error totals settle it
// (-1 where they do not). A candidate's documented total (below) and its block-error total T
// differ by less than T * rel + abs: the float32 block errors round at most 18 times each (a
// subtraction, a square and 15 additions: 32 units allowed), the float64 sums at most once per
// term (twice allowed), and float32 underflow adds under 2^-140 per block. So where every other
// candidate's T exceeds the least T by more than both slacks, the documented totals rank them
// the same way, and no tie rule is needed.
int settled_global_choice(const double* totals, int n, std::int64_t blocks, std::int64_t elements) {
  const double rel = 32 * 0x1p-24 + (static_cast<double>(elements) + static_cast<double>(blocks) + 8) * 0x1p-52;
  const double abs = static_cast<double>(blocks) * 0x1p-140;
  const auto slack = [&](double t) { return t * rel * 1.01 + abs; };
  int best = 0;
  for (int c = 0; c < n; ++c) {
    if (!std::isfinite(totals[c])) return -1;
    if (totals[c] < totals[best]) best = c;
  }
  for (int c = 0; c < n; ++c)
    if (c != best && !(totals[c] - totals[best] > slack(totals[c]) + slack(totals[best]))) return -1;
  return best;
}

// mse's global-scale search (three-level nvfp4, docs/numerics.md): the whole tensor is quantized
// with each candidate global scale and the one with the least total squared error over the finite
// inputs is kept, ties to the first. The total is a float64 sum in row-major order of the
// dequantized float32 values, so every backend and thread count chooses the same candidate. The
// kernels' block-error totals (one pass over x for every candidate) decide it wherever they settle
// it, and their chosen block scales are written with the winner's factor (as the searched
// quantize would choose and write them, without searching again); near-ties, non-finite inputs
// and overflowing totals take the documented computation.
void quantize_searching_global(const ops::Kernels& k, const detail::Rows& x, DType dtype, const ops::QuantizePlan& p,
                               Quantized& q, Tensor& compact) {
  const float amax = *p.spec.global_scale;
  constexpr int kCandidates = static_cast<int>(std::size(numerics::kNvfp4GlobalCandidates));
  float globals[kCandidates];
  for (int c = 0; c < kCandidates; ++c)
    globals[c] = std::fmin(amax * numerics::kNvfp4GlobalCandidates[c], std::numeric_limits<float>::max());
  const std::int64_t blocks = x.numel / numerics::kNvfp4Group;
  double totals[kCandidates];
  // The CUDA table has no entry: its quantize refuses the search below, naming it. Stochastic
  // rounding keys its bits by element: the kernels' quantize writes that, not nvfp4_encode.
  std::vector<std::uint8_t> codes;
  if (k.nvfp4_global_errors && !p.spec.sr_seed) codes.resize(static_cast<std::size_t>(kCandidates * blocks));
  if (k.nvfp4_global_errors && k.nvfp4_global_errors(x.data, dtype, blocks, globals, kCandidates, totals,
                                                     codes.empty() ? nullptr : codes.data())) {
    const int c = settled_global_choice(totals, kCandidates, blocks, x.numel);
    if (c >= 0) {
      QuantSpec s = p.spec;
      s.global_scale = globals[c];
      if (codes.empty()) {
        k.quantize(x.data, dtype, p.rows, p.K, s, q.packed.data<std::uint8_t>(), compact.bytes(), nullptr);
      } else {
        const std::uint8_t* chosen = codes.data() + c * blocks;
        std::memcpy(compact.bytes(), chosen, static_cast<std::size_t>(blocks));
        k.nvfp4_encode(x.data, dtype, blocks, globals[c], chosen, q.packed.data<std::uint8_t>());
      }
      q.spec.global_scale = s.global_scale;
      return;
    }
  }
  const auto n = static_cast<std::size_t>(x.numel);
  std::vector<float> xf(n), y(n);
  for (std::size_t i = 0; i < n; ++i) xf[i] = detail::load_f32(x.data + i * dtype_size(dtype), dtype);
  Tensor packed(DType::uint8, p.packed), scales(DType::uint8, p.compact_scales);
  double best = 0.0;
  bool first = true;
  for (const float g : globals) {
    QuantSpec s = p.spec;
    s.global_scale = g;
    std::memset(packed.bytes(), 0, packed.nbytes());  // the reference ORs codes in
    k.quantize(x.data, dtype, p.rows, p.K, s, packed.data<std::uint8_t>(), scales.bytes(), nullptr);
    k.dequantize(packed.data<std::uint8_t>(), scales.bytes(), nullptr, DType::uint8, p.rows, p.K, s, DType::float32,
                 reinterpret_cast<std::byte*>(y.data()));
    double err = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!std::isfinite(xf[i])) continue;
      const double d = static_cast<double>(y[i]) - static_cast<double>(xf[i]);
      err += d * d;
    }
    if (first || err < best) {
      std::swap(q.packed, packed);
      std::swap(compact, scales);
      q.spec.global_scale = s.global_scale;
      best = err;
      first = false;
    }
  }
}

}  // namespace

float global_scale(const TensorView& x) {
  ops::check_amax_input(ops::arg_of(x), "global_scale");
  const ops::Kernels& k = ops::kernels_for("global_scale", {&x});  // before rows_of reads x
  const detail::Rows c = detail::rows_of(x);
  return k.amax_finite(c.data, x.dtype, c.numel);
}

Quantized quantize(const TensorView& x, const QuantSpec& spec) { return ops::quantize(x, spec, true); }

Quantized ops::quantize(const TensorView& x, const QuantSpec& spec, bool search_global_scale) {
  const ops::QuantizePlan p = ops::plan_quantize(ops::arg_of(x), spec);
  if (p.spec.hadamard) {
    // The kernels quantize the transformed (bfloat16) tensor; nonfinite 'error' then names the
    // transformed element (the transform spreads a NaN or Inf over its chunk of 16).
    QuantSpec inner = p.spec;
    inner.hadamard = false;
    const Tensor y = hadamard_transform(x, DType::bfloat16);
    Quantized q = ops::quantize(y.view(), inner, search_global_scale);
    q.spec.hadamard = true;
    q.shape = x.shape;
    return q;
  }
  const ops::Kernels& k = ops::kernels_for("quantize", {&x});
  const detail::Rows xc = detail::rows_of(x);
  if (p.spec.nonfinite == NonFinite::error) check_finite(k, xc, x.dtype, x.shape);

  Quantized q = ops::allocate_quantized(p, x.shape);
  Tensor compact(p.scale_dtype, p.compact_scales);
  const bool three_level = p.spec.mode == Mode::nvfp4 && p.spec.global_scale.has_value();
  if (three_level && p.spec.scale_search == ScaleSearch::mse && search_global_scale && xc.numel > 0) {
    quantize_searching_global(k, xc, x.dtype, p, q, compact);
  } else {
    k.quantize(xc.data, x.dtype, p.rows, p.K, p.spec, q.packed.data<std::uint8_t>(), compact.bytes(), q.biases.bytes());
    // 4over6 encodes with 1536 / amax; the standard decoder reaches amax / 1536 through 1.75 * amax.
    if (three_level && p.spec.scale_search == ScaleSearch::four_over_six)
      q.spec.global_scale = numerics::nvfp4_four_over_six_global(*p.spec.global_scale);
  }
  q.scales = p.spec.layout == Layout::swizzled ? swizzle_scales(compact.view()) : compact;
  return q;
}

Tensor dequantize(const Quantized& q, DType dtype) {
  const bool affine = q.spec.mode == Mode::affine;
  const TensorView biases = affine ? q.biases.view() : TensorView();
  return dequantize(q.packed.view(), q.scales.view(), affine ? &biases : nullptr, q.spec, dtype);
}

namespace ops {

QuantizedOperand bind_operand(const OperandPlan& plan, const TensorView& packed, const TensorView& scales,
                              const TensorView* biases) {
  QuantizedOperand o;
  if (plan.spec.layout == Layout::swizzled) {
    Tensor host_scales;  // swizzled device scales are unswizzled on the host
    o.scales.copy = unswizzle_scales(host_readable(scales, host_scales), plan.rows, plan.groups);
    o.scales.data = o.scales.copy.bytes();
    o.scales.numel = o.scales.copy.numel();
  } else {
    o.scales = detail::rows_of(scales);
  }
  o.packed = detail::rows_of(packed);
  if (plan.spec.mode == Mode::affine) o.biases = detail::rows_of(*biases);
  return o;
}

}  // namespace ops

Tensor dequantize(const TensorView& packed, const TensorView& scales, const TensorView* biases, const QuantSpec& spec,
                  DType dtype) {
  const std::optional<ops::Arg> b = ops::optional_arg(biases);
  const ops::OperandPlan p =
      ops::plan_dequantize(ops::arg_of(packed), ops::arg_of(scales), ops::opt_ptr(b), spec, dtype);
  const ops::Kernels& k = ops::kernels_for("dequantize", {&packed, &scales, biases});
  const ops::QuantizedOperand w = ops::bind_operand(p, packed, scales, biases);
  Tensor y = Tensor::uninitialized(dtype, p.shape);  // every element is written
  k.dequantize(reinterpret_cast<const std::uint8_t*>(w.packed.data), w.scales.data, w.biases.data, p.scale_dtype,
               p.rows, p.K, p.spec, dtype, y.bytes());
  return y;
}

Tensor swizzle_scales(const TensorView& scales) {
  require(scales.dtype == DType::uint8,
          std::string("swizzle_scales: scales must be uint8, got ") + dtype_name(scales.dtype));
  require(scales.rank() >= 1, "swizzle_scales: scales must have rank >= 1");
  const std::int64_t C = scales.shape.back();
  const std::int64_t R = C == 0 ? numel(Shape(scales.shape.begin(), scales.shape.end() - 1)) : scales.numel() / C;
  const Tensor compact = detail::contiguous(scales);
  Tensor out(DType::uint8, {ops::roundup(R, 128), ops::roundup(C, 4)});
  reference::swizzle(compact.data<std::uint8_t>(), R, C, out.data<std::uint8_t>());
  return out;
}

Tensor unswizzle_scales(const TensorView& swizzled, std::int64_t rows, std::int64_t cols) {
  require(swizzled.dtype == DType::uint8,
          std::string("unswizzle_scales: scales must be uint8, got ") + dtype_name(swizzled.dtype));
  require(rows >= 0 && cols >= 0, "unswizzle_scales: rows and cols must be >= 0");
  const std::int64_t need = ops::roundup(rows, 128) * ops::roundup(cols, 4);
  require(swizzled.numel() == need, "unswizzle_scales: " + std::to_string(rows) + "x" + std::to_string(cols) +
                                        " scales need " + std::to_string(need) + " swizzled bytes, got " +
                                        std::to_string(swizzled.numel()));
  const Tensor sw = detail::contiguous(swizzled);
  Tensor out(DType::uint8, {rows, cols});
  reference::unswizzle(sw.data<std::uint8_t>(), rows, cols, out.data<std::uint8_t>());
  return out;
}

}  // namespace microscale
