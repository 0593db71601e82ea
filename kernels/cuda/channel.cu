// weave channel kernels: the channel family on device buffers. Over a link whose peer region is
// not mapped here (a network transport), in the port-channel model: the kernel never touches a
// peer's memory: it stages each message in its own outbox, pushes a trigger into the proxy's
// FIFO, and the proxy's connection copies the message into the peer's region and then signals
// the peer's `ready` token (the connection orders the signal after the copy). The receiving
// kernel waits on that token in its own device memory, uses the message in place, and hands the
// slot back by pushing a signal-only trigger that raises the sender's `freed` token. So the same
// kernel runs over any connection that can write device memory.
//
// Over a link whose peer region is mapped into this GPU (CUDA IPC: ChannelLink::peer_region is
// its address here), in the memory-channel model: the kernel stages each message straight into
// the peer's slot and raises the peer's `ready` itself (release, system scope), and hands a slot
// back by raising the peer's `freed` itself; no proxy and no CUDA stream takes part. That
// matters beyond speed: the proxy's copies run on CUDA streams, and the GPU serves a process's
// streams through a few hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default), so a copy
// can queue behind work the caller put on its stream after the collective — which waits for the
// collective, which waits for the copy.
//
// One link per peer pair (ChannelLink, built by the host on first use), each side owning one
// region the other side writes into:
//
//   [0]       ready: messages the peer posted into this region (monotonic u64)
//   [64]      freed: messages of this rank the peer has consumed (monotonic u64)
//   [4096 +   slot i of `slots`: a 64-byte header (call, signature, count, length), then up to
//    i * slot_bytes]  slot_bytes - 64 bytes of payload
//
// Message m (counted from 0) travels in slot m % slots. The outbox has the same layout, and its
// slot of message m is reused by message m + slots, which is posted only after the peer freed
// m — so the copy of m has finished by then. The counters `posted` and `consumed` live in the
// link table in device memory, so consecutive launches and CUDA-graph replays stay in step.
//
// The algorithms are those of the host channel executor (collectives/src/channel): ring
// all-reduce, all-gather and reduce-scatter (rounds of at most slots - 1 messages per share,
// so the ring cannot deadlock), chain broadcast and reduce, and one-hop lockstep exchanges
// (direct) for every collective, all-to-all(v) and send/receive; and the logarithmic ones for
// large worlds (recursive doubling and halving, Bruck, binomial trees), in channel_log.cu; then
// channel_run.cu dispatches each call to its algorithm and defines the entry points. Every
// program is these three files in that order. A launch is one block: thread 0 waits and pushes,
// every thread copies and reduces.
//
// Every message carries the call's number, signature and count; a receiver that finds others
// than its own reports CallMismatch. Every wait is bounded (DeviceStatusHandle).

namespace weave {

// The collective codes (enum ChannelCollective: CHANNEL_ALL_REDUCE, CHANNEL_ALL_GATHER,
// CHANNEL_REDUCE_SCATTER, CHANNEL_BROADCAST, CHANNEL_REDUCE, CHANNEL_ALL_TO_ALL,
// CHANNEL_ALL_TO_ALLV, CHANNEL_SEND_RECV), the algorithm codes (enum ChannelAlgorithm:
// CHANNEL_RING, CHANNEL_DIRECT, CHANNEL_DOUBLING, CHANNEL_HALVING, CHANNEL_BRUCK, CHANNEL_TREE)
// and CHANNEL_NO_PEER, the rank number that names no peer
// (send/receive without one side), are declared in front of this file from their Rust
// definitions (kernels::channel::code_declarations).

// A rank number that names every peer (direct exchanges).
constexpr uint32_t CHANNEL_ALL_PEERS = 0xfffffffeu;

// Most sources a direct reduction combines (this rank and every peer).
constexpr uint32_t CHANNEL_MAX_DIRECT_SOURCES = 64;

// The argument block (kernels::channel::ChannelArgs).
struct ChannelArgs {
  uint64_t send;       // local input (device address)
  uint64_t recv;       // local output
  uint64_t count;      // elements (reducing kernels) or bytes (the byte kernel)
  uint64_t aux[4];     // all-to-all-v: device arrays of u64 elements per rank (send counts,
                       // send displacements, recv counts, recv displacements); send/receive:
                       // aux[0] = bytes to receive, aux[1] = the call number the message
                       // received must carry (the receive's pair stamp)
  uint64_t links;      // device address of ChannelLink[world]
  uint64_t scratch;    // the logarithmic algorithms' work buffer (device address; sized per call)
  uint64_t call;       // this call's number (send/receive: the send's pair stamp)
  uint64_t signature;  // what every rank must agree on (collective, algorithm, dtype, op, root)
  uint64_t agreed;     // the count every rank must agree on
  FifoDeviceHandle fifo;
  DeviceStatusHandle status;
  uint32_t rank;
  uint32_t world;
  uint32_t root;        // broadcast, reduce; send/receive: the rank to send to
  uint32_t op;          // reduce operator (weave::Op)
  uint32_t collective;  // ChannelCollective
  uint32_t algorithm;   // ChannelAlgorithm
  uint32_t from;        // send/receive: the rank to receive from
  uint32_t elem_size;   // bytes of one element (all-to-all-v counts are elements)
};

// One side of a link as kernels see it (kernels::channel::ChannelLink).
struct ChannelLink {
  uint64_t inbox;             // this rank's region of the link (the peer writes into it)
  uint64_t outbox;            // this rank's private staging region (same layout)
  uint64_t posted;            // messages posted to the peer so far
  uint64_t consumed;          // messages of the peer consumed so far
  uint32_t data_semaphore;    // proxy semaphore raising `ready` in the peer's region
  uint32_t credit_semaphore;  // proxy semaphore raising `freed` in the peer's region
  uint32_t outbox_memory;     // proxy memory id of the outbox
  uint32_t peer_memory;       // proxy memory id of the peer's region
  uint32_t slots;             // slots per direction
  uint32_t slot_bytes;        // header + payload bytes of one slot (a multiple of 64)
  uint32_t peer;              // the peer's rank
  uint32_t built;             // 1 once the host built the link
  uint64_t peer_region;       // the peer's region as mapped into this GPU; 0: through the proxy
};

// The link steps and algorithms below are real calls, not inlined into every call site (as the
// shared headers' WEAVE_DEVICE helpers are): each is a few instructions around a bounded wait
// or a block-wide loop, and one copy of each keeps the compile of a channel program short.
#define WEAVE_CHANNEL_STEP __device__ __noinline__

namespace chan {

constexpr uint64_t READY = 0;
constexpr uint64_t FREED = 64;
constexpr uint64_t SLOTS_OFFSET = 4096;
constexpr uint64_t HEADER_BYTES = 64;

// What thread 0 tells the block after a wait: where the message is, and whether to go on.
struct Shared {
  char* at;
  uint32_t ok;
  const void* sources[CHANNEL_MAX_DIRECT_SOURCES];
};

WEAVE_DEVICE uint64_t slot_offset(const ChannelLink& l, uint64_t message) {
  return SLOTS_OFFSET + (message % l.slots) * l.slot_bytes;
}

WEAVE_DEVICE uint64_t payload_bytes(const ChannelLink& l) { return l.slot_bytes - HEADER_BYTES; }

// The link to `peer`, or null (BadArgument reported) when the host did not build it.
WEAVE_DEVICE ChannelLink* link_to(const ChannelArgs& a, uint32_t peer) {
  ChannelLink* l = peer < a.world ? as_ptr<ChannelLink>(a.links) + peer : nullptr;
  if (l == nullptr || l->built != 1 || l->peer != peer || l->slots == 0) {
    report_error(a.status, DeviceError::BadArgument);
    return nullptr;
  }
  return l;
}

// Block-wide: waits until the next message to `peer` may be staged (the peer freed the slot's
// previous message); returns where its payload goes, or null when the block must stop.
WEAVE_CHANNEL_STEP char* outbox(const ChannelArgs& a, uint32_t peer, Shared* sh) {
  __syncthreads();
  if (threadIdx.x == 0) {
    ChannelLink* l = link_to(a, peer);
    bool ok = l != nullptr;
    if (ok) {
      const uint64_t posted = l->posted;
      const uint64_t need = posted + 1 > l->slots ? posted + 1 - l->slots : 0;
      const uint64_t* freed = as_ptr<const uint64_t>(l->inbox + FREED);
      ok = spin_until([&] { return atomic_load_acquire_sys(freed) >= need; }, a.status,
                      DeviceError::SemaphoreTimeout);
      // Memory channel: straight into the peer's slot (freed above, so the peer is done with it).
      const uint64_t staging = l->peer_region != 0 ? l->peer_region : l->outbox;
      sh->at = as_ptr<char>(staging + slot_offset(*l, posted) + HEADER_BYTES);
    }
    sh->ok = ok;
  }
  __syncthreads();
  return sh->ok ? sh->at : nullptr;
}

// Block-wide: posts the `bytes`-byte message staged where outbox() said (the outbox, or the
// peer's slot over a memory channel).
WEAVE_CHANNEL_STEP bool post(const ChannelArgs& a, uint32_t peer, uint64_t bytes, Shared* sh) {
  __syncthreads();
  if (threadIdx.x == 0) {
    ChannelLink* l = link_to(a, peer);
    bool ok = l != nullptr && bytes <= payload_bytes(*l);
    if (l != nullptr && !ok) report_error(a.status, DeviceError::BadArgument);
    if (ok) {
      const uint64_t offset = slot_offset(*l, l->posted);
      const bool direct = l->peer_region != 0;
      uint64_t* header = as_ptr<uint64_t>((direct ? l->peer_region : l->outbox) + offset);
      header[0] = a.call;
      header[1] = a.signature;
      header[2] = a.agreed;
      header[3] = bytes;
      // The block's stores into the outbox or the peer's slot (ordered before this thread by the
      // barrier) become visible to the copy engine the proxy starts once it sees the trigger,
      // or to the peer once it sees `ready` raised.
      __threadfence_system();
      if (direct) {
        l->posted += 1;
        atomic_store_release_sys(as_ptr<uint64_t>(l->peer_region + READY), l->posted);
      } else {
        Trigger t;
        const TriggerFields f{TriggerType::Data | TriggerType::Flag, HEADER_BYTES + bytes, l->outbox_memory, offset,
                              l->peer_memory,                         offset,               l->data_semaphore};
        ok = make_trigger(f, a.status, &t) && push(a.fifo, t, a.status);
        if (ok) l->posted += 1;
      }
    }
    sh->ok = ok;
  }
  __syncthreads();
  return sh->ok != 0;
}

// Block-wide: waits for `peer`'s next message, checks that it belongs to this call and is
// `bytes` long, and returns its payload (valid until release()), or null when the block must
// stop.
WEAVE_CHANNEL_STEP const char* receive(const ChannelArgs& a, uint32_t peer, uint64_t bytes, Shared* sh) {
  __syncthreads();
  if (threadIdx.x == 0) {
    ChannelLink* l = link_to(a, peer);
    bool ok = l != nullptr;
    if (ok) {
      const uint64_t target = l->consumed + 1;
      const uint64_t* ready = as_ptr<const uint64_t>(l->inbox + READY);
      ok = spin_until([&] { return atomic_load_acquire_sys(ready) >= target; }, a.status,
                      DeviceError::SemaphoreTimeout);
    }
    if (ok) {
      const uint64_t offset = slot_offset(*l, l->consumed);
      const uint64_t* header = as_ptr<const uint64_t>(l->inbox + offset);
      // A send/receive's messages carry the sender's pair stamp with this rank, which must be
      // the one this receive expects (collectives/src/matching.rs).
      const uint64_t call = a.collective == CHANNEL_SEND_RECV ? a.aux[1] : a.call;
      if (header[0] != call || header[1] != a.signature || header[2] != a.agreed || header[3] != bytes) {
        report_error(a.status, DeviceError::CallMismatch);
        ok = false;
      }
      sh->at = as_ptr<char>(l->inbox + offset + HEADER_BYTES);
    }
    sh->ok = ok;
  }
  __syncthreads();
  return sh->ok ? sh->at : nullptr;
}

// Block-wide: hands the slot of `peer`'s message last received back to the peer.
WEAVE_CHANNEL_STEP bool release(const ChannelArgs& a, uint32_t peer, Shared* sh) {
  __syncthreads();
  if (threadIdx.x == 0) {
    ChannelLink* l = link_to(a, peer);
    bool ok = l != nullptr;
    if (ok && l->peer_region != 0) {
      // Memory channel: the block's reads of the slot are ordered before this release store.
      l->consumed += 1;
      atomic_store_release_sys(as_ptr<uint64_t>(l->peer_region + FREED), l->consumed);
    } else if (ok) {
      Trigger t;
      const TriggerFields f{TriggerType::Flag, 0, 0, 0, 0, 0, l->credit_semaphore};
      ok = make_trigger(f, a.status, &t) && push(a.fifo, t, a.status);
      if (ok) l->consumed += 1;
    }
    sh->ok = ok;
  }
  __syncthreads();
  return sh->ok != 0;
}

// Block-wide: stages `bytes` bytes at `src` and posts them to `peer`.
WEAVE_CHANNEL_STEP bool send_bytes(const ChannelArgs& a, uint32_t peer, const void* src, uint64_t bytes, Shared* sh) {
  char* out = outbox(a, peer, sh);
  if (out == nullptr) return false;
  copy(out, src, bytes, threadIdx.x, blockDim.x);
  return post(a, peer, bytes, sh);
}

// The payload bytes every link of this launch carries per message (all links are alike).
WEAVE_DEVICE uint64_t message_bytes(const ChannelArgs& a, uint32_t any_peer) {
  const ChannelLink* l = as_ptr<const ChannelLink>(a.links) + any_peer;
  return payload_bytes(*l);
}

// Messages a block of `elems` elements takes at `chunk` elements a message (at least one, so
// every receiver hears from every sender even for an empty block).
WEAVE_DEVICE uint64_t pieces(uint64_t elems, uint64_t chunk) {
  const uint64_t p = (elems + chunk - 1) / chunk;
  return p == 0 ? 1 : p;
}

// Message c of a block of `elems` elements: *first and *len, false past the last message.
WEAVE_DEVICE bool piece(uint64_t c, uint64_t elems, uint64_t chunk, uint64_t* first, uint64_t* len) {
  if (c >= pieces(elems, chunk)) return false;
  const uint64_t at = c * chunk < elems ? c * chunk : elems;
  *first = at;
  *len = elems - at < chunk ? elems - at : chunk;
  return true;
}

// Block-wide: dst[i] = Op over srcs[0..nsrc)[i] in order (divided by `avg` when non-zero), also
// stored at out[i] when out is not null; any number of sources (folded REDUCE_MAX_SOURCES at a
// time, left to right, so every rank combining the same sources gets the same bits). dst may be
// the first source: each thread reads and writes only its own elements.
template <typename Op, typename T>
WEAVE_CHANNEL_STEP void combine(T* dst, T* out, const T* const* srcs, uint32_t nsrc, uint64_t elems, uint32_t avg) {
  T* outs[1] = {out};
  const uint32_t nout = out != nullptr ? 1 : 0;
  if (nsrc <= REDUCE_MAX_SOURCES) {
    reduce_to<Op, T>(dst, outs, nout, srcs, nsrc, elems, avg, threadIdx.x, blockDim.x);
    return;
  }
  reduce_to<Op, T>(dst, nullptr, 0, srcs, REDUCE_MAX_SOURCES, elems, 0, threadIdx.x, blockDim.x);
  for (uint32_t first = REDUCE_MAX_SOURCES; first < nsrc; first += REDUCE_MAX_SOURCES - 1) {
    const T* group[REDUCE_MAX_SOURCES];
    group[0] = dst;
    uint32_t n = 1;
    for (uint32_t s = first; s < nsrc && n < REDUCE_MAX_SOURCES; ++s) group[n++] = srcs[s];
    const bool last = first + (REDUCE_MAX_SOURCES - 1) >= nsrc;
    reduce_to<Op, T>(dst, outs, last ? nout : 0, group, n, elems, last ? avg : 0, threadIdx.x, blockDim.x);
  }
}

// Block-wide copy of `bytes` bytes (ranges identical or disjoint; identical moves nothing).
WEAVE_CHANNEL_STEP void move(void* dst, const void* src, uint64_t bytes) {
  if (dst != src) copy(dst, src, bytes, threadIdx.x, blockDim.x);
}

// ---- ring ------------------------------------------------------------------------------------

enum RingKind : uint32_t { RING_ALL_REDUCE, RING_REDUCE_SCATTER, RING_ALL_GATHER };

// One ring collective (see collectives/src/channel/ring.rs, whose step formula this follows):
// step t sends share (r - t + shift) mod n to the right and receives share (r - t - 1 + shift)
// mod n from the left; all-reduce splits the buffer into n shares, the others move blocks of
// `count` elements.
template <typename Op, typename T>
WEAVE_CHANNEL_STEP void ring(const ChannelArgs& a, RingKind kind, Shared* sh) {
  const uint32_t n = a.world, me = a.rank;
  const uint32_t left = (me + n - 1) % n, right = (me + 1) % n;
  const uint64_t count = a.count;
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  if (n == 1) {
    move(recv, send, count * sizeof(T));
    return;
  }
  const ChannelLink* any = as_ptr<const ChannelLink>(a.links) + right;
  const uint64_t chunk = message_bytes(a, right) / sizeof(T);
  const uint64_t per_share = (any->slots - 1) * chunk;
  const uint32_t avg = a.op == OP_AVG ? n : 0;
  uint64_t share_total;
  uint32_t steps_rs, steps_ag;
  if (kind == RING_ALL_REDUCE) {
    share_total = (count + n - 1) / n;
    steps_rs = n - 1;
    steps_ag = n - 1;
  } else if (kind == RING_REDUCE_SCATTER) {
    share_total = count;
    steps_rs = n - 1;
    steps_ag = 0;
  } else {
    share_total = count;
    steps_rs = 0;
    steps_ag = n - 1;
  }
  const uint64_t rounds = share_total == 0 ? 1 : (share_total + per_share - 1) / per_share;
  const uint32_t shift = kind == RING_REDUCE_SCATTER ? n - 1 : 0;
  const uint32_t total = steps_rs + steps_ag;
  // Share s's elements [lo, hi) of this round, and where its block starts in recv.
  auto range = [&](uint32_t s, uint64_t round, uint64_t* lo, uint64_t* hi, uint64_t* base) {
    if (kind == RING_ALL_REDUCE) {
      const uint64_t q = count / n, rem = count % n;
      const uint64_t a0 = s * q + (s < rem ? s : rem);
      const uint64_t b0 = a0 + q + (s < rem ? 1 : 0);
      *lo = a0 + round * per_share < b0 ? a0 + round * per_share : b0;
      *hi = *lo + per_share < b0 ? *lo + per_share : b0;
      *base = 0;
    } else {
      *lo = round * per_share < count ? round * per_share : count;
      *hi = *lo + per_share < count ? *lo + per_share : count;
      *base = uint64_t(s) * count;
    }
  };
  auto input = [&](uint32_t s, uint64_t at) -> const T* {
    return kind == RING_REDUCE_SCATTER ? send + uint64_t(s) * count + at : send + at;
  };
  for (uint64_t round = 0; round < rounds; ++round) {
    if (kind == RING_ALL_GATHER) {
      uint64_t lo, hi, base;
      range(me, round, &lo, &hi, &base);
      move(recv + base + lo, send + lo, (hi - lo) * sizeof(T));
    }
    for (uint32_t t = 0; t <= total; ++t) {
      const uint32_t s = (me + n + shift - t % n) % n;
      uint64_t lo, hi, base;
      range(s, round, &lo, &hi, &base);
      const uint64_t msgs = pieces(hi - lo, chunk);
      for (uint64_t c = 0; c < msgs; ++c) {
        uint64_t at, k;
        piece(c, hi - lo, chunk, &at, &k);
        at += lo;
        if (t == 0) {
          // Step 0: this rank's own input of its first share.
          if (!send_bytes(a, right, input(s, at), k * sizeof(T), sh)) return;
          continue;
        }
        const T* inbox = reinterpret_cast<const T*>(receive(a, left, k * sizeof(T), sh));
        if (inbox == nullptr) return;
        const bool forward = t < total;
        T* out = nullptr;
        if (forward) {
          out = reinterpret_cast<T*>(outbox(a, right, sh));
          if (out == nullptr) return;
        }
        if (t <= steps_rs) {
          const T* srcs[2] = {inbox, input(s, at)};
          if (t == steps_rs) {
            // The share is complete here: the final value (divided for averages).
            T* dst = kind == RING_REDUCE_SCATTER ? recv + at : recv + base + at;
            combine<Op, T>(dst, out, srcs, 2, k, avg);
          } else {
            combine<Op, T>(out, nullptr, srcs, 2, k, 0);
          }
        } else {
          // All-gather half: keep the finished share and pass it on.
          move(recv + base + at, inbox, k * sizeof(T));
          if (forward) move(out, inbox, k * sizeof(T));
        }
        if (!release(a, left, sh)) return;
        if (forward && !post(a, right, k * sizeof(T), sh)) return;
      }
    }
  }
}

// A chain from `prev` to `next` (CHANNEL_NO_PEER at the ends), pipelined by messages:
// broadcast unless REDUCING (copy and pass on), reduce towards the root otherwise (combine with
// this rank's input and pass on; the root, with no `next`, writes the result).
template <typename Op, typename T, bool REDUCING>
WEAVE_CHANNEL_STEP void chain(const ChannelArgs& a, uint32_t prev, uint32_t next, Shared* sh) {
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  const uint64_t count = a.count;
  const uint32_t any = prev != CHANNEL_NO_PEER ? prev : next;
  if (any == CHANNEL_NO_PEER) {
    move(recv, send, count * sizeof(T));
    return;
  }
  const uint64_t chunk = message_bytes(a, any) / sizeof(T);
  const uint32_t avg = a.op == OP_AVG ? a.world : 0;
  for (uint64_t c = 0; c < pieces(count, chunk); ++c) {
    uint64_t at, k;
    piece(c, count, chunk, &at, &k);
    if (prev == CHANNEL_NO_PEER) {
      // The head of the chain: its own data only.
      if (!send_bytes(a, next, send + at, k * sizeof(T), sh)) return;
      if (!REDUCING) move(recv + at, send + at, k * sizeof(T));
      continue;
    }
    const T* inbox = reinterpret_cast<const T*>(receive(a, prev, k * sizeof(T), sh));
    if (inbox == nullptr) return;
    T* out = nullptr;
    if (next != CHANNEL_NO_PEER) {
      out = reinterpret_cast<T*>(outbox(a, next, sh));
      if (out == nullptr) return;
    }
    if (!REDUCING) {
      move(recv + at, inbox, k * sizeof(T));
      if (out != nullptr) move(out, inbox, k * sizeof(T));
    } else {
      const T* srcs[2] = {inbox, send + at};
      if (out != nullptr) {
        combine<Op, T>(out, nullptr, srcs, 2, k, 0);
      } else {
        combine<Op, T>(recv + at, nullptr, srcs, 2, k, avg);
      }
    }
    if (!release(a, prev, sh)) return;
    if (out != nullptr && !post(a, next, k * sizeof(T), sh)) return;
  }
}

// The chain from the root around the ring: the rank before this one (CHANNEL_NO_PEER at the
// root) and the rank after it (CHANNEL_NO_PEER at the end). Broadcast flows along it, reduce
// against it.
WEAVE_DEVICE uint32_t chain_before(const ChannelArgs& a) {
  return (a.rank + a.world - a.root) % a.world > 0 ? (a.rank + a.world - 1) % a.world : CHANNEL_NO_PEER;
}
WEAVE_DEVICE uint32_t chain_after(const ChannelArgs& a) {
  return (a.rank + a.world - a.root) % a.world + 1 < a.world ? (a.rank + 1) % a.world : CHANNEL_NO_PEER;
}

// ---- direct ----------------------------------------------------------------------------------

// Which blocks a direct exchange moves (see collectives/src/channel/direct.rs).
enum DirectBlocks : uint32_t {
  WHOLE,        // the whole buffer (count elements) to or from every peer
  BLOCK_OF,     // block q (q * count) of the send buffer goes to q; block p of recv from p
  OWN_BLOCK,    // receive: every peer's block for this rank lands at recv (count elements)
  VARIABLE,     // all-to-all-v: counts and displacements from the aux arrays
};

// (offset, elements) of the block exchanged with `peer`: `sending` picks the send side.
WEAVE_DEVICE void block_of(const ChannelArgs& a, DirectBlocks b, uint32_t peer, bool sending, uint64_t* off,
                           uint64_t* elems) {
  switch (b) {
    case WHOLE:
    case OWN_BLOCK:
      *off = 0;
      *elems = a.count;
      break;
    case BLOCK_OF:
      *off = uint64_t(peer) * a.count;
      *elems = a.count;
      break;
    case VARIABLE: {
      const uint64_t* counts = as_ptr<const uint64_t>(sending ? a.aux[0] : a.aux[2]);
      const uint64_t* displs = as_ptr<const uint64_t>(sending ? a.aux[1] : a.aux[3]);
      *off = displs[peer] * a.elem_size;
      *elems = counts[peer] * a.elem_size;
      break;
    }
  }
}

// The lockstep exchange: message c to every peer this rank sends to, then message c from every
// peer it receives from, until every block is through. `to` and `from` are a rank,
// CHANNEL_ALL_PEERS or CHANNEL_NO_PEER. With REDUCING, message c of every peer and this
// rank's own input (`own` elements in) are combined in rank order into recv (REDUCING); else
// each message is copied to its place.
template <typename Op, typename T, bool REDUCING>
WEAVE_CHANNEL_STEP void exchange(const ChannelArgs& a, DirectBlocks out_blocks, DirectBlocks in_blocks, uint32_t to,
                           uint32_t from, uint64_t own, Shared* sh) {
  const uint32_t n = a.world, me = a.rank;
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  const uint32_t tid = threadIdx.x;
  const uint32_t named = to < n ? to : from;
  const uint32_t any = named < n ? named : (me + 1) % n;
  const uint64_t chunk = message_bytes(a, any) / sizeof(T);
  const uint32_t avg = a.op == OP_AVG ? n : 0;
  auto sends_to = [&](uint32_t q) { return q != me && (to == CHANNEL_ALL_PEERS || q == to); };
  auto takes_from = [&](uint32_t p) { return p != me && (from == CHANNEL_ALL_PEERS || p == from); };
  uint64_t rounds = 0;
  for (uint32_t p = 0; p < n; ++p) {
    uint64_t off, elems;
    if (sends_to(p)) {
      block_of(a, out_blocks, p, true, &off, &elems);
      const uint64_t m = pieces(elems, chunk);
      rounds = m > rounds ? m : rounds;
    }
    if (takes_from(p)) {
      block_of(a, in_blocks, p, false, &off, &elems);
      const uint64_t m = pieces(elems, chunk);
      rounds = m > rounds ? m : rounds;
    }
  }
  if (REDUCING && n > CHANNEL_MAX_DIRECT_SOURCES) {
    if (tid == 0) report_error(a.status, DeviceError::BadArgument);
    return;
  }
  for (uint64_t c = 0; c < rounds; ++c) {
    for (uint32_t j = 1; j < n; ++j) {
      const uint32_t q = (me + j) % n;
      uint64_t off, elems, at, k;
      if (!sends_to(q)) continue;
      block_of(a, out_blocks, q, true, &off, &elems);
      if (!piece(c, elems, chunk, &at, &k)) continue;
      if (!send_bytes(a, q, send + off + at, k * sizeof(T), sh)) return;
    }
    uint64_t reduce_at = 0, reduce_k = 0;
    bool any_taken = false;
    for (uint32_t p = 0; p < n; ++p) {
      uint64_t off, elems, at, k;
      if (!takes_from(p)) continue;
      block_of(a, in_blocks, p, false, &off, &elems);
      if (!piece(c, elems, chunk, &at, &k)) continue;
      const T* inbox = reinterpret_cast<const T*>(receive(a, p, k * sizeof(T), sh));
      if (inbox == nullptr) return;
      if (!REDUCING) {
        move(recv + off + at, inbox, k * sizeof(T));
        if (!release(a, p, sh)) return;
      } else {
        if (tid == 0) sh->sources[p] = inbox;
        reduce_at = off + at;
        reduce_k = k;
        any_taken = true;
      }
    }
    if (REDUCING && any_taken) {
      if (tid == 0) sh->sources[me] = send + own + reduce_at;
      __syncthreads();
      combine<Op, T>(recv + reduce_at, nullptr, reinterpret_cast<const T* const*>(sh->sources), n, reduce_k, avg);
      for (uint32_t p = 0; p < n; ++p) {
        if (takes_from(p) && !release(a, p, sh)) return;
      }
    }
  }
}

}  // namespace chan
}  // namespace weave
