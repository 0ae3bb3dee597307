// One call of one op on one thread, for instruction counts under valgrind (which runs the
// AVX2 path of the x86 build): repeatable on a shared machine where timings are not. The op's
// kernel is the function to collect, e.g. for the GEMV:
//
//   valgrind --tool=callgrind --toggle-collect='microscale::cpu::quantized_matmul(*'
//       build/bench/microscale_op_once gemv nvfp4 4096 4096
//   (instructions per weight = the collected total / (N * K))
//
//   microscale_op_once gemv MODE N K [M] [x dtype: f32|bf16|f16]   quantized_matmul, W [N, K]
//   microscale_op_once quantize MODE ROWS K [dtype: f32|bf16]       quantize (nvfp4: three-level)
// MODE: nvfp4, mxfp4, mxfp8, mxfp8-e5m2, affine4-g64, affine8-g64; nvfp4-mse and mxfp4-mse search
// the scales.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "microscale/microscale.hpp"

namespace ms = microscale;

namespace {

ms::QuantSpec spec_of(const std::string& mode) {
  if (mode.ends_with("-mse")) {
    ms::QuantSpec s = spec_of(mode.substr(0, mode.size() - 4));
    s.scale_search = ms::ScaleSearch::mse;
    return s;
  }
  ms::QuantSpec s;
  if (mode == "mxfp8-e5m2") {
    s.mode = ms::Mode::mxfp8;
    s.elem = ms::Elem::e5m2;
  } else if (mode.starts_with("affine")) {
    s.mode = ms::Mode::affine;
    s.bits = mode[6] - '0';
    s.group_size = std::atoi(mode.c_str() + mode.find("-g") + 2);
  } else {
    s.mode = ms::mode_from_name(mode);
  }
  return s;
}

ms::DType dtype_of(const char* name) {
  if (std::strcmp(name, "bf16") == 0) return ms::DType::bfloat16;
  if (std::strcmp(name, "f16") == 0) return ms::DType::float16;
  return ms::DType::float32;
}

// Gaussian values in dtype t (scale sigma).
std::vector<std::byte> values(std::int64_t n, float sigma, ms::DType t, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> z(0.0f, sigma);
  std::vector<std::byte> out(static_cast<std::size_t>(n) * ms::dtype_size(t));
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = z(rng);
    if (t == ms::DType::float32) {
      std::memcpy(out.data() + i * 4, &v, 4);
    } else {
      const std::uint16_t h = t == ms::DType::bfloat16 ? ms::encode_bf16(v) : ms::encode_f16(v);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s gemv|quantize MODE ROWS K [M] [dtype]\n", argv[0]);
    return 2;
  }
  try {
    const std::string op = argv[1];
    ms::QuantSpec s = spec_of(argv[2]);
    const std::int64_t rows = std::atoll(argv[3]), K = std::atoll(argv[4]);
    ms::set_num_threads(1);
    if (op == "gemv") {
      const std::int64_t M = argc > 5 ? std::atoll(argv[5]) : 1;
      const ms::DType xt = argc > 6 ? dtype_of(argv[6]) : ms::DType::float32;
      const auto w = values(rows * K, 0.02f, ms::DType::float32, 1);
      const ms::TensorView wv(w.data(), ms::DType::float32, {rows, K});
      if (s.mode == ms::Mode::nvfp4) s.global_scale = ms::global_scale(wv);
      const ms::Quantized q = ms::quantize(wv, s);
      const auto x = values(M * K, 1.0f, xt, 2);
      const ms::Tensor y = ms::quantized_matmul(ms::TensorView(x.data(), xt, {M, K}), q, true);
      std::printf("y: %lld values\n", static_cast<long long>(y.numel()));
    } else if (op == "quantize") {
      const ms::DType xt = argc > 5 ? dtype_of(argv[5]) : ms::DType::float32;
      const auto w = values(rows * K, 0.02f, xt, 1);
      const ms::TensorView wv(w.data(), xt, {rows, K});
      if (s.mode == ms::Mode::nvfp4) s.global_scale = ms::global_scale(wv);
      const ms::Quantized q = ms::quantize(wv, s);
      std::printf("packed bytes = %zu\n", q.packed.nbytes());
    } else {
      std::fprintf(stderr, "unknown op '%s'\n", op.c_str());
      return 2;
    }
  } catch (const ms::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
