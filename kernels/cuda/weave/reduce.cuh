// weave/reduce.cuh: element-wise reductions of the collective kernels: the operator codes the
// host passes (collectives' ReduceOp), division for averages, and reduce_to, which combines
// several sources in order into one or more destinations.
#ifndef WEAVE_REDUCE_CUH
#define WEAVE_REDUCE_CUH

#include "weave/dtype.cuh"
#include "weave/types.cuh"

namespace weave {

// Operator codes of the argument blocks (collectives::gpu op_code): sum, product, minimum,
// maximum, and average (a sum divided by the number of ranks at the end).
enum Op : uint32_t { OP_SUM = 0, OP_PROD = 1, OP_MIN = 2, OP_MAX = 3, OP_AVG = 4 };

// The operators a program instantiates, as a mask of bits: 1 sum (and average), 2 product,
// 4 minimum, 8 maximum (numbers, because the preprocessor does not see the enum). Every operator
// unless the host program builder defines WEAVE_REDUCE_OPS: a first launch compiles its reducing
// kernel for the one operator it needs (each operator is a full copy of the kernel's code).
#ifndef WEAVE_REDUCE_OPS
#define WEAVE_REDUCE_OPS 15
#endif

// Calls run(Operator{}) with the operator type that the code `op` names (OP_AVG: Sum, the caller
// divides) and returns true; returns false, calling nothing, for a code that names none or an
// operator this program was not built with (WEAVE_REDUCE_OPS). The reducing entry points pick
// their operator at run time through it.
template <typename Run>
WEAVE_DEVICE bool with_reduce_op(uint32_t op, const Run& run) {
  switch (op) {
#if WEAVE_REDUCE_OPS & 1
    case OP_SUM:
    case OP_AVG: run(Sum{}); return true;
#endif
#if WEAVE_REDUCE_OPS & 2
    case OP_PROD: run(Prod{}); return true;
#endif
#if WEAVE_REDUCE_OPS & 4
    case OP_MIN: run(Min{}); return true;
#endif
#if WEAVE_REDUCE_OPS & 8
    case OP_MAX: run(Max{}); return true;
#endif
    default: return false;
  }
}

// Sources reduce_to combines at most per call on its vectorized path.
constexpr uint32_t REDUCE_MAX_SOURCES = 8;

template <typename T>
WEAVE_DEVICE T divide(T v, uint32_t n) {
  return static_cast<T>(v / static_cast<T>(n));
}
template <>
WEAVE_DEVICE uint8_t divide<uint8_t>(uint8_t v, uint32_t n) {
  return static_cast<uint8_t>(uint32_t(v) / n);
}
template <>
WEAVE_DEVICE int8_t divide<int8_t>(int8_t v, uint32_t n) {
  return static_cast<int8_t>(int32_t(v) / int32_t(n));
}
template <>
WEAVE_DEVICE half_t divide<half_t>(half_t v, uint32_t n) {
  return half_from_float(to_float(v) / float(n));
}
template <>
WEAVE_DEVICE bf16_t divide<bf16_t>(bf16_t v, uint32_t n) {
  return bf16_from_float(to_float(v) / float(n));
}

// Every lane of a word W (uint64_t, uint4) of T divided by n.
template <typename T, typename W>
WEAVE_DEVICE W divide_lanes(W a, uint32_t n) {
  Lanes<W, T> x;
  x.w = a;
#pragma unroll
  for (uint32_t i = 0; i < sizeof(W) / sizeof(T); ++i) x.e[i] = divide<T>(x.e[i], n);
  return x.w;
}

// dst[i] = Op over srcs[s][i] in source order (divided by `avg` when non-zero), also stored at
// outs[o][i]; at most REDUCE_MAX_SOURCES sources.
// Vectorized when every pointer is 16-byte aligned; threads [0, nthreads) of the caller's group
// share the work (`thread` is the caller's index).
template <typename Op, typename T>
WEAVE_DEVICE void reduce_to(T* dst, T* const* outs, uint32_t nout, const T* const* srcs, uint32_t nsrc,
                            uint64_t elems, uint32_t avg, uint32_t thread, uint32_t nthreads) {
  bool aligned = as_address(dst) % 16 == 0;
  for (uint32_t o = 0; o < nout; ++o) aligned = aligned && as_address(outs[o]) % 16 == 0;
  for (uint32_t s = 0; s < nsrc; ++s) aligned = aligned && as_address(srcs[s]) % 16 == 0;
  uint64_t done = 0;
  if (aligned) {
    constexpr uint64_t per = 16 / sizeof(T);
    const uint64_t units = elems / per;
    for (uint64_t u = thread; u < units; u += nthreads) {
      uint4 v[REDUCE_MAX_SOURCES];
#pragma unroll
      for (uint32_t s = 0; s < REDUCE_MAX_SOURCES; ++s) {
        if (s < nsrc) v[s] = reinterpret_cast<const uint4*>(srcs[s])[u];
      }
      uint4 acc = v[0];
#pragma unroll
      for (uint32_t s = 1; s < REDUCE_MAX_SOURCES; ++s) {
        if (s < nsrc) acc = reduce_vec16<Op, T>(acc, v[s]);
      }
      if (avg) acc = divide_lanes<T>(acc, avg);
      reinterpret_cast<uint4*>(dst)[u] = acc;
      for (uint32_t o = 0; o < nout; ++o) reinterpret_cast<uint4*>(outs[o])[u] = acc;
    }
    done = units * per;
  }
  for (uint64_t i = done + thread; i < elems; i += nthreads) {
    T acc = srcs[0][i];
    for (uint32_t s = 1; s < nsrc; ++s) acc = Op::apply(acc, srcs[s][i]);
    if (avg) acc = divide<T>(acc, avg);
    dst[i] = acc;
    for (uint32_t o = 0; o < nout; ++o) outs[o][i] = acc;
  }
}

}  // namespace weave

#endif  // WEAVE_REDUCE_CUH
