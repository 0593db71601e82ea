// weave collective kernels: every collective on device buffers, stream-ordered.
//
// Workspace: four areas per rank, each one device allocation mapped by every peer, each made
// when a kernel first needs it (GpuCollectiveArgs holds every rank's address of each, as mapped
// into this GPU; an area not made yet is 0 and no kernel that uses it is launched):
//
// Control area (peers[r]), made with the engine:
//   [0, 512)          flags: u64 at 64*w, written (release, system scope) by rank w
//   [512, 768)        registered buffers' addresses: 32 bytes at 32*w, written by rank w
//                     (windowed.cu)
//   [1536, 2048)      packet epochs: u64 per block index < PACKET_MAX_BLOCKS (packet kernels)
//   [2048]            this rank's epoch (u64): phases completed by this rank so far
//   [2056]            block arrival counter (u32) for grid-wide phases
//   [3072, 4096)      step counters of the block-pipelined kernels (u64 per block)
//   [4096, PKT_END)   LL16 packets: [writer][parity][packet_capacity]
//   [P2P, ...)        point-to-point mailboxes: [writer][parity][aux[2] bytes]
// Slot area (slots[r]): data slots of the flag-based kernels: [parity][world + 1][chunk_bytes / 2]
// Pipe area (pipes[r]): the block-pipelined kernels' flags, then slots (pipeline.cu)
// Line area (lines[r]): LL128 lines: [writer][parity][ll128_lines] of 128 bytes
//
// Every counter an area's protocol keeps across kernels lives in the control area, and a new
// area is zero: the pipe area's flags are monotonic step numbers whose counters start at 0 with
// the area (only pipelined kernels advance them), and the LL128 lines wait for a flag equal to
// the packet epoch + 1 (never 0).
//
// The program is this file followed by data_movement.cu (byte kernels and point-to-point),
// exchange_ll.cu (LL packet kernels of the data-movement
// collectives), pipeline.cu (block-pipelined kernels for large messages) and windowed.cu (the
// all-reduce over windows, reading and writing user memory in place).
//
// Point-to-point (weave_sendrecv) uses pairwise words only, so the two ranks of a transfer
// synchronize with each other and nobody else: in the receiver's control block, ready[w]
// (512 + 64 w, written by sender w: chunks of w made ready for it) and ack[w] (1024 + 64 w,
// written by receiver w: chunks of this rank that w consumed); this rank's own counters
// sent[w] / received[w] at 2560 / 2624 + 8 w; arrival counters (u32: parity 0, parity 1, end)
// at 2688 (send side) and 2704 (receive side). Blocks of a side do not wait for each other,
// so a fast block may reach chunk c + 1 while a slow one still copies chunk c: one counter per
// slot parity keeps their arrivals apart (a block reaches chunk c + 2 only after the receiver
// acknowledged chunk c, which needs every block's arrival for chunk c).
// A chunk goes into slot parity (seq & 1) once the receiver acknowledged seq - 2; each slot
// starts with a header (message length, chunk index) so mismatched sizes are reported.
//
// Synchronization is by epochs: a kernel reads the epoch E at start; its k-th phase publishes
// E + k to every rank's flag slot (its own included) once all its blocks arrived, and waits until
// every rank's flag reached E + k. The last block advances the epoch at the end, on the device,
// so CUDA-graph replays stay in step. Every flag-based kernel (reduce, all-to-all-v) starts with
// an entry phase, so no rank writes into a peer's slots while that peer still runs an earlier
// kernel. The packet kernels and the block-pipelined kernels need no phase (see their
// comments) and leave this epoch alone: the packet kernels count themselves in the packet
// epochs (one counter per block index, so no block waits for another at the end; see
// packet_epoch), the pipelined kernels in their step counters. Every spin is
// bounded by DeviceStatusHandle (a timed-out kernel records the error and returns).
//
// Grids are at most one block per SM (the host guarantees it), so all blocks are co-resident and
// the grid-wide phases cannot deadlock.

#include "weave/weave.cuh"

namespace weave {

// First statement of every kernel. On sm_90 and later the host launches the kernels with
// programmatic stream serialization, so a kernel may be scheduled while the kernel before it
// on the stream still runs: it waits here until that kernel completed and its writes are
// visible (so nothing below this line sees a difference), then lets the next kernel start
// launching, which hides the launch latency behind the running kernel. A kernel launched
// without the attribute passes both instructions at once.
WEAVE_DEVICE void await_previous_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace weave

// Every kernel entry point NAME(GpuCollectiveArgs a), running RUN(a) after
// await_previous_kernels() and report_started(): C linkage, and at most WEAVE_BLOCK_THREADS threads per block
// (defined by the host program builder from the launch configuration), so the compiler keeps
// each thread's registers within what a full block may use.
#define WEAVE_KERNEL(NAME, ...)                                                                      \
  extern "C" __global__ void __launch_bounds__(WEAVE_BLOCK_THREADS) NAME(weave::GpuCollectiveArgs a) { \
    weave::await_previous_kernels();                                                                   \
    weave::report_started(a.status);                                                                   \
    __VA_ARGS__(a);                                                                                    \
  }

// The body IMPL of a reducing kernel, as WEAVE_REDUCING_KERNEL takes it: a template
// NAME<Op, T> whose run(a) calls IMPL(a); IMPL may name Op and T.
#define WEAVE_REDUCING_BODY(NAME, ...)                                            \
  template <typename Op, typename T>                                              \
  struct NAME {                                                                   \
    WEAVE_DEVICE static void run(const GpuCollectiveArgs& a) { __VA_ARGS__(a); } \
  };

namespace weave {

struct GpuCollectiveArgs {
  uint64_t send;
  uint64_t recv;
  uint64_t count;
  uint64_t peers[8];
  uint64_t aux[4];
  uint64_t packet_capacity;
  uint64_t chunk_bytes;
  uint64_t slots[8];
  uint64_t pipes[8];
  uint64_t pipe_share_bytes;
  uint64_t lines[8];
  uint64_t ll128_lines;
  uint64_t win_send[8];
  uint64_t win_recv[8];
  uint32_t rank;
  uint32_t world;
  uint32_t root;
  uint32_t op;
  DeviceStatusHandle status;
};

namespace coll {

constexpr uint64_t FLAG_STRIDE = 64;
constexpr uint64_t EPOCH_OFFSET = 2048;
constexpr uint64_t ARRIVALS_OFFSET = 2056;
constexpr uint64_t PACKETS_OFFSET = 4096;

// End of the LL16 packets in the control area (256-aligned): where the mailboxes start.
WEAVE_DEVICE uint64_t packets_end(const GpuCollectiveArgs& a) {
  const uint64_t end = PACKETS_OFFSET + uint64_t(a.world) * 2 * a.packet_capacity * sizeof(LL16Packet);
  return (end + 255) / 256 * 256;
}

// Slot `slot` (0..world) of parity `parity` in rank `owner`'s slot area.
WEAVE_DEVICE char* slot_ptr(const GpuCollectiveArgs& a, uint32_t owner, uint32_t parity, uint32_t slot) {
  const uint64_t half = a.chunk_bytes / 2;
  return as_ptr<char>(a.slots[owner] + (uint64_t(parity) * (a.world + 1) + slot) * half);
}

WEAVE_DEVICE uint64_t* epoch_ptr(const GpuCollectiveArgs& a) { return as_ptr<uint64_t>(a.peers[a.rank] + EPOCH_OFFSET); }
WEAVE_DEVICE uint32_t* arrivals_ptr(const GpuCollectiveArgs& a) {
  return as_ptr<uint32_t>(a.peers[a.rank] + ARRIVALS_OFFSET);
}

WEAVE_DEVICE uint32_t global_thread() { return blockIdx.x * blockDim.x + threadIdx.x; }
WEAVE_DEVICE uint32_t global_threads() { return gridDim.x * blockDim.x; }

// Grid-wide phase `index` (1-based within the kernel): every block arrives; the last one
// publishes `value` to every rank's flag slot for this rank (release, system scope).
WEAVE_DEVICE void arrive(const GpuCollectiveArgs& a, uint64_t value, uint32_t index) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    const uint32_t before = atomicAdd(arrivals_ptr(a), 1u);
    if (before == gridDim.x * index - 1) {
      for (uint32_t r = 0; r < a.world; ++r) {
        atomic_store_release_sys(as_ptr<uint64_t>(a.peers[r] + uint64_t(a.rank) * FLAG_STRIDE), value);
      }
    }
  }
}

// Waits until every rank (this one included) published at least `value`. False when the wait
// gave up (the error is recorded); then the kernel must return.
WEAVE_DEVICE bool wait_all(const GpuCollectiveArgs& a, uint64_t value) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    for (uint32_t r = 0; r < a.world && ok; ++r) {
      const uint64_t* flag = as_ptr<const uint64_t>(a.peers[a.rank] + uint64_t(r) * FLAG_STRIDE);
      if (!spin_until([&] { return atomic_load_acquire_sys(flag) >= value; }, a.status, DeviceError::SemaphoreTimeout)) {
        ok = 0;
      }
    }
  }
  __syncthreads();
  return ok != 0;
}

// A full phase: arrive and wait.
WEAVE_DEVICE bool phase(const GpuCollectiveArgs& a, uint64_t epoch, uint32_t& index) {
  ++index;
  arrive(a, epoch + index, index);
  return wait_all(a, epoch + index);
}

// End of kernel: the last block resets the arrival counter and advances the epoch by `advance`.
// A one-block kernel that never arrived is the last block by itself: it skips the counter (one
// atomic round trip less on the small-message path).
WEAVE_DEVICE void finish(const GpuCollectiveArgs& a, uint64_t epoch, uint32_t arrivals, uint64_t advance) {
  __syncthreads();
  if (gridDim.x == 1 && arrivals == 0) {
    if (threadIdx.x == 0) *epoch_ptr(a) = epoch + advance;
    return;
  }
  if (threadIdx.x == 0) {
    __threadfence();
    const uint32_t before = atomicAdd(arrivals_ptr(a), 1u);
    if (before == gridDim.x * (arrivals + 1) - 1) {
      *arrivals_ptr(a) = 0;
      *epoch_ptr(a) = epoch + advance;
      __threadfence();
    }
  }
}

// The LL16 packets `writer` writes into `owner`'s workspace under parity `parity`
// (packet_capacity of them).
WEAVE_DEVICE LL16Packet* packet_buffer(const GpuCollectiveArgs& a, uint32_t owner, uint32_t writer, uint32_t parity) {
  return as_ptr<LL16Packet>(a.peers[owner] + PACKETS_OFFSET) + (uint64_t(writer) * 2 + parity) * a.packet_capacity;
}

// ---- packet epochs ------------------------------------------------------------------------
//
// The packet kernels (LL16 packets, LL128 lines) number their uses of the packet buffers: the
// E-th packet kernel on a rank uses flag E + 1 and parity (E + 1) & 1, equal on every rank since
// every rank runs the same kernels. E lives in PACKET_MAX_BLOCKS counters, one per block
// index, all equal between kernels: block b of a B-block kernel reads counter b at its start
// and at its end stores E + 1 into counters b, b + B, b + 2B, … So every counter advances once
// per kernel, no block reads a counter another block of the same kernel writes, and the end
// of a kernel needs neither an arrival counter nor a fence (the next kernel on the stream
// starts after this one completed).
constexpr uint64_t PACKET_EPOCHS_OFFSET = 1536;
constexpr uint32_t PACKET_MAX_BLOCKS = WEAVE_PACKET_MAX_BLOCKS;
static_assert(PACKET_EPOCHS_OFFSET + 8 * PACKET_MAX_BLOCKS <= EPOCH_OFFSET, "packet epochs overlap the epoch");

WEAVE_DEVICE uint64_t* packet_epochs(const GpuCollectiveArgs& a) {
  return as_ptr<uint64_t>(a.peers[a.rank] + PACKET_EPOCHS_OFFSET);
}

// This packet kernel's E (every thread of the block reads it at the start), or false (the
// error reported, nothing advanced) when the grid has more blocks than there are counters; the
// host never launches one.
WEAVE_DEVICE bool packet_epoch(const GpuCollectiveArgs& a, uint64_t& epoch) {
  if (gridDim.x > PACKET_MAX_BLOCKS) {
    if (blockIdx.x == 0 && threadIdx.x == 0) report_error(a.status, DeviceError::BadArgument);
    return false;
  }
  epoch = packet_epochs(a)[blockIdx.x];
  return true;
}

// packet_epoch, with what this epoch's LL16 packets use: the flag they carry (E + 1, never 0)
// and the parity of the packet buffers (alternating per epoch).
WEAVE_DEVICE bool packet_epoch(const GpuCollectiveArgs& a, uint64_t& epoch, uint32_t& flag, uint32_t& parity) {
  if (!packet_epoch(a, epoch)) return false;
  flag = uint32_t(epoch + 1);
  parity = uint32_t(epoch + 1) & 1;
  return true;
}

// The start every LL16 packet kernel shares, in a kernel whose arguments are `a`: declares
// this block's packet `epoch` with its `flag` and `parity` (packet_epoch; the kernel returns
// where that refuses the grid), the call's `bytes` (BYTES) as `words` of 8 bytes, the `send`
// and `recv` buffers, this thread's place `t` among `nt` in the grid, and `packets(owner,
// writer)`: the buffer on rank `owner` that rank `writer` fills in this epoch.
#define WEAVE_LL16_KERNEL_START(BYTES)                                                     \
  uint64_t epoch;                                                                           \
  uint32_t flag, parity;                                                                    \
  if (!packet_epoch(a, epoch, flag, parity)) return;                                        \
  const uint64_t bytes = (BYTES);                                                           \
  const uint64_t words = (bytes + 7) / 8;                                                   \
  const char* send = as_ptr<const char>(a.send);                                            \
  char* recv = as_ptr<char>(a.recv);                                                        \
  const uint32_t t = global_thread(), nt = global_threads();                                \
  auto packets = [&](uint32_t owner, uint32_t writer) { return packet_buffer(a, owner, writer, parity); }

// End of a packet kernel: this block advances its counters to E + 1 (after every thread of the
// block read E), one counter per thread.
WEAVE_DEVICE void packet_finish(const GpuCollectiveArgs& a, uint64_t epoch) {
  static_assert(PACKET_MAX_BLOCKS <= WEAVE_BLOCK_THREADS, "a block advances up to PACKET_MAX_BLOCKS counters");
  __syncthreads();
  const uint32_t j = blockIdx.x + threadIdx.x * gridDim.x;
  if (j < PACKET_MAX_BLOCKS) packet_epochs(a)[j] = epoch + 1;
}

// Ends a packet kernel whose call does not fit its buffers (the host never launches one):
// BadArgument reported once, the epoch advanced all the same. Every thread of the block calls it.
WEAVE_DEVICE void packet_refuse(const GpuCollectiveArgs& a, uint64_t epoch) {
  if (global_thread() == 0) report_error(a.status, DeviceError::BadArgument);
  packet_finish(a, epoch);
}

// Loads the 8-byte word `w` of a byte range of length `bytes` (zero-padded past the end).
WEAVE_DEVICE uint64_t load_word(const char* p, uint64_t w, uint64_t bytes) {
  const uint64_t at = w * 8;
  if (at + 8 <= bytes && as_address(p) % 8 == 0) return reinterpret_cast<const uint64_t*>(p)[w];
  uint64_t v = 0;
  for (uint64_t b = 0; b < 8 && at + b < bytes; ++b) v |= uint64_t(uint8_t(p[at + b])) << (8 * b);
  return v;
}

WEAVE_DEVICE void store_word(char* p, uint64_t w, uint64_t bytes, uint64_t v) {
  const uint64_t at = w * 8;
  if (at + 8 <= bytes && as_address(p) % 8 == 0) {
    reinterpret_cast<uint64_t*>(p)[w] = v;
    return;
  }
  for (uint64_t b = 0; b < 8 && at + b < bytes; ++b) p[at + b] = char(uint8_t(v >> (8 * b)));
}

// ---- peers in rank order (packet kernels) ---------------------------------------------------

// At most this many peers (GpuCollectiveArgs::peers has 8 entries).
constexpr uint32_t MAX_PEERS = 7;

// The i-th peer in rank order, skipping this rank (i < world - 1).
WEAVE_DEVICE uint32_t peer_rank(const GpuCollectiveArgs& a, uint32_t i) { return i < a.rank ? i : i + 1; }

// Bit i set for every peer index i < world - 1.
WEAVE_DEVICE uint32_t every_peer(const GpuCollectiveArgs& a) { return (1u << (a.world - 1)) - 1; }

// Op over the words of ranks 0, 1, …, world - 1 in that order (this rank's is `mine`, peer i's
// is theirs[i]): every rank that combines the same words gets the same bits, whatever its rank.
template <typename Op, typename T>
WEAVE_DEVICE uint64_t combine_in_rank_order(const GpuCollectiveArgs& a, uint64_t mine,
                                            const uint64_t (&theirs)[MAX_PEERS]) {
  uint64_t acc = 0;
#pragma unroll
  for (uint32_t r = 0; r <= MAX_PEERS; ++r) {
    if (r < a.world) {
      uint64_t x = mine;
      if (r < a.rank) x = theirs[r < MAX_PEERS ? r : 0];
      if (r > a.rank) x = theirs[r > 0 ? r - 1 : 0];
      acc = r == 0 ? x : reduce_lanes<Op, T>(acc, x);
    }
  }
  return acc;
}

// Word `w` of this rank's result: the peers' words, read as LL16 packets (peer i's at at(i)),
// combined in rank order with word `w` of `own` (a range of `bytes` bytes), divided by the rank
// count for an average, into `acc`. False when a read gave up (its error reported).
template <typename Op, typename T, typename At>
WEAVE_DEVICE bool reduce_ll16_word(const GpuCollectiveArgs& a, const At& at, uint32_t flag, const char* own, uint64_t w,
                                   uint64_t bytes, uint64_t& acc) {
  uint64_t theirs[MAX_PEERS];
  if (!read_ll16_each<MAX_PEERS>(at, every_peer(a), flag, a.status, theirs)) return false;
  acc = combine_in_rank_order<Op, T>(a, load_word(own, w, bytes), theirs);
  if (a.op == OP_AVG) acc = divide_lanes<T>(acc, a.world);
  return true;
}

// [begin, end) of part `part` of `elems` elements split `parts` ways at multiples of `align`.
WEAVE_DEVICE void split(uint64_t elems, uint32_t parts, uint32_t part, uint64_t align, uint64_t& begin, uint64_t& end) {
  const uint64_t units = (elems + align - 1) / align;
  begin = units * part / parts * align;
  end = units * (part + 1) / parts * align;
  if (begin > elems) begin = elems;
  if (end > elems) end = elems;
}

// Calls body(q, b, e) for every peer q, in order from the rank after this one, with [b, e) its
// word share of `words` words split over the ranks (the two-shot all-reduces' scatter).
template <typename Body>
WEAVE_DEVICE void for_each_peer_share(const GpuCollectiveArgs& a, uint64_t words, const Body& body) {
  for (uint32_t k = 1; k < a.world; ++k) {
    const uint32_t q = (a.rank + k) % a.world;
    uint64_t b, e;
    split(words, a.world, q, 1, b, e);
    body(q, b, e);
  }
}

// The words [begin[i], end[i]) of peer i's share when `words` words are split over the ranks
// (the two-shot all-reduces' gather); an empty range for every i >= world - 1.
WEAVE_DEVICE void peer_shares(const GpuCollectiveArgs& a, uint64_t words, uint64_t (&begin)[MAX_PEERS],
                              uint64_t (&end)[MAX_PEERS]) {
#pragma unroll
  for (uint32_t i = 0; i < MAX_PEERS; ++i) {
    uint64_t b = 0, e = 0;
    if (i + 1 < a.world) split(words, a.world, peer_rank(a, i), 1, b, e);
    begin[i] = b;
    end[i] = e;
  }
}

// ---- all-reduce ---------------------------------------------------------------------------

// One-shot with LL16 packets (small messages): every rank writes its data as packets into
// every peer's packet buffer; every rank reads the peers' packets from its own buffer and
// combines them in rank order (so every rank gets the same bits). No flag phase: the packet
// flag is the epoch.
template <typename Op, typename T>
WEAVE_DEVICE void all_reduce_ll(const GpuCollectiveArgs& a) {
  WEAVE_LL16_KERNEL_START(a.count * sizeof(T));
  if (words <= a.packet_capacity) {
    for (uint64_t w = t; w < words; w += nt) {
      const uint64_t mine = load_word(send, w, bytes);
      for (uint32_t k = 1; k < a.world; ++k) {
        const uint32_t peer = (a.rank + k) % a.world;
        write_ll16(packets(peer, a.rank) + w, mine, flag);
      }
    }
    for (uint64_t w = t; w < words; w += nt) {
      auto at = [&](uint32_t i) { return packets(a.rank, peer_rank(a, i)) + w; };
      uint64_t acc;
      if (!reduce_ll16_word<Op, T>(a, at, flag, send, w, bytes, acc)) break;
      store_word(recv, w, bytes, acc);
    }
  } else if (t == 0) {
    report_error(a.status, DeviceError::BadArgument);
  }
  packet_finish(a, epoch);
}

// Two-shot with LL16 packets (medium messages), no flag phase either: rank q owns word share q.
// Every rank writes its share q as packets into rank q's buffer (first half of its slot);
// rank q combines the n-1 received shares with its own, stores the result, and writes it as
// packets into every rank's buffer (second half of its slot); every rank then reads the other
// reduced shares. Each rank moves about 2(n-1)/n of the message instead of n-1 times it.
template <typename Op, typename T>
WEAVE_DEVICE void all_reduce_two_shot(const GpuCollectiveArgs& a) {
  WEAVE_LL16_KERNEL_START(a.count * sizeof(T));
  const uint64_t half = a.packet_capacity / 2;
  uint64_t mb, me_end;
  split(words, a.world, a.rank, 1, mb, me_end);
  if ((words + a.world - 1) / a.world > half) {
    packet_refuse(a, epoch);
    return;
  }
  // 1. Scatter: share q of the input to rank q.
  for_each_peer_share(a, words, [&](uint32_t q, uint64_t b, uint64_t e) {
    for (uint64_t i = t; i < e - b; i += nt) write_ll16(packets(q, a.rank) + i, load_word(send, b + i, bytes), flag);
  });
  // 2. Reduce the own share; keep it and send it to every rank.
  bool ok = true;
  for (uint64_t i = t; i < me_end - mb; i += nt) {
    auto at = [&](uint32_t j) { return packets(a.rank, peer_rank(a, j)) + i; };
    uint64_t acc;
    ok = reduce_ll16_word<Op, T>(a, at, flag, send, mb + i, bytes, acc);
    if (!ok) break;
    store_word(recv, mb + i, bytes, acc);
    for (uint32_t k = 1; k < a.world; ++k) {
      write_ll16(packets((a.rank + k) % a.world, a.rank) + half + i, acc, flag);
    }
  }
  // 3. Gather the other reduced shares, every peer's at once (shares differ by at most a word).
  uint64_t begin[MAX_PEERS], end[MAX_PEERS];
  peer_shares(a, words, begin, end);
  const uint64_t longest = (words + a.world - 1) / a.world;
  for (uint64_t i = t; i < longest && ok; i += nt) {
    uint32_t mask = 0;
#pragma unroll
    for (uint32_t j = 0; j < MAX_PEERS; ++j) mask |= (i < end[j] - begin[j] ? 1u : 0u) << j;
    uint64_t v[MAX_PEERS];
    auto at = [&](uint32_t j) { return packets(a.rank, peer_rank(a, j)) + half + i; };
    ok = read_ll16_each<MAX_PEERS>(at, mask, flag, a.status, v);
#pragma unroll
    for (uint32_t j = 0; j < MAX_PEERS; ++j) {
      if (ok && (mask >> j & 1)) store_word(recv, begin[j] + i, bytes, v[j]);
    }
  }
  packet_finish(a, epoch);
}

// Two-shot with LL128 lines (medium messages between NVLink peers; packet.cuh): the two-shot
// scheme above, but 120 of every 128 bytes are payload instead of 8 of 16, so each round moves
// about half the bytes. Warps move four lines at a time. The line area of (owner, writer,
// parity) holds the scattered share in its first half and the reduced share in its second;
// the flag is the epoch + 1 (u64), and the parity alternates per epoch as for the packets.
template <typename Op, typename T>
WEAVE_DEVICE void all_reduce_two_shot_ll128(const GpuCollectiveArgs& a) {
  uint64_t epoch;
  if (!packet_epoch(a, epoch)) return;
  const uint64_t flag = epoch + 1;
  const uint32_t parity = uint32_t(epoch + 1) & 1;
  const uint64_t bytes = a.count * sizeof(T);
  const uint64_t words = (bytes + 7) / 8;
  const uint64_t half = a.ll128_lines / 2;
  const char* send = as_ptr<const char>(a.send);
  char* recv = as_ptr<char>(a.recv);
  const uint32_t warp = global_thread() / 32, warps = global_threads() / 32;
  const uint32_t group = ll128_group();
  const uint32_t j0 = ll128_payload_index(0), j1 = ll128_payload_index(1);
  // Line `line` of the half `which` (0 scattered, 1 reduced) of `owner`'s area for `writer`.
  auto line_at = [&](uint32_t owner, uint32_t writer, uint32_t which, uint64_t line) {
    return as_ptr<uint64_t>(a.lines[owner]) +
           ((uint64_t(writer) * 2 + parity) * a.ll128_lines + which * half + line) * LL128_LINE_WORDS;
  };
  auto lines_of = [](uint64_t share_words) { return (share_words + LL128_PAYLOAD_WORDS - 1) / LL128_PAYLOAD_WORDS; };
  // Payload index j of line `line` as a word of a share [b, e): its word, or none past the end.
  auto word_in = [&](uint64_t b, uint64_t e, uint64_t line, uint32_t j, uint64_t& w) {
    w = b + line * LL128_PAYLOAD_WORDS + j;
    return j < LL128_PAYLOAD_WORDS && w < e;
  };
  uint64_t mb, me_end;
  split(words, a.world, a.rank, 1, mb, me_end);
  if (lines_of((words + a.world - 1) / a.world) > half) {
    packet_refuse(a, epoch);
    return;
  }
  // 1. Scatter: share q of the input to rank q.
  for_each_peer_share(a, words, [&](uint32_t q, uint64_t b, uint64_t e) {
    for (uint64_t first = uint64_t(warp) * LL128_LINES_PER_WARP; first < lines_of(e - b);
         first += uint64_t(warps) * LL128_LINES_PER_WARP) {
      const uint64_t line = first + group;
      uint64_t w, v0 = 0, v1 = 0;
      if (word_in(b, e, line, j0, w)) v0 = load_word(send, w, bytes);
      if (word_in(b, e, line, j1, w)) v1 = load_word(send, w, bytes);
      write_ll128(line_at(q, a.rank, 0, line), line < lines_of(e - b), v0, v1, flag);
    }
  });
  // 2. Reduce the own share; keep it and send it to every rank.
  bool ok = true;
  for (uint64_t first = uint64_t(warp) * LL128_LINES_PER_WARP; ok && first < lines_of(me_end - mb);
       first += uint64_t(warps) * LL128_LINES_PER_WARP) {
    const uint64_t line = first + group;
    const bool active = line < lines_of(me_end - mb);
    uint64_t t0[MAX_PEERS], t1[MAX_PEERS];
    auto at = [&](uint32_t j) { return line_at(a.rank, peer_rank(a, j), 0, line) + 2 * ll128_part(); };
    ok = read_ll128_each<MAX_PEERS>(at, active ? every_peer(a) : 0, flag, a.status, t0, t1);
    if (!ok) break;
    uint64_t w, acc0 = 0, acc1 = 0;
    if (word_in(mb, me_end, line, j0, w)) {
      acc0 = combine_in_rank_order<Op, T>(a, load_word(send, w, bytes), t0);
      if (a.op == OP_AVG) acc0 = divide_lanes<T>(acc0, a.world);
      store_word(recv, w, bytes, acc0);
    }
    if (word_in(mb, me_end, line, j1, w)) {
      acc1 = combine_in_rank_order<Op, T>(a, load_word(send, w, bytes), t1);
      if (a.op == OP_AVG) acc1 = divide_lanes<T>(acc1, a.world);
      store_word(recv, w, bytes, acc1);
    }
    for (uint32_t k = 1; k < a.world; ++k) {
      write_ll128(line_at((a.rank + k) % a.world, a.rank, 1, line), active, acc0, acc1, flag);
    }
  }
  // 3. Gather the other reduced shares, every peer's at once (shares differ by at most a word).
  uint64_t begin[MAX_PEERS], end[MAX_PEERS];
  peer_shares(a, words, begin, end);
  const uint64_t longest = lines_of((words + a.world - 1) / a.world);
  for (uint64_t first = uint64_t(warp) * LL128_LINES_PER_WARP; ok && first < longest;
       first += uint64_t(warps) * LL128_LINES_PER_WARP) {
    const uint64_t line = first + group;
    uint32_t mask = 0;
#pragma unroll
    for (uint32_t j = 0; j < MAX_PEERS; ++j) mask |= (line < lines_of(end[j] - begin[j]) ? 1u : 0u) << j;
    uint64_t v0[MAX_PEERS], v1[MAX_PEERS];
    auto at = [&](uint32_t j) { return line_at(a.rank, peer_rank(a, j), 1, line) + 2 * ll128_part(); };
    ok = read_ll128_each<MAX_PEERS>(at, mask, flag, a.status, v0, v1);
    if (!ok) break;
#pragma unroll
    for (uint32_t j = 0; j < MAX_PEERS; ++j) {
      uint64_t w;
      if ((mask >> j & 1) && word_in(begin[j], end[j], line, j0, w)) store_word(recv, w, bytes, v0[j]);
      if ((mask >> j & 1) && word_in(begin[j], end[j], line, j1, w)) store_word(recv, w, bytes, v1[j]);
    }
  }
  packet_finish(a, epoch);
}

// Reduce to a root: every rank pushes its step portion to the root's slot; the root reduces.
template <typename Op, typename T>
WEAVE_DEVICE void reduce(const GpuCollectiveArgs& a) {
  const uint64_t epoch = *epoch_ptr(a);
  uint32_t index = 0;
  const uint64_t step = a.chunk_bytes / 2 / sizeof(T) / 16 * 16;
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  const uint32_t t = global_thread(), nt = global_threads();
  const uint32_t avg = a.op == OP_AVG ? a.world : 0;
  if (!phase(a, epoch, index)) return;
  uint32_t parity = 0;
  for (uint64_t base = 0; base < a.count; base += step, parity ^= 1) {
    const uint64_t elems = (a.count - base < step) ? a.count - base : step;
    if (a.rank != a.root) put(slot_ptr(a, a.root, parity, a.rank), send + base, elems * sizeof(T), t, nt);
    if (!phase(a, epoch, index)) return;
    if (a.rank == a.root) {
      const T* srcs[8];
      srcs[0] = send + base;
      uint32_t n = 1;
      for (uint32_t k = 1; k < a.world; ++k) {
        srcs[n++] = reinterpret_cast<const T*>(slot_ptr(a, a.rank, parity, (a.rank + k) % a.world));
      }
      reduce_to<Op, T>(recv + base, nullptr, 0, srcs, n, elems, avg, t, nt);
    }
  }
  finish(a, epoch, index, index);
}

}  // namespace coll
}  // namespace weave
