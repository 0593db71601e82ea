// weave/handles.cuh: C++ mirrors of the `#[repr(C)]` device handles of comm-core
// (`comm_core::device`, `comm_core::fifo::FifoDeviceHandle`,
// `comm_core::port_channel::PortChannelDeviceHandle`).
//
// Same names, same field names, same order, same sizes and alignment. Every NVRTC compile made
// through the kernels crate appends `static_assert`s generated from `comm_core::device::LAYOUTS`,
// so a drift between the two sides fails compilation naming the struct and the field.
// Addresses are u64 device virtual addresses (0 = absent).
#ifndef WEAVE_HANDLES_CUH
#define WEAVE_HANDLES_CUH

#include "weave/types.cuh"

namespace weave {

// A semaphore between this GPU and one peer GPU (memory-channel semaphore).
struct DeviceSemaphoreHandle {
  uint64_t inbound;           // u64*: local counter the peer adds to
  uint64_t remote_inbound;    // u64*: the peer's inbound counter, mapped here
  uint64_t expected_inbound;  // u64*: local count of signals waited for (persists across launches)
};

// A memory channel between this GPU and one peer GPU.
struct MemoryChannelDeviceHandle {
  DeviceSemaphoreHandle semaphore;  // the channel's semaphore
  uint64_t dst;                     // peer memory (mapped here) that put writes / get reads
  uint64_t src;                     // local memory
  uint64_t remote_packets;          // the peer's packet buffer (put_packets writes there)
  uint64_t local_packets;           // this GPU's packet buffer (the peer's packets arrive here)
};

// Where a kernel reports that it gave up, and how long it may spin.
struct DeviceStatusHandle {
  uint64_t error;           // u32*: error code (0 = fine), host-visible
  uint64_t abort;           // u32*: abort request (non-zero = stop), host-visible
  uint64_t timeout_cycles;  // spin budget in clock64() cycles
  uint64_t progress;        // u64*: the latest call whose kernel started, host-visible (0: none)
  uint64_t call;            // the call this launch belongs to (the ledger's collective number)
};

// Codes a kernel stores into *DeviceStatusHandle::error (comm_core::device::DeviceError).
struct DeviceError {
  static constexpr uint32_t None = 0;
  static constexpr uint32_t SemaphoreTimeout = 1;  // a semaphore wait ran out of cycles
  static constexpr uint32_t PacketTimeout = 2;     // an LL packet wait ran out of cycles
  static constexpr uint32_t Aborted = 3;           // the host asked the kernel to stop
  static constexpr uint32_t FifoTimeout = 4;       // a FIFO push found no room in time
  static constexpr uint32_t BadArgument = 5;       // arguments the kernel cannot handle
  static constexpr uint32_t CallMismatch = 6;      // a peer's message is of a different call
};

// An 8-byte LL packet: 4 bytes of data and a 4-byte flag, written by one 8-byte store.
struct alignas(8) LL8Packet {
  uint32_t data;
  uint32_t flag;
};

// A 16-byte LL packet: 8 bytes of data interleaved with two flags, written by one 16-byte store.
struct alignas(16) LL16Packet {
  uint32_t data1;
  uint32_t flag1;
  uint32_t data2;
  uint32_t flag2;
};

// The proxy's trigger FIFO as device code sees it (comm_core::fifo::FifoDeviceHandle).
struct FifoDeviceHandle {
  uint64_t triggers;  // address of slot 0 (capacity slots of 16 bytes follow)
  uint64_t head;      // u64*: next sequence number to reserve
  uint64_t tail;      // u64*: triggers popped so far
  uint32_t capacity;  // number of slots, a power of two
  uint32_t reserved;  // zero
};

// A port channel as device code sees it (comm_core::port_channel::PortChannelDeviceHandle).
struct PortChannelDeviceHandle {
  FifoDeviceHandle fifo;            // the proxy's trigger FIFO
  uint64_t inbound_token;           // u64*: token the peer signals (0 = cannot wait)
  uint64_t expected_inbound_token;  // u64*: expected-inbound counter (0 = cannot wait)
  uint32_t semaphore_id;            // semaphore id for triggers
  uint32_t dst;                     // destination memory id for triggers
  uint32_t src;                     // source memory id for triggers
  uint32_t reserved;                // zero
};

// Compile-time layout introspection for the generated checks.
//
// NVRTC supports neither `offsetof` nor `__builtin_offsetof`, so offsets are measured with
// `__builtin_bit_cast`: a T whose byte i holds the low byte of i, and one whose byte i holds
// the high byte, are built at compile time, and the first bytes of a field's value in the two
// are that field's offset (types up to 64 KiB). NVRTC 12.x before 12.4 or so has no
// `__builtin_bit_cast`; there the address of the field of a T at address 0, which its front end
// folds to a constant, is the offset (the checks still fail on a wrong offset, see
// kernels/src/compile.rs tests, run with NVRTC 12 in CI).
#if defined(__has_builtin)
#if __has_builtin(__builtin_bit_cast)
#define WEAVE_HAS_BIT_CAST 1
#endif
#endif

#ifdef WEAVE_HAS_BIT_CAST
namespace layout {

template <typename T>
struct Bytes {
  unsigned char b[sizeof(T)];
};

template <typename T, unsigned Shift>
constexpr Bytes<T> byte_index_pattern() {
  static_assert(sizeof(T) <= 65536, "weave: layout checks measure offsets of types up to 64 KiB");
  Bytes<T> r{};
  for (unsigned i = 0; i < sizeof(T); ++i) r.b[i] = static_cast<unsigned char>(i >> Shift);
  return r;
}

// A T whose byte i holds i >> Shift (its low byte).
template <typename T, unsigned Shift>
constexpr T pattern() {
  return __builtin_bit_cast(T, byte_index_pattern<T, Shift>());
}

// The first byte of a value's object representation.
template <typename F>
constexpr unsigned first_byte(const F& value) {
  return __builtin_bit_cast(Bytes<F>, value).b[0];
}

}  // namespace layout
#endif  // WEAVE_HAS_BIT_CAST
}  // namespace weave

// The byte offset of `field` in `T`, as a constant expression (offsetof for NVRTC).
#ifdef WEAVE_HAS_BIT_CAST
#define WEAVE_OFFSET_OF(T, field)                                         \
  (::weave::layout::first_byte(::weave::layout::pattern<T, 0>().field) | \
   (::weave::layout::first_byte(::weave::layout::pattern<T, 8>().field) << 8))
#else
#define WEAVE_OFFSET_OF(T, field) \
  (static_cast<unsigned>(reinterpret_cast<unsigned long long>(&(static_cast<T*>(nullptr)->field))))
#endif

#endif  // WEAVE_HANDLES_CUH
