// weave/copy.cuh: cooperative copies between local and peer memory.
//
// `thread` and `nthreads` name the caller's share of the work: every thread of the group calls
// with its own index in [0, nthreads) and the same other arguments. Bytes move in 16-byte
// vectors when the source and destination are equally aligned modulo 16 (the unaligned head and
// tail go byte by byte), else in the widest unit both agree on (8, 4, 2 or 1 bytes). Any size
// and any alignment is correct. No ordering: signal (after a __syncthreads()) to publish.
#ifndef WEAVE_COPY_CUH
#define WEAVE_COPY_CUH

#include "weave/types.cuh"

namespace weave {
namespace detail {

// Copies with `V`-sized units where dst and src share alignment modulo sizeof(V).
template <typename V>
WEAVE_DEVICE void copy_units(char* dst, const char* src, uint64_t bytes, uint32_t thread, uint32_t nthreads) {
  constexpr uint64_t W = sizeof(V);
  uint64_t head = (W - (as_address(dst) % W)) % W;
  if (head > bytes) head = bytes;
  for (uint64_t i = thread; i < head; i += nthreads) dst[i] = src[i];
  const uint64_t units = (bytes - head) / W;
  V* d = reinterpret_cast<V*>(dst + head);
  const V* s = reinterpret_cast<const V*>(src + head);
  uint64_t i = thread;
  const uint64_t n = nthreads;
  // Four independent loads in flight before the stores.
  for (; i + 3 * n < units; i += 4 * n) {
    const V a = s[i];
    const V b = s[i + n];
    const V c = s[i + 2 * n];
    const V e = s[i + 3 * n];
    d[i] = a;
    d[i + n] = b;
    d[i + 2 * n] = c;
    d[i + 3 * n] = e;
  }
  for (; i < units; i += n) d[i] = s[i];
  for (uint64_t j = head + units * W + thread; j < bytes; j += n) dst[j] = src[j];
}

}  // namespace detail

// Cooperative copy of `bytes` bytes from src to dst (any alignment; ranges must not overlap).
WEAVE_DEVICE void copy(void* dst, const void* src, uint64_t bytes, uint32_t thread, uint32_t nthreads) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const uint64_t skew = as_address(d) ^ as_address(s);
  if (skew % 16 == 0) {
    detail::copy_units<uint4>(d, s, bytes, thread, nthreads);
  } else if (skew % 8 == 0) {
    detail::copy_units<uint2>(d, s, bytes, thread, nthreads);
  } else if (skew % 4 == 0) {
    detail::copy_units<uint32_t>(d, s, bytes, thread, nthreads);
  } else if (skew % 2 == 0) {
    detail::copy_units<uint16_t>(d, s, bytes, thread, nthreads);
  } else {
    detail::copy_units<uint8_t>(d, s, bytes, thread, nthreads);
  }
}

// Cooperative copy into (usually peer) memory: copy() under the name of the direction.
WEAVE_DEVICE void put(void* dst, const void* src, uint64_t bytes, uint32_t thread, uint32_t nthreads) {
  copy(dst, src, bytes, thread, nthreads);
}

// Cooperative copy out of (usually peer) memory: copy() under the name of the direction.
WEAVE_DEVICE void get(void* dst, const void* src, uint64_t bytes, uint32_t thread, uint32_t nthreads) {
  copy(dst, src, bytes, thread, nthreads);
}

}  // namespace weave

#endif  // WEAVE_COPY_CUH
