// The conversion kernels (kernels::convert): an 8-bit float buffer widened to the type its
// reductions are carried in, and back. FP8 reductions run in three kernels on the stream: widen
// every input, reduce in the wide type with the kernels of that type, narrow the result once
// (collectives/src/fp8.rs says why that gives one rounding whatever the algorithm).
//
// Each kernel is a grid-stride loop over `count` elements; `src` and `dst` are disjoint.

namespace weave {
// The one parameter of every conversion kernel (kernels::convert::ConvertArgs).
struct ConvertArgs {
  uint64_t src;
  uint64_t dst;
  uint64_t count;
};
static_assert(sizeof(ConvertArgs) == 24, "weave: ConvertArgs is three u64 (kernels/src/convert.rs)");
}  // namespace weave

#define WEAVE_CONVERT_KERNEL(NAME, FROM, TO, BODY)                                            \
  extern "C" __global__ void NAME(weave::ConvertArgs a) {                                      \
    const FROM* __restrict__ src = weave::as_ptr<const FROM>(a.src);                           \
    TO* __restrict__ dst = weave::as_ptr<TO>(a.dst);                                           \
    const weave::uint64_t stride = static_cast<weave::uint64_t>(gridDim.x) * blockDim.x;       \
    for (weave::uint64_t i = static_cast<weave::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
         i < a.count; i += stride) {                                                           \
      BODY;                                                                                    \
    }                                                                                          \
  }

// e4m3 is reduced in float (every sum of up to 73 values is exact there), e5m2 in double.
WEAVE_CONVERT_KERNEL(weave_widen_f8e4m3, weave::uint8_t, float,
                     dst[i] = static_cast<float>(weave::fp8_to_double(src[i], weave::FP8_E4M3)))
WEAVE_CONVERT_KERNEL(weave_narrow_f8e4m3, float, weave::uint8_t,
                     dst[i] = static_cast<weave::uint8_t>(weave::fp8_from_double(src[i], weave::FP8_E4M3)))
WEAVE_CONVERT_KERNEL(weave_widen_f8e5m2, weave::uint8_t, double,
                     dst[i] = weave::fp8_to_double(src[i], weave::FP8_E5M2))
WEAVE_CONVERT_KERNEL(weave_narrow_f8e5m2, double, weave::uint8_t,
                     dst[i] = static_cast<weave::uint8_t>(weave::fp8_from_double(src[i], weave::FP8_E5M2)))
