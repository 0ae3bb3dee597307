#include <microscale/microscale.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  namespace ms = microscale;
  std::vector<float> w(4 * 64);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.1f * static_cast<float>(i));
  const ms::TensorView x(w.data(), ms::DType::float32, {4, 64});

  ms::QuantSpec spec;                       // nvfp4 by default
  spec.global_scale = ms::global_scale(x);  // tensor amax: three-level NVFP4
  ms::Quantized q = ms::quantize(x, spec);  // q.packed uint8 [4, 32], q.scales E4M3 bytes [4, 4]
  ms::Tensor y = ms::dequantize(q, ms::DType::float32);

  double err = 0, ref = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double d = w[i] - y.data<float>()[i];
    err += d * d;
    ref += static_cast<double>(w[i]) * w[i];
  }
  std::printf("nvfp4: %.3f bits/value, relative error %.4f\n", ms::bits_per_value(q.spec), std::sqrt(err / ref));
  return std::sqrt(err / ref) < 0.15 ? 0 : 1;
}
