//! What a plan costs: `steps × α + bytes × β + reduced bytes × γ` on a link of known constants
//! (the α-β-γ model). The steps are [`steps`]'s; the bytes are those one
//! rank sends and reduces on the plan's critical path. It answers "about how long", for
//! `ncclGroupSimulateEnd` and for planning around communication; the benchmark's scale model
//! (`weave-bench`) fits the same form to measured points.

use std::time::Duration;

use super::steps::{ceil_log2, steps};
use super::table::{Algorithm, Collective};

/// The constants of one kind of link: microseconds per step (α), per byte sent (β) and per byte
/// reduced (γ).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCost {
    /// Microseconds per sequential step.
    pub step_us: f64,
    /// Microseconds per byte one rank sends on the critical path.
    pub us_per_byte: f64,
    /// Microseconds per byte one rank reduces on the critical path.
    pub us_per_reduced_byte: f64,
}

/// Between GPUs of one H200 node over NVLink (docs/perf-log/gpu.md: a small all-reduce of about
/// 5 µs between two GPUs, about 360 GB/s bus bandwidth; the kernels reduce as fast as they
/// move).
pub const NVLINK_H200: LinkCost = LinkCost { step_us: 2.5, us_per_byte: 1.0 / 360e3, us_per_reduced_byte: 0.0 };

/// Between ranks of one host through shared memory (docs/perf-log/cpu-host.md, "CPUs: the
/// collectives layout, before and after", 2 cores: a small 2-rank all-reduce in 0.2–0.4 µs, a
/// 16 MiB one in 2.6–4.5 ms, 4–6 GB/s). γ, the sums' own rate, is a round guess, not fitted.
pub const SHARED_MEMORY: LinkCost = LinkCost { step_us: 0.25, us_per_byte: 1.0 / 5e3, us_per_reduced_byte: 1.0 / 10e3 };

/// Between nodes: 100 Gbit/s and 5 µs a step, a conservative InfiniBand / RoCE figure (γ as
/// for [`SHARED_MEMORY`]: the sums run on the CPU or GPU of the node).
pub const NETWORK: LinkCost = LinkCost { step_us: 5.0, us_per_byte: 8.0 / 100e3, us_per_reduced_byte: 1.0 / 10e3 };

/// Bytes one rank sends and bytes it reduces on the critical path of `algorithm` running
/// `collective` on `n` ranks, for a call whose largest buffer holds `bytes` (the output of an
/// all-gather, the input of a reduce-scatter, either buffer of an all-to-all), or `None` where
/// that depends on more than `n` (the hierarchical plans).
pub fn critical_bytes(collective: Collective, algorithm: Algorithm, n: usize, bytes: usize) -> Option<(f64, f64)> {
    use Algorithm::*;
    use Collective::*;
    if n <= 1 {
        return Some((0.0, 0.0));
    }
    let (m, nf) = (bytes as f64, n as f64);
    let p = 1usize << n.ilog2();
    let pf = p as f64;
    // Ranks outside the largest power of two fold their whole buffer in and get it back.
    let fold = if p == n { 0.0 } else { 1.0 };
    let lg = ceil_log2(n) as f64;
    let share = (nf - 1.0) / nf * m;
    Some(match (collective, algorithm) {
        (_, Hierarchical) => return None,
        (SendRecv, _) => (m, 0.0),
        (AllReduce, OneShot | Direct | ChannelDirect | ChannelEager) => ((nf - 1.0) * m, (nf - 1.0) * m),
        (AllReduce, ChannelDoubling) => ((f64::from(n.ilog2()) + 2.0 * fold) * m, (f64::from(n.ilog2()) + fold) * m),
        (AllReduce, ChannelHalving) => (2.0 * (pf - 1.0) / pf * m + 2.0 * fold * m, (pf - 1.0) / pf * m + fold * m),
        (AllReduce, ChannelTree) => (2.0 * lg * m, lg * m),
        (AllReduce, _) => (2.0 * share, share),
        (ReduceScatter, ChannelDoubling | ChannelHalving) => (share + fold * m, share + fold * m),
        (ReduceScatter, ChannelTree) => (lg * m, lg * m),
        (ReduceScatter, _) => (share, share),
        (AllGather | AllToAll | AllToAllv, _) => (share, 0.0),
        (Broadcast, OneShot | Direct | ChannelDirect | ChannelEager) => ((nf - 1.0) * m, 0.0),
        (Broadcast, ChannelTree | ChannelBruck | ChannelDoubling | ChannelHalving) => (lg * m, 0.0),
        (Broadcast, TwoShot | TwoShotLl128 | TwoPhase) => (2.0 * share, 0.0),
        (Broadcast, _) => (m, 0.0),
        (Reduce, OneShot | Direct | ChannelDirect | ChannelEager) => ((nf - 1.0) * m, (nf - 1.0) * m),
        (Reduce, ChannelTree | ChannelBruck | ChannelDoubling | ChannelHalving) => (lg * m, lg * m),
        (Reduce, TwoShot | TwoShotLl128 | TwoPhase) => (2.0 * share, share),
        (Reduce, _) => (m, m),
    })
}

/// The model's time of `algorithm` running `collective` of `bytes` on `n` ranks over `link`, or
/// `None` for the hierarchical plans (see [`critical_bytes`]).
pub fn estimated_time(
    collective: Collective,
    algorithm: Algorithm,
    n: usize,
    bytes: usize,
    link: &LinkCost,
) -> Option<Duration> {
    let steps = steps(collective, algorithm, n)? as f64;
    let (sent, reduced) = critical_bytes(collective, algorithm, n, bytes)?;
    let us = steps * link.step_us + sent * link.us_per_byte + reduced * link.us_per_reduced_byte;
    Some(Duration::from_secs_f64(us.max(0.0) / 1e6))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every algorithm the table may pick for every collective, and a few worlds.
    fn every_case() -> impl Iterator<Item = (Collective, Algorithm, usize)> {
        Collective::ALL.into_iter().flat_map(|c| {
            Algorithm::ALL.into_iter().flat_map(move |a| [1, 2, 3, 8, 13, 64].into_iter().map(move |n| (c, a, n)))
        })
    }

    #[test]
    fn time_grows_with_bytes_and_ranks_and_is_zero_alone() {
        for (c, a, n) in every_case() {
            let Some(small) = estimated_time(c, a, n, 8, &NVLINK_H200) else {
                assert_eq!(a, Algorithm::Hierarchical, "{c} {a} on {n} has no estimate");
                continue;
            };
            let large = estimated_time(c, a, n, 64 << 20, &NVLINK_H200).unwrap();
            if n == 1 {
                assert_eq!(large, Duration::ZERO, "{c} {a} alone");
            } else {
                assert!(small > Duration::ZERO && large > small, "{c} {a} on {n}: {small:?} then {large:?}");
            }
        }
    }

    #[test]
    fn known_figures() {
        // Two GPUs, a one-shot all-reduce of 8 B: one step (2.5 µs) and nothing measurable else.
        let t = estimated_time(Collective::AllReduce, Algorithm::OneShot, 2, 8, &NVLINK_H200).unwrap();
        assert!((t.as_secs_f64() * 1e6 - 2.5).abs() < 0.01, "{t:?}");
        // A ring all-reduce of 360 MB on 4 ranks: 6 steps, and 2 × 3/4 of the buffer (540 MB) at
        // 360 GB/s, 1.5 ms.
        let t = estimated_time(Collective::AllReduce, Algorithm::Ring, 4, 360_000_000, &NVLINK_H200).unwrap();
        assert!((t.as_secs_f64() * 1e6 - (6.0 * 2.5 + 1500.0)).abs() < 0.01, "{t:?}");
        // The halving all-reduce of a power of two sends as much as the ring, in fewer steps.
        let ring = critical_bytes(Collective::AllReduce, Algorithm::ChannelRing, 16, 1 << 20).unwrap();
        let halving = critical_bytes(Collective::AllReduce, Algorithm::ChannelHalving, 16, 1 << 20).unwrap();
        assert!((ring.0 - halving.0).abs() < 1e-6 && (ring.1 - halving.1).abs() < 1e-6, "{ring:?} {halving:?}");
        let doubling = critical_bytes(Collective::AllReduce, Algorithm::ChannelDoubling, 16, 1 << 20).unwrap();
        assert!(doubling.0 > 2.0 * halving.0, "doubling sends the whole buffer every step: {doubling:?}");
    }
}
