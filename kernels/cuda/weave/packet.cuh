// weave/packet.cuh: LL ("low latency") packets: data interleaved with a flag, written by one
// store, so a reader that sees the flag has the data and no separate signal is needed.
//
//   LL16Packet: {data1, flag1, data2, flag2}, 8 bytes of payload, one 16-byte store
//               (st.volatile.global.v4.u32); valid when both flags equal the expected flag.
//   LL8Packet:  {data, flag}, 4 bytes of payload, one 8-byte store (st.volatile.global.v2.u32).
//   LL128 line: 16 u64, the last one the flag, 120 bytes of payload; written by the 8 lanes of
//               a warp's lane group with one 16-byte store each in one warp instruction, read
//               the same way (see "LL128 lines" below: NVLink only).
//
// The flag is a per-use counter chosen by the caller: it must be non-zero (a zeroed buffer
// would read as valid under flag 0) and differ from the flag the buffer held before.
// Payload bytes are little-endian: packet i carries bytes [i*P, (i+1)*P) of the message, the
// last packet of a message whose size is not a multiple of P carries zero padding.
#ifndef WEAVE_PACKET_CUH
#define WEAVE_PACKET_CUH

#include "weave/atomics.cuh"
#include "weave/handles.cuh"
#include "weave/status.cuh"
#include "weave/types.cuh"

namespace weave {

// ---- single packets -------------------------------------------------------------------------

// Writes 8 bytes of data (low word in data1) and the flag with one 16-byte store.
WEAVE_DEVICE void write_ll16(LL16Packet* p, uint64_t data, uint32_t flag) {
  store_volatile_v4(&p->data1, static_cast<uint32_t>(data), flag, static_cast<uint32_t>(data >> 32), flag);
}

// Non-blocking read: true and *out set when both flags equal `flag`.
WEAVE_DEVICE bool try_read_ll16(const LL16Packet* p, uint32_t flag, uint64_t* out) {
  uint32_t d1, f1, d2, f2;
  load_volatile_v4(&p->data1, d1, f1, d2, f2);
  if (f1 != flag || f2 != flag) return false;
  *out = static_cast<uint64_t>(d1) | (static_cast<uint64_t>(d2) << 32);
  return true;
}

// Bounded wait for the packet to carry `flag`, then *out = its data. False (PacketTimeout or
// Aborted reported) when it gave up.
WEAVE_DEVICE bool read_ll16(const LL16Packet* p, uint32_t flag, const DeviceStatusHandle& status, uint64_t* out) {
  return spin_until([&] { return try_read_ll16(p, flag, out); }, status, DeviceError::PacketTimeout);
}

// Bounded wait for several LL16 packets at once: packet i (bit i of `mask`, i < MAX) is at(i);
// out[i] gets its data. Each pass loads every packet still missing before looking at any, so
// the waits for different writers overlap instead of adding up (one memory round trip for all
// of them when they already arrived). False (PacketTimeout or Aborted reported) when it gave up.
template <uint32_t MAX, typename At>
WEAVE_DEVICE bool read_ll16_each(At at, uint32_t mask, uint32_t flag, const DeviceStatusHandle& status,
                                 uint64_t (&out)[MAX]) {
  uint32_t pending = mask;
  return spin_until(
      [&] {
        uint32_t d1[MAX], f1[MAX], d2[MAX], f2[MAX];
#pragma unroll
        for (uint32_t i = 0; i < MAX; ++i) {
          if (pending >> i & 1) load_volatile_v4(&at(i)->data1, d1[i], f1[i], d2[i], f2[i]);
        }
#pragma unroll
        for (uint32_t i = 0; i < MAX; ++i) {
          if ((pending >> i & 1) && f1[i] == flag && f2[i] == flag) {
            out[i] = static_cast<uint64_t>(d1[i]) | (static_cast<uint64_t>(d2[i]) << 32);
            pending &= ~(1u << i);
          }
        }
        return pending == 0;
      },
      status, DeviceError::PacketTimeout);
}

// Writes 4 bytes of data and the flag with one 8-byte store.
WEAVE_DEVICE void write_ll8(LL8Packet* p, uint32_t data, uint32_t flag) {
  store_volatile_v2(&p->data, data, flag);
}

// Non-blocking read: true and *out set when the flag equals `flag`.
WEAVE_DEVICE bool try_read_ll8(const LL8Packet* p, uint32_t flag, uint32_t* out) {
  uint32_t d, f;
  load_volatile_v2(&p->data, d, f);
  if (f != flag) return false;
  *out = d;
  return true;
}

// Bounded wait for the packet to carry `flag`, then *out = its data.
WEAVE_DEVICE bool read_ll8(const LL8Packet* p, uint32_t flag, const DeviceStatusHandle& status, uint32_t* out) {
  return spin_until([&] { return try_read_ll8(p, flag, out); }, status, DeviceError::PacketTimeout);
}

// ---- packet traits, so the cooperative helpers serve both kinds -----------------------------

template <typename P>
struct PacketTraits;

template <>
struct PacketTraits<LL16Packet> {
  typedef uint64_t Word;                         // payload of one packet
  static constexpr uint32_t PAYLOAD_BYTES = 8;   // bytes of payload per packet
};

template <>
struct PacketTraits<LL8Packet> {
  typedef uint32_t Word;
  static constexpr uint32_t PAYLOAD_BYTES = 4;
};

WEAVE_DEVICE void write_packet(LL16Packet* p, uint64_t data, uint32_t flag) { write_ll16(p, data, flag); }
WEAVE_DEVICE void write_packet(LL8Packet* p, uint32_t data, uint32_t flag) { write_ll8(p, data, flag); }
WEAVE_DEVICE bool read_packet(const LL16Packet* p, uint32_t flag, const DeviceStatusHandle& s, uint64_t* out) {
  return read_ll16(p, flag, s, out);
}
WEAVE_DEVICE bool read_packet(const LL8Packet* p, uint32_t flag, const DeviceStatusHandle& s, uint32_t* out) {
  return read_ll8(p, flag, s, out);
}

// Number of packets of kind P that carry `bytes` bytes.
template <typename P>
WEAVE_DEVICE uint64_t packet_count(uint64_t bytes) {
  return (bytes + PacketTraits<P>::PAYLOAD_BYTES - 1) / PacketTraits<P>::PAYLOAD_BYTES;
}

// ---- cooperative helpers --------------------------------------------------------------------

// Cooperatively turns `bytes` bytes at src (any alignment) into packet_count<P>(bytes) packets
// at dst (usually the peer's packet buffer), each carrying `flag`.
template <typename P>
WEAVE_DEVICE void put_packets(P* dst, const void* src, uint64_t bytes, uint32_t thread, uint32_t nthreads,
                              uint32_t flag) {
  typedef typename PacketTraits<P>::Word Word;
  constexpr uint64_t B = PacketTraits<P>::PAYLOAD_BYTES;
  const uint8_t* s = static_cast<const uint8_t*>(src);
  const bool aligned = as_address(s) % B == 0;
  const uint64_t count = packet_count<P>(bytes);
  for (uint64_t i = thread; i < count; i += nthreads) {
    const uint64_t offset = i * B;
    const uint64_t len = bytes - offset < B ? bytes - offset : B;
    Word w = 0;
    if (aligned && len == B) {
      w = *reinterpret_cast<const Word*>(s + offset);
    } else {
      for (uint64_t k = 0; k < len; ++k) w |= static_cast<Word>(s[offset + k]) << (8 * k);
    }
    write_packet(dst + i, w, flag);
  }
}

// Cooperatively waits for the packets put_packets<P>(…, bytes, …, flag) wrote at src (usually
// this GPU's packet buffer) and stores their payload, `bytes` bytes, at dst (any alignment).
// False when this thread gave up on a packet (PacketTimeout or Aborted reported).
template <typename P>
WEAVE_DEVICE bool unpack_packets(void* dst, const P* src, uint64_t bytes, uint32_t thread, uint32_t nthreads,
                                 uint32_t flag, const DeviceStatusHandle& status) {
  typedef typename PacketTraits<P>::Word Word;
  constexpr uint64_t B = PacketTraits<P>::PAYLOAD_BYTES;
  uint8_t* d = static_cast<uint8_t*>(dst);
  const bool aligned = as_address(d) % B == 0;
  const uint64_t count = packet_count<P>(bytes);
  for (uint64_t i = thread; i < count; i += nthreads) {
    Word w;
    if (!read_packet(src + i, flag, status, &w)) return false;
    const uint64_t offset = i * B;
    const uint64_t len = bytes - offset < B ? bytes - offset : B;
    if (aligned && len == B) {
      *reinterpret_cast<Word*>(d + offset) = w;
    } else {
      for (uint64_t k = 0; k < len; ++k) d[offset + k] = static_cast<uint8_t>(w >> (8 * k));
    }
  }
  return true;
}

// ---- LL128 lines ----------------------------------------------------------------------------
//
// A line is 128 bytes (128-byte aligned): u64 words 0..14 carry payload, word 15 the flag.
// Lane group g of a warp (lanes 8g .. 8g + 7) moves one line; lane part p = lane % 8 holds
// words 2p and 2p + 1, so part 7 holds payload word 14 and the flag. The warp writes its four
// lines with one 16-byte store per lane in one instruction, and reads them the same way.
// A reader that sees the flag in its line's load has the whole line: on NVLink a warp's
// 128-byte-aligned store reaches the peer as one transaction, the property NCCL's LL128
// protocol rests on too. Over PCIe it does not hold, so the host uses lines only between
// GPUs that reach each other over NVLink. Every function here is warp-collective: all 32
// lanes call it with the same arguments except the per-lane ones.

constexpr uint32_t LL128_LINE_WORDS = 16;
constexpr uint32_t LL128_PAYLOAD_WORDS = 15;
constexpr uint32_t LL128_LANES_PER_LINE = 8;
constexpr uint32_t LL128_LINES_PER_WARP = 32 / LL128_LANES_PER_LINE;
constexpr uint32_t FULL_WARP = 0xffffffffu;

// This lane's part of its line (0..7).
WEAVE_DEVICE uint32_t ll128_part() { return threadIdx.x % LL128_LANES_PER_LINE; }

// This lane's line within its warp's group of four (0..3).
WEAVE_DEVICE uint32_t ll128_group() { return threadIdx.x % 32 / LL128_LANES_PER_LINE; }

// Payload word `j` (0 or 1) of this lane's part, as an index into the line's payload, or
// LL128_PAYLOAD_WORDS when the part has no such word (part 7's second word is the flag).
WEAVE_DEVICE uint32_t ll128_payload_index(uint32_t j) {
  const uint32_t w = 2 * ll128_part() + j;
  return w < LL128_PAYLOAD_WORDS ? w : LL128_PAYLOAD_WORDS;
}

// Stores this lane's part of `line` (w0, w1 are its payload words; part 7's w1 is replaced by
// the flag). Every lane of the warp must call it together, even lanes without a line (`active`
// false), so the four lines leave in one instruction.
WEAVE_DEVICE void write_ll128(uint64_t* line, bool active, uint64_t w0, uint64_t w1, uint64_t flag) {
  __syncwarp();
  if (active) store_volatile_v2_u64(line + 2 * ll128_part(), w0, ll128_part() == 7 ? flag : w1);
}

// Bounded wait, by the whole warp, until each of up to MAX lines of this lane's group carries
// `flag`: line i (bit i of the group's `mask`) is at(i); w0[i], w1[i] get this lane's words of
// it. Every pass reloads every line with one load per lane and line, so a line whose flag
// matched was read whole. False on every lane when the warp gave up (PacketTimeout or Aborted
// reported, or another thread already failed).
template <uint32_t MAX, typename At>
WEAVE_DEVICE bool read_ll128_each(At at, uint32_t mask, uint64_t flag, const DeviceStatusHandle& status,
                                  uint64_t (&w0)[MAX], uint64_t (&w1)[MAX]) {
  const bool flag_lane = ll128_part() == 7;
  const int64_t start = clock64();
  for (uint32_t pass = 1;; ++pass) {
#pragma unroll
    for (uint32_t i = 0; i < MAX; ++i) {
      if (mask >> i & 1) load_volatile_v2_u64(at(i), w0[i], w1[i]);
    }
    bool ready = true;
#pragma unroll
    for (uint32_t i = 0; i < MAX; ++i) {
      if ((mask >> i & 1) && flag_lane && w1[i] != flag) ready = false;
    }
    if (__all_sync(FULL_WARP, ready)) return true;
    // Give up together: on a timeout, when the host asks to stop, or when another thread
    // already failed (then there is nothing to report).
    bool quit = false;
    uint32_t report = DeviceError::None;
    if (static_cast<uint64_t>(clock64() - start) > status.timeout_cycles) {
      quit = true;
      report = DeviceError::PacketTimeout;
    }
    if (pass % SPIN_CHECK_PERIOD == 0 && threadIdx.x % 32 == 0) {
      if (abort_requested(status)) {
        quit = true;
        report = DeviceError::Aborted;
      } else if (status_error(status) != DeviceError::None) {
        quit = true;
      }
    }
    if (__any_sync(FULL_WARP, quit)) {
      const uint32_t code = __reduce_max_sync(FULL_WARP, report);
      if (threadIdx.x % 32 == 0 && code != DeviceError::None) report_error(status, code);
      return false;
    }
  }
}

}  // namespace weave

#endif  // WEAVE_PACKET_CUH
