// weave data-movement and point-to-point kernels — all-to-all-v and device send/recv — and the
// entry points of every kernel defined so far (appended to collectives.cu, whose helpers —
// epochs, grid phases, peers in rank order — they use).

namespace weave {
namespace coll {

// ---- data movement (byte kernels) ----------------------------------------------------------

// All-to-all-v: counts and displacements in elements of `count` bytes each, as device arrays
// of `world` u64 (aux[0] send counts, aux[1] send displacements, aux[2] recv counts, aux[3]
// recv displacements). First every rank publishes its send and recv counts to every rank, so
// each checks every pair and all agree on the number of steps, without the host.
WEAVE_DEVICE void all_to_allv(const GpuCollectiveArgs& a) {
  const uint64_t epoch = *epoch_ptr(a);
  uint32_t index = 0;
  const uint64_t step = a.chunk_bytes / 2;
  const uint64_t esz = a.count;
  const char* send = as_ptr<const char>(a.send);
  char* recv = as_ptr<char>(a.recv);
  const uint64_t* send_counts = as_ptr<const uint64_t>(a.aux[0]);
  const uint64_t* send_displs = as_ptr<const uint64_t>(a.aux[1]);
  const uint64_t* recv_counts = as_ptr<const uint64_t>(a.aux[2]);
  const uint64_t* recv_displs = as_ptr<const uint64_t>(a.aux[3]);
  const uint32_t t = global_thread(), nt = global_threads();
  if (!phase(a, epoch, index)) return;
  // Count table: rank r's row (send counts, then recv counts, in elements) in every rank's
  // slot[1][r].
  for (uint32_t r = 0; r < a.world; ++r) {
    uint64_t* row = reinterpret_cast<uint64_t*>(slot_ptr(a, r, 1, a.rank));
    for (uint32_t q = t; q < a.world; q += nt) {
      row[q] = send_counts[q];
      row[a.world + q] = recv_counts[q];
    }
  }
  if (!phase(a, epoch, index)) return;
  uint64_t longest = 0;
  bool consistent = true;
  for (uint32_t p = 0; p < a.world; ++p) {
    const uint64_t* row_p = reinterpret_cast<const uint64_t*>(slot_ptr(a, a.rank, 1, p));
    for (uint32_t q = 0; q < a.world; ++q) {
      const uint64_t* row_q = reinterpret_cast<const uint64_t*>(slot_ptr(a, a.rank, 1, q));
      if (row_p[q] != row_q[a.world + p]) consistent = false;
      if (row_p[q] * esz > longest) longest = row_p[q] * esz;
    }
  }
  if (!consistent) {
    if (t == 0) report_error(a.status, DeviceError::BadArgument);
    return;
  }
  // Every rank has read the count table before anyone reuses slot[1].
  if (!phase(a, epoch, index)) return;
  uint32_t parity = 0;
  for (uint64_t base = 0; base < longest; base += step, parity ^= 1) {
    for (uint32_t k = 0; k < a.world; ++k) {
      const uint32_t q = (a.rank + k) % a.world;
      const uint64_t total = send_counts[q] * esz;
      const uint64_t have = total > base ? total - base : 0;
      const uint64_t bytes = have < step ? have : step;
      const char* from = send + send_displs[q] * esz + base;
      if (q == a.rank) {
        copy(recv + recv_displs[q] * esz + base, from, bytes, t, nt);
      } else {
        put(slot_ptr(a, q, parity, a.rank), from, bytes, t, nt);
      }
    }
    if (!phase(a, epoch, index)) return;
    for (uint32_t k = 1; k < a.world; ++k) {
      const uint32_t p = (a.rank + k) % a.world;
      const uint64_t total = recv_counts[p] * esz;
      const uint64_t have = total > base ? total - base : 0;
      copy(recv + recv_displs[p] * esz + base, slot_ptr(a, a.rank, parity, p), have < step ? have : step, t, nt);
    }
  }
  finish(a, epoch, index, index);
}

// ---- point-to-point ------------------------------------------------------------------------

constexpr uint64_t READY_OFFSET = 512;
constexpr uint64_t ACK_OFFSET = 1024;
constexpr uint64_t SENT_OFFSET = 2560;
constexpr uint64_t RECEIVED_OFFSET = 2624;
constexpr uint64_t SEND_ARRIVALS_OFFSET = 2688;
constexpr uint64_t RECV_ARRIVALS_OFFSET = 2704;
constexpr uint64_t P2P_HEADER = 256;
constexpr uint64_t NO_PEER = ~uint64_t(0);

// The mailboxes follow the packets in the control area.
WEAVE_DEVICE uint64_t p2p_offset(const GpuCollectiveArgs& a) { return packets_end(a); }

// Slot of `writer` with `parity` in `owner`'s mailboxes.
WEAVE_DEVICE char* mailbox(const GpuCollectiveArgs& a, uint32_t owner, uint32_t writer, uint64_t parity) {
  return as_ptr<char>(a.peers[owner] + p2p_offset(a) + (uint64_t(writer) * 2 + parity) * a.aux[2]);
}

WEAVE_DEVICE uint64_t* control(const GpuCollectiveArgs& a, uint32_t owner, uint64_t offset) {
  return as_ptr<uint64_t>(a.peers[owner] + offset);
}

// Arrival at `counter` (one of a side's three): the last of `blocks` blocks resets the counter
// and runs `last()` (thread 0 of that block).
template <typename F>
WEAVE_DEVICE void role_arrive(uint32_t* counter, uint32_t blocks, F last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    if (atomicAdd(counter, 1u) == blocks - 1) {
      *counter = 0;
      __threadfence();
      last();
    }
  }
}

// What both sides of a transfer walk: the message (`bytes`) in chunks of `payload` bytes (an
// empty message is one empty chunk), numbered seq0 + 1, seq0 + 2, … after this rank's counter
// for the peer (`counter`: sent[q] or received[p]), and the side's arrival counters.
struct P2pWalk {
  uint64_t bytes, payload, chunks, seq0;
  uint64_t* counter;
  uint32_t* arrivals;

  // Bytes of chunk c, which starts at byte c * payload.
  WEAVE_DEVICE uint64_t len(uint64_t c) const {
    const uint64_t at = c * payload;
    const uint64_t n = bytes - at < payload ? bytes - at : payload;
    return bytes == 0 ? 0 : n;
  }
};

WEAVE_DEVICE P2pWalk p2p_walk(const GpuCollectiveArgs& a, uint64_t bytes, uint64_t counter_offset,
                              uint64_t arrivals_offset) {
  P2pWalk w;
  w.bytes = bytes;
  w.payload = a.aux[2] - P2P_HEADER;
  w.chunks = bytes == 0 ? 1 : (bytes + w.payload - 1) / w.payload;
  w.counter = as_ptr<uint64_t>(a.peers[a.rank] + counter_offset);
  w.seq0 = *w.counter;
  w.arrivals = as_ptr<uint32_t>(a.peers[a.rank] + arrivals_offset);
  return w;
}

// End of a side: once every block is done, its counter for the peer moves past the message.
WEAVE_DEVICE void p2p_walk_end(const P2pWalk& w, uint32_t blocks) {
  role_arrive(w.arrivals + 2, blocks, [&] {
    *w.counter = w.seq0 + w.chunks;
    __threadfence();
  });
}

WEAVE_DEVICE void send_role(const GpuCollectiveArgs& a, uint32_t q, uint32_t bid, uint32_t blocks) {
  const P2pWalk w = p2p_walk(a, a.count, SENT_OFFSET + 8 * q, SEND_ARRIVALS_OFFSET);
  const uint32_t t = bid * blockDim.x + threadIdx.x, nt = blocks * blockDim.x;
  const char* src = as_ptr<const char>(a.send);
  __shared__ int ok;
  for (uint64_t c = 0; c < w.chunks; ++c) {
    const uint64_t seq = w.seq0 + c + 1;
    if (threadIdx.x == 0) {
      const uint64_t* ack = control(a, a.rank, ACK_OFFSET + 64 * q);
      ok = spin_until([&] { return atomic_load_acquire_sys(ack) + 2 >= seq; }, a.status, DeviceError::SemaphoreTimeout);
    }
    __syncthreads();
    if (!ok) return;
    char* slot = mailbox(a, q, a.rank, seq & 1);
    if (t == 0) {
      reinterpret_cast<uint64_t*>(slot)[0] = w.bytes;
      reinterpret_cast<uint64_t*>(slot)[1] = c;
      reinterpret_cast<uint64_t*>(slot)[2] = a.aux[3] & 0xffffffffu;
    }
    put(slot + P2P_HEADER, src + c * w.payload, w.len(c), t, nt);
    role_arrive(w.arrivals + (seq & 1), blocks, [&] {
      atomic_store_release_sys(control(a, q, READY_OFFSET + 64 * a.rank), seq);
    });
  }
  p2p_walk_end(w, blocks);
}

WEAVE_DEVICE void recv_role(const GpuCollectiveArgs& a, uint32_t p, uint32_t bid, uint32_t blocks) {
  const P2pWalk w = p2p_walk(a, a.aux[0], RECEIVED_OFFSET + 8 * p, RECV_ARRIVALS_OFFSET);
  const uint32_t t = bid * blockDim.x + threadIdx.x, nt = blocks * blockDim.x;
  char* dst = as_ptr<char>(a.recv);
  __shared__ int ok;
  for (uint64_t c = 0; c < w.chunks; ++c) {
    const uint64_t seq = w.seq0 + c + 1;
    const char* slot = mailbox(a, a.rank, p, seq & 1);
    if (threadIdx.x == 0) {
      const uint64_t* ready = control(a, a.rank, READY_OFFSET + 64 * p);
      ok = spin_until([&] { return atomic_load_acquire_sys(ready) >= seq; }, a.status, DeviceError::SemaphoreTimeout);
      if (ok) {
        // The sender's pair stamp must be the one this receive expects, and then the sizes
        // must agree (collectives/src/matching.rs): either way the ranks are out of step.
        const uint64_t* header = reinterpret_cast<const uint64_t*>(slot);
        if (header[2] != (a.aux[3] >> 32) || header[0] != w.bytes || header[1] != c) {
          report_error(a.status, DeviceError::CallMismatch);
          ok = 0;
        }
      }
    }
    __syncthreads();
    if (!ok) return;
    copy(dst + c * w.payload, slot + P2P_HEADER, w.len(c), t, nt);
    role_arrive(w.arrivals + (seq & 1), blocks, [&] {
      atomic_store_release_sys(control(a, p, ACK_OFFSET + 64 * a.rank), seq);
    });
  }
  p2p_walk_end(w, blocks);
}

// One send (count bytes of send to peer `root`; root == ~0 for none) and one receive (aux[0]
// bytes from peer aux[1] into recv; aux[1] == ~0 for none) progressing together: the first
// half of the blocks sends, the second half receives. aux[3] holds the pair stamps
// (collectives/src/matching.rs): the send's in its low 32 bits, written into every chunk's
// header; the one the receive expects in its high 32 bits.
WEAVE_DEVICE void sendrecv(const GpuCollectiveArgs& a) {
  const bool sends = a.root != 0xffffffffu;
  const bool recvs = a.aux[1] != NO_PEER;
  if (sends && recvs) {
    const uint32_t half = gridDim.x / 2;
    if (blockIdx.x < half) {
      send_role(a, a.root, blockIdx.x, half);
    } else {
      recv_role(a, uint32_t(a.aux[1]), blockIdx.x - half, gridDim.x - half);
    }
  } else if (sends) {
    send_role(a, a.root, blockIdx.x, gridDim.x);
  } else if (recvs) {
    recv_role(a, uint32_t(a.aux[1]), blockIdx.x, gridDim.x);
  }
}

// Runs Kernel<Op, T> with the operator chosen at run time.
template <template <typename, typename> class K, typename T>
WEAVE_DEVICE void dispatch(const GpuCollectiveArgs& a) {
  const bool known = with_reduce_op(a.op, [&](auto op) { K<decltype(op), T>::run(a); });
  if (!known && global_thread() == 0) report_error(a.status, DeviceError::BadArgument);
}

WEAVE_REDUCING_BODY(AllReduceLL, all_reduce_ll<Op, T>)
WEAVE_REDUCING_BODY(AllReduceTwoShot, all_reduce_two_shot<Op, T>)
WEAVE_REDUCING_BODY(AllReduceTwoShotLl128, all_reduce_two_shot_ll128<Op, T>)
WEAVE_REDUCING_BODY(Reduce, reduce<Op, T>)

}  // namespace coll
}  // namespace weave

// The entry point weave_<KERNEL>_<type name> of a reducing kernel for element type T, running
// IMPL<Op, T> with the operator chosen at run time. The type names are DataType::rust_name().
#define WEAVE_REDUCING_KERNEL(KERNEL, IMPL, NAME, T) \
  WEAVE_KERNEL(weave_##KERNEL##_##NAME, weave::coll::dispatch<weave::coll::IMPL, T>)

// The entry points of these bodies are instantiated by the host program builder
// (`kernels/src/direct.rs`, `ENTRY_POINTS`): all of them, or only the one a launch needs.
