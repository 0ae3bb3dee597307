#include <vector>

#include "core/numerics.hpp"
#include "reference/reference.hpp"

namespace microscale::reference {

void matmul(const float* x, const float* w, std::int64_t M, std::int64_t N, std::int64_t K, bool transpose,
            const float* bias, float* y) {
  for (std::int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) acc += xr[k] * (transpose ? w[n * K + k] : w[k * N + n]);
      y[m * N + n] = bias ? acc + bias[n] : acc;
    }
  }
}

namespace {

// Element values of one packed row.
std::vector<float> element_values(const std::uint8_t* row, std::int64_t K, const QuantSpec& spec) {
  std::vector<float> v(static_cast<std::size_t>(K));
  for (std::int64_t k = 0; k < K; ++k) {
    if (spec.mode == Mode::mxfp8)
      v[static_cast<std::size_t>(k)] = numerics::decode_fp8(spec.elem, row[k]);
    else
      v[static_cast<std::size_t>(k)] = numerics::decode_e2m1(static_cast<std::uint32_t>(row[k / 2] >> ((k & 1) * 4)));
  }
  return v;
}

float scale_value(std::uint8_t code, Mode mode) {
  return mode == Mode::nvfp4 ? numerics::decode_e4m3(code) : numerics::decode_e8m0(code);
}

}  // namespace

void qqmm(const std::uint8_t* px, const std::uint8_t* sx, const std::uint8_t* pw, const std::uint8_t* sw,
          std::int64_t M, std::int64_t N, std::int64_t K, const QuantSpec& spec, float alpha, const float* bias,
          float* y) {
  const int g = spec.group_size;
  const std::int64_t groups = K / g;
  const std::int64_t row_bytes = K * spec.bits / 8;
  std::vector<std::vector<float>> wv(static_cast<std::size_t>(N));
  for (std::int64_t n = 0; n < N; ++n) wv[static_cast<std::size_t>(n)] = element_values(pw + n * row_bytes, K, spec);
  for (std::int64_t m = 0; m < M; ++m) {
    const std::vector<float> xv = element_values(px + m * row_bytes, K, spec);
    for (std::int64_t n = 0; n < N; ++n) {
      const std::vector<float>& wn = wv[static_cast<std::size_t>(n)];
      float acc = 0.0f;
      for (std::int64_t b = 0; b < groups; ++b) {
        float dot = 0.0f;
        for (std::int64_t k = b * g; k < (b + 1) * g; ++k)
          dot += xv[static_cast<std::size_t>(k)] * wn[static_cast<std::size_t>(k)];
        const float s = scale_value(sx[m * groups + b], spec.mode) * scale_value(sw[n * groups + b], spec.mode);
        acc += s * dot;
      }
      const float out = alpha * acc;
      y[m * N + n] = bias ? out + bias[n] : out;
    }
  }
}

}  // namespace microscale::reference
