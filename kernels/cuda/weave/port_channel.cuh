// weave/port_channel.cuh: member-style helpers over a PortChannelDeviceHandle: the kernel
// pushes triggers naming the channel's semaphore and memories into the proxy's FIFO, and the
// proxy thread carries them out. Call from one thread per channel at a time (pushes from many
// threads are safe but their order is then unspecified).
//
// Like comm_core::port_channel::PortChannel on the host: puts larger than a trigger can carry
// are split into chunks of 2^31 bytes; an offset or size that does not fit a trigger reports
// BadArgument and pushes nothing; flush waits until the proxy popped the flush trigger.
#ifndef WEAVE_PORT_CHANNEL_CUH
#define WEAVE_PORT_CHANNEL_CUH

#include "weave/atomics.cuh"
#include "weave/fifo.cuh"
#include "weave/handles.cuh"
#include "weave/semaphore.cuh"
#include "weave/status.cuh"
#include "weave/types.cuh"

namespace weave {

// Bytes per trigger when a put is split (comm-core's PUT_CHUNK).
constexpr uint64_t PORT_CHANNEL_PUT_CHUNK = 1ull << (TRIGGER_SIZE_BITS - 1);

// A port channel as kernels use it: a copy of the handle plus operations. Every operation
// returns false when it gave up (the error word says why).
struct PortChannel {
  PortChannelDeviceHandle handle;

  WEAVE_DEVICE explicit PortChannel(const PortChannelDeviceHandle& h) : handle(h) {}

  // A trigger of this channel.
  WEAVE_DEVICE TriggerFields fields(uint32_t type, uint64_t dst_offset, uint64_t src_offset, uint64_t size) const {
    return TriggerFields{type, size, handle.src, src_offset, handle.dst, dst_offset, handle.semaphore_id};
  }

  // Pushes the triggers of a put of `bytes` bytes (the last one also carrying `extra` type
  // bits; a put of 0 bytes with extra bits pushes one trigger of just those). Checks every
  // trigger before pushing the first. *last_seq = the last trigger's sequence number.
  WEAVE_DEVICE bool push_put(uint64_t dst_offset, uint64_t src_offset, uint64_t bytes, uint32_t extra,
                             const DeviceStatusHandle& status, uint64_t* last_seq) const {
    const uint64_t chunks = (bytes + PORT_CHANNEL_PUT_CHUNK - 1) / PORT_CHANNEL_PUT_CHUNK;
    if (chunks == 0) {
      if (extra == 0) return true;
      Trigger t;
      return make_trigger(fields(extra, 0, 0, 0), status, &t) && push(handle.fifo, t, status, last_seq);
    }
    // Every chunk shares the ids and differs only in offsets and size: checking the first and
    // the last trigger checks them all, so nothing is pushed when one would not fit.
    const uint64_t last = (chunks - 1) * PORT_CHANNEL_PUT_CHUNK;
    const bool overflow = dst_offset + last < dst_offset || src_offset + last < src_offset;
    if (overflow || !trigger_fields_fit(fields(TriggerType::Data | extra, dst_offset, src_offset, 0)) ||
        !trigger_fields_fit(fields(TriggerType::Data | extra, dst_offset + last, src_offset + last, bytes - last))) {
      report_error(status, DeviceError::BadArgument);
      return false;
    }
    for (uint64_t done = 0; done < bytes; done += PORT_CHANNEL_PUT_CHUNK) {
      const uint64_t n = bytes - done < PORT_CHANNEL_PUT_CHUNK ? bytes - done : PORT_CHANNEL_PUT_CHUNK;
      const uint32_t type = TriggerType::Data | (done + n == bytes ? extra : 0);
      Trigger t;
      if (!make_trigger(fields(type, dst_offset + done, src_offset + done, n), status, &t)) return false;
      if (!push(handle.fifo, t, status, last_seq)) return false;
    }
    return true;
  }

  // Asks the proxy to copy bytes from src memory (src_offset) to dst memory (dst_offset).
  WEAVE_DEVICE bool put(uint64_t dst_offset, uint64_t src_offset, uint64_t bytes,
                        const DeviceStatusHandle& status) const {
    uint64_t seq;
    return push_put(dst_offset, src_offset, bytes, 0, status, &seq);
  }

  // Asks the proxy to signal the peer's semaphore after everything pushed before.
  WEAVE_DEVICE bool signal(const DeviceStatusHandle& status) const {
    uint64_t seq;
    return push_put(0, 0, 0, TriggerType::Flag, status, &seq);
  }

  // put() then signal(), in one trigger where possible.
  WEAVE_DEVICE bool put_with_signal(uint64_t dst_offset, uint64_t src_offset, uint64_t bytes,
                                    const DeviceStatusHandle& status) const {
    uint64_t seq;
    return push_put(dst_offset, src_offset, bytes, TriggerType::Flag, status, &seq);
  }

  // put_with_signal() then flush(): returns once the proxy handled the last trigger.
  WEAVE_DEVICE bool put_with_signal_and_flush(uint64_t dst_offset, uint64_t src_offset, uint64_t bytes,
                                              const DeviceStatusHandle& status) const {
    uint64_t seq;
    return push_put(dst_offset, src_offset, bytes, TriggerType::Flag | TriggerType::Sync, status, &seq) &&
           fifo_wait_processed(handle.fifo, seq, status);
  }

  // Returns once the proxy executed everything pushed before (and the connection completed it).
  WEAVE_DEVICE bool flush(const DeviceStatusHandle& status) const {
    uint64_t seq;
    return push_put(0, 0, 0, TriggerType::Sync, status, &seq) && fifo_wait_processed(handle.fifo, seq, status);
  }

  // Waits (bounded) for the peer's next signal: expected = atomicAdd(expected_inbound_token, 1)
  // + 1, then an acquire spin until the inbound token reaches it. BadArgument when the handle
  // carries no tokens.
  WEAVE_DEVICE bool wait(const DeviceStatusHandle& status) const {
    if (handle.inbound_token == 0 || handle.expected_inbound_token == 0) {
      report_error(status, DeviceError::BadArgument);
      return false;
    }
    return wait_counter(handle.inbound_token, handle.expected_inbound_token, status);
  }

  // Consumes the peer's next signal if it has arrived; never blocks (false without tokens).
  WEAVE_DEVICE bool poll() const {
    if (handle.inbound_token == 0 || handle.expected_inbound_token == 0) return false;
    return poll_counter(handle.inbound_token, handle.expected_inbound_token);
  }
};

}  // namespace weave

#endif  // WEAVE_PORT_CHANNEL_CUH
