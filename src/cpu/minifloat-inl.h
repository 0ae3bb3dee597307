// Per-target SIMD decode of minifloat magnitudes (E4M3, E5M2), shared by the CPU kernels.
// Highway's -inl.h pattern: included after hwy/foreach_target.h, once per target.
//
// Never lets a subnormal float32 enter a floating-point operation: Zen 4 takes a microcode
// assist on each (measured: two-level nvfp4 dequantize of weights with std 0.02, whose E4M3
// scales are all subnormal, ran 6x slower when they were decoded by multiplying subnormal bits).
#if defined(MICROSCALE_CPU_MINIFLOAT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MICROSCALE_CPU_MINIFLOAT_INL_H_
#undef MICROSCALE_CPU_MINIFLOAT_INL_H_
#else
#define MICROSCALE_CPU_MINIFLOAT_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace microscale::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Float32 bits of the value of magnitude codes mag (0 .. 0x7F, sign dropped) of a minifloat with
// M mantissa bits and exponent bias B. Normal codes rebias their exponent by an integer add;
// subnormal codes (exponent field 0) are their mantissa integer times 2^(1-B-M), exactly.
// Codes above the largest finite one come out as large finite values: callers patch Inf/NaN.
template <int M, int B, class DI>
HWY_INLINE hn::Vec<DI> MinifloatMagnitudeBits(DI di, hn::Vec<DI> mag) {
  const hn::Repartition<float, DI> df;
  const auto normal = hn::Add(hn::ShiftLeft<23 - M>(mag), hn::Set(di, (127 - B) << 23));
  constexpr float kSubnormalStep = 1.0f / static_cast<float>(1 << (B + M - 1));
  const auto subnormal = hn::BitCast(di, hn::Mul(hn::ConvertTo(df, mag), hn::Set(df, kSubnormalStep)));
  return hn::IfThenElse(hn::Lt(mag, hn::Set(di, 1 << M)), subnormal, normal);
}

}  // namespace microscale::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
