// weave channel kernels, the runs: each collective of the family dispatched to its algorithm
// (ChannelArgs::algorithm) — the ring, chain and direct exchanges of channel.cu, the logarithmic
// ones of channel_log.cu — and the entry points. Appended to those two files in every program
// of the family (kernels::channel::ChannelKernel::program).

namespace weave {
namespace chan {

// The reducing collectives on T with Op (all-reduce, reduce-scatter, reduce).
template <typename Op, typename T>
WEAVE_CHANNEL_STEP void run_reducing(const ChannelArgs& a) {
  __shared__ Shared sh;
  const uint32_t n = a.world, me = a.rank, tid = threadIdx.x;
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  const bool ring_family = a.algorithm == CHANNEL_RING;
  if (n == 1) {
    // Every collective of one rank is a copy of its input (count elements).
    move(recv, send, a.count * sizeof(T));
    return;
  }
  if (a.algorithm == CHANNEL_DOUBLING && a.collective == CHANNEL_ALL_REDUCE) {
    doubling<Op, T>(a, &sh);
    return;
  }
  if (a.algorithm == CHANNEL_HALVING && (a.collective == CHANNEL_ALL_REDUCE || a.collective == CHANNEL_REDUCE_SCATTER)) {
    halving<Op, T>(a, a.collective == CHANNEL_ALL_REDUCE, &sh);
    return;
  }
  if (a.algorithm == CHANNEL_TREE && a.collective == CHANNEL_REDUCE) {
    tree_reduce<Op, T>(a, &sh);
    return;
  }
  if (a.algorithm != CHANNEL_RING && a.algorithm != CHANNEL_DIRECT) {
    // A logarithmic algorithm this collective does not have (the host never asks for one).
    if (tid == 0) report_error(a.status, DeviceError::BadArgument);
    return;
  }
  switch (a.collective) {
    case CHANNEL_ALL_REDUCE:
      if (ring_family) {
        ring<Op, T>(a, RING_ALL_REDUCE, &sh);
      } else {
        exchange<Op, T, true>(a, WHOLE, WHOLE, CHANNEL_ALL_PEERS, CHANNEL_ALL_PEERS, 0, &sh);
      }
      break;
    case CHANNEL_REDUCE_SCATTER:
      if (ring_family) {
        ring<Op, T>(a, RING_REDUCE_SCATTER, &sh);
      } else {
        exchange<Op, T, true>(a, BLOCK_OF, OWN_BLOCK, CHANNEL_ALL_PEERS, CHANNEL_ALL_PEERS, uint64_t(me) * a.count, &sh);
      }
      break;
    case CHANNEL_REDUCE:
      if (ring_family) {
        chain<Op, T, true>(a, chain_after(a), chain_before(a), &sh);
      } else if (me == a.root) {
        exchange<Op, T, true>(a, WHOLE, WHOLE, CHANNEL_NO_PEER, CHANNEL_ALL_PEERS, 0, &sh);
      } else {
        exchange<Op, T, false>(a, WHOLE, WHOLE, a.root, CHANNEL_NO_PEER, 0, &sh);
      }
      break;
    default:
      if (tid == 0) report_error(a.status, DeviceError::BadArgument);
  }
}

// The data-movement collectives on bytes (all-gather, broadcast, all-to-all(v), send/receive).
WEAVE_CHANNEL_STEP void run_moving(const ChannelArgs& a) {
  typedef uint8_t T;
  typedef Sum Op;  // unused by the copies; the templates want one
  __shared__ Shared sh;
  const uint32_t n = a.world, me = a.rank, tid = threadIdx.x;
  const T* send = as_ptr<const T>(a.send);
  T* recv = as_ptr<T>(a.recv);
  const bool ring_family = a.algorithm == CHANNEL_RING;
  if (n == 1 && a.collective != CHANNEL_ALL_TO_ALLV && a.collective != CHANNEL_SEND_RECV) {
    move(recv, send, a.count);
    return;
  }
  if (a.algorithm == CHANNEL_BRUCK && a.collective == CHANNEL_ALL_GATHER) {
    bruck_all_gather(a, &sh);
    return;
  }
  if (a.algorithm == CHANNEL_BRUCK && a.collective == CHANNEL_ALL_TO_ALL) {
    bruck_all_to_all(a, &sh);
    return;
  }
  if (a.algorithm == CHANNEL_TREE && a.collective == CHANNEL_BROADCAST) {
    tree_broadcast(a, &sh);
    return;
  }
  if (a.algorithm != CHANNEL_RING && a.algorithm != CHANNEL_DIRECT) {
    // A logarithmic algorithm this collective does not have (the host never asks for one).
    if (tid == 0) report_error(a.status, DeviceError::BadArgument);
    return;
  }
  switch (a.collective) {
    case CHANNEL_ALL_GATHER:
      if (ring_family) {
        ring<Op, T>(a, RING_ALL_GATHER, &sh);
      } else {
        move(recv + uint64_t(me) * a.count, send, a.count);
        exchange<Op, T, false>(a, WHOLE, BLOCK_OF, CHANNEL_ALL_PEERS, CHANNEL_ALL_PEERS, 0, &sh);
      }
      break;
    case CHANNEL_BROADCAST:
      if (ring_family) {
        chain<Op, T, false>(a, chain_before(a), chain_after(a), &sh);
      } else if (me == a.root) {
        move(recv, send, a.count);
        exchange<Op, T, false>(a, WHOLE, WHOLE, CHANNEL_ALL_PEERS, CHANNEL_NO_PEER, 0, &sh);
      } else {
        exchange<Op, T, false>(a, WHOLE, WHOLE, CHANNEL_NO_PEER, a.root, 0, &sh);
      }
      break;
    case CHANNEL_ALL_TO_ALL:
      move(recv + uint64_t(me) * a.count, send + uint64_t(me) * a.count, a.count);
      exchange<Op, T, false>(a, BLOCK_OF, BLOCK_OF, CHANNEL_ALL_PEERS, CHANNEL_ALL_PEERS, 0, &sh);
      break;
    case CHANNEL_ALL_TO_ALLV: {
      const uint64_t* sc = as_ptr<const uint64_t>(a.aux[0]);
      const uint64_t* sd = as_ptr<const uint64_t>(a.aux[1]);
      const uint64_t* rc = as_ptr<const uint64_t>(a.aux[2]);
      const uint64_t* rd = as_ptr<const uint64_t>(a.aux[3]);
      if (sc[me] != rc[me]) {
        if (tid == 0) report_error(a.status, DeviceError::CallMismatch);
        return;
      }
      move(recv + rd[me] * a.elem_size, send + sd[me] * a.elem_size, sc[me] * a.elem_size);
      exchange<Op, T, false>(a, VARIABLE, VARIABLE, CHANNEL_ALL_PEERS, CHANNEL_ALL_PEERS, 0, &sh);
      break;
    }
    case CHANNEL_SEND_RECV: {
      // Send a.count bytes to a.root and receive aux[0] bytes from a.from, message by message
      // in lockstep, so that a ring shift cannot deadlock.
      const uint32_t to = a.root, from = a.from;
      const uint32_t any = to != CHANNEL_NO_PEER ? to : from;
      if (any == CHANNEL_NO_PEER) return;
      const uint64_t chunk = message_bytes(a, any);
      const uint64_t out_msgs = to != CHANNEL_NO_PEER ? pieces(a.count, chunk) : 0;
      const uint64_t in_msgs = from != CHANNEL_NO_PEER ? pieces(a.aux[0], chunk) : 0;
      for (uint64_t c = 0; c < out_msgs || c < in_msgs; ++c) {
        uint64_t at, k;
        if (c < out_msgs && piece(c, a.count, chunk, &at, &k) && !send_bytes(a, to, send + at, k, &sh)) return;
        if (c < in_msgs && piece(c, a.aux[0], chunk, &at, &k)) {
          const T* inbox = reinterpret_cast<const T*>(receive(a, from, k, &sh));
          if (inbox == nullptr) return;
          move(recv + at, inbox, k);
          if (!release(a, from, &sh)) return;
        }
      }
      break;
    }
    default:
      if (tid == 0) report_error(a.status, DeviceError::BadArgument);
  }
}

// The reducing entry points pick the operator at run time (averages sum, then divide).
template <typename T>
WEAVE_DEVICE void dispatch(const ChannelArgs& a) {
  const bool known = with_reduce_op(a.op, [&](auto op) { run_reducing<decltype(op), T>(a); });
  if (!known && threadIdx.x == 0) report_error(a.status, DeviceError::BadArgument);
}

}  // namespace chan
}  // namespace weave

// The entry points, instantiated by the program builder (kernels::channel), one per program so
// a launch compiles only what it runs: WEAVE_CHANNEL_MOVING() defines weave_channel_bytes (data
// movement, counts in bytes), WEAVE_CHANNEL_REDUCING(NAME, T) defines weave_channel_NAME (the
// reducing collectives, counts in elements; NAME is DataType::rust_name()). One block of
// WEAVE_CHANNEL_THREADS threads per launch.
#define WEAVE_CHANNEL_MOVING()                                                                               \
  extern "C" __global__ void __launch_bounds__(WEAVE_CHANNEL_THREADS) weave_channel_bytes(weave::ChannelArgs a) { \
    weave::report_started(a.status);                                                                         \
    weave::chan::run_moving(a);                                                                              \
  }
#define WEAVE_CHANNEL_REDUCING(NAME, T)                                                                          \
  extern "C" __global__ void __launch_bounds__(WEAVE_CHANNEL_THREADS) weave_channel_##NAME(weave::ChannelArgs a) { \
    weave::report_started(a.status);                                                                             \
    weave::chan::dispatch<T>(a);                                                                                 \
  }
