// weave/memory_channel.cuh: member-style helpers over a MemoryChannelDeviceHandle.
//
// Offsets are bytes: `remote_offset` into the peer memory `dst`, `local_offset` into the local
// memory `src`, packet offsets into the packet buffers (multiples of the packet size).
// Cooperative calls take the caller's share (thread, nthreads) as in copy.cuh. No call orders
// anything within a block: __syncthreads() between many threads' put() and one thread's
// signal().
#ifndef WEAVE_MEMORY_CHANNEL_CUH
#define WEAVE_MEMORY_CHANNEL_CUH

#include "weave/copy.cuh"
#include "weave/handles.cuh"
#include "weave/packet.cuh"
#include "weave/semaphore.cuh"
#include "weave/types.cuh"

namespace weave {

// A memory channel as kernels use it: a copy of the handle plus operations.
struct MemoryChannel {
  MemoryChannelDeviceHandle handle;

  WEAVE_DEVICE explicit MemoryChannel(const MemoryChannelDeviceHandle& h) : handle(h) {}

  // Copies bytes from local memory (src + local_offset) into peer memory (dst + remote_offset).
  WEAVE_DEVICE void put(uint64_t remote_offset, uint64_t local_offset, uint64_t bytes, uint32_t thread,
                        uint32_t nthreads) const {
    weave::put(as_ptr<char>(handle.dst) + remote_offset, as_ptr<const char>(handle.src) + local_offset, bytes,
               thread, nthreads);
  }

  // Copies bytes from peer memory (dst + remote_offset) into local memory (src + local_offset).
  WEAVE_DEVICE void get(uint64_t remote_offset, uint64_t local_offset, uint64_t bytes, uint32_t thread,
                        uint32_t nthreads) const {
    weave::get(as_ptr<char>(handle.src) + local_offset, as_ptr<const char>(handle.dst) + remote_offset, bytes,
               thread, nthreads);
  }

  // One element of peer memory at byte offset `remote_offset` (aligned for T).
  template <typename T>
  WEAVE_DEVICE T read(uint64_t remote_offset) const {
    return *reinterpret_cast<const T*>(as_ptr<const char>(handle.dst) + remote_offset);
  }

  // Stores one element into peer memory at byte offset `remote_offset` (aligned for T).
  template <typename T>
  WEAVE_DEVICE void write(uint64_t remote_offset, const T& value) const {
    *reinterpret_cast<T*>(as_ptr<char>(handle.dst) + remote_offset) = value;
  }

  // Sends bytes of local memory (src + local_offset) as P packets into the peer's packet
  // buffer at byte offset `remote_packet_offset`, each carrying `flag`.
  template <typename P = LL16Packet>
  WEAVE_DEVICE void put_packets(uint64_t remote_packet_offset, uint64_t local_offset, uint64_t bytes,
                                uint32_t thread, uint32_t nthreads, uint32_t flag) const {
    weave::put_packets<P>(reinterpret_cast<P*>(as_ptr<char>(handle.remote_packets) + remote_packet_offset),
                          as_ptr<const char>(handle.src) + local_offset, bytes, thread, nthreads, flag);
  }

  // Waits for the peer's packets in this GPU's packet buffer at byte offset
  // `local_packet_offset` and stores their payload at src + local_offset. False when this
  // thread gave up (PacketTimeout or Aborted reported).
  template <typename P = LL16Packet>
  WEAVE_DEVICE bool unpack_packets(uint64_t local_packet_offset, uint64_t local_offset, uint64_t bytes,
                                   uint32_t thread, uint32_t nthreads, uint32_t flag,
                                   const DeviceStatusHandle& status) const {
    return weave::unpack_packets<P>(as_ptr<char>(handle.src) + local_offset,
                                    reinterpret_cast<const P*>(as_ptr<const char>(handle.local_packets) +
                                                               local_packet_offset),
                                    bytes, thread, nthreads, flag, status);
  }

  // Semaphore operations (see semaphore.cuh).
  WEAVE_DEVICE void signal() const { weave::signal(handle.semaphore); }
  WEAVE_DEVICE void relaxed_signal() const { weave::relaxed_signal(handle.semaphore); }
  WEAVE_DEVICE bool wait(const DeviceStatusHandle& status) const { return weave::wait(handle.semaphore, status); }
  WEAVE_DEVICE bool relaxed_wait(const DeviceStatusHandle& status) const {
    return weave::relaxed_wait(handle.semaphore, status);
  }
  WEAVE_DEVICE bool poll() const { return weave::poll(handle.semaphore); }
};

}  // namespace weave

#endif  // WEAVE_MEMORY_CHANNEL_CUH
