// GPTQ (include/microscale/gptq.hpp, docs/numerics.md "GPTQ"). Everything is float64 except the
// rounding itself, which takes the working weight to float32 and uses the spec's per-group math
// (core/numerics.hpp) exactly as quantize does, so the bytes are standard. The cubic steps (X^T X,
// the factorization, the error updates) are blocked products through cpu::dense_update.
//
// Rows of W are independent given U (the upper Cholesky factor of H^-1), so the rounding runs in
// parallel over chunks of rows, each chunk doing every column block; every row sees the same
// operations in the same order whatever the thread count.
#include "microscale/gptq.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/convert.hpp"
#include "core/numerics.hpp"
#include "cpu/dense.hpp"
#include "cpu/parallel.hpp"
#include "ops/plan.hpp"

namespace microscale {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw Error("gptq: " + msg); }

using Matrix = std::vector<double>;  // row-major K x K

// The x [rows, K] values of a float view as float64, row-major.
std::vector<double> load_rows(const TensorView& x, std::int64_t* rows, std::int64_t K) {
  const detail::Rows c = detail::rows_of(x);
  const std::size_t n = static_cast<std::size_t>(c.numel), size = dtype_size(x.dtype);
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = detail::load_f32(c.data + i * size, x.dtype);
  *rows = K == 0 ? 0 : c.numel / K;
  return out;
}

// Sum of a[i] * b[i] in a fixed order (four interleaved partial sums, then combined): the same
// result on every thread count.
double dot(const double* a, const double* b, std::int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// y[0..n) -= a * x[0..n)
void axpy_sub(double* y, double a, const double* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] -= a * x[i];
}

// U upper triangular with U^T U = H^-1, from the lower Cholesky factor L of A = P H P (P reverses
// the index order, which for a row-major matrix reverses the flat array): H = V V^T with
// V = P L P upper, so U = V^-1 = P L^-1 P, the unique upper Cholesky factor of H^-1, for the cost
// of one Cholesky and one triangular inverse. `h` (the dampened H) is overwritten.
Matrix inverse_cholesky_upper(Matrix& h, std::int64_t K, double damp) {
  std::reverse(h.begin(), h.end());
  double* a = h.data();
  // Right-looking blocked Cholesky of A's lower triangle, panels of kPanel columns: the panel's
  // diagonal block, the rows below it (a triangular solve per row), then the trailing lower
  // triangle takes the panel's product in strips of rows (a strip also computes the part of its
  // diagonal block above the diagonal, which is never read).
  constexpr std::int64_t kPanel = 64, kStrip = 48, kColTile = 128;
  static_assert(kStrip % cpu::kDensePanel == 0 && kColTile % cpu::kDensePanel == 0);
  std::vector<double> pt(static_cast<std::size_t>(kPanel * K)),
      packed(static_cast<std::size_t>(cpu::packed_size(kPanel, K)));
  for (std::int64_t j0 = 0; j0 < K; j0 += kPanel) {
    const std::int64_t j1 = std::min(K, j0 + kPanel), w = j1 - j0, rest = K - j1;
    for (std::int64_t j = j0; j < j1; ++j) {
      double* aj = a + j * K;
      const double d = aj[j] - dot(aj + j0, aj + j0, j - j0);
      if (!(d > 0.0) || !std::isfinite(d))
        fail("hessian is not positive definite after dampening (damp " + std::to_string(damp) + ", pivot " +
             std::to_string(K - 1 - j) + " of " + std::to_string(K) +
             "); pass a larger damp, or accumulate H from more (and more varied) samples");
      aj[j] = std::sqrt(d);
      for (std::int64_t i = j + 1; i < j1; ++i) {
        double* ai = a + i * K;
        ai[j] = (ai[j] - dot(ai + j0, aj + j0, j - j0)) / aj[j];
      }
    }
    cpu::parallel_for(rest, 64, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = j1 + b; i < j1 + e; ++i) {
        double* ai = a + i * K;
        for (std::int64_t j = j0; j < j1; ++j) ai[j] = (ai[j] - dot(ai + j0, a + j * K + j0, j - j0)) / a[j * K + j];
      }
    });
    for (std::int64_t i = 0; i < rest; ++i)
      for (std::int64_t k = 0; k < w; ++k) pt[static_cast<std::size_t>(k * rest + i)] = a[(j1 + i) * K + j0 + k];
    cpu::pack_panels(w, rest, pt.data(), rest, packed.data());
    cpu::parallel_for(rest, kStrip, [&](std::int64_t b, std::int64_t e) {
      cpu::dense_update(e - b, e, w, pt.data() + b, rest, packed.data(), w * cpu::kDensePanel, a + (j1 + b) * K + j1, K,
                        /*add=*/false);
    });
  }
  // X = L^-1 by block rows of kPanel: X[i0:i1, :i0] = -L[i0:i1, :i0] X[:i0, :i0] (X lower, so a
  // tile of columns from c0 needs only the rows k >= c0), then the block's own rows by forward
  // substitution, column tiles in parallel.
  Matrix x(static_cast<std::size_t>(K * K), 0.0);
  for (std::int64_t i0 = 0; i0 < K; i0 += kPanel) {
    const std::int64_t i1 = std::min(K, i0 + kPanel), hb = i1 - i0;
    for (std::int64_t k = 0; k < i0; ++k)
      for (std::int64_t r = 0; r < hb; ++r) pt[static_cast<std::size_t>(k * hb + r)] = a[(i0 + r) * K + k];
    cpu::parallel_for(i0, kColTile, [&](std::int64_t c0, std::int64_t c1) {
      std::vector<double> xp(static_cast<std::size_t>(cpu::packed_size(i0 - c0, c1 - c0)));
      cpu::pack_panels(i0 - c0, c1 - c0, x.data() + c0 * K + c0, K, xp.data());
      cpu::dense_update(hb, c1 - c0, i0 - c0, pt.data() + c0 * hb, hb, xp.data(), (i0 - c0) * cpu::kDensePanel,
                        x.data() + i0 * K + c0, K, /*add=*/false);
    });
    cpu::parallel_for(i1, kColTile, [&](std::int64_t c0, std::int64_t c1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        const double* li = a + i * K;
        double* xi = x.data() + i * K;
        const std::int64_t end = std::min(c1, i + 1);
        if (c0 >= end) continue;
        if (i < c1 && i >= c0) xi[i] = 1.0;
        for (std::int64_t q = std::max(i0, c0); q < i; ++q) axpy_sub(xi + c0, li[q], x.data() + q * K + c0, end - c0);
        for (std::int64_t c = c0; c < end; ++c) xi[c] /= li[i];
      }
    });
  }
  std::reverse(x.begin(), x.end());
  return x;
}

// i is an element index within a row.
void put_nibble(std::uint8_t* row, std::int64_t i, std::uint32_t code) {
  row[i / 2] = static_cast<std::uint8_t>(row[i / 2] | (code << ((i & 1) * 4)));
}
void put_bits(std::uint8_t* row, std::int64_t i, int bits, std::uint32_t value) {
  std::int64_t t = i * bits;
  for (int k = 0; k < bits; ++k, ++t)
    if ((value >> k) & 1u) row[t / 8] = static_cast<std::uint8_t>(row[t / 8] | (1u << (t % 8)));
}

// One group's quantizer, chosen from the group's current weights (as float32) when its first
// column is reached; rounds one value to its code and the float32 value dequantize gives it.
struct GroupQuantizer {
  const QuantSpec& spec;
  DType src;
  numerics::Nvfp4Tensor nv;
  numerics::MxElem ef;
  float amax;
  // the current group's parameters
  numerics::BlockScale scale{0, 1.0f};
  float dec = 1.0f;                         // fp modes: decode factor of the block
  numerics::AffineScaleBias affine{};       // as encoded
  float stored_scale = 0, stored_bias = 0;  // as stored (rounded to src) and decoded

  void choose(const float* x, int g) {
    if (spec.mode == Mode::affine) {
      float lo = x[0], hi = x[0];
      for (int i = 1; i < g; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      affine = numerics::affine_scale_bias(lo, hi, spec.bits);
      stored_scale = numerics::round_to(affine.scale, src);
      stored_bias = numerics::round_to(affine.bias, src);
      return;
    }
    float bamax = 0.0f;
    for (int i = 0; i < g; ++i) bamax = numerics::amax_step(bamax, x[i]);
    if (spec.mode == Mode::nvfp4) {
      scale = numerics::nvfp4_block_scale(bamax, nv);
      dec = numerics::nvfp4_decode_factor(scale.code, nv.three_level, amax);
    } else {
      scale = numerics::mx_block_scale(bamax, ef, spec.scale_rule, src);
      dec = numerics::decode_e8m0(scale.code);
    }
  }

  // (code, decoded value) of x in the current group.
  std::uint32_t round(float x, float* value) const {
    switch (spec.mode) {
      case Mode::nvfp4:
      case Mode::mxfp4: {
        const std::uint8_t c = numerics::encode_e2m1(x * scale.enc);
        *value = numerics::decode_e2m1(c) * dec;
        return c;
      }
      case Mode::mxfp8: {
        const std::uint8_t c = numerics::encode_fp8(spec.elem, x * scale.enc);
        *value = numerics::decode_fp8(spec.elem, c) * dec;
        return c;
      }
      case Mode::affine: {
        const std::uint32_t c = numerics::affine_code(x, affine, numerics::affine_max_code(spec.bits));
        *value = numerics::affine_decode(c, stored_scale, stored_bias);
        return c;
      }
    }
    return 0;
  }
};

void check_hessian(const HessianView& h, std::int64_t K) {
  if (h.shape.size() != 2 || h.shape[0] != K || h.shape[1] != K)
    fail("hessian must have shape [K, K] = [" + std::to_string(K) + ", " + std::to_string(K) +
         "] for w of K = " + std::to_string(K) + " columns, got " + shape_str(h.shape, ShapeStyle::dims));
  if (K > 0 && h.data == nullptr) fail("hessian has no data");
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = 0; j < K; ++j)
      if (!std::isfinite(h.data[i * K + j]))
        fail("hessian holds a non-finite value (" + std::to_string(h.data[i * K + j]) + ") at [" + std::to_string(i) +
             ", " + std::to_string(j) + "]");
  // X^T X summed in float32 by another library may differ from its transpose in the last bits.
  for (std::int64_t i = 0; i < K; ++i)
    for (std::int64_t j = i + 1; j < K; ++j) {
      const double a = h.data[i * K + j], b = h.data[j * K + i];
      const double tol = 1e-4 * std::sqrt(std::fabs(h.data[i * K + i] * h.data[j * K + j]));
      if (std::fabs(a - b) > tol)
        fail("hessian is not symmetric: [" + std::to_string(i) + ", " + std::to_string(j) + "] = " + std::to_string(a) +
             " but [" + std::to_string(j) + ", " + std::to_string(i) + "] = " + std::to_string(b) +
             " (expected H = X^T X)");
    }
}

}  // namespace

Quantized gptq(const TensorView& w, const HessianView& hessian, const QuantSpec& spec, const GptqOptions& opt) {
  if (!is_float(w.dtype)) fail(std::string("w must be float32, float16 or bfloat16, got ") + dtype_name(w.dtype));
  if (w.rank() != 2) fail("w must be a 2-D weight [N, K], got shape " + shape_str(w.shape, ShapeStyle::dims));
  if (spec.scale_search != ScaleSearch::none)
    fail(std::string("scale_search ") + name(spec.scale_search) +
         " does not combine with GPTQ (GPTQ chooses the codes itself); pass scale_search none");
  // GPTQ's grid is the 1x16 round-to-nearest one on the untransformed weight; these options
  // would change it behind the error feedback.
  if (spec.scale_2d || spec.hadamard || spec.sr_seed)
    fail(std::string(spec.scale_2d   ? "scale_2d"
                     : spec.hadamard ? "hadamard"
                                     : "sr_seed") +
         " does not combine with GPTQ; quantize with GPTQ alone");
  ops::QuantizePlan p;
  try {
    p = ops::plan_quantize(ops::arg_of(w), spec);
  } catch (const Error& e) {  // quantize's message about w or the spec, as gptq's
    const std::string m = e.what(), op = "quantize: ";
    fail(m.starts_with(op) ? m.substr(op.size()) : m);
  }
  const std::int64_t N = w.shape[0], K = w.shape[1];
  const int G = p.spec.group_size;
  if (!(opt.damp >= 0.0) || !std::isfinite(opt.damp))
    fail("damp must be a finite number >= 0, got " + std::to_string(opt.damp));
  if (opt.block_size <= 0 || opt.block_size % G != 0)
    fail("block_size must be a positive multiple of the group size " + std::to_string(G) + ", got " +
         std::to_string(opt.block_size));
  check_hessian(hessian, K);

  std::int64_t rows = 0;
  std::vector<double> wd = load_rows(w, &rows, K);
  for (std::size_t i = 0; i < wd.size(); ++i)
    if (!std::isfinite(wd[i]))
      fail("w holds a non-finite value (" + std::to_string(wd[i]) + ") at [" + std::to_string(i / K) + ", " +
           std::to_string(i % K) + "]; GPTQ needs finite weights");

  // Dead inputs (H_ii = 0: the column never saw a non-zero activation) get H_ii = 1 and a zero
  // weight, then the diagonal is dampened by damp * mean(diag H).
  Matrix h(hessian.data, hessian.data + K * K);
  double diag = 0;
  for (std::int64_t i = 0; i < K; ++i) {
    double& hii = h[static_cast<std::size_t>(i * K + i)];
    if (hii == 0.0) {
      hii = 1.0;
      for (std::int64_t r = 0; r < N; ++r) wd[static_cast<std::size_t>(r * K + i)] = 0.0;
    }
    diag += hii;
  }
  const double add = K > 0 ? opt.damp * (diag / static_cast<double>(K)) : 0.0;
  for (std::int64_t i = 0; i < K; ++i) h[static_cast<std::size_t>(i * K + i)] += add;
  const Matrix u = inverse_cholesky_upper(h, K, opt.damp);
  h = Matrix();

  Quantized q = ops::allocate_quantized(p, w.shape);
  Tensor compact(p.scale_dtype, p.compact_scales);
  const bool three_level = p.spec.mode == Mode::nvfp4 && p.spec.global_scale.has_value();
  const float amax = three_level ? *p.spec.global_scale : 0.0f;
  const std::int64_t row_bytes = K * p.spec.bits / 8, groups = K / G, B = opt.block_size;
  const std::size_t scale_size = dtype_size(p.scale_dtype);
  const bool fp4 = p.spec.mode == Mode::nvfp4 || p.spec.mode == Mode::mxfp4;

  // Blocks in order; within a block, each group's errors reach the rest of the block when the
  // group is done, so only the group's own later columns take single updates. The U rows a block
  // needs are packed once (cpu::dense_update's panels) and shared by the chunks of rows.
  constexpr std::int64_t kRows = 48;
  const double* ud = u.data();
  std::vector<double> later, inner;
  for (std::int64_t b0 = 0; b0 < K; b0 += B) {
    const std::int64_t b1 = std::min(K, b0 + B), nb = b1 - b0;
    later.resize(static_cast<std::size_t>(cpu::packed_size(nb, K - b1)));
    cpu::pack_panels(nb, K - b1, ud + b0 * K + b1, K, later.data());
    // group g's U[g0 : g1, g1 : b1] at offset g * packed_size(G, nb)
    const std::int64_t inner_size = cpu::packed_size(G, nb);
    inner.resize(static_cast<std::size_t>(nb / G * inner_size));
    for (std::int64_t g0 = b0; g0 < b1; g0 += G)
      cpu::pack_panels(G, b1 - g0 - G, ud + g0 * K + g0 + G, K, inner.data() + (g0 - b0) / G * inner_size);
    cpu::parallel_for(N, kRows, [&](std::int64_t r0, std::int64_t r1) {
      const std::int64_t R = r1 - r0;
      double* wr = wd.data() + r0 * K;
      std::vector<double> errt(static_cast<std::size_t>(nb * R));  // errt[i - b0][r]: the errors, column-major
      GroupQuantizer quant{p.spec, w.dtype, numerics::nvfp4_tensor(three_level, amax),
                           numerics::mx_elem(p.spec.mode, p.spec.elem), amax};
      std::vector<float> group(static_cast<std::size_t>(G));
      for (std::int64_t g0 = b0; g0 < b1; g0 += G) {
        const std::int64_t g1 = g0 + G;
        for (std::int64_t r = 0; r < R; ++r) {
          double* row = wr + r * K;
          // the group's scale, from its weights as updated so far
          for (int k = 0; k < G; ++k) group[static_cast<std::size_t>(k)] = static_cast<float>(row[g0 + k]);
          quant.choose(group.data(), G);
          const std::int64_t gi = (r0 + r) * groups + g0 / G;
          std::byte* sp = compact.bytes() + static_cast<std::size_t>(gi) * scale_size;
          if (p.spec.mode == Mode::affine) {
            detail::store_f32(quant.affine.scale, w.dtype, sp);
            detail::store_f32(quant.affine.bias, w.dtype, q.biases.bytes() + static_cast<std::size_t>(gi) * scale_size);
          } else {
            *reinterpret_cast<std::uint8_t*>(sp) = quant.scale.code;
          }
          std::uint8_t* packed = q.packed.data<std::uint8_t>() + (r0 + r) * row_bytes;
          for (std::int64_t i = g0; i < g1; ++i) {
            const double* ui = ud + i * K;
            float value = 0.0f;
            const std::uint32_t code = quant.round(static_cast<float>(row[i]), &value);
            if (fp4)
              put_nibble(packed, i, code);
            else if (p.spec.mode == Mode::mxfp8)
              packed[i] = static_cast<std::uint8_t>(code);
            else
              put_bits(packed, i, p.spec.bits, code);
            const double e = (row[i] - static_cast<double>(value)) / ui[i];
            errt[static_cast<std::size_t>((i - b0) * R + r)] = e;
            axpy_sub(row + i + 1, e, ui + i + 1, g1 - i - 1);
          }
        }
        cpu::dense_update(R, b1 - g1, G, errt.data() + (g0 - b0) * R, R, inner.data() + (g0 - b0) / G * inner_size,
                          G * cpu::kDensePanel, wr + g1, K, /*add=*/false);
      }
      cpu::dense_update(R, K - b1, nb, errt.data(), R, later.data(), nb * cpu::kDensePanel, wr + b1, K,
                        /*add=*/false);
    });
  }
  q.scales = p.spec.layout == Layout::swizzled ? swizzle_scales(compact.view()) : compact;
  return q;
}

Quantized gptq(const TensorView& w, const TensorView& hessian, const QuantSpec& spec, const GptqOptions& opt) {
  if (hessian.dtype != DType::float32)
    fail(std::string("hessian must be float32 or float64, got ") + dtype_name(hessian.dtype));
  const detail::Rows c = detail::rows_of(hessian);
  std::vector<double> h(static_cast<std::size_t>(c.numel));
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = detail::load_f32(c.data + i * 4, DType::float32);
  return gptq(w, HessianView{h.data(), hessian.shape}, spec, opt);
}

void accumulate_hessian(const TensorView& x, std::span<double> hessian) {
  if (!is_float(x.dtype))
    throw Error(std::string("accumulate_hessian: x must be float32, float16 or bfloat16, got ") + dtype_name(x.dtype));
  if (x.rank() < 1) throw Error("accumulate_hessian: x must have rank >= 1 ([..., K])");
  const std::int64_t K = x.shape.back();
  if (static_cast<std::int64_t>(hessian.size()) != K * K)
    throw Error("accumulate_hessian: hessian must hold [K, K] = " + std::to_string(K * K) +
                " values for x of K = " + std::to_string(K) + ", got " + std::to_string(hessian.size()));
  const detail::Rows c = detail::rows_of(x);
  const std::int64_t rows = K == 0 ? 0 : c.numel / K;
  const std::size_t size = dtype_size(x.dtype);
  // The batch's X^T X, upper triangle: D[i, j] (j >= i) sums x[s, i] * x[s, j] over runs of
  // kDenseDepth samples (cpu::dense_update's order: samples in order within a run, runs in
  // order), for strips of rows i in parallel, so the sums do not depend on the thread count.
  // Adding D to both triangles keeps a symmetric H exactly symmetric.
  constexpr std::int64_t kStrip = 48;
  std::vector<double> d(static_cast<std::size_t>(K * K), 0.0);
  static_assert(kStrip % cpu::kDensePanel == 0);
  const std::int64_t run = std::min(rows, cpu::kDenseDepth);
  std::vector<double> xb(static_cast<std::size_t>(run * K)), xp(static_cast<std::size_t>(cpu::packed_size(run, K)));
  for (std::int64_t s0 = 0; s0 < rows; s0 += cpu::kDenseDepth) {
    const std::int64_t s1 = std::min(rows, s0 + cpu::kDenseDepth), kd = s1 - s0;
    cpu::parallel_for(kd, 16, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b * K; i < e * K; ++i)
        xb[static_cast<std::size_t>(i)] =
            detail::load_f32(c.data + static_cast<std::size_t>(s0 * K + i) * size, x.dtype);
    });
    const std::int64_t panels = (K + cpu::kDensePanel - 1) / cpu::kDensePanel;
    cpu::parallel_for(panels, 16, [&](std::int64_t b, std::int64_t e) {
      const std::int64_t j0 = b * cpu::kDensePanel;
      cpu::pack_panels(kd, std::min(K, e * cpu::kDensePanel) - j0, xb.data() + j0, K, xp.data() + j0 * kd);
    });
    cpu::parallel_for(K, kStrip, [&](std::int64_t b, std::int64_t e) {
      cpu::dense_update(e - b, K - b, kd, xb.data() + b, K, xp.data() + b * kd, kd * cpu::kDensePanel,
                        d.data() + b * K + b, K, /*add=*/true);
    });
  }
  cpu::parallel_for(K, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      for (std::int64_t j = 0; j < K; ++j) {
        const double v = j >= i ? d[static_cast<std::size_t>(i * K + j)] : d[static_cast<std::size_t>(j * K + i)];
        hessian[static_cast<std::size_t>(i * K + j)] += v;
      }
  });
}

}  // namespace microscale
