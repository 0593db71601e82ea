// weave LL packet exchange: the small-message path of all-gather, all-to-all, broadcast,
// reduce-scatter and reduce (appended to collectives.cu, whose helpers it uses).
//
// Every rank writes, for every peer q, the bytes q needs from it as LL16 packets into q's packet
// buffer (writer = this rank, parity of the packet epoch, flag = packet epoch + 1), then reads
// what every peer wrote for it from its own buffer. No flag phase and no grid barrier: the packet flag is
// the synchronization, as in the one-shot all-reduce.
//
// A rank that has nothing for a peer (broadcast from another root, reduce to another root)
// still writes it one empty packet, and every rank reads one packet from every peer. So a
// rank that finished this kernel knows every peer started it, and therefore finished its
// previous kernel: that is what lets the next packet kernel reuse the other parity without a
// barrier, whatever the collective.

namespace weave {
namespace coll {

enum ExchangeKind : uint32_t {
  XCHG_ALL_GATHER = 0,
  XCHG_ALL_TO_ALL = 1,
  XCHG_BROADCAST = 2,
  XCHG_REDUCE_SCATTER = 3,
  XCHG_REDUCE = 4,
};

template <typename Op, typename T, uint32_t KIND>
WEAVE_DEVICE void exchange_ll(const GpuCollectiveArgs& a) {
  constexpr bool REDUCING = KIND == XCHG_REDUCE_SCATTER || KIND == XCHG_REDUCE;
  // `bytes` is one block (count is elements for the reducing kinds, bytes for the others).
  WEAVE_LL16_KERNEL_START(REDUCING ? a.count * sizeof(T) : a.count);
  if (words > a.packet_capacity) {
    packet_refuse(a, epoch);
    return;
  }
  // What this rank sends to rank q (nullptr: one empty packet).
  auto source = [&](uint32_t q) -> const char* {
    switch (KIND) {
      case XCHG_ALL_GATHER:
        return send;
      case XCHG_BROADCAST:
        return a.rank == a.root ? send : nullptr;
      case XCHG_REDUCE:
        return q == a.root ? send : nullptr;
      default:  // all-to-all, reduce-scatter: block q
        return send + uint64_t(q) * bytes;
    }
  };

  // 1. Write every peer's packets.
  for (uint32_t k = 1; k < a.world; ++k) {
    const uint32_t q = (a.rank + k) % a.world;
    const char* src = source(q);
    LL16Packet* out = packets(q, a.rank);
    if (src != nullptr) {
      for (uint64_t w = t; w < words; w += nt) write_ll16(out + w, load_word(src, w, bytes), flag);
    } else if (t == 0) {
      write_ll16(out, 0, flag);
    }
  }

  bool ok = true;
  if constexpr (!REDUCING) {
    // 2. The own block moves locally (in place it is already there).
    const char* own_src = KIND == XCHG_ALL_TO_ALL ? send + uint64_t(a.rank) * bytes : send;
    char* own_dst = KIND == XCHG_BROADCAST ? recv : recv + uint64_t(a.rank) * bytes;
    const bool has_own = KIND != XCHG_BROADCAST || a.rank == a.root;
    if (has_own && own_dst != own_src) copy(own_dst, own_src, bytes, t, nt);
    // 3. Unpack what the peers sent: the root's words and the other peers' empty packets
    // (broadcast), or every peer's word w at once (all-gather, all-to-all).
    if constexpr (KIND == XCHG_BROADCAST) {
      for (uint32_t k = 1; k < a.world && ok; ++k) {
        const uint32_t p = (a.rank + k) % a.world;
        const LL16Packet* in = packets(a.rank, p);
        if (p == a.root) {  // the root sends data, the others one empty packet
          for (uint64_t w = t; w < words && ok; w += nt) {
            uint64_t v = 0;
            ok = read_ll16(in + w, flag, a.status, &v);
            if (ok) store_word(recv, w, bytes, v);
          }
        } else if (t == 0) {
          uint64_t ignored = 0;
          ok = read_ll16(in, flag, a.status, &ignored);
        }
      }
    } else {
      for (uint64_t w = t; w < words; w += nt) {
        uint64_t v[MAX_PEERS];
        auto at = [&](uint32_t i) { return packets(a.rank, peer_rank(a, i)) + w; };
        ok = read_ll16_each<MAX_PEERS>(at, every_peer(a), flag, a.status, v);
        if (!ok) break;
#pragma unroll
        for (uint32_t i = 0; i < MAX_PEERS; ++i) {
          if (i + 1 < a.world) store_word(recv + uint64_t(peer_rank(a, i)) * bytes, w, bytes, v[i]);
        }
      }
    }
  } else {
    const bool receives = KIND == XCHG_REDUCE_SCATTER || a.rank == a.root;
    if (receives) {
      // 2. Combine the own block with every peer's, word by word, in rank order.
      const char* own = KIND == XCHG_REDUCE_SCATTER ? send + uint64_t(a.rank) * bytes : send;
      for (uint64_t w = t; w < words && ok; w += nt) {
        auto at = [&](uint32_t i) { return packets(a.rank, peer_rank(a, i)) + w; };
        uint64_t acc;
        ok = reduce_ll16_word<Op, T>(a, at, flag, own, w, bytes, acc);
        if (!ok) break;
        store_word(recv, w, bytes, acc);
      }
    } else if (t == 0) {
      // 2'. Reduce to another root: only the peers' empty packets arrive here.
      for (uint32_t k = 1; k < a.world && ok; ++k) {
        uint64_t ignored = 0;
        ok = read_ll16(packets(a.rank, (a.rank + k) % a.world), flag, a.status, &ignored);
      }
    }
  }
  packet_finish(a, epoch);
}

WEAVE_REDUCING_BODY(ReduceScatterLL, exchange_ll<Op, T, XCHG_REDUCE_SCATTER>)
WEAVE_REDUCING_BODY(ReduceLL, exchange_ll<Op, T, XCHG_REDUCE>)

}  // namespace coll
}  // namespace weave

// The entry points of these bodies are instantiated by the host program builder
// (`kernels/src/direct.rs`, `ENTRY_POINTS`): all of them, or only the one a launch needs.
