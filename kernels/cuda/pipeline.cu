// weave block-pipelined kernels: the large-message path of all-reduce, broadcast, all-gather,
// reduce-scatter and all-to-all (appended to collectives.cu, whose helpers it uses).
//
// The message is cut into tiles. Block b of every rank takes tiles b, b + B, b + 2B, … (B =
// gridDim.x, equal on every rank) and synchronizes only with block b of the other ranks, so
// blocks run at their own pace: while one block pushes, another reduces or drains, and the
// links carry data in both directions at once. There is no grid-wide barrier and no entry
// phase.
//
// Pipe area (at a.pipe_offset in every workspace):
//   [0, FLAGS)    flags: u64 at 8 * (8 b + w), stored (release, system scope) by block b of rank w
//   [FLAGS, ...)  slots of a.pipe_share_bytes: [block][parity][inbox, results][writer]
// Block b counts its steps (one step per tile) in this rank's control block, u64 at
// 3072 + 8 b (b < 128). The counter outlives the kernel and is equal on every rank, because every rank
// runs the same blocks over the same tiles. At step s a block signals 2s - 1 (two-round
// kernels: inbox pushed) and 2s (step done on its side), so flags only grow, across kernels
// of every kind.
//
// Chain step (broadcast on 3+ GPUs): see broadcast_chain. Relay step (broadcast): see
// broadcast_relay. Two-round step (all-reduce): push shares into the owners' inboxes, signal
// and wait 2s - 1, reduce the own share and push it into every rank's results, signal and
// wait 2s, drain the results. One-round step (all-gather, reduce-scatter, all-to-all): push,
// signal and wait 2s, drain the inbox.
//
// Slot reuse: slots of parity s & 1 are written again at step s + 2, and every write of step
// s + 2 comes after a wait (the last of step s + 1, or the first of step s + 2) that proves the
// owner finished step s, including its reads of those slots.

namespace weave {
namespace coll {

// Both come from the host program builder (collectives::gpu::program), which sizes the area.
constexpr uint32_t PIPE_MAX_BLOCKS = WEAVE_PIPE_MAX_BLOCKS;
constexpr uint64_t PIPE_FLAGS_BYTES = WEAVE_PIPE_FLAGS_BYTES;
constexpr uint64_t PIPE_STEPS_OFFSET = 3072;
static_assert(PIPE_STEPS_OFFSET + 8 * PIPE_MAX_BLOCKS <= PACKETS_OFFSET, "step counters overlap the packets");
static_assert(PIPE_FLAGS_BYTES >= 8 * 8 * PIPE_MAX_BLOCKS, "pipe flags too small");
constexpr uint32_t PIPE_INBOX = 0;
constexpr uint32_t PIPE_RESULTS = 1;

WEAVE_DEVICE uint64_t* pipe_flag(const GpuCollectiveArgs& a, uint32_t owner, uint32_t block, uint32_t writer) {
  return as_ptr<uint64_t>(a.peers[owner] + a.pipe_offset + (uint64_t(block) * 8 + writer) * 8);
}

// Slot of `writer` in `owner`'s pipe area.
WEAVE_DEVICE char* pipe_slot(const GpuCollectiveArgs& a, uint32_t owner, uint32_t parity, uint32_t kind,
                             uint32_t writer) {
  const uint64_t index = ((uint64_t(blockIdx.x) * 2 + parity) * 2 + kind) * a.world + writer;
  return as_ptr<char>(a.peers[owner] + a.pipe_offset + PIPE_FLAGS_BYTES + index * a.pipe_share_bytes);
}

// Publishes `value` to this block's flag in every peer's area, after every thread's writes.
WEAVE_DEVICE void pipe_signal(const GpuCollectiveArgs& a, uint64_t value) {
  __syncthreads();
  const uint32_t q = threadIdx.x;
  if (q < a.world && q != a.rank) {
    // Release at system scope after the barrier: the block's writes (every thread's, ordered
    // before this store by __syncthreads) are visible to a peer that acquires the flag.
    atomic_store_release_sys(pipe_flag(a, q, blockIdx.x, a.rank), value);
  }
}

// Waits until block blockIdx.x of every peer published at least `value`; false (error
// recorded) when a wait gave up, and then on every thread of the block.
WEAVE_DEVICE bool pipe_wait(const GpuCollectiveArgs& a, uint64_t value) {
  int failed = 0;
  const uint32_t p = threadIdx.x;
  if (p < a.world && p != a.rank) {
    const uint64_t* flag = pipe_flag(a, a.rank, blockIdx.x, p);
    failed = !spin_until([&] { return atomic_load_acquire_sys(flag) >= value; }, a.status,
                         DeviceError::SemaphoreTimeout);
  }
  return __syncthreads_or(failed) == 0;
}

// Elements per share of one tile: the message spread over every block in at least
// a.aux[0] steps per block (0 counts as 1: more steps let a block's rounds overlap with the
// other blocks' instead of running one after the other), but extra steps make no share smaller
// than PIPE_MIN_SHARE_BYTES; at most what a slot holds, a multiple of 16 elements (so every share
// starts 16-byte aligned in the slots).
constexpr uint64_t PIPE_MIN_SHARE_BYTES = 16 << 10;
template <typename T>
WEAVE_DEVICE uint64_t pipe_share(const GpuCollectiveArgs& a, uint64_t elems, uint32_t ways) {
  const uint64_t cap = a.pipe_share_bytes / sizeof(T) / 16 * 16;
  const uint64_t steps = a.aux[0] > 0 ? a.aux[0] : 1;
  auto spread = [&](uint64_t parts) { return ((elems + parts - 1) / parts + 15) / 16 * 16; };
  const uint64_t one_step = spread(uint64_t(ways) * gridDim.x);
  uint64_t share = spread(uint64_t(ways) * gridDim.x * steps);
  // Extra steps only down to the floor (and never more than one step's share).
  const uint64_t floor = PIPE_MIN_SHARE_BYTES / sizeof(T) < one_step ? PIPE_MIN_SHARE_BYTES / sizeof(T) : one_step;
  if (share < floor) share = floor;
  return share < cap ? share : cap;
}

// dst[i] = Op over srcs[s][i] (divided by `avg` when non-zero), also stored at outs[o][i].
// Vectorized when every pointer is 16-byte aligned; the block's threads share the work.
template <typename Op, typename T>
WEAVE_DEVICE void reduce_to(T* dst, T* const* outs, uint32_t nout, const T* const* srcs, uint32_t nsrc,
                            uint64_t elems, uint32_t avg) {
  const uint32_t thread = threadIdx.x, nthreads = blockDim.x;
  bool aligned = as_address(dst) % 16 == 0;
  for (uint32_t o = 0; o < nout; ++o) aligned = aligned && as_address(outs[o]) % 16 == 0;
  for (uint32_t s = 0; s < nsrc; ++s) aligned = aligned && as_address(srcs[s]) % 16 == 0;
  uint64_t done = 0;
  if (aligned) {
    constexpr uint64_t per = 16 / sizeof(T);
    const uint64_t units = elems / per;
    for (uint64_t u = thread; u < units; u += nthreads) {
      uint4 v[8];
#pragma unroll
      for (uint32_t s = 0; s < 8; ++s) {
        if (s < nsrc) v[s] = reinterpret_cast<const uint4*>(srcs[s])[u];
      }
      uint4 acc = v[0];
#pragma unroll
      for (uint32_t s = 1; s < 8; ++s) {
        if (s < nsrc) acc = reduce_vec16<Op, T>(acc, v[s]);
      }
      if (avg) acc = divide_vec16<T>(acc, avg);
      reinterpret_cast<uint4*>(dst)[u] = acc;
      for (uint32_t o = 0; o < nout; ++o) reinterpret_cast<uint4*>(outs[o])[u] = acc;
    }
    done = units * per;
  }
  for (uint64_t i = done + thread; i < elems; i += nthreads) {
    T acc = srcs[0][i];
    for (uint32_t s = 1; s < nsrc; ++s) acc = Op::apply(acc, srcs[s][i]);
    if (avg) acc = divide<T>(acc, avg);
    dst[i] = acc;
    for (uint32_t o = 0; o < nout; ++o) outs[o][i] = acc;
  }
}

// False (BadArgument reported, kernel finished) when the grid has more blocks than the pipe
// area has flags for; the host never launches one.
WEAVE_DEVICE bool pipe_grid_fits(const GpuCollectiveArgs& a, uint64_t epoch) {
  if (gridDim.x <= PIPE_MAX_BLOCKS) return true;
  if (global_thread() == 0) report_error(a.status, DeviceError::BadArgument);
  finish(a, epoch, 0, 1);
  return false;
}

// This block's step counter (this rank's control block).
WEAVE_DEVICE uint64_t* pipe_steps(const GpuCollectiveArgs& a) {
  return as_ptr<uint64_t>(a.peers[a.rank] + PIPE_STEPS_OFFSET) + blockIdx.x;
}

// Two-round all-reduce: every rank's tile is reduce-scattered (share q combined by rank q),
// then all-gathered. `count` is elements of T.
template <typename Op, typename T>
WEAVE_DEVICE void two_round(const GpuCollectiveArgs& a) {
  const uint64_t epoch = *epoch_ptr(a);
  const uint32_t n = a.world, me = a.rank;
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  const uint32_t avg = a.op == OP_AVG ? n : 0;
  if (!pipe_grid_fits(a, epoch)) return;
  uint64_t step = *pipe_steps(a);
  const uint64_t share = pipe_share<T>(a, a.count, n);
  const uint64_t tile = share * n;
  const uint64_t tiles = (a.count + tile - 1) / tile;
  for (uint64_t i = blockIdx.x; i < tiles; i += gridDim.x) {
    ++step;
    const uint32_t parity = uint32_t(step & 1);
    const uint64_t base = i * tile;
    const uint64_t elems = a.count - base < tile ? a.count - base : tile;
    // 1. Shares to their owners' inboxes.
    for (uint32_t k = 1; k < n; ++k) {
      const uint32_t q = (me + k) % n;
      uint64_t b, e;
      split(elems, n, q, 16, b, e);
      put(pipe_slot(a, q, parity, PIPE_INBOX, me), send + base + b, (e - b) * sizeof(T), threadIdx.x, blockDim.x);
    }
    pipe_signal(a, 2 * step - 1);
    if (!pipe_wait(a, 2 * step - 1)) return;
    // 2. The own share: combined, kept, and pushed to every rank.
    {
      uint64_t b, e;
      split(elems, n, me, 16, b, e);
      const T* srcs[8];
      uint32_t nsrc = 0;
      srcs[nsrc++] = send + base + b;
      for (uint32_t k = 1; k < n; ++k) {
        srcs[nsrc++] = reinterpret_cast<const T*>(pipe_slot(a, me, parity, PIPE_INBOX, (me + k) % n));
      }
      T* outs[8];
      uint32_t nout = 0;
      for (uint32_t k = 1; k < n; ++k) {
        outs[nout++] = reinterpret_cast<T*>(pipe_slot(a, (me + k) % n, parity, PIPE_RESULTS, me));
      }
      reduce_to<Op, T>(recv + base + b, outs, nout, srcs, nsrc, e - b, avg);
    }
    pipe_signal(a, 2 * step);
    if (!pipe_wait(a, 2 * step)) return;
    // 3. Every other rank's share from the own results slots.
    for (uint32_t k = 1; k < n; ++k) {
      const uint32_t p = (me + k) % n;
      uint64_t b, e;
      split(elems, n, p, 16, b, e);
      copy(recv + base + b, pipe_slot(a, me, parity, PIPE_RESULTS, p), (e - b) * sizeof(T), threadIdx.x, blockDim.x);
    }
  }
  if (threadIdx.x == 0) *pipe_steps(a) = step;
  finish(a, epoch, 0, 1);
}

// Relay broadcast (medium and large messages): the root scatters each tile over the other
// ranks (share j to relay j, the j-th rank after the root), and every relay forwards its share
// to the other relays. The root sends the message once and every relay receives it once, as
// in a chain, but in two hops instead of n - 1, and no rank sends more than the root. On 2
// GPUs there is nothing to forward and a step is one round (push, signal and wait 2s, drain).
// On 3+ GPUs a step is two rounds: the root pushes, everyone signals and waits 2s - 1, the
// relays forward and keep their share, everyone signals 2s, the relays wait 2s and drain. The
// root does not wait 2s: its next write (step s + 1, the other parity) already waits 2s + 1,
// which proves every relay finished step s. `count` is bytes.
WEAVE_DEVICE void broadcast_relay(const GpuCollectiveArgs& a) {
  const uint64_t epoch = *epoch_ptr(a);
  const uint32_t n = a.world, me = a.rank, root = a.root;
  const bool is_root = me == root;
  const uint32_t relays = n - 1;
  const uint32_t relay = (me + n - root) % n - 1;  // this rank's share (relays only)
  const char* send = as_ptr<const char>(a.send);
  char* recv = as_ptr<char>(a.recv);
  if (!pipe_grid_fits(a, epoch)) return;
  uint64_t step = *pipe_steps(a);
  const uint64_t tile = n > 1 ? pipe_share<uint8_t>(a, a.count, relays) * relays : a.count;
  const uint64_t tiles = n > 1 ? (a.count + tile - 1) / tile : 0;
  if (n == 1 && blockIdx.x == 0 && recv != send) copy(recv, send, a.count, threadIdx.x, blockDim.x);
  for (uint64_t i = blockIdx.x; i < tiles; i += gridDim.x) {
    ++step;
    const uint32_t parity = uint32_t(step & 1);
    const uint64_t base = i * tile;
    const uint64_t elems = a.count - base < tile ? a.count - base : tile;
    // 1. The root scatters the tile over the relays' inboxes and keeps its own copy.
    if (is_root) {
      for (uint32_t j = 0; j < relays; ++j) {
        uint64_t b, e;
        split(elems, relays, j, 16, b, e);
        put(pipe_slot(a, (root + 1 + j) % n, parity, PIPE_INBOX, root), send + base + b, e - b, threadIdx.x,
            blockDim.x);
      }
      if (recv != send) copy(recv + base, send + base, elems, threadIdx.x, blockDim.x);
    }
    if (n == 2) {
      pipe_signal(a, 2 * step);
      if (!pipe_wait(a, 2 * step)) return;
      if (!is_root) copy(recv + base, pipe_slot(a, me, parity, PIPE_INBOX, root), elems, threadIdx.x, blockDim.x);
      continue;
    }
    pipe_signal(a, 2 * step - 1);
    if (!pipe_wait(a, 2 * step - 1)) return;
    // 2. A relay keeps its share and forwards it to the other relays' results.
    if (!is_root) {
      uint64_t b, e;
      split(elems, relays, relay, 16, b, e);
      const char* mine = pipe_slot(a, me, parity, PIPE_INBOX, root);
      for (uint32_t k = 1; k < relays; ++k) {
        const uint32_t q = (root + 1 + (relay + k) % relays) % n;
        put(pipe_slot(a, q, parity, PIPE_RESULTS, me), mine, e - b, threadIdx.x, blockDim.x);
      }
      copy(recv + base + b, mine, e - b, threadIdx.x, blockDim.x);
    }
    pipe_signal(a, 2 * step);
    if (is_root) continue;
    if (!pipe_wait(a, 2 * step)) return;
    // 3. The other relays' shares from the own results slots.
    for (uint32_t k = 1; k < relays; ++k) {
      const uint32_t j = (relay + k) % relays;
      uint64_t b, e;
      split(elems, relays, j, 16, b, e);
      copy(recv + base + b, pipe_slot(a, me, parity, PIPE_RESULTS, (root + 1 + j) % n), e - b, threadIdx.x,
           blockDim.x);
    }
  }
  if (threadIdx.x == 0) *pipe_steps(a) = step;
  finish(a, epoch, 0, 1);
}

enum OneRoundKind : uint32_t { ROUND_ALL_GATHER = 0, ROUND_ALL_TO_ALL = 1, ROUND_REDUCE_SCATTER = 2 };

// One-round kernels, over `count` elements of T per (sender, receiver) block: all-gather sends
// its one block to everyone, all-to-all and reduce-scatter send block q to rank q; the
// receiver copies (or, reduce-scatter, combines with its own block).
template <typename Op, typename T, uint32_t KIND>
WEAVE_DEVICE void one_round(const GpuCollectiveArgs& a) {
  const uint64_t epoch = *epoch_ptr(a);
  const uint32_t n = a.world, me = a.rank;
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  const uint32_t avg = (KIND == ROUND_REDUCE_SCATTER && a.op == OP_AVG) ? n : 0;
  if (!pipe_grid_fits(a, epoch)) return;
  auto block_of = [&](uint32_t q) -> const T* {
    return KIND == ROUND_ALL_GATHER ? send : send + uint64_t(q) * a.count;
  };
  uint64_t step = *pipe_steps(a);
  const uint64_t tile = pipe_share<T>(a, a.count, 1);
  const uint64_t tiles = (a.count + tile - 1) / tile;
  for (uint64_t i = blockIdx.x; i < tiles; i += gridDim.x) {
    ++step;
    const uint32_t parity = uint32_t(step & 1);
    const uint64_t base = i * tile;
    const uint64_t elems = a.count - base < tile ? a.count - base : tile;
    const uint64_t bytes = elems * sizeof(T);
    for (uint32_t k = 1; k < n; ++k) {
      const uint32_t q = (me + k) % n;
      put(pipe_slot(a, q, parity, PIPE_INBOX, me), block_of(q) + base, bytes, threadIdx.x, blockDim.x);
    }
    if (KIND != ROUND_REDUCE_SCATTER) {
      T* own = recv + uint64_t(me) * a.count + base;
      const T* from = block_of(me) + base;
      if (own != from) copy(own, from, bytes, threadIdx.x, blockDim.x);
    }
    pipe_signal(a, 2 * step);
    if (!pipe_wait(a, 2 * step)) return;
    if (KIND == ROUND_REDUCE_SCATTER) {
      const T* srcs[8];
      uint32_t nsrc = 0;
      srcs[nsrc++] = block_of(me) + base;
      for (uint32_t k = 1; k < n; ++k) {
        srcs[nsrc++] = reinterpret_cast<const T*>(pipe_slot(a, me, parity, PIPE_INBOX, (me + k) % n));
      }
      reduce_to<Op, T>(recv + base, nullptr, 0, srcs, nsrc, elems, avg);
    } else {
      for (uint32_t k = 1; k < n; ++k) {
        const uint32_t p = (me + k) % n;
        copy(recv + uint64_t(p) * a.count + base, pipe_slot(a, me, parity, PIPE_INBOX, p), bytes, threadIdx.x,
             blockDim.x);
      }
    }
  }
  if (threadIdx.x == 0) *pipe_steps(a) = step;
  finish(a, epoch, 0, 1);
}

// An all-pairs step with no data: proves every peer's block finished every earlier step.
WEAVE_DEVICE bool pipe_barrier(const GpuCollectiveArgs& a, uint64_t& step) {
  ++step;
  pipe_signal(a, 2 * step);
  return pipe_wait(a, 2 * step);
}

// Chain broadcast (large messages on 3 or more GPUs): root → root + 1 → … → root - 1, so every
// link carries the message once, with tiles flowing down the chain. At step s a block takes
// its tile from send (root) or from its inbox (written by its predecessor), pushes it into its
// successor's inbox and copies it to its output. The chain uses every slot of the block's area
// as one ring of 4 × world slots (tile s in slot s mod depth), so a link has many tiles in
// flight. The predecessor's flag in this rank's area reaching 2s - 1 says tile s arrived; the
// successor's reaching 2s - 1 says it is done with the slot of tile s (so tile s + depth may
// overwrite it). A barrier step at entry and at exit keeps the slot-reuse rule of the other
// pipelined kernels across kernels. `count` is bytes.
WEAVE_DEVICE char* chain_slot(const GpuCollectiveArgs& a, uint32_t owner, uint64_t step) {
  return pipe_slot(a, owner, uint32_t(step & 1), uint32_t((step >> 1) & 1), uint32_t((step >> 2) % a.world));
}

WEAVE_DEVICE void broadcast_chain(const GpuCollectiveArgs& a) {
  const uint64_t epoch = *epoch_ptr(a);
  const uint32_t n = a.world, me = a.rank;
  const uint32_t pos = (me + n - a.root) % n;
  const uint32_t next = (me + 1) % n, prev = (me + n - 1) % n;
  const bool first_link = pos == 0, last_link = pos == n - 1;
  const uint64_t depth = 4 * uint64_t(n);
  const char* send = as_ptr<const char>(a.send);
  char* recv = as_ptr<char>(a.recv);
  if (!pipe_grid_fits(a, epoch)) return;
  uint64_t step = *pipe_steps(a);
  const uint64_t tile = pipe_share<uint8_t>(a, a.count, 1);
  const uint64_t tiles = (a.count + tile - 1) / tile;
  if (blockIdx.x < tiles) {
    if (!pipe_barrier(a, step)) return;
    const uint64_t first = step + 1;
    for (uint64_t i = blockIdx.x; i < tiles; i += gridDim.x) {
      ++step;
      const uint64_t base = i * tile;
      const uint64_t bytes = a.count - base < tile ? a.count - base : tile;
      int failed = 0;
      if (threadIdx.x == 0 && !first_link) {
        const uint64_t* arrived = pipe_flag(a, me, blockIdx.x, prev);
        failed = !spin_until([&] { return atomic_load_acquire_sys(arrived) >= 2 * step - 1; }, a.status,
                             DeviceError::SemaphoreTimeout);
      }
      if (threadIdx.x == 1 && !last_link && step >= first + depth) {
        const uint64_t* drained = pipe_flag(a, me, blockIdx.x, next);
        failed = !spin_until([&] { return atomic_load_acquire_sys(drained) >= 2 * (step - depth) - 1; }, a.status,
                             DeviceError::SemaphoreTimeout);
      }
      if (__syncthreads_or(failed)) return;
      const char* from = first_link ? send + base : chain_slot(a, me, step);
      if (!last_link) put(chain_slot(a, next, step), from, bytes, threadIdx.x, blockDim.x);
      if (recv + base != from) copy(recv + base, from, bytes, threadIdx.x, blockDim.x);
      __syncthreads();
      if (threadIdx.x == 0 && !last_link) {
        atomic_store_release_sys(pipe_flag(a, next, blockIdx.x, me), 2 * step - 1);
      }
      if (threadIdx.x == 1 && !first_link) {
        atomic_store_release_sys(pipe_flag(a, prev, blockIdx.x, me), 2 * step - 1);
      }
    }
    if (!pipe_barrier(a, step)) return;
  }
  if (threadIdx.x == 0) *pipe_steps(a) = step;
  finish(a, epoch, 0, 1);
}

template <typename Op, typename T>
struct AllReducePipelined {
  WEAVE_DEVICE static void run(const GpuCollectiveArgs& a) { two_round<Op, T>(a); }
};
template <typename Op, typename T>
struct ReduceScatterPipelined {
  WEAVE_DEVICE static void run(const GpuCollectiveArgs& a) { one_round<Op, T, ROUND_REDUCE_SCATTER>(a); }
};

}  // namespace coll
}  // namespace weave

WEAVE_FOR_EACH_REDUCING_TYPE(all_reduce_pipelined, AllReducePipelined)
WEAVE_FOR_EACH_REDUCING_TYPE(reduce_scatter_pipelined, ReduceScatterPipelined)

// Data movement: `count` is bytes.
WEAVE_KERNEL(weave_broadcast_chain, weave::coll::broadcast_chain)
WEAVE_KERNEL(weave_broadcast_pipelined, weave::coll::broadcast_relay)
WEAVE_KERNEL(weave_all_gather_pipelined, weave::coll::one_round<weave::Sum, weave::uint8_t, weave::coll::ROUND_ALL_GATHER>)
WEAVE_KERNEL(weave_all_to_all_pipelined, weave::coll::one_round<weave::Sum, weave::uint8_t, weave::coll::ROUND_ALL_TO_ALL>)
