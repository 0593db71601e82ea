// weave/fp8.cuh: the 8-bit float formats e4m3 and e5m2 and their conversions to and from
// double, without the toolkit's cuda_fp8.h, in integer arithmetic only, so the host (the
// equivalence test of collectives/src/fp8.rs compiles this file with the system's C++
// compiler) and every GPU architecture give the same bits:
//
//   widening   exact (every 8-bit value is a double);
//   narrowing  round to nearest, ties to even; a value beyond the largest finite one, infinity
//              included, saturates to it (NVIDIA's __NV_SATFINITE); NaN becomes 0x7f; zero
//              and values that round to zero keep their sign.
//
// e4m3: bias 7, no infinity, S.1111.111 is NaN, largest 448 (0x7e).
// e5m2: bias 15, S.11111.00 is infinity, S.11111.01-11 NaN, largest 57344 (0x7b).
#ifndef WEAVE_FP8_CUH
#define WEAVE_FP8_CUH

#include "weave/types.cuh"

namespace weave {

// The layout of an 8-bit float format.
struct Fp8Format {
  int mantissa_bits;
  int bias;
  // The magnitude code of the largest finite value.
  uint32_t max_finite;
  // Whether S.11111.00 is infinity (e5m2) rather than a number.
  bool has_infinity;
};

constexpr Fp8Format FP8_E4M3 = {3, 7, 0x7e, false};
constexpr Fp8Format FP8_E5M2 = {2, 15, 0x7b, true};
// What a NaN narrows to.
constexpr uint32_t FP8_NAN = 0x7f;

WEAVE_DEVICE uint64_t fp8_double_bits(double x) {
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t b;
  __builtin_memcpy(&b, &x, sizeof b);
  return b;
#endif
}

WEAVE_DEVICE double fp8_bits_double(uint64_t b) {
#if defined(__CUDACC_RTC__) || defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double x;
  __builtin_memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// The value of `code` in format `f`, exactly.
WEAVE_DEVICE double fp8_to_double(uint32_t code, Fp8Format f) {
  const uint64_t sign = static_cast<uint64_t>(code & 0x80) << 56;
  const uint32_t magnitude = code & 0x7f;
  if (magnitude > f.max_finite) {
    const bool infinite = f.has_infinity && magnitude == f.max_finite + 1;
    return fp8_bits_double(sign | (infinite ? 0x7ff0000000000000ull : 0x7ff8000000000000ull));
  }
  if (magnitude == 0) return fp8_bits_double(sign);
  const int exponent_field = static_cast<int>(magnitude >> f.mantissa_bits);
  uint64_t significand = magnitude & ((1u << f.mantissa_bits) - 1);
  // value = significand × 2^scale, the significand with its implicit bit when normal.
  int scale = 1 - f.bias - f.mantissa_bits;
  if (exponent_field != 0) {
    significand |= 1ull << f.mantissa_bits;
    scale = exponent_field - f.bias - f.mantissa_bits;
  }
  // Normalize into a double: the leading bit of the significand becomes bit 52.
  int top = 0;
  while ((significand >> (top + 1)) != 0) ++top;
  const uint64_t fraction = (significand << (52 - top)) & ((1ull << 52) - 1);
  const uint64_t biased = static_cast<uint64_t>(scale + top + 1023);
  return fp8_bits_double(sign | (biased << 52) | fraction);
}

// `x` narrowed to format `f` (see the file comment).
WEAVE_DEVICE uint32_t fp8_from_double(double x, Fp8Format f) {
  const uint64_t bits = fp8_double_bits(x);
  const uint32_t sign = static_cast<uint32_t>(bits >> 56) & 0x80;
  const int exponent_field = static_cast<int>((bits >> 52) & 0x7ff);
  const uint64_t fraction = bits & ((1ull << 52) - 1);
  if (exponent_field == 0x7ff) return fraction != 0 ? FP8_NAN : (sign | f.max_finite);
  // Subnormal doubles are far below half the smallest 8-bit value.
  if (exponent_field == 0) return sign;
  const int exponent = exponent_field - 1023;
  const uint64_t significand = fraction | (1ull << 52);  // |x| = significand × 2^(exponent - 52)
  const int min_normal = 1 - f.bias;
  // The spacing of the 8-bit values at |x|: 2^quantum.
  const int quantum = (exponent > min_normal ? exponent : min_normal) - f.mantissa_bits;
  const int shift = 52 + quantum - exponent;  // at least 52 - mantissa_bits
  if (shift >= 54) return sign;               // |x| < half the spacing
  uint64_t q = significand >> shift;
  const uint64_t rest = significand & ((1ull << shift) - 1);
  const uint64_t half = 1ull << (shift - 1);
  if (rest > half || (rest == half && (q & 1) != 0)) ++q;
  // |x| rounds to q × 2^quantum.
  uint32_t magnitude;
  if (exponent < min_normal) {
    // Subnormal; q = 2^mantissa_bits is the smallest normal, whose code is q too.
    magnitude = static_cast<uint32_t>(q);
  } else {
    int e = exponent;
    if (q == (2ull << f.mantissa_bits)) {
      q >>= 1;
      ++e;
    }
    const int field = e + f.bias;
    if (field > 0x7f >> f.mantissa_bits) return sign | f.max_finite;
    magnitude = (static_cast<uint32_t>(field) << f.mantissa_bits) | static_cast<uint32_t>(q - (1ull << f.mantissa_bits));
  }
  return sign | (magnitude > f.max_finite ? f.max_finite : magnitude);
}

}  // namespace weave

#endif  // WEAVE_FP8_CUH
