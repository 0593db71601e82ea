// weave/types.cuh: fixed-width integers and the function attributes every weave header uses.
//
// NVRTC without the CUDA toolkit has no <cstdint>, so weave defines its own integer names
// inside namespace weave (they never clash with a user's <cstdint> in the global namespace).
#ifndef WEAVE_TYPES_CUH
#define WEAVE_TYPES_CUH

// Device functions of weave: always inlined into the caller's kernel.
#define WEAVE_DEVICE __device__ __forceinline__

namespace weave {

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;

static_assert(sizeof(uint8_t) == 1 && sizeof(uint16_t) == 2, "weave: 8/16-bit integer sizes");
static_assert(sizeof(uint32_t) == 4 && sizeof(uint64_t) == 8, "weave: 32/64-bit integer sizes");
static_assert(sizeof(int32_t) == 4 && sizeof(int64_t) == 8, "weave: signed integer sizes");
static_assert(sizeof(void*) == 8, "weave: device pointers are 64-bit");

// A device address carried as a u64 in a handle, as a typed pointer.
template <typename T>
WEAVE_DEVICE T* as_ptr(uint64_t address) {
  return reinterpret_cast<T*>(address);
}

// A typed pointer as the u64 address handles carry.
template <typename T>
WEAVE_DEVICE uint64_t as_address(T* pointer) {
  return reinterpret_cast<uint64_t>(pointer);
}

}  // namespace weave

#endif  // WEAVE_TYPES_CUH
