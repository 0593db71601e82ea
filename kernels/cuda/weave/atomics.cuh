// weave/atomics.cuh: named memory-ordering primitives, written as inline PTX.
//
// Every cross-thread, cross-GPU or GPU-host access in weave goes through one of these; weave
// uses no ad-hoc fences. Names say the ordering and the scope:
//   relaxed / acquire / release  - the PTX memory-consistency ordering
//   _gpu                         - ordered with respect to threads of this GPU
//   _sys                         - ordered with respect to the whole system (peer GPUs, host)
// All pointers must point into global memory: device memory, peer memory mapped into this
// GPU's address space, or pinned host memory mapped for the device.
//
// The volatile vector accesses at the end are for LL packets, whose flag words make a torn
// read detectable; they order nothing.
#ifndef WEAVE_ATOMICS_CUH
#define WEAVE_ATOMICS_CUH

#include "weave/types.cuh"

namespace weave {

// ---- loads ----------------------------------------------------------------------------------

// Acquire load, system scope: later accesses of this thread happen after it.
WEAVE_DEVICE uint64_t atomic_load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Acquire load of a u32, system scope.
WEAVE_DEVICE uint32_t atomic_load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Relaxed (atomic, unordered) load, system scope.
WEAVE_DEVICE uint64_t atomic_load_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Relaxed load of a u32, system scope.
WEAVE_DEVICE uint32_t atomic_load_relaxed_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Acquire load, GPU scope.
WEAVE_DEVICE uint64_t atomic_load_acquire_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Relaxed load, GPU scope.
WEAVE_DEVICE uint64_t atomic_load_relaxed_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// ---- stores ---------------------------------------------------------------------------------

// Release store, system scope: earlier accesses of this thread happen before it.
WEAVE_DEVICE void atomic_store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Release store of a u32, system scope.
WEAVE_DEVICE void atomic_store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Release fence, system scope: this thread's earlier accesses (and those it observed, such as
// its block's before a __syncthreads) are performed before its later stores. One fence before
// several relaxed stores publishes like a release store each, for the cost of one.
WEAVE_DEVICE void fence_release_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Relaxed store, system scope.
WEAVE_DEVICE void atomic_store_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Relaxed store of a u32, system scope.
WEAVE_DEVICE void atomic_store_relaxed_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Relaxed store, GPU scope.
WEAVE_DEVICE void atomic_store_relaxed_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// ---- read-modify-write ----------------------------------------------------------------------

// *p += v with release ordering, system scope, result unused (a `red`).
WEAVE_DEVICE void atomic_add_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// *p += v, relaxed, system scope, result unused.
WEAVE_DEVICE void atomic_add_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Returns *p and adds v, relaxed, GPU scope.
WEAVE_DEVICE uint64_t atomic_fetch_add_relaxed_gpu(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.relaxed.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// Returns *p and adds v, relaxed, system scope.
WEAVE_DEVICE uint64_t atomic_fetch_add_relaxed_sys(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.relaxed.sys.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// ---- volatile vector accesses (LL packets) --------------------------------------------------

// One 16-byte volatile store of four u32 (p must be 16-byte aligned).
WEAVE_DEVICE void store_volatile_v4(uint32_t* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

// One 16-byte volatile load of four u32 (p must be 16-byte aligned).
WEAVE_DEVICE void load_volatile_v4(const uint32_t* p, uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "l"(p)
               : "memory");
}

// One 8-byte volatile store of two u32 (p must be 8-byte aligned).
WEAVE_DEVICE void store_volatile_v2(uint32_t* p, uint32_t a, uint32_t b) {
  asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b) : "memory");
}

// One 8-byte volatile load of two u32 (p must be 8-byte aligned).
WEAVE_DEVICE void load_volatile_v2(const uint32_t* p, uint32_t& a, uint32_t& b) {
  asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p) : "memory");
}

// One 16-byte volatile store of two u64 (p must be 16-byte aligned).
WEAVE_DEVICE void store_volatile_v2_u64(uint64_t* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

// One 16-byte volatile load of two u64 (p must be 16-byte aligned).
WEAVE_DEVICE void load_volatile_v2_u64(const uint64_t* p, uint64_t& a, uint64_t& b) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

}  // namespace weave

#endif  // WEAVE_ATOMICS_CUH
