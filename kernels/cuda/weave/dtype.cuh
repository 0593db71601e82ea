// weave/dtype.cuh: the element types of the collectives and their arithmetic, without the
// toolkit's cuda_fp16.h / cuda_bf16.h (NVRTC alone does not ship them).
//
//   half_t   IEEE binary16, conversions with cvt.f32.f16 / cvt.rn.f16.f32, add/mul/min/max in
//            f16 (round to nearest even);
//   bf16_t   bfloat16, conversions by bit shift / cvt.rn.bf16.f32, arithmetic in bf16
//            (sm_90 has add/mul.bf16; older targets compute in f32 and round once);
//   packed   f16x2 / bf16x2 add, min, max on a u32 holding two elements (element 0 in the low
//            half), for 16-byte vector reductions;
// and Sum, Prod, Min, Max functors over every element type (integers wrap, like the host).
#ifndef WEAVE_DTYPE_CUH
#define WEAVE_DTYPE_CUH

#include "weave/types.cuh"

namespace weave {

// IEEE half precision, as raw bits.
struct alignas(2) half_t {
  uint16_t bits;
};

// bfloat16, as raw bits (the high half of an f32).
struct alignas(2) bf16_t {
  uint16_t bits;
};

static_assert(sizeof(half_t) == 2 && sizeof(bf16_t) == 2, "weave: 16-bit floats are 2 bytes");

// ---- conversions ----------------------------------------------------------------------------

WEAVE_DEVICE float to_float(half_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}

WEAVE_DEVICE float to_float(bf16_t b) { return __uint_as_float(static_cast<uint32_t>(b.bits) << 16); }

// f32 -> f16, round to nearest even.
WEAVE_DEVICE half_t half_from_float(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

// f32 -> bf16, round to nearest even (NaN stays NaN).
WEAVE_DEVICE bf16_t bf16_from_float(float f) {
  bf16_t b;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(f));
#else
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    b.bits = static_cast<uint16_t>((u >> 16) | 0x40u);
  } else {
    b.bits = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
#endif
  return b;
}

// One binary PTX instruction INSTR over 16-bit floats T (half_t, bf16_t): T NAME(T a, T b).
#define WEAVE_BINARY_16(NAME, T, INSTR)                                             \
  WEAVE_DEVICE T NAME(T a, T b) {                                                   \
    T r;                                                                            \
    asm(INSTR " %0, %1, %2;" : "=h"(r.bits) : "h"(a.bits), "h"(b.bits));           \
    return r;                                                                       \
  }

// One binary PTX instruction INSTR over packed pairs: uint32_t NAME(uint32_t a, uint32_t b).
#define WEAVE_BINARY_X2(NAME, INSTR)                                                \
  WEAVE_DEVICE uint32_t NAME(uint32_t a, uint32_t b) {                              \
    uint32_t r;                                                                     \
    asm(INSTR " %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));                           \
    return r;                                                                       \
  }

// ---- scalar arithmetic of 16-bit floats -----------------------------------------------------

WEAVE_BINARY_16(add, half_t, "add.rn.f16")
WEAVE_BINARY_16(mul, half_t, "mul.rn.f16")

WEAVE_DEVICE half_t min(half_t a, half_t b) { return to_float(b) < to_float(a) ? b : a; }
WEAVE_DEVICE half_t max(half_t a, half_t b) { return to_float(b) > to_float(a) ? b : a; }

#if __CUDA_ARCH__ >= 900
WEAVE_BINARY_16(add, bf16_t, "add.rn.bf16")
WEAVE_BINARY_16(mul, bf16_t, "mul.rn.bf16")
#else
WEAVE_DEVICE bf16_t add(bf16_t a, bf16_t b) { return bf16_from_float(to_float(a) + to_float(b)); }
WEAVE_DEVICE bf16_t mul(bf16_t a, bf16_t b) { return bf16_from_float(to_float(a) * to_float(b)); }
#endif

WEAVE_DEVICE bf16_t min(bf16_t a, bf16_t b) { return to_float(b) < to_float(a) ? b : a; }
WEAVE_DEVICE bf16_t max(bf16_t a, bf16_t b) { return to_float(b) > to_float(a) ? b : a; }

// ---- packed pairs (element 0 in the low 16 bits) --------------------------------------------

WEAVE_BINARY_X2(add_f16x2, "add.rn.f16x2")
WEAVE_BINARY_X2(min_f16x2, "min.f16x2")
WEAVE_BINARY_X2(max_f16x2, "max.f16x2")

#if __CUDA_ARCH__ >= 900
WEAVE_BINARY_X2(add_bf16x2, "add.rn.bf16x2")
#else
WEAVE_DEVICE uint32_t add_bf16x2(uint32_t a, uint32_t b) {
  const bf16_t lo = add(bf16_t{static_cast<uint16_t>(a)}, bf16_t{static_cast<uint16_t>(b)});
  const bf16_t hi = add(bf16_t{static_cast<uint16_t>(a >> 16)}, bf16_t{static_cast<uint16_t>(b >> 16)});
  return static_cast<uint32_t>(lo.bits) | (static_cast<uint32_t>(hi.bits) << 16);
}
#endif

WEAVE_BINARY_X2(min_bf16x2, "min.bf16x2")
WEAVE_BINARY_X2(max_bf16x2, "max.bf16x2")

#undef WEAVE_BINARY_16
#undef WEAVE_BINARY_X2

// ---- reduction functors ---------------------------------------------------------------------
// Op::apply(a, b) for every element type: f64, f32, half_t, bf16_t, i64, i32, u64, u32, i8, u8.
// Integer sums and products wrap (computed unsigned), like the host collectives.

namespace detail {
template <typename T>
struct Unsigned {
  typedef T type;
};
template <>
struct Unsigned<int64_t> {
  typedef uint64_t type;
};
template <>
struct Unsigned<int32_t> {
  typedef uint32_t type;
};
template <>
struct Unsigned<int8_t> {
  typedef uint8_t type;
};
}  // namespace detail

struct Sum {
  template <typename T>
  WEAVE_DEVICE static T apply(T a, T b) {
    typedef typename detail::Unsigned<T>::type U;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
  WEAVE_DEVICE static float apply(float a, float b) { return a + b; }
  WEAVE_DEVICE static double apply(double a, double b) { return a + b; }
  WEAVE_DEVICE static half_t apply(half_t a, half_t b) { return add(a, b); }
  WEAVE_DEVICE static bf16_t apply(bf16_t a, bf16_t b) { return add(a, b); }
};

struct Prod {
  template <typename T>
  WEAVE_DEVICE static T apply(T a, T b) {
    typedef typename detail::Unsigned<T>::type U;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  }
  WEAVE_DEVICE static float apply(float a, float b) { return a * b; }
  WEAVE_DEVICE static double apply(double a, double b) { return a * b; }
  WEAVE_DEVICE static half_t apply(half_t a, half_t b) { return mul(a, b); }
  WEAVE_DEVICE static bf16_t apply(bf16_t a, bf16_t b) { return mul(a, b); }
};

struct Min {
  template <typename T>
  WEAVE_DEVICE static T apply(T a, T b) {
    return b < a ? b : a;
  }
  WEAVE_DEVICE static half_t apply(half_t a, half_t b) { return min(a, b); }
  WEAVE_DEVICE static bf16_t apply(bf16_t a, bf16_t b) { return min(a, b); }
};

struct Max {
  template <typename T>
  WEAVE_DEVICE static T apply(T a, T b) {
    return b > a ? b : a;
  }
  WEAVE_DEVICE static half_t apply(half_t a, half_t b) { return max(a, b); }
  WEAVE_DEVICE static bf16_t apply(bf16_t a, bf16_t b) { return max(a, b); }
};

// A word W (uint64_t, uint4) seen as its lanes, sizeof(W) / sizeof(T) elements of T.
template <typename W, typename T>
union Lanes {
  static_assert(sizeof(W) % sizeof(T) == 0, "weave: element size divides the word");
  W w;
  T e[sizeof(W) / sizeof(T)];
};

// Element-wise Op over two words W of T lanes.
template <typename Op, typename T, typename W>
WEAVE_DEVICE W reduce_lanes(W a, W b) {
  Lanes<W, T> x, y;
  x.w = a;
  y.w = b;
#pragma unroll
  for (uint32_t i = 0; i < sizeof(W) / sizeof(T); ++i) x.e[i] = Op::apply(x.e[i], y.e[i]);
  return x.w;
}

// Element-wise Op over two 16-byte vectors of T.
template <typename Op, typename T>
WEAVE_DEVICE uint4 reduce_vec16(uint4 a, uint4 b) {
  return reduce_lanes<Op, T>(a, b);
}

}  // namespace weave

#endif  // WEAVE_DTYPE_CUH
