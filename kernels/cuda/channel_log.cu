// weave channel kernels, the logarithmic algorithms: recursive doubling and halving
// (Rabenseifner) for all-reduce and reduce-scatter, Bruck's all-gather and all-to-all, and
// binomial trees for broadcast and reduce, for any world size, in ceil(log2 n) steps (plus two
// around the power-of-two core where doubling and halving fold the other ranks in).
//
// Each follows the host channel executor's schedule step for step — same peers, same blocks,
// same order of operands in every reduction — so the two read side by side and a world mixes
// no orders: collectives/src/channel/swap.rs (`swap`), recursive.rs (doubling, halving),
// bruck.rs and tree.rs, with their peers and the fold in collectives/src/schedule.rs. The Rust
// side computes the same peers to build the links (gpu/channels.rs asks schedule.rs), this file
// recomputes the schedule from (world, rank, root). Where the host keeps a scratch vector, the kernel uses the family's scratch buffer
// (ChannelArgs::scratch, sized by the host for the call).
//
// Appended to channel.cu in every program of the family: it uses that file's link steps
// (outbox, post, receive, release) and block-wide helpers (combine, move, pieces, piece).

namespace weave {
namespace chan {

// ---- the step and the fold (swap.rs) ---------------------------------------------------------

// One step (swap.rs `swap`): `out_elems` elements to `to` and `in_elems` elements from `from`
// (either CHANNEL_NO_PEER), message c posted before message c is taken, so a rank runs at most
// one message ahead of the peer it waits for. stage(at, dst, k) writes elements [at, at + k) of
// the outgoing block into the outbox; take(at, msg, k) consumes elements [at, at + k) of the
// incoming one before its slot is freed (take may overwrite what message c staged: it is out).
// Both run on every thread of the block. False when the block must stop.
template <typename T, typename Stage, typename Take>
WEAVE_DEVICE bool swap_step(const ChannelArgs& a, uint32_t to, uint64_t out_elems, Stage stage, uint32_t from,
                       uint64_t in_elems, Take take, Shared* sh) {
  const uint32_t any = to != CHANNEL_NO_PEER ? to : from;
  if (any == CHANNEL_NO_PEER) return true;
  const uint64_t chunk = message_bytes(a, any) / sizeof(T);
  const uint64_t out_msgs = to != CHANNEL_NO_PEER ? pieces(out_elems, chunk) : 0;
  const uint64_t in_msgs = from != CHANNEL_NO_PEER ? pieces(in_elems, chunk) : 0;
  for (uint64_t c = 0; c < out_msgs || c < in_msgs; ++c) {
    uint64_t at, k;
    if (c < out_msgs && piece(c, out_elems, chunk, &at, &k)) {
      T* out = reinterpret_cast<T*>(outbox(a, to, sh));
      if (out == nullptr) return false;
      stage(at, out, k);
      if (!post(a, to, k * sizeof(T), sh)) return false;
    }
    if (c < in_msgs && piece(c, in_elems, chunk, &at, &k)) {
      const T* inbox = reinterpret_cast<const T*>(receive(a, from, k * sizeof(T), sh));
      if (inbox == nullptr) return false;
      take(at, inbox, k);
      if (!release(a, from, sh)) return false;
    }
  }
  return true;
}

// A step that sends the contiguous block src[0, out_elems).
template <typename T, typename Take>
WEAVE_DEVICE bool swap_block(const ChannelArgs& a, uint32_t to, const T* src, uint64_t out_elems, uint32_t from,
                             uint64_t in_elems, Take take, Shared* sh) {
  auto stage = [&](uint64_t at, T* dst, uint64_t k) { move(dst, src + at, k * sizeof(T)); };
  return swap_step<T>(a, to, out_elems, stage, from, in_elems, take, sh);
}

// A step that only sends src[0, elems) to `to`.
template <typename T>
WEAVE_DEVICE bool send_block(const ChannelArgs& a, uint32_t to, const T* src, uint64_t elems, Shared* sh) {
  auto nothing = [](uint64_t, const T*, uint64_t) {};
  return swap_block<T>(a, to, src, elems, CHANNEL_NO_PEER, 0, nothing, sh);
}

// A step that only receives `elems` elements from `from` into dst.
template <typename T>
WEAVE_DEVICE bool receive_block(const ChannelArgs& a, uint32_t from, T* dst, uint64_t elems, Shared* sh) {
  auto into = [&](uint64_t at, const T* msg, uint64_t k) { move(dst + at, msg, k * sizeof(T)); };
  return swap_block<T>(a, CHANNEL_NO_PEER, static_cast<const T*>(nullptr), 0, from, elems, into, sh);
}

// A rank or core index that does not exist.
constexpr uint32_t NONE = 0xffffffffu;

// A world of n ranks as a power-of-two core of p ranks (schedule.rs `Fold`): the first 2 * rem
// ranks pair up, the even rank of each pair folding into the odd one; core index i stands for
// the ranks first(i) .. first(i + 1).
struct Fold {
  uint32_t p;
  uint32_t rem;

  WEAVE_DEVICE explicit Fold(uint32_t n) : p(1), rem(0) {
    while (uint64_t(p) * 2 <= n) p *= 2;
    rem = n - p;
  }
  // The core index of rank r, or NONE for a rank that folds into r + 1.
  WEAVE_DEVICE uint32_t core(uint32_t r) const {
    if (r < 2 * rem) return r % 2 == 1 ? r / 2 : NONE;
    return r - rem;
  }
  // The rank that holds core index i.
  WEAVE_DEVICE uint32_t rank(uint32_t i) const { return i < rem ? 2 * i + 1 : i + rem; }
  // The first rank core index i stands for (first(p) = n).
  WEAVE_DEVICE uint32_t first(uint32_t i) const { return i < rem ? 2 * i : i + rem; }
  // The rank whose data r holds besides its own, if any.
  WEAVE_DEVICE uint32_t partner(uint32_t r) const { return r < 2 * rem ? (r ^ 1u) : NONE; }
  // log2 p: the steps of the core.
  WEAVE_DEVICE uint32_t steps() const { return 31 - __clz(p); }
};

// Block-wide: dst[0, k) = first Op second, element by element (divided by `avg` when non-zero).
template <typename Op, typename T>
WEAVE_DEVICE void combine_two(T* dst, const T* first, const T* second, uint64_t k, uint32_t avg) {
  const T* srcs[2] = {first, second};
  combine<Op, T>(dst, nullptr, srcs, 2, k, avg);
}

// ---- recursive doubling and halving (recursive.rs) -------------------------------------------

// All-reduce by recursive doubling (recursive.rs `all_reduce_doubling`): the result builds up in
// recv; every step swaps the whole buffer with the core partner of one bit and reduces, the
// lower core index's operand first.
template <typename Op, typename T>
WEAVE_CHANNEL_STEP void doubling(const ChannelArgs& a, Shared* sh) {
  const uint32_t n = a.world, me = a.rank;
  const uint64_t count = a.count;
  const Fold f(n);
  T* acc = as_ptr<T>(a.recv);
  const uint32_t avg = a.op == OP_AVG ? n : 0;
  move(acc, as_ptr<const T>(a.send), count * sizeof(T));
  const uint32_t i = f.core(me);
  if (i == NONE) {
    // Folded out: hand the input to the partner, take the result back.
    if (!send_block<T>(a, me + 1, acc, count, sh)) return;
    receive_block<T>(a, me + 1, acc, count, sh);
    return;
  }
  const uint32_t steps = f.steps();
  const uint32_t lower = f.partner(me);
  if (lower != NONE) {
    auto fold_in = [&](uint64_t at, const T* m, uint64_t k) { combine_two<Op, T>(acc + at, m, acc + at, k, 0); };
    if (!swap_block<T>(a, CHANNEL_NO_PEER, acc, 0, lower, count, fold_in, sh)) return;
  }
  for (uint32_t step = 0; step < steps; ++step) {
    const uint32_t mask = 1u << step;
    const uint32_t peer = f.rank(i ^ mask);
    const uint32_t divide = step + 1 == steps ? avg : 0;
    const bool mine_first = (i & mask) == 0;
    auto reduce = [&](uint64_t at, const T* m, uint64_t k) {
      if (mine_first) {
        combine_two<Op, T>(acc + at, acc + at, m, k, divide);
      } else {
        combine_two<Op, T>(acc + at, m, acc + at, k, divide);
      }
    };
    if (!swap_block<T>(a, peer, acc, count, peer, count, reduce, sh)) return;
  }
  if (lower != NONE) send_block<T>(a, lower, acc, count, sh);
}

// All-reduce (Rabenseifner: halving, then doubling) or reduce-scatter (halving alone) by
// recursive halving (recursive.rs `halving`). The work buffer is recv for the all-reduce (count
// elements in p shares) and the scratch buffer for the reduce-scatter (a copy of the n blocks,
// core index i owning the blocks of the ranks it stands for).
template <typename Op, typename T>
WEAVE_CHANNEL_STEP void halving(const ChannelArgs& a, bool all_reduce, Shared* sh) {
  const uint32_t n = a.world, me = a.rank;
  const uint64_t count = a.count;
  const Fold f(n);
  const uint32_t steps = f.steps();
  T* recv = as_ptr<T>(a.recv);
  T* work = all_reduce ? recv : as_ptr<T>(a.scratch);
  const uint64_t total = all_reduce ? count : uint64_t(n) * count;
  const uint32_t avg = a.op == OP_AVG ? n : 0;
  move(work, as_ptr<const T>(a.send), total * sizeof(T));
  // First element of core index i's part of the work buffer (bound(p) = total).
  auto bound = [&](uint32_t i) -> uint64_t { return all_reduce ? total * i / f.p : uint64_t(f.first(i)) * count; };
  const uint32_t i = f.core(me);
  if (i == NONE) {
    // Folded out: hand the whole input to the partner, take the result (or this block) back.
    if (!send_block<T>(a, me + 1, work, total, sh)) return;
    receive_block<T>(a, me + 1, recv, count, sh);
    return;
  }
  const uint32_t lower = f.partner(me);
  if (lower != NONE) {
    auto fold_in = [&](uint64_t at, const T* m, uint64_t k) { combine_two<Op, T>(work + at, m, work + at, k, 0); };
    if (!swap_block<T>(a, CHANNEL_NO_PEER, work, 0, lower, total, fold_in, sh)) return;
  }
  // Recursive halving: the core indices [lo, lo + 2 * mask) split in two; this rank keeps its
  // half and sends the other.
  uint32_t lo = 0;
  for (uint32_t s = steps; s-- > 0;) {
    const uint32_t mask = 1u << s;
    const uint32_t peer = f.rank(i ^ mask);
    const bool mine_first = (i & mask) == 0;
    const uint32_t keep = mine_first ? lo : lo + mask, give = mine_first ? lo + mask : lo;
    const uint64_t ka = bound(keep), kb = bound(keep + mask);
    const uint64_t ga = bound(give), gb = bound(give + mask);
    const uint32_t divide = s == 0 ? avg : 0;
    auto reduce = [&](uint64_t at, const T* m, uint64_t k) {
      T* mine = work + ka + at;
      if (mine_first) {
        combine_two<Op, T>(mine, mine, m, k, divide);
      } else {
        combine_two<Op, T>(mine, m, mine, k, divide);
      }
    };
    if (!swap_block<T>(a, peer, work + ga, gb - ga, peer, kb - ka, reduce, sh)) return;
    lo = keep;
  }
  if (all_reduce) {
    // Recursive doubling: the parts held so far double every step.
    for (uint32_t s = 0; s < steps; ++s) {
      const uint32_t mask = 1u << s;
      const uint32_t peer = f.rank(i ^ mask);
      const uint32_t mine = i & ~(mask - 1), theirs = (i ^ mask) & ~(mask - 1);
      const uint64_t ma = bound(mine), mb = bound(mine + mask);
      const uint64_t ta = bound(theirs), tb = bound(theirs + mask);
      auto place = [&](uint64_t at, const T* m, uint64_t k) { move(work + ta + at, m, k * sizeof(T)); };
      if (!swap_block<T>(a, peer, work + ma, mb - ma, peer, tb - ta, place, sh)) return;
    }
    if (lower != NONE) send_block<T>(a, lower, work, count, sh);
  } else {
    if (lower != NONE && !send_block<T>(a, lower, work + uint64_t(lower) * count, count, sh)) return;
    move(recv, work + uint64_t(me) * count, count * sizeof(T));
  }
}

// ---- Bruck (bruck.rs) ------------------------------------------------------------------------

// All-gather by Bruck's algorithm (bruck.rs, all-gather): the scratch buffer holds blocks in
// the order me, me + 1, ... (mod n); the step at distance d sends the first min(d, n - d) blocks
// gathered so far to me - d and appends as many from me + d; a final rotation puts every block
// at its rank's place. Bytes (the data-movement kernel): count is the block's bytes.
WEAVE_CHANNEL_STEP void bruck_all_gather(const ChannelArgs& a, Shared* sh) {
  typedef uint8_t T;
  const uint32_t n = a.world, me = a.rank;
  const uint64_t count = a.count;
  T* work = as_ptr<T>(a.scratch);
  T* recv = as_ptr<T>(a.recv);
  move(work, as_ptr<const T>(a.send), count);
  uint64_t held = 1;
  for (uint64_t d = 1; d < n; d *= 2) {
    const uint64_t m = d < n - d ? d : n - d;
    const uint32_t to = uint32_t((me + n - d) % n), from = uint32_t((me + d) % n);
    T* at_end = work + held * count;
    auto append = [&](uint64_t at, const T* msg, uint64_t k) { move(at_end + at, msg, k); };
    if (!swap_block<T>(a, to, work, m * count, from, m * count, append, sh)) return;
    held += m;
  }
  for (uint32_t j = 0; j < n; ++j) move(recv + uint64_t((me + j) % n) * count, work + uint64_t(j) * count, count);
}

// The packed sequence of the blocks j of the work buffer whose index has bit d set (ascending
// j, `count` bytes each): calls f(work offset, packed offset - at, bytes) for each contiguous
// piece of its bytes [at, at + k). The s-th such block is j = (s / d) * 2d + d + s % d.
template <typename F>
WEAVE_DEVICE void packed_pieces(uint64_t d, uint64_t count, uint64_t at, uint64_t k, F f) {
  for (uint64_t x = at; x < at + k;) {
    const uint64_t s = x / count, off = x % count;
    const uint64_t j = (s / d) * 2 * d + d + s % d;
    const uint64_t len = count - off < at + k - x ? count - off : at + k - x;
    f(j * count + off, x - at, len);
    x += len;
  }
}

// All-to-all by Bruck's algorithm (bruck.rs, all-to-all): block j of the scratch buffer starts
// as this rank's block for me + j; the step at distance d sends every block whose index has bit
// d set to me + d and takes the same blocks from me - d in their place; at the end block j holds
// what me - j sent here. The blocks are packed straight into the outbox and unpacked straight
// from the inbox (message c replaces exactly the elements message c sent).
WEAVE_CHANNEL_STEP void bruck_all_to_all(const ChannelArgs& a, Shared* sh) {
  typedef uint8_t T;
  const uint32_t n = a.world, me = a.rank;
  const uint64_t count = a.count;
  T* work = as_ptr<T>(a.scratch);
  T* recv = as_ptr<T>(a.recv);
  const T* send = as_ptr<const T>(a.send);
  for (uint32_t j = 0; j < n; ++j) move(work + uint64_t(j) * count, send + uint64_t((me + j) % n) * count, count);
  for (uint64_t d = 1; d < n; d *= 2) {
    // Indices in [0, n) with bit d set: d in every full 2d, and the tail past d.
    const uint64_t tail = n % (2 * d);
    const uint64_t moving = (n / (2 * d)) * d + (tail > d ? tail - d : 0);
    const uint32_t to = uint32_t((me + d) % n), from = uint32_t((me + n - d) % n);
    auto stage = [&](uint64_t at, T* dst, uint64_t k) {
      packed_pieces(d, count, at, k, [&](uint64_t w, uint64_t p, uint64_t len) { move(dst + p, work + w, len); });
    };
    auto take = [&](uint64_t at, const T* msg, uint64_t k) {
      packed_pieces(d, count, at, k, [&](uint64_t w, uint64_t p, uint64_t len) { move(work + w, msg + p, len); });
    };
    if (!swap_step<T>(a, to, moving * count, stage, from, moving * count, take, sh)) return;
  }
  for (uint32_t j = 0; j < n; ++j) move(recv + uint64_t((me + n - j) % n) * count, work + uint64_t(j) * count, count);
}

// ---- binomial trees (tree.rs) ----------------------------------------------------------------

// Most children of a tree node (one per bit of a 32-bit rank).
constexpr uint32_t TREE_MAX_CHILDREN = 32;

// The binomial tree around this rank (tree.rs `tree`), ranks relative to the root
// (v = (me - root) mod n): the parent differs from v in its highest set bit; the children add
// the bits above it, in the order the steps reach them. Returns the number of children.
WEAVE_DEVICE uint32_t tree_of(const ChannelArgs& a, uint32_t* parent, uint32_t* children) {
  const uint32_t n = a.world, root = a.root;
  const uint32_t v = (a.rank + n - root) % n;
  const uint32_t high = v == 0 ? 0 : 1u << (31 - __clz(v));
  *parent = v == 0 ? NONE : uint32_t((uint64_t(v - high) + root) % n);
  uint32_t count = 0;
  for (uint64_t m = v == 0 ? 1 : 2 * uint64_t(high); m < n && v + m < n; m *= 2) {
    children[count++] = uint32_t((v + m + root) % n);
  }
  return count;
}

// Broadcast down the binomial tree (tree.rs `broadcast`): the whole buffer from the parent (the
// root copies its input), then to every child. Bytes (the data-movement kernel).
WEAVE_CHANNEL_STEP void tree_broadcast(const ChannelArgs& a, Shared* sh) {
  typedef uint8_t T;
  uint32_t parent, children[TREE_MAX_CHILDREN];
  const uint32_t kids = tree_of(a, &parent, children);
  T* recv = as_ptr<T>(a.recv);
  if (parent == NONE) {
    move(recv, as_ptr<const T>(a.send), a.count);
  } else if (!receive_block<T>(a, parent, recv, a.count, sh)) {
    return;
  }
  for (uint32_t c = 0; c < kids; ++c) {
    if (!send_block<T>(a, children[c], recv, a.count, sh)) return;
  }
}

// Reduce up the binomial tree (tree.rs `reduce`): this rank's input (copied to the scratch
// buffer) combined with every child's partial result, the smallest subtree first, then sent to
// the parent; the root writes the result (dividing for averages).
template <typename Op, typename T>
WEAVE_CHANNEL_STEP void tree_reduce(const ChannelArgs& a, Shared* sh) {
  uint32_t parent, children[TREE_MAX_CHILDREN];
  const uint32_t kids = tree_of(a, &parent, children);
  const uint64_t count = a.count;
  T* acc = as_ptr<T>(a.scratch);
  move(acc, as_ptr<const T>(a.send), count * sizeof(T));
  auto add = [&](uint64_t at, const T* m, uint64_t k) { combine_two<Op, T>(acc + at, acc + at, m, k, 0); };
  for (uint32_t c = kids; c-- > 0;) {
    if (!swap_block<T>(a, CHANNEL_NO_PEER, acc, 0, children[c], count, add, sh)) return;
  }
  if (parent != NONE) {
    send_block<T>(a, parent, acc, count, sh);
  } else {
    const T* srcs[1] = {acc};
    combine<Op, T>(as_ptr<T>(a.recv), nullptr, srcs, 1, count, a.op == OP_AVG ? a.world : 0);
  }
}

}  // namespace chan
}  // namespace weave
