//! The algorithm table: which algorithm runs a collective, as data.
//!
//! Each [`Row`] maps (collective, memory space, GPU architecture, world-size range, byte range)
//! to an [`Algorithm`]; the first matching row wins. `WEAVE_ALGO` (or
//! [`AlgorithmTable::set_override`]) forces an algorithm per collective. The GPU path adds its
//! rows to the same table.

use comm_core::{Error, Result};

pub use super::algorithm::{Algorithm, Collective, Family, MemorySpace};

/// Where the table's rows say an algorithm runs.
impl Algorithm {
    /// Whether the GPU path implements this algorithm for `c`: some device row names it.
    pub fn runs_on_device(self, c: Collective) -> bool {
        HIERARCHICAL_DEVICE_ROWS
            .iter()
            .chain(DEVICE_ROWS)
            .chain(CHANNEL_DEVICE_ROWS)
            .any(|r| r.collective == c && r.algorithm == self)
    }

    /// Whether the host path implements this algorithm for `c`: some host row (of either
    /// family) names it.
    pub fn runs_on_host(self, c: Collective) -> bool {
        HIERARCHICAL_HOST_ROWS
            .iter()
            .chain(HOST_ROWS)
            .chain(CHANNEL_HOST_ROWS)
            .any(|r| r.collective == c && r.algorithm == self)
    }
}

/// One row of the table. Ranges are inclusive of the minimum and exclusive of the maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The collective.
    pub collective: Collective,
    /// Where the buffers live.
    pub memory: MemorySpace,
    /// GPU architecture the row is tuned for, as compute capability × 10 (90 for H100 and
    /// H200); `None` for any (host rows, generic GPU rows).
    pub arch: Option<u32>,
    /// Smallest world size (inclusive).
    pub min_ranks: usize,
    /// Largest world size (exclusive).
    pub max_ranks: usize,
    /// Smallest message in bytes (inclusive).
    pub min_bytes: usize,
    /// Largest message in bytes (exclusive).
    pub max_bytes: usize,
    /// What runs.
    pub algorithm: Algorithm,
}

const ANY: usize = usize::MAX;
/// Broadcasts and reduces below this many bytes run eagerly (`channel_eager`) on host memory,
/// even where every peer is mapped: the senders return without waiting for a receiver, as in
/// MPI's eager protocol, so back-to-back calls overlap. The price: a mismatched call fails
/// only on the ranks that receive, and a root that differs between ranks surfaces at a later
/// call or as a timeout (see `channel::eager`).
const EAGER_BYTES: usize = 4097;
/// From this many ranks on, small calls run the logarithmic channel algorithms (recursive
/// doubling and halving, Bruck, binomial trees: `log2 n` steps) instead of the one-hop and ring
/// ones (`n - 1` steps), on either family's rows; smaller worlds keep the one-hop algorithms,
/// which are faster there (docs/perf-log/cpu-host.md, "Large worlds: logarithmic algorithms and
/// thread-ranks").
const LOG_WORLD: usize = 9;

const fn host(c: Collective, ranks: (usize, usize), bytes: (usize, usize), a: Algorithm) -> Row {
    Row {
        collective: c,
        memory: MemorySpace::Host,
        arch: None,
        min_ranks: ranks.0,
        max_ranks: ranks.1,
        min_bytes: bytes.0,
        max_bytes: bytes.1,
        algorithm: a,
    }
}

/// The host rows for jobs of several nodes in a grid (first in the table, so they win where
/// the topology lets them run): every collective whose data can be split into a part inside
/// each node and a part across nodes. All-to-all(v) and send/recv already cross the network
/// once per byte over the channel rows.
pub const HIERARCHICAL_HOST_ROWS: &[Row] = {
    use Algorithm::*;
    use Collective::*;
    &[
        // At every size: one crossing of the network (a small all-reduce on one rail) and
        // node steps in shared memory beat a flat hop that sends a TCP message per peer
        // (docs/perf-log/nodes.md, "Across nodes: the hierarchical all-reduce crosses the network
        // once", and "Across nodes: small calls on one rail").
        host(AllReduce, (1, ANY), (0, ANY), Hierarchical),
        host(AllGather, (1, ANY), (0, ANY), Hierarchical),
        // Below 64 KiB one flat hop beats three steps.
        host(ReduceScatter, (1, ANY), (64 << 10, ANY), Hierarchical),
        // The root's data crosses the network once per node instead of once per rank.
        host(Broadcast, (1, ANY), (0, ANY), Hierarchical),
        host(Reduce, (1, ANY), (0, ANY), Hierarchical),
    ]
};

/// The device rows for jobs of several nodes in a grid (first in the table, as the host ones):
/// steps of device calls over the node and rail sub-communicators, with device staging and
/// copies on the caller's stream where blocks are reordered or a node's partial result is
/// held (`hierarchy/device.rs`). All-reduce and all-gather start at 64 KiB, where the host rows
/// started before their small calls were measured: the device all-reduce still crosses the
/// network twice per call, and device timings across nodes are still to be taken.
pub const HIERARCHICAL_DEVICE_ROWS: &[Row] = {
    use Algorithm::*;
    use Collective::*;
    &[
        device(ANY_GPU, AllReduce, (1, ANY), (64 << 10, ANY), Hierarchical),
        device(ANY_GPU, AllGather, (1, ANY), (64 << 10, ANY), Hierarchical),
        device(ANY_GPU, ReduceScatter, (1, ANY), (64 << 10, ANY), Hierarchical),
        device(ANY_GPU, Broadcast, (1, ANY), (0, ANY), Hierarchical),
        device(ANY_GPU, Reduce, (1, ANY), (0, ANY), Hierarchical),
    ]
};

/// Rows put in front of the others on a host whose ranks outnumber its cores
/// ([`AlgorithmTable::for_crowded_host`]): there every step of a logarithmic algorithm waits
/// for the scheduler to run its partner, while the workspace's one-shot all-reduce needs one
/// arrival of every rank. On the 2-core machine, 8 B: 82 / 178 / 820 µs at 32 / 64 / 128
/// processes against doubling's 279 / 633 / 1,897 (docs/perf-log/cpu-host.md, "Many ranks on one
/// host: the issue's table again"). Up to 128 ranks: beyond, each rank reading every peer's
/// scratch outgrows the scheduling it saves.
pub const CROWDED_HOST_ROWS: &[Row] = {
    use Algorithm::*;
    use Collective::*;
    &[host(AllReduce, (LOG_WORLD, 129), (0, 16 << 10), OneShot)]
};

/// Rows put in front of the others where every rank is a node of its own
/// ([`AlgorithmTable::for_one_rank_per_node`]: jobs of one rank per host, and the rails of
/// hierarchical calls): every message then crosses the network, where the one-hop
/// `channel_direct` sends `n − 1` messages a rank at once, which queue behind each other on
/// each node's link, and a step of recursive doubling sends one; from 32 KiB, halving's
/// reduce-scatter and all-gather move a fraction of the bytes doubling does, in as few
/// messages at once, up to where the ring's pipeline catches up. Powers of two only: at 3
/// ranks doubling's fold step lost to the one hop (docs/perf-log/nodes.md, "Across nodes: one rank
/// per node, small all-reduces by recursive doubling").
pub const ONE_RANK_PER_NODE_ROWS: &[Row] = {
    use Algorithm::*;
    use Collective::*;
    &[
        host(AllReduce, (4, 5), (0, 32 << 10), ChannelDoubling),
        host(AllReduce, (8, 9), (0, 32 << 10), ChannelDoubling),
        host(AllReduce, (4, 5), (0, 1 << 20), ChannelHalving),
        host(AllReduce, (8, 9), (0, 1 << 20), ChannelHalving),
    ]
};

/// The host rows, tuned on a 2-core x86 machine (see docs/PERFORMANCE.md, "CPUs of one host", and
/// docs/perf-log/cpu-host.md). "Bytes" is the size of the largest buffer of the call (the
/// receive buffer of an all-gather, the send buffer of a reduce-scatter), as in the nccl-tests
/// tables.
pub const HOST_ROWS: &[Row] = {
    use Algorithm::*;
    use Collective::*;
    &[
        // Large worlds, small calls: log2(n) steps instead of n - 1 (see LOG_WORLD).
        host(AllReduce, (LOG_WORLD, ANY), (0, 16 << 10), ChannelDoubling),
        host(AllGather, (LOG_WORLD, 64), (0, 16 << 10), ChannelBruck),
        host(AllGather, (64, 512), (0, 128 << 10), ChannelBruck),
        host(AllGather, (512, ANY), (0, 1 << 20), ChannelBruck),
        host(ReduceScatter, (LOG_WORLD, 64), (0, 16 << 10), ChannelHalving),
        host(ReduceScatter, (64, 512), (0, 128 << 10), ChannelHalving),
        host(ReduceScatter, (512, ANY), (0, 1 << 20), ChannelHalving),
        host(AllToAll, (LOG_WORLD, 64), (0, 16 << 10), ChannelBruck),
        host(AllToAll, (64, 512), (0, 128 << 10), ChannelBruck),
        host(AllToAll, (512, ANY), (0, 1 << 20), ChannelBruck),
        host(Broadcast, (LOG_WORLD, ANY), (0, 64 << 10), ChannelTree),
        host(Reduce, (LOG_WORLD, ANY), (0, 64 << 10), ChannelTree),
        host(AllReduce, (1, 9), (0, 64 << 10), OneShot),
        host(AllReduce, (1, 64), (0, 16 << 10), OneShot),
        host(AllReduce, (1, 64), (0, ANY), TwoPhase),
        // From 64 ranks halving's 2·log2(n) steps beat the ring's 2(n − 1) up to 1 MiB, 3× at
        // 64 KiB–512 KiB with 64 thread ranks (docs/SCALE.md); both move the same bytes.
        host(AllReduce, (64, ANY), (0, 1 << 20), ChannelHalving),
        host(AllReduce, (64, ANY), (0, ANY), Ring),
        host(AllGather, (1, 64), (0, ANY), Direct),
        host(AllGather, (64, ANY), (0, ANY), Ring),
        host(ReduceScatter, (1, 64), (0, ANY), Direct),
        host(ReduceScatter, (64, ANY), (0, ANY), Ring),
        host(Broadcast, (1, 9), (0, EAGER_BYTES), ChannelEager),
        host(Broadcast, (1, ANY), (0, ANY), Direct),
        host(Reduce, (1, 9), (0, EAGER_BYTES), ChannelEager),
        host(Reduce, (1, 9), (0, 64 << 10), OneShot),
        host(Reduce, (1, ANY), (0, ANY), TwoPhase),
        host(AllToAll, (1, ANY), (0, ANY), Direct),
        host(AllToAllv, (1, ANY), (0, ANY), Direct),
        host(SendRecv, (1, ANY), (0, ANY), Direct),
    ]
};

/// The host rows of the channel family: they run wherever the direct rows cannot (a peer
/// without direct access) or when `WEAVE_ALGO=channel` asks for them. One hop (direct) for
/// small calls of small worlds, the ring and chains otherwise.
pub const CHANNEL_HOST_ROWS: &[Row] = {
    use Algorithm::*;
    use Collective::*;
    const K: usize = 1 << 10;
    const M: usize = 1 << 20;
    &[
        host(AllReduce, (1, 9), (0, 64 * K), ChannelDirect),
        host(AllReduce, (LOG_WORLD, ANY), (0, 16 * K), ChannelDoubling),
        host(AllReduce, (LOG_WORLD, ANY), (0, M), ChannelHalving),
        host(AllReduce, (1, ANY), (0, ANY), ChannelRing),
        host(AllGather, (1, 9), (0, 256 * K), ChannelDirect),
        // Bruck moves the same bytes as the ring (n - 1 blocks per rank) in log2(n) steps.
        host(AllGather, (LOG_WORLD, ANY), (0, M), ChannelBruck),
        host(AllGather, (1, ANY), (0, ANY), ChannelRing),
        host(ReduceScatter, (1, 9), (0, 256 * K), ChannelDirect),
        host(ReduceScatter, (LOG_WORLD, ANY), (0, M), ChannelHalving),
        host(ReduceScatter, (1, ANY), (0, ANY), ChannelRing),
        host(Broadcast, (1, 9), (0, EAGER_BYTES), ChannelEager),
        host(Broadcast, (1, 9), (0, 64 * K), ChannelDirect),
        host(Broadcast, (LOG_WORLD, ANY), (0, 64 * K), ChannelTree),
        host(Broadcast, (1, ANY), (0, ANY), ChannelRing),
        host(Reduce, (1, 9), (0, EAGER_BYTES), ChannelEager),
        host(Reduce, (1, 9), (0, 64 * K), ChannelDirect),
        host(Reduce, (LOG_WORLD, ANY), (0, 64 * K), ChannelTree),
        host(Reduce, (1, ANY), (0, ANY), ChannelRing),
        // Bruck moves every block up to log2(n) times: only while the blocks are small.
        host(AllToAll, (LOG_WORLD, 64), (0, 16 * K), ChannelBruck),
        host(AllToAll, (64, 512), (0, 128 * K), ChannelBruck),
        host(AllToAll, (512, ANY), (0, M), ChannelBruck),
        host(AllToAll, (1, ANY), (0, ANY), ChannelDirect),
        host(AllToAllv, (1, ANY), (0, ANY), ChannelDirect),
        host(SendRecv, (1, ANY), (0, ANY), ChannelDirect),
        // Forced (`WEAVE_ALGO=channel_eager`) for calls of any size.
        host(Broadcast, (1, ANY), (0, ANY), ChannelEager),
        host(Reduce, (1, ANY), (0, ANY), ChannelEager),
    ]
};

const fn device(arch: Option<u32>, c: Collective, ranks: (usize, usize), bytes: (usize, usize), a: Algorithm) -> Row {
    Row {
        collective: c,
        memory: MemorySpace::Device,
        arch,
        min_ranks: ranks.0,
        max_ranks: ranks.1,
        min_bytes: bytes.0,
        max_bytes: bytes.1,
        algorithm: a,
    }
}

const HOPPER: Option<u32> = Some(90);
const ANY_GPU: Option<u32> = None;

/// The GPU rows (one host's GPUs over NVLink or PCIe, at most 8). Small messages go as LL
/// packets without any barrier (one-shot; two-shot for medium all-reduces, as LL128 lines on
/// sm_90 when every GPU pair is joined by NVLink, else as LL16 packets), large ones through
/// the block-pipelined kernels. The thresholds come from H200 sweeps for 2 and for 4 GPUs
/// (docs/perf-log/gpu.md, "Tuning notes"); the generic rows (any architecture, or
/// GPUs of different kinds) use the same crossovers until measured elsewhere.
pub const DEVICE_ROWS: &[Row] = {
    use Algorithm::*;
    use Collective::*;
    const K: usize = 1 << 10;
    const M: usize = 1 << 20;
    &[
        // sm_90, 2 GPUs: LL128 lines from 512 KiB up to 3.75 MiB, then the pipelined kernel.
        device(HOPPER, AllReduce, (2, 3), (0, 512 * K), OneShot),
        device(HOPPER, AllReduce, (2, 3), (512 * K, 4 * M), TwoShotLl128),
        device(HOPPER, AllGather, (2, 3), (0, 2 * M), OneShot),
        device(HOPPER, ReduceScatter, (2, 3), (0, 2 * M), OneShot),
        device(HOPPER, AllToAll, (2, 3), (0, 2 * M), OneShot),
        device(HOPPER, Broadcast, (2, 3), (0, M), OneShot),
        // sm_90, 3 to 8 GPUs: LL128 two-shot beats LL16 and the pipelined kernel in its range.
        device(HOPPER, AllReduce, (3, 9), (0, 512 * K), OneShot),
        device(HOPPER, AllReduce, (3, 9), (512 * K, 4 * M), TwoShotLl128),
        device(HOPPER, AllGather, (3, 9), (0, 2 * M), OneShot),
        device(HOPPER, ReduceScatter, (3, 9), (0, 2 * M), OneShot),
        device(HOPPER, AllToAll, (3, 9), (0, 2 * M), OneShot),
        device(HOPPER, Broadcast, (3, 9), (0, 512 * K), OneShot),
        device(HOPPER, Broadcast, (3, 9), (512 * K, ANY), Ring),
        // Any GPU.
        device(ANY_GPU, AllReduce, (1, 9), (0, 64 * K), OneShot),
        device(ANY_GPU, AllReduce, (1, 9), (0, M), TwoShot),
        device(ANY_GPU, AllReduce, (1, 9), (0, ANY), TwoPhase),
        device(ANY_GPU, AllGather, (1, 9), (0, 256 * K), OneShot),
        device(ANY_GPU, AllGather, (1, 9), (0, ANY), Direct),
        device(ANY_GPU, ReduceScatter, (1, 9), (0, 256 * K), OneShot),
        device(ANY_GPU, ReduceScatter, (1, 9), (0, ANY), Direct),
        device(ANY_GPU, AllToAll, (1, 9), (0, 256 * K), OneShot),
        device(ANY_GPU, AllToAll, (1, 9), (0, ANY), Direct),
        device(ANY_GPU, Broadcast, (1, 9), (0, 128 * K), OneShot),
        device(ANY_GPU, Broadcast, (3, 9), (64 * M, ANY), Ring),
        device(ANY_GPU, Broadcast, (1, 9), (0, ANY), TwoPhase),
        device(ANY_GPU, Reduce, (1, 9), (0, 128 * K), OneShot),
        device(ANY_GPU, Reduce, (1, 9), (0, ANY), Direct),
        device(ANY_GPU, AllToAllv, (1, 9), (0, ANY), Direct),
        device(ANY_GPU, SendRecv, (1, 9), (0, ANY), Direct),
    ]
};

/// The device rows of the channel family: they run wherever the direct kernels cannot (more
/// than 8 GPUs) or when `WEAVE_ALGO=channel` asks for them; the same shape as the host's
/// ([`CHANNEL_HOST_ROWS`]), the logarithmic algorithms included (same worlds, same sizes,
/// until measured on GPUs).
pub const CHANNEL_DEVICE_ROWS: &[Row] = {
    use Algorithm::*;
    use Collective::*;
    const K: usize = 1 << 10;
    const M: usize = 1 << 20;
    &[
        device(ANY_GPU, AllReduce, (1, 9), (0, 64 * K), ChannelDirect),
        device(ANY_GPU, AllReduce, (LOG_WORLD, ANY), (0, 16 * K), ChannelDoubling),
        device(ANY_GPU, AllReduce, (LOG_WORLD, ANY), (0, M), ChannelHalving),
        device(ANY_GPU, AllReduce, (1, ANY), (0, ANY), ChannelRing),
        device(ANY_GPU, AllGather, (1, 9), (0, 256 * K), ChannelDirect),
        device(ANY_GPU, AllGather, (LOG_WORLD, ANY), (0, M), ChannelBruck),
        device(ANY_GPU, AllGather, (1, ANY), (0, ANY), ChannelRing),
        device(ANY_GPU, ReduceScatter, (1, 9), (0, 256 * K), ChannelDirect),
        device(ANY_GPU, ReduceScatter, (LOG_WORLD, ANY), (0, M), ChannelHalving),
        device(ANY_GPU, ReduceScatter, (1, ANY), (0, ANY), ChannelRing),
        device(ANY_GPU, Broadcast, (1, 9), (0, 64 * K), ChannelDirect),
        device(ANY_GPU, Broadcast, (LOG_WORLD, ANY), (0, 64 * K), ChannelTree),
        device(ANY_GPU, Broadcast, (1, ANY), (0, ANY), ChannelRing),
        device(ANY_GPU, Reduce, (1, 9), (0, 64 * K), ChannelDirect),
        device(ANY_GPU, Reduce, (LOG_WORLD, ANY), (0, 64 * K), ChannelTree),
        device(ANY_GPU, Reduce, (1, ANY), (0, ANY), ChannelRing),
        device(ANY_GPU, AllToAll, (LOG_WORLD, 64), (0, 16 * K), ChannelBruck),
        device(ANY_GPU, AllToAll, (64, 512), (0, 128 * K), ChannelBruck),
        device(ANY_GPU, AllToAll, (512, ANY), (0, M), ChannelBruck),
        device(ANY_GPU, AllToAll, (1, ANY), (0, ANY), ChannelDirect),
        device(ANY_GPU, AllToAllv, (1, ANY), (0, ANY), ChannelDirect),
        device(ANY_GPU, SendRecv, (1, ANY), (0, ANY), ChannelDirect),
    ]
};

/// The table a communicator consults, with its overrides.
#[derive(Debug, Clone)]
pub struct AlgorithmTable {
    rows: Vec<Row>,
    overrides: Vec<(Option<Collective>, Algorithm)>,
    family: Option<Family>,
}

impl Default for AlgorithmTable {
    fn default() -> Self {
        AlgorithmTable {
            rows: HIERARCHICAL_HOST_ROWS
                .iter()
                .chain(HIERARCHICAL_DEVICE_ROWS)
                .chain(HOST_ROWS)
                .chain(DEVICE_ROWS)
                .chain(CHANNEL_HOST_ROWS)
                .chain(CHANNEL_DEVICE_ROWS)
                .copied()
                .collect(),
            overrides: Vec::new(),
            family: None,
        }
    }
}

impl AlgorithmTable {
    /// The rows, first match wins.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Puts [`CROWDED_HOST_ROWS`] in front, unless they are there already: for a communicator
    /// whose host runs more ranks than it has cores (every rank of a one-host job sees the same
    /// host, so all agree).
    pub fn for_crowded_host(&mut self) {
        self.put_first(CROWDED_HOST_ROWS);
    }

    /// Puts [`ONE_RANK_PER_NODE_ROWS`] in front, unless they are there already: for a
    /// communicator whose every rank is on a node of its own (all its ranks see the same
    /// topology, so all agree).
    pub fn for_one_rank_per_node(&mut self) {
        self.put_first(ONE_RANK_PER_NODE_ROWS);
    }

    /// Puts `rows` in front of the existing rows, unless some row already holds them: a table
    /// copied from a parent communicator may have them.
    fn put_first(&mut self, rows: &[Row]) {
        if !self.rows.windows(rows.len()).any(|w| w == rows) {
            self.rows.splice(0..0, rows.iter().copied());
        }
    }

    /// Puts `row` in front of the existing rows.
    pub fn prepend(&mut self, row: Row) {
        self.rows.insert(0, row);
    }

    /// Forces `algorithm` for `collective` (or for every collective that has it, when `None`).
    pub fn set_override(&mut self, collective: Option<Collective>, algorithm: Algorithm) {
        self.overrides.retain(|(c, _)| *c != collective);
        self.overrides.push((collective, algorithm));
    }

    /// Drops the overrides that force `algorithm` (for a sub-communicator that cannot run it).
    pub fn clear_overrides_of(&mut self, algorithm: Algorithm) {
        self.overrides.retain(|(_, a)| *a != algorithm);
    }

    /// Restricts the rows to one family (`WEAVE_ALGO=channel`), where that family runs.
    pub fn set_family(&mut self, family: Option<Family>) {
        self.family = family;
    }

    /// The family the rows are restricted to, if any.
    pub fn family(&self) -> Option<Family> {
        self.family
    }

    /// Parses `WEAVE_ALGO`: `ring`, `channel` (the channel family's rows), or
    /// `all_reduce=one_shot,all_gather=channel_ring`.
    pub fn apply_overrides(&mut self, spec: &str) -> Result<()> {
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part.eq_ignore_ascii_case("channel") {
                self.family = Some(Family::Channel);
                continue;
            }
            let (c, a) = match part.split_once('=') {
                Some((c, a)) => {
                    let c = Collective::parse(c)
                        .ok_or_else(|| Error::invalid(format!("WEAVE_ALGO: unknown collective {c:?} in {part:?}")))?;
                    (Some(c), a)
                }
                None => (None, part),
            };
            let a = Algorithm::parse(a).ok_or_else(|| {
                Error::invalid(format!(
                    "WEAVE_ALGO: unknown algorithm {a:?}; expected channel or one of {}",
                    Algorithm::ALL.map(|a| a.name()).join(", ")
                ))
            })?;
            if let Some(c) = c
                && !a.runs_on_host(c)
                && !a.runs_on_device(c)
            {
                return Err(Error::invalid(format!("WEAVE_ALGO: {c} has no {a} algorithm")));
            }
            self.set_override(c, a);
        }
        Ok(())
    }

    /// The algorithm for this call on one node where every peer is mapped (the direct and
    /// channel families may run): an override that applies, else the first matching row that
    /// is not tied to a GPU architecture.
    pub fn select(&self, c: Collective, memory: MemorySpace, ranks: usize, bytes: usize) -> Result<Algorithm> {
        self.select_among(c, memory, ranks, bytes, None, &[Family::Direct, Family::Channel])
    }

    /// As [`select`](Self::select), on GPUs of architecture `arch` (compute capability × 10:
    /// rows tuned for `arch` and rows for any architecture match; `None`: any), among the
    /// algorithms of `families` only (the families the topology allows). An override outside
    /// them is an error naming why; with a family forced by [`set_family`](Self::set_family),
    /// its rows come first where it runs.
    pub fn select_among(
        &self,
        c: Collective,
        memory: MemorySpace,
        ranks: usize,
        bytes: usize,
        arch: Option<u32>,
        families: &[Family],
    ) -> Result<Algorithm> {
        let runs = |a: Algorithm| match memory {
            MemorySpace::Host => a.runs_on_host(c),
            MemorySpace::Device => a.runs_on_device(c),
        };
        if let Some((_, a)) = self.overrides.iter().rev().find(|(oc, a)| (*oc == Some(c) || oc.is_none()) && runs(*a)) {
            if !families.contains(&a.family()) {
                return Err(Error::Unsupported(format!(
                    "WEAVE_ALGO forces {a} for {c}, which needs direct access to every peer's memory; this \
                     communicator reaches some peers only through connections (use a channel algorithm)"
                )));
            }
            return Ok(*a);
        }
        let matching = |r: &&Row, family: Option<Family>| {
            r.collective == c
                && r.memory == memory
                && (r.arch.is_none() || r.arch == arch)
                && (r.min_ranks..r.max_ranks).contains(&ranks)
                && (r.min_bytes..r.max_bytes).contains(&bytes)
                && families.contains(&r.algorithm.family())
                && family.is_none_or(|f| r.algorithm.family() == f)
        };
        let forced = self.family.and_then(|f| self.rows.iter().find(|r| matching(r, Some(f))));
        forced.or_else(|| self.rows.iter().find(|r| matching(r, None))).map(|r| r.algorithm).ok_or_else(|| {
            Error::Unsupported(format!(
                "no algorithm for {c} on {memory:?} memory with {ranks} ranks and {bytes} bytes among the {} family",
                families.iter().map(|f| format!("{f:?}").to_lowercase()).collect::<Vec<_>>().join(" and ")
            ))
        })
    }
}

#[cfg(test)]
mod tests;
