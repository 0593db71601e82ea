//! What the algorithm table speaks of: the collectives, where their buffers live, the
//! algorithms that run them and the families those belong to.

use std::fmt;

/// A collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// All-reduce.
    AllReduce,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// Broadcast from a root.
    Broadcast,
    /// Reduce to a root.
    Reduce,
    /// All-to-all with equal blocks.
    AllToAll,
    /// All-to-all with per-peer counts and displacements.
    AllToAllv,
    /// Point-to-point sends and receives (groups of them).
    SendRecv,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 8] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::AllToAllv,
        Collective::SendRecv,
    ];

    /// The snake-case name (`all_reduce`).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllv => "all_to_allv",
            Collective::SendRecv => "send_recv",
        }
    }

    /// Parses a name as printed by [`name`](Self::name) (also accepts `allreduce`, `alltoall`, …).
    pub fn parse(s: &str) -> Option<Collective> {
        let s = s.trim().to_ascii_lowercase().replace('-', "_");
        Collective::ALL.into_iter().find(|c| c.name() == s || c.name().replace('_', "") == s)
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a collective's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemorySpace {
    /// CPU memory.
    Host,
    /// GPU memory.
    Device,
}

/// An algorithm implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Every rank stages its data, then reads and combines every peer's (one sync per chunk).
    OneShot,
    /// GPU: reduce-scatter and all-gather both as LL packets, no barrier (medium all-reduces).
    TwoShot,
    /// GPU: the two-shot all-reduce as LL128 lines (120 bytes of payload in every 128 instead
    /// of 8 in 16), for medium messages between GPUs joined by NVLink; elsewhere it runs as
    /// [`TwoShot`](Self::TwoShot).
    TwoShotLl128,
    /// Reduce-scatter then all-gather (all-reduce) or gather (reduce) through shared scratch:
    /// each rank reduces only its share, so memory traffic does not grow with the rank count.
    /// On GPUs block-pipelined, and also the large broadcast (scatter, then all-gather).
    TwoPhase,
    /// Neighbour-to-neighbour ring: n-1 steps each way; the path that scales to many ranks and
    /// to transports without direct access. On GPUs: the pipelined chain broadcast.
    Ring,
    /// Each rank reads exactly the blocks it needs from every peer (host), or pushes every peer
    /// the blocks it needs (GPU, block-pipelined).
    Direct,
    /// Channel family: ring (all-reduce as reduce-scatter then all-gather, all-gather,
    /// reduce-scatter) or chain (broadcast, reduce) over connections, two neighbours per rank.
    ChannelRing,
    /// Channel family: every rank sends every peer what it needs over connections, one hop,
    /// in lockstep by message (also all-to-all(v) and send/recv).
    ChannelDirect,
    /// Channel family, broadcast and reduce: the ranks that send (the root of a broadcast,
    /// every other rank of a reduce) post their data into many small per-peer slots and
    /// return without waiting, so small calls never synchronize.
    ChannelEager,
    /// Channel family, all-reduce by recursive doubling: `log2 n` steps, each a swap of the
    /// whole buffer with the partner whose rank differs in one bit. Outside the largest power
    /// of two `p <= n`, each extra rank first folds its data into a partner and gets the result
    /// back at the end (two more steps). For small calls of large worlds.
    ChannelDoubling,
    /// Channel family, recursive halving (Rabenseifner): all-reduce as a reduce-scatter by
    /// recursive halving then an all-gather by recursive doubling (`2 log2 n` steps, each rank
    /// moving `2(n - 1)/n` of the buffer, as a ring does), and reduce-scatter as its first
    /// half; extra ranks outside a power of two fold in as in
    /// [`ChannelDoubling`](Self::ChannelDoubling). For medium calls of large worlds.
    ChannelHalving,
    /// Channel family, Bruck's algorithms: all-gather in `ceil(log2 n)` steps (step `k` passes
    /// the `2^k` blocks gathered so far to rank `r - 2^k`) and all-to-all in `ceil(log2 n)`
    /// steps (step `k` forwards the blocks whose distance has bit `k` set to rank `r + 2^k`),
    /// for any `n`. For small calls of large worlds.
    ChannelBruck,
    /// Channel family, broadcast and reduce over a binomial tree rooted at the root: `ceil(log2
    /// n)` steps for any root and any `n`. For small calls of large worlds.
    ChannelTree,
    /// Across nodes: the collective as steps inside each node and across nodes over
    /// sub-communicators (all-reduce = reduce-scatter in the node, all-reduce of each shard
    /// across nodes, all-gather in the node), so that every byte crosses the network once.
    /// Each step runs whatever its sub-communicator's table picks.
    Hierarchical,
}

/// The algorithm families: what an algorithm needs from the transports and the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Loads and stores into peers' memory mapped here (shared memory, NVLink): every peer
    /// must be reached with direct access.
    Direct,
    /// Messages through connections (write, update-and-sync): any transport.
    Channel,
    /// Steps over sub-communicators of the nodes and of the rails across them: a job of
    /// several nodes that form a grid ([`comm_core::topology::NodeGrid`]) with more than one
    /// rank per node.
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 14] = [
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::TwoShotLl128,
        Algorithm::TwoPhase,
        Algorithm::Ring,
        Algorithm::Direct,
        Algorithm::ChannelRing,
        Algorithm::ChannelDirect,
        Algorithm::ChannelEager,
        Algorithm::ChannelDoubling,
        Algorithm::ChannelHalving,
        Algorithm::ChannelBruck,
        Algorithm::ChannelTree,
        Algorithm::Hierarchical,
    ];

    /// The snake-case name (`one_shot`).
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::OneShot => "one_shot",
            Algorithm::TwoShot => "two_shot",
            Algorithm::TwoShotLl128 => "two_shot_ll128",
            Algorithm::TwoPhase => "two_phase",
            Algorithm::Ring => "ring",
            Algorithm::Direct => "direct",
            Algorithm::ChannelRing => "channel_ring",
            Algorithm::ChannelDirect => "channel_direct",
            Algorithm::ChannelEager => "channel_eager",
            Algorithm::ChannelDoubling => "channel_doubling",
            Algorithm::ChannelHalving => "channel_halving",
            Algorithm::ChannelBruck => "channel_bruck",
            Algorithm::ChannelTree => "channel_tree",
            Algorithm::Hierarchical => "hierarchical",
        }
    }

    /// The family this algorithm belongs to.
    pub const fn family(self) -> Family {
        match self {
            Algorithm::ChannelRing
            | Algorithm::ChannelDirect
            | Algorithm::ChannelEager
            | Algorithm::ChannelDoubling
            | Algorithm::ChannelHalving
            | Algorithm::ChannelBruck
            | Algorithm::ChannelTree => Family::Channel,
            Algorithm::Hierarchical => Family::Hierarchical,
            _ => Family::Direct,
        }
    }

    /// Parses a name as printed by [`name`](Self::name).
    pub fn parse(s: &str) -> Option<Algorithm> {
        let s = s.trim().to_ascii_lowercase().replace('-', "_");
        Algorithm::ALL.into_iter().find(|a| a.name() == s)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
