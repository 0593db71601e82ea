// weave/fifo.cuh: triggers and the device side of the trigger FIFO (comm_core::fifo).
//
// Trigger layout: two u64 words, identical to comm_core::fifo::Trigger (MSCCL++'s
// ProxyTrigger). The generated checks appended to every compile compare these constants and a
// few encodings with the Rust side.
//
//   word | bits   | field                                  | width
//   -----+--------+----------------------------------------+------
//     0  | 0..32  | size in bytes                          | 32
//     0  | 32..64 | source offset                          | 32
//     1  | 0..32  | destination offset                     | 32
//     1  | 32..41 | source memory id                       | 9
//     1  | 41..50 | destination memory id                  | 9
//     1  | 50..53 | type: DATA = 1, FLAG = 2, SYNC = 4     | 3
//     1  | 53..63 | semaphore id                           | 10
//     1  | 63     | commit bit (set by push, lap parity)   | 1
//
// Push protocol (matches TriggerFifo on the host, which may push into the same FIFO):
//   1. reserve sequence s = fetch_add(head, 1) (relaxed, system scope: host producers
//      compare-and-swap the same counter);
//   2. bounded wait until s - tail < capacity (acquire load of tail: the consumer is done with
//      the slot's previous trigger);
//   3. in slot s & (capacity - 1): store word 0 (relaxed), then word 1 with the commit bit
//      1 - ((s / capacity) & 1) (release, system scope), so a consumer whose acquire load sees
//      the commit bit also sees word 0 and everything this thread wrote before the push.
// A push that gives up after reserving (FifoTimeout/Aborted reported) leaves its slot empty, so
// the consumer stalls at it: the FIFO is unusable after such an error, as the error says.
//
// Platform note: the counters live wherever the transport put them (pinned host memory when
// host threads push too). System-scope atomics on pinned host memory need a platform where
// device atomics to host memory are atomic with respect to the CPU; when only GPU threads push,
// keep `head` in device memory.
#ifndef WEAVE_FIFO_CUH
#define WEAVE_FIFO_CUH

#include "weave/atomics.cuh"
#include "weave/handles.cuh"
#include "weave/status.cuh"
#include "weave/types.cuh"

namespace weave {

constexpr uint32_t TRIGGER_SIZE_BITS = 32;
constexpr uint32_t TRIGGER_OFFSET_BITS = 32;
constexpr uint32_t MEMORY_ID_BITS = 9;
constexpr uint32_t TRIGGER_TYPE_BITS = 3;
constexpr uint32_t SEMAPHORE_ID_BITS = 10;

constexpr uint32_t TRIGGER_SIZE_SHIFT = 0;                                          // word 0
constexpr uint32_t TRIGGER_SRC_OFFSET_SHIFT = 32;                                   // word 0
constexpr uint32_t TRIGGER_DST_OFFSET_SHIFT = 0;                                    // word 1
constexpr uint32_t TRIGGER_SRC_MEMORY_SHIFT = 32;                                   // word 1
constexpr uint32_t TRIGGER_DST_MEMORY_SHIFT = TRIGGER_SRC_MEMORY_SHIFT + MEMORY_ID_BITS;  // word 1
constexpr uint32_t TRIGGER_TYPE_SHIFT = TRIGGER_DST_MEMORY_SHIFT + MEMORY_ID_BITS;  // word 1
constexpr uint32_t TRIGGER_SEMAPHORE_SHIFT = TRIGGER_TYPE_SHIFT + TRIGGER_TYPE_BITS;  // word 1
constexpr uint32_t TRIGGER_COMMIT_SHIFT = 63;                                       // word 1

constexpr uint64_t field_mask(uint32_t bits) { return (1ull << bits) - 1; }

constexpr uint64_t MAX_TRIGGER_SIZE = field_mask(TRIGGER_SIZE_BITS);
constexpr uint64_t MAX_TRIGGER_OFFSET = field_mask(TRIGGER_OFFSET_BITS);
constexpr uint32_t MAX_MEMORIES = 1u << MEMORY_ID_BITS;
constexpr uint32_t MAX_SEMAPHORES = 1u << SEMAPHORE_ID_BITS;
constexpr uint64_t TRIGGER_COMMIT_BIT = 1ull << TRIGGER_COMMIT_SHIFT;

static_assert(TRIGGER_SRC_OFFSET_SHIFT == TRIGGER_SIZE_SHIFT + TRIGGER_SIZE_BITS, "weave: word 0 is size | src offset");
static_assert(TRIGGER_SRC_OFFSET_SHIFT + TRIGGER_OFFSET_BITS == 64, "weave: word 0 is full");
static_assert(TRIGGER_SRC_MEMORY_SHIFT == TRIGGER_DST_OFFSET_SHIFT + TRIGGER_OFFSET_BITS, "weave: word 1 layout");
static_assert(TRIGGER_SEMAPHORE_SHIFT + SEMAPHORE_ID_BITS == TRIGGER_COMMIT_SHIFT, "weave: word 1 is full");

// What the proxy does for a trigger (comm_core::fifo::TriggerType); flags combine.
struct TriggerType {
  static constexpr uint32_t Data = 1;  // copy size bytes from the source to the destination
  static constexpr uint32_t Flag = 2;  // signal the semaphore (after the copy)
  static constexpr uint32_t Sync = 4;  // flush the semaphore's connection
};

// One request to the proxy: two u64 words, laid out as above, commit bit clear.
struct Trigger {
  uint64_t w0;
  uint64_t w1;
};

// The decoded fields of a trigger (comm_core::fifo::TriggerFields).
struct TriggerFields {
  uint32_t type;        // TriggerType bits
  uint64_t size;        // bytes to copy (Data)
  uint32_t src_memory;  // memory copied from
  uint64_t src_offset;  // byte offset in it
  uint32_t dst_memory;  // memory copied to
  uint64_t dst_offset;  // byte offset in it
  uint32_t semaphore;   // semaphore to signal, whose connection carries copy and flush
};

// Encodes fields that are known to fit (constexpr; static checks use it). Out-of-range fields
// are not masked here: use make_trigger() for values that are not checked yet.
constexpr Trigger encode_trigger(const TriggerFields& f) {
  return Trigger{(f.size << TRIGGER_SIZE_SHIFT) | (f.src_offset << TRIGGER_SRC_OFFSET_SHIFT),
                 (f.dst_offset << TRIGGER_DST_OFFSET_SHIFT) |
                     (static_cast<uint64_t>(f.src_memory) << TRIGGER_SRC_MEMORY_SHIFT) |
                     (static_cast<uint64_t>(f.dst_memory) << TRIGGER_DST_MEMORY_SHIFT) |
                     (static_cast<uint64_t>(f.type) << TRIGGER_TYPE_SHIFT) |
                     (static_cast<uint64_t>(f.semaphore) << TRIGGER_SEMAPHORE_SHIFT)};
}

// True when every field fits its bits and the type is a non-empty combination of flags.
constexpr bool trigger_fields_fit(const TriggerFields& f) {
  return f.type != 0 && f.type <= field_mask(TRIGGER_TYPE_BITS) && f.size <= MAX_TRIGGER_SIZE &&
         f.src_offset <= MAX_TRIGGER_OFFSET && f.dst_offset <= MAX_TRIGGER_OFFSET && f.src_memory < MAX_MEMORIES &&
         f.dst_memory < MAX_MEMORIES && f.semaphore < MAX_SEMAPHORES;
}

// Decodes a trigger (the commit bit is ignored).
constexpr TriggerFields decode_trigger(const Trigger& t) {
  return TriggerFields{
      static_cast<uint32_t>((t.w1 >> TRIGGER_TYPE_SHIFT) & field_mask(TRIGGER_TYPE_BITS)),
      (t.w0 >> TRIGGER_SIZE_SHIFT) & MAX_TRIGGER_SIZE,
      static_cast<uint32_t>((t.w1 >> TRIGGER_SRC_MEMORY_SHIFT) & field_mask(MEMORY_ID_BITS)),
      (t.w0 >> TRIGGER_SRC_OFFSET_SHIFT) & MAX_TRIGGER_OFFSET,
      static_cast<uint32_t>((t.w1 >> TRIGGER_DST_MEMORY_SHIFT) & field_mask(MEMORY_ID_BITS)),
      (t.w1 >> TRIGGER_DST_OFFSET_SHIFT) & MAX_TRIGGER_OFFSET,
      static_cast<uint32_t>((t.w1 >> TRIGGER_SEMAPHORE_SHIFT) & field_mask(SEMAPHORE_ID_BITS)),
  };
}

// Checked encoding: false (BadArgument reported, *out untouched) when a field does not fit.
// Nothing is ever masked silently.
WEAVE_DEVICE bool make_trigger(const TriggerFields& f, const DeviceStatusHandle& status, Trigger* out) {
  if (!trigger_fields_fit(f)) {
    report_error(status, DeviceError::BadArgument);
    return false;
  }
  *out = encode_trigger(f);
  return true;
}

// The commit bit a valid trigger with sequence number `seq` carries in a ring of 2^lap_shift slots.
constexpr uint64_t fifo_commit_bit(uint64_t seq, uint32_t lap_shift) { return ((seq >> lap_shift) & 1) ^ 1; }

// Pushes a trigger (see the protocol above). True, and *seq_out = its sequence number (the
// ticket fifo_wait_processed takes) when seq_out is not null; false when it gave up
// (FifoTimeout or Aborted reported) or the handle is unusable (BadArgument).
WEAVE_DEVICE bool push(const FifoDeviceHandle& fifo, const Trigger& trigger, const DeviceStatusHandle& status,
                       uint64_t* seq_out = nullptr) {
  const uint64_t capacity = fifo.capacity;
  if (capacity == 0 || (capacity & (capacity - 1)) != 0 || fifo.triggers == 0 || fifo.head == 0 || fifo.tail == 0 ||
      (trigger.w1 & TRIGGER_COMMIT_BIT) != 0) {
    report_error(status, DeviceError::BadArgument);
    return false;
  }
  const uint64_t seq = atomic_fetch_add_relaxed_sys(as_ptr<uint64_t>(fifo.head), 1);
  const uint64_t* tail = as_ptr<const uint64_t>(fifo.tail);
  if (!spin_until([&] { return seq - atomic_load_acquire_sys(tail) < capacity; }, status, DeviceError::FifoTimeout)) {
    return false;
  }
  const uint32_t lap_shift = static_cast<uint32_t>(__popcll(capacity - 1));
  uint64_t* slot = as_ptr<uint64_t>(fifo.triggers) + 2 * (seq & (capacity - 1));
  atomic_store_relaxed_sys(slot, trigger.w0);
  atomic_store_release_sys(slot + 1, trigger.w1 | (fifo_commit_bit(seq, lap_shift) << TRIGGER_COMMIT_SHIFT));
  if (seq_out != nullptr) *seq_out = seq;
  return true;
}

// Bounded wait until the consumer popped the trigger with sequence number `seq` (tail > seq,
// acquire: what the proxy did for it is visible). False when it gave up (FifoTimeout/Aborted).
WEAVE_DEVICE bool fifo_wait_processed(const FifoDeviceHandle& fifo, uint64_t seq, const DeviceStatusHandle& status) {
  const uint64_t* tail = as_ptr<const uint64_t>(fifo.tail);
  return spin_until([&] { return atomic_load_acquire_sys(tail) > seq; }, status, DeviceError::FifoTimeout);
}

}  // namespace weave

#endif  // WEAVE_FIFO_CUH
