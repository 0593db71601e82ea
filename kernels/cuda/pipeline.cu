// weave block-pipelined kernels: the large-message path of all-reduce, broadcast, all-gather,
// reduce-scatter and all-to-all (appended to collectives.cu, whose helpers it uses).
//
// The message is cut into tiles. Block b of every rank takes tiles b, b + B, b + 2B, … (B =
// gridDim.x, equal on every rank) and talks only with block b of the other ranks, so blocks
// run at their own pace. There is no grid-wide barrier and no entry phase.
//
// Steps and slots. Block b counts its steps (one per tile) in this rank's control block, u64
// at 3072 + 8 b (b < 128). The counter outlives the kernel and is equal on every rank, because
// every rank runs the same blocks over the same tiles. Step s uses the slot group s mod
// PIPE_DEPTH of the block: an inbox and a results slot per writer.
//
// Flags. Three monotonic u64 per (block, kind, writer) in the owner's area, stored (release,
// system scope) by the writer and polled (acquire) by the owner:
//   INBOX_READY    the writer's data for step s is in the owner's inbox slots;
//   RESULTS_READY  the writer's data for step s is in the owner's results slots;
//   FREED          the writer (here the *reader* of its own slots) finished reading every slot
//                  of step s, so the owner of this flag may write step s + PIPE_DEPTH there.
// Before writing step s into rank q's slots a block waits until q's FREED reached
// s - PIPE_DEPTH. Every kernel frees every step it used, so the rule holds across kernels of
// every kind, and no kernel needs a barrier.
//
// Schedules. The credits let a block push tile t + 1 before its peers read tile t. The chain
// and relay broadcasts and the "overlapped" schedule of the all-reduce and one-round kernels
// use that: each pass pushes one tile and finishes earlier ones, then publishes everything the
// pass did with one post (one system-scope fence for up to three flags), so what a pass waits
// for was posted a pass earlier. Their "lockstep" schedule consumes each tile right after it
// arrived (still in L2) instead. PIPE_DEPTH = 4 leaves two passes of slack for the overlapped
// all-reduce, which frees step s at the end of the pass that pushes step s + 2.
//
// Pipe area (a.pipes[r] of every rank r):
//   [0, FLAGS)    flags: u64 at 8 * ((3 b + kind) * 8 + writer)
//   [FLAGS, ...)  slots of a.pipe_share_bytes: [block][depth][inbox, results][writer]

namespace weave {
namespace coll {

// All three come from the host program builder (collectives::gpu::program), which sizes the area.
constexpr uint32_t PIPE_MAX_BLOCKS = WEAVE_PIPE_MAX_BLOCKS;
constexpr uint32_t PIPE_DEPTH = WEAVE_PIPE_DEPTH;
constexpr uint64_t PIPE_FLAGS_BYTES = WEAVE_PIPE_FLAGS_BYTES;
constexpr uint64_t PIPE_STEPS_OFFSET = 3072;
constexpr uint32_t PIPE_FLAG_KINDS = 3;
static_assert(PIPE_STEPS_OFFSET + 8 * PIPE_MAX_BLOCKS <= PACKETS_OFFSET, "step counters overlap the packets");
static_assert(PIPE_FLAGS_BYTES >= 8 * 8 * PIPE_FLAG_KINDS * PIPE_MAX_BLOCKS, "pipe flags too small");
static_assert(PIPE_DEPTH >= 3, "the all-reduce frees a step two passes after pushing it");
constexpr uint32_t PIPE_INBOX = 0;
constexpr uint32_t PIPE_RESULTS = 1;
enum PipeFlag : uint32_t { INBOX_READY = 0, RESULTS_READY = 1, FREED = 2 };

// Flag `kind` of `writer` for block `block` in `owner`'s area.
WEAVE_DEVICE uint64_t* pipe_flag(const GpuCollectiveArgs& a, uint32_t owner, uint32_t block, uint32_t kind,
                                 uint32_t writer) {
  return as_ptr<uint64_t>(a.pipes[owner] + ((uint64_t(block) * PIPE_FLAG_KINDS + kind) * 8 + writer) * 8);
}

// Slot of `writer` for step `step` in `owner`'s pipe area (this block's slots).
WEAVE_DEVICE char* pipe_slot(const GpuCollectiveArgs& a, uint32_t owner, uint64_t step, uint32_t kind,
                             uint32_t writer) {
  const uint64_t index = ((uint64_t(blockIdx.x) * PIPE_DEPTH + step % PIPE_DEPTH) * 2 + kind) * a.world + writer;
  return as_ptr<char>(a.pipes[owner] + PIPE_FLAGS_BYTES + index * a.pipe_share_bytes);
}

// Bit r set for every rank r but this one.
WEAVE_DEVICE uint32_t pipe_peers(const GpuCollectiveArgs& a) { return ((1u << a.world) - 1) & ~(1u << a.rank); }

// One flag to publish: `value` to flag `kind` in the area of every rank in `to` (a rank mask;
// 0 publishes nothing).
struct PipeNote {
  uint32_t kind;
  uint64_t value;
  uint32_t to;
};

// Publishes up to three notes, after every thread's accesses so far: one release fence per
// receiving rank, then a relaxed store per flag.
WEAVE_DEVICE void pipe_post(const GpuCollectiveArgs& a, PipeNote n0, PipeNote n1 = {0, 0, 0},
                            PipeNote n2 = {0, 0, 0}) {
  __syncthreads();
  const uint32_t q = threadIdx.x;
  if (q < a.world && ((n0.to | n1.to | n2.to) >> q & 1)) {
    // The fence after the barrier orders the block's accesses (every thread's, ordered before
    // it by __syncthreads) before the flags: a peer that acquires a flag sees the data, and a
    // freed slot is no longer read here.
    fence_release_sys();
    if (n0.to >> q & 1) atomic_store_relaxed_sys(pipe_flag(a, q, blockIdx.x, n0.kind, a.rank), n0.value);
    if (n1.to >> q & 1) atomic_store_relaxed_sys(pipe_flag(a, q, blockIdx.x, n1.kind, a.rank), n1.value);
    if (n2.to >> q & 1) atomic_store_relaxed_sys(pipe_flag(a, q, blockIdx.x, n2.kind, a.rank), n2.value);
  }
}

// Waits until every rank in `from` posted at least `value` to this block's flag `kind` here;
// false (error recorded) when a wait gave up, and then on every thread of the block.
WEAVE_DEVICE bool pipe_await(const GpuCollectiveArgs& a, uint32_t kind, uint64_t value, uint32_t from) {
  int failed = 0;
  const uint32_t p = threadIdx.x;
  if (value > 0 && p < a.world && (from >> p & 1)) {
    const uint64_t* flag = pipe_flag(a, a.rank, blockIdx.x, kind, p);
    failed = !spin_until([&] { return atomic_load_acquire_sys(flag) >= value; }, a.status,
                         DeviceError::SemaphoreTimeout);
  }
  return __syncthreads_or(failed) == 0;
}

// Waits until every rank in `to` may receive step `step` in this block's slots: each of them
// freed step - PIPE_DEPTH.
WEAVE_DEVICE bool pipe_await_room(const GpuCollectiveArgs& a, uint64_t step, uint32_t to) {
  return pipe_await(a, FREED, step > PIPE_DEPTH ? step - PIPE_DEPTH : 0, to);
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

// False (BadArgument reported) when the grid has more blocks than the pipe area has flags for;
// the host never launches one.
WEAVE_DEVICE bool pipe_grid_fits(const GpuCollectiveArgs& a) {
  if (gridDim.x <= PIPE_MAX_BLOCKS) return true;
  if (global_thread() == 0) report_error(a.status, DeviceError::BadArgument);
  return false;
}

// This block's step counter (this rank's control block).
WEAVE_DEVICE uint64_t* pipe_steps(const GpuCollectiveArgs& a) {
  return as_ptr<uint64_t>(a.peers[a.rank] + PIPE_STEPS_OFFSET) + blockIdx.x;
}


// This block's tiles of a message cut into `tiles` tiles (tiles b, b + B, …).
WEAVE_DEVICE uint64_t pipe_block_tiles(uint64_t tiles) {
  return tiles > blockIdx.x ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
}

// The t-th tile of this block (t from 1): its first element and its length.
WEAVE_DEVICE void pipe_tile(uint64_t t, uint64_t tile, uint64_t count, uint64_t& base, uint64_t& elems) {
  base = (blockIdx.x + (t - 1) * gridDim.x) * tile;
  elems = count - base < tile ? count - base : tile;
}

// How a two-round or one-round kernel orders a block's phases over its tiles (a.aux[1]):
//   PIPE_LOCKSTEP    tile by tile: push, post, wait, then consume the tile that just arrived
//                    (while it is still in L2); the step is freed with the next tile's post.
//   PIPE_OVERLAPPED  pass t pushes tile t and consumes the earlier tiles, then posts once:
//                    what a pass waits for was posted a pass earlier, so blocks never wait on
//                    each other in step, at the cost of reading slots a pass after they arrived.
// Which one wins depends on the GPU count, so the table picks per world size
// (collectives::gpu::calls); the measurements are in docs/perf-log/gpu.md (tuning notes).
constexpr uint64_t PIPE_LOCKSTEP = 0;
constexpr uint64_t PIPE_OVERLAPPED = 1;

// A block's walk over its tiles of a message of `count` units cut into tiles of `tile`: the
// step its counter stood at (steps first + 1, …, first + mine are this kernel's) and how many
// tiles it takes.
struct PipeWalk {
  uint64_t first;
  uint64_t tile;
  uint64_t mine;
};
WEAVE_DEVICE PipeWalk pipe_walk(const GpuCollectiveArgs& a, uint64_t count, uint64_t tile) {
  return {*pipe_steps(a), tile, pipe_block_tiles((count + tile - 1) / tile)};
}

// Tile t (from 1) of a block's walk over `count` elements: its step, and the elements
// [base, base + elems) it covers (pipe_tile).
struct PipeTile {
  uint64_t step;
  uint64_t base;
  uint64_t elems;
};
WEAVE_DEVICE PipeTile pipe_walk_tile(const PipeWalk& w, uint64_t t, uint64_t count) {
  PipeTile at;
  at.step = w.first + t;
  pipe_tile(t, w.tile, count, at.base, at.elems);
  return at;
}

// Ends a block's walk: its step counter moves past the steps it used (the next kernel's start).
WEAVE_DEVICE void pipe_walk_end(const GpuCollectiveArgs& a, const PipeWalk& w) {
  if (threadIdx.x == 0) *pipe_steps(a) = w.first + w.mine;
}

// Runs the phases of a block's tiles in the schedule a.aux[1] names, for the two-round (three
// phases: push, reduce, drain) and one-round (two: push, drain) kernels. `phase(p, t)` runs
// phase p on tile t (from 1) and returns false when a wait gave up (then so does this).
// Phase 0 publishes INBOX_READY, a middle phase RESULTS_READY, and the last phase's reads are
// what FREED releases. Pass t runs phase p on tile t - p lag: lockstep (lag 0) posts after
// every phase but the last (the first with the previous tile's FREED, the last tile's FREED
// after the loop); overlapped (lag 1) posts once per pass, so what a pass waits for was
// posted a pass earlier.
template <uint32_t PHASES, typename Phase>
WEAVE_DEVICE bool pipe_schedule(const GpuCollectiveArgs& a, const PipeWalk& w, Phase phase) {
  static_assert(PHASES == 2 || PHASES == 3, "a push, at most one middle phase, a drain");
  const uint32_t peers = pipe_peers(a);
  const bool overlapped = a.aux[1] == PIPE_OVERLAPPED;
  const uint64_t lag = overlapped ? 1 : 0;
  const uint64_t first = w.first, mine = w.mine;
  for (uint64_t t = 1; t <= mine + (PHASES - 1) * lag; ++t) {
    bool ran[PHASES];
#pragma unroll
    for (uint32_t p = 0; p < PHASES; ++p) {
      ran[p] = t > p * lag && t - p * lag <= mine;
      if (ran[p] && !phase(p, t - p * lag)) return false;
      if (overlapped || p + 1 == PHASES) continue;
      if (p == 0) {
        pipe_post(a, {INBOX_READY, first + t, peers}, {FREED, first + t - 1, t >= 2 ? peers : 0});
      } else {
        pipe_post(a, {RESULTS_READY, first + t, peers});
      }
    }
    if (overlapped) {
      pipe_post(a, {INBOX_READY, first + t, ran[0] ? peers : 0},
                {RESULTS_READY, first + t - 1, PHASES == 3 && ran[1] ? peers : 0},
                {FREED, first + t - (PHASES - 1), ran[PHASES - 1] ? peers : 0});
    }
  }
  if (!overlapped && mine > 0) pipe_post(a, {FREED, first + mine, peers});
  return true;
}

// The sources of a reduction of step `step`: `own` (this rank's part), then the n - 1 other
// ranks' parts in this rank's inbox, in ring order from me + 1. Returns their count, n.
template <typename T>
WEAVE_DEVICE uint32_t pipe_inbox_sources(const GpuCollectiveArgs& a, uint32_t n, uint32_t me, uint64_t step,
                                         const T* own, const T** srcs) {
  uint32_t nsrc = 0;
  srcs[nsrc++] = own;
  for (uint32_t k = 1; k < n; ++k) {
    srcs[nsrc++] = reinterpret_cast<const T*>(pipe_slot(a, me, step, PIPE_INBOX, (me + k) % n));
  }
  return nsrc;
}

// Two-round all-reduce: every rank's tile is reduce-scattered (share q combined by rank q),
// then all-gathered. Per tile: push the shares into their owners' inboxes; reduce the own
// share (kept, and pushed into every rank's results); drain the other ranks' shares from the
// results. `count` is elements of T.
template <typename Op, typename T>
WEAVE_DEVICE void two_round(const GpuCollectiveArgs& a) {
  const uint32_t n = a.world, me = a.rank, peers = pipe_peers(a);
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  const uint32_t avg = a.op == OP_AVG ? n : 0;
  if (!pipe_grid_fits(a)) return;
  const PipeWalk walk = pipe_walk(a, a.count, pipe_share<T>(a, a.count, n) * n);
  // Tile t's shares to their owners' inboxes (after the room for its results, too).
  auto push = [&](uint64_t t) -> bool {
    const auto [step, base, elems] = pipe_walk_tile(walk, t, a.count);
    if (!pipe_await_room(a, step, peers)) return false;
    for (uint32_t k = 1; k < n; ++k) {
      const uint32_t q = (me + k) % n;
      uint64_t b, e;
      split(elems, n, q, 16, b, e);
      put(pipe_slot(a, q, step, PIPE_INBOX, me), send + base + b, (e - b) * sizeof(T), threadIdx.x, blockDim.x);
    }
    return true;
  };
  // Tile t's own share, combined, kept, and pushed into every rank's results.
  auto reduce = [&](uint64_t t) -> bool {
    const auto [step, base, elems] = pipe_walk_tile(walk, t, a.count);
    if (!pipe_await(a, INBOX_READY, step, peers)) return false;
    uint64_t b, e;
    split(elems, n, me, 16, b, e);
    const T* srcs[8];
    const uint32_t nsrc = pipe_inbox_sources(a, n, me, step, send + base + b, srcs);
    T* outs[8];
    uint32_t nout = 0;
    for (uint32_t k = 1; k < n; ++k) {
      outs[nout++] = reinterpret_cast<T*>(pipe_slot(a, (me + k) % n, step, PIPE_RESULTS, me));
    }
    reduce_to<Op, T>(recv + base + b, outs, nout, srcs, nsrc, e - b, avg, threadIdx.x, blockDim.x);
    return true;
  };
  // Tile t: every other rank's share from the own results slots.
  auto drain = [&](uint64_t t) -> bool {
    const auto [step, base, elems] = pipe_walk_tile(walk, t, a.count);
    if (!pipe_await(a, RESULTS_READY, step, peers)) return false;
    for (uint32_t k = 1; k < n; ++k) {
      const uint32_t p = (me + k) % n;
      uint64_t b, e;
      split(elems, n, p, 16, b, e);
      copy(recv + base + b, pipe_slot(a, me, step, PIPE_RESULTS, p), (e - b) * sizeof(T), threadIdx.x, blockDim.x);
    }
    return true;
  };
  auto phase = [&](uint32_t p, uint64_t t) { return p == 0 ? push(t) : p == 1 ? reduce(t) : drain(t); };
  if (pipe_schedule<3>(a, walk, phase)) pipe_walk_end(a, walk);
}

// Relay broadcast: the root scatters each tile over the other ranks (share j to relay j, the
// j-th rank after the root), and every relay forwards its share to the other relays. The root
// sends the message once and every relay receives it once, as in a chain, but in two hops
// instead of n - 1, and no rank sends more than the root. The root only pushes (as far as the
// relays' room allows); pass t of a relay forwards and keeps its share of tile t and drains
// tile t - 1 (the other relays' shares). On 2 GPUs the one relay keeps the whole tile.
// `count` is bytes.
WEAVE_DEVICE void broadcast_relay(const GpuCollectiveArgs& a) {
  const uint32_t n = a.world, me = a.rank, root = a.root;
  const uint32_t peers = pipe_peers(a);
  const uint32_t relays = n - 1;
  const uint32_t relay = (me + n - root) % n - 1;  // this rank's share (relays only)
  const uint32_t other_relays = peers & ~(1u << root);
  const char* send = as_ptr<const char>(a.send);
  char* recv = as_ptr<char>(a.recv);
  if (!pipe_grid_fits(a)) return;
  if (n == 1) {
    if (blockIdx.x == 0 && recv != send) copy(recv, send, a.count, threadIdx.x, blockDim.x);
    return;
  }
  const PipeWalk walk = pipe_walk(a, a.count, pipe_share<uint8_t>(a, a.count, relays) * relays);
  const uint64_t first = walk.first, tile = walk.tile, mine = walk.mine;
  if (me == root) {
    for (uint64_t t = 1; t <= mine; ++t) {
      const auto [step, base, elems] = pipe_walk_tile(walk, t, a.count);
      if (!pipe_await_room(a, step, peers)) return;
      for (uint32_t j = 0; j < relays; ++j) {
        uint64_t b, e;
        split(elems, relays, j, 16, b, e);
        put(pipe_slot(a, (root + 1 + j) % n, step, PIPE_INBOX, root), send + base + b, e - b, threadIdx.x,
            blockDim.x);
      }
      if (recv != send) copy(recv + base, send + base, elems, threadIdx.x, blockDim.x);
      // The root reads none of its slots: they are free as soon as it moves on.
      pipe_post(a, {INBOX_READY, step, peers}, {FREED, step, peers});
    }
  } else {
    for (uint64_t t = 1; t <= mine + 1; ++t) {
      const bool forward = t <= mine, drain = t >= 2;
      uint64_t base, elems;
      // 1. Tile t: keep the own share and forward it into the other relays' results.
      if (forward) {
        const uint64_t step = first + t;
        pipe_tile(t, tile, a.count, base, elems);
        if (!pipe_await(a, INBOX_READY, step, 1u << root)) return;
        if (!pipe_await_room(a, step, other_relays)) return;
        uint64_t b, e;
        split(elems, relays, relay, 16, b, e);
        const char* kept = pipe_slot(a, me, step, PIPE_INBOX, root);
        for (uint32_t k = 1; k < relays; ++k) {
          const uint32_t q = (root + 1 + (relay + k) % relays) % n;
          put(pipe_slot(a, q, step, PIPE_RESULTS, me), kept, e - b, threadIdx.x, blockDim.x);
        }
        copy(recv + base + b, kept, e - b, threadIdx.x, blockDim.x);
      }
      // 2. Tile t - 1: the other relays' shares.
      if (drain) {
        const uint64_t step = first + t - 1;
        pipe_tile(t - 1, tile, a.count, base, elems);
        if (!pipe_await(a, RESULTS_READY, step, other_relays)) return;
        for (uint32_t k = 1; k < relays; ++k) {
          const uint32_t j = (relay + k) % relays;
          uint64_t b, e;
          split(elems, relays, j, 16, b, e);
          copy(recv + base + b, pipe_slot(a, me, step, PIPE_RESULTS, (root + 1 + j) % n), e - b, threadIdx.x,
               blockDim.x);
        }
      }
      pipe_post(a, {RESULTS_READY, first + t, forward ? other_relays : 0}, {FREED, first + t - 1, drain ? peers : 0});
    }
  }
  pipe_walk_end(a, walk);
}

enum OneRoundKind : uint32_t { ROUND_ALL_GATHER = 0, ROUND_ALL_TO_ALL = 1, ROUND_REDUCE_SCATTER = 2 };

// One-round kernels, over `count` elements of T per (sender, receiver) block: all-gather sends
// its one block to everyone, all-to-all and reduce-scatter send block q to rank q; the
// receiver copies (or, reduce-scatter, combines with its own block). Per tile: push, then
// drain the inbox, in the order a.aux[1] says.
template <typename Op, typename T, uint32_t KIND>
WEAVE_DEVICE void one_round(const GpuCollectiveArgs& a) {
  const uint32_t n = a.world, me = a.rank, peers = pipe_peers(a);
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  const uint32_t avg = (KIND == ROUND_REDUCE_SCATTER && a.op == OP_AVG) ? n : 0;
  if (!pipe_grid_fits(a)) return;
  auto block_of = [&](uint32_t q) -> const T* {
    return KIND == ROUND_ALL_GATHER ? send : send + uint64_t(q) * a.count;
  };
  const PipeWalk walk = pipe_walk(a, a.count, pipe_share<T>(a, a.count, 1));
  // Tile t to every peer (and the own block to its place).
  auto push = [&](uint64_t t) -> bool {
    const auto [step, base, elems] = pipe_walk_tile(walk, t, a.count);
    if (!pipe_await_room(a, step, peers)) return false;
    for (uint32_t k = 1; k < n; ++k) {
      const uint32_t q = (me + k) % n;
      put(pipe_slot(a, q, step, PIPE_INBOX, me), block_of(q) + base, elems * sizeof(T), threadIdx.x, blockDim.x);
    }
    if (KIND != ROUND_REDUCE_SCATTER) {
      T* own = recv + uint64_t(me) * a.count + base;
      const T* from = block_of(me) + base;
      if (own != from) copy(own, from, elems * sizeof(T), threadIdx.x, blockDim.x);
    }
    return true;
  };
  // Tile t from the inbox.
  auto drain = [&](uint64_t t) -> bool {
    const auto [step, base, elems] = pipe_walk_tile(walk, t, a.count);
    if (!pipe_await(a, INBOX_READY, step, peers)) return false;
    if (KIND == ROUND_REDUCE_SCATTER) {
      const T* srcs[8];
      const uint32_t nsrc = pipe_inbox_sources(a, n, me, step, block_of(me) + base, srcs);
      reduce_to<Op, T>(recv + base, nullptr, 0, srcs, nsrc, elems, avg, threadIdx.x, blockDim.x);
    } else {
      for (uint32_t k = 1; k < n; ++k) {
        const uint32_t p = (me + k) % n;
        copy(recv + uint64_t(p) * a.count + base, pipe_slot(a, me, step, PIPE_INBOX, p), elems * sizeof(T),
             threadIdx.x, blockDim.x);
      }
    }
    return true;
  };
  auto phase = [&](uint32_t p, uint64_t t) { return p == 0 ? push(t) : drain(t); };
  if (pipe_schedule<2>(a, walk, phase)) pipe_walk_end(a, walk);
}

// Chain broadcast (large messages on 3 or more GPUs): root → root + 1 → … → root - 1, so every
// link carries the message once, with tiles flowing down the chain. At step s a block takes
// its tile from send (root) or from its inbox (written by its predecessor), pushes it into its
// successor's inbox (once the successor freed step s - PIPE_DEPTH) and copies it to its output;
// up to PIPE_DEPTH tiles per block are in flight on every link. `count` is bytes.
WEAVE_DEVICE void broadcast_chain(const GpuCollectiveArgs& a) {
  const uint32_t n = a.world, me = a.rank, peers = pipe_peers(a);
  const uint32_t pos = (me + n - a.root) % n;
  const uint32_t next = (me + 1) % n, prev = (me + n - 1) % n;
  const bool first_link = pos == 0, last_link = pos == n - 1;
  const char* send = as_ptr<const char>(a.send);
  char* recv = as_ptr<char>(a.recv);
  if (!pipe_grid_fits(a)) return;
  const PipeWalk walk = pipe_walk(a, a.count, pipe_share<uint8_t>(a, a.count, 1));
  const uint64_t mine = walk.mine;
  for (uint64_t t = 1; t <= mine; ++t) {
    const auto [step, base, bytes] = pipe_walk_tile(walk, t, a.count);
    if (!first_link && !pipe_await(a, INBOX_READY, step, 1u << prev)) return;
    if (!last_link && !pipe_await_room(a, step, 1u << next)) return;
    const char* from = first_link ? send + base : pipe_slot(a, me, step, PIPE_INBOX, prev);
    if (!last_link) put(pipe_slot(a, next, step, PIPE_INBOX, me), from, bytes, threadIdx.x, blockDim.x);
    if (recv + base != from) copy(recv + base, from, bytes, threadIdx.x, blockDim.x);
    pipe_post(a, {INBOX_READY, step, last_link ? 0u : 1u << next}, {FREED, step, peers});
  }
  pipe_walk_end(a, walk);
}

WEAVE_REDUCING_BODY(AllReducePipelined, two_round<Op, T>)
WEAVE_REDUCING_BODY(ReduceScatterPipelined, one_round<Op, T, ROUND_REDUCE_SCATTER>)

}  // namespace coll
}  // namespace weave


// Data movement: `count` is bytes.

// The entry points of these bodies are instantiated by the host program builder
// (`kernels/src/direct.rs`, `ENTRY_POINTS`): all of them, or only the one a launch needs.
