//! The model itself: a plan's shape and what it costs on a fabric (`steps × α + bytes × β +
//! reduced × γ`, see the parent module), the plan weave's algorithm table picks as a shape, and
//! the least-squares fit of a fabric's constants to measured points.

use std::sync::LazyLock;

use collectives::select::cost;
use collectives::{AlgorithmTable, Collective, Family, MemorySpace};

/// One fabric's constants (µs per step, per byte, per reduced byte).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Fabric {
    pub(super) name: &'static str,
    pub(super) alpha: f64,
    pub(super) beta: f64,
    pub(super) gamma: f64,
    /// Where ranks share cores (one host with more ranks than CPUs): the CPUs, and the time
    /// of a step then per rank queued on a core, when a message waits for the scheduler to
    /// run its receiver. 0: ranks never share.
    pub(super) cores: usize,
    pub(super) alpha_shared: f64,
}

impl Fabric {
    /// A fabric whose ranks never share cores.
    pub(super) const fn network(name: &'static str, alpha: f64, beta: f64) -> Fabric {
        Fabric { name, alpha, beta, gamma: 0.0, cores: 0, alpha_shared: alpha }
    }
}

/// The network between nodes in the predictions: collectives' [`cost::NETWORK`] (100 Gbit/s,
/// 5 µs a step; the measured fabrics here are slower).
pub(super) const NETWORK: Fabric =
    Fabric::network("network (100 Gbit/s, 5 µs)", cost::NETWORK.step_us, cost::NETWORK.us_per_byte);
/// TCP between namespace nodes at 10 Gbit/s (docs/perf-log/nodes.md, "Across nodes: faults, hierarchical plans, device buffers" and "Across nodes: weave vs Open MPI on 2 namespace nodes × 2 ranks": 8 B all-reduce
/// over 2 nodes ≈ 26 µs, 64 MiB at 50 % of the link).
pub(super) const TCP_10G: Fabric = Fabric::network("tcp (perf-log figure)", 26.0, 8.0 / 5e3);
/// SoftRoCE in a QEMU guest (docs/perf-log/infiniband.md: 25.6 µs a message, ≈ 40 MB/s).
pub(super) const SOFTROCE: Fabric = Fabric::network("softroce (perf-log figures)", 25.6, 1.0 / 40.0);
/// H200 NVLink: collectives' [`cost::NVLINK_H200`] (≈ 5 µs small all-reduce between 2 GPUs,
/// ≈ 360 GB/s busbw).
pub(super) const NVLINK: Fabric =
    Fabric::network("nvlink (H200)", cost::NVLINK_H200.step_us, cost::NVLINK_H200.us_per_byte);

/// A collective the model covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    AllReduce,
    AllGather,
    /// One message of `m` bytes from one rank to another (the point-to-point benches).
    Send,
}

/// The shapes of the plans: what each costs in steps, bytes sent and bytes reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// Every rank reads every peer's data in one step (the direct family on one host).
    OneShot,
    /// Reduce-scatter then all-gather through shared scratch (the direct family's two phases).
    TwoPhase,
    /// Neighbour ring: `n - 1` steps each way.
    Ring,
    /// Recursive doubling (all-reduce): `log2 p` swaps of the whole buffer, two more steps for
    /// ranks outside the power of two `p`.
    Doubling,
    /// Recursive halving then doubling (Rabenseifner).
    Halving,
    /// Bruck's all-gather: `ceil(log2 n)` steps.
    Bruck,
    /// One hop to every peer, in lockstep (channel direct); for a send, the one message.
    OneHop,
    /// Messages back to back, as a bandwidth test sends them: the time per message, whose
    /// latency overlaps the others' (bytes only, no step).
    Stream,
}

/// Steps, bytes sent and bytes reduced on the critical path of `shape` for `op` with `n` ranks
/// and a call of `m` bytes (all-gather: the output buffer).
pub(super) fn counts(op: Op, shape: Shape, n: usize, m: f64) -> (f64, f64, f64) {
    let nf = n as f64;
    if n <= 1 {
        return (0.0, 0.0, 0.0);
    }
    let p = 1usize << n.ilog2();
    let (pf, lg) = (p as f64, f64::from(p.ilog2()));
    let extra = if p == n { 0.0 } else { 2.0 };
    match (op, shape) {
        (Op::Send, Shape::Stream) => (0.0, m, 0.0),
        (Op::Send, _) => (1.0, m, 0.0),
        (Op::AllReduce | Op::AllGather, Shape::Stream) => {
            let (_, b, r) = counts(op, Shape::OneHop, n, m);
            (0.0, b, r)
        }
        (Op::AllReduce, Shape::OneShot) => (2.0, (nf - 1.0) * m, (nf - 1.0) * m),
        (Op::AllReduce, Shape::TwoPhase) => (3.0, 2.0 * (nf - 1.0) / nf * m, (nf - 1.0) / nf * m),
        (Op::AllReduce, Shape::Ring) => (2.0 * (nf - 1.0), 2.0 * (nf - 1.0) / nf * m, (nf - 1.0) / nf * m),
        (Op::AllReduce, Shape::Doubling) => (lg + extra, (lg + extra) * m, (lg + extra / 2.0) * m),
        (Op::AllReduce, Shape::Halving) => {
            (2.0 * lg + extra, 2.0 * (pf - 1.0) / pf * m + extra * m, (pf - 1.0) / pf * m + extra / 2.0 * m)
        }
        // Channel direct: the whole buffer to every peer in one hop, each rank reduces all.
        (Op::AllReduce, Shape::OneHop) => (1.0, (nf - 1.0) * m, (nf - 1.0) * m),
        (Op::AllReduce, Shape::Bruck) => (2.0 * (nf - 1.0), 2.0 * (nf - 1.0) / nf * m, (nf - 1.0) / nf * m),
        (Op::AllGather, Shape::Bruck | Shape::Doubling | Shape::Halving) => {
            (f64::from(n.next_power_of_two().ilog2()), (nf - 1.0) / nf * m, 0.0)
        }
        (Op::AllGather, Shape::OneShot | Shape::TwoPhase | Shape::OneHop) => (1.0, (nf - 1.0) / nf * m, 0.0),
        (Op::AllGather, Shape::Ring) => (nf - 1.0, (nf - 1.0) / nf * m, 0.0),
    }
}

/// The model's features of `shape` for `n` ranks and `m` bytes on a fabric with `cores` CPUs
/// (0: ranks never share): steps alone, steps sharing cores, bytes and reduced bytes — the
/// last three times the ranks per core where they share: a step then waits for every rank
/// queued on a core to run, and a rank gets that share of a CPU for its bytes.
pub(super) fn features(op: Op, shape: Shape, n: usize, m: f64, cores: usize) -> [f64; 4] {
    let (s, b, r) = counts(op, shape, n, m);
    let shared = cores > 0 && n > cores;
    let per_core = if shared { n as f64 / cores as f64 } else { 1.0 };
    if shared { [0.0, s * per_core, b * per_core, r * per_core] } else { [s, 0.0, b, r] }
}

/// The model's time (µs) of `shape` on `fabric`.
pub(super) fn time(f: &Fabric, op: Op, shape: Shape, n: usize, m: f64) -> f64 {
    let x = features(op, shape, n, m, f.cores);
    x[0] * f.alpha + x[1] * f.alpha_shared + x[2] * f.beta + x[3] * f.gamma
}

/// The shape of a plan by the algorithm name weave prints (`None`: not modelled).
pub(super) fn shape_of(algorithm: &str) -> Option<Shape> {
    Some(match algorithm {
        "one_shot" => Shape::OneShot,
        "two_phase" | "two_shot" | "two_shot_ll128" => Shape::TwoPhase,
        "ring" | "channel_ring" => Shape::Ring,
        "channel_doubling" => Shape::Doubling,
        "channel_halving" => Shape::Halving,
        "channel_bruck" => Shape::Bruck,
        "direct" | "channel_direct" | "message" => Shape::OneHop,
        "stream" => Shape::Stream,
        _ => return None,
    })
}

/// The algorithm table of a communicator with one rank per node, as across a network.
static ACROSS_NODES: LazyLock<AlgorithmTable> = LazyLock::new(|| {
    let mut table = AlgorithmTable::default();
    table.for_one_rank_per_node();
    table
});

/// The algorithm table of the ranks of one node.
static INSIDE_A_NODE: LazyLock<AlgorithmTable> = LazyLock::new(AlgorithmTable::default);

/// The plan weave's algorithm table picks for a call of `m` bytes on `n` ranks, as a shape:
/// `across` a network (one rank per node: the channel family on host memory), or inside an
/// NVLink node (the direct family on an H200's device memory, sm_90). A point-to-point message
/// is one hop.
pub(super) fn weave_shape(op: Op, n: usize, m: f64, across: bool) -> Shape {
    let collective = match op {
        Op::AllReduce => Collective::AllReduce,
        Op::AllGather => Collective::AllGather,
        Op::Send => return Shape::OneHop,
    };
    let (table, memory, arch, family) = if across {
        (&*ACROSS_NODES, MemorySpace::Host, None, Family::Channel)
    } else {
        (&*INSIDE_A_NODE, MemorySpace::Device, Some(90), Family::Direct)
    };
    let algorithm = table.select_among(collective, memory, n, m as usize, arch, &[family]);
    // Every algorithm the table picks for these calls has a shape (a test checks it); a ring
    // is the model's reading of anything else.
    algorithm.ok().and_then(|a| shape_of(a.name())).unwrap_or(Shape::Ring)
}

/// Hierarchical all-reduce / all-gather over `nodes` nodes of `per_node` ranks: the step inside
/// the node on `intra`, the step across nodes (one rank per node and rail, `1 / per_node` of
/// the data) on `inter` with weave's shape for that world, and the closing step inside.
pub(super) fn hierarchical(op: Op, intra: &Fabric, inter: &Fabric, nodes: usize, per_node: usize, m: f64) -> f64 {
    let shard = m / per_node as f64;
    let across = time(inter, op, weave_shape(op, nodes, shard, true), nodes, shard);
    // All-reduce: reduce-scatter in the node, all-reduce of each shard across, all-gather in
    // the node (the two node steps cost one node all-reduce); all-gather: across, then inside.
    time(intra, op, weave_shape(op, per_node, m, false), per_node, m) + across
}

/// Least-squares α, α shared, β, γ ≥ 0 for `points` on a host of `cores` CPUs (a constant the
/// points say nothing of, or that comes out negative, is dropped and the rest refitted).
pub(super) fn fit(name: &'static str, cores: usize, points: &[(Op, Shape, usize, f64, f64)]) -> Fabric {
    let rows: Vec<([f64; 4], f64)> =
        points.iter().map(|&(op, shape, n, m, t)| (features(op, shape, n, m, cores), t)).collect();
    let mut used = [0, 1, 2, 3].map(|k| rows.iter().any(|(x, _)| x[k] != 0.0));
    loop {
        let idx: Vec<usize> = (0..4).filter(|&k| used[k]).collect();
        let k = idx.len();
        let mut a = vec![vec![0.0; k + 1]; k];
        // Weighted by 1 / t²: relative errors, so small calls count as much as large ones.
        for (x, t) in &rows {
            let w = 1.0 / (t * t).max(1e-12);
            for (i, &p) in idx.iter().enumerate() {
                for (j, &q) in idx.iter().enumerate() {
                    a[i][j] += w * x[p] * x[q];
                }
                a[i][k] += w * x[p] * t;
            }
        }
        let solved = solve(&mut a);
        let mut c = [0.0; 4];
        if let Some(sol) = &solved {
            for (i, &p) in idx.iter().enumerate() {
                c[p] = sol[i];
            }
        }
        match (0..4).find(|&p| used[p] && (solved.is_none() || c[p] < 0.0)) {
            Some(p) if k > 1 => used[p] = false,
            _ => {
                let [alpha, alpha_shared, beta, gamma] = c.map(|v: f64| v.max(0.0));
                return Fabric { name, alpha, beta, gamma, cores, alpha_shared };
            }
        }
    }
}

/// Solves the augmented system `a` (k rows of k + 1) by Gaussian elimination; `None` if singular.
pub(super) fn solve(a: &mut [Vec<f64>]) -> Option<Vec<f64>> {
    let k = a.len();
    for col in 0..k {
        let pivot = (col..k).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (row, r) in a.iter_mut().enumerate() {
            if row != col {
                let f = r[col] / pivot_row[col];
                for (x, p) in r[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i]).collect())
}

/// CPUs online on this host (where the shm points were measured).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_textbook_shapes() {
        // Ring all-reduce of 8 ranks: 14 steps, 2·7/8 of the buffer sent.
        assert_eq!(counts(Op::AllReduce, Shape::Ring, 8, 8.0), (14.0, 14.0, 7.0));
        // Doubling: log2 8 = 3 swaps; 9 ranks fold the extra one in and out (+2).
        assert_eq!(counts(Op::AllReduce, Shape::Doubling, 8, 1.0).0, 3.0);
        assert_eq!(counts(Op::AllReduce, Shape::Doubling, 9, 1.0).0, 5.0);
        // Bruck all-gather: ceil(log2 n) steps for any n.
        assert_eq!(counts(Op::AllGather, Shape::Bruck, 5, 5.0).0, 3.0);
        assert_eq!(counts(Op::AllGather, Shape::Bruck, 65536, 1.0).0, 16.0);
        // Channel direct all-reduce: the whole buffer to each of the 3 peers in one hop.
        assert_eq!(counts(Op::AllReduce, Shape::OneHop, 4, 8.0), (1.0, 24.0, 24.0));
        // A message is one step; a stream of them costs bytes only.
        assert_eq!(counts(Op::Send, Shape::OneHop, 2, 64.0), (1.0, 64.0, 0.0));
        assert_eq!(counts(Op::Send, Shape::Stream, 2, 64.0), (0.0, 64.0, 0.0));
    }

    #[test]
    fn the_fit_recovers_the_constants_that_made_the_points() {
        let truth = Fabric { name: "t", alpha: 0.7, beta: 0.002, gamma: 0.0005, cores: 4, alpha_shared: 9.0 };
        let mut pts = Vec::new();
        for (op, shape) in
            [(Op::AllReduce, Shape::Ring), (Op::AllReduce, Shape::Doubling), (Op::AllGather, Shape::Bruck)]
        {
            for n in [2usize, 3, 8, 64] {
                for m in [8.0, 4096.0, 1048576.0] {
                    pts.push((op, shape, n, m, time(&truth, op, shape, n, m)));
                }
            }
        }
        let f = fit("t", 4, &pts);
        for (got, want) in
            [(f.alpha, truth.alpha), (f.alpha_shared, truth.alpha_shared), (f.beta, truth.beta), (f.gamma, truth.gamma)]
        {
            assert!((got - want).abs() <= 1e-6 * want.max(1e-9), "fitted {got}, made with {want}");
        }
    }

    #[test]
    fn logarithmic_plans_beat_the_ring_for_small_calls_of_large_worlds_only() {
        let small = 8.0;
        assert!(
            time(&NETWORK, Op::AllReduce, Shape::Doubling, 4096, small)
                < time(&NETWORK, Op::AllReduce, Shape::Ring, 4096, small)
        );
        let huge = 1073741824.0;
        assert!(
            time(&NETWORK, Op::AllReduce, Shape::Ring, 4096, huge)
                < time(&NETWORK, Op::AllReduce, Shape::Doubling, 4096, huge)
        );
    }

    #[test]
    fn every_plan_the_table_picks_has_a_shape() {
        let mut across = AlgorithmTable::default();
        across.for_one_rank_per_node();
        let inside = AlgorithmTable::default();
        for c in [Collective::AllReduce, Collective::AllGather] {
            for n in [2usize, 3, 8, 9, 64, 65536] {
                for k in 0..=30 {
                    let m = 1usize << k;
                    let picked = [
                        across.select_among(c, MemorySpace::Host, n, m, None, &[Family::Channel]),
                        inside.select_among(c, MemorySpace::Device, n.min(8), m, Some(90), &[Family::Direct]),
                    ];
                    for a in picked {
                        let a = a.unwrap_or_else(|e| panic!("{c} on {n} ranks, {m} B: {e}"));
                        assert!(
                            shape_of(a.name()).is_some(),
                            "{c} on {n} ranks, {m} B: the model has no shape for {a}"
                        );
                    }
                }
            }
        }
        // The table's small-call plans across nodes are logarithmic from 4 ranks.
        assert_eq!(weave_shape(Op::AllReduce, 64, 8.0, true), Shape::Doubling);
        assert_eq!(weave_shape(Op::AllReduce, 8, 8.0, false), Shape::OneShot);
    }
}
