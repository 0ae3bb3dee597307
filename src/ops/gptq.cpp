// GPTQ (include/microscale/gptq.hpp, docs/numerics.md "GPTQ"). Everything is float64 except the
// rounding itself, which takes the working weight to float32 and uses the spec's per-group math
// (core/numerics.hpp) exactly as quantize does, so the bytes are standard.
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
// y[0..n) += a * x[0..n)
void axpy_add(double* y, double a, const double* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// Four rows w[0..3] (stride ldw) take a block's errors e[row][k] (stride lde) through the U rows
// u[k] (stride ldu), k in order: w[r][j] -= e[r][k] * u[k][j], each step rounded, as axpy_sub
// row by row would; done four k at a time per loaded value so that each w value is loaded and
// stored once per four steps and each u value serves four rows.
void update_4_rows(double* w, std::int64_t ldw, const double* e, std::int64_t lde, const double* u, std::int64_t ldu,
                   std::int64_t nk, std::int64_t n) {
  double* w0 = w;
  double* w1 = w + ldw;
  double* w2 = w + 2 * ldw;
  double* w3 = w + 3 * ldw;
  std::int64_t k = 0;
  for (; k + 4 <= nk; k += 4) {
    const double* u0 = u + k * ldu;
    const double* u1 = u0 + ldu;
    const double* u2 = u1 + ldu;
    const double* u3 = u2 + ldu;
    const double* e0 = e + k;
    const double* e1 = e0 + lde;
    const double* e2 = e1 + lde;
    const double* e3 = e2 + lde;
    for (std::int64_t j = 0; j < n; ++j) {
      const double a = u0[j], b = u1[j], c = u2[j], d = u3[j];
      w0[j] = (((w0[j] - e0[0] * a) - e0[1] * b) - e0[2] * c) - e0[3] * d;
      w1[j] = (((w1[j] - e1[0] * a) - e1[1] * b) - e1[2] * c) - e1[3] * d;
      w2[j] = (((w2[j] - e2[0] * a) - e2[1] * b) - e2[2] * c) - e2[3] * d;
      w3[j] = (((w3[j] - e3[0] * a) - e3[1] * b) - e3[2] * c) - e3[3] * d;
    }
  }
  for (; k < nk; ++k)
    for (int r = 0; r < 4; ++r) axpy_sub(w + r * ldw, e[r * lde + k], u + k * ldu, n);
}

// U upper triangular with U^T U = H^-1, from the factorization H = V V^T with V upper triangular
// (a Cholesky factorization run from the last index down), then U = V^-1. This is the unique
// upper Cholesky factor of H^-1 and costs two triangular passes instead of a Cholesky, an inverse
// and a second Cholesky. `h` (the dampened H, upper triangle read) is overwritten by V.
Matrix inverse_cholesky_upper(Matrix& h, std::int64_t K, double damp) {
  // V[i][j] = (H[i][j] - sum_{k > j} V[i][k] V[j][k]) / V[j][j], columns j from the last down, in
  // panels of kPanel columns: the sum's part over the finished columns (k >= the panel's end) is
  // taken first for the whole panel, so each row's finished part is read once per panel instead
  // of once per column; the rest, inside the panel, column by column.
  double* v = h.data();
  constexpr std::int64_t kPanel = 64;
  for (std::int64_t j1 = K; j1 > 0;) {
    const std::int64_t j0 = std::max<std::int64_t>(0, j1 - kPanel);
    cpu::parallel_for(j1, 16, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) {
        double* vi = v + i * K;
        for (std::int64_t j = std::max(i, j0); j < j1; ++j) vi[j] -= dot(vi + j1, v + j * K + j1, K - j1);
      }
    });
    for (std::int64_t j = j1 - 1; j >= j0; --j) {
      double* vj = v + j * K;
      const double d = vj[j] - dot(vj + j + 1, vj + j + 1, j1 - 1 - j);
      if (!(d > 0.0) || !std::isfinite(d))
        fail("hessian is not positive definite after dampening (damp " + std::to_string(damp) + ", pivot " +
             std::to_string(j) + " of " + std::to_string(K) +
             "); pass a larger damp, or accumulate H from more (and more varied) samples");
      vj[j] = std::sqrt(d);
      const double pivot = vj[j];
      cpu::parallel_for(j, 64, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) {
          double* vi = v + i * K;
          vi[j] = (vi[j] - dot(vi + j + 1, vj + j + 1, j1 - 1 - j)) / pivot;
        }
      });
    }
    j1 = j0;
  }
  // Row c of U solves U[c] V = e_c: forward substitution in axpy form over the rows of V. Tiles
  // of rows share each V row while it is in cache.
  Matrix u(static_cast<std::size_t>(K * K), 0.0);
  constexpr std::int64_t kTile = 32;
  cpu::parallel_for((K + kTile - 1) / kTile, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t t = b; t < e; ++t) {
      const std::int64_t c0 = t * kTile, c1 = std::min(K, c0 + kTile);
      for (std::int64_t c = c0; c < c1; ++c) u[static_cast<std::size_t>(c * K + c)] = 1.0;
      for (std::int64_t k = c0; k < K; ++k) {
        const double* vk = v + k * K;
        for (std::int64_t c = c0; c < std::min(c1, k + 1); ++c) {
          double* uc = u.data() + c * K;
          uc[k] /= vk[k];
          axpy_sub(uc + k + 1, uc[k], vk + k + 1, K - 1 - k);
        }
      }
    }
  });
  return u;
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

  constexpr std::int64_t kRows = 32, kColTile = 512;
  cpu::parallel_for(N, kRows, [&](std::int64_t r0, std::int64_t r1) {
    const std::int64_t R = r1 - r0;
    double* wr = wd.data() + r0 * K;
    std::vector<double> err(static_cast<std::size_t>(R * B));
    std::vector<GroupQuantizer> gq(static_cast<std::size_t>(R),
                                   GroupQuantizer{p.spec, w.dtype, numerics::nvfp4_tensor(three_level, amax),
                                                  numerics::mx_elem(p.spec.mode, p.spec.elem), amax});
    std::vector<float> group(static_cast<std::size_t>(G));
    for (std::int64_t b0 = 0; b0 < K; b0 += B) {
      const std::int64_t b1 = std::min(K, b0 + B);
      for (std::int64_t i = b0; i < b1; ++i) {
        const double* ui = u.data() + i * K;
        for (std::int64_t r = 0; r < R; ++r) {
          double* row = wr + r * K;
          GroupQuantizer& quant = gq[static_cast<std::size_t>(r)];
          if (i % G == 0) {  // the group's scale, from its weights as updated so far
            for (int k = 0; k < G; ++k) group[static_cast<std::size_t>(k)] = static_cast<float>(row[i + k]);
            quant.choose(group.data(), G);
            const std::int64_t gi = (r0 + r) * groups + i / G;
            std::byte* sp = compact.bytes() + static_cast<std::size_t>(gi) * scale_size;
            if (p.spec.mode == Mode::affine) {
              detail::store_f32(quant.affine.scale, w.dtype, sp);
              detail::store_f32(quant.affine.bias, w.dtype,
                                q.biases.bytes() + static_cast<std::size_t>(gi) * scale_size);
            } else {
              *reinterpret_cast<std::uint8_t*>(sp) = quant.scale.code;
            }
          }
          float value = 0.0f;
          const std::uint32_t code = quant.round(static_cast<float>(row[i]), &value);
          std::uint8_t* packed = q.packed.data<std::uint8_t>() + (r0 + r) * row_bytes;
          if (fp4)
            put_nibble(packed, i, code);
          else if (p.spec.mode == Mode::mxfp8)
            packed[i] = static_cast<std::uint8_t>(code);
          else
            put_bits(packed, i, p.spec.bits, code);
          const double e = (row[i] - static_cast<double>(value)) / ui[i];
          err[static_cast<std::size_t>(r * B + (i - b0))] = e;
          axpy_sub(row + i + 1, e, ui + i + 1, b1 - i - 1);
        }
      }
      // The block's errors reach the later columns, a tile of columns at a time so that the U rows
      // in use stay in cache across the rows of the chunk.
      for (std::int64_t j0 = b1; j0 < K; j0 += kColTile) {
        const std::int64_t n = std::min(K, j0 + kColTile) - j0;
        std::int64_t r = 0;
        for (; r + 4 <= R; r += 4)
          update_4_rows(wr + r * K + j0, K, err.data() + r * B, B, u.data() + b0 * K + j0, K, b1 - b0, n);
        for (; r < R; ++r)
          for (std::int64_t k = b0; k < b1; ++k)
            axpy_sub(wr + r * K + j0, err[static_cast<std::size_t>(r * B + (k - b0))], u.data() + k * K + j0, n);
      }
    }
  });
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
  std::int64_t rows = 0;
  const std::vector<double> xd = load_rows(x, &rows, K);
  // The batch's X^T X, upper triangle only: D[i, j] (j >= i) sums x[s, i] * x[s, j] over the
  // samples s in order, so the sums do not depend on the thread count. Tiles of samples and
  // columns keep x's part in cache while a chunk of rows takes it. Adding D to both triangles
  // keeps a symmetric H exactly symmetric.
  std::vector<double> d(static_cast<std::size_t>(K * K), 0.0);
  constexpr std::int64_t kSamples = 64, kCols = 512;
  cpu::parallel_for(K, 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t s0 = 0; s0 < rows; s0 += kSamples) {
      const std::int64_t s1 = std::min(rows, s0 + kSamples);
      for (std::int64_t j0 = b; j0 < K; j0 += kCols) {
        const std::int64_t j1 = std::min(K, j0 + kCols);
        for (std::int64_t i = b; i < e; ++i) {
          const std::int64_t from = std::max(i, j0);
          if (from >= j1) continue;
          for (std::int64_t s = s0; s < s1; ++s) {
            const double* xs = xd.data() + s * K;
            axpy_add(d.data() + i * K + from, xs[i], xs + from, j1 - from);
          }
        }
      }
    }
  });
  cpu::parallel_for(K, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      for (std::int64_t j = 0; j < K; ++j) {
        const double v = j >= i ? d[static_cast<std::size_t>(i * K + j)] : d[static_cast<std::size_t>(j * K + i)];
        hessian[static_cast<std::size_t>(i * K + j)] += v;
      }
  });
}

}  // namespace microscale
