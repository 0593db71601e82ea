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

// Each wrapper is one asm statement with a "memory" clobber; these macros write them, so every
// wrapper of a kind has the same operand constraints and only its PTX instruction differs.
// T is the value type, C its operand constraint ("l" for 64-bit, "r" for 32-bit registers).

// T NAME(const T* p): loads with INSTR ("ld.<order>.<scope>.global.<type>").
#define WEAVE_ATOMIC_LOAD(NAME, T, C, INSTR)                                \
  WEAVE_DEVICE T NAME(const T* p) {                                         \
    T v;                                                                    \
    asm volatile(INSTR " %0, [%1];" : "=" C(v) : "l"(p) : "memory");        \
    return v;                                                               \
  }

// void NAME(T* p, T v): stores (or reduces, `red`) v with INSTR.
#define WEAVE_ATOMIC_STORE(NAME, T, C, INSTR) \
  WEAVE_DEVICE void NAME(T* p, T v) { asm volatile(INSTR " [%0], %1;" ::"l"(p), C(v) : "memory"); }

// T NAME(T* p, T v): returns *p and updates it with v through INSTR (`atom`).
#define WEAVE_ATOMIC_FETCH(NAME, T, C, INSTR)                                                 \
  WEAVE_DEVICE T NAME(T* p, T v) {                                                            \
    T old;                                                                                    \
    asm volatile(INSTR " %0, [%1], %2;" : "=" C(old) : "l"(p), C(v) : "memory");              \
    return old;                                                                               \
  }

// The u64 and u32 wrappers of one access: INSTR without its type suffix (".u64", ".u32").
#define WEAVE_ATOMIC_LOADS(NAME, INSTR)                     \
  WEAVE_ATOMIC_LOAD(NAME, uint64_t, "l", INSTR ".u64")      \
  WEAVE_ATOMIC_LOAD(NAME, uint32_t, "r", INSTR ".u32")
#define WEAVE_ATOMIC_STORES(NAME, INSTR)                    \
  WEAVE_ATOMIC_STORE(NAME, uint64_t, "l", INSTR ".u64")     \
  WEAVE_ATOMIC_STORE(NAME, uint32_t, "r", INSTR ".u32")

// ---- loads ----------------------------------------------------------------------------------

// Acquire load (u64 and u32), system scope: later accesses of this thread happen after it.
WEAVE_ATOMIC_LOADS(atomic_load_acquire_sys, "ld.acquire.sys.global")
// Relaxed (atomic, unordered) load (u64 and u32), system scope.
WEAVE_ATOMIC_LOADS(atomic_load_relaxed_sys, "ld.relaxed.sys.global")
// Acquire load, GPU scope.
WEAVE_ATOMIC_LOAD(atomic_load_acquire_gpu, uint64_t, "l", "ld.acquire.gpu.global.u64")
// Relaxed load, GPU scope.
WEAVE_ATOMIC_LOAD(atomic_load_relaxed_gpu, uint64_t, "l", "ld.relaxed.gpu.global.u64")

// ---- stores ---------------------------------------------------------------------------------

// Release store (u64 and u32), system scope: earlier accesses of this thread happen before it.
WEAVE_ATOMIC_STORES(atomic_store_release_sys, "st.release.sys.global")

// Release fence, system scope: this thread's earlier accesses (and those it observed, such as
// its block's before a __syncthreads) are performed before its later stores. One fence before
// several relaxed stores publishes like a release store each, for the cost of one.
WEAVE_DEVICE void fence_release_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Relaxed store (u64 and u32), system scope.
WEAVE_ATOMIC_STORES(atomic_store_relaxed_sys, "st.relaxed.sys.global")
// Relaxed store, GPU scope.
WEAVE_ATOMIC_STORE(atomic_store_relaxed_gpu, uint64_t, "l", "st.relaxed.gpu.global.u64")

// ---- read-modify-write ----------------------------------------------------------------------

// *p += v with release ordering, system scope, result unused (a `red`).
WEAVE_ATOMIC_STORE(atomic_add_release_sys, uint64_t, "l", "red.release.sys.global.add.u64")
// *p += v, relaxed, system scope, result unused.
WEAVE_ATOMIC_STORE(atomic_add_relaxed_sys, uint64_t, "l", "red.relaxed.sys.global.add.u64")
// Returns *p and adds v, relaxed, GPU scope.
WEAVE_ATOMIC_FETCH(atomic_fetch_add_relaxed_gpu, uint64_t, "l", "atom.relaxed.gpu.global.add.u64")
// Returns *p and adds v, relaxed, system scope.
WEAVE_ATOMIC_FETCH(atomic_fetch_add_relaxed_sys, uint64_t, "l", "atom.relaxed.sys.global.add.u64")

#undef WEAVE_ATOMIC_LOAD
#undef WEAVE_ATOMIC_STORE
#undef WEAVE_ATOMIC_FETCH
#undef WEAVE_ATOMIC_LOADS
#undef WEAVE_ATOMIC_STORES

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
